//! Keeping a kustomize build inside the materialised tree of one commit.
//!
//! `kubectl kustomize` follows a `resources:` entry, a base, a component or a generator's
//! file wherever it points: an absolute path, `../../..` out of the tree (into a checkout's
//! `.git/config`, say), a URL, a git repository. Before the build, every kustomization
//! reachable from the source is read and every entry that names a file or folder must be a
//! relative path to something that exists inside the tree; anything else is refused with the
//! file and the entry. The network namespace `confine.rs` runs kubectl in is the backstop.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::yaml;

/// The names kustomize looks for, in its order.
pub const KUSTOMIZATION_FILES: [&str; 3] =
    ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The kustomization file of a folder on disk, in kustomize's order.
pub fn kustomization_file(dir: &Path) -> Option<PathBuf> {
    KUSTOMIZATION_FILES
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
}

/// Checks every kustomization reachable from `dir` (inside `root`). Returns the first refusal,
/// or the folders (relative to `root`) whose kustomization holds `helmCharts` to inflate
/// (only when `enable_helm`).
pub fn check_confined(root: &Path, dir: &Path, enable_helm: bool) -> Result<Vec<PathBuf>, String> {
    let mut helm = Vec::new();
    let root = lexical(root);
    let start = lexical(dir);
    if !start.starts_with(&root) {
        return Err(format!(
            "the source folder {} is outside the repository",
            dir.display()
        ));
    }
    let mut seen = BTreeSet::new();
    let mut stack = vec![start];
    while let Some(dir) = stack.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let Some(file) = kustomization_file(&dir) else {
            // kustomize itself says a folder without a kustomization is not a base.
            continue;
        };
        let label = relative(&root, &file);
        let text = read_text(&file, &label)?;
        let kustomization = yaml::parse_document(&text, &label).map_err(|e| e.to_string())?;
        let (found, charts) =
            helm_charts(&kustomization, enable_helm).map_err(|e| format!("{label}: {e}"))?;
        if !charts.is_empty() {
            helm.push(dir.strip_prefix(&root).unwrap_or(&dir).to_path_buf());
        }
        for entry in entries(&kustomization)
            .map_err(|e| format!("{label}: {e}"))?
            .into_iter()
            .chain(found)
        {
            let target = resolve(&root, &dir, &entry).map_err(|why| {
                format!(
                    "{label}: {} entry {:?} {why}",
                    entry.field,
                    entry.value.chars().take(200).collect::<String>()
                )
            })?;
            if entry.may_be_base && target.is_dir() {
                stack.push(target.clone());
            }
            // A plugin configuration file (`generators: [gen.yaml]`) names files of its own,
            // which kustomize resolves from this kustomization's folder.
            if entry.plugin && target.is_file() {
                let plugin_label = relative(&root, &target);
                let text = read_text(&target, &plugin_label)?;
                for (index, document) in yaml::parse_documents(&text, &plugin_label)
                    .map_err(|e| e.to_string())?
                    .iter()
                    .enumerate()
                {
                    for inner in plugin_entries(document)
                        .map_err(|e| format!("{plugin_label}: document {index}: {e}"))?
                    {
                        resolve(&root, &dir, &inner).map_err(|why| {
                            format!(
                                "{plugin_label}: document {index}: {} entry {:?} {why}",
                                inner.field,
                                inner.value.chars().take(200).collect::<String>()
                            )
                        })?;
                    }
                }
            }
        }
    }
    Ok(helm)
}

