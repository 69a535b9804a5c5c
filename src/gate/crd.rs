//! Facts about a CustomResourceDefinition, read from one rendered object: its name, group,
//! kind, served and storage versions, and whether the API server would accept its names.
//!
//! The gate's rules and Bosun read CRDs through these functions only, so both agree on what
//! a CRD serves. The structural schema of one version is [`crate::schema::version_schema`].

use std::collections::BTreeSet;

use serde_json::Value;

use crate::names;

/// What a CustomResourceDefinition declares about the kind it serves.
#[derive(Debug, Clone)]
pub struct CrdInfo {
    /// `spec.group`.
    pub group: String,
    /// `spec.names.kind`.
    pub kind: String,
    /// The versions marked `served: true`.
    pub served: BTreeSet<String>,
    /// The version marked `storage: true` (empty when none is).
    pub storage: String,
    /// Every version `spec.versions` lists, served or not.
    pub versions: BTreeSet<String>,
}

/// Whether an object is a CustomResourceDefinition: kind `CustomResourceDefinition` in the
/// `apiextensions.k8s.io` group.
fn is_crd(object: &Value) -> bool {
    object.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
        && object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("apiextensions.k8s.io/"))
}

/// A CustomResourceDefinition's name (`metadata.name`) and [`CrdInfo`]: its group, kind,
/// served versions and storage version.
///
/// `None` for any other object, for a CRD without a name, group or kind, and for a CRD whose
/// names the API server would reject ([`crd_name_problem`]): such a CRD serves nothing, and
/// none of its names reaches a report's machine block or Bosun.
pub fn crd_info(object: &Value) -> Option<(String, CrdInfo)> {
    if !is_crd(object) {
        return None;
    }
    let name = object.pointer("/metadata/name")?.as_str()?.to_string();
    let group = object.pointer("/spec/group")?.as_str()?.to_string();
    let kind = object.pointer("/spec/names/kind")?.as_str()?.to_string();
    let mut served = BTreeSet::new();
    let mut storage = String::new();
    let mut versions = BTreeSet::new();
    for version in object
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(v) = version.get("name").and_then(Value::as_str) else {
            continue;
        };
        versions.insert(v.to_string());
        if version
            .get("served")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            served.insert(v.to_string());
        }
        if version
            .get("storage")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            storage = v.to_string();
        }
    }
    // A name the API server would reject makes the whole CRD one it rejects: none of its
    // versions is served, and no name of it reaches a report's machine block or Bosun.
    if crd_name_problem(object).is_some() {
        return None;
    }
    Some((
        name,
        CrdInfo {
            group,
            kind,
            served,
            storage,
            versions,
        },
    ))
}

/// Whether a CustomResourceDefinition object lists `version` under `spec.versions` with
/// `served: true`.
pub fn serves_version(crd: &Value, version: &str) -> bool {
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| {
            v.get("name").and_then(Value::as_str) == Some(version)
                && v.get("served").and_then(Value::as_bool) == Some(true)
        })
}

/// Why the API server would reject this CustomResourceDefinition's names, if it would: a
/// name that is not a DNS-1123 subdomain, a group that is not one (or has no dot), a kind that
/// is not a kind name, a plural that is not a DNS-1035 label, a name other than
/// `<plural>.<group>`, or a version name that is not a DNS-1035 label (as the apiextensions
/// validation refuses them). `None` for a CRD with valid names
/// and for any other object.
pub fn crd_name_problem(object: &Value) -> Option<String> {
    if !is_crd(object) {
        return None;
    }
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let name = text("/metadata/name");
    if !names::is_dns1123_subdomain(name) {
        return Some("its name is not a DNS-1123 subdomain".into());
    }
    let group = text("/spec/group");
    if !names::is_dns1123_subdomain(group) {
        return Some("spec.group is not a DNS-1123 subdomain".into());
    }
    if !group.contains('.') {
        return Some("spec.group is not a domain with at least one dot".into());
    }
    if !names::is_kind(text("/spec/names/kind")) {
        return Some("spec.names.kind is not a kind name".into());
    }
    let plural = text("/spec/names/plural");
    if !names::is_dns1035_label(plural) {
        return Some("spec.names.plural is not a DNS-1035 label".into());
    }
    if name != format!("{plural}.{group}") {
        return Some("its name is not spec.names.plural + \".\" + spec.group".into());
    }
    for (index, version) in object
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let valid = version
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(names::is_dns1035_label);
        if !valid {
            return Some(format!(
                "spec.versions[{index}].name is not a DNS-1035 label"
            ));
        }
    }
    None
}
