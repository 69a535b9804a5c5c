//! The inventory of editable keys, and the values each key may take.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::{ChangedDefault, ChangedFile, Editable, Fix, MAX_INVENTORY, key_text, value_at};
use crate::bosun::classify::Handoff;
use crate::bosun::repair::Refusal;
use crate::gate::rules::NotServed;
use crate::render::Rendering;
use crate::render::charts::{self, ChartRef};
use crate::yaml::edit::Segment;

fn strings(key: &[String]) -> Vec<Segment> {
    key.iter().map(|k| Segment::Key(k.clone())).collect()
}

/// Whether a value looks like a version, an image tag or a digest (by its key or its shape).
pub fn version_shaped(key: &[Segment], value: &Value) -> bool {
    let Some(text) = value.as_str() else {
        return false;
    };
    let last = match key.last() {
        Some(Segment::Key(k)) => k.to_ascii_lowercase(),
        _ => String::new(),
    };
    let by_key = [
        "tag",
        "version",
        "digest",
        "image",
        "targetrevision",
        "appversion",
    ]
    .iter()
    .any(|k| last == *k || last.ends_with(k));
    let digits = text.trim_start_matches('v');
    let by_shape = text.starts_with("sha256:")
        || (digits.chars().next().is_some_and(|c| c.is_ascii_digit())
            && digits.contains('.')
            && digits
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-+_".contains(c)));
    by_key || by_shape
}

fn sensitive(key: &[Segment]) -> bool {
    key.iter().any(|s| match s {
        Segment::Key(k) => crate::model::redact::sensitive_key(k),
        Segment::Index(_) => false,
    })
}

/// The scalar leaves of a YAML file with their paths (keys and list indexes).
fn scalar_leaves(text: &str, origin: &str) -> Vec<(Vec<Segment>, Value)> {
    let Ok(value) = crate::yaml::parse_document(text, origin) else {
        return Vec::new();
    };
    fn walk(value: &Value, path: &mut Vec<Segment>, out: &mut Vec<(Vec<Segment>, Value)>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    // A credential (by its key, or an env list's `{name: DB_PASSWORD,
                    // value: ...}`) is never editable, nor shown to a model.
                    if crate::model::redact::sensitive_entry(map, k) {
                        continue;
                    }
                    path.push(Segment::Key(k.clone()));
                    walk(v, path, out);
                    path.pop();
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    path.push(Segment::Index(i));
                    walk(v, path, out);
                    path.pop();
                }
            }
            Value::Null => {}
            Value::String(text) if crate::model::redact::sensitive_value(text) => {}
            other => out.push((path.clone(), other.clone())),
        }
    }
    let mut out = Vec::new();
    walk(&value, &mut Vec::new(), &mut out);
    out
}

/// What one Application the `not-served` blocks name brings to the fix: the values files it
/// layers (path, text at the head) and the chart defaults that changed under it.
#[derive(Debug, Clone, Default)]
pub struct AppInputs {
    pub values_files: Vec<(String, String)>,
    pub defaults: Vec<ChangedDefault>,
}

/// Gathers each named Application's inputs from the head's rendering (its values files), the
/// base's (the chart versions it moves from) and the chart mirror (both versions' defaults),
/// then builds the fix. `read` reads a file at the head.
#[allow(clippy::too_many_arguments)] // the head and base views are read separately
pub fn plan(
    not_served: &[NotServed],
    head: &Rendering,
    base: Option<&Rendering>,
    mirror: Option<&Path>,
    changed_files: &[String],
    read: &dyn Fn(&str) -> Option<String>,
    read_base: &dyn Fn(&str) -> Option<String>,
    report: &str,
) -> Result<Fix, Refusal> {
    let named: Vec<&str> = not_served
        .iter()
        .flat_map(|n| n.applications.iter().map(String::as_str))
        .collect();
    let mut apps = Vec::new();
    for app in head.applications.iter().filter(|a| {
        named.contains(&format!("{}/{} on {}", a.namespace, a.name, a.cluster.name).as_str())
    }) {
        let mut inputs = AppInputs::default();
        for path in &app.values_files {
            if let Some(text) = read(path) {
                inputs.values_files.push((path.clone(), text));
            }
        }
        // The chart defaults that changed, for each chart source that moved.
        let base_app = base.and_then(|b| {
            b.applications.iter().find(|x| {
                x.name == app.name
                    && x.namespace == app.namespace
                    && x.cluster.name == app.cluster.name
            })
        });
        for source in &app.sources {
            let (Some(chart), Some(to), Some(repo)) = (
                source.get("chart").and_then(Value::as_str),
                source.get("targetRevision").and_then(Value::as_str),
                source.get("repoURL").and_then(Value::as_str),
            ) else {
                continue;
            };
            let from = base_app.and_then(|b| {
                b.sources.iter().find_map(|s| {
                    (s.get("chart").and_then(Value::as_str) == Some(chart))
                        .then(|| s.get("targetRevision").and_then(Value::as_str))
                        .flatten()
                })
            });
            let Some(from) = from.filter(|f| *f != to) else {
                continue;
            };
            let at = |version: &str| {
                charts::default_values(
                    mirror,
                    &ChartRef {
                        repo_url: repo.to_string(),
                        chart: chart.to_string(),
                        version: version.to_string(),
                    },
                )
            };
            let (Ok(old), Ok(new)) = (at(from), at(to)) else {
                continue;
            };
            inputs
                .defaults
                .extend(changed_defaults(chart, from, to, &old, &new));
        }
        apps.push(inputs);
    }
    let changed: Vec<ChangedFile> = changed_files
        .iter()
        .filter(|p| p.ends_with(".yaml") || p.ends_with(".yml"))
        .filter_map(|p| {
            read(p).map(|text| ChangedFile {
                path: p.clone(),
                text,
                base: read_base(p),
            })
        })
        .collect();
    // Files an Application the blocks do not name also layers.
    let shared: std::collections::BTreeSet<String> = head
        .applications
        .iter()
        .filter(|a| {
            !named.contains(&format!("{}/{} on {}", a.namespace, a.name, a.cluster.name).as_str())
        })
        .flat_map(|a| a.values_files.iter().cloned())
        .collect();
    build(not_served, &apps, &changed, &shared, report)
}

