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
    k.ends_with("key")
        || k == "auth"
        || k.ends_with("auth")
        || k.ends_with("pw")
        || k.ends_with("pass")
        || k.ends_with("webhookurl")
        || k.ends_with("databaseurl")
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

/// Whether a string looks like it carries a credential whatever its key: a URL with user
/// information (`postgres://user:pass@host`), or a flag naming one (`--client-secret=...`).
pub fn sensitive_value(text: &str) -> bool {
    if let Some((_, rest)) = text.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return true;
        }
    }
    text.starts_with('-')
        && text
            .split_once('=')
            .is_some_and(|(flag, _)| sensitive_key(flag.trim_start_matches('-')))
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
    fn credential_keys_and_values_are_recognised() {
        for key in [
            "password",
            "dbPassword",
            "apiToken",
            "client_secret",
            "signingKey",
            "tlsKey",
            "bindPW",
            "smtpPass",
            "slackWebhookUrl",
            "DATABASE_URL",
            "dsn",
            "auth",
        ] {
            assert!(sensitive_key(key), "{key}");
        }
        for key in [
            "enabled",
            "replicaCount",
            "image",
            "tag",
            "interval",
            "keepalive",
        ] {
            assert!(!sensitive_key(key), "{key}");
        }
        assert!(sensitive_value("postgres://u:p@db:5432/x"));
        assert!(sensitive_value("--client-secret=abc"));
        assert!(!sensitive_value("https://charts.example.test/stable"));
        assert!(!sensitive_value("--v=2"));
    }

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
