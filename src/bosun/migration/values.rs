//! Reading values: helm's layering, what the new schema declares or dictates, leaves, paths.

use serde_json::Value;

use super::Migration;
use super::planning::values_of;
use crate::render::HelmFailure;

/// Helm's coalescing of values layers: maps merge key by key, a later scalar or list wins, a
/// `null` removes the key.
pub fn coalesce(base: &Value, layer: &Value) -> Value {
    match (base, layer) {
        (Value::Object(b), Value::Object(l)) => {
            let mut out = b.clone();
            for (k, v) in l {
                if v.is_null() {
                    out.remove(k);
                } else if let Some(existing) = out.get(k) {
                    let merged = coalesce(existing, v);
                    out.insert(k.clone(), merged);
                } else {
                    out.insert(k.clone(), v.clone());
                }
            }
            Value::Object(out)
        }
        (_, l) => l.clone(),
    }
}

/// The values one failing helm run gets: the chart's defaults, then each layer in order, the
/// repository's files as `files` (a proposal, or the originals) say.
pub(super) fn layered(
    migration: &Migration,
    failure: &HelmFailure,
    files: &[(String, Value)],
) -> Value {
    layered_over(migration.new_defaults.clone(), migration, failure, files)
}

/// `layered` over `values` instead of the chart's defaults.
pub(super) fn layered_over(
    mut values: Value,
    migration: &Migration,
    failure: &HelmFailure,
    files: &[(String, Value)],
) -> Value {
    for input in &failure.job.values {
        let own = input
            .file
            .as_ref()
            .filter(|f| migration.files.iter().any(|m| &m.place == *f))
            .and_then(|f| files.iter().find(|(p, _)| *p == f.path));
        let layer = match own {
            Some((_, v)) => v.clone(),
            None => values_of(&input.content, &input.name).unwrap_or(Value::Null),
        };
        values = coalesce(&values, &layer);
    }
    values
}

/// The schema node at a path of keys, following `properties`, then `additionalProperties`
/// when it is a schema. `Free` when the schema says nothing below (any key is declared).
pub(super) enum Node<'a> {
    At(&'a Value),
    Free,
    Undeclared,
}

pub(super) fn schema_at<'a>(schema: &'a Value, path: &[String]) -> Node<'a> {
    let mut node = schema;
    for key in path {
        if let Some(next) = node.get("properties").and_then(|p| p.get(key)) {
            node = next;
            continue;
        }
        if let Some(patterns) = node.get("patternProperties").and_then(Value::as_object) {
            // Many or large patterns, or one this regex engine cannot read (ECMA-262
            // lookarounds): counted as declaring everything, the side that refuses more.
            if patterns.len() > 64 || patterns.keys().any(|p| p.len() > 1024) {
                return Node::Free;
            }
            let mut matched = None;
            for (pattern, schema) in patterns {
                match regex::RegexBuilder::new(pattern)
                    .size_limit(1 << 20)
                    .build()
                {
                    Ok(r) if r.is_match(key) => {
                        matched = Some(schema);
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => return Node::Free,
                }
            }
            if let Some(next) = matched {
                node = next;
                continue;
            }
        }
        // Combinators and references are not followed: everything below counts as declared.
        if ["$ref", "allOf", "anyOf", "oneOf", "if"]
            .iter()
            .any(|k| node.get(k).is_some())
        {
            return Node::Free;
        }
        match node.get("additionalProperties") {
            Some(Value::Bool(false)) => return Node::Undeclared,
            Some(Value::Bool(true)) => return Node::Free,
            Some(next @ Value::Object(_)) => node = next,
            _ => {
                // Properties listed but the key is not one, with no `additionalProperties`:
                // allowed, but not declared; no properties at all: a free-form object.
                return if node.get("properties").is_some() {
                    Node::Undeclared
                } else {
                    Node::Free
                };
            }
        }
    }
    Node::At(node)
}

/// Whether the new chart declares a path: its schema names it (or leaves that object free),
/// or its values.yaml sets it.
pub(super) fn declared(migration: &Migration, path: &[String]) -> bool {
    !matches!(schema_at(&migration.new_schema, path), Node::Undeclared)
        || value_at(&migration.new_defaults, path).is_some()
}

/// Whether the schema dictates `value` at `path`: its default, its only enum value, its const.
pub(super) fn dictated(schema: &Value, path: &[String], value: &Value) -> bool {
    let Node::At(node) = schema_at(schema, path) else {
        return false;
    };
    node.get("default") == Some(value)
        || node.get("const") == Some(value)
        || node
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|e| e.len() == 1 && &e[0] == value)
}

pub(super) fn value_at<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut node = value;
    for key in path {
        node = node.as_object()?.get(key)?;
    }
    Some(node)
}

/// Every leaf of a values document (a scalar, a list, an empty map) with its path of keys.
pub fn leaves(value: &Value) -> Vec<(Vec<String>, Value)> {
    fn walk(value: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    path.push(k.clone());
                    walk(v, path, out);
                    path.pop();
                }
            }
            other => out.push((path.clone(), other.clone())),
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

pub(super) fn path_text(path: &[String]) -> String {
    crate::bosun::reshape::path_text(
        &path
            .iter()
            .map(|k| crate::bosun::reshape::Seg::Key(k.clone()))
            .collect::<Vec<_>>(),
    )
}

pub(super) fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}
