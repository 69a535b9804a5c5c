//! One Application's sources -> render jobs (helm, kustomize, plain directory) -> objects,
//! reproducing what Argo CD's repo-server does (reference: argo-cd v3.5
//! `reposerver/repository/repository.go`, `util/helm/cmd.go`, `util/kustomize/kustomize.go`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::charts::{self, ChartRef};
use super::inventory::Cluster;
use super::repos::RepoResolver;
use crate::git::Snapshot;
use crate::paths::{escapes_root, normalize};
use crate::yaml;

use super::directory::read_directory;
use super::helm::helm_job;

/// Where a chart's files are.
#[derive(Debug, Clone)]
pub enum ChartLocation {
    /// An unpacked chart in the mirror.
    Mirror(PathBuf),
    /// A chart directory inside a git snapshot.
    Git {
        snapshot: Arc<Snapshot>,
        path: String,
    },
}

/// A values file handed to helm, by name (for messages) and content.
#[derive(Debug, Clone)]
pub struct ValuesInput {
    pub name: String,
    pub content: Vec<u8>,
    /// The repository file it was read from, when it came from a git snapshot (a values
    /// migration edits only files of the repository under review).
    pub file: Option<ValuesFile>,
}

/// A values file's place in a git snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValuesFile {
    pub repo_dir: PathBuf,
    pub commit: String,
    pub path: String,
}

#[derive(Debug, Clone)]
pub struct HelmJob {
    pub chart: ChartLocation,
    pub chart_label: String,
    pub chart_digest: String,
    pub release: String,
    pub namespace: String,
    pub kube_version: Option<String>,
    pub api_versions: Vec<String>,
    pub values: Vec<ValuesInput>,
    pub set: Vec<String>,
    pub set_string: Vec<String>,
    pub set_file: Vec<(String, ValuesInput)>,
    pub include_crds: bool,
    pub skip_tests: bool,
    pub skip_schema_validation: bool,
}

