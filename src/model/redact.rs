//! What never leaves the process: credentials. Every value a prompt carries goes through one
//! function, `Held::redact` (or `redact` when nothing needs restoring), whichever path asks:
//! the reshape, the values migration, the mechanical fix and the green summary. A value is
//! held back, and a `(redacted-N)` placeholder sent instead, when
//!
//! - it is in a Secret's `data` or `stringData` (at any depth: a List, a custom resource
//!   carrying a manifest);
//! - its key names a credential (`sensitive_key`: password, token, secretKey, privateKey,
//!   credentials, ...), or it is the `value` of a `{name, value}` pair whose name does;
//! - a schema given alongside marks its field as one: `format: password`, or a description
//!   that speaks of a password, token, private or API key or credential (`schema_hint`);
//! - it has a known credential shape whatever its key (`token_shaped`: GitHub, GitLab, AWS,
//!   Slack, JWT, PEM private keys), carries user information in a URL or a credential flag
//!   (`sensitive_value`);
//! - the operator's `model.redact` rules in bosun.yaml name its key or match it (`Rules`).
//!
//! A placeholder stands for one path of the original; `Held::restore` puts the original's
//! value back where a reply carries it, so a held value is never taken from a reply. Generic
//! high-entropy strings are not held back: digests and image references are what the summary
//! and the mechanical fix are grounded in.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};
use serde_json::{Map, Value};

/// Whether a key names a credential: a password, secret, token, API or access key, private
/// key, credential, certificate, DSN or connection string (`_`, `-` and case ignored), or is
/// `key` or `auth` itself. Values under such keys never leave the process.
pub fn sensitive_key(key: &str) -> bool {
    let k = normal_key(key);
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

/// A key as `sensitive_key` and the operator's list compare it: letters and digits only,
/// lower case.
fn normal_key(key: &str) -> String {
    key.chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// Whether a string looks like it carries a credential whatever its key: a URL with user
/// information (`postgres://user:pass@host`), a flag naming one (`--client-secret=...`), or a
/// known token shape (`token_shaped`).
pub fn sensitive_value(text: &str) -> bool {
    // Every URL in the text, not only the first: a multi-line `config: |` block may name a
    // documentation link before `postgres://user:password@db/x`.
    static USERINFO: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s@]*@").expect("a fixed pattern")
    });
    // `KEY=value` lines or words whose key names a credential (kustomize's `literals`, an
    // env file, `--password=x` flags), and `password: x` written inside a string block.
    static ASSIGNED: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(
            r"(?m)^[ \t]*-{0,2}([A-Za-z0-9_.-]+)[ \t]*[:=][ \t]*\S|\s--?([A-Za-z0-9_.-]+)=\S",
        )
        .expect("a fixed pattern")
    });
    if USERINFO.is_match(text) || token_shaped(text) {
        return true;
    }
    ASSIGNED
        .captures_iter(text)
        .filter_map(|c| c.get(1).or_else(|| c.get(2)))
        .any(|key| sensitive_key(key.as_str().trim_start_matches('-')))
}

/// The shapes credentials are issued in, found anywhere in a string: GitHub tokens (`ghp_`,
/// `gho_`, `ghu_`, `ghs_`, `ghr_`, `github_pat_`), GitLab (`glpat-`), AWS access key ids
/// (`AKIA`, `ASIA`...), Slack (`xoxb-`...), JWTs (`eyJ...`.`eyJ...`), PEM private keys.
static TOKENS: LazyLock<RegexSet> = LazyLock::new(|| {
    RegexSet::new([
        r"\bgh[pousr]_[A-Za-z0-9]{20,}",
        r"\bgithub_pat_[A-Za-z0-9_]{20,}",
        r"\bglpat-[A-Za-z0-9_-]{20,}",
        r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b",
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
        r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}",
        r"-----BEGIN[A-Z ]*PRIVATE KEY-----",
    ])
    .expect("fixed patterns")
});

/// Whether a string holds a known credential shape (`TOKENS`).
pub fn token_shaped(text: &str) -> bool {
    TOKENS.is_match(text)
}

/// Whether the entry `key` of `map` holds a credential: its key is sensitive, or it is the
/// `value` of a `{name, value}` pair whose name is (an `env` list's `DB_PASSWORD`).
pub fn sensitive_entry(map: &Map<String, Value>, key: &str) -> bool {
    Rules::default().entry(map, key)
}

