//! The diff's room for CustomResourceDefinitions: versions at both commits, schema fields moved.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::FieldChange;

/// A CustomResourceDefinition's change, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdChange {
    pub before: Vec<CrdVersion>,
    pub after: Vec<CrdVersion>,
    /// Schema fields (paths under a version's `schema`) added, removed and changed, in the
    /// versions both commits have.
    pub schema_fields_added: usize,
    pub schema_fields_removed: usize,
    pub schema_fields_changed: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrdVersion {
    pub name: String,
    pub served: bool,
    pub storage: bool,
}

impl CrdChange {
    pub(super) fn of(old: &Value, new: &Value, fields: &[FieldChange]) -> Option<CrdChange> {
        let versions = |crd: &Value| -> Option<Vec<CrdVersion>> {
            if crd.get("kind")?.as_str()? != "CustomResourceDefinition" {
                return None;
            }
            Some(
                crd.pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| {
                        Some(CrdVersion {
                            name: v.get("name")?.as_str()?.to_string(),
                            served: v.get("served").and_then(Value::as_bool) == Some(true),
                            storage: v.get("storage").and_then(Value::as_bool) == Some(true),
                        })
                    })
                    .collect(),
            )
        };
        let (before, after) = (versions(old)?, versions(new)?);
        let mut change = CrdChange {
            before,
            after,
            schema_fields_added: 0,
            schema_fields_removed: 0,
            schema_fields_changed: 0,
        };
        for field in fields.iter().filter(|f| is_schema_field(&f.path)) {
            match (&field.old, &field.new) {
                (None, Some(_)) => change.schema_fields_added += 1,
                (Some(_), None) => change.schema_fields_removed += 1,
                _ => change.schema_fields_changed += 1,
            }
        }
        Some(change)
    }
}

/// The part of a CRD field path after `spec.versions[...]`, when it is one.
fn version_rest(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("spec.versions[")?;
    // Version names are DNS labels (the gate refuses others): no `]` inside.
    Some(&rest[rest.find(']')? + 1..])
}

/// A path inside a CRD version's schema (`spec.versions[name=v1].schema.…`).
pub fn is_schema_field(path: &str) -> bool {
    version_rest(path).is_some_and(|rest| rest == ".schema" || rest.starts_with(".schema."))
}

/// A path the CRD table summarises: a whole version added or removed, its served and storage
/// flags, its schema. Other version fields (deprecated, subresources, printer columns) are
/// listed like any field.
pub fn is_crd_version_field(path: &str) -> bool {
    version_rest(path)
        .is_some_and(|rest| rest.is_empty() || rest == ".served" || rest == ".storage")
        || is_schema_field(path)
}
