//! Matching rules Argo CD borrows from Go and Kubernetes: label selectors, `path.Match`
//! globbing for git generators, and the looser globs of directory sources.

use std::collections::BTreeMap;

use serde_json::Value;

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Reads a selector object; `None`/`{}` is the empty selector, which matches everything.
    pub fn from_value(value: Option<&Value>) -> Result<LabelSelector, String> {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return Ok(Self::default());
        };
        let object = value.as_object().ok_or("selector must be an object")?;
        let mut selector = LabelSelector::default();
        if let Some(labels) = object.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                selector.match_labels.insert(k.clone(), scalar_string(v));
            }
        }
        if let Some(expressions) = object.get("matchExpressions").and_then(Value::as_array) {
            for e in expressions {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or("matchExpressions entry without key")?;
                let operator = e
                    .get("operator")
                    .and_then(Value::as_str)
                    .ok_or("matchExpressions entry without operator")?;
                if !matches!(operator, "In" | "NotIn" | "Exists" | "DoesNotExist") {
                    return Err(format!("unknown selector operator {operator:?}"));
                }
                let values = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| vs.iter().map(scalar_string).collect())
                    .unwrap_or_default();
                selector.match_expressions.push(Requirement {
                    key: key.to_string(),
                    operator: operator.to_string(),
                    values,
                });
            }
        }
        Ok(selector)
    }

    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

fn scalar_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Go's `path.Match`: `*` matches any run of non-`/` characters, `?` one non-`/` character,
/// `[...]` a class (`[^...]` negated, ranges, `\` escapes). A malformed pattern matches nothing.
pub fn go_path_match(pattern: &str, name: &str) -> bool {
    match_from(pattern.as_bytes(), name.as_bytes(), false)
}

/// Like [`go_path_match`], and `**` as a whole segment matches any number of segments
/// (the git files generator's globbing).
pub fn doublestar_match(pattern: &str, name: &str) -> bool {
    let pattern_segments: Vec<&str> = pattern.split('/').collect();
    let name_segments: Vec<&str> = name.split('/').collect();
    segments_match(&pattern_segments, &name_segments)
}

fn segments_match(pattern: &[&str], name: &[&str]) -> bool {
    match pattern.first() {
        None => name.is_empty(),
        Some(&"**") => (0..=name.len()).any(|skip| segments_match(&pattern[1..], &name[skip..])),
        Some(p) => {
            !name.is_empty()
                && go_path_match(p, name[0])
                && segments_match(&pattern[1..], &name[1..])
        }
    }
}

/// A `git ls-files -- <pattern>` pathspec glob (fnmatch without FNM_PATHNAME): `*` and `?`
/// also match `/`.
pub fn git_pathspec_match(pattern: &str, name: &str) -> bool {
    match_from(pattern.as_bytes(), name.as_bytes(), true)
}

/// The globs of directory sources' `include`/`exclude`: `*` also crosses `/`, and `{a,b}`
/// alternatives are allowed.
pub fn loose_glob_match(pattern: &str, name: &str) -> bool {
    expand_braces(pattern)
        .iter()
        .any(|p| match_from(p.as_bytes(), name.as_bytes(), true))
}

fn expand_braces(pattern: &str) -> Vec<String> {
    let Some(open) = pattern.find('{') else {
        return vec![pattern.to_string()];
    };
    let Some(close_rel) = pattern[open..].find('}') else {
        return vec![pattern.to_string()];
    };
    let close = open + close_rel;
    let (head, body, tail) = (
        &pattern[..open],
        &pattern[open + 1..close],
        &pattern[close + 1..],
    );
    body.split(',')
        .flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}")))
        .collect()
}

fn match_from(pattern: &[u8], name: &[u8], star_crosses_slash: bool) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let mut backtrack: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    backtrack = Some((p, n));
                    p += 1;
                    continue;
                }
                b'?' if name[n] != b'/' || star_crosses_slash => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = match_class(&pattern[p..], name[n]) {
                        if matched {
                            p += next;
                            n += 1;
                            continue;
                        }
                    } else {
                        return false;
                    }
                }
                b'\\' if p + 1 < pattern.len() && pattern[p + 1] == name[n] => {
                    p += 2;
                    n += 1;
                    continue;
                }
                c if c != b'?' && c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        // Mismatch: let the last star swallow one more character, unless that is a `/`.
        match backtrack {
            Some((star_p, star_n)) if star_crosses_slash || name[star_n] != b'/' => {
                backtrack = Some((star_p, star_n + 1));
                p = star_p + 1;
                n = star_n + 1;
            }
            _ => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// Returns (matched, pattern bytes consumed) for a `[...]` class, `None` if malformed.
fn match_class(pattern: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negated = pattern.get(i) == Some(&b'^');
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let current = *pattern.get(i)?;
        if current == b']' && !first {
            return Some((matched != negated, i + 1));
        }
        first = false;
        let mut low = current;
        if low == b'\\' {
            i += 1;
            low = *pattern.get(i)?;
        }
        i += 1;
        let mut high = low;
        if pattern.get(i) == Some(&b'-') && pattern.get(i + 1).is_some_and(|c| *c != b']') {
            high = *pattern.get(i + 1)?;
            if high == b'\\' {
                high = *pattern.get(i + 2)?;
                i += 1;
            }
            i += 2;
        }
        if low <= c && c <= high {
            matched = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_path_match_semantics() {
        assert!(go_path_match("platform/*", "platform/web"));
        assert!(!go_path_match("platform/*", "platform/web/sub"));
        assert!(go_path_match("a/?b", "a/xb"));
        assert!(go_path_match("a/[a-c]x", "a/bx"));
        assert!(!go_path_match("a/[^a-c]x", "a/bx"));
        assert!(go_path_match("*/config.json", "team/config.json"));
        assert!(!go_path_match("*", "a/b"));
        assert!(go_path_match("a\\*b", "a*b"));
    }

    #[test]
    fn doublestar_crosses_segments() {
        assert!(doublestar_match(
            "clusters/**/config.yaml",
            "clusters/eu/prod/config.yaml"
        ));
        assert!(doublestar_match(
            "clusters/**/config.yaml",
            "clusters/config.yaml"
        ));
        assert!(!doublestar_match(
            "clusters/*/config.yaml",
            "clusters/eu/prod/config.yaml"
        ));
    }

    #[test]
    fn loose_glob_with_braces() {
        assert!(loose_glob_match("{*.yml,*.yaml}", "a/b.yaml"));
        assert!(!loose_glob_match("{*.yml,*.yaml}", "a/b.json"));
    }

    #[test]
    fn selectors() {
        let s = LabelSelector::from_value(Some(&json!({
            "matchLabels": {"env": "prod"},
            "matchExpressions": [{"key": "region", "operator": "In", "values": ["eu", "us"]},
                                 {"key": "legacy", "operator": "DoesNotExist"}]
        })))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(s.matches(&labels(&[("env", "prod"), ("region", "eu")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("region", "ap")])));
        assert!(!s.matches(&labels(&[
            ("env", "prod"),
            ("region", "eu"),
            ("legacy", "y")
        ])));
        assert!(LabelSelector::from_value(None).unwrap().is_empty());
    }
}
