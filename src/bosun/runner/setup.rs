//! The render setup of a triage: render configuration, live inventory, chart pulls.

use std::path::Path;
use std::sync::Arc;

use super::TriageError;
use crate::bosun::config::{Config, ConfigError, InventoryConfig};
use crate::forge::RepoSlug;
use crate::git::Snapshot;
use crate::render::cache::RenderCache;
use crate::render::charts::{self, ChartPulls};
use crate::render::inventory::Inventory;
use crate::render::tools::Tool;
use crate::render::{self, RenderConfig};

/// How Bosun renders a checkout (a triage's or `bosun repair`'s): its chart mirror, render
/// cache (with the remote one behind it, when bosun.yaml names one) and limits from
/// bosun.yaml, the tools it found.
#[allow(clippy::too_many_arguments)]
pub fn render_config(
    config: &Config,
    workdir: &Path,
    (helm, kubectl): (&Tool, Option<&Tool>),
    remote: Option<&Arc<crate::remote_cache::RemoteCache>>,
    checkout: &Path,
    url: &str,
    inventory: Inventory,
    chart_pulls: ChartPulls,
) -> RenderConfig {
    let mut cache = RenderCache::at(workdir.join("render-cache"));
    if let Some(remote) = remote {
        cache = cache.with_second_level(remote.clone());
    }
    RenderConfig {
        repo_dir: checkout.to_path_buf(),
        repo_url: Some(url.to_string()),
        inventory,
        charts: Some(
            config
                .charts
                .dir
                .clone()
                .unwrap_or_else(|| workdir.join("charts")),
        ),
        git_mirrors: Vec::new(),
        helm: helm.clone(),
        kubectl: kubectl.cloned(),
        cache,
        max_depth: render::DEFAULT_MAX_DEPTH,
        jobs: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2),
        chart_pulls,
        chart_repo_mirrors: config
            .charts
            .mirrors
            .iter()
            .map(|m| (m.from.clone(), m.to.clone()))
            .collect(),
        kustomize_enable_helm: config.render.kustomize_enable_helm,
        parsed: Default::default(),
    }
}

/// The remote render cache bosun.yaml names (`render.cacheUrl`), read-only whatever the
/// environment holds: Bosun renders pull requests, so it never writes what other runs believe.
/// Its warnings go to `log`.
pub fn remote_cache(
    config: &Config,
    log: impl Fn(&str) + Send + Sync + 'static,
) -> Result<Option<Arc<crate::remote_cache::RemoteCache>>, ConfigError> {
    let Some(url) = &config.render.cache_url else {
        return Ok(None);
    };
    let trust =
        crate::remote_cache::Trust::from_keys(config.render.cache_public_key.as_deref(), None)
            .map_err(ConfigError::RemoteCache)?;
    let max = config.render.limits().output_bytes as u64;
    crate::remote_cache::RemoteCache::open(url, trust, max, Arc::new(log))
        .map(|remote| Some(Arc::new(remote)))
        .map_err(ConfigError::RemoteCache)
}

/// The cluster inventory `config` names: a file, Argo CD's API (its token from the environment
/// variable named), or Argo CD's cluster Secrets read through `kube`.
pub(super) async fn inventory(
    config: &InventoryConfig,
    kube: Option<&kube::Client>,
) -> Result<Inventory, TriageError> {
    match config {
        InventoryConfig::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                TriageError::Inventory(format!("cannot read {}: {e}", path.display()))
            })?;
            Inventory::parse(&text, &path.display().to_string())
                .map_err(|e| TriageError::Inventory(e.to_string()))
        }
        InventoryConfig::Argocd { server, token_env } => {
            let token = std::env::var(token_env).unwrap_or_default();
            if token.is_empty() {
                return Err(TriageError::Inventory(format!(
                    "inventory.argocd: no token: set ${token_env}"
                )));
            }
            Inventory::fetch_argocd(server, &token)
                .await
                .map_err(|e| TriageError::Inventory(e.to_string()))
        }
        InventoryConfig::Kubernetes { namespace } => {
            let client = kube
                .cloned()
                .ok_or_else(|| TriageError::Inventory("no Kubernetes client configured".into()))?;
            Inventory::read_cluster_secrets(client, namespace)
                .await
                .map_err(|e| TriageError::Inventory(e.to_string()))
        }
    }
}

/// The repositories a missing chart may be pulled from: `charts.pullFrom`, or every repository
/// the default branch names (read in `checkout`).
pub(super) fn chart_pulls(
    config: &Config,
    slug: &RepoSlug,
    checkout: &Path,
) -> Result<ChartPulls, TriageError> {
    if let Some(list) = &config.charts.pull_from {
        return Ok(ChartPulls::Only(
            list.iter().map(|u| charts::allowlist_key(u)).collect(),
        ));
    }
    let branch = config
        .repository(slug)
        .map(|r| r.default_branch.clone())
        .unwrap_or_else(|| "main".into());
    let snapshot = Snapshot::load(checkout, &format!("refs/remotes/origin/{branch}"))
        .map_err(|e| TriageError::Git(format!("the default branch {branch}: {e}")))?;
    Ok(ChartPulls::Only(charts::repositories_named(&snapshot)))
}
