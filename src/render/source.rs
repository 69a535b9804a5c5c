//! One Application's sources -> render jobs (helm, kustomize, plain directory) -> objects,
//! reproducing what Argo CD's repo-server does (reference: argo-cd v3.5
//! `reposerver/repository/repository.go`, `util/helm/cmd.go`, `util/kustomize/kustomize.go`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::charts::{self, ChartRef};
use super::git::{Snapshot, escapes_root, hex, normalize};
use super::inventory::Cluster;
use super::matching::loose_glob_match;
use super::params::merge_patch;
use super::repos::RepoResolver;
use crate::yaml;

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

#[derive(Debug, Clone)]
pub struct KustomizeJob {
    pub snapshot: Arc<Snapshot>,
    pub path: String,
    /// The source's `kustomize` block, applied through a wrapping kustomization.
    pub options: Value,
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
    match app.pointer("/spec/sources").and_then(Value::as_array) {
        Some(sources) if !sources.is_empty() => sources.clone(),
        _ => app.pointer("/spec/source").cloned().into_iter().collect(),
    }
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn non_empty(value: Option<&Value>) -> bool {
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
        let is_values_only = source.get("ref").is_some()
            && source.get("path").is_none()
            && source.get("chart").is_none();
        if is_values_only {
            planned.push(PlannedSource {
                source: source.clone(),
                job: None,
            });
            continue;
        }
        let context = |e: String| {
            if sources.len() > 1 {
                format!("sources[{index}]: {e}")
            } else {
                e
            }
        };
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
    let target_revision = str_at(source, "/targetRevision");
    if let Some(chart) = source.get("chart").and_then(Value::as_str) {
        let chart_ref = ChartRef {
            repo_url: repo_url.to_string(),
            chart: chart.to_string(),
            version: target_revision.to_string(),
        };
        if chart_ref.version.is_empty()
            || chart_ref.version.contains(['*', '^', '~', '>', '<', ' '])
        {
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
        let job = helm_job(
            app,
            app_name,
            source,
            cluster,
            refs,
            location,
            chart_ref.to_string(),
            digest,
            None,
        )?;
        return Ok(PlannedSource {
            source: source.clone(),
            job: Some(RenderJob::Helm(job)),
        });
    }

    let snapshot = ctx.repos.resolve(repo_url, target_revision)?;
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
    // Argo CD merges .argocd-source.yaml, then .argocd-source-<app>.yaml, into the source.
    let mut source = source.clone();
    for file in [
        ".argocd-source.yaml".to_string(),
        format!(".argocd-source-{app_name}.yaml"),
    ] {
        let file_path = join(&path, &file);
        if let Some(text) = snapshot.read_string(&file_path) {
            let patch = yaml::parse_document(&text, &file_path).map_err(|e| e.to_string())?;
            merge_patch(&mut source, &patch);
        }
    }
    let explicit: Vec<&str> = ["helm", "kustomize", "directory", "plugin"]
        .into_iter()
        .filter(|k| non_empty(source.get(*k)))
        .collect();
    if explicit.len() > 1 {
        return Err(format!(
            "multiple application source types defined: {}",
            explicit.join(", ")
        ));
    }
    let kind = match explicit.first() {
        Some(kind) => *kind,
        None if snapshot.exists(&join(&path, "Chart.yaml")) => "helm",
        None if super::kustomize::KUSTOMIZATION_FILES
            .iter()
            .any(|f| snapshot.exists(&join(&path, f))) =>
        {
            "kustomize"
        }
        None => "directory",
    };
    let job = match kind {
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

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

fn join(dir: &str, file: &str) -> String {
    if dir.is_empty() {
        normalize(file)
    } else {
        normalize(&format!("{dir}/{file}"))
    }
}

/// Build environment variables Argo CD substitutes into parameters and value file paths.
fn build_env(
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

fn substitute_env(text: &str, env: &[(String, String)]) -> String {
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

/// Escapes commas in `--set` values unless the value is a helm list (`{a,b}`), as Argo CD does.
fn clean_set_value(value: &str) -> String {
    if value.starts_with('{') && value.ends_with('}') {
        return value.to_string();
    }
    let mut out = String::new();
    let mut previous = '\0';
    for c in value.chars() {
        if c == ',' && previous != '\\' {
            out.push('\\');
        }
        out.push(c);
        previous = c;
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn helm_job(
    app: &Value,
    app_name: &str,
    source: &Value,
    cluster: &Cluster,
    refs: &BTreeMap<String, Arc<Snapshot>>,
    chart: ChartLocation,
    chart_label: String,
    chart_digest: String,
    git_chart: Option<(&Arc<Snapshot>, &str)>,
) -> Result<HelmJob, String> {
    let helm = source.get("helm").cloned().unwrap_or(json!({}));
    let flag = |key: &str| helm.get(key).and_then(Value::as_bool).unwrap_or(false);
    let release = helm
        .get("releaseName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(app_name)
        .to_string();
    let namespace = helm
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(str_at(app, "/spec/destination/namespace"))
        .to_string();
    let kube_version = match helm
        .get("kubeVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        Some(v) => Some(
            super::inventory::parse_kube_version(v)
                .ok_or(format!("helm.kubeVersion {v:?} is not a version"))?,
        ),
        None => cluster.kube_version.clone(),
    };
    let api_versions = match helm.get("apiVersions").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => {
            let entries: Vec<String> = list
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            let mut sorted = entries;
            sorted.sort();
            sorted.dedup();
            sorted
        }
        _ => cluster.api_versions.clone(),
    };
    let commit = match &chart {
        ChartLocation::Git { snapshot, .. } => snapshot.commit.clone(),
        ChartLocation::Mirror(_) => String::new(),
    };
    let env = build_env(
        app,
        source,
        cluster,
        &api_versions,
        kube_version.as_deref(),
        &commit,
    );
    let ignore_missing = flag("ignoreMissingValueFiles");

    let mut values = Vec::new();
    for entry in helm
        .get("valueFiles")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(raw) = entry.as_str() else { continue };
        for input in resolve_value_file(raw, &env, refs, &chart, git_chart)? {
            match input {
                Ok(v) => values.push(v),
                Err(missing) if ignore_missing => {
                    let _ = missing;
                }
                Err(missing) => {
                    return Err(format!(
                        "value file {missing} does not exist (set helm.ignoreMissingValueFiles to allow that)"
                    ));
                }
            }
        }
    }
    // Inline values go last, as one more values file: valuesObject wins over values.
    if let Some(object) = helm.get("valuesObject").filter(|v| !v.is_null()) {
        values.push(ValuesInput {
            name: "helm.valuesObject".into(),
            content: object.to_string().into_bytes(),
            file: None,
        });
    } else if let Some(text) = helm
        .get("values")
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
    {
        values.push(ValuesInput {
            name: "helm.values".into(),
            content: text.as_bytes().to_vec(),
            file: None,
        });
    }
    let mut set = Vec::new();
    let mut set_string = Vec::new();
    for parameter in helm
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = parameter.get("name").and_then(Value::as_str).unwrap_or("");
        let value = match parameter.get("value") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let value = clean_set_value(&substitute_env(&value, &env));
        if parameter
            .get("forceString")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            set_string.push(format!("{name}={value}"));
        } else {
            set.push(format!("{name}={value}"));
        }
    }
    let mut set_file = Vec::new();
    for parameter in helm
        .get("fileParameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = parameter
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // helm reads `--set-file a=x,b=y` as two files: a name with `,` or `=` would make it
        // read any file on the machine into the values.
        if name.is_empty()
            || name.contains([',', '=', '\\'])
            || name.chars().any(char::is_whitespace)
        {
            return Err(format!(
                "helm.fileParameters name {:?}: not a values key (no `,`, `=`, `\\` or spaces)",
                name.chars().take(120).collect::<String>()
            ));
        }
        let raw = parameter.get("path").and_then(Value::as_str).unwrap_or("");
        let mut found = resolve_value_file(raw, &env, refs, &chart, git_chart)?;
        match found.pop() {
            Some(Ok(input)) => set_file.push((name, input)),
            _ => {
                return Err(format!(
                    "helm.fileParameters {name}: file {raw} does not exist"
                ));
            }
        }
    }
    Ok(HelmJob {
        chart,
        chart_label,
        chart_digest,
        release,
        namespace,
        kube_version,
        api_versions,
        values,
        set,
        set_string,
        set_file,
        include_crds: !flag("skipCrds"),
        skip_tests: flag("skipTests"),
        skip_schema_validation: flag("skipSchemaValidation"),
    })
}

/// Resolves one `valueFiles` entry to zero or more files (globs expand); a missing file is an
/// `Err(name)` entry so the caller can honour `ignoreMissingValueFiles`.
fn resolve_value_file(
    raw: &str,
    env: &[(String, String)],
    refs: &BTreeMap<String, Arc<Snapshot>>,
    chart: &ChartLocation,
    git_chart: Option<(&Arc<Snapshot>, &str)>,
) -> Result<Vec<Result<ValuesInput, String>>, String> {
    if raw.starts_with("http://") || raw.starts_with("https://") {
        return Err(format!(
            "value file {raw} is a URL: the gate does not fetch remote values files"
        ));
    }
    // `$ref/path` reads the ref source's repository root.
    if let Some(rest) = raw.strip_prefix('$') {
        let (reference, path) = rest.split_once('/').unwrap_or((rest, ""));
        if let Some(snapshot) = refs.get(reference) {
            return Ok(read_from_snapshot(snapshot, &normalize(path), raw));
        }
    }
    let expanded = substitute_env(raw, env);
    match (chart, git_chart) {
        (ChartLocation::Git { .. }, Some((snapshot, dir))) => {
            let path = join(dir, &expanded);
            if escapes_root(&path) {
                return Err(format!("value file {raw} leaves the repository"));
            }
            Ok(read_from_snapshot(snapshot, &path, raw))
        }
        (ChartLocation::Mirror(dir), _) => {
            let relative = normalize(&expanded);
            if escapes_root(&relative) {
                return Err(format!("value file {raw} leaves the chart"));
            }
            let path = dir.join(&relative);
            Ok(vec![
                std::fs::read(&path)
                    .map(|content| ValuesInput {
                        name: raw.to_string(),
                        content,
                        file: None,
                    })
                    .map_err(|_| raw.to_string()),
            ])
        }
        _ => Err(format!("value file {raw}: chart location unknown")),
    }
}

fn read_from_snapshot(
    snapshot: &Snapshot,
    path: &str,
    raw: &str,
) -> Vec<Result<ValuesInput, String>> {
    if path.contains(['*', '?', '[']) {
        // Argo CD v3.5 expands globs in value file paths (sorted, de-duplicated).
        let matches: Vec<Result<ValuesInput, String>> = snapshot
            .paths()
            .filter(|p| super::matching::doublestar_match(path, p))
            .map(|p| {
                Ok(ValuesInput {
                    name: p.to_string(),
                    content: snapshot.read(p).unwrap_or_default().to_vec(),
                    file: Some(ValuesFile {
                        repo_dir: snapshot.repo_dir.clone(),
                        commit: snapshot.commit.clone(),
                        path: p.to_string(),
                    }),
                })
            })
            .collect();
        return if matches.is_empty() {
            vec![Err(raw.to_string())]
        } else {
            matches
        };
    }
    if snapshot.is_symlink(path) {
        return vec![Err(format!(
            "{raw} (a symbolic link, which the gate does not follow)"
        ))];
    }
    vec![
        snapshot
            .read(path)
            .map(|c| ValuesInput {
                name: raw.to_string(),
                content: c.to_vec(),
                file: Some(ValuesFile {
                    repo_dir: snapshot.repo_dir.clone(),
                    commit: snapshot.commit.clone(),
                    path: path.to_string(),
                }),
            })
            .ok_or_else(|| raw.to_string()),
    ]
}

/// Reads a plain-directory source (recurse, include, exclude as Argo CD applies them).
pub fn read_directory(
    snapshot: &Snapshot,
    path: &str,
    options: Option<&Value>,
) -> Result<Vec<Value>, String> {
    let recurse = options
        .and_then(|o| o.get("recurse"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let include = options
        .and_then(|o| o.get("include"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let exclude = options
        .and_then(|o| o.get("exclude"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if options
        .and_then(|o| o.get("jsonnet"))
        .is_some_and(|j| non_empty(Some(j)))
    {
        return Err("jsonnet directory sources are not supported by the gate".to_string());
    }
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    };
    let mut objects = Vec::new();
    for (file, content) in snapshot.files_under(path) {
        let relative = &file[prefix.len()..];
        if !recurse && relative.contains('/') {
            continue;
        }
        let is_manifest = [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| relative.ends_with(ext));
        if relative.ends_with(".jsonnet") || relative.ends_with(".libsonnet") {
            return Err(format!("{file}: jsonnet is not supported by the gate"));
        }
        if !is_manifest {
            continue;
        }
        if !include.is_empty() && !loose_glob_match(include, relative) {
            continue;
        }
        if !exclude.is_empty() && loose_glob_match(exclude, relative) {
            continue;
        }
        let text = yaml::utf8(content, file)?;
        // Argo CD leaves out files marked to be skipped, and YAML that does not look like a
        // Kubernetes manifest at all (no apiVersion, kind and metadata).
        if text.contains("+argocd:skip-file-rendering") {
            continue;
        }
        let looks_like_manifest =
            text.contains("apiVersion:") && text.contains("kind:") && text.contains("metadata:");
        if !relative.ends_with(".json") && !looks_like_manifest {
            continue;
        }
        let documents = yaml::parse_documents(text, file).map_err(|e| e.to_string())?;
        for (index, document) in documents.into_iter().enumerate() {
            if document.get("apiVersion").and_then(Value::as_str).is_none()
                || document.get("kind").and_then(Value::as_str).is_none()
            {
                return Err(format!(
                    "{file}: document {index} is not a Kubernetes object (it has no apiVersion or kind)"
                ));
            }
            push_object(document, &mut objects);
        }
    }
    Ok(objects)
}

/// Adds an object, expanding `List` kinds into their items (Argo CD does the same).
pub fn push_object(object: Value, out: &mut Vec<Value>) {
    let is_list = object.get("items").is_some_and(Value::is_array);
    if is_list {
        for item in object["items"].as_array().cloned().unwrap_or_default() {
            push_object(item, out);
        }
    } else if object.is_object() {
        out.push(object);
    }
}

impl HelmJob {
    /// A digest of every input that can change helm's output.
    pub fn cache_key(&self, helm_version: &str) -> String {
        let mut hasher = Sha256::new();
        let mut field = |label: &str, bytes: &[u8]| {
            hasher.update(label.as_bytes());
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field("kind", b"helm-template-v1");
        field("helm", helm_version.as_bytes());
        field("chart", self.chart_digest.as_bytes());
        field("release", self.release.as_bytes());
        field("namespace", self.namespace.as_bytes());
        field(
            "kube",
            self.kube_version.as_deref().unwrap_or("").as_bytes(),
        );
        // One field per entry: a list joined with a separator could equal another list whose
        // entry holds that separator, and equal keys are taken as equal renders.
        field("api-count", &(self.api_versions.len() as u64).to_le_bytes());
        for api in &self.api_versions {
            field("api", api.as_bytes());
        }
        for v in &self.values {
            field("values", &v.content);
        }
        for s in &self.set {
            field("set", s.as_bytes());
        }
        for s in &self.set_string {
            field("set-string", s.as_bytes());
        }
        for (name, input) in &self.set_file {
            field("set-file", name.as_bytes());
            field("set-file-content", &input.content);
        }
        field(
            "flags",
            format!(
                "{}{}{}",
                self.include_crds, self.skip_tests, self.skip_schema_validation
            )
            .as_bytes(),
        );
        hex(&hasher.finalize())
    }

    /// The argv after `helm`, with values written into `scratch` (Argo CD's flag order).
    pub fn args(&self, chart_path: &Path, scratch: &Path) -> Result<Vec<String>, String> {
        let mut args = vec![
            "template".to_string(),
            chart_path.display().to_string(),
            "--name-template".to_string(),
            self.release.clone(),
        ];
        if !self.namespace.is_empty() {
            args.extend(["--namespace".to_string(), self.namespace.clone()]);
        }
        if let Some(kube) = &self.kube_version {
            args.extend(["--kube-version".to_string(), kube.clone()]);
        }
        for s in &self.set {
            args.extend(["--set".to_string(), s.clone()]);
        }
        for s in &self.set_string {
            args.extend(["--set-string".to_string(), s.clone()]);
        }
        for (index, (name, input)) in self.set_file.iter().enumerate() {
            let path = scratch.join(format!("set-file-{index}"));
            std::fs::write(&path, &input.content)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            args.extend([
                "--set-file".to_string(),
                format!("{name}={}", path.display()),
            ]);
        }
        for (index, input) in self.values.iter().enumerate() {
            let path = scratch.join(format!("values-{index}.yaml"));
            std::fs::write(&path, &input.content)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            args.extend(["--values".to_string(), path.display().to_string()]);
        }
        for api in &self.api_versions {
            args.extend(["--api-versions".to_string(), api.clone()]);
        }
        if self.include_crds {
            args.push("--include-crds".to_string());
        }
        if self.skip_schema_validation {
            args.push("--skip-schema-validation".to_string());
        }
        if self.skip_tests {
            args.push("--skip-tests".to_string());
        }
        Ok(args)
    }
}

impl KustomizeJob {
    pub fn cache_key(&self, kubectl_version: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"kustomize-v1\0");
        hasher.update(kubectl_version.as_bytes());
        hasher.update(b"\0");
        // A kustomization can reach anywhere in the repository: key on the whole tree.
        hasher.update(self.snapshot.digest_under("").as_bytes());
        hasher.update(self.path.as_bytes());
        hasher.update(b"\0");
        hasher.update(self.options.to_string().as_bytes());
        hex(&hasher.finalize())
    }

    /// The directory to build. With `kustomize` options, Argo CD runs `kustomize edit set ...`
    /// on the kustomization; the gate does the same edits on a copy placed beside the original
    /// (same depth, so relative references still resolve), leaving the shared tree untouched.
    pub fn build_dir(&self, root: &Path, copy_id: &str) -> Result<BuildDir, String> {
        let target = root.join(&self.path);
        let options = match &self.options {
            Value::Object(m) if m.values().any(|v| non_empty(Some(v))) => m,
            _ => {
                return Ok(BuildDir {
                    dir: target,
                    root: root.to_path_buf(),
                    _copy: None,
                });
            }
        };
        // The repository's root has no folder beside it inside the tree: the whole tree is
        // copied to a tree of its own (removed when the build is done).
        let (copy, build_root, tree) = if normalize(&self.path).is_empty() {
            let tree = tempfile::Builder::new()
                .prefix("gate-tree-")
                .tempdir()
                .map_err(|e| format!("cannot copy the tree: {e}"))?;
            copy_dir(&target, tree.path())
                .map_err(|e| format!("{}: {e}", tree.path().display()))?;
            (
                tree.path().to_path_buf(),
                tree.path().to_path_buf(),
                Some(tree),
            )
        } else {
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| "root".into());
            let copy = target.with_file_name(format!("{name}.gate-{copy_id}"));
            copy_dir(&target, &copy).map_err(|e| format!("{}: {e}", copy.display()))?;
            (copy, root.to_path_buf(), None)
        };
        let file = super::kustomize::kustomization_file(&copy)
            .ok_or(format!("{}: no kustomization file", self.path))?;
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut kustomization =
            yaml::parse_document(&text, &format!("{}/kustomization.yaml", self.path))
                .map_err(|e| e.to_string())?;
        if !kustomization.is_object() {
            kustomization = json!({});
        }
        edit_kustomization(&mut kustomization, options);
        std::fs::remove_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let text = serde_json::to_string_pretty(&kustomization).map_err(|e| e.to_string())?;
        std::fs::write(copy.join("kustomization.yaml"), text)
            .map_err(|e| format!("{}: {e}", copy.display()))?;
        Ok(BuildDir {
            dir: copy,
            root: build_root,
            _copy: tree,
        })
    }
}

/// Where kustomize builds: the folder, the tree it must stay in, and the copy of the tree to
/// remove afterwards (when the source is the repository's root and carries options).
pub struct BuildDir {
    pub dir: PathBuf,
    pub root: PathBuf,
    _copy: Option<tempfile::TempDir>,
}

pub(crate) fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The edits `kustomize edit set|add ...` makes for each of a source's kustomize options.
fn edit_kustomization(kustomization: &mut Value, options: &serde_json::Map<String, Value>) {
    let Some(k) = kustomization.as_object_mut() else {
        return;
    };
    for field in ["namePrefix", "nameSuffix", "namespace"] {
        if let Some(Value::String(v)) = options.get(field).filter(|v| non_empty(Some(v))) {
            k.insert(field.to_string(), json!(v));
        }
    }
    for (option, field) in [
        ("commonLabels", "commonLabels"),
        ("commonAnnotations", "commonAnnotations"),
    ] {
        if let Some(Value::Object(add)) = options.get(option) {
            let entry = k.entry(field.to_string()).or_insert_with(|| json!({}));
            if let Value::Object(existing) = entry {
                for (key, value) in add {
                    existing.insert(key.clone(), value.clone());
                }
            }
        }
    }
    if let Some(Value::Array(images)) = options.get("images") {
        let entry = k.entry("images".to_string()).or_insert_with(|| json!([]));
        if let Value::Array(existing) = entry {
            for image in images
                .iter()
                .filter_map(Value::as_str)
                .map(parse_kustomize_image)
            {
                match existing
                    .iter_mut()
                    .find(|e| e.get("name") == image.get("name"))
                {
                    Some(found) => merge_patch(found, &image),
                    None => existing.push(image),
                }
            }
        }
    }
    if let Some(Value::Array(replicas)) = options.get("replicas") {
        let entry = k.entry("replicas".to_string()).or_insert_with(|| json!([]));
        if let Value::Array(existing) = entry {
            for replica in replicas {
                existing.retain(|e| e.get("name") != replica.get("name"));
                existing.push(replica.clone());
            }
        }
    }
    for field in ["components", "patches"] {
        if let Some(Value::Array(add)) = options.get(field) {
            let entry = k.entry(field.to_string()).or_insert_with(|| json!([]));
            if let Value::Array(existing) = entry {
                for item in add {
                    if !existing.contains(item) {
                        existing.push(item.clone());
                    }
                }
            }
        }
    }
}

fn parse_kustomize_image(spec: &str) -> Value {
    let (name, rest) = match spec.split_once('=') {
        Some((name, new)) => (name.to_string(), Some(new.to_string())),
        None => (String::new(), None),
    };
    let image = rest.clone().unwrap_or_else(|| spec.to_string());
    let (image_name, digest) = image
        .split_once('@')
        .map(|(n, d)| (n.to_string(), Some(d.to_string())))
        .unwrap_or((image.clone(), None));
    let (image_name, tag) = match image_name.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n.to_string(), Some(t.to_string())),
        _ => (image_name, None),
    };
    let mut out = serde_json::Map::new();
    if rest.is_some() {
        out.insert("name".into(), json!(name));
        out.insert("newName".into(), json!(image_name));
    } else {
        out.insert("name".into(), json!(image_name));
    }
    if let Some(tag) = tag {
        out.insert("newTag".into(), json!(tag));
    }
    if let Some(digest) = digest {
        out.insert("digest".into(), json!(digest));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal keys are taken as equal renders (the diff skips them): two inputs helm renders
    /// differently must never share a key, whatever separators their strings hold.
    #[test]
    fn inputs_that_differ_never_share_a_render_key() {
        let job = |api: &[&str], values: &[&[u8]]| HelmJob {
            chart: ChartLocation::Mirror(PathBuf::from("/c")),
            chart_label: "c".into(),
            chart_digest: "d".into(),
            release: "r".into(),
            namespace: "n".into(),
            kube_version: None,
            api_versions: api.iter().map(|s| s.to_string()).collect(),
            values: values
                .iter()
                .map(|v| ValuesInput {
                    name: "v".into(),
                    content: v.to_vec(),
                    file: None,
                })
                .collect(),
            set: vec![],
            set_string: vec![],
            set_file: vec![],
            include_crds: true,
            skip_tests: false,
            skip_schema_validation: false,
        };
        let key = |j: HelmJob| j.cache_key("v4");
        assert_ne!(
            key(job(&["x/v1", "y/v1"], &[])),
            key(job(&["x/v1\ny/v1"], &[]))
        );
        assert_ne!(
            key(job(&["x/v1", "y/v1"], &[])),
            key(job(&["x/v1,y/v1"], &[]))
        );
        assert_ne!(key(job(&[], &[b"a", b"b"])), key(job(&[], &[b"ab"])));
        assert_eq!(key(job(&["x/v1"], &[b"a"])), key(job(&["x/v1"], &[b"a"])));
    }

    #[test]
    fn set_values_escape_commas_like_argo_cd() {
        assert_eq!(clean_set_value("a,b"), "a\\,b");
        assert_eq!(clean_set_value("{a,b}"), "{a,b}");
        assert_eq!(clean_set_value("a\\,b"), "a\\,b");
    }

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

    #[test]
    fn kustomize_images() {
        assert_eq!(
            parse_kustomize_image("nginx:1.2"),
            json!({"name": "nginx", "newTag": "1.2"})
        );
        assert_eq!(
            parse_kustomize_image("nginx=ghcr.io/x/nginx:1.3"),
            json!({"name": "nginx", "newName": "ghcr.io/x/nginx", "newTag": "1.3"})
        );
    }

    #[test]
    fn lists_are_expanded() {
        let mut out = Vec::new();
        push_object(
            json!({"kind": "List", "items": [{"kind": "A"}, {"kind": "ConfigMapList", "items": [{"kind": "B"}]}]}),
            &mut out,
        );
        assert_eq!(out.len(), 2);
    }
}
