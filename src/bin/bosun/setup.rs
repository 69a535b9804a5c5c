//! Bosun assembled from bosun.yaml: the forge token and login, tools, work folder, model.

use std::sync::Arc;

use anyhow::{Context, Result};

use gitops_loop::bosun::config::{Config, InventoryConfig};
use gitops_loop::bosun::runner::Bosun;
use gitops_loop::render::tools;

use super::Cli;

pub(super) async fn bosun(cli: &Cli, config: Config) -> Result<Bosun> {
    let token = std::env::var(&config.forge.token_env).unwrap_or_default();
    if token.is_empty() {
        anyhow::bail!("no forge token: set ${}", config.forge.token_env);
    }
    let forge = config.forge.kind.connect(&config.forge.api_url, &token)?;
    let me = match &config.forge.login {
        Some(login) => login.clone(),
        None => forge
            .current_user()
            .await
            .context("cannot ask the forge who the token is (or set forge.login)")?,
    };
    let limits = config.render.limits();
    let mut helm = tools::find_tool("helm", cli.helm.as_deref(), "GATE_HELM")?;
    helm.limits = limits;
    let kubectl = tools::find_tool("kubectl", cli.kubectl.as_deref(), "GATE_KUBECTL")
        .ok()
        .map(|mut k| {
            k.limits = limits;
            k
        });
    let kube = match config.inventory {
        InventoryConfig::Kubernetes { .. } => Some(
            kube::Client::try_default()
                .await
                .context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?,
        ),
        InventoryConfig::File(_) | InventoryConfig::Argocd { .. } => None,
    };
    let workdir = config
        .workdir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("bosun"));
    std::fs::create_dir_all(&workdir)
        .with_context(|| format!("cannot create {}", workdir.display()))?;
    // Checkouts and render trees hold pull-request content: their folders are Bosun's alone.
    // (Not the work folder itself: in a pod that is a volume's mount point, which Bosun does
    // not own.)
    {
        use std::os::unix::fs::PermissionsExt;
        let checkouts = workdir.join("checkouts");
        std::fs::create_dir_all(&checkouts)
            .with_context(|| format!("cannot create {}", checkouts.display()))?;
        std::fs::set_permissions(&checkouts, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict {}", checkouts.display()))?;
    }
    // Render trees and helm's scratch live in the work folder's `tmp`. Whatever a crashed
    // run left there is removed at start, unless another Bosun on this folder is triaging now
    // (it holds the triage lock).
    {
        use std::os::unix::fs::PermissionsExt;
        let tmp = workdir.join("tmp");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(workdir.join(".lock"))
            .with_context(|| format!("cannot open {}", workdir.join(".lock").display()))?;
        if lock.try_lock().is_ok() {
            if tmp.exists() {
                std::fs::remove_dir_all(&tmp)
                    .with_context(|| format!("cannot clear {}", tmp.display()))?;
            }
            let _ = lock.unlock();
        }
        std::fs::create_dir_all(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot restrict {}", tmp.display()))?;
        let _ = tempfile::env::override_temp_dir(&tmp);
    }
    let model = gitops_loop::model::from_config(&config.model)
        .map_err(|e| anyhow::anyhow!("{}: model: {e}", "bosun.yaml"))?
        .map(Arc::<dyn gitops_loop::model::Model>::from)
        .map(|model| {
            // A question asked once is not asked again by a retry or a restart.
            let dir = workdir.join("model-replies");
            gitops_loop::model::remembered::Remembered::new(model, dir.clone())
                .map(|kept| Arc::new(kept) as Arc<dyn gitops_loop::model::Model>)
                .with_context(|| format!("cannot create {}", dir.display()))
        })
        .transpose()?;
    let notes = if config.release_notes.enabled {
        Some(Arc::new(
            gitops_loop::bosun::notes::Notes::new(config.release_notes.clone())
                .map_err(|e| anyhow::anyhow!("bosun.yaml: releaseNotes: {e}"))?,
        ))
    } else {
        None
    };
    // GitLab's OAuth tokens are marked `oauth2:` for the API client; git takes the token itself
    // as the password (GitLab's user name for it is `oauth2`, written in gitUrl).
    let git_token = match config.forge.kind {
        gitops_loop::forge::ForgeKind::Gitlab => token
            .strip_prefix(gitops_loop::forge::gitlab::OAUTH_PREFIX)
            .unwrap_or(&token)
            .to_string(),
        _ => token,
    };
    let remote_cache =
        gitops_loop::bosun::runner::remote_cache(&config, |line| tracing::warn!("{line}"))
            .map_err(anyhow::Error::msg)?;
    Ok(Bosun {
        model,
        notes,
        remote_cache,
        config,
        forge,
        token: git_token,
        me,
        helm,
        kubectl,
        kube,
        workdir,
    })
}