/// The built-in plugins a configuration file may hold, and their fields that name files.
/// Anything else is refused: the gate does not run what it cannot scan.
const PLUGINS: &[(&str, &[&str])] = &[
    ("PatchTransformer", &["path"]),
    ("PatchJson6902Transformer", &["path"]),
    ("PatchStrategicMergeTransformer", &["paths"]),
    ("ReplacementTransformer", &["replacements"]),
    ("ConfigMapGenerator", &["files", "envs", "env"]),
    ("SecretGenerator", &["files", "envs", "env"]),
    ("LabelTransformer", &[]),
    ("AnnotationsTransformer", &[]),
    ("NamespaceTransformer", &[]),
    ("PrefixSuffixTransformer", &[]),
    ("PrefixTransformer", &[]),
    ("SuffixTransformer", &[]),
    ("ImageTagTransformer", &[]),
    ("ReplicaCountTransformer", &[]),
    ("HashTransformer", &[]),
    ("SortOrderTransformer", &[]),
    ("ValueAddTransformer", &[]),
];

/// The entries of one plugin configuration document that name files.
fn plugin_entries(document: &Value) -> Result<Vec<PathEntry>, String> {
    let kind = document.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = document
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some((_, fields)) = PLUGINS.iter().find(|(k, _)| *k == kind) else {
        return Err(format!(
            "plugin {kind:?} is not a built-in plugin the gate scans; it refuses what it cannot scan"
        ));
    };
    if api_version != "builtin" {
        return Err(format!(
            "plugin {kind} has apiVersion {api_version:?}; only `builtin` plugins run offline"
        ));
    }
    // The same exactness as a kustomization: a field in another case is one kustomize reads.
    if let Some(map) = document.as_object() {
        for key in map.keys() {
            let lower = key.to_ascii_lowercase();
            if !key.is_ascii()
                || ["path", "paths", "files", "envs", "env", "replacements"]
                    .iter()
                    .any(|f| *f == lower && f != key)
            {
                return Err(format!(
                    "key {:?} names files in another case (or with non-ASCII letters); the gate refuses it",
                    key.chars().take(60).collect::<String>()
                ));
            }
        }
    }
    let mut out = Vec::new();
    for field in *fields {
        match *field {
            "replacements" => {
                if let Some(Value::Array(items)) = document.get("replacements") {
                    for (index, item) in items.iter().enumerate() {
                        exact_keys(
                            item,
                            REPLACEMENT_FIELDS,
                            &format!("replacements[{index}]: "),
                        )?;
                        if let Some(path) = item.get("path").and_then(Value::as_str) {
                            out.push(PathEntry {
                                field: format!("replacements[{index}].path"),
                                value: path.to_string(),
                                may_be_base: false,
                                plugin: false,
                            });
                        }
                    }
                }
            }
            "files" => {
                for source in strings(document.get("files")) {
                    let path = source.split_once('=').map(|(_, p)| p).unwrap_or(&source);
                    out.push(PathEntry {
                        field: "files".into(),
                        value: path.to_string(),
                        may_be_base: false,
                        plugin: false,
                    });
                }
            }
            other => {
                for value in strings(document.get(other)) {
                    if !value.contains('\n') {
                        out.push(PathEntry {
                            field: other.to_string(),
                            value,
                            may_be_base: false,
                            plugin: false,
                        });
                    }
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .filter(|e| !e.value.trim().is_empty())
        .collect())
}

/// One entry of a kustomization that names a file or a folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathEntry {
    /// Where it sits: `resources`, `configMapGenerator[0].files`, ...
    pub field: String,
    pub value: String,
    /// A folder here is a kustomization of its own, to be checked in turn.
    pub may_be_base: bool,
    /// A file here is a plugin configuration whose own file entries are checked too.
    pub plugin: bool,
}

fn strings(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// The fields of a kustomization (kustomize v5's `types.Kustomization`), exactly as written.
const FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "openapi",
    "namePrefix",
    "nameSuffix",
    "namespace",
    "commonLabels",
    "labels",
    "commonAnnotations",
    "patchesStrategicMerge",
    "patchesJson6902",
    "patches",
    "images",
    "replacements",
    "replicas",
    "vars",
    "sortOptions",
    "resources",
    "components",
    "crds",
    "bases",
    "configMapGenerator",
    "secretGenerator",
    "helmGlobals",
    "helmCharts",
    "helmChartInflationGenerator",
    "generatorOptions",
    "configurations",
    "generators",
    "transformers",
    "validators",
    "buildMetadata",
];
const GENERATOR_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "behavior",
    "files",
    "envs",
    "env",
    "literals",
    "options",
    "type",
];
const PATCH_FIELDS: &[&str] = &["path", "patch", "target", "options"];
const REPLACEMENT_FIELDS: &[&str] = &["path", "source", "targets"];
const OPENAPI_FIELDS: &[&str] = &["path", "version"];
const HELM_GLOBALS_FIELDS: &[&str] = &["chartHome", "configHome"];

/// kustomize reads a kustomization with Go's `encoding/json`, which matches field names
/// ignoring case (and folds `ſ` to `s`, `K` to `k`): `RESOURCES:` is `resources:` to it. The
/// scan reads exact names, so every key must be exactly one of the fields it knows.
fn exact_keys(value: &Value, allowed: &[&str], at: &str) -> Result<(), String> {
    let Some(map) = value.as_object() else {
        return Ok(());
    };
    for key in map.keys() {
        if allowed.contains(&key.as_str()) {
            continue;
        }
        let shown: String = key.chars().take(60).collect();
        return Err(
            match allowed
                .iter()
                .find(|f| key.is_ascii() && f.eq_ignore_ascii_case(key))
            {
                Some(field) => format!(
                    "{at}key {shown:?} is {field:?} in another case (kustomize matches field names ignoring case); the gate reads only the exact name, so it refuses this one"
                ),
                None => format!(
                    "{at}key {shown:?} is not a kustomization field the gate knows; it refuses what it cannot scan"
                ),
            },
        );
    }
    Ok(())
}

/// Every entry of one kustomization that names a file or folder; `helmCharts` are refused, and
/// so is any key the scan would not read exactly as kustomize does.
pub fn entries(kustomization: &Value) -> Result<Vec<PathEntry>, String> {
    exact_keys(kustomization, FIELDS, "")?;
    for (field, allowed) in [
        ("configMapGenerator", GENERATOR_FIELDS),
        ("secretGenerator", GENERATOR_FIELDS),
        ("patches", PATCH_FIELDS),
        ("patchesJson6902", PATCH_FIELDS),
        ("replacements", REPLACEMENT_FIELDS),
    ] {
        if let Some(Value::Array(items)) = kustomization.get(field) {
            for (index, item) in items.iter().enumerate() {
                exact_keys(item, allowed, &format!("{field}[{index}]: "))?;
            }
        }
    }
    if let Some(openapi) = kustomization.get("openapi") {
        exact_keys(openapi, OPENAPI_FIELDS, "openapi: ")?;
    }
    if let Some(globals) = kustomization.get("helmGlobals") {
        exact_keys(globals, HELM_GLOBALS_FIELDS, "helmGlobals: ")?;
    }
    let mut out = Vec::new();
    let mut push = |field: String, value: String, may_be_base: bool| {
        if !value.trim().is_empty() {
            let plugin = matches!(field.as_str(), "generators" | "transformers" | "validators");
            out.push(PathEntry {
                field,
                value,
                may_be_base,
                plugin,
            });
        }
    };
    for field in [
        "resources",
        "bases",
        "components",
        "generators",
        "transformers",
        "validators",
    ] {
        for value in strings(kustomization.get(field)) {
            push(field.to_string(), value, true);
        }
    }
    for field in ["crds", "configurations"] {
        for value in strings(kustomization.get(field)) {
            push(field.to_string(), value, false);
        }
    }
    // An entry with a line break is an inline patch, not a path.
    for value in strings(kustomization.get("patchesStrategicMerge")) {
        if !value.contains('\n') {
            push("patchesStrategicMerge".into(), value, false);
        }
    }
    for field in ["patches", "patchesJson6902", "replacements"] {
        if let Some(Value::Array(items)) = kustomization.get(field) {
            for (index, item) in items.iter().enumerate() {
                if let Some(path) = item.get("path").and_then(Value::as_str) {
                    push(format!("{field}[{index}].path"), path.to_string(), false);
                }
            }
        }
    }
    for field in ["configMapGenerator", "secretGenerator"] {
        if let Some(Value::Array(items)) = kustomization.get(field) {
            for (index, item) in items.iter().enumerate() {
                for source in strings(item.get("files")) {
                    // `key=path`: the path is what follows the key.
                    let path = source.split_once('=').map(|(_, p)| p).unwrap_or(&source);
                    push(format!("{field}[{index}].files"), path.to_string(), false);
                }
                for env in strings(item.get("envs"))
                    .into_iter()
                    .chain(strings(item.get("env")))
                {
                    push(format!("{field}[{index}].envs"), env, false);
                }
            }
        }
    }
    if let Some(path) = kustomization
        .pointer("/openapi/path")
        .and_then(Value::as_str)
    {
        push("openapi.path".into(), path.to_string(), false);
    }
    if let Some(path) = kustomization
        .pointer("/helmGlobals/chartHome")
        .and_then(Value::as_str)
    {
        push("helmGlobals.chartHome".into(), path.to_string(), false);
    }
    if kustomization
        .get("helmChartInflationGenerator")
        .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()) || v.is_object())
    {
        return Err(
            "helmChartInflationGenerator is not supported by the gate; write helmCharts".into(),
        );
    }
    Ok(out)
}