/// Whether a schema node marks its field as a credential: `format: password`, or (for a
/// field that is not an object or a list, whose description speaks of what it holds) a
/// description that speaks of a password, passphrase, token, private, secret, API or access
/// key, or credentials.
pub fn schema_hint(node: &Value) -> bool {
    if matches!(
        node.get("type").and_then(Value::as_str),
        Some("object" | "array")
    ) {
        return node.get("format").and_then(Value::as_str) == Some("password");
    }
    static WORDS: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)\b(password|passphrase|passwd|token|private key|secret key|api key|access key|credentials?)\b")
            .expect("a fixed pattern")
    });
    node.get("format").and_then(Value::as_str) == Some("password")
        || node
            .get("description")
            .and_then(Value::as_str)
            .is_some_and(|d| WORDS.is_match(d))
}

/// The redaction rules: the built-in ones and the operator's (`model.redact` in bosun.yaml:
/// more key names, and regular expressions a value may match).
#[derive(Debug, Clone, Default)]
pub struct Rules {
    keys: Vec<String>,
    values: Vec<Regex>,
}

impl Rules {
    /// The built-in rules with the operator's key names (compared as `sensitive_key` compares:
    /// letters and digits, any case) and value patterns (regular expressions, found anywhere
    /// in a string).
    pub fn new(keys: &[String], patterns: &[String]) -> Result<Rules, String> {
        Ok(Rules {
            keys: keys.iter().map(|k| normal_key(k)).collect(),
            values: patterns
                .iter()
                .map(|p| {
                    Regex::new(p).map_err(|e| {
                        format!("model.redact.values: {p:?} is not a regular expression: {e}")
                    })
                })
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether a key names a credential, by the built-in rule or the operator's list.
    pub fn key(&self, key: &str) -> bool {
        sensitive_key(key) || (!self.keys.is_empty() && self.keys.contains(&normal_key(key)))
    }

    /// Whether a string is a credential whatever its key.
    pub fn value(&self, text: &str) -> bool {
        sensitive_value(text) || self.values.iter().any(|r| r.is_match(text))
    }

    /// Whether the entry `key` of `map` holds a credential (`sensitive_entry`, with the
    /// operator's keys).
    pub fn entry(&self, map: &Map<String, Value>, key: &str) -> bool {
        self.key(key)
            || (key == "value"
                && map
                    .get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| self.key(n)))
    }
}

/// Values held back from a prompt, in the order their placeholders were given: the
/// placeholder `(redacted-N)` stands for the N-th, and each remembers where it was (a JSON
/// Pointer under the root it was redacted from).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    entries: Vec<(String, Value)>,
}

/// The placeholder of the N-th held value (from 1).
pub fn placeholder(n: usize) -> String {
    format!("(redacted-{n})")
}

fn placeholder_index(text: &str) -> Option<usize> {
    text.strip_prefix("(redacted-")?
        .strip_suffix(')')
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))?
        .parse::<usize>()
        .ok()?
        .checked_sub(1)
}

