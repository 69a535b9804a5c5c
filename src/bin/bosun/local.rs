//! `bosun repair`: its arguments, the tools and the work folder it runs with, and its lines
//! printed; the gate and the repair on a local checkout are `bosun::local`.

use std::path::Path;

use anyhow::{Context, Result, bail};

use gitops_loop::bosun::config::{Config, InventoryConfig};
use gitops_loop::bosun::local::Local;
use gitops_loop::render::{self, inventory::Inventory};

pub struct Args<'a> {
    pub repo: &'a Path,
    pub head: &'a str,
    pub base: Option<&'a str>,
    pub inventory: Option<&'a Path>,
    pub repo_url: Option<&'a str>,
}

/// A line as the terminal gets it: no control character a chart or a model put there.
fn plain(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Which phase `bosun repair` is in, one line on stderr each (stdout is what it found).
fn phase(what: &str) {
    eprintln!("bosun: phase: {what}");
}

pub async fn repair(cli: &super::Cli, config: &Config, args: Args<'_>) -> Result<i32> {
    phase("reading the inventory, the tools and the model");
    let inventory_path = match (args.inventory, &config.inventory) {
        (Some(path), _) => path.to_path_buf(),
        (None, InventoryConfig::File(path)) => path.clone(),
        (None, InventoryConfig::Kubernetes { .. } | InventoryConfig::Argocd { .. }) => bail!(
            "bosun repair reads a file inventory: pass --inventory FILE (bosun.yaml reads a live one)"
        ),
    };
    let inventory = Inventory::parse(
        &std::fs::read_to_string(&inventory_path)
            .with_context(|| format!("cannot read {}", inventory_path.display()))?,
        &inventory_path.display().to_string(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let repo_url = match args.repo_url {
        Some(url) => url.to_string(),
        None if config.repositories.len() == 1 => config.repositories[0].url.clone(),
        None => bail!("bosun.yaml lists several repositories: pass --repo-url"),
    };
    let limits = config.render.limits();
    let mut helm = render::tools::find_tool("helm", cli.helm.as_deref(), "GATE_HELM")?;
    helm.limits = limits;
    let kubectl = render::tools::find_tool("kubectl", cli.kubectl.as_deref(), "GATE_KUBECTL")
        .ok()
        .map(|mut k| {
            k.limits = limits;
            k
        });
    let workdir = local_workdir(config)?;
    let model = gitops_loop::model::from_config(&config.model)
        .map_err(|e| anyhow::anyhow!("bosun.yaml: model: {e}"))?;
    let remote =
        gitops_loop::bosun::runner::remote_cache(config, |line| eprintln!("bosun: {line}"))
            .map_err(anyhow::Error::msg)?;
    // Offline: charts come from the mirror (`gate charts pull` fills it).
    let render_config = |dir: &Path| {
        gitops_loop::bosun::runner::render_config(
            config,
            &workdir,
            (&helm, kubectl.as_ref()),
            remote.as_ref(),
            dir,
            &repo_url,
            inventory.clone(),
            Default::default(),
        )
    };
    let local = Local {
        config,
        repo: args.repo,
        head: args.head,
        base: args.base,
        workdir: &workdir,
        render_config: &render_config,
        model: model.as_deref(),
    };
    phase(&format!(
        "judging {} with the gate (the merge base and the head rendered)",
        plain(args.head)
    ));
    let mut judged = false;
    local
        .run(&mut |line| {
            println!("{}", plain(&line));
            if !judged && line.starts_with("gate on ") {
                judged = true;
                phase("classifying the verdict; repairing when it says how (plan, model, admission, a commit on a branch)");
            } else if line.starts_with("repaired: ") {
                phase("judging the repair's commit with the gate");
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// `workdir` from bosun.yaml, else `$XDG_CACHE_HOME/bosun` or `~/.cache/bosun`: a folder
/// this user owns and nobody else can write (its render cache is trusted).
fn local_workdir(config: &Config) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = match &config.workdir {
        Some(dir) => dir.clone(),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache"))
            })
            .context("no work folder: set workdir in bosun.yaml (or HOME)")?
            .join("bosun"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let meta = std::fs::metadata(&dir)?;
    if meta.uid() != rustix::process::getuid().as_raw() {
        bail!(
            "{} belongs to another user; set workdir in bosun.yaml",
            dir.display()
        );
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot restrict {}", dir.display()))?;
    Ok(dir)
}
