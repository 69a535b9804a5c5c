//! `ChartRepositoryDouble`: a classic Helm chart repository (index.yaml + packaged charts)
//! served over HTTP on loopback, built with the real helm (`helm package`, `helm repo index`).
//! It stands in for a public URL such as `https://charts.example.test/stable`: clients pull
//! from it through a mirror mapping (`gate charts pull --chart-repo-mirror`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::Value;

struct Shared {
    served: PathBuf,
}

pub struct ChartRepositoryDouble {
    /// The URL the GitOps repository writes (`https://charts.example.test/stable`).
    pub alias: String,
    addr: SocketAddr,
    /// Unpacked charts: `<source>/<chart>/<version>/Chart.yaml`.
    source: PathBuf,
    helm: PathBuf,
    published: Mutex<BTreeSet<(String, String)>>,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ChartRepositoryDouble {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve_file(State(shared): State<Arc<Shared>>, UrlPath(file): UrlPath<String>) -> Response {
    if file.contains('/') || file.contains("..") {
        return StatusCode::NOT_FOUND.into_response();
    }
    match std::fs::read(shared.served.join(&file)) {
        Ok(bytes) => {
            let content_type = if file.ends_with(".yaml") {
                "application/x-yaml"
            } else {
                "application/gzip"
            };
            ([("content-type", content_type)], bytes).into_response()
        }
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

impl ChartRepositoryDouble {
    /// Serves every chart version under `source` except `unpublished` (`name@version`).
    pub async fn start(
        alias: &str,
        source: &Path,
        helm: &Path,
        unpublished: &[String],
    ) -> Result<ChartRepositoryDouble> {
        let dir = tempfile::Builder::new()
            .prefix("ground-charts-")
            .tempdir()?;
        let served = dir.path().join("served");
        std::fs::create_dir_all(&served)?;
        let shared = Arc::new(Shared {
            served: served.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/{file}", get(serve_file))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let repository = ChartRepositoryDouble {
            alias: alias.trim_end_matches('/').to_string(),
            addr,
            source: source.to_path_buf(),
            helm: helm.to_path_buf(),
            published: Mutex::new(BTreeSet::new()),
            shared,
            _dir: dir,
            server,
        };
        for (chart, version) in repository.available()? {
            if !unpublished.contains(&format!("{chart}@{version}")) {
                repository.package(&chart, &version)?;
            }
        }
        repository.reindex()?;
        Ok(repository)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every chart version the source folder holds: (chart, version).
    pub fn available(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for chart in std::fs::read_dir(&self.source)
            .with_context(|| format!("{}", self.source.display()))?
            .flatten()
        {
            for version in std::fs::read_dir(chart.path())?.flatten() {
                if version.path().join("Chart.yaml").is_file() {
                    out.push((
                        chart.file_name().to_string_lossy().to_string(),
                        version.file_name().to_string_lossy().to_string(),
                    ));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn package(&self, chart: &str, version: &str) -> Result<()> {
        let dir = self.source.join(chart).join(version);
        if !dir.join("Chart.yaml").is_file() {
            bail!(
                "chart {chart} {version} is not in {}",
                self.source.display()
            );
        }
        let output = Command::new(&self.helm)
            .arg("package")
            .arg(&dir)
            .arg("--destination")
            .arg(&self.shared.served)
            .output()?;
        if !output.status.success() {
            bail!(
                "helm package {chart} {version}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((chart.to_string(), version.to_string()));
        Ok(())
    }

    fn reindex(&self) -> Result<()> {
        let output = Command::new(&self.helm)
            .args(["repo", "index"])
            .arg(&self.shared.served)
            .arg("--url")
            .arg(self.url())
            .output()?;
        if !output.status.success() {
            bail!(
                "helm repo index: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// A new version appears in the repository.
    pub fn publish(&self, chart: &str, version: &str) -> Result<()> {
        self.package(chart, version)?;
        self.reindex()
    }

    /// The versions of `chart` the index lists, as a client sees them.
    pub fn versions(&self, chart: &str) -> Vec<String> {
        let text =
            std::fs::read_to_string(self.shared.served.join("index.yaml")).unwrap_or_default();
        let index: Value =
            gitops_loop::yaml::parse_document(&text, "index.yaml").unwrap_or(Value::Null);
        index
            .pointer(&format!("/entries/{chart}"))
            .and_then(Value::as_array)
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(|e| e.get("version").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
}
