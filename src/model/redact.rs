//! What never leaves the process: Secret values. Every value a prompt carries goes through
//! `redact` first; the gate's report hides the same values (`diff::REDACTED`).

use serde_json::Value;

/// Shown to a model instead of a Secret's value.
pub const REDACTED: &str = "(redacted)";

/// Whether a key names a credential: a password, secret, token, API or access key, private
/// key, credential, certificate, DSN or connection string (`_`, `-` and case ignored), or is
/// `key` or `auth` itself. Values under such keys never leave the process.
pub fn sensitive_key(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_lowercase();
    k == "key"
        || k == "auth"
        || k.ends_with("auth")
        || [
            "password",
            "passwd",
            "passphrase",
            "secret",
            "token",
            "apikey",
            "accesskey",
            "privatekey",
            "credential",
            "certificate",
            "dsn",
            "connectionstring",
        ]
        .iter()
        .any(|w| k.contains(w))
}

/// Whether the entry `key` of `map` holds a credential: its key is sensitive, or it is the
/// `value` of a `{name, value}` pair whose name is (an `env` list's `DB_PASSWORD`).
pub fn sensitive_entry(map: &serde_json::Map<String, Value>, key: &str) -> bool {
    sensitive_key(key)
        || (key == "value"
            && map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(sensitive_key))
}

/// A copy of `value` with the `data` and `stringData` values of every Secret in it (at any
/// depth: a List, a chart's values holding manifests) replaced.
pub fn redact(value: &Value) -> Value {
    let mut copy = value.clone();
    walk(&mut copy);
    copy
}

fn is_secret(map: &serde_json::Map<String, Value>) -> bool {
    map.get("kind").and_then(Value::as_str) == Some("Secret")
        && map
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_none_or(|v| v == "v1")
}

fn walk(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if is_secret(map) {
                for key in ["data", "stringData"] {
                    if let Some(Value::Object(entries)) = map.get_mut(key) {
                        for entry in entries.values_mut() {
                            *entry = Value::String(REDACTED.into());
                        }
                    } else if let Some(other) = map.get_mut(key) {
                        *other = Value::String(REDACTED.into());
                    }
                }
            }
            for child in map.values_mut() {
                walk(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(walk),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_values_are_replaced_at_any_depth() {
        let value = json!({"items": [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
             "data": {"password": "Y2FuYXJ5"}, "stringData": {"token": "canary-token"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "data": {"keep": "me"}}
        ]});
        let text = redact(&value).to_string();
        assert!(
            !text.contains("canary") && !text.contains("Y2FuYXJ5"),
            "{text}"
        );
        assert!(text.contains("keep") && text.contains("me"));
    }
}
