//! The diff's room for field-level differences: leaf changes between two JSON values, by path.

use super::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    /// `spec.template.spec.containers[0].image`
    pub path: String,
    /// Absent from the JSON when the field was absent; `null` when it was null.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub old: Option<Value>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub new: Option<Value>,
}

/// A key present in the JSON is `Some`, even when its value is `null`.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
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
    walk_diff(path, old, new, &mut |path, old, new| {
        out.push(FieldChange {
            path,
            old: old.cloned(),
            new: new.cloned(),
        })
    });
}

/// The first `limit` leaf differences, and how many more there are: nothing beyond the limit
/// is copied (a chart's values.yaml can be megabytes).
pub fn diff_values_limited(old: &Value, new: &Value, limit: usize) -> (Vec<FieldChange>, usize) {
    let mut out = Vec::new();
    let mut more = 0usize;
    walk_diff("", old, new, &mut |path, old, new| {
        if out.len() < limit {
            out.push(FieldChange {
                path,
                old: old.cloned(),
                new: new.cloned(),
            });
        } else {
            more += 1;
        }
    });
    (out, more)
}

/// Receives each leaf difference: its path, the old value and the new one.
type Emit<'e> = dyn FnMut(String, Option<&Value>, Option<&Value>) + 'e;

fn walk_diff(path: &str, old: &Value, new: &Value, emit: &mut Emit<'_>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => walk_diff(&child_path(path, k), va, vb, emit),
                    None => emit(child_path(path, k), Some(va), None),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    emit(child_path(path, k), None, Some(vb));
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
                    Some((_, y)) => walk_diff(&item_path, x, y, emit),
                    None => emit(item_path, Some(x), None),
                }
            }
            for (name, y) in &named_b {
                if !named_a.iter().any(|(n, _)| n == name) {
                    emit(format!("{path}[name={name}]"), None, Some(y));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let item_path = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => walk_diff(&item_path, x, y, emit),
                    (x, y) if x.is_some() || y.is_some() => emit(item_path, x, y),
                    _ => {}
                }
            }
        }
        (a, b) if a != b => emit(path.to_string(), Some(a), Some(b)),
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
