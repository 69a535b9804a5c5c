//! The plan: the values files a failed render asks to migrate, and what nothing can supply.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::values::{layered, leaves, path_text};
use super::{Migration, ValuesFile, handoff, is_schema_refusal};
use crate::bosun::repair::Refusal;
use crate::render::source::ChartLocation;
use crate::render::{HelmFailure, RenderFailure, Severity};
use crate::yaml;

/// Reads a chart file at the location a helm job renders from.
fn chart_file(chart: &ChartLocation, name: &str) -> Option<Vec<u8>> {
    match chart {
        ChartLocation::Mirror(dir) => std::fs::read(dir.join(name)).ok(),
        ChartLocation::Git { snapshot, path } => snapshot
            .read(&crate::paths::normalize(&format!("{path}/{name}")))
            .map(<[u8]>::to_vec),
    }
}

/// Why a values file could not be read as values.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    /// Not UTF-8 text: the reader's line naming the file and the byte.
    #[error("{0}")]
    NotUtf8(String),
    #[error(transparent)]
    Yaml(#[from] yaml::YamlError),
    #[error("{origin} is not a mapping of values")]
    NotAMapping { origin: String },
}

/// Parses a values document: a mapping, or empty (then `{}`).
pub(super) fn values_of(text: &[u8], origin: &str) -> Result<Value, ValuesError> {
    let text = yaml::utf8(text, origin).map_err(ValuesError::NotUtf8)?;
    match yaml::parse_document(text, origin)? {
        Value::Null => Ok(Value::Object(Map::new())),
        v @ Value::Object(_) => Ok(v),
        _ => Err(ValuesError::NotAMapping {
            origin: origin.to_string(),
        }),
    }
}

/// Plans the migrations for a head that failed to render. `checkout` and `commit` are the
/// head's repository and commit (only its files are rewritten); `old_schema` finds the schema
/// of the chart the base deploys for a failing Application. A failure that is not only values
/// schema refusals, or values the repository does not hold, is a handoff.
pub fn plan(
    failure: &RenderFailure,
    checkout: &Path,
    commit: &str,
    old_schema: &dyn Fn(&HelmFailure) -> Option<Value>,
) -> Result<Vec<Migration>, Refusal> {
    let refusals = schema_refusals(failure)?;
    let mut by_chart: BTreeMap<String, Vec<&HelmFailure>> = BTreeMap::new();
    for f in refusals {
        by_chart
            .entry(f.job.chart_digest.clone())
            .or_default()
            .push(f);
    }
    let mut migrations = Vec::new();
    for failures in by_chart.into_values() {
        let first = failures[0];
        let chart = first.job.chart_label.clone();
        let (new_schema, new_defaults) = new_chart(first, &chart)?;
        let files = values_files(&failures, checkout, commit)?;
        not_shared(failure, &failures, &files)?;
        migrations.push(Migration {
            chart,
            error: first.message.clone(),
            new_schema,
            new_defaults,
            old_schema: old_schema(first),
            files,
            failures: failures.into_iter().cloned().collect(),
            redaction: Default::default(),
        });
    }
    Ok(migrations)
}

/// The failing helm runs, when every error of the render is a values schema refusal of one
/// of them; otherwise the handoff.
fn schema_refusals(failure: &RenderFailure) -> Result<Vec<&HelmFailure>, Refusal> {
    let errors: Vec<_> = failure
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    let refusals: Vec<&HelmFailure> = failure
        .helm_failures
        .iter()
        .filter(|f| is_schema_refusal(&f.message))
        .collect();
    if refusals.is_empty()
        || errors.iter().any(|d| {
            !is_schema_refusal(&d.message) || !refusals.iter().any(|f| f.application == d.subject)
        })
    {
        let other = errors
            .iter()
            .find(|d| !is_schema_refusal(&d.message))
            .map(|d| d.to_string())
            .unwrap_or_else(|| "the render failed".into());
        return Err((
            handoff(
                "the Application or source the error names".into(),
                format!(
                    "the head fails to render for more than a values schema refusal, which a values migration does not address: {}",
                    other
                ),
            ),
            vec![],
        ));
    }
    Ok(refusals)
}

/// The new chart's values.schema.json (required) and values.yaml (`{}` when it has none).
fn new_chart(first: &HelmFailure, chart: &str) -> Result<(Value, Value), Refusal> {
    let new_schema = chart_file(&first.job.chart, "values.schema.json")
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .ok_or_else(|| {
            (
                handoff(
                    chart.to_string(),
                    format!("{chart} has no readable values.schema.json"),
                ),
                vec![],
            )
        })?;
    let new_defaults = match chart_file(&first.job.chart, "values.yaml") {
        Some(bytes) => values_of(&bytes, &format!("{chart} values.yaml"))
            .map_err(|e| (handoff(chart.to_string(), e.to_string()), vec![]))?,
        None => json!({}),
    };
    Ok((new_schema, new_defaults))
}