#[cfg(test)]
impl HelmJob {
    /// A helm job of the chart at `chart` with every other input empty (tests set what they
    /// read).
    pub(crate) fn of_chart(chart: ChartLocation) -> HelmJob {
        HelmJob {
            chart,
            chart_label: "c".into(),
            chart_digest: "d".into(),
            release: "r".into(),
            namespace: "n".into(),
            kube_version: None,
            api_versions: vec![],
            values: vec![],
            set: vec![],
            set_string: vec![],
            set_file: vec![],
            include_crds: true,
            skip_tests: false,
            skip_schema_validation: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct KustomizeJob {
    pub snapshot: Arc<Snapshot>,
    pub path: String,
    /// The source's `kustomize` block, applied through a wrapping kustomization.
    pub options: Value,
    /// The mirror's copy of every chart the tree's `helmCharts` name: each chart's digest, or
    /// why it has none (absent, or refused), as the render key reads it.
    pub charts: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum RenderJob {
    Helm(HelmJob),
    Kustomize(KustomizeJob),
    /// Plain manifests: already read, no process to run.
    Objects(Vec<Value>),
}

/// A source after `.argocd-source*.yaml` overrides, and the job that renders it.
#[derive(Debug, Clone)]
pub struct PlannedSource {
    pub source: Value,
    pub job: Option<RenderJob>,
}

/// Fetches a chart into the mirror.
pub type PullChart<'a> = dyn Fn(&ChartRef) -> Result<(), String> + 'a;

pub struct PlanContext<'a> {
    pub repos: &'a RepoResolver,
    pub charts: Option<&'a Path>,
    pub chart_digests: &'a dyn Fn(&Path) -> Result<String, String>,
    /// Set by `gate charts pull`: fetch a chart the mirror lacks.
    pub pull: Option<&'a PullChart<'a>>,
}

/// The sources of an Application: `spec.sources` when set, else `spec.source`.
pub fn sources_of(app: &Value) -> Vec<Value> {
    source_slice(app).to_vec()
}

/// [`sources_of`], borrowed.
pub(crate) fn source_slice(app: &Value) -> &[Value] {
    match app.pointer("/spec/sources").and_then(Value::as_array) {
        Some(sources) if !sources.is_empty() => sources,
        _ => app
            .pointer("/spec/source")
            .map_or(&[], std::slice::from_ref),
    }
}

/// An error of source `index` of `count`, named as such when there are several.
fn of_source(count: usize, index: usize, error: String) -> String {
    if count > 1 {
        format!("sources[{index}]: {error}")
    } else {
        error
    }
}

pub(crate) fn str_at<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The chart a source names (`chart`, at its `repoURL` and `targetRevision`), if it names
/// one: a source helm renders from a chart repository.
pub(crate) fn chart_ref(source: &Value) -> Option<ChartRef> {
    let chart = source.get("chart").and_then(Value::as_str)?;
    Some(ChartRef {
        repo_url: str_at(source, "/repoURL").to_string(),
        chart: chart.to_string(),
        version: str_at(source, "/targetRevision").to_string(),
    })
}

pub(crate) fn non_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(_) => true,
    }
}

/// Plans every source of an Application for one destination cluster.
pub fn plan(
    app: &Value,
    cluster: &Cluster,
    ctx: &PlanContext,
) -> Result<Vec<PlannedSource>, String> {
    let name = str_at(app, "/metadata/name").to_string();
    let sources = sources_of(app);
    if sources.is_empty() {
        return Err("has neither spec.source nor spec.sources".to_string());
    }
    // `ref` sources expose a repository root to the others as `$<ref>`.
    let mut refs: BTreeMap<String, Arc<Snapshot>> = BTreeMap::new();
    for source in &sources {
        if let Some(reference) = source.get("ref").and_then(Value::as_str) {
            let url = str_at(source, "/repoURL");
            refs.insert(
                reference.to_string(),
                ctx.repos.resolve(url, str_at(source, "/targetRevision"))?,
            );
        }
    }
    let mut planned = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        if is_values_only(source) {
            planned.push(PlannedSource {
                source: source.clone(),
                job: None,
            });
            continue;
        }
        let context = |e: String| of_source(sources.len(), index, e);
        planned.push(plan_source(app, &name, source, cluster, &refs, ctx).map_err(context)?);
    }
    Ok(planned)
}

fn plan_source(
    app: &Value,
    app_name: &str,
    source: &Value,
    cluster: &Cluster,
    refs: &BTreeMap<String, Arc<Snapshot>>,
    ctx: &PlanContext,
) -> Result<PlannedSource, String> {
    let repo_url = str_at(source, "/repoURL");
    if repo_url.is_empty() {
        return Err("source has no repoURL".to_string());
    }
    if let Some(chart_ref) = chart_ref(source) {
        let job = plan_chart_source(app, app_name, source, cluster, refs, ctx, chart_ref)?;
        return Ok(PlannedSource {
            source: source.clone(),
            job: Some(RenderJob::Helm(job)),
        });
    }
    plan_git_source(app, app_name, source, cluster, refs, ctx)
}