/// The defaults of a chart that differ between two versions' values.
pub fn changed_defaults(
    chart: &str,
    from: &str,
    to: &str,
    old: &Value,
    new: &Value,
) -> Vec<ChangedDefault> {
    let old_leaves = crate::bosun::migration::leaves(old);
    let new_leaves = crate::bosun::migration::leaves(new);
    let mut keys: Vec<&Vec<String>> = old_leaves
        .iter()
        .chain(new_leaves.iter())
        .map(|(k, _)| k)
        .collect();
    keys.sort();
    keys.dedup();
    let find = |leaves: &[(Vec<String>, Value)], key: &Vec<String>| {
        leaves
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    keys.into_iter()
        .filter(|key| !key.is_empty())
        .filter_map(|key| {
            let (o, n) = (find(&old_leaves, key), find(&new_leaves, key));
            (o != n).then(|| ChangedDefault {
                chart: chart.to_string(),
                from: from.to_string(),
                to: to.to_string(),
                key: key.clone(),
                old: o,
                new: n,
            })
        })
        .collect()
}

/// Builds the fix's inventory, and for each entry the values it may take (the harness
/// enforces them; the prompt only lists them):
/// - a chart default that changed, settable in each values file the Application layers: its
///   old default (pinning it back); or `false` for a boolean the new version turned on whose
///   key names the kind the cluster does not serve (`serviceMonitor.enabled`);
/// - a version line the pull request changed: a version a chart of this change moves to (a
///   coupled pin), never its value at the base (that would undo the promotion).
///
/// Only files no other Application layers (`shared` lists those): an edit must not reach a
/// cluster that serves the kind. Credentials are never editable, nor shown.
pub fn build(
    not_served: &[NotServed],
    apps: &[AppInputs],
    changed_files: &[ChangedFile],
    shared: &std::collections::BTreeSet<String>,
    report: &str,
) -> Result<Fix, Refusal> {
    let kinds: Vec<String> = not_served
        .iter()
        .map(|n| n.kind.to_ascii_lowercase())
        .collect();
    let mut found = Found::default();
    for app in apps {
        found.chart_defaults(app, shared, &kinds);
    }
    found.version_lines(changed_files);
    found.finish(not_served, report)
}

/// The inventory as `build` gathers it.
#[derive(Default)]
struct Found {
    /// The files an entry edits: path, text at the head.
    files: BTreeMap<String, String>,
    inventory: Vec<Editable>,
    /// (file, key) of each entry, to keep the first.
    seen: std::collections::BTreeSet<(String, String)>,
    /// The chart defaults that changed, each once.
    defaults: Vec<ChangedDefault>,
}

impl Found {
    /// An entry, unless its key is a credential, it may take no value, or the file's key has
    /// one already.
    fn push(&mut self, entry: Editable) {
        if !sensitive(&entry.key)
            && !entry.allowed.is_empty()
            && self.seen.insert((entry.file.clone(), key_text(&entry.key)))
        {
            self.inventory.push(entry);
        }
    }

    /// The chart defaults that changed under one Application, each settable in the values
    /// files only it layers. `kinds`: the kinds the cluster does not serve, in lower case.
    fn chart_defaults(
        &mut self,
        app: &AppInputs,
        shared: &std::collections::BTreeSet<String>,
        kinds: &[String],
    ) {
        let mut own: Vec<(String, Value)> = Vec::new();
        for (path, text) in &app.values_files {
            if shared.contains(path) {
                continue;
            }
            let parsed = crate::yaml::parse_document(text, path).unwrap_or(Value::Null);
            own.push((path.clone(), parsed));
            self.files.insert(path.clone(), text.clone());
        }
        for change in &app.defaults {
            let segments = strings(&change.key);
            let secret = |v: &Option<Value>| {
                v.as_ref()
                    .and_then(Value::as_str)
                    .is_some_and(crate::model::redact::sensitive_value)
            };
            if sensitive(&segments)
                || matches!(change.new, Some(Value::Array(_) | Value::Object(_)))
                || matches!(change.old, Some(Value::Array(_) | Value::Object(_)))
                || secret(&change.old)
                || secret(&change.new)
            {
                continue;
            }
            if !self.defaults.contains(change) {
                self.defaults.push(change.clone());
            }
            let allowed = default_allowed(change, kinds);
            for (path, parsed) in &own {
                self.push(Editable {
                    file: path.clone(),
                    current: value_at(parsed, &segments).cloned(),
                    key: segments.clone(),
                    allowed: allowed.clone(),
                });
            }
        }
    }

    /// The version lines the pull request changed: only to a version a chart moves to (a
    /// coupled pin), never back to the base (that would undo the promotion) or down.
    fn version_lines(&mut self, changed_files: &[ChangedFile]) {
        let moves: Vec<Value> = self.defaults.iter().map(|d| json!(d.to)).collect();
        for changed in changed_files {
            let base: Vec<(Vec<Segment>, Value)> = changed
                .base
                .as_deref()
                .map(|b| scalar_leaves(b, &changed.path))
                .unwrap_or_default();
            let mut any = false;
            for (key, value) in scalar_leaves(&changed.text, &changed.path) {
                let skip = matches!(key.last(), Some(Segment::Key(k)) if k == "apiVersion" || k == "kind" || k == "kubeVersion");
                let before = base.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
                if skip || !version_shaped(&key, &value) || before.as_ref() == Some(&value) {
                    continue;
                }
                let mut allowed: Vec<Value> = Vec::new();
                for m in &moves {
                    if !allowed.contains(m)
                        && Some(m) != before.as_ref()
                        && *m != value
                        && m.is_string() == value.is_string()
                    {
                        allowed.push(m.clone());
                    }
                }
                any = true;
                self.push(Editable {
                    file: changed.path.clone(),
                    key,
                    current: Some(value),
                    allowed,
                });
            }
            if any {
                self.files
                    .insert(changed.path.clone(), changed.text.clone());
            }
        }
    }

    /// The fix, or the handoff when the inventory is empty or over `MAX_INVENTORY`.
    fn finish(self, not_served: &[NotServed], report: &str) -> Result<Fix, Refusal> {
        let named: Vec<&str> = not_served
            .iter()
            .flat_map(|n| n.applications.iter().map(String::as_str))
            .collect();
        let stop = |fact: String| {
            Err((
                Handoff {
                    open: named.join(", "),
                    choice: "stop rendering the object there, or make the cluster serve it".into(),
                    fact,
                },
                vec![],
            ))
        };
        if self.inventory.len() > MAX_INVENTORY {
            return stop(format!(
                "the inventory of editable keys holds {} entries, over the {MAX_INVENTORY} Bosun asks a model about",
                self.inventory.len()
            ));
        }
        if self.inventory.is_empty() {
            return stop("no key Bosun may set would stop it: no changed chart default that turns the kind on in a values file only those Applications read, and no version line of this change to put back".into());
        }
        Ok(Fix {
            not_served: not_served.to_vec(),
            inventory: self.inventory,
            defaults: self.defaults,
            files: self.files,
            versions: versions_named(report),
            redaction: Default::default(),
        })
    }
}

/// The values a changed default may take: its old default (pinning it back); and `false` for a
/// boolean the new version turned on whose key names a kind the cluster does not serve.
fn default_allowed(change: &ChangedDefault, kinds: &[String]) -> Vec<Value> {
    let mut allowed = Vec::new();
    if let Some(old) = change
        .old
        .as_ref()
        .filter(|v| !v.is_array() && !v.is_object())
    {
        allowed.push(old.clone());
    }
    let names_kind = change.key.iter().any(|k| {
        let k = k.to_ascii_lowercase();
        k.len() >= 4
            && kinds
                .iter()
                .any(|kind| k.contains(kind.as_str()) || kind.contains(k.as_str()))
    });
    if change.new == Some(json!(true)) && names_kind && !allowed.contains(&json!(false)) {
        allowed.push(json!(false));
    }
    allowed
}

/// The versions a gate report names in its machine blocks: the `summary` block's chart moves
/// (from and to), image tags (from and to) and changed defaults (old and new), as text. A
/// report that does not parse names none. Its prose is never read: it quotes what charts
/// (a NOTES text, a rendered field) and pull requests (a title) wrote.
pub fn versions_named(report: &str) -> std::collections::BTreeSet<String> {
    let mut versions = std::collections::BTreeSet::new();
    let Some(summary) = crate::gate::report::parse(report)
        .ok()
        .and_then(|parsed| parsed.summary)
    else {
        return versions;
    };
    for chart in &summary.charts {
        versions.extend([chart.from.clone(), chart.to.clone()]);
    }
    for image in &summary.images {
        versions.extend([image.from.clone(), image.to.clone()]);
    }
    for default in &summary.defaults {
        for value in [&default.old, &default.new] {
            if let Some(text) = value.as_str() {
                versions.insert(text.to_string());
            }
        }
    }
    versions.retain(|v| !v.is_empty());
    versions
}
