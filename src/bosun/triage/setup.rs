//! The render setup of a triage: render configuration, live inventory, chart pulls.

use super::*;

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
) -> Result<Option<Arc<crate::remote_cache::RemoteCache>>, String> {
    let Some(url) = &config.render.cache_url else {
        return Ok(None);
    };
    let trust =
        crate::remote_cache::Trust::from_keys(config.render.cache_public_key.as_deref(), None)
            .map_err(|e| format!("bosun.yaml: render.cacheUrl: {e}"))?;
    let max = config.render.limits().output_bytes as u64;
    crate::remote_cache::RemoteCache::open(url, trust, max, Arc::new(log))
        .map(|remote| Some(Arc::new(remote)))
        .map_err(|e| format!("bosun.yaml: render.cacheUrl: {e}"))
}

impl Bosun {
    async fn inventory(&self) -> Result<Inventory, TriageError> {
        match &self.config.inventory {
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
                let client = self.kube.clone().ok_or_else(|| {
                    TriageError::Inventory("no Kubernetes client configured".into())
                })?;
                Inventory::read_cluster_secrets(client, namespace)
                    .await
                    .map_err(|e| TriageError::Inventory(e.to_string()))
            }
        }
    }

    fn render_config(
        &self,
        checkout: &Path,
        url: &str,
        inventory: Inventory,
        chart_pulls: ChartPulls,
    ) -> RenderConfig {
        render_config(
            &self.config,
            &self.workdir,
            (&self.helm, self.kubectl.as_ref()),
            self.remote_cache.as_ref(),
            checkout,
            url,
            inventory,
            chart_pulls,
        )
    }

    /// The repository fetched and the render configuration with the live inventory.
    pub(super) async fn prepare(
        &self,
        slug: &RepoSlug,
        url: &str,
    ) -> Result<RenderConfig, TriageError> {
        let checkout = self.checkout(slug)?;
        let inventory = self.inventory().await?;
        let pulls = self.chart_pulls(slug, &checkout)?;
        Ok(self.render_config(&checkout, url, inventory, pulls))
    }

    /// The repositories a missing chart may be pulled from: `charts.pullFrom`, or every
    /// repository the default branch names.
    fn chart_pulls(&self, slug: &RepoSlug, checkout: &Path) -> Result<ChartPulls, TriageError> {
        if let Some(list) = &self.config.charts.pull_from {
            return Ok(ChartPulls::Only(
                list.iter().map(|u| charts::allowlist_key(u)).collect(),
            ));
        }
        let branch = self
            .config
            .repository(slug)
            .map(|r| r.default_branch.clone())
            .unwrap_or_else(|| "main".into());
        let snapshot = Snapshot::load(checkout, &format!("refs/remotes/origin/{branch}"))
            .map_err(|e| TriageError::Git(format!("the default branch {branch}: {e}")))?;
        Ok(ChartPulls::Only(charts::repositories_named(&snapshot)))
    }
}
