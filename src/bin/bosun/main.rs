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

use gitops_loop::bosun::config::Config;
use gitops_loop::bosun::server::Server;

/// `bosun repair`: the gate and the repair decision on a local checkout.
mod local;
mod setup;

use self::setup::bosun;

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
    /// Run the gate and the same repair decision on a local checkout, with no forge: a repair
    /// is left as a commit on a new branch `bosun/repair-<head>` (the working tree is not
    /// touched), and the gate runs again on it. Exit 0 when the result is green, 1 when a
    /// person is needed, 2 when the gate could not decide, 3 on an error.
    Repair {
        /// The repository (a git checkout).
        #[arg(long)]
        repo: PathBuf,
        /// The commit to judge and repair.
        #[arg(long, default_value = "HEAD")]
        head: String,
        /// The commit to compare with, as given (default: the merge base of the head and the
        /// default branch).
        #[arg(long)]
        base: Option<String>,
        /// A cluster inventory file (default: bosun.yaml's `inventory.file`).
        #[arg(long)]
        inventory: Option<PathBuf>,
        /// The repository's URL as Applications write it (default: the only repository in
        /// bosun.yaml).
        #[arg(long)]
        repo_url: Option<String>,
    },
    /// Triage one pull request now and print what happened.
    Triage {
        /// The pull request number.
        #[arg(long)]
        pr: u64,
        /// OWNER/NAME, on GitLab the project's full path GROUP/[SUBGROUP/...]PROJECT
        /// (default: the only repository in the configuration).
        #[arg(long)]
        repo: Option<String>,
    },
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
            // GitLab's merge request webhook, beside Kargo's intake: only on GitLab.
            let gitlab_token =
                (config.forge.kind == gitops_loop::forge::ForgeKind::Gitlab).then(|| {
                    let token = std::env::var(&config.webhook.gitlab_token_env).unwrap_or_default();
                    if token.is_empty() {
                        tracing::warn!(
                            "no GitLab webhook token: ${} is unset, so {} refuses every delivery",
                            config.webhook.gitlab_token_env,
                            gitops_loop::bosun::server::gitlab::ROUTE
                        );
                    }
                    token.into_bytes()
                });
            let bosun = Arc::new(bosun(&cli, config).await?);
            let (server, router) = Server::start(bosun, secret.into_bytes(), gitlab_token)
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
            // A graceful stop is not a crash: the running triage's attempt is given back.
            server.stop();
            Ok(())
        }
        Command::Repair {
            repo,
            head,
            base,
            inventory,
            repo_url,
        } => {
            let code = local::repair(
                &cli,
                &config,
                local::Args {
                    repo,
                    head,
                    base: base.as_deref(),
                    inventory: inventory.as_deref(),
                    repo_url: repo_url.as_deref(),
                },
            )
            .await;
            match code {
                Ok(code) => std::process::exit(code),
                Err(e) => {
                    eprintln!("bosun: {e:#}");
                    // Distinct from 1 (a person is needed) and 2 (the gate could not decide).
                    std::process::exit(3);
                }
            }
        }
        Command::Triage { pr, repo } => {
            let slug = match repo {
                Some(text) => match config.named(text) {
                    Ok(Some(slug)) => slug,
                    Ok(None) => anyhow::bail!("--repo {text}: not a repository in bosun.yaml"),
                    Err(e) => anyhow::bail!("--repo: {e}"),
                },
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