/// Where an entry points, if that is a file or folder inside `root`.
fn resolve(root: &Path, dir: &Path, entry: &PathEntry) -> Result<PathBuf, &'static str> {
    let value = entry.value.trim();
    let lower = value.to_ascii_lowercase();
    // kustomize parses an entry as a repository before it looks on disk: `github.com/o/r`
    // is cloned even when a folder of that name exists in the tree.
    if lower.contains("://")
        || lower.starts_with("git@")
        || lower.starts_with("git::")
        || lower.starts_with("ssh:")
        || lower.starts_with("github.com")
        || lower.contains("?ref=")
        || lower.contains("?version=")
        || lower.contains(".git?")
        || lower.ends_with(".git")
        || lower.contains("//")
    {
        return Err("is a remote location; the gate renders offline and refuses it");
    }
    if Path::new(value).is_absolute() || value.starts_with('~') {
        return Err("is an absolute path; a kustomization may only name files of its repository");
    }
    let target = lexical(&dir.join(value));
    if !target.starts_with(root) {
        return Err("leaves the repository; a kustomization may only name files of its repository");
    }
    match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            Err("is a symbolic link; the gate never follows one")
        }
        Ok(_) => Ok(target),
        Err(_) => Err(
            "is not a file or folder of the repository (kustomize would try it as a remote base); the gate refuses it",
        ),
    }
}