impl Held {
    pub fn new() -> Held {
        Held::default()
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The held values, in placeholder order.
    pub fn values(&self) -> impl Iterator<Item = &Value> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Whether a value held back was at `pointer` or under it (`root` as given to `redact`,
    /// then the path).
    pub fn covers(&self, pointer: &str) -> bool {
        self.entries.iter().any(|(p, _)| {
            p == pointer
                || p.strip_prefix(pointer)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// A copy of `value` with every credential in it replaced by a placeholder, the values
    /// held here. `schemas` are structural schemas `value` is an instance of (a CRD version's
    /// `openAPIV3Schema`, a chart's `values.schema.json`): their hints hold more back.
    /// `root` prefixes the paths remembered.
    pub fn redact(
        &mut self,
        root: &str,
        value: &Value,
        schemas: &[&Value],
        rules: &Rules,
    ) -> Value {
        let mut pointer = root.to_string();
        self.walk(value, false, schemas, rules, &mut pointer)
    }

    fn hold(&mut self, pointer: &str, value: &Value) -> Value {
        self.entries.push((pointer.to_string(), value.clone()));
        Value::String(placeholder(self.entries.len()))
    }

    fn walk(
        &mut self,
        value: &Value,
        hot: bool,
        schemas: &[&Value],
        rules: &Rules,
        pointer: &mut String,
    ) -> Value {
        let hot = hot || schemas.iter().any(|s| schema_hint(s));
        match value {
            Value::Object(map) => {
                let secret = is_secret(map);
                let mut out = Map::new();
                for (key, child) in map {
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    let below: Vec<&Value> = schemas
                        .iter()
                        .filter_map(|s| {
                            s.get("properties")
                                .and_then(|p| p.get(key))
                                .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
                        })
                        .collect();
                    let redacted = if secret && (key == "data" || key == "stringData") {
                        match child {
                            Value::Object(entries) => {
                                let mut held = Map::new();
                                for (k, v) in entries {
                                    let l = pointer.len();
                                    pointer.push('/');
                                    pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
                                    held.insert(k.clone(), self.hold(pointer, v));
                                    pointer.truncate(l);
                                }
                                Value::Object(held)
                            }
                            other => self.hold(pointer, other),
                        }
                    } else {
                        let hot = hot || rules.entry(map, key);
                        self.walk(child, hot, &below, rules, pointer)
                    };
                    pointer.truncate(len);
                    out.insert(key.clone(), redacted);
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                let below: Vec<&Value> = schemas.iter().filter_map(|s| s.get("items")).collect();
                Value::Array(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            let len = pointer.len();
                            pointer.push_str(&format!("/{i}"));
                            let out = self.walk(v, hot, &below, rules, pointer);
                            pointer.truncate(len);
                            out
                        })
                        .collect(),
                )
            }
            // A string shaped like a placeholder is held too: a placeholder in a reply then
            // always means one of ours.
            Value::String(text)
                if hot || rules.value(text) || placeholder_index(text).is_some() =>
            {
                self.hold(pointer, value)
            }
            Value::Number(_) if hot => self.hold(pointer, value),
            other => other.clone(),
        }
    }

    /// `value` with every placeholder of ours replaced by the value it stands for (a string
    /// that is not exactly a placeholder given here stays as it is).
    pub fn restore(&self, value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), self.restore(v)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.restore(v)).collect()),
            Value::String(text) => placeholder_index(text)
                .and_then(|i| self.entries.get(i))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| value.clone()),
            other => other.clone(),
        }
    }

    /// Whether `value` is, or holds, a value held back here: a comment names such a value's
    /// path and never shows it.
    pub fn shows_held(&self, value: &Value) -> bool {
        self.entries.iter().any(|(_, h)| h == value)
            || match value {
                Value::Object(map) => map.values().any(|v| self.shows_held(v)),
                Value::Array(items) => items.iter().any(|v| self.shows_held(v)),
                _ => false,
            }
    }

    /// `text` (an error message, a schema's complaint, a loss's value) with the held values in
    /// it replaced by their placeholders: a string wherever it is quoted (`"v"`, `'v'`, JSON),
    /// and bare when it is eight characters or more and not a plain word (so a held
    /// `password` does not blank the key `password` of a path); a number as a whole token.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (index, (_, value)) in self.entries.iter().enumerate() {
            let mark = placeholder(index + 1);
            match value {
                Value::String(s) if !s.is_empty() => {
                    let json = serde_json::to_string(s).unwrap_or_default();
                    for (quoted, with) in [
                        (json, format!("\"{mark}\"")),
                        (format!("\"{s}\""), format!("\"{mark}\"")),
                        (format!("'{s}'"), format!("'{mark}'")),
                    ] {
                        out = out.replace(&quoted, &with);
                    }
                    if s.chars().count() >= 8 && !s.chars().all(char::is_alphabetic) {
                        out = out.replace(s.as_str(), &mark);
                    }
                }
                Value::Number(n) => {
                    let n = n.to_string();
                    let mut kept = String::with_capacity(out.len());
                    let mut rest = out.as_str();
                    while let Some(at) = rest.find(&n) {
                        let before = rest[..at].chars().next_back();
                        let after = rest[at + n.len()..].chars().next();
                        let whole = before.is_none_or(|c| !c.is_alphanumeric() && c != '.')
                            && after.is_none_or(|c| !c.is_alphanumeric() && c != '.');
                        kept.push_str(&rest[..at]);
                        kept.push_str(if whole { &mark } else { &n });
                        rest = &rest[at + n.len()..];
                    }
                    kept.push_str(rest);
                    out = kept;
                }
                _ => {}
            }
        }
        out
    }
}

/// A copy of `value` with every credential replaced by a placeholder, for material nothing is
/// restored into (the mechanical fix's inventory, the green summary's notes).
pub fn redact(value: &Value, rules: &Rules) -> Value {
    Held::new().redact("", value, &[], rules)
}