/// A source from a chart repository: a pinned version with a chart name and version that stay
/// inside the mirror, found there (pulled first when this run may pull), rendered by helm.
fn plan_chart_source(
    app: &Value,
    app_name: &str,
    source: &Value,
    cluster: &Cluster,
    refs: &BTreeMap<String, Arc<Snapshot>>,
    ctx: &PlanContext,
    chart_ref: ChartRef,
) -> Result<HelmJob, String> {
    if chart_ref.version.is_empty() || chart_ref.version.contains(['*', '^', '~', '>', '<', ' ']) {
        return Err(format!(
            "{chart_ref}: the gate renders pinned chart versions only (targetRevision must be an exact version)"
        ));
    }
    // Both become folders of the chart mirror: a name or version that is a path (`/x`,
    // `..`, `.`) would read a chart from anywhere on the machine.
    if !charts::is_chart_name(&chart_ref.chart) {
        return Err(format!(
            "chart {:?}: not a chart name (letters, digits, `.`, `_`, `-`, no path)",
            chart_ref.chart.chars().take(120).collect::<String>()
        ));
    }
    if !charts::is_chart_version(&chart_ref.version) {
        return Err(format!(
            "{chart_ref}: targetRevision is not a chart version (SemVer: digits, letters, `.`, `+`, `-`)"
        ));
    }
    let dir = match (charts::locate(ctx.charts, &chart_ref), ctx.pull) {
        (Ok(dir), _) => dir,
        (Err(_), Some(pull)) => {
            pull(&chart_ref)?;
            charts::locate(ctx.charts, &chart_ref)?
        }
        (Err(e), None) => return Err(e),
    };
    let digest = (ctx.chart_digests)(&dir)?;
    let location = ChartLocation::Mirror(dir);
    helm_job(
        app,
        app_name,
        source,
        cluster,
        refs,
        location,
        chart_ref.to_string(),
        digest,
        None,
    )
}

/// A source from a git repository: its path at the resolved commit, with the
/// `.argocd-source*.yaml` overrides merged in, rendered as its type says (helm, kustomize or a
/// directory of manifests).
fn plan_git_source(
    app: &Value,
    app_name: &str,
    source: &Value,
    cluster: &Cluster,
    refs: &BTreeMap<String, Arc<Snapshot>>,
    ctx: &PlanContext,
) -> Result<PlannedSource, String> {
    let repo_url = str_at(source, "/repoURL");
    let (snapshot, path, source) = git_source(app_name, source, ctx.repos)?;
    let job = match source_type(&source, &snapshot, &path)? {
        "helm" => {
            let digest = snapshot.digest_under(&path);
            let label = format!("chart at {path} in {repo_url}");
            let location = ChartLocation::Git {
                snapshot: snapshot.clone(),
                path: path.clone(),
            };
            RenderJob::Helm(helm_job(
                app,
                app_name,
                &source,
                cluster,
                refs,
                location,
                label,
                digest,
                Some((&snapshot, &path)),
            )?)
        }
        "kustomize" => RenderJob::Kustomize(KustomizeJob {
            snapshot: snapshot.clone(),
            path: path.clone(),
            options: source.get("kustomize").cloned().unwrap_or(Value::Null),
            charts: kustomize_charts(&snapshot, ctx),
        }),
        "directory" => {
            RenderJob::Objects(read_directory(&snapshot, &path, source.get("directory"))?)
        }
        _ => {
            return Err("config management plugins are not supported by the gate: it cannot run a plugin sidecar".to_string());
        }
    };
    Ok(PlannedSource {
        source,
        job: Some(job),
    })
}

/// A git source as planning reads it: the snapshot its `repoURL` and `targetRevision` name,
/// its path (normalised, inside the repository, a folder there), and the source with
/// `.argocd-source.yaml`, then `.argocd-source-<app>.yaml`, merged in (as Argo CD does).
fn git_source(
    app_name: &str,
    source: &Value,
    repos: &RepoResolver,
) -> Result<(Arc<Snapshot>, String, Value), String> {
    let repo_url = str_at(source, "/repoURL");
    let target_revision = str_at(source, "/targetRevision");
    let snapshot = repos.resolve(repo_url, target_revision)?;
    let path = normalize(str_at(source, "/path"));
    if escapes_root(&path) {
        return Err(format!(
            "source path {:?} leaves the repository",
            str_at(source, "/path")
        ));
    }
    if !snapshot.is_dir(&path) {
        return Err(format!(
            "source path {path:?} does not exist in {repo_url} at {}",
            short(&snapshot.commit)
        ));
    }
    let mut source = source.clone();
    for file in [
        ".argocd-source.yaml".to_string(),
        format!(".argocd-source-{app_name}.yaml"),
    ] {
        let file_path = join(&path, &file);
        if let Some(text) = snapshot.read_string(&file_path) {
            let patch = yaml::parse_document(&text, &file_path).map_err(|e| e.to_string())?;
            json_patch::merge(&mut source, &patch);
        }
    }
    Ok((snapshot, path, source))
}

