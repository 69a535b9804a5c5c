//! The store's selectors: label and field selectors and the maps they match.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::kube::store::resources::ApiError;

pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn fields_of(object: &Value) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    for (field, pointer) in [
        ("metadata.name", "/metadata/name"),
        ("metadata.namespace", "/metadata/namespace"),
    ] {
        fields.insert(
            field.to_string(),
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        );
    }
    fields
}

/// A parsed label or field selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    requirements: Vec<(String, String, Vec<String>)>,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, ApiError> {
        let mut requirements = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            // Split at the next comma outside parentheses.
            let mut depth = 0;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let term = rest[..end].trim();
            rest = rest.get(end + 1..).unwrap_or("").trim();
            if term.is_empty() {
                continue;
            }
            let invalid = || {
                ApiError::new(
                    400,
                    "BadRequest",
                    format!("unable to parse requirement: {term:?}"),
                )
            };
            let requirement = if let Some(key) = term.strip_prefix('!') {
                (key.trim().to_string(), "!".to_string(), vec![])
            } else if let Some((key, value)) = term.split_once("!=") {
                (
                    key.trim().to_string(),
                    "!=".to_string(),
                    vec![value.trim().to_string()],
                )
            } else if let Some((key, value)) = term.split_once("==") {
                (
                    key.trim().to_string(),
                    "=".to_string(),
                    vec![value.trim().to_string()],
                )
            } else if let Some((key, value)) = term.split_once('=') {
                (
                    key.trim().to_string(),
                    "=".to_string(),
                    vec![value.trim().to_string()],
                )
            } else if let Some(open) = term.find('(') {
                let head: Vec<&str> = term[..open].split_whitespace().collect();
                let values = term[open + 1..]
                    .trim_end_matches(')')
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                match head.as_slice() {
                    [key, "in"] => (key.to_string(), "in".to_string(), values),
                    [key, "notin"] => (key.to_string(), "notin".to_string(), values),
                    _ => return Err(invalid()),
                }
            } else {
                (term.to_string(), "exists".to_string(), vec![])
            };
            if requirement.0.is_empty() {
                return Err(invalid());
            }
            requirements.push(requirement);
        }
        Ok(Selector { requirements })
    }

    /// Whether the selector selects everything (no requirement).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|(key, op, values)| {
            let value = labels.get(key);
            match op.as_str() {
                "=" => value == values.first(),
                "!=" => value != values.first(),
                "in" => value.is_some_and(|v| values.contains(v)),
                "notin" => value.is_none_or(|v| !values.contains(v)),
                "exists" => value.is_some(),
                "!" => value.is_none(),
                _ => false,
            }
        })
    }
}