/// The fields of one `helmCharts` entry (kustomize's `HelmChart`) the gate inflates.
const HELM_CHART_FIELDS: &[&str] = &[
    "name",
    "repo",
    "version",
    "releaseName",
    "namespace",
    "valuesInline",
    "valuesFile",
    "additionalValuesFiles",
    "includeCRDs",
    "skipTests",
    "skipHooks",
    "apiVersions",
    "kubeVersion",
];

/// One chart a kustomization inflates.
#[derive(Debug, Clone)]
pub struct HelmChart {
    pub chart: crate::render::charts::ChartRef,
    pub release: String,
    pub namespace: String,
    pub values_files: Vec<String>,
    pub values_inline: Value,
    pub additional_values_files: Vec<String>,
    pub include_crds: bool,
    pub skip_tests: bool,
    pub skip_hooks: bool,
    pub api_versions: Vec<String>,
    pub kube_version: String,
}

/// The `helmCharts` of a kustomization: refused unless Argo CD's build options enable helm
/// (`--kustomize-enable-helm`); then each must be a pinned chart of the mirror, and its values
/// files are path entries like any other.
pub fn helm_charts(
    kustomization: &Value,
    enable_helm: bool,
) -> Result<(Vec<PathEntry>, Vec<HelmChart>), String> {
    let Some(items) = kustomization.get("helmCharts") else {
        return Ok((Vec::new(), Vec::new()));
    };
    let items = match items {
        Value::Array(items) if items.is_empty() => return Ok((Vec::new(), Vec::new())),
        Value::Array(items) => items,
        Value::Null => return Ok((Vec::new(), Vec::new())),
        _ => return Err("helmCharts must be a list".into()),
    };
    if !enable_helm {
        return Err(
            "helmCharts needs kustomize's --enable-helm, which Argo CD passes only when its kustomize.buildOptions say so; run the gate with --kustomize-enable-helm if yours do".into(),
        );
    }
    let mut paths = Vec::new();
    let mut charts = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let at = format!("helmCharts[{index}]");
        exact_keys(item, HELM_CHART_FIELDS, &format!("{at}: "))?;
        // kustomize decodes a HelmChart strictly: a field of the wrong type fails the build.
        if let Some(map) = item.as_object() {
            for (key, value) in map {
                let ok = match key.as_str() {
                    "includeCRDs" | "skipTests" | "skipHooks" => value.is_boolean(),
                    "additionalValuesFiles" | "apiVersions" => value
                        .as_array()
                        .is_some_and(|a| a.iter().all(Value::is_string)),
                    "valuesInline" => value.is_object() || value.is_null(),
                    _ => value.is_string(),
                };
                if !ok {
                    return Err(format!(
                        "{at}.{key}: the wrong type (kustomize refuses this kustomization)"
                    ));
                }
            }
        }
        let text = |key: &str| {
            item.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let flag = |key: &str| item.get(key).and_then(Value::as_bool).unwrap_or(false);
        let chart = crate::render::charts::ChartRef {
            repo_url: text("repo"),
            chart: text("name"),
            version: text("version"),
        };
        if chart.repo_url.is_empty() || chart.version.is_empty() {
            return Err(format!(
                "{at}: the gate inflates pinned charts of its mirror only (repo and version are required)"
            ));
        }
        // The same rules as a Helm source's: both become folders of the chart mirror, so a
        // name or version that is a path would read a chart from anywhere on the machine.
        if !crate::render::charts::is_chart_name(&chart.chart) {
            return Err(format!(
                "{at}.name {:?}: not a chart name (letters, digits, `.`, `_`, `-`, no path)",
                chart.chart.chars().take(120).collect::<String>()
            ));
        }
        if !crate::render::charts::is_chart_version(&chart.version) {
            return Err(format!(
                "{at}.version {:?}: not a pinned chart version (SemVer: digits, letters, `.`, `+`, `-`)",
                chart.version.chars().take(120).collect::<String>()
            ));
        }
        let values_files: Vec<String> = strings(item.get("valuesFile"));
        let additional = strings(item.get("additionalValuesFiles"));
        for (field, list) in [
            ("valuesFile", &values_files),
            ("additionalValuesFiles", &additional),
        ] {
            for value in list {
                paths.push(PathEntry {
                    field: format!("{at}.{field}"),
                    value: value.clone(),
                    may_be_base: false,
                    plugin: false,
                });
            }
        }
        let release = match text("releaseName") {
            name if name.is_empty() => "release-name".to_string(),
            name => name,
        };
        // A release name is a DNS-1123 subdomain of at most 53 characters (helm's rule); the
        // gate passes it as a name template, so nothing else may reach it.
        if release.len() > 53 || !crate::names::is_dns1123_subdomain(&release) {
            return Err(format!(
                "{at}.releaseName {:?}: not a release name (lowercase letters, digits, `-`, `.`, at most 53)",
                release.chars().take(80).collect::<String>()
            ));
        }
        charts.push(HelmChart {
            chart,
            release,
            namespace: text("namespace"),
            values_files,
            values_inline: item.get("valuesInline").cloned().unwrap_or(Value::Null),
            additional_values_files: additional,
            include_crds: flag("includeCRDs"),
            skip_tests: flag("skipTests"),
            skip_hooks: flag("skipHooks"),
            api_versions: strings(item.get("apiVersions")),
            kube_version: text("kubeVersion"),
        });
    }
    Ok((paths, charts))
}

