//! The diff's room for field-level differences: leaf changes between two JSON values, by path.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    let mut path = parent.to_string();
    push_key(&mut path, key);
    path
}

/// Appends `key` to a path: `.key` for a plain key (none before it at the root), `["key"]`
/// for any other.
fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&serde_json::to_string(key).unwrap_or_default());
        path.push(']');
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
    walk(&mut path.to_string(), old, new, emit);
}

/// [`walk_diff`] with one path buffer for the whole walk: each level appends its segment and
/// takes it off again, and a path is copied only when a difference is emitted (a CRD's
/// schema has thousands of equal fields).
fn walk(path: &mut String, old: &Value, new: &Value, emit: &mut Emit<'_>) {
    let depth = path.len();
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                push_key(path, k);
                match b.get(k) {
                    Some(vb) => walk(path, va, vb, emit),
                    None => emit(path.clone(), Some(va), None),
                }
                path.truncate(depth);
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
                path.push_str("[name=");
                path.push_str(name);
                path.push(']');
                match named_b.iter().find(|(n, _)| n == name) {
                    Some((_, y)) => walk(path, x, y, emit),
                    None => emit(path.clone(), Some(x), None),
                }
                path.truncate(depth);
            }
            for (name, y) in &named_b {
                if !named_a.iter().any(|(n, _)| n == name) {
                    emit(format!("{path}[name={name}]"), None, Some(y));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                use std::fmt::Write;
                let _ = write!(path, "[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => walk(path, x, y, emit),
                    (x, y) if x.is_some() || y.is_some() => emit(path.clone(), x, y),
                    _ => {}
                }
                path.truncate(depth);
            }
        }
        (a, b) if a != b => emit(path.clone(), Some(a), Some(b)),
        _ => {}
    }
}

/// The items of a list keyed by their `name`, when every item is an object with a distinct one.
fn named_items(items: &[Value]) -> Option<Vec<(&str, &Value)>> {
    let mut out: Vec<(&str, &Value)> = Vec::with_capacity(items.len());
    for item in items {
        let name = item.get("name")?.as_str()?;
        if out.iter().any(|(n, _)| *n == name) {
            return None;
        }
        out.push((name, item));
    }
    (!out.is_empty()).then_some(out)
}
