//! `bosun`: reads the gate's verdict on pull requests and repairs what is provable, escalates
//! what has nothing to change, and hands the rest to a person. docs/bosun.md is the manual.
//!
//! Exit codes: 0 the triage ran (whatever path it took, a handoff included); 1 Bosun itself
//! could not work (configuration, forge, git, inventory); 2 the command line was wrong.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use gitops_loop::bosun::config::{Config, InventoryConfig};
use gitops_loop::bosun::server::Server;
use gitops_loop::bosun::triage::Bosun;
use gitops_loop::forge::{Forge, RepoSlug, github::GitHub};
use gitops_loop::render::tools;

#[derive(Parser)]
#[command(
    name = "bosun",
    version,
    about = "Repair what the gate proves, hand off the rest"
)]
struct Cli {
    /// The configuration file.
    #[arg(
        long,
        global = true,
        default_value = "bosun.yaml",
        env = "BOSUN_CONFIG"
    )]
    config: PathBuf,
    /// The helm binary (else $GATE_HELM, the project's target/tools, PATH).
    #[arg(long, global = true)]
    helm: Option<PathBuf>,
    /// The kubectl binary used for Kustomize (else $GATE_KUBECTL, target/tools, PATH).
    #[arg(long, global = true)]
    kubectl: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the intake (POST /intake), /healthz, /metrics and /jobs.
    Serve {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// Look for new head commits on tracked pull requests this often (seconds; 0: never).
        #[arg(long, default_value_t = 60)]
        poll: u64,
    },
    /// Triage one pull request now and print what happened.
    Triage {
        /// The pull request number.
        #[arg(long)]
        pr: u64,
        /// OWNER/NAME (default: the only repository in the configuration).
        #[arg(long)]
        repo: Option<RepoSlug>,
    },
}

async fn bosun(cli: &Cli, config: Config) -> Result<Bosun> {
    let token = std::env::var(&config.forge.token_env).unwrap_or_default();
    if token.is_empty() {
        anyhow::bail!("no forge token: set ${}", config.forge.token_env);
    }
    let forge = GitHub::new(&config.forge.api_url, &token)?;
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
        InventoryConfig::File(_) => None,
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
        .map(Arc::from);
    Ok(Bosun {
        model,
        config,
        forge: Arc::new(forge),
        token,
        me,
        helm,
        kubectl,
        kube,
        workdir,
    })
}

async fn run(cli: Cli) -> Result<()> {
    let config = Config::load(&cli.config)?;
    match &cli.command {
        Command::Serve { listen, poll } => {
            let secret = std::env::var(&config.webhook.secret_env).unwrap_or_default();
            if secret.is_empty() {
                anyhow::bail!(
                    "no webhook secret: set ${} (the intake refuses every delivery without one)",
                    config.webhook.secret_env
                );
            }
            let bosun = Arc::new(bosun(&cli, config).await?);
            let (server, router) = Server::start(bosun, secret.into_bytes())
                .context("cannot open Bosun's journal in its work folder")?;
            if *poll > 0 {
                let poller = server.clone();
                let every = Duration::from_secs(*poll);
                tokio::spawn(async move {
                    let mut ticker = tokio::time::interval(every);
                    loop {
                        ticker.tick().await;
                        poller.poll().await;
                    }
                });
            }
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            tracing::info!("bosun listening on {}", listener.local_addr()?);
            gitops_loop::bosun::server::serve(listener, router, gitops_loop::shutdown_signal())
                .await?;
            Ok(())
        }
        Command::Triage { pr, repo } => {
            let slug = match repo {
                Some(slug) => slug.clone(),
                None if config.repositories.len() == 1 => config.repositories[0].slug.clone(),
                None => anyhow::bail!(
                    "bosun.yaml lists {} repositories: pass --repo OWNER/NAME",
                    config.repositories.len()
                ),
            };
            let bosun = bosun(&cli, config).await?;
            let run = bosun.triage(&slug, *pr).await?;
            for line in &run.lines {
                println!("{line}");
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    gitops_loop::forge::github::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bosun: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bosun: {e:#}");
            ExitCode::FAILURE
        }
    }
}
