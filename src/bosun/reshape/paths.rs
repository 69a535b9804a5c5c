//! Paths inside a document: keys and indexes, their text, and a document's leaves.

use serde_json::Value;

/// One step of a path inside a document.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A path inside a document, as keys and indexes (never joined text: a key may hold a `.`).
pub type DocPath = Vec<Seg>;

/// A path for messages: `spec.target.name`, `spec.data[0]`, and `["a.b"]` for a key that is
/// not a plain word.
pub fn path_text(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(key)
                if !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Seg::Key(key) => {
                out.push_str(&format!(
                    "[{}]",
                    serde_json::to_string(key).unwrap_or_default()
                ));
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Every leaf (scalar, empty object, empty list) of a document with its path, `apiVersion`,
/// `kind` and `metadata` excluded (the identity rule covers them).
pub fn leaf_paths(document: &Value) -> Vec<(DocPath, Value)> {
    fn walk(value: &Value, path: &mut DocPath, out: &mut Vec<(DocPath, Value)>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    path.push(Seg::Key(key.clone()));
                    walk(child, path, out);
                    path.pop();
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for (i, child) in items.iter().enumerate() {
                    path.push(Seg::Index(i));
                    walk(child, path, out);
                    path.pop();
                }
            }
            other => out.push((path.clone(), other.clone())),
        }
    }
    let mut out = Vec::new();
    if let Some(map) = document.as_object() {
        for (key, child) in map {
            if !["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
                walk(child, &mut vec![Seg::Key(key.clone())], &mut out);
            }
        }
    }
    out
}

/// `leaf_paths` with the paths as text (for messages and tests).
pub fn leaves(document: &Value) -> Vec<(String, Value)> {
    leaf_paths(document)
        .into_iter()
        .map(|(p, v)| (path_text(&p), v))
        .collect()
}
