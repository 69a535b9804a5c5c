//! The chart mirror: charts from Helm and OCI repositories, unpacked on disk, so that a render
//! never touches the network.
//!
//! Layout: `<charts>/<repo-key>/<chart>/<version>/Chart.yaml`, where `<repo-key>` is the
//! repoURL without its scheme and trailing `/` (`https://charts.example.test/stable` ->
//! `charts.example.test/stable`, `oci://registry.example.test/charts` or
//! `registry.example.test/charts` -> `registry.example.test/charts`).
//! `gate charts pull` fills it with helm's own `pull`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::tools::Tool;
use crate::git::Snapshot;

/// The mirror folder of a chart repository URL.
pub fn repo_key(repo_url: &str) -> String {
    let url = repo_url.trim().trim_end_matches('/');
    let url = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url);
    url.split('/')
        .filter(|s| !s.is_empty() && *s != "." && *s != "..")
        .collect::<Vec<_>>()
        .join("/")
}

/// A chart name as a folder of the mirror: `[A-Za-z0-9_][A-Za-z0-9._-]*`, never a path.
pub fn is_chart_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 253
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A chart version (SemVer, an optional leading `v`) as a folder of the mirror.
pub fn is_chart_version(version: &str) -> bool {
    let digits = version.strip_prefix('v').unwrap_or(version);
    digits.as_bytes().first().is_some_and(u8::is_ascii_digit)
        && version.len() <= 128
        && !version.contains("..")
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-'))
}

/// True when Argo CD would treat the repository as OCI: an `oci://` URL, or a URL without a
/// scheme (Argo CD's docs write OCI Helm repositories that way).
pub fn is_oci(repo_url: &str) -> bool {
    repo_url.starts_with("oci://") || !repo_url.contains("://")
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChartRef {
    pub repo_url: String,
    pub chart: String,
    pub version: String,
}

impl std::fmt::Display for ChartRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chart {} version {} from {}",
            self.chart, self.version, self.repo_url
        )
    }
}

/// Where a chart sits in the mirror (whether or not it is there).
pub fn chart_dir(mirror: &Path, chart: &ChartRef) -> PathBuf {
    mirror
        .join(repo_key(&chart.repo_url))
        .join(&chart.chart)
        .join(&chart.version)
}

/// Finds a chart in the mirror.
pub fn locate(mirror: Option<&Path>, chart: &ChartRef) -> Result<PathBuf, String> {
    let Some(mirror) = mirror else {
        return Err(format!(
            "{chart} is needed but no chart mirror was given (--charts DIR; fill it with `gate charts pull`)"
        ));
    };
    if !is_chart_name(&chart.chart) || !is_chart_version(&chart.version) {
        return Err(format!(
            "{chart}: not a chart name and version the mirror can hold"
        ));
    }
    let dir = chart_dir(mirror, chart);
    if dir.join("Chart.yaml").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "{chart} is not in the chart mirror (looked for {}); run `gate charts pull` to fetch it",
            dir.display()
        ))
    }
}

/// The bytes of a chart's directory in the mirror, rounded up to 64 KiB (0 when the mirror
/// lacks it, or has no chart by that name and version there): what rendering it costs,
/// roughly, for the shards' dealing ([`super::key_weight`]). Rounded, so that charts of
/// about one size weigh the same (and are dealt in turn); a mirror whose copy of a chart
/// differs in size deals otherwise only where the difference crosses a multiple of 64 KiB.
/// Only a name and version [`locate`] accepts are looked up, so nothing outside the mirror
/// is read.
pub fn mirrored_bytes(mirror: Option<&Path>, chart: &ChartRef) -> u64 {
    const UNIT: u64 = 64 << 10;
    locate(mirror, chart).map_or(0, |dir| {
        super::cache::dir_bytes(&dir)
            .div_ceil(UNIT)
            .saturating_mul(UNIT)
    })
}

