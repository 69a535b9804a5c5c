//! The gate's rules: findings with a stable id, a severity and their evidence.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::diff::{AppStatus, ObjectKey, RenderDiff};
use crate::render::git::Snapshot;
use crate::render::inventory::Inventory;
use crate::render::parsed::Object;
use crate::render::{RenderedApplication, Rendering};
use crate::{names, yaml};

pub const DROPPED_SERVED_VERSION: &str = "dropped-served-version";
pub const CHART_RENDERS_UNSERVED_VERSION: &str = "chart-renders-unserved-version";
/// The same, from a chart in this repository whose template computes the apiVersion: there is
/// something here to change, but no literal line says where.
pub const REPOSITORY_CHART_RENDERS_UNSERVED_VERSION: &str =
    "repository-chart-renders-unserved-version";
pub const RENDER_FAILED: &str = "render-failed";
pub const ADDON_ADDED: &str = "addon-added";
pub const MAJOR_VERSION: &str = "major-version-boundary";
pub const RBAC_REMOVED: &str = "rbac-removed";
pub const CRD_ADDED: &str = "crd-added";
pub const CRD_REMOVED: &str = "crd-removed";
pub const DROPPED_VERSION_UNUSED: &str = "dropped-version-unused";
pub const UNSCANNED_FILE: &str = "unscanned-file";
/// A rendered custom object the API server would quietly prune a value from, or reject.
pub const FIELD_PRUNED_ON_APPLY: &str = "field-pruned-on-apply";
/// A change to generated Applications that lets Argo CD delete or overwrite on its own.
pub const SYNC_POLICY_CHANGED: &str = "sync-policy-changed";
/// An Application whose destination is no cluster of the inventory.
pub const DESTINATION_UNKNOWN: &str = "destination-unknown";
/// A rendered CustomResourceDefinition whose names the API server would reject.
pub const CRD_NAME_INVALID: &str = "crd-name-invalid";
/// An object of a group its cluster does not serve at all (no version natively, no CRD
/// rendered there): Argo CD would fail the sync. Blocking where the inventory lists the
/// cluster's APIs, a note where it does not.
pub const KIND_NOT_SERVED: &str = "kind-not-served-on-cluster";

/// API groups every Kubernetes cluster serves: the rule never raises objects of these (an
/// inventory's API list is often partial for them).
const NATIVE_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Applications a `not-served` block lists (the rest are counted).
const NOT_SERVED_LISTED: usize = 25;

/// The first `n` items joined, and how many more.
fn listed(items: &[String], n: usize) -> String {
    let shown = items.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > n {
        format!("{shown} and {} more", items.len() - n)
    } else {
        shown
    }
}

/// A rendered object whose API group its destination cluster does not serve.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotServed {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// `namespace/name on cluster`, the Applications that render it (the first 25).
    pub applications: Vec<String>,
    /// How many more Applications render it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_applications: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Blocking,
    Note,
}

/// A manifest in the repository that declares an apiVersion.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    /// Repository-relative file path.
    pub path: String,
    /// Index of the document among the file's non-empty documents (0-based).
    pub document: usize,
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// A Helm template of a chart in this repository (not plain YAML): the apiVersion is a
    /// literal line of the template, and `document` counts the template's `---` separators.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template: bool,
}

/// A CRD that stopped serving versions the repository still declares: the evidence a repair
/// needs (the destination is the storage version at head).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedServedVersion {
    pub crd: String,
    pub group: String,
    pub kind: String,
    pub dropped: Vec<String>,
    pub served: Vec<String>,
    pub storage: String,
    pub clusters: Vec<String>,
    pub consumers: Vec<Consumer>,
}

/// An object a chart renders with an apiVersion the target no longer serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnservedRendered {
    pub application: String,
    pub cluster: String,
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub served: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    /// One line a person reads.
    pub summary: String,
    pub evidence: Value,
}

#[derive(Debug, Clone)]
pub(crate) struct CrdInfo {
    pub(crate) group: String,
    pub(crate) kind: String,
    pub(crate) served: BTreeSet<String>,
    pub(crate) storage: String,
}

/// Work the rules do per distinct object, not per Application: an operator chart's CRDs are
/// one shared object on every cluster (and at both commits).
#[derive(Default)]
struct Memo {
    /// By object address; the object is kept so the address is not reused.
    crds: HashMap<usize, (Object, Option<(String, CrdInfo)>)>,
    /// (object, CRD, version) addresses -> the outcome of pruning and validating.
    losses: HashMap<(usize, usize), (Object, Object, Vec<String>)>,
}

impl Memo {
    fn crd_info(&mut self, object: &Object) -> Option<(String, CrdInfo)> {
        self.crds
            .entry(Arc::as_ptr(object) as usize)
            .or_insert_with(|| (object.clone(), crd_info(object)))
            .1
            .clone()
    }
}

fn crds_by_cluster(
    memo: &mut Memo,
    rendering: &Rendering,
) -> BTreeMap<String, BTreeMap<String, CrdInfo>> {
    let mut out: BTreeMap<String, BTreeMap<String, CrdInfo>> = BTreeMap::new();
    for app in &rendering.applications {
        for object in &app.objects {
            if let Some((name, info)) = memo.crd_info(object) {
                out.entry(app.cluster.name.clone())
                    .or_default()
                    .insert(name, info);
            }
        }
    }
    out
}

