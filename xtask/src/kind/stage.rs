//! `stage`: writing target/kind/<scenario>/ with its URLs pointed at the cluster.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::run::{execute, shell_line};
use super::scenario::{inside_scenarios, kargo_source, read_scenario};
use super::{SAMPLE_CHARTS, SAMPLE_REPO, SERVED_CHART_REPOSITORY, STAGED, URL_MAP, relative};

/// Runs one command of `stage`, failing unless it succeeds.
fn execute_ok(root: &Path, argv: Vec<String>) -> Result<()> {
    let (status, _) = execute(root, &argv, false)
        .with_context(|| format!("could not start {}", shell_line(&argv)))?;
    if !status.success() {
        bail!("{} ended with {status}", shell_line(&argv));
    }
    Ok(())
}

/// `text` with the scenarios' forge and chart repository URLs pointed at Gitea.
pub(super) fn rewrite(text: &str) -> String {
    URL_MAP
        .iter()
        .fold(text.to_string(), |text, (from, to)| text.replace(from, to))
}

/// The `name@version` entries of every `unpublished:` list of a scenario.yaml, block or flow
/// style (the charts that are not served until the scenario's timeline publishes them).
pub(super) fn unpublished(scenario_yaml: &str) -> Vec<String> {
    let clean = |item: &str| {
        let item = item.split(" #").next().unwrap_or("").trim();
        item.trim_matches(['"', '\'']).to_string()
    };
    let mut found = Vec::new();
    let mut lines = scenario_yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix("unpublished:") else {
            continue;
        };
        let rest = rest.split(" #").next().unwrap_or("").trim();
        if let Some(flow) = rest.strip_prefix('[') {
            let flow = flow.trim_end().trim_end_matches(']');
            found.extend(flow.split(',').map(clean).filter(|s| !s.is_empty()));
            continue;
        }
        let indent = line.len() - trimmed.len();
        while let Some(&next) = lines.peek() {
            let item = next.trim_start();
            if item.is_empty() || item.starts_with('#') {
                lines.next();
                continue;
            }
            // A block sequence may sit at the key's own indentation.
            match item.strip_prefix("- ") {
                Some(entry) if next.len() - item.len() >= indent => {
                    found.push(clean(entry));
                    lines.next();
                }
                _ => break,
            }
        }
    }
    found
}

/// The charts of the mirror's served repository: (name, version, folder), sorted.
fn mirror_charts(mirror: &Path) -> Result<Vec<(String, String, PathBuf)>> {
    let repository = mirror.join(SERVED_CHART_REPOSITORY);
    let sorted_dirs = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut dirs = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        Ok(dirs)
    };
    let mut charts = Vec::new();
    for chart in sorted_dirs(&repository)? {
        for version in sorted_dirs(&chart)? {
            if version.join("Chart.yaml").is_file() {
                let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
                charts.push((
                    name(&chart).unwrap_or_default(),
                    name(&version).unwrap_or_default(),
                    version,
                ));
            }
        }
    }
    Ok(charts)
}

/// Copies a folder, rewriting every UTF-8 file with [`rewrite`]; `.git` is left out.
fn copy_rewritten(from: &Path, to: &Path) -> Result<()> {
    copy_tree(from, to, true)
}

/// Copies a folder as it is; `.git` is left out.
fn copy_plain(from: &Path, to: &Path) -> Result<()> {
    copy_tree(from, to, false)
}

fn copy_tree(from: &Path, to: &Path, rewriting: bool) -> Result<()> {
    std::fs::create_dir_all(to)?;
    let mut entries = std::fs::read_dir(from)
        .with_context(|| format!("reading {}", from.display()))?
        .collect::<std::io::Result<Vec<_>>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name() == ".git" {
            continue;
        }
        let source = entry.path();
        let target = to.join(entry.file_name());
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            copy_tree(&source, &target, rewriting)?;
        } else if file_type.is_file() {
            match String::from_utf8(std::fs::read(&source)?) {
                Ok(text) if rewriting => std::fs::write(&target, rewrite(&text))?,
                Ok(text) => std::fs::write(&target, text)?,
                Err(raw) => std::fs::write(&target, raw.into_bytes())?,
            }
        } else {
            bail!(
                "{}: neither a file nor a folder (symbolic links are not staged)",
                source.display()
            );
        }
    }
    Ok(())
}