/// The values files of this repository and commit the failing runs layer, each once; a run
/// that also sets values inline, or layers none of this repository's, is a handoff.
fn values_files(
    failures: &[&HelmFailure],
    checkout: &Path,
    commit: &str,
) -> Result<Vec<ValuesFile>, Refusal> {
    let mut files: Vec<ValuesFile> = Vec::new();
    for f in failures {
        let inline = f
            .job
            .values
            .iter()
            .any(|v| v.file.is_none() && v.name.starts_with("helm."));
        if inline
            || !f.job.set.is_empty()
            || !f.job.set_string.is_empty()
            || !f.job.set_file.is_empty()
        {
            return Err((
                handoff(
                    format!(
                        "the helm values of {} (inline in the Application)",
                        f.application
                    ),
                    format!(
                        "{} also sets values inline (helm.values, valuesObject or parameters), which Bosun does not rewrite: {}",
                        f.application, f.message
                    ),
                ),
                vec![],
            ));
        }
        let mut editable = 0;
        for input in &f.job.values {
            let Some(file) = &input.file else { continue };
            if file.repo_dir != checkout || file.commit != commit {
                continue;
            }
            editable += 1;
            if files.iter().any(|v| v.path == file.path) {
                continue;
            }
            let text = yaml::utf8(&input.content, &file.path)
                .map_err(|e| (handoff(file.path.clone(), e), vec![]))?
                .to_string();
            let value = values_of(&input.content, &file.path)
                .map_err(|e| (handoff(file.path.clone(), e.to_string()), vec![]))?;
            files.push(ValuesFile {
                path: file.path.clone(),
                text,
                value,
                place: file.clone(),
            });
        }
        if editable == 0 {
            return Err((
                handoff(
                    format!(
                        "the values of {} (inline in the Application, or in another repository)",
                        f.application
                    ),
                    format!(
                        "{} layers no values file of this repository, and Bosun migrates values files only: {}",
                        f.application, f.message
                    ),
                ),
                vec![],
            ));
        }
    }
    Ok(files)
}

/// A file another Application reads too (one that renders, or another chart) would change
/// under it: a person decides.
fn not_shared(
    failure: &RenderFailure,
    failures: &[&HelmFailure],
    files: &[ValuesFile],
) -> Result<(), Refusal> {
    for file in files {
        for (application, cluster, layered) in &failure.values_users {
            if layered.contains(&file.path)
                && !failures
                    .iter()
                    .any(|f| &f.application == application && &f.cluster == cluster)
            {
                return Err((
                    handoff(
                        file.path.clone(),
                        format!(
                            "{} is also layered by {application} on {cluster}, which this migration does not render; changing it could change that Application",
                            file.path
                        ),
                    ),
                    vec![],
                ));
            }
        }
    }
    Ok(())
}

/// The keys the new schema requires that nothing can supply: not the layered values (the new
/// chart's values.yaml and the repository's files), no default, const or single enum value,
/// and no key of that name anywhere in the old values. Checked before any model call: there is
/// nothing to derive an answer from.
pub fn unsuppliable(migration: &Migration) -> Vec<String> {
    let originals: Vec<(String, Value)> = migration
        .files
        .iter()
        .map(|f| (f.path.clone(), f.value.clone()))
        .collect();
    let old_keys: BTreeSet<String> = migration
        .files
        .iter()
        .flat_map(|f| leaves(&f.value))
        .flat_map(|(p, _)| p)
        .collect();
    let mut missing = BTreeSet::new();
    for failure in &migration.failures {
        let values = layered(migration, failure, &originals);
        required_missing(
            &migration.new_schema,
            &values,
            &mut Vec::new(),
            &old_keys,
            &mut missing,
        );
    }
    missing.into_iter().collect()
}

fn required_missing(
    schema: &Value,
    values: &Value,
    path: &mut Vec<String>,
    old_keys: &BTreeSet<String>,
    out: &mut BTreeSet<String>,
) {
    let Some(map) = values.as_object() else {
        return;
    };
    for key in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if map.contains_key(key) {
            continue;
        }
        let property = schema.get("properties").and_then(|p| p.get(key));
        let supplied = property.is_some_and(|p| {
            p.get("default").is_some()
                || p.get("const").is_some()
                || p.get("enum")
                    .and_then(Value::as_array)
                    .is_some_and(|e| e.len() == 1)
        }) || old_keys.contains(key);
        if !supplied {
            path.push(key.to_string());
            out.insert(path_text(path));
            path.pop();
        }
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (key, child) in properties {
            if let Some(v) = map.get(key) {
                path.push(key.clone());
                required_missing(child, v, path, old_keys, out);
                path.pop();
            }
        }
    }
}

/// The schema of the chart the base deploys for a failing Application (same Application,
/// same cluster, a chart source of the same name), from the chart mirror.
pub fn old_schema_in(
    base: &crate::render::Rendering,
    mirror: Option<&Path>,
    failure: &HelmFailure,
) -> Option<Value> {
    let ChartLocation::Mirror(dir) = &failure.job.chart else {
        return None;
    };
    let name = dir.parent()?.file_name()?.to_str()?;
    let app = base.applications.iter().find(|a| {
        format!("Application {}/{}", a.namespace, a.name) == failure.application
            && a.cluster.name == failure.cluster
    })?;
    app.sources.iter().find_map(|source| {
        let chart = crate::render::charts::ChartRef {
            repo_url: source.get("repoURL")?.as_str()?.to_string(),
            chart: source.get("chart")?.as_str()?.to_string(),
            version: source.get("targetRevision")?.as_str()?.to_string(),
        };
        if chart.chart != name {
            return None;
        }
        let dir = crate::render::charts::locate(mirror, &chart).ok()?;
        serde_json::from_slice(&std::fs::read(dir.join("values.schema.json")).ok()?).ok()
    })
}