/// A CustomResourceDefinition's name, group, kind, served versions and storage version.
pub(crate) fn crd_info(object: &Value) -> Option<(String, CrdInfo)> {
    if object.get("kind")?.as_str()? != "CustomResourceDefinition" {
        return None;
    }
    if !object
        .get("apiVersion")?
        .as_str()?
        .starts_with("apiextensions.k8s.io/")
    {
        return None;
    }
    let name = object.pointer("/metadata/name")?.as_str()?.to_string();
    let group = object.pointer("/spec/group")?.as_str()?.to_string();
    let kind = object.pointer("/spec/names/kind")?.as_str()?.to_string();
    let mut served = BTreeSet::new();
    let mut storage = String::new();
    for version in object
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(v) = version.get("name").and_then(Value::as_str) else {
            continue;
        };
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
        },
    ))
}

/// Every rendered object of an API group (not the core group), with its Application, its
/// apiVersion and its kind.
fn grouped_objects(
    rendering: &Rendering,
) -> impl Iterator<Item = (&RenderedApplication, &Object, &str, &str)> {
    rendering.applications.iter().flat_map(|app| {
        app.objects.iter().filter_map(move |object| {
            let api_version = object.get("apiVersion").and_then(Value::as_str)?;
            let kind = object.get("kind").and_then(Value::as_str)?;
            (!split_api_version(api_version).0.is_empty()).then_some((
                app,
                object,
                api_version,
                kind,
            ))
        })
    })
}

/// Every value the API server would prune from, or every reason it would reject, a rendered
/// object of a custom kind: (Application `ns/name on cluster`, object, what happens). The
/// schema is the one the object's cluster serves at this render for the version the object
/// declares; an object whose CRD or version is not there is another rule's business.
fn apply_losses(memo: &mut Memo, rendering: &Rendering) -> Vec<(String, String, String)> {
    let mut crds: BTreeMap<(&str, String, String), &Object> = BTreeMap::new();
    for app in &rendering.applications {
        for object in &app.objects {
            if let Some((_, info)) = memo.crd_info(object) {
                crds.insert(
                    (
                        app.cluster.name.as_str(),
                        info.group.clone(),
                        info.kind.clone(),
                    ),
                    object,
                );
            }
        }
    }
    let mut out = Vec::new();
    for (app, object, api_version, kind) in grouped_objects(rendering) {
        let (group, version) = split_api_version(api_version);
        {
            let Some(crd) = crds.get(&(
                app.cluster.name.as_str(),
                group.to_string(),
                kind.to_string(),
            )) else {
                continue;
            };
            let served = crd
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|v| {
                    v.get("name").and_then(Value::as_str) == Some(version)
                        && v.get("served").and_then(Value::as_bool) == Some(true)
                });
            let Some(schema) = crate::schema::version_schema(crd, version).filter(|_| served)
            else {
                continue;
            };
            let label = format!("{} {}", api_version, object_label(&ObjectKey::of(object)));
            let where_ = format!("{}/{} on {}", app.namespace, app.name, app.cluster.name);
            let losses = &memo
                .losses
                .entry((Arc::as_ptr(object) as usize, Arc::as_ptr(crd) as usize))
                .or_insert_with(|| {
                    (
                        Object::clone(object),
                        Object::clone(crd),
                        losses_of(object, schema, version),
                    )
                })
                .2;
            for loss in losses {
                out.push((where_.clone(), label.clone(), loss.clone()));
            }
        }
    }
    out
}

/// What the API server would prune from, or why it would reject, one object under a schema.
fn losses_of(object: &Value, schema: &Value, version: &str) -> Vec<String> {
    let mut copy = object.clone();
    let outcome = crate::schema::prune_and_validate(&mut copy, schema);
    let mut out = Vec::new();
    for (path, value) in outcome.pruned {
        let mut value = value.to_string();
        if value.chars().count() > 80 {
            value = format!("{}…", value.chars().take(80).collect::<String>());
        }
        out.push(format!(
            "{path} = {value} would be pruned (the {version} schema has no such field)"
        ));
    }
    for error in outcome.errors {
        out.push(format!("rejected: {error}"));
    }
    out
}

/// What an Application (as stored) lets Argo CD do by itself that can delete or overwrite:
/// automated sync, pruning, self-healing, syncing to empty, cascading deletion, forced or
/// replacing applies.
pub(crate) fn sync_powers(stored: &Value) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    let policy = stored.pointer("/spec/syncPolicy");
    let automated = policy.and_then(|p| p.get("automated"));
    let truthy = |v: Option<&Value>| v.and_then(Value::as_bool) == Some(true);
    if let Some(automated) = automated.filter(|a| a.is_object())
        && automated.get("enabled").and_then(Value::as_bool) != Some(false)
    {
        out.insert("sync automatically (syncPolicy.automated)");
        if truthy(automated.get("prune")) {
            out.insert("prune resources automatically, deleting what leaves the render (syncPolicy.automated.prune)");
        }
        if truthy(automated.get("selfHeal")) {
            out.insert("self-heal, overwriting changes made in the cluster (syncPolicy.automated.selfHeal)");
        }
        if truthy(automated.get("allowEmpty")) {
            out.insert(
                "sync an empty render, deleting everything (syncPolicy.automated.allowEmpty)",
            );
        }
    }
    for option in policy
        .and_then(|p| p.get("syncOptions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        match option.trim() {
            "Replace=true" => {
                out.insert("replace resources instead of applying them (syncOptions Replace=true)");
            }
            "Force=true" => {
                out.insert(
                    "force syncs, deleting and recreating resources (syncOptions Force=true)",
                );
            }
            _ => {}
        }
    }
    if stored
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| {
            f.iter().filter_map(Value::as_str).any(|f| {
                f == "resources-finalizer.argocd.argoproj.io"
                    || f.starts_with("resources-finalizer.argocd.argoproj.io/")
            })
        })
    {
        out.insert("delete their resources when the Application is deleted (resources-finalizer)");
    }
    out
}