/// A chart's default values (its values.yaml) from the mirror: `{}` when it has none; an
/// error for a chart not in the mirror, a values.yaml that is not a regular file under 8 MiB,
/// or YAML that does not parse.
pub fn default_values(
    mirror: Option<&Path>,
    chart: &ChartRef,
) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let dir = locate(mirror, chart)?;
    let path = dir.join("values.yaml");
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        // A chart without values.yaml has no defaults.
        Err(_) => return Ok(Value::Object(Default::default())),
    };
    if !meta.is_file() || meta.len() > 8 << 20 {
        return Err("values.yaml is not a regular file under 8 MiB".into());
    }
    let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
    let text = crate::yaml::utf8(&bytes, "values.yaml")?;
    crate::yaml::parse_document(text, "values.yaml")
        .map(|v| {
            if v.is_null() {
                Value::Object(Default::default())
            } else {
                v
            }
        })
        .map_err(|e| format!("values.yaml line {}: {}", e.line, e.message))
}

/// Which chart repositories a render may pull a missing chart from. A render is offline
/// (`Never`) unless asked; `gate charts pull` pulls what the user's repository names (`Any`);
/// Bosun pulls only from repositories on its allowlist (`Only`), so a pull request naming any
/// other repository gets a render error, not a fetch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ChartPulls {
    #[default]
    Never,
    Any,
    Only(BTreeSet<String>),
}

impl ChartPulls {
    pub fn enabled(&self) -> bool {
        !matches!(self, ChartPulls::Never)
    }

    /// Whether a chart of `repo_url` may be pulled; the refusal says why.
    pub fn check(&self, repo_url: &str) -> Result<(), String> {
        match self {
            ChartPulls::Never => Err("the render is offline".into()),
            ChartPulls::Any => Ok(()),
            ChartPulls::Only(allowed) if allowed.contains(&allowlist_key(repo_url)) => Ok(()),
            ChartPulls::Only(_) => Err(format!(
                "chart repository {repo_url} is not on the pull allowlist (charts.pullFrom, by default the repositories the default branch already names); nothing is fetched from a repository a pull request names"
            )),
        }
    }
}

/// A chart repository URL compared the way the allowlist compares it: lowercase, no trailing
/// `/`, and `oci://` dropped (Argo CD writes OCI repositories without a scheme); `https://`
/// and `http://` stay (allowing one does not allow the other).
pub fn allowlist_key(url: &str) -> String {
    let url = url.trim().to_ascii_lowercase();
    let url = url.strip_prefix("oci://").unwrap_or(&url);
    url.trim_end_matches('/').to_string()
}

/// Every `repoURL` value written anywhere in the repository's YAML (Applications, generator
/// lists, values files): the chart repositories the commit already names.
pub fn repositories_named(snapshot: &Snapshot) -> BTreeSet<String> {
    fn walk(value: &serde_json::Value, out: &mut BTreeSet<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    if key == "repoURL"
                        && let Some(url) = value.as_str()
                        && !url.contains("{{")
                    {
                        out.insert(allowlist_key(url));
                    }
                    walk(value, out);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for path in snapshot.manifest_files() {
        let Some(Ok(text)) = snapshot.read(path).map(std::str::from_utf8) else {
            continue;
        };
        if !text.contains("repoURL") {
            continue;
        }
        if let Ok(documents) = crate::yaml::parse_documents(text, path) {
            for document in &documents {
                walk(document, &mut out);
            }
        }
    }
    out
}

/// The largest chart a pull may unpack (a real chart with many CRDs is a few MiB).
pub const MAX_PULLED_CHART_BYTES: u64 = 100 << 20;

fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.file_type() {
            Ok(t) if t.is_dir() => total += tree_size(&entry.path()),
            Ok(t) if t.is_file() => total += entry.metadata().map(|m| m.len()).unwrap_or(0),
            _ => {}
        }
    }
    total
}