/// Whether rendering an Application runs a process (helm or kustomize) for one of its
/// sources ([`source_runs_a_process`]). Reads the sources' repositories through `repos` (the
/// repository under test at the commit being read; any other through its mirror). Its
/// destination is not looked at. An error is why a source's type cannot be told (planning
/// would fail on it too).
pub fn runs_a_process(app: &Value, repos: &RepoResolver) -> Result<bool, String> {
    let name = str_at(app, "/metadata/name");
    for source in sources_of(app) {
        if source_runs_a_process(name, &source, repos)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether one source of Application `app_name` renders with a process, its type decided as
/// planning decides it: a `chart` is helm; a git source's type is the one it names (after the
/// `.argocd-source*.yaml` overrides), else helm for a `Chart.yaml`, kustomize for a
/// kustomization, else a directory of manifests read without a process. A values-only `ref`
/// source renders nothing.
pub fn source_runs_a_process(
    app_name: &str,
    source: &Value,
    repos: &RepoResolver,
) -> Result<bool, String> {
    if is_values_only(source) {
        return Ok(false);
    }
    if str_at(source, "/repoURL").is_empty() {
        return Err("source has no repoURL".to_string());
    }
    if source.get("chart").and_then(Value::as_str).is_some() {
        return Ok(true);
    }
    let (snapshot, path, source) = git_source(app_name, source, repos)?;
    match source_type(&source, &snapshot, &path)? {
        "helm" | "kustomize" => Ok(true),
        "directory" => Ok(false),
        _ => Err("config management plugins are not supported by the gate: it cannot run a plugin sidecar".to_string()),
    }
}

/// A `ref` source that only exposes its repository to the others' value files.
pub(crate) fn is_values_only(source: &Value) -> bool {
    source.get("ref").is_some() && source.get("path").is_none() && source.get("chart").is_none()
}

/// The objects of an Application's plain sources alone (directories of manifests, no
/// process), each read as [`plan`] reads it, in source order: what every render of the
/// Application holds besides what its helm and kustomize sources render. Its other sources
/// are left out.
pub fn plain_objects(
    app: &Value,
    cluster: &Cluster,
    ctx: &PlanContext,
) -> Result<Vec<Value>, String> {
    let name = str_at(app, "/metadata/name");
    let sources = sources_of(app);
    let mut objects = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        let context = |e: String| of_source(sources.len(), index, e);
        if is_values_only(source)
            || source_runs_a_process(name, source, ctx.repos).map_err(context)?
        {
            continue;
        }
        // A directory's plan reads no `$ref`: only helm's value files do.
        let planned =
            plan_git_source(app, name, source, cluster, &BTreeMap::new(), ctx).map_err(context)?;
        match planned.job {
            Some(RenderJob::Objects(read)) => objects.extend(read),
            _ => {
                return Err(context(
                    "planning runs a process for a source of plain manifests".into(),
                ));
            }
        }
    }
    Ok(objects)
}

/// A git source's type, as Argo CD tells it: the one it names (two are an error), else helm
/// when the path holds a `Chart.yaml`, kustomize when it holds a kustomization, else a
/// directory.
fn source_type(source: &Value, snapshot: &Snapshot, path: &str) -> Result<&'static str, String> {
    let explicit: Vec<&'static str> = ["helm", "kustomize", "directory", "plugin"]
        .into_iter()
        .filter(|k| non_empty(source.get(*k)))
        .collect();
    if explicit.len() > 1 {
        return Err(format!(
            "multiple application source types defined: {}",
            explicit.join(", ")
        ));
    }
    Ok(match explicit.first() {
        Some(kind) => *kind,
        None if snapshot.exists(&join(path, "Chart.yaml")) => "helm",
        None if super::kustomize::KUSTOMIZATION_FILES
            .iter()
            .any(|f| snapshot.exists(&join(path, f))) =>
        {
            "kustomize"
        }
        None => "directory",
    })
}

