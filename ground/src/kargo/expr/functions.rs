//! Functions: Kargo's template functions and the expr-lang built-ins a template needs.

use serde_json::json;
use serde_json::{Map, Value};

use super::eval::kind;
use super::templates::{go_json, to_text};
use crate::kargo::expr::Scope;

fn failed(status: &str) -> bool {
    matches!(status, "Failed" | "Errored")
}

/// `quote(x)`: a string as a Go-quoted literal; anything else as `unsafeQuote` does.
pub fn quote(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => serde_json::to_string(s).map_err(|e| e.to_string()),
        other => unsafe_quote(other),
    }
}

/// `unsafeQuote(x)`: the value's JSON between double quotes, escapes kept.
pub fn unsafe_quote(value: &Value) -> Result<String, String> {
    Ok(format!("\"{}\"", go_json(value)?))
}

/// A version as Masterminds' `semver.NewVersion` reads one (what Kargo's `semverDiff` uses):
/// a leading `v`, and a missing minor or patch (`1`, `1.2`) taken as 0.
fn lenient_version(text: &str) -> Option<semver::Version> {
    let text = text.trim().strip_prefix('v').unwrap_or(text.trim());
    let split = text.find(['-', '+']).unwrap_or(text.len());
    let (core, rest) = text.split_at(split);
    let parts: Vec<&str> = core.split('.').collect();
    if parts.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut full: Vec<&str> = parts.clone();
    while full.len() < 3 {
        full.push("0");
    }
    semver::Version::parse(&format!("{}{rest}", full.join("."))).ok()
}

/// Kargo's `semverDiff`: Major, Minor, Patch, Metadata, None, or Incomparable.
pub fn semver_diff(a: &str, b: &str) -> &'static str {
    let parse = lenient_version;
    let (Some(a), Some(b)) = (parse(a), parse(b)) else {
        return "Incomparable";
    };
    if a.major != b.major {
        "Major"
    } else if a.minor != b.minor {
        "Minor"
    } else if a.patch != b.patch {
        "Patch"
    } else if a.build != b.build {
        "Metadata"
    } else {
        "None"
    }
}

fn arg(args: &[Value], i: usize) -> String {
    args.get(i)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Kargo's functions ([K pkg/expressions/function/functions.go]) and the few expr-lang
/// built-ins a template needs.
pub(super) fn call(name: &str, args: &[Value], scope: Option<&Scope>) -> Result<Value, String> {
    let first = args.first().cloned().unwrap_or(Value::Null);
    let builtin = match name {
        "quote" => Some(Value::String(quote(&first)?)),
        "unsafeQuote" => Some(Value::String(unsafe_quote(&first)?)),
        "len" => Some(json!(match &first {
            Value::String(s) => s.chars().count(),
            Value::Array(a) => a.len(),
            Value::Object(m) => m.len(),
            other => return Err(format!("invalid argument for len (type {})", kind(other))),
        })),
        // expr-lang's string() is fmt's %v: nil is "<nil>".
        "string" => Some(Value::String(match &first {
            Value::Null => "<nil>".to_string(),
            other => to_text(other)?,
        })),
        "lower" => Some(json!(arg(args, 0).to_lowercase())),
        "upper" => Some(json!(arg(args, 0).to_uppercase())),
        "trim" => Some(json!(arg(args, 0).trim())),
        "hasPrefix" => Some(json!(arg(args, 0).starts_with(&arg(args, 1)))),
        "hasSuffix" => Some(json!(arg(args, 0).ends_with(&arg(args, 1)))),
        "trimPrefix" => Some(json!(
            arg(args, 0)
                .strip_prefix(arg(args, 1).as_str())
                .map(str::to_string)
                .unwrap_or_else(|| arg(args, 0))
        )),
        "semverDiff" => {
            if args.len() != 2 {
                return Err(format!("expected 2 arguments, got {}", args.len()));
            }
            for (i, which) in [(0, "first"), (1, "second")] {
                if !args[i].is_string() {
                    return Err(format!(
                        "{which} argument must be string, got {}",
                        kind(&args[i])
                    ));
                }
            }
            Some(json!(semver_diff(&arg(args, 0), &arg(args, 1))))
        }
        "warehouse" => {
            let name = arg(args, 0);
            if name.is_empty() {
                return Err("name must not be empty".into());
            }
            Some(json!({"kind": "Warehouse", "name": name}))
        }
        "always" => Some(json!(true)),
        _ => None,
    };
    if let Some(value) = builtin {
        return Ok(value);
    }
    let scope = scope.ok_or_else(|| format!("unknown function {name}()"))?;
    let freight = scope.freight;
    Ok(match name {
        "failure" => json!(scope.statuses.iter().any(|(_, s)| failed(s))),
        "success" => json!(!scope.statuses.iter().any(|(_, s)| failed(s))),
        "status" => json!(
            scope
                .statuses
                .iter()
                .find(|(a, _)| *a == arg(args, 0))
                .map(|(_, s)| s.clone())
                .unwrap_or_default()
        ),
        "secret" => scope
            .secrets
            .get(&arg(args, 0))
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new())),
        "chartFrom" => {
            let (repo, chart) = (arg(args, 0), arg(args, 1));
            let found = freight
                .get("charts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                // [K functions.go chartFrom, FindChart]: the repoURL and the name match
                // exactly; an oci:// repository's chart has no name.
                .find(|c| {
                    c.get("repoURL").and_then(Value::as_str) == Some(repo.as_str())
                        && c.get("name").and_then(Value::as_str).unwrap_or("") == chart
                })
                .ok_or(format!(
                    "the target Freight has no chart {chart} from {repo}"
                ))?;
            json!({"RepoURL": found["repoURL"], "Name": found["name"], "Version": found["version"]})
        }
        "imageFrom" => {
            let repo = arg(args, 0);
            let found = freight
                .get("images")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|i| i.get("repoURL").and_then(Value::as_str) == Some(repo.as_str()))
                .ok_or(format!("the target Freight has no image {repo}"))?;
            json!({"RepoURL": found["repoURL"], "Tag": found["tag"], "Digest": found["digest"]})
        }
        other => return Err(format!("function {other}() is not supported by the ground")),
    })
}