/// Pulls one chart into the mirror with `helm pull --untar`. A chart already present is kept.
/// Returns true when something was downloaded.
pub fn pull(
    helm: &Tool,
    mirror: &Path,
    chart: &ChartRef,
    repo_mirrors: &[(String, String)],
) -> Result<bool, String> {
    if !is_chart_name(&chart.chart) || !is_chart_version(&chart.version) {
        return Err(format!(
            "{chart}: not a chart name and version the mirror can hold"
        ));
    }
    let target = chart_dir(mirror, chart);
    if target.join("Chart.yaml").is_file() {
        return Ok(false);
    }
    let staging = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(ensure_dir(mirror)?)
        .map_err(|e| format!("{}: {e}", mirror.display()))?;
    let home = staging.path().join("helm-home");
    let mut call = helm.confined(&home).with_network().arg("pull");
    // A pull-through mirror serves the repository's charts from another URL; the mirror folder
    // still uses the URL the repository writes.
    let source = repo_mirrors
        .iter()
        .find(|(from, _)| from.trim_end_matches('/') == chart.repo_url.trim_end_matches('/'))
        .map(|(_, to)| to.clone())
        .unwrap_or_else(|| chart.repo_url.clone());
    if is_oci(&source) {
        let base = source.trim_start_matches("oci://").trim_end_matches('/');
        call = call.arg(format!("oci://{base}/{}", chart.chart));
    } else {
        call = call.arg(&chart.chart).arg("--repo").arg(&source);
    }
    call = call
        .arg("--version")
        .arg(&chart.version)
        .arg("--untar")
        .arg("--untardir")
        .arg(staging.path().join("out"));
    let output = helm
        .run(call)
        .map_err(|e| format!("helm pull of {chart}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "helm pull of {chart} failed: {}",
            first_error_line(&String::from_utf8_lossy(&output.stderr))
        ));
    }
    let unpacked = staging.path().join("out").join(&chart.chart);
    let size = tree_size(&staging.path().join("out"));
    if size > MAX_PULLED_CHART_BYTES {
        return Err(format!(
            "helm pull of {chart} unpacked {size} bytes, more than the limit of {MAX_PULLED_CHART_BYTES}; it is not kept"
        ));
    }
    if !unpacked.join("Chart.yaml").is_file() {
        return Err(format!(
            "helm pull of {chart} produced no {}/Chart.yaml",
            chart.chart
        ));
    }
    let parent = target.parent().ok_or("bad mirror path")?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    if let Err(e) = std::fs::rename(&unpacked, &target) {
        // Another render of the same run (a check renders both commits at once) may have
        // put the same version in place first: that one is as good.
        if !target.join("Chart.yaml").is_file() {
            return Err(format!("{}: {e}", target.display()));
        }
    }
    Ok(true)
}

fn ensure_dir(dir: &Path) -> Result<&Path, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// helm prints warnings, then `Error: ...` possibly followed by a list (schema errors): keep the
/// error and its list, on one line (`first: item; item`).
/// helm's schema errors list properties in map order (`additional properties 'b', 'a' not
/// allowed`), which changes from run to run; sorted, the same values give the same report.
fn sorted_names(item: &str) -> String {
    for (open, close) in [
        ("additional properties ", " not allowed"),
        ("missing properties ", ""),
    ] {
        if let Some(start) = item.find(open) {
            let rest = &item[start + open.len()..];
            let end = if close.is_empty() {
                rest.find(|c: char| {
                    c != '\'' && c != ',' && c != ' ' && !c.is_alphanumeric() && !"_-.".contains(c)
                })
                .unwrap_or(rest.len())
            } else {
                match rest.find(close) {
                    Some(end) => end,
                    None => continue,
                }
            };
            let names = &rest[..end];
            let mut parts: Vec<&str> = names.split(", ").collect();
            if parts.len() > 1
                && parts
                    .iter()
                    .all(|p| p.starts_with('\'') && p.ends_with('\''))
            {
                parts.sort_unstable();
                return format!(
                    "{}{}{}",
                    &item[..start + open.len()],
                    parts.join(", "),
                    &rest[end..]
                );
            }
        }
    }
    item.to_string()
}

