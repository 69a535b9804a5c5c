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
fn inside_scenarios(path: &str) -> bool {
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
