//! Reading the head's repository: every manifest of its YAML files, and the literal
//! apiVersions of its own charts' templates (the consumers of an API version a person can
//! edit).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Consumer, Finding, Inputs, Severity, UNSCANNED_FILE};
use crate::git::Snapshot;
use crate::render::Rendering;
use crate::yaml;

/// Every manifest (a document with apiVersion and kind) in the repository's YAML files, outside
/// chart templates and hidden folders, and the files that could not be read as YAML.
#[derive(Debug, Default)]
pub struct ManifestScan {
    pub manifests: Vec<Consumer>,
    /// (path, why)
    pub unreadable: Vec<(String, String)>,
}

pub fn scan_manifests(snapshot: &Snapshot) -> ManifestScan {
    let mut manifests = Vec::new();
    let mut unreadable = Vec::new();
    for path in snapshot.manifest_files() {
        let text = match yaml::utf8(snapshot.read(path).unwrap_or_default(), path) {
            Ok(text) => text,
            Err(e) => {
                unreadable.push((path.to_string(), e));
                continue;
            }
        };
        match yaml::parse_documents(text, path) {
            Ok(documents) => {
                for (index, document) in documents.into_iter().enumerate() {
                    let (Some(api_version), Some(kind)) = (
                        document.get("apiVersion").and_then(Value::as_str),
                        document.get("kind").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    let text = |p: &str| {
                        document
                            .pointer(p)
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string()
                    };
                    let consumer = Consumer {
                        path: path.to_string(),
                        document: index,
                        api_version: api_version.to_string(),
                        kind: kind.to_string(),
                        namespace: text("/metadata/namespace"),
                        name: text("/metadata/name"),
                        template: false,
                    };
                    manifests.push(consumer);
                }
            }
            Err(e) => {
                unreadable.push((path.to_string(), format!("line {}: {}", e.line, e.message)))
            }
        }
    }
    ManifestScan {
        manifests,
        unreadable,
    }
}

/// Charts in this repository that head Applications render (a source with a `path` holding a
/// `Chart.yaml`), by directory.
pub(super) fn local_chart_dirs(
    rendering: &Rendering,
    snapshot: &Snapshot,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for app in &rendering.applications {
        for source in &app.sources {
            if source.get("chart").is_some() {
                continue;
            }
            let Some(path) = source.get("path").and_then(Value::as_str) else {
                continue;
            };
            let dir = crate::paths::normalize(path);
            if snapshot.exists(&format!("{dir}/Chart.yaml")) {
                out.entry(dir)
                    .or_default()
                    .push(format!("{}/{}", app.namespace, app.name));
            }
        }
    }
    out
}

/// The apiVersions the templates of a repository chart declare as literal lines
/// (`apiVersion: group/version` at the start of a line, in a document with a literal `kind:`).
/// An apiVersion computed by a template expression is not a literal and is not listed.
pub fn scan_chart_templates(snapshot: &Snapshot, chart_dir: &str) -> Vec<Consumer> {
    let mut out = Vec::new();
    let templates = format!("{chart_dir}/templates");
    for (path, content) in snapshot.files_under(&templates) {
        if !(path.ends_with(".yaml") || path.ends_with(".yml")) {
            continue;
        }
        let text = String::from_utf8_lossy(content);
        let mut documents: Vec<Vec<&str>> = vec![Vec::new()];
        for line in text.lines() {
            if line.trim_end() == "---" {
                documents.push(Vec::new());
            } else if let Some(current) = documents.last_mut() {
                current.push(line);
            }
        }
        for (index, lines) in documents.iter().enumerate() {
            let literal = |key: &str| -> Vec<String> {
                lines
                    .iter()
                    .filter_map(|line| {
                        let value = line.strip_prefix(key)?.trim();
                        let value = value.trim_matches(|c| c == '"' || c == '\'');
                        (!value.is_empty() && !value.contains("{{") && !value.contains(' '))
                            .then(|| value.to_string())
                    })
                    .collect()
            };
            let Some(kind) = literal("kind:").into_iter().next() else {
                continue;
            };
            let name = lines
                .iter()
                .skip_while(|line| !line.starts_with("metadata:"))
                .find_map(|line| line.strip_prefix("  name:"))
                .map(|name| name.trim().to_string())
                .unwrap_or_default();
            for api_version in literal("apiVersion:") {
                out.push(Consumer {
                    path: path.to_string(),
                    document: index,
                    api_version,
                    kind: kind.clone(),
                    namespace: String::new(),
                    name: name.clone(),
                    template: true,
                });
            }
        }
    }
    out
}

/// `unscanned-file`, a note: a YAML file of the head that could not be read as YAML was not
/// scanned for apiVersions, so a consumer of a dropped version may hide in it.
pub(super) fn unscanned_files(inputs: &Inputs<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (path, message) in &inputs.scan.unreadable {
        findings.push(Finding {
            rule: UNSCANNED_FILE.into(),
            severity: Severity::Note,
            summary: format!(
                "{path} could not be read as YAML and was not scanned for apiVersions ({message})"
            ),
            evidence: serde_json::json!({"path": path}),
        });
    }
    findings
}