/// Why the API server would reject this CustomResourceDefinition's names, if it would.
pub(crate) fn crd_name_problem(object: &Value) -> Option<String> {
    if object.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition")
        || !object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("apiextensions.k8s.io/"))
    {
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
    if !names::is_dns1123_subdomain(text("/spec/group")) {
        return Some("spec.group is not a DNS-1123 subdomain".into());
    }
    if !names::is_kind(text("/spec/names/kind")) {
        return Some("spec.names.kind is not a kind name".into());
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

/// Every manifest (a document with apiVersion and kind) in the repository's YAML files, outside
/// chart templates and hidden folders, and the files that could not be read as YAML.
#[derive(Debug, Default)]
pub struct ManifestScan {
    pub manifests: Vec<Consumer>,
    /// (path, why)
    pub unreadable: Vec<(String, String)>,
}

pub fn scan_manifests(snapshot: &Snapshot) -> ManifestScan {
    let mut manifests = Vec::new();
    let mut unreadable = Vec::new();
    for path in snapshot.manifest_files() {
        let text = match yaml::utf8(snapshot.read(path).unwrap_or_default(), path) {
            Ok(text) => text,
            Err(e) => {
                unreadable.push((path.to_string(), e));
                continue;
            }
        };
        match yaml::parse_documents(text, path) {
            Ok(documents) => {
                for (index, document) in documents.into_iter().enumerate() {
                    let (Some(api_version), Some(kind)) = (
                        document.get("apiVersion").and_then(Value::as_str),
                        document.get("kind").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    let text = |p: &str| {
                        document
                            .pointer(p)
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string()
                    };
                    let consumer = Consumer {
                        path: path.to_string(),
                        document: index,
                        api_version: api_version.to_string(),
                        kind: kind.to_string(),
                        namespace: text("/metadata/namespace"),
                        name: text("/metadata/name"),
                        template: false,
                    };
                    manifests.push(consumer);
                }
            }
            Err(e) => {
                unreadable.push((path.to_string(), format!("line {}: {}", e.line, e.message)))
            }
        }
    }
    ManifestScan {
        manifests,
        unreadable,
    }
}

/// Charts in this repository that head Applications render (a source with a `path` holding a
/// `Chart.yaml`), by directory.
fn local_chart_dirs(rendering: &Rendering, snapshot: &Snapshot) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for app in &rendering.applications {
        for source in &app.sources {
            if source.get("chart").is_some() {
                continue;
            }
            let Some(path) = source.get("path").and_then(Value::as_str) else {
                continue;
            };
            let dir = crate::render::git::normalize(path);
            if snapshot.exists(&format!("{dir}/Chart.yaml")) {
                out.entry(dir)
                    .or_default()
                    .push(format!("{}/{}", app.namespace, app.name));
            }
        }
    }
    out
}

/// The apiVersions the templates of a repository chart declare as literal lines
/// (`apiVersion: group/version` at the start of a line, in a document with a literal `kind:`).
/// An apiVersion computed by a template expression is not a literal and is not listed.
pub fn scan_chart_templates(snapshot: &Snapshot, chart_dir: &str) -> Vec<Consumer> {
    let mut out = Vec::new();
    let templates = format!("{chart_dir}/templates");
    for (path, content) in snapshot.files_under(&templates) {
        if !(path.ends_with(".yaml") || path.ends_with(".yml")) {
            continue;
        }
        let text = String::from_utf8_lossy(content);
        let mut documents: Vec<Vec<&str>> = vec![Vec::new()];
        for line in text.lines() {
            if line.trim_end() == "---" {
                documents.push(Vec::new());
            } else if let Some(current) = documents.last_mut() {
                current.push(line);
            }
        }
        for (index, lines) in documents.iter().enumerate() {
            let literal = |key: &str| -> Vec<String> {
                lines
                    .iter()
                    .filter_map(|line| {
                        let value = line.strip_prefix(key)?.trim();
                        let value = value.trim_matches(|c| c == '"' || c == '\'');
                        (!value.is_empty() && !value.contains("{{") && !value.contains(' '))
                            .then(|| value.to_string())
                    })
                    .collect()
            };
            let Some(kind) = literal("kind:").into_iter().next() else {
                continue;
            };
            let name = lines
                .iter()
                .skip_while(|line| !line.starts_with("metadata:"))
                .find_map(|line| line.strip_prefix("  name:"))
                .map(|name| name.trim().to_string())
                .unwrap_or_default();
            for api_version in literal("apiVersion:") {
                out.push(Consumer {
                    path: path.to_string(),
                    document: index,
                    api_version,
                    kind: kind.clone(),
                    namespace: String::new(),
                    name: name.clone(),
                    template: true,
                });
            }
        }
    }
    out
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// The rules that compare two renderings.
pub fn evaluate(
    base: &Rendering,
    head: &Rendering,
    diff: &RenderDiff,
    head_snapshot: &Snapshot,
    inventory: &Inventory,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let ManifestScan {
        manifests,
        unreadable,
    } = scan_manifests(head_snapshot);
    // Templates of the repository's own charts declare apiVersions too, and a person can edit
    // them: they are consumers with a file path, like plain manifests.
    let chart_dirs = local_chart_dirs(head, head_snapshot);
    let template_declarations: Vec<(String, Consumer)> = chart_dirs
        .keys()
        .flat_map(|dir| {
            scan_chart_templates(head_snapshot, dir)
                .into_iter()
                .map(move |c| (dir.clone(), c))
        })
        .collect();
    let mut memo = Memo::default();
    let base_crds = crds_by_cluster(&mut memo, base);
    let head_crds = crds_by_cluster(&mut memo, head);

    // dropped-served-version
    let mut dropped_by_crd: BTreeMap<String, DroppedServedVersion> = BTreeMap::new();
    for (cluster, head_map) in &head_crds {
        let Some(base_map) = base_crds.get(cluster) else {
            continue;
        };
        for (name, now) in head_map {
            let Some(before) = base_map.get(name) else {
                continue;
            };
            let dropped: Vec<String> = before.served.difference(&now.served).cloned().collect();
            if dropped.is_empty() {
                continue;
            }
            let entry =
                dropped_by_crd
                    .entry(name.clone())
                    .or_insert_with(|| DroppedServedVersion {
                        crd: name.clone(),
                        group: now.group.clone(),
                        kind: now.kind.clone(),
                        dropped: Vec::new(),
                        served: now.served.iter().cloned().collect(),
                        storage: now.storage.clone(),
                        clusters: Vec::new(),
                        consumers: Vec::new(),
                    });
            for v in dropped {
                if !entry.dropped.contains(&v) {
                    entry.dropped.push(v);
                }
            }
            entry.dropped.sort();
            entry.clusters.push(cluster.clone());
        }
    }
    for info in dropped_by_crd.values_mut() {
        for consumer in manifests
            .iter()
            .chain(template_declarations.iter().map(|(_, c)| c))
        {
            let (group, version) = split_api_version(&consumer.api_version);
            if group == info.group
                && consumer.kind == info.kind
                && info.dropped.iter().any(|d| d == version)
            {
                info.consumers.push(consumer.clone());
            }
        }
        info.consumers.sort();
        let evidence = serde_json::to_value(&*info).unwrap_or(Value::Null);
        if info.consumers.is_empty() {
            findings.push(Finding {
                rule: DROPPED_VERSION_UNUSED.into(),
                severity: Severity::Note,
                summary: format!(
                    "CustomResourceDefinition/{} no longer serves {}; nothing in this repository declares {}",
                    info.crd,
                    info.dropped.join(", "),
                    if info.dropped.len() == 1 { "it" } else { "them" }
                ),
                evidence,
            });
        } else {
            findings.push(Finding {
                rule: DROPPED_SERVED_VERSION.into(),
                severity: Severity::Blocking,
                summary: format!(
                    "CustomResourceDefinition/{}: no longer serves {}; {} manifests must move to {}",
                    info.crd,
                    info.dropped.join(", "),
                    info.kind,
                    info.storage
                ),
                evidence,
            });
        }
    }

    // chart-renders-unserved-version: new at head, not declared by any repository manifest.
    // One finding per object, listing every Application (cluster) that renders it.
    let base_unserved = unserved_objects(base, &base_crds, inventory);
    type Unserved = (UnservedRendered, Vec<String>, Option<String>);
    let mut unserved: BTreeMap<(String, String, String), Unserved> = BTreeMap::new();
    for object in unserved_objects(head, &head_crds, inventory) {
        let same = |o: &UnservedRendered| {
            o.application == object.application
                && o.cluster == object.cluster
                && o.api_version == object.api_version
                && o.kind == object.kind
                && o.name == object.name
        };
        if base_unserved.iter().any(same) {
            continue;
        }
        if manifests.iter().any(|c| {
            c.api_version == object.api_version && c.kind == object.kind && c.name == object.name
        }) {
            continue;
        }
        let local_chart = chart_dirs
            .iter()
            .find(|(_, apps)| apps.contains(&object.application))
            .map(|(dir, _)| dir.clone());
        if let Some(dir) = &local_chart
            && template_declarations.iter().any(|(d, c)| {
                d == dir && c.api_version == object.api_version && c.kind == object.kind
            })
        {
            continue;
        }
        let key = (
            object.api_version.clone(),
            object.kind.clone(),
            object.name.clone(),
        );
        let entry = unserved
            .entry(key)
            .or_insert_with(|| (object.clone(), Vec::new(), local_chart.clone()));
        entry
            .1
            .push(format!("{} on {}", object.application, object.cluster));
    }
    for (_, (object, applications, local_chart)) in unserved {
        let served = if object.served.is_empty() {
            "none".to_string()
        } else {
            object.served.join(", ")
        };
        let summary = match &local_chart {
            // The repository's own chart: there is something to change, but the template
            // computes the apiVersion, so no literal line names it.
            Some(dir) => format!(
                "{} {} is rendered by this repository's chart {dir} with apiVersion {}, which the target no longer serves (serves {served}); the apiVersion is computed by a template expression under {dir}/templates ({})",
                object.kind,
                object.name,
                object.api_version,
                applications.join(", ")
            ),
            None => format!(
                "{} {} is rendered by a chart with apiVersion {}, which the target no longer serves (serves {served}); no manifest in this repository declares it, so there are no values to change here ({})",
                object.kind,
                object.name,
                object.api_version,
                applications.join(", ")
            ),
        };
        findings.push(Finding {
            rule: if local_chart.is_some() {
                REPOSITORY_CHART_RENDERS_UNSERVED_VERSION.into()
            } else {
                CHART_RENDERS_UNSERVED_VERSION.into()
            },
            severity: Severity::Blocking,
            summary,
            evidence: match &local_chart {
                Some(dir) => serde_json::json!({"object": object, "applications": applications, "localChart": dir}),
                None => serde_json::json!({"object": object, "applications": applications}),
            },
        });
    }

    // kind-not-served-on-cluster: new at head (the same Application, cluster and object at
    // the base does not count), one finding per object listing every Application.
    // Whether a kind is served depends on the cluster, not the Application: an object the
    // base already rendered on that cluster (under any Application name) is not new.
    let at_base: std::collections::HashSet<(String, ObjectKey, String)> =
        not_served_objects(base, &base_crds, inventory)
            .into_iter()
            .map(|(_, c, k, v, _)| (c, k, v))
            .collect();
    let mut not_served: BTreeMap<(String, ObjectKey), (NotServed, bool)> = BTreeMap::new();
    for (application, cluster, key, api_version, listed) in
        not_served_objects(head, &head_crds, inventory)
    {
        if at_base.contains(&(cluster.clone(), key.clone(), api_version.clone())) {
            continue;
        }
        let entry = not_served
            .entry((api_version.clone(), key.clone()))
            .or_insert_with(|| {
                (
                    NotServed {
                        api_version: api_version.clone(),
                        kind: key.kind.clone(),
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                        applications: Vec::new(),
                        more_applications: 0,
                    },
                    false,
                )
            });
        entry
            .0
            .applications
            .push(format!("{application} on {cluster}"));
        // Blocking when any of its clusters lists its APIs.
        entry.1 |= listed;
    }
    for (_, (mut object, blocking)) in not_served {
        let (group, _) = split_api_version(&object.api_version);
        findings.push(Finding {
            rule: KIND_NOT_SERVED.into(),
            severity: if blocking {
                Severity::Blocking
            } else {
                Severity::Note
            },
            summary: format!(
                "{} {} ({}) is rendered for {}, and {} serves no {} of the {group} API and renders no CRD for it there: Argo CD would fail the sync{}",
                object.kind,
                if object.namespace.is_empty() { object.name.clone() } else { format!("{}/{}", object.namespace, object.name) },
                object.api_version,
                listed(&object.applications, 5),
                if object.applications.len() == 1 { "that cluster" } else { "each cluster" },
                object.kind,
                if blocking { "" } else { " (a note: the inventory lists no APIs for the cluster, or the object carries Argo CD's SkipDryRunOnMissingResource option)" }
            ),
            evidence: {
                // The block stays small on a fleet: the first Applications and a count.
                let total = object.applications.len();
                object.applications.truncate(NOT_SERVED_LISTED);
                object.more_applications = total.saturating_sub(NOT_SERVED_LISTED);
                serde_json::to_value(&object).unwrap_or(Value::Null)
            },
        });
    }

    // addon-added: the expansion of every Application the change creates.
    let added: Vec<&RenderedApplication> = diff
        .applications
        .iter()
        .filter(|a| a.status == AppStatus::Added)
        .filter_map(|a| {
            head.applications.iter().find(|h| {
                h.cluster.name == a.app.cluster
                    && h.name == a.app.name
                    && h.namespace == a.app.namespace
            })
        })
        .collect();
    if !added.is_empty() {
        let rows: Vec<Value> = added
            .iter()
            .map(|app| {
                serde_json::json!({
                    "application": app.name,
                    "namespace": app.namespace,
                    "cluster": app.cluster.name,
                    "destinationNamespace": app.destination_namespace,
                    "renders": app.sources.iter().filter(|s| s.get("chart").is_some() || s.get("path").is_some()).map(crate::render::output::source_line).collect::<Vec<_>>(),
                    "origin": app.origin.to_string(),
                })
            })
            .collect();
        findings.push(Finding {
            rule: ADDON_ADDED.into(),
            severity: Severity::Note,
            summary: format!(
                "this change creates {} Application{}",
                added.len(),
                if added.len() == 1 { "" } else { "s" }
            ),
            evidence: Value::Array(rows),
        });
    }

    // Notes a reviewer needs.
    let mut majors: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for app in &diff.applications {
        for chart_move in &app.chart_moves {
            if crosses_major(&chart_move.from, &chart_move.to) {
                majors
                    .entry((
                        chart_move.chart.clone(),
                        chart_move.from.clone(),
                        chart_move.to.clone(),
                    ))
                    .or_default()
                    .push(app.app.to_string());
            }
        }
    }
    for ((chart, from, to), apps) in majors {
        findings.push(Finding {
            rule: MAJOR_VERSION.into(),
            severity: Severity::Note,
            summary: format!("chart {chart} {from} → {to} crosses a major version boundary ({} Application{})", apps.len(), if apps.len() == 1 { "" } else { "s" }),
            evidence: serde_json::json!({"chart": chart, "from": from, "to": to, "applications": apps}),
        });
    }
    let rbac_kinds = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];
    let mut rbac_removed: Vec<String> = Vec::new();
    let mut crds_added: BTreeSet<String> = BTreeSet::new();
    let mut crds_removed: BTreeSet<String> = BTreeSet::new();
    for app in &diff.applications {
        for object in &app.objects.removed {
            if object.group == "rbac.authorization.k8s.io"
                && rbac_kinds.contains(&object.kind.as_str())
            {
                rbac_removed.push(format!("{} ({})", object_label(object), app.app));
            }
            if object.kind == "CustomResourceDefinition" {
                crds_removed.insert(object.name.clone());
            }
        }
        for object in &app.objects.added {
            if object.kind == "CustomResourceDefinition" {
                crds_added.insert(object.name.clone());
            }
        }
    }
    if !rbac_removed.is_empty() {
        findings.push(Finding {
            rule: RBAC_REMOVED.into(),
            severity: Severity::Note,
            summary: format!(
                "{} RBAC object{} removed",
                rbac_removed.len(),
                if rbac_removed.len() == 1 { "" } else { "s" }
            ),
            evidence: serde_json::json!(rbac_removed),
        });
    }
    for (rule, set, verb) in [
        (CRD_ADDED, &crds_added, "added"),
        (CRD_REMOVED, &crds_removed, "removed"),
    ] {
        if !set.is_empty() {
            findings.push(Finding {
                rule: rule.into(),
                severity: Severity::Note,
                summary: format!(
                    "{} CustomResourceDefinition{} {verb}",
                    set.len(),
                    if set.len() == 1 { "" } else { "s" }
                ),
                evidence: serde_json::json!(set),
            });
        }
    }
    // Values the apply would drop: every rendered object of a custom kind, through the
    // structural schema of the version it declares as its cluster serves it at this commit.
    let base_losses: std::collections::HashSet<(String, String, String)> =
        apply_losses(&mut memo, base).into_iter().collect();
    let mut losses: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (app, object, loss) in apply_losses(&mut memo, head) {
        let introduced = !base_losses.contains(&(app.clone(), object.clone(), loss.clone()));
        let severity = if introduced { "blocking" } else { "note" };
        losses
            .entry((format!("{severity}\u{0}{object}"), loss))
            .or_default()
            .push(app);
    }
    for ((key, loss), apps) in losses {
        let (severity, object) = key.split_once('\u{0}').unwrap_or(("note", &key));
        let shown: Vec<&str> = apps.iter().take(10).map(String::as_str).collect();
        findings.push(Finding {
            rule: FIELD_PRUNED_ON_APPLY.into(),
            severity: if severity == "blocking" {
                Severity::Blocking
            } else {
                Severity::Note
            },
            summary: format!(
                "{object}: {loss}, in {}{}{}",
                shown.join(", "),
                if apps.len() > shown.len() {
                    format!(" and {} more", apps.len() - shown.len())
                } else {
                    String::new()
                },
                if severity == "blocking" {
                    ""
                } else {
                    " (so at the merge base too)"
                }
            ),
            evidence: serde_json::json!({"object": object, "loss": loss, "applications": apps}),
        });
    }
    // Sync policies: what a changed Application now lets Argo CD do by itself.
    // Argo CD knows an Application by namespace and name (a move to another cluster is the
    // same Application); a new one brings all its powers.
    let base_by_key: BTreeMap<(&str, &str), &RenderedApplication> = base
        .applications
        .iter()
        .map(|a| ((a.namespace.as_str(), a.name.as_str()), a))
        .collect();
    let mut enabled: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for app in &head.applications {
        let was = base_by_key
            .get(&(app.namespace.as_str(), app.name.as_str()))
            .map(|before| sync_powers(&before.stored))
            .unwrap_or_default();
        let now = sync_powers(&app.stored);
        for power in now.difference(&was) {
            enabled
                .entry(power)
                .or_default()
                .push(format!("{}/{}", app.namespace, app.name));
        }
    }
    for (power, apps) in enabled {
        let shown: Vec<&str> = apps.iter().take(10).map(String::as_str).collect();
        findings.push(Finding {
            rule: SYNC_POLICY_CHANGED.into(),
            severity: Severity::Note,
            summary: format!(
                "{} Application{} now {power}: {}{}",
                apps.len(),
                if apps.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if apps.len() > shown.len() {
                    format!(" and {} more", apps.len() - shown.len())
                } else {
                    String::new()
                }
            ),
            evidence: serde_json::json!({"enables": power, "applications": apps}),
        });
    }
    // Unknown destinations: blocking when the pull request brings one, a note when the base
    // has the same Application with the same unknown destination.
    let base_unknown: BTreeSet<(&str, &str, &str)> = base
        .applications
        .iter()
        .filter_map(|a| {
            a.destination_unknown
                .as_deref()
                .map(|d| (a.namespace.as_str(), a.name.as_str(), d))
        })
        .collect();
    for app in &head.applications {
        let Some(destination) = &app.destination_unknown else {
            continue;
        };
        let before = base_unknown.contains(&(
            app.namespace.as_str(),
            app.name.as_str(),
            destination.as_str(),
        ));
        // From Argo CD's API, a cluster the token may not read is left out silently: there an
        // unknown destination may be a hidden cluster, and is never let through as a note.
        let note = before && !inventory.partial_view;
        findings.push(Finding {
            rule: DESTINATION_UNKNOWN.into(),
            severity: if note {
                Severity::Note
            } else {
                Severity::Blocking
            },
            summary: format!(
                "Application {}/{} (from {}) has destination {destination}, which is no cluster of the inventory: Argo CD generates it and reports \"cluster not found\", and nothing is rendered for it{}",
                app.namespace,
                app.name,
                app.origin,
                if note {
                    " (so it was at the merge base too)"
                } else if before {
                    " (at the merge base too, but the inventory is Argo CD's view, which leaves out clusters its token may not read)"
                } else {
                    ""
                }
            ),
            evidence: serde_json::json!({
                "application": app.name,
                "namespace": app.namespace,
                "origin": app.origin.to_string(),
                "destination": destination,
            }),
        });
    }
    let mut invalid = BTreeSet::new();
    for app in &head.applications {
        for object in &app.objects {
            if let Some(why) = crd_name_problem(object) {
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                // The name is chart-controlled: shown quoted and cut, never as raw text.
                let shown: String = name.chars().take(80).collect();
                invalid.insert((app.name.clone(), app.cluster.name.clone(), shown, why));
            }
        }
    }
    for (application, cluster, name, why) in invalid {
        findings.push(Finding {
            rule: CRD_NAME_INVALID.into(),
            severity: Severity::Blocking,
            summary: format!(
                "Application {application} on {cluster} renders a CustomResourceDefinition {name:?} the API server would reject: {why}; none of its versions counts as served"
            ),
            evidence: serde_json::json!({"application": application, "cluster": cluster, "reason": why}),
        });
    }
    for (path, message) in unreadable {
        findings.push(Finding {
            rule: UNSCANNED_FILE.into(),
            severity: Severity::Note,
            summary: format!(
                "{path} could not be read as YAML and was not scanned for apiVersions ({message})"
            ),
            evidence: serde_json::json!({"path": path}),
        });
    }
    findings.sort_by(|a, b| (a.severity, &a.rule).cmp(&(b.severity, &b.rule)));
    findings
}

fn object_label(object: &ObjectKey) -> String {
    format!(
        "{} {}",
        object.kind,
        if object.namespace.is_empty() {
            object.name.clone()
        } else {
            format!("{}/{}", object.namespace, object.name)
        }
    )
}

/// Objects rendered with an apiVersion their cluster does not serve: a CRD of that group and
/// kind at this render without that version served, or a built-in group the inventory lists
/// without that version.
fn unserved_objects(
    rendering: &Rendering,
    crds: &BTreeMap<String, BTreeMap<String, CrdInfo>>,
    inventory: &Inventory,
) -> Vec<UnservedRendered> {
    let mut out = Vec::new();
    let destinations = inventory.destinations();
    for (app, object, api_version, kind) in grouped_objects(rendering) {
        let cluster_crds = crds.get(&app.cluster.name);
        let cluster = destinations.iter().find(|c| c.name == app.cluster.name);
        let (group, version) = split_api_version(api_version);
        {
            let crd =
                cluster_crds.and_then(|m| m.values().find(|c| c.group == group && c.kind == kind));
            let served: Option<Vec<String>> = match crd {
                Some(crd) => {
                    (!crd.served.contains(version)).then(|| crd.served.iter().cloned().collect())
                }
                None => cluster.as_ref().and_then(|c| {
                    let versions: Vec<String> = c
                        .api_versions
                        .iter()
                        .filter_map(|entry| {
                            let (g, rest) = entry.split_once('/')?;
                            (g == group && !rest.contains('/')).then(|| rest.to_string())
                        })
                        .collect();
                    (!versions.is_empty() && !versions.iter().any(|v| v == version))
                        .then_some(versions)
                }),
            };
            if let Some(served) = served {
                let text = |p: &str| {
                    object
                        .pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                out.push(UnservedRendered {
                    application: format!("{}/{}", app.namespace, app.name),
                    cluster: app.cluster.name.clone(),
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                    namespace: text("/metadata/namespace"),
                    name: text("/metadata/name"),
                    served,
                });
            }
        }
    }
    out
}

/// Objects whose group the destination cluster serves neither natively (the inventory's API
/// list) nor through a CRD rendered at this commit for that cluster. Argo CD's own kinds are
/// left to Argo CD. Returns (application, cluster, object key, whether the cluster's API list
/// is known).
fn not_served_objects(
    rendering: &Rendering,
    crds: &BTreeMap<String, BTreeMap<String, CrdInfo>>,
    inventory: &Inventory,
) -> Vec<(String, String, ObjectKey, String, bool)> {
    let destinations: std::collections::HashMap<String, crate::render::inventory::Cluster> =
        inventory
            .destinations()
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect();
    // Groups an APIService rendered for the cluster serves (an aggregated API, not a CRD).
    let mut aggregated: BTreeSet<(String, String)> = BTreeSet::new();
    for app in &rendering.applications {
        for object in &app.objects {
            if object.get("kind").and_then(Value::as_str) == Some("APIService")
                && object
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .is_some_and(|v| v.starts_with("apiregistration.k8s.io/"))
                && let Some(group) = object.pointer("/spec/group").and_then(Value::as_str)
            {
                aggregated.insert((app.cluster.name.clone(), group.to_string()));
            }
        }
    }
    let mut out = Vec::new();
    for (app, object, api_version, kind) in grouped_objects(rendering) {
        let (group, _) = split_api_version(api_version);
        if NATIVE_GROUPS.contains(&group) || group == "argoproj.io" {
            continue;
        }
        if app.destination_unknown.is_some()
            || aggregated.contains(&(app.cluster.name.clone(), group.to_string()))
        {
            continue;
        }
        if crds
            .get(&app.cluster.name)
            .is_some_and(|m| m.values().any(|c| c.group == group && c.kind == kind))
        {
            continue;
        }
        let Some(cluster) = destinations.get(&app.cluster.name) else {
            continue;
        };
        if serves_kind(&cluster.api_versions, group, kind) {
            continue;
        }
        // Argo CD's escape for a CRD installed from elsewhere: a note, not a blocker.
        let skip_dry_run = object
            .pointer("/metadata/annotations/argocd.argoproj.io~1sync-options")
            .and_then(Value::as_str)
            .is_some_and(|o| {
                o.split(',')
                    .any(|x| x.trim() == "SkipDryRunOnMissingResource=true")
            });
        let listed = !cluster.api_versions.is_empty() && !skip_dry_run;
        out.push((
            format!("{}/{}", app.namespace, app.name),
            app.cluster.name.clone(),
            ObjectKey::of(object),
            api_version.to_string(),
            listed,
        ));
    }
    out
}

/// Whether an inventory API list serves `kind` of `group` at some version: an entry
/// `group/version/Kind`, or `group/version` when the list names no kind of that
/// group/version (then every kind of it counts).
fn serves_kind(entries: &[String], group: &str, kind: &str) -> bool {
    let parts: Vec<Vec<&str>> = entries.iter().map(|e| e.split('/').collect()).collect();
    parts.iter().any(|p| match p.as_slice() {
        [g, _, k] => *g == group && *k == kind,
        [g, v] => {
            *g == group
                && !parts
                    .iter()
                    .any(|q| matches!(q.as_slice(), [qg, qv, _] if qg == g && qv == v))
        }
        _ => false,
    })
}

/// True when a version move crosses a major boundary (for 0.x, a minor change counts).
pub fn crosses_major(from: &str, to: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.trim_start_matches('v').split(['.', '-', '+']);
        Some((
            parts.next()?.parse().ok()?,
            parts.next().and_then(|m| m.parse().ok()).unwrap_or(0),
        ))
    };
    match (parse(from), parse(to)) {
        (Some((a_major, a_minor)), Some((b_major, b_minor))) => {
            a_major != b_major || (a_major == 0 && a_minor != b_minor)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::render::{ClusterRef, Origin, RenderStats};
    use serde_json::json;

    fn crd(served: &[&str]) -> Value {
        let versions: Vec<Value> = ["v1beta1", "v1"]
            .iter()
            .map(|v| json!({"name": v, "served": served.contains(v), "storage": *v == "v1"}))
            .collect();
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "externalsecrets.external-secrets.io"},
            "spec": {"group": "external-secrets.io", "names": {"kind": "ExternalSecret"}, "versions": versions}})
    }

    /// One cluster runs the CRD (from a registry chart) and this repository's own chart, which
    /// renders an ExternalSecret at v1beta1.
    fn rendering(served: &[&str]) -> Rendering {
        let app = |name: &str, source: Value, objects: Vec<Value>| RenderedApplication {
            name: name.into(),
            namespace: "argocd".into(),
            project: "default".into(),
            origin: Origin::File {
                path: "apps.yaml".into(),
                document: 0,
            },
            cluster: ClusterRef {
                name: "prod".into(),
                server: "https://prod".into(),
            },
            destination_namespace: "web".into(),
            sources: vec![source],
            objects: objects.into_iter().map(std::sync::Arc::new).collect(),
            render_keys: vec![],
            manifest: Value::Null,
            stored: Value::Null,
            destination_unknown: None,
            values_files: Vec::new(),
        };
        let secret = json!({"apiVersion": "external-secrets.io/v1beta1", "kind": "ExternalSecret",
            "metadata": {"name": "web-tls", "namespace": "web"}});
        Rendering {
            revision: "r".into(),
            applications: vec![
                app(
                    "external-secrets",
                    json!({"repoURL": "https://charts", "chart": "external-secrets"}),
                    vec![crd(served)],
                ),
                app(
                    "web",
                    json!({"repoURL": "https://git", "path": "charts/web"}),
                    vec![secret],
                ),
            ],
            diagnostics: Vec::new(),
            stats: RenderStats::default(),
        }
    }

    fn evaluate_with_template(template: &str) -> Vec<Finding> {
        let files = [
            ("charts/web/Chart.yaml", "name: web\nversion: 1.0.0\n"),
            ("charts/web/templates/tls.yaml", template),
        ]
        .into_iter()
        .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
        .collect();
        let snapshot = Snapshot::from_files("r", files);
        evaluate(
            &rendering(&["v1beta1", "v1"]),
            &rendering(&["v1"]),
            &RenderDiff::default(),
            &snapshot,
            &Inventory::default(),
        )
    }

    #[test]
    fn a_repository_chart_template_is_a_consumer_with_its_path() {
        let findings = evaluate_with_template(
            "{{- if .Values.tls }}\napiVersion: external-secrets.io/v1beta1\nkind: ExternalSecret\nmetadata:\n  name: {{ .Release.Name }}-tls\n{{- end }}\n",
        );
        let rules: Vec<&str> = findings.iter().map(|f| f.rule.as_str()).collect();
        assert_eq!(rules, [DROPPED_SERVED_VERSION]);
        let consumers = &findings[0].evidence["consumers"];
        assert_eq!(consumers[0]["path"], "charts/web/templates/tls.yaml");
        assert_eq!(consumers[0]["template"], true);
    }

    #[test]
    fn a_computed_api_version_in_a_repository_chart_names_the_chart() {
        let findings = evaluate_with_template(
            "apiVersion: {{ .Values.apiVersion }}\nkind: ExternalSecret\nmetadata:\n  name: x\n",
        );
        let unserved: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.rule == REPOSITORY_CHART_RENDERS_UNSERVED_VERSION)
            .collect();
        assert_eq!(unserved.len(), 1);
        assert_eq!(unserved[0].evidence["localChart"], "charts/web");
        assert!(
            unserved[0]
                .summary
                .contains("this repository's chart charts/web")
        );
        assert!(!unserved[0].summary.contains("no values to change"));
    }

    #[test]
    fn major_boundaries() {
        assert!(crosses_major("0.10.3", "2.10.0"));
        assert!(crosses_major("0.10.3", "0.11.0"));
        assert!(!crosses_major("1.19.2", "1.19.3"));
        assert!(!crosses_major("3.4.0", "3.5.0"));
        assert!(crosses_major("v3.4.0", "4.0.0"));
    }

    #[test]
    fn an_inventory_serves_a_kind_by_its_kind_entry_or_a_bare_group_version() {
        let list = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let kinds = list(&[
            "monitoring.coreos.com/v1",
            "monitoring.coreos.com/v1/ServiceMonitor",
        ]);
        assert!(serves_kind(
            &kinds,
            "monitoring.coreos.com",
            "ServiceMonitor"
        ));
        assert!(!serves_kind(&kinds, "monitoring.coreos.com", "Probe"));
        let versions = list(&["monitoring.coreos.com/v1"]);
        assert!(serves_kind(&versions, "monitoring.coreos.com", "Probe"));
        assert!(!serves_kind(
            &versions,
            "grafana.integreatly.org",
            "GrafanaDashboard"
        ));
    }
}