pub fn first_error_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let Some(start) = lines.iter().position(|l| l.starts_with("Error:")) else {
        return lines.last().copied().unwrap_or("(no output)").to_string();
    };
    let mut out = lines[start].trim_start_matches("Error:").trim().to_string();
    for line in &lines[start + 1..] {
        if line.starts_with("Use --debug flag") {
            continue;
        }
        if let Some(item) = line.strip_prefix("- ") {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
            out.push_str(&sorted_names(item));
        } else {
            out.push(' ');
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_names_and_versions_are_never_paths() {
        for good in ["external-secrets", "cert_manager", "a.b-c", "x1"] {
            assert!(is_chart_name(good), "{good}");
        }
        for bad in ["", "/tmp/x", "../x", "a/b", ".", "..", "-x", "a b", "a\nb"] {
            assert!(!is_chart_name(bad), "{bad:?}");
        }
        for good in ["1.2.3", "v0.10.3", "2.0.0-rc.1+build.5"] {
            assert!(is_chart_version(good), "{good}");
        }
        for bad in ["", ".", "..", "1/../../x", "latest", "1.2.3/x", "1..2"] {
            assert!(!is_chart_version(bad), "{bad:?}");
        }
        let mirror = tempfile::tempdir().unwrap();
        let chart = ChartRef {
            repo_url: "https://charts.example.test".into(),
            chart: "/etc".into(),
            version: ".".into(),
        };
        assert!(locate(Some(mirror.path()), &chart).is_err());
    }

    #[test]
    fn pulls_follow_the_allowlist() {
        let only = ChartPulls::Only([allowlist_key("https://charts.example.test/stable")].into());
        assert_eq!(only.check("https://Charts.Example.test/stable/"), Ok(()));
        assert!(only.check("http://charts.example.test/stable").is_err());
        let oci = ChartPulls::Only([allowlist_key("registry.example.test/charts")].into());
        assert_eq!(oci.check("oci://registry.example.test/charts"), Ok(()));
        assert!(
            only.check("https://charts.evil.test/stable")
                .unwrap_err()
                .contains("not on the pull allowlist")
        );
        assert!(
            ChartPulls::Never
                .check("https://charts.example.test/stable")
                .is_err()
        );
        assert_eq!(ChartPulls::Any.check("https://charts.evil.test"), Ok(()));
    }

    #[test]
    fn repo_keys() {
        assert_eq!(
            repo_key("https://charts.example.test/stable/"),
            "charts.example.test/stable"
        );
        assert_eq!(
            repo_key("oci://registry.example.test/charts"),
            "registry.example.test/charts"
        );
        assert_eq!(
            repo_key("registry.example.test/charts"),
            "registry.example.test/charts"
        );
        assert_eq!(repo_key("https://x/../../etc"), "x/etc");
        assert!(is_oci("registry.example.test/charts"));
        assert!(!is_oci("https://charts.example.test"));
    }

    #[test]
    fn helm_schema_errors_name_properties_in_one_order() {
        let a = first_error_line(
            "Error: values don't meet the specifications of the schema(s) in the following chart(s):\nc:\n- at '/crds': additional properties 'keep', 'enabled' not allowed\n",
        );
        let b = first_error_line(
            "Error: values don't meet the specifications of the schema(s) in the following chart(s):\nc:\n- at '/crds': additional properties 'enabled', 'keep' not allowed\n",
        );
        assert_eq!(a, b);
        assert!(
            a.ends_with("additional properties 'enabled', 'keep' not allowed"),
            "{a}"
        );
        let m = first_error_line("Error: x:\n- at '': missing properties 'b', 'a'\n");
        assert!(m.ends_with("missing properties 'a', 'b'"), "{m}");
    }

    #[test]
    fn helm_schema_errors_stay_on_one_line() {
        let stderr = "walk.go:75: found symbolic link\nError: values don't meet the specifications of the schema(s) in the following chart(s):\nexternal-secrets:\n- at '/replicaCount': got string, want integer\n- at '': additional properties 'x' not allowed\n";
        assert_eq!(
            first_error_line(stderr),
            "values don't meet the specifications of the schema(s) in the following chart(s): external-secrets: at '/replicaCount': got string, want integer; at '': additional properties 'x' not allowed"
        );
    }
}