/// The charts a kustomization tree inflates, each with its mirror digest (or why there is
/// none), for the Kustomize job's render key.
fn kustomize_charts(snapshot: &Snapshot, ctx: &PlanContext) -> Vec<String> {
    super::kustomize::charts_named(snapshot)
        .into_iter()
        .map(|chart| {
            let digest = match charts::locate(ctx.charts, &chart) {
                Ok(dir) => (ctx.chart_digests)(&dir).unwrap_or_else(|e| format!("refused: {e}")),
                Err(_) => "absent".to_string(),
            };
            format!("{chart}\0{digest}")
        })
        .collect()
}

pub(crate) fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

pub(crate) fn join(dir: &str, file: &str) -> String {
    if dir.is_empty() {
        normalize(file)
    } else {
        normalize(&format!("{dir}/{file}"))
    }
}

/// Build environment variables Argo CD substitutes into parameters and value file paths.
pub(crate) fn build_env(
    app: &Value,
    source: &Value,
    cluster: &Cluster,
    api_versions: &[String],
    kube: Option<&str>,
    commit: &str,
) -> Vec<(String, String)> {
    vec![
        (
            "ARGOCD_APP_NAME".into(),
            str_at(app, "/metadata/name").into(),
        ),
        (
            "ARGOCD_APP_NAMESPACE".into(),
            str_at(app, "/spec/destination/namespace").into(),
        ),
        (
            "ARGOCD_APP_PROJECT_NAME".into(),
            str_at(app, "/spec/project").into(),
        ),
        ("ARGOCD_APP_REVISION".into(), commit.into()),
        (
            "ARGOCD_APP_REVISION_SHORT".into(),
            commit.chars().take(7).collect(),
        ),
        (
            "ARGOCD_APP_SOURCE_PATH".into(),
            str_at(source, "/path").into(),
        ),
        (
            "ARGOCD_APP_SOURCE_REPO_URL".into(),
            str_at(source, "/repoURL").into(),
        ),
        (
            "ARGOCD_APP_SOURCE_TARGET_REVISION".into(),
            str_at(source, "/targetRevision").into(),
        ),
        ("KUBE_VERSION".into(), kube.unwrap_or("").into()),
        ("KUBE_API_VERSIONS".into(), api_versions.join(",")),
        (
            "ARGOCD_APP_DESTINATION_SERVER".into(),
            cluster.server.clone(),
        ),
    ]
}

pub(crate) fn substitute_env(text: &str, env: &[(String, String)]) -> String {
    let mut out = text.to_string();
    // Longest names first so $ARGOCD_APP_REVISION does not eat $ARGOCD_APP_REVISION_SHORT.
    let mut sorted: Vec<&(String, String)> = env.iter().collect();
    sorted.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    for (key, value) in sorted {
        out = out
            .replace(&format!("${{{key}}}"), value)
            .replace(&format!("${key}"), value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_substitution_prefers_longest_names() {
        let env = vec![
            ("ARGOCD_APP_REVISION".to_string(), "abcdef123".to_string()),
            (
                "ARGOCD_APP_REVISION_SHORT".to_string(),
                "abcdef1".to_string(),
            ),
        ];
        assert_eq!(
            substitute_env("$ARGOCD_APP_REVISION_SHORT/${ARGOCD_APP_REVISION}", &env),
            "abcdef1/abcdef123"
        );
    }
}
