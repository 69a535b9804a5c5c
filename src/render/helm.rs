//! Helm sources as Argo CD's repo-server renders them (argo-cd v3.5 `util/helm/cmd.go`,
//! `reposerver/repository/repository.go`): the job, its values files and `--set` flags,
//! and its cache key.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::git::{Snapshot, hex};
use crate::paths::{escapes_root, normalize};
use crate::render::inventory::Cluster;
use crate::render::source::{
    ChartLocation, HelmJob, ValuesFile, ValuesInput, build_env, join, str_at, substitute_env,
};

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
pub(crate) fn helm_job(
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
    let api_versions = api_versions(&helm, cluster);
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
    let files = ValueFiles {
        env: &env,
        refs,
        chart: &chart,
        git_chart,
    };
    let values = files.values(&helm, flag("ignoreMissingValueFiles"))?;
    let (set, set_string) = set_flags(&helm, &env);
    let set_file = files.set_files(&helm)?;
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

/// `helm.apiVersions` sorted and without repeats, or the cluster's when the list is empty.
fn api_versions(helm: &Value, cluster: &Cluster) -> Vec<String> {
    match helm.get("apiVersions").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => {
            let mut sorted: Vec<String> = list
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            sorted.sort();
            sorted.dedup();
            sorted
        }
        _ => cluster.api_versions.clone(),
    }
}

/// `helm.parameters` as `--set` and `--set-string` flags (`forceString`), `$ARGOCD_APP_*`
/// substituted and commas escaped as Argo CD does.
fn set_flags(helm: &Value, env: &[(String, String)]) -> (Vec<String>, Vec<String>) {
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
        let value = clean_set_value(&substitute_env(&value, env));
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
    (set, set_string)
}

/// Where a Helm source's value files are read from: the chart, `$ref` sources, the build
/// environment their names are substituted with.
struct ValueFiles<'a> {
    env: &'a [(String, String)],
    refs: &'a BTreeMap<String, Arc<Snapshot>>,
    chart: &'a ChartLocation,
    git_chart: Option<(&'a Arc<Snapshot>, &'a str)>,
}

impl ValueFiles<'_> {
    /// `helm.valueFiles` in order (a missing one refused unless `ignore_missing`), then the
    /// inline values as one more file: `valuesObject` wins over `values`.
    fn values(&self, helm: &Value, ignore_missing: bool) -> Result<Vec<ValuesInput>, String> {
        let mut values = Vec::new();
        for entry in helm
            .get("valueFiles")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(raw) = entry.as_str() else { continue };
            for input in resolve_value_file(raw, self.env, self.refs, self.chart, self.git_chart)? {
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
        Ok(values)
    }

    /// `helm.fileParameters` as `--set-file` pairs; a name helm would split, or a missing
    /// file, is refused.
    fn set_files(&self, helm: &Value) -> Result<Vec<(String, ValuesInput)>, String> {
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
            // helm reads `--set-file a=x,b=y` as two files: a name with `,` or `=` would make
            // it read any file on the machine into the values.
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
            let mut found =
                resolve_value_file(raw, self.env, self.refs, self.chart, self.git_chart)?;
            match found.pop() {
                Some(Ok(input)) => set_file.push((name, input)),
                _ => {
                    return Err(format!(
                        "helm.fileParameters {name}: file {raw} does not exist"
                    ));
                }
            }
        }
        Ok(set_file)
    }
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

impl HelmJob {
    /// A digest of every input of this job that can change helm's output. The helm binary
    /// is one per run, so it is not part of the key; the persistent cache adds its version
    /// (`RenderCache::entry`), which is asked while the run plans its jobs.
    pub fn render_key(&self) -> String {
        let mut hasher = Sha256::new();
        let mut field = |label: &str, bytes: &[u8]| {
            hasher.update(label.as_bytes());
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field("kind", b"helm-template-v1");
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Equal keys are taken as equal renders (the diff skips them): two inputs helm renders
    /// differently must never share a key, whatever separators their strings hold.
    #[test]
    fn inputs_that_differ_never_share_a_render_key() {
        let job = |api: &[&str], values: &[&[u8]]| HelmJob {
            api_versions: api.iter().map(|s| s.to_string()).collect(),
            values: values
                .iter()
                .map(|v| ValuesInput {
                    name: "v".into(),
                    content: v.to_vec(),
                    file: None,
                })
                .collect(),
            ..HelmJob::of_chart(ChartLocation::Mirror(PathBuf::from("/c")))
        };
        let key = |j: HelmJob| j.render_key();
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
}