fn is_secret(map: &Map<String, Value>) -> bool {
    map.get("kind").and_then(Value::as_str) == Some("Secret")
        && map
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_none_or(|v| v == "v1")
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
            "secretKey",
            "privateKey",
            "credentials",
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
    fn known_token_shapes_are_held_whatever_their_key() {
        for token in [
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "gho_0123456789abcdefghijABCDEFGHIJ012345",
            "glpat-abcdefghij0123456789",
            "AKIAIOSFODNN7EXAMPLE",
            "xoxb-1234567890-abcdefghij",
            "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----",
        ] {
            assert!(token_shaped(token), "{token}");
        }
        for text in [
            "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "quay.io/jetstack/cert-manager-controller:v1.19.3",
            "-----BEGIN CERTIFICATE-----",
            "ghp_short",
            "eyJ-only-one-part",
        ] {
            assert!(!token_shaped(text), "{text}");
        }
    }

    #[test]
    fn secret_values_are_replaced_at_any_depth() {
        let value = json!({"items": [
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
             "data": {"password": "Y2FuYXJ5"}, "stringData": {"token": "canary-token"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "data": {"keep": "me"}}
        ]});
        let text = redact(&value, &Rules::default()).to_string();
        assert!(
            !text.contains("canary") && !text.contains("Y2FuYXJ5"),
            "{text}"
        );
        assert!(text.contains("keep") && text.contains("me"));
    }

    #[test]
    fn schema_hints_operator_rules_and_shapes_hold_values_back_and_placeholders_restore_them() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "bind": {"type": "string", "format": "password"},
            "opaque": {"type": "string", "description": "The bearer token the hook presents."},
            "plain": {"type": "string", "description": "The name of the Secret to create."},
        }}}});
        let document = json!({"spec": {
            "bind": "b1nd", "opaque": "0paque", "plain": "target-secret",
            "template": {"data": {"password": "hunter2"}},
            "note": "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "house": "corp-internal-4412", "licence": "L-77",
            "trap": "(redacted-1)",
        }});
        let rules = Rules::new(&["LICENCE".into()], &["^corp-internal-".into()]).unwrap();
        let mut held = Held::new();
        let sent = held.redact("", &document, &[&schema], &rules);
        let text = sent.to_string();
        for secret in ["b1nd", "0paque", "hunter2", "ghp_", "corp-internal", "L-77"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(sent["spec"]["plain"], json!("target-secret"));
        // The planted placeholder was held too: a reply's placeholder is always ours.
        assert_ne!(sent["spec"]["trap"], json!("(redacted-1)"));
        assert_eq!(held.restore(&sent), document);
        assert!(held.covers("/spec/template"));
        assert!(!held.covers("/spec/plain"));
        let mark = sent["spec"]["template"]["data"]["password"]
            .as_str()
            .unwrap();
        assert_eq!(
            held.scrub("spec.template.data.password: \"hunter2\" is too short, 'hunter2'"),
            format!("spec.template.data.password: \"{mark}\" is too short, '{mark}'")
        );
        let mark = sent["spec"]["house"].as_str().unwrap();
        assert_eq!(
            held.scrub("at spec.house: corp-internal-4412."),
            format!("at spec.house: {mark}.")
        );
        let mut numbers = Held::new();
        numbers.redact("", &json!({"auth": {"pin": 8374}}), &[], &Rules::default());
        assert_eq!(
            numbers.scrub("pin: Invalid value: 8374: not 83745"),
            "pin: Invalid value: (redacted-1): not 83745"
        );
        // A placeholder a reply invents stands for nothing: it stays text.
        assert_eq!(
            held.restore(&json!("(redacted-99)")),
            json!("(redacted-99)")
        );
        assert!(Rules::new(&[], &["(".into()]).is_err());
    }

    /// The reviewer's misses: a URL with user information after another URL, `KEY=value`
    /// lines, a flag's `=value`, and `password: x` inside a string block.
    #[test]
    fn credentials_anywhere_in_a_string_are_held() {
        for text in [
            "docs http://example.test/x then postgres://app:hunter2@db.example.test/app",
            "DB_PASSWORD=hunter2\nLOG_LEVEL=info",
            "run --verbose --api-token=abc123",
            "settings:\n  password: hunter2\n  user: app",
        ] {
            assert!(sensitive_value(text), "{text:?}");
        }
        for text in [
            "see http://example.test/docs#auth for how to log in",
            "LOG_LEVEL=info",
            "replicas: 3",
        ] {
            assert!(!sensitive_value(text), "{text:?}");
        }
    }
}
