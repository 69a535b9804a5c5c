//! Structural schema handling as the API server does it for custom resources: unknown fields
//! are pruned (unless `x-kubernetes-preserve-unknown-fields`), then types, `required` and
//! `enum` are validated. Patterns and formats are not checked.

use serde_json::{Map, Value};

use super::store::ApiError;

/// Prunes unknown fields and validates `object` against `schema`; the error lists every
/// violation with its field path, as the API server's 422 does.
pub fn prune_and_validate(object: &mut Value, schema: &Value, kind: &str) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if let Some(map) = object.as_object_mut() {
        // apiVersion, kind and metadata are validated by the server itself, never pruned.
        let mut rest: Map<String, Value> = map.clone();
        for key in ["apiVersion", "kind", "metadata"] {
            rest.remove(key);
        }
        let mut rest = Value::Object(rest);
        let mut root = schema.clone();
        if let Some(props) = root.get_mut("properties").and_then(Value::as_object_mut) {
            for key in ["apiVersion", "kind", "metadata"] {
                props.remove(key);
            }
        }
        if let Some(required) = root.get_mut("required").and_then(Value::as_array_mut) {
            required.retain(|r| !matches!(r.as_str(), Some("apiVersion" | "kind" | "metadata")));
        }
        walk(&mut rest, &root, "", &mut errors);
        for key in map.keys().cloned().collect::<Vec<_>>() {
            if !["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
                map.remove(&key);
            }
        }
        if let Value::Object(kept) = rest {
            map.extend(kept);
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("[{}]", errors.join(", "))
    };
    Err(ApiError::new(
        422,
        "Invalid",
        format!("{kind} \"{name}\" is invalid: {message}"),
    ))
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn walk(value: &mut Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null()
        && schema
            .get("nullable")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    {
        return;
    }
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let ok = actual == expected
            || (expected == "number" && actual == "integer")
            || (int_or_string && (actual == "integer" || actual == "string"));
        if !ok {
            let shown = if path.is_empty() { "<root>" } else { path };
            errors.push(format!(
                "{shown}: Invalid value: \"{actual}\": {shown} in body must be of type {expected}"
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        errors.push(format!(
            "{path}: Unsupported value: {value}: supported values: {}",
            list.join(", ")
        ));
    }
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    match value {
        Value::Object(map) => {
            // Defaults first (the API server defaults before it validates).
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (key, property) in properties {
                    if let (false, Some(default)) = (map.contains_key(key), property.get("default"))
                    {
                        map.insert(key.clone(), default.clone());
                    }
                }
            }
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for field in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(field) {
                        errors.push(format!("{}: Required value", child(path, field)));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let sub_schema = properties.and_then(|p| p.get(&key)).or(additional);
                match sub_schema {
                    Some(sub) => {
                        if let Some(v) = map.get_mut(&key) {
                            walk(v, sub, &child(path, &key), errors);
                        }
                    }
                    None if preserve
                        || (properties.is_none()
                            && additional.is_none()
                            && schema.get("type").is_none()) => {}
                    None => {
                        map.remove(&key);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, item_schema, &format!("{path}[{i}]"), errors);
                }
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                errors.push(format!(
                    "{path}: Invalid value: {}: {path} in body should have at least {min} items",
                    items.len()
                ));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_unknown_fields_and_reports_every_violation() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["stage"], "properties": {
                "stage": {"type": "string"}, "mode": {"type": "string", "enum": ["A", "B"]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}});
        let mut object = json!({"apiVersion": "x/v1", "kind": "P", "metadata": {"name": "p"},
            "spec": {"mode": "C", "unknown": 1, "free": {"anything": true}}, "extra": 1});
        let err = prune_and_validate(&mut object, &schema, "P").unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "P \"p\" is invalid: [spec.stage: Required value, spec.mode: Unsupported value: \"C\": supported values: \"A\", \"B\"]"
        );
        assert!(object["spec"].get("unknown").is_none());
        assert!(object.get("extra").is_none());
        assert_eq!(object["spec"]["free"]["anything"], json!(true));
        assert_eq!(object["metadata"]["name"], json!("p"));
    }
}
