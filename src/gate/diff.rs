//! The diff of two renderings: Applications added, removed and changed per cluster; per
//! Application, objects added, removed and changed; per changed object, the fields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::render::{RenderedApplication, Rendering, object_sort_key};

/// An Application's identity across two renders.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AppKey {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} on {}", self.namespace, self.name, self.cluster)
    }
}

/// An object's identity inside one Application.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn of(object: &Value) -> ObjectKey {
        let (group, kind, namespace, name) = object_sort_key(object);
        ObjectKey {
            group,
            kind,
            namespace,
            name,
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}/{}", self.group, self.kind)
        };
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

/// Shown instead of a Secret's values.
pub const REDACTED: &str = "(secret value hidden)";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    /// `spec.template.spec.containers[0].image`
    pub path: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectChange {
    pub object: ObjectKey,
    pub fields: Vec<FieldChange>,
}

/// A chart whose version differs between the two renders of one Application.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartMove {
    pub chart: String,
    pub repo_url: String,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppStatus {
    Added,
    Removed,
    Changed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppDiff {
    pub app: AppKey,
    pub status: AppStatus,
    pub chart_moves: Vec<ChartMove>,
    pub added: Vec<ObjectKey>,
    pub removed: Vec<ObjectKey>,
    pub changed: Vec<ObjectChange>,
    /// True when the Application's own spec (sources, destination) changed.
    pub spec_changed: bool,
    /// The generated Application itself, field by field (labels, annotations, finalizers,
    /// spec: a sync policy, a destination, a source), between the two commits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub application_fields: Vec<FieldChange>,
    /// When the chart version moved and something else changed too: the chart's own change,
    /// rendered with the head's values at both versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_only: Option<ChartOnly>,
}

/// The objects a chart version move changes by itself (head's values at both versions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChartOnly {
    pub added: Vec<ObjectKey>,
    pub removed: Vec<ObjectKey>,
    pub changed: Vec<ObjectChange>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffCounts {
    pub applications_added: usize,
    pub applications_removed: usize,
    pub applications_changed: usize,
    pub objects_added: usize,
    pub objects_removed: usize,
    pub objects_changed: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RenderDiff {
    pub counts: DiffCounts,
    /// Only Applications with a difference, sorted by cluster and name.
    pub applications: Vec<AppDiff>,
}

pub fn key_of(app: &RenderedApplication) -> AppKey {
    AppKey {
        cluster: app.cluster.name.clone(),
        namespace: app.namespace.clone(),
        name: app.name.clone(),
    }
}

/// Charts an Application renders from: (repoURL, chart) -> version.
pub fn charts_of(app: &RenderedApplication) -> BTreeMap<(String, String), String> {
    app.sources
        .iter()
        .filter_map(|s| {
            let chart = s.get("chart")?.as_str()?;
            let repo = s.get("repoURL").and_then(Value::as_str).unwrap_or("");
            let version = s
                .get("targetRevision")
                .and_then(Value::as_str)
                .unwrap_or("");
            Some(((repo.to_string(), chart.to_string()), version.to_string()))
        })
        .collect()
}

pub fn diff(base: &Rendering, head: &Rendering) -> RenderDiff {
    let base_apps: BTreeMap<AppKey, &RenderedApplication> =
        base.applications.iter().map(|a| (key_of(a), a)).collect();
    let head_apps: BTreeMap<AppKey, &RenderedApplication> =
        head.applications.iter().map(|a| (key_of(a), a)).collect();
    let mut keys: Vec<&AppKey> = base_apps.keys().chain(head_apps.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut result = RenderDiff::default();
    for key in keys {
        let (old, new) = (base_apps.get(key), head_apps.get(key));
        let empty: Vec<Value> = Vec::new();
        let old_objects = old.map(|a| &a.objects).unwrap_or(&empty);
        let new_objects = new.map(|a| &a.objects).unwrap_or(&empty);
        let (added, removed, changed) = diff_objects(old_objects, new_objects);
        let status = match (old, new) {
            (None, Some(_)) => AppStatus::Added,
            (Some(_), None) => AppStatus::Removed,
            _ => AppStatus::Changed,
        };
        let spec_changed = match (old, new) {
            (Some(o), Some(n)) => {
                o.sources != n.sources || o.destination_namespace != n.destination_namespace
            }
            _ => false,
        };
        let mut application_fields = Vec::new();
        if let (Some(o), Some(n)) = (old, new)
            && o.stored != n.stored
        {
            diff_values("", &o.stored, &n.stored, &mut application_fields);
        }
        let chart_moves = match (old, new) {
            (Some(o), Some(n)) => {
                let (before, after) = (charts_of(o), charts_of(n));
                after
                    .iter()
                    .filter_map(|((repo, chart), to)| {
                        let from = before.get(&(repo.clone(), chart.clone()))?;
                        (from != to).then(|| ChartMove {
                            chart: chart.clone(),
                            repo_url: repo.clone(),
                            from: from.clone(),
                            to: to.clone(),
                        })
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        if status == AppStatus::Changed
            && added.is_empty()
            && removed.is_empty()
            && changed.is_empty()
            && !spec_changed
            && application_fields.is_empty()
        {
            continue;
        }
        match status {
            AppStatus::Added => result.counts.applications_added += 1,
            AppStatus::Removed => result.counts.applications_removed += 1,
            AppStatus::Changed => result.counts.applications_changed += 1,
        }
        result.counts.objects_added += added.len();
        result.counts.objects_removed += removed.len();
        result.counts.objects_changed += changed.len();
        result.applications.push(AppDiff {
            app: key.clone(),
            status,
            chart_moves,
            added,
            removed,
            changed,
            spec_changed,
            application_fields,
            chart_only: None,
        });
    }
    result
}

/// Objects added, removed and changed (with fields) between two object lists.
pub fn diff_objects(
    old: &[Value],
    new: &[Value],
) -> (Vec<ObjectKey>, Vec<ObjectKey>, Vec<ObjectChange>) {
    let index = |objects: &[Value]| -> BTreeMap<ObjectKey, Value> {
        objects
            .iter()
            .map(|o| (ObjectKey::of(o), o.clone()))
            .collect()
    };
    let (old, new) = (index(old), index(new));
    let added = new
        .keys()
        .filter(|k| !old.contains_key(*k))
        .cloned()
        .collect();
    let removed = old
        .keys()
        .filter(|k| !new.contains_key(*k))
        .cloned()
        .collect();
    let mut changed = Vec::new();
    for (key, new_object) in &new {
        let Some(old_object) = old.get(key) else {
            continue;
        };
        if old_object == new_object {
            continue;
        }
        let mut fields = Vec::new();
        diff_values("", old_object, new_object, &mut fields);
        if key.kind == "Secret" && key.group.is_empty() {
            for field in &mut fields {
                if field.path.starts_with("data") || field.path.starts_with("stringData") {
                    field.old = field.old.as_ref().map(|_| Value::String(REDACTED.into()));
                    field.new = field.new.as_ref().map(|_| Value::String(REDACTED.into()));
                }
            }
        }
        changed.push(ObjectChange {
            object: key.clone(),
            fields,
        });
    }
    (added, removed, changed)
}

fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (_, false) => format!(
            "{parent}[{}]",
            serde_json::to_string(key).unwrap_or_default()
        ),
    }
}

/// Appends the leaf differences between `old` and `new` under `path`.
pub fn diff_values(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => diff_values(&child_path(path, k), va, vb, out),
                    None => out.push(FieldChange {
                        path: child_path(path, k),
                        old: Some(va.clone()),
                        new: None,
                    }),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(FieldChange {
                        path: child_path(path, k),
                        old: None,
                        new: Some(vb.clone()),
                    });
                }
            }
        }
        (Value::Array(a), Value::Array(b))
            if named_items(a).is_some() && named_items(b).is_some() =>
        {
            // Lists of named items (containers, ports, CRD versions) are compared by name, so
            // an insertion does not show as a change of every later item.
            let (named_a, named_b) = (
                named_items(a).unwrap_or_default(),
                named_items(b).unwrap_or_default(),
            );
            for (name, x) in &named_a {
                let item_path = format!("{path}[name={name}]");
                match named_b.iter().find(|(n, _)| n == name) {
                    Some((_, y)) => diff_values(&item_path, x, y, out),
                    None => out.push(FieldChange {
                        path: item_path,
                        old: Some((*x).clone()),
                        new: None,
                    }),
                }
            }
            for (name, y) in &named_b {
                if !named_a.iter().any(|(n, _)| n == name) {
                    out.push(FieldChange {
                        path: format!("{path}[name={name}]"),
                        old: None,
                        new: Some((*y).clone()),
                    });
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let item_path = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => diff_values(&item_path, x, y, out),
                    (Some(x), None) => out.push(FieldChange {
                        path: item_path,
                        old: Some(x.clone()),
                        new: None,
                    }),
                    (None, Some(y)) => out.push(FieldChange {
                        path: item_path,
                        old: None,
                        new: Some(y.clone()),
                    }),
                    (None, None) => {}
                }
            }
        }
        (a, b) if a != b => out.push(FieldChange {
            path: path.to_string(),
            old: Some(a.clone()),
            new: Some(b.clone()),
        }),
        _ => {}
    }
}

/// The items of a list keyed by their `name`, when every item is an object with a distinct one.
fn named_items(items: &[Value]) -> Option<Vec<(String, &Value)>> {
    let mut out: Vec<(String, &Value)> = Vec::with_capacity(items.len());
    for item in items {
        let name = item.get("name")?.as_str()?.to_string();
        if out.iter().any(|(n, _)| *n == name) {
            return None;
        }
        out.push((name, item));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_paths() {
        let mut out = Vec::new();
        diff_values(
            "",
            &json!({"spec": {"containers": [{"image": "a:1"}], "x": 1}, "metadata": {"labels": {"app.kubernetes.io/name": "a"}}}),
            &json!({"spec": {"containers": [{"image": "a:2"}]}, "metadata": {"labels": {"app.kubernetes.io/name": "b"}}}),
            &mut out,
        );
        let paths: Vec<&str> = out.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "spec.containers[0].image",
                "spec.x",
                "metadata.labels[\"app.kubernetes.io/name\"]"
            ]
        );
    }

    #[test]
    fn named_lists_compare_by_name() {
        let mut out = Vec::new();
        diff_values(
            "spec",
            &json!({"versions": [{"name": "v1beta1", "served": true}, {"name": "v1", "served": true}]}),
            &json!({"versions": [{"name": "v1", "served": true}]}),
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, "spec.versions[name=v1beta1]");
        assert_eq!(out[0].new, None);
    }

    #[test]
    fn secret_values_are_hidden() {
        let old = vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "YQ=="}}),
        ];
        let new = vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "Yg=="}}),
        ];
        let (_, _, changed) = diff_objects(&old, &new);
        assert_eq!(changed[0].fields[0].path, "data.password");
        assert_eq!(changed[0].fields[0].new, Some(json!(REDACTED)));
        assert!(!serde_json::to_string(&changed).unwrap().contains("Yg=="));
    }
}
