//! The chart mirror: charts from Helm and OCI repositories, unpacked on disk, so that a render
//! never touches the network.
//!
//! Layout: `<charts>/<repo-key>/<chart>/<version>/Chart.yaml`, where `<repo-key>` is the
//! repoURL without its scheme and trailing `/` (`https://charts.example.test/stable` ->
//! `charts.example.test/stable`, `oci://registry.example.test/charts` or
//! `registry.example.test/charts` -> `registry.example.test/charts`).
//! `gate charts pull` fills it with helm's own `pull`.

use std::path::{Path, PathBuf};

use super::tools::Tool;

/// The mirror folder of a chart repository URL.
pub fn repo_key(repo_url: &str) -> String {
    let url = repo_url.trim().trim_end_matches('/');
    let url = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url);
    url.split('/')
        .filter(|s| !s.is_empty() && *s != "." && *s != "..")
        .collect::<Vec<_>>()
        .join("/")
}

/// True when Argo CD would treat the repository as OCI: an `oci://` URL, or a URL without a
/// scheme (Argo CD's docs write OCI Helm repositories that way).
pub fn is_oci(repo_url: &str) -> bool {
    repo_url.starts_with("oci://") || !repo_url.contains("://")
}

#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Pulls one chart into the mirror with `helm pull --untar`. A chart already present is kept.
/// Returns true when something was downloaded.
pub fn pull(
    helm: &Tool,
    mirror: &Path,
    chart: &ChartRef,
    repo_mirrors: &[(String, String)],
) -> Result<bool, String> {
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
    if !unpacked.join("Chart.yaml").is_file() {
        return Err(format!(
            "helm pull of {chart} produced no {}/Chart.yaml",
            chart.chart
        ));
    }
    let parent = target.parent().ok_or("bad mirror path")?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    std::fs::rename(&unpacked, &target).map_err(|e| format!("{}: {e}", target.display()))?;
    Ok(true)
}

fn ensure_dir(dir: &Path) -> Result<&Path, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// helm prints warnings, then `Error: ...` possibly followed by a list (schema errors): keep the
/// error and its list, on one line (`first: item; item`).
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
            out.push_str(item);
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
    fn helm_schema_errors_stay_on_one_line() {
        let stderr = "walk.go:75: found symbolic link\nError: values don't meet the specifications of the schema(s) in the following chart(s):\nexternal-secrets:\n- at '/replicaCount': got string, want integer\n- at '': additional properties 'x' not allowed\n";
        assert_eq!(
            first_error_line(stderr),
            "values don't meet the specifications of the schema(s) in the following chart(s): external-secrets: at '/replicaCount': got string, want integer; at '': additional properties 'x' not allowed"
        );
    }
}