/// The charts any kustomization of `snapshot` names under `helmCharts`, read leniently (the
/// build checks them): a kustomization can reach any folder of the tree, so a kustomize
/// source's render key covers the mirror's copy of every chart the tree could inflate.
pub fn charts_named(snapshot: &crate::git::Snapshot) -> Vec<crate::render::charts::ChartRef> {
    let mut out = Vec::new();
    for path in snapshot.paths() {
        let name = path.rsplit('/').next().unwrap_or(path);
        if !KUSTOMIZATION_FILES.contains(&name) {
            continue;
        }
        let Some(text) = snapshot
            .read(path)
            .and_then(|b| std::str::from_utf8(b).ok())
        else {
            continue;
        };
        if !text.contains("helmCharts") {
            continue;
        }
        let Ok(document) = yaml::parse_document(text, path) else {
            continue;
        };
        for item in document
            .get("helmCharts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let text = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or("");
            let chart = crate::render::charts::ChartRef {
                repo_url: text("repo").to_string(),
                chart: text("name").to_string(),
                version: text("version").to_string(),
            };
            if !out.contains(&chart) {
                out.push(chart);
            }
        }
    }
    out
}

/// Inflates the `helmCharts` of the kustomizations in `folders` (relative to `tree`, a private
/// copy of the commit's files, as `check_confined` found them) the way kustomize would, but
/// from the chart mirror and with the confined helm: each chart's output becomes a file the
/// kustomization lists as a resource, and the `helmCharts` field is removed. kubectl's
/// kustomize cannot do it itself here: it asks `helm version -c`, which Helm 4 no longer has.
pub fn inflate(
    tree: &Path,
    folders: &[PathBuf],
    helm: &crate::render::tools::Tool,
    mirror: Option<&Path>,
    scratch: &Path,
) -> Result<(), String> {
    let mut counter = 0usize;
    for folder in folders {
        let dir = tree.join(folder);
        let Some(file) = kustomization_file(&dir) else {
            continue;
        };
        let label = relative(tree, &file);
        let text = read_text(&file, &label)?;
        let mut kustomization = yaml::parse_document(&text, &label).map_err(|e| e.to_string())?;
        let (_, charts) = helm_charts(&kustomization, true).map_err(|e| format!("{label}: {e}"))?;
        let mut resources = strings(kustomization.get("resources"));
        // The output goes to a folder no file of the commit can name (a committed file of the
        // same name would otherwise be overwritten, and a patch on it would vanish).
        let out_dir = tempfile::Builder::new()
            .prefix(".gate-helm-")
            .tempdir_in(&dir)
            .map_err(|e| format!("{label}: {e}"))?
            .keep();
        let out_name = out_dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let chart_home = kustomization
            .pointer("/helmGlobals/chartHome")
            .and_then(Value::as_str)
            .unwrap_or("charts")
            .to_string();
        for chart in &charts {
            // kustomize renders a chart already under chartHome instead of pulling it: the
            // gate renders from its mirror, so such a commit is refused, not shown wrong.
            let home = dir.join(&chart_home);
            if home.join(&chart.chart.chart).exists()
                || home
                    .join(format!("{}-{}", chart.chart.chart, chart.chart.version))
                    .exists()
            {
                return Err(format!(
                    "{label}: helmCharts {}: a chart of that name is committed under {chart_home}/, which kustomize would render instead of the repository's; the gate refuses to guess which",
                    chart.chart
                ));
            }
            let chart_dir = crate::render::charts::locate(mirror, &chart.chart)?;
            // helm follows a symbolic link in a chart to any file on the machine: refused as
            // for a Helm source (the digest is the render key's, `charts_named`).
            crate::render::cache::digest_dir(&chart_dir)
                .map_err(|e| format!("{label}: helmCharts {}: {e}", chart.chart))?;
            // Every value rides on its flag (`--name-template=...`): a release name or a
            // version that starts with `-` stays a value, never a flag of its own.
            let mut call = helm
                .confined(&scratch.join("helm-home"))
                .arg("template")
                .arg(&chart_dir)
                .arg(format!("--name-template={}", chart.release));
            if !chart.namespace.is_empty() {
                call = call.arg(format!("--namespace={}", chart.namespace));
            }
            // Values files are copied to scratch and passed by that path: helm splits a
            // `--values` argument on commas.
            let mut copy_values = |file: &str| -> Result<PathBuf, String> {
                let entry = PathEntry {
                    field: "valuesFile".into(),
                    value: file.to_string(),
                    may_be_base: false,
                    plugin: false,
                };
                let source = resolve(tree, &dir, &entry)
                    .map_err(|why| format!("{label}: valuesFile {file:?} {why}"))?;
                counter += 1;
                let target = scratch.join(format!("kustomize-helm-values-{counter}.yaml"));
                std::fs::copy(&source, &target).map_err(|e| format!("{label}: {file}: {e}"))?;
                Ok(target)
            };
            let mut values = Vec::new();
            for file in &chart.values_files {
                values.push(copy_values(file)?);
            }
            let mut additional = Vec::new();
            for file in &chart.additional_values_files {
                additional.push(copy_values(file)?);
            }
            for file in values {
                call = call.arg(format!("--values={}", file.display()));
            }
            if !chart.values_inline.is_null() {
                counter += 1;
                let inline = scratch.join(format!("kustomize-helm-values-{counter}.json"));
                std::fs::write(&inline, chart.values_inline.to_string())
                    .map_err(|e| format!("{}: {e}", inline.display()))?;
                call = call.arg(format!("--values={}", inline.display()));
            }
            for file in additional {
                call = call.arg(format!("--values={}", file.display()));
            }
            if chart.include_crds {
                call = call.arg("--include-crds");
            }
            if chart.skip_tests {
                call = call.arg("--skip-tests");
            }
            if chart.skip_hooks {
                call = call.arg("--no-hooks");
            }
            if !chart.kube_version.is_empty() {
                call = call.arg(format!("--kube-version={}", chart.kube_version));
            }
            for api in &chart.api_versions {
                call = call.arg(format!("--api-versions={api}"));
            }
            let output = helm
                .run(call)
                .map_err(|e| format!("{label}: helmCharts {}: {e}", chart.chart))?;
            if !output.status.success() {
                return Err(format!(
                    "{label}: helmCharts {} failed: {}",
                    chart.chart,
                    crate::render::charts::first_error_line(&String::from_utf8_lossy(
                        &output.stderr
                    ))
                ));
            }
            counter += 1;
            let name = format!("chart-{counter}.yaml");
            std::fs::write(out_dir.join(&name), &output.stdout)
                .map_err(|e| format!("{}: {e}", out_dir.join(&name).display()))?;
            resources.push(format!("{out_name}/{name}"));
        }
        if let Some(map) = kustomization.as_object_mut() {
            map.remove("helmCharts");
            map.remove("helmGlobals");
            map.insert(
                "resources".into(),
                Value::Array(resources.into_iter().map(Value::String).collect()),
            );
        }
        let text = serde_json::to_string_pretty(&kustomization).map_err(|e| e.to_string())?;
        std::fs::remove_file(&file).map_err(|e| format!("{label}: {e}"))?;
        std::fs::write(dir.join("kustomization.yaml"), text)
            .map_err(|e| format!("{label}: {e}"))?;
    }
    Ok(())
}

/// A file the scan reads, as UTF-8 text (anything else kustomize would misread).
fn read_text(path: &Path, label: &str) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{label}: {e}"))?;
    String::from_utf8(bytes)
        .map_err(|_| format!("{label}: not UTF-8 text; kustomize would misread it"))
}

/// `a/b/../c` -> `a/c`, without touching the disk (the materialised tree has no links).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests;