/// `cargo xtask kind stage`: writes target/kind/<scenario>/ from scratch. Local files only;
/// nothing leaves the machine.
///
/// - `repo/`: the sample repository, URLs rewritten, committed on `main` (pushed to
///   platform/gitops);
/// - `charts/`: every chart of the mirror's `charts.example.test/stable` that the scenario does
///   not hold back as `unpublished`, packaged with `helm package`, with the `index.yaml` of
///   `helm repo index`, committed on `main` (pushed to platform/charts);
/// - `pipelines.yaml` (the scenario's charts/kargo-pipelines values) or `kargo.yaml` (its
///   hand-written Warehouses and Stages), URLs rewritten.
pub fn stage(root: &Path, scenario: &str) -> Result<()> {
    let scenario_dir = root.join("scenarios").join(scenario);
    let scenario_yaml = std::fs::read_to_string(scenario_dir.join("scenario.yaml"))
        .with_context(|| format!("no scenario {scenario} in {}", scenario_dir.display()))?;
    let yaml = read_scenario(root, scenario)?;
    let source = kargo_source(&yaml, scenario)?;
    let out = root.join(STAGED).join(scenario);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let kargo_path = scenario_dir.join(source.file());
    let kargo = std::fs::read_to_string(&kargo_path)
        .with_context(|| format!("reading {}", kargo_path.display()))?;
    let (repo, mirror) = lay_out(root, scenario, &yaml, &out)?;
    let pinned = pause_workloads(&repo, &mirror)?;
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join(source.staged_name()), rewrite(&kargo))?;

    let held_back = unpublished(&scenario_yaml);
    let charts = out.join("charts");
    std::fs::create_dir_all(&charts)?;
    let charts_arg = charts.display().to_string();
    let mut published = Vec::new();
    for (name, version, dir) in mirror_charts(&mirror)? {
        let id = format!("{name}@{version}");
        if held_back.contains(&id) {
            continue;
        }
        execute_ok(
            root,
            argv![
                "helm",
                "package",
                dir.display().to_string(),
                "--destination",
                &charts_arg
            ],
        )?;
        published.push(id);
    }
    execute_ok(root, argv!["helm", "repo", "index", &charts_arg])?;

    for (dir, message) in [
        (&repo, format!("{scenario}: the sample repository")),
        (&charts, format!("{scenario}: {}", published.join(", "))),
    ] {
        let dir = dir.display().to_string();
        let git = |args: Vec<String>| {
            let mut argv = argv!["git", "-C", &dir];
            argv.extend(args);
            argv
        };
        execute_ok(
            root,
            git(argv!["init", "--quiet", "--initial-branch", "main"]),
        )?;
        execute_ok(root, git(argv!["add", "--all"]))?;
        execute_ok(
            root,
            git(argv![
                "-c",
                "user.name=gitops-loop",
                "-c",
                "user.email=kind@example.test",
                "commit",
                "--quiet",
                "--message",
                message
            ]),
        )?;
    }
    println!(
        "kind stage: {} (published: {}; held back: {}; pods run the pause image: {})",
        relative(root, &out),
        published.join(", "),
        if held_back.is_empty() {
            "none".to_string()
        } else {
            held_back.join(", ")
        },
        if pinned.is_empty() {
            "none".to_string()
        } else {
            pinned.join(", ")
        }
    );
    Ok(())
}

/// Writes `out/repo` (the scenario's repository content with its overlay laid over, URLs
/// rewritten) and `out/mirror` (its chart mirror with its overlay), as the ground lays them
/// out. Returns both folders.
pub(super) fn lay_out(
    root: &Path,
    scenario: &str,
    yaml: &serde_json::Value,
    out: &Path,
) -> Result<(PathBuf, PathBuf)> {
    let scenario_dir = root.join("scenarios").join(scenario);
    let folder = |pointer: &str, default: Option<&str>| -> Result<Option<PathBuf>> {
        match yaml.pointer(pointer) {
            None | Some(serde_json::Value::Null) => Ok(default.map(|d| root.join(d))),
            Some(serde_json::Value::String(path)) if inside_scenarios(path) => {
                Ok(Some(scenario_dir.join(path)))
            }
            Some(other) => bail!(
                "scenarios/{scenario}/scenario.yaml: {pointer} must name a folder under scenarios/, relative to the scenario, not {other}"
            ),
        }
    };
    let content = folder("/repository/content", Some(SAMPLE_REPO))?.context("content")?;
    let mirror = folder("/charts/mirror", Some(SAMPLE_CHARTS))?.context("mirror")?;
    // The mirror is staged whole: `play` publishes its held-back versions from there.
    let staged_mirror = out.join("mirror");
    copy_plain(&mirror, &staged_mirror)?;
    if let Some(overlay) = folder("/charts/overlay", None)? {
        copy_plain(&overlay, &staged_mirror)?;
    }
    let repo = out.join("repo");
    copy_rewritten(&content, &repo)?;
    if let Some(overlay) = folder("/repository/overlay", None)? {
        copy_rewritten(&overlay, &repo)?;
    }
    Ok((repo, staged_mirror))
}

/// What `stage` appends to an addon's values/<addon>/base.yaml on kind.
pub(super) const PAUSE_VALUES: &str = "\n# kind (cargo xtask kind stage): the sample's charts are the shapes of real charts, not\n# their controllers; their pods run the pause image, so an Application's health says the\n# objects were applied and scheduled, not whether a controller ran against partial CRDs.\nimage:\n  repository: registry.k8s.io/pause\n  tag: \"3.10\"\n";

/// Points the pods of the sample's addon charts at the pause image, for every addon of
/// targets/addons.yaml whose chart takes `image.repository` (its values.yaml in the mirror has
/// it) and whose base values do not set `image` already. Returns the addons changed.
pub(super) fn pause_workloads(repo: &Path, mirror: &Path) -> Result<Vec<String>> {
    let targets = repo.join("targets/addons.yaml");
    let Ok(text) = std::fs::read_to_string(&targets) else {
        return Ok(Vec::new());
    };
    let entries: serde_json::Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("{}: not YAML", targets.display()))?;
    let mut changed = Vec::new();
    for entry in entries.as_array().into_iter().flatten() {
        let (Some(addon), Some(chart)) = (entry["addon"].as_str(), entry["chart"].as_str()) else {
            continue;
        };
        if !super::scenario::plain(addon, false) || !super::scenario::plain(chart, false) {
            continue;
        }
        let takes_image = mirror_charts(mirror)?.iter().any(|(name, _, dir)| {
            name == chart
                && std::fs::read_to_string(dir.join("values.yaml"))
                    .is_ok_and(|values| values.contains("\nimage:\n  repository:"))
        });
        let base = repo.join("values").join(addon).join("base.yaml");
        let existing = std::fs::read_to_string(&base).unwrap_or_default();
        if !takes_image || existing.lines().any(|line| line.starts_with("image:")) {
            continue;
        }
        std::fs::create_dir_all(base.parent().context("values folder")?)?;
        std::fs::write(&base, format!("{existing}{PAUSE_VALUES}"))?;
        changed.push(addon.to_string());
    }
    Ok(changed)
}
