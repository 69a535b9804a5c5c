//! The scenario: its scenario.yaml, where its Kargo objects come from, which names are plain.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// How a scenario declares its Kargo objects (`kargo:` in scenario.yaml).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KargoSource {
    /// `kargo.pipelines: FILE`: values of charts/kargo-pipelines, installed with helm.
    Pipelines(String),
    /// `kargo.objects: FILE`: hand-written Warehouses and Stages, applied with kubectl.
    Objects(String),
}

impl KargoSource {
    /// The file `stage` writes under target/kind/<scenario>/.
    pub(super) fn staged_name(&self) -> &'static str {
        match self {
            KargoSource::Pipelines(_) => "pipelines.yaml",
            KargoSource::Objects(_) => "kargo.yaml",
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            KargoSource::Pipelines(file) => format!("pipelines values ({file})"),
            KargoSource::Objects(file) => format!("Kargo objects ({file})"),
        }
    }

    pub(super) fn file(&self) -> &str {
        match self {
            KargoSource::Pipelines(file) | KargoSource::Objects(file) => file,
        }
    }
}

/// scenarios/<scenario>/scenario.yaml, parsed.
pub fn read_scenario(root: &Path, scenario: &str) -> Result<serde_json::Value> {
    if scenario.is_empty() || scenario.contains(['/', '\\']) || scenario.starts_with('.') {
        bail!("{scenario:?} is not a folder name under scenarios/");
    }
    let path = root.join("scenarios").join(scenario).join("scenario.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no scenario {scenario}: cannot read {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("{}: not YAML", path.display()))
}

/// True for a relative path of plain names that, read from scenarios/<scenario>/, stays under
/// scenarios/ (`pipelines.yaml`, `../sample/pipelines-x.yaml`).
pub(super) fn inside_scenarios(path: &str) -> bool {
    let mut depth = 1i32;
    let parts: Vec<&str> = path.split('/').collect();
    for (index, part) in parts.iter().enumerate() {
        if *part == ".." && index + 1 < parts.len() {
            depth -= 1;
        } else if plain(part, false) {
            depth += 1;
        } else {
            return false;
        }
        if depth < 0 {
            return false;
        }
    }
    depth >= 1
}

/// Where the scenario's Kargo objects come from.
pub fn kargo_source(scenario_yaml: &serde_json::Value, scenario: &str) -> Result<KargoSource> {
    let kargo = &scenario_yaml["kargo"];
    let file = |key: &str| -> Result<Option<String>> {
        match kargo.get(key) {
            None => Ok(None),
            Some(serde_json::Value::String(file)) if inside_scenarios(file) => {
                Ok(Some(file.clone()))
            }
            Some(other) => bail!(
                "scenarios/{scenario}/scenario.yaml: kargo.{key} must name a file under scenarios/, relative to the scenario, not {other}"
            ),
        }
    };
    match (file("pipelines")?, file("objects")?) {
        (Some(pipelines), None) => Ok(KargoSource::Pipelines(pipelines)),
        (None, Some(objects)) => Ok(KargoSource::Objects(objects)),
        _ => bail!(
            "scenarios/{scenario}/scenario.yaml: kargo names neither or both of `pipelines` and `objects`"
        ),
    }
}

/// A name a plan may put into a command: letters, digits, `.`, `_`, `-` (and one `/` for an
/// OWNER/NAME slug), nothing a shell or a URL would read otherwise.
pub(super) fn plain(text: &str, slug: bool) -> bool {
    let parts: Vec<&str> = if slug {
        text.split('/').collect()
    } else {
        vec![text]
    };
    (!slug || parts.len() == 2)
        && parts.iter().all(|part| {
            !part.is_empty()
                && !part.starts_with(['.', '-'])
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

/// A cluster of the scenario's inventory that gets a kind cluster of its own, registered in
/// Argo CD with the labels and annotations its generators select on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadCluster {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
}

/// A label or annotation key: an optional DNS-1123 subdomain prefix and `/`, then a name
/// (Kubernetes' qualified name). Every part starts and ends with a letter or digit, so a key
/// can never be read as a flag.
fn qualified_key(key: &str) -> bool {
    let alnum_ends = |part: &str| {
        part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && alnum_ends(name)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    let prefix_ok = prefix.is_empty()
        || (prefix.len() <= 253
            && prefix.split('.').all(|part| {
                alnum_ends(part)
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            }));
    name_ok && prefix_ok
}

/// A label value: empty, or at most 63 characters of letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or digit.
fn label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric())
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
}

/// Keys the kind plan writes itself on a cluster Secret: a scenario may not set them.
const RESERVED_KEYS: [&str; 2] = [
    "argocd.argoproj.io/secret-type",
    "gitops-gate.io/kube-version",
];

/// The clusters of the scenario's `inventory:` that Argo CD deploys to, each a kind cluster on
/// kind. The Argo CD control plane itself (`https://kubernetes.default.svc`) is the main
/// cluster and is left out. A name, key or value that is not plain is refused, naming it.
pub fn workload_clusters(
    root: &Path,
    scenario_yaml: &serde_json::Value,
    scenario: &str,
) -> Result<Vec<WorkloadCluster>> {
    let Some(inventory) = scenario_yaml.get("inventory") else {
        return Ok(Vec::new());
    };
    let origin = format!("scenarios/{scenario}/scenario.yaml");
    let file = match inventory {
        serde_json::Value::String(file) if inside_scenarios(file) => file,
        other => bail!("{origin}: inventory must name a file under scenarios/, not {other}"),
    };
    let path = root.join("scenarios").join(scenario).join(file);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{origin}: cannot read its inventory {file}"))?;
    let inventory: serde_json::Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("scenarios/{scenario}/{file}: not YAML"))?;
    let mut clusters = Vec::new();
    for cluster in inventory["clusters"].as_array().into_iter().flatten() {
        let name = cluster["name"].as_str().unwrap_or_default();
        if cluster["server"].as_str() == Some("https://kubernetes.default.svc") {
            continue;
        }
        // The kind cluster is `gitops-loop-<name>` and its node container adds
        // `-control-plane`: a DNS label of at most 63 characters.
        let dns_label = !name.is_empty()
            && name.len() <= 36
            && !name.starts_with('-')
            && !name.ends_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !dns_label {
            bail!(
                "scenarios/{scenario}/{file}: cluster name {name:?} is not a lowercase DNS label of at most 36 characters (a kind cluster is named after it)"
            );
        }
        let pairs = |field: &str| -> Result<Vec<(String, String)>> {
            let mut out = Vec::new();
            for (key, value) in cluster[field].as_object().into_iter().flatten() {
                let value = value.as_str().unwrap_or_default();
                // Annotation values take the label rules too: they reach an argv.
                if !qualified_key(key)
                    || RESERVED_KEYS.contains(&key.as_str())
                    || !label_value(value)
                {
                    bail!(
                        "scenarios/{scenario}/{file}: cluster {name}: {field} {key:?}: {value:?} is not a plain key and value"
                    );
                }
                out.push((key.clone(), value.to_string()));
            }
            // By key, whatever order serde_json's map keeps (feature unification in a
            // workspace build can turn on `preserve_order`).
            out.sort();
            Ok(out)
        };
        clusters.push(WorkloadCluster {
            name: name.to_string(),
            labels: pairs("labels")?,
            annotations: pairs("annotations")?,
        });
    }
    Ok(clusters)
}

/// The chart each Stage of a charts/kargo-pipelines values file promotes (Stage name, as the
/// chart names it, to chart name). Targets without `chart.name` (an `oci://` chart URL names
/// its chart itself) are left out.
pub fn stage_charts(pipelines: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for target in pipelines["targets"].as_array().into_iter().flatten() {
        let (Some(target_name), Some(chart)) = (
            target["name"].as_str(),
            target.pointer("/chart/name").and_then(|n| n.as_str()),
        ) else {
            continue;
        };
        for stage in target["stages"].as_array().into_iter().flatten() {
            let name = match (stage["stageName"].as_str(), stage["name"].as_str()) {
                (Some(stage_name), _) => stage_name.to_string(),
                (None, Some(name)) => format!("{target_name}-{name}"),
                (None, None) => continue,
            };
            out.insert(name, chart.to_string());
        }
    }
    out
}

/// The Stage-to-chart map of a scenario whose Kargo objects come from the pipelines chart
/// (empty for hand-written objects).
pub fn scenario_stage_charts(
    root: &Path,
    scenario: &str,
    source: &KargoSource,
) -> Result<std::collections::BTreeMap<String, String>> {
    let KargoSource::Pipelines(file) = source else {
        return Ok(Default::default());
    };
    let path = root.join("scenarios").join(scenario).join(file);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading scenarios/{scenario}/{file}"))?;
    let values: serde_json::Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("scenarios/{scenario}/{file}: not YAML"))?;
    Ok(stage_charts(&values))
}
