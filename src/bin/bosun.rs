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
use gitops_loop::forge::RepoSlug;
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
        .map(Arc::from);
    let notes = if config.release_notes.enabled {
        Some(Arc::new(
            gitops_loop::bosun::notes::Notes::new(config.release_notes.clone())
                .map_err(|e| anyhow::anyhow!("bosun.yaml: releaseNotes: {e}"))?,
        ))
    } else {
        None
    };
    Ok(Bosun {
        model,
        notes,
        config,
        forge,
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

/// `bosun repair`: the gate and the repair decision on a local checkout.
mod local {
    use std::path::Path;

    use anyhow::{Context, Result, bail};

    use gitops_loop::bosun::classify::{self, Path as Decision, Situation};
    use gitops_loop::bosun::config::{Config, InventoryConfig};
    use gitops_loop::bosun::{applier, repair};
    use gitops_loop::gate::{check, report};
    use gitops_loop::render::{self, RenderConfig, inventory::Inventory};

    pub struct Args<'a> {
        pub repo: &'a Path,
        pub head: &'a str,
        pub base: Option<&'a str>,
        pub inventory: Option<&'a Path>,
        pub repo_url: Option<&'a str>,
    }

    fn git(dir: &Path, args: &[&str]) -> Result<String> {
        let output = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .context("cannot run git")?;
        if !output.status.success() {
            bail!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// Removes the repair's worktree however the run ends (an error, a panic): the user's
    /// repository never keeps a stray worktree.
    struct Worktree<'a> {
        repo: &'a Path,
        tree: std::path::PathBuf,
    }

    impl Drop for Worktree<'_> {
        fn drop(&mut self) {
            let tree = self.tree.display().to_string();
            let _ = git(self.repo, &["worktree", "remove", "--force", &tree]);
            let _ = git(self.repo, &["worktree", "prune"]);
        }
    }

    /// Git in the repair's worktree: no hooks and no signing of the user's configuration run
    /// on content a pull request wrote, and pathspecs are literal.
    fn git_quiet(dir: &Path, args: &[&str]) -> Result<String> {
        let mut all = vec![
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "commit.gpgsign=false",
            "--literal-pathspecs",
        ];
        all.extend_from_slice(args);
        git(dir, &all)
    }

    fn plain(text: &str) -> String {
        text.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    }

    /// What the local repair does.
    enum Work {
        Swap(Vec<gitops_loop::gate::rules::DroppedServedVersion>),
        Migrate,
        Fix(Vec<gitops_loop::gate::rules::NotServed>),
    }

    pub async fn repair(cli: &super::Cli, config: &Config, args: Args<'_>) -> Result<i32> {
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
        // Offline: charts come from the mirror (`gate charts pull` fills it).
        let render_config = |dir: &Path| {
            gitops_loop::bosun::triage::render_config(
                config,
                &workdir,
                (&helm, kubectl.as_ref()),
                dir,
                &repo_url,
                inventory.clone(),
                Default::default(),
            )
        };
        let judge = |revision: &str| {
            let result = check::check(
                &render_config(args.repo),
                &check::Revisions {
                    base: args.base.map(str::to_string),
                    head: revision.to_string(),
                    target: None,
                },
            );
            // Bosun reads the verdict as it is published, never the in-memory result.
            let (markdown, _) = report::render(&result);
            (result, markdown)
        };
        let (result, markdown) = tokio::task::block_in_place(|| judge(args.head));
        let title = plain(&gitops_loop::gate::publish::title(&result));
        println!(
            "gate on {}: {title}",
            &result.verdict.head.get(..7).unwrap_or("")
        );
        let parsed = report::parse(&markdown).map_err(|e| anyhow::anyhow!("{e}"))?;
        let head = result.verdict.head.clone();
        let decision = classify::classify(&Situation {
            report: Some(&parsed),
            head_sha: &head,
            fork: false,
            attempts: 0,
            attempt_cap: config.attempt_cap,
        });
        let handoff = |handoff: &classify::Handoff, details: &[String]| {
            println!(
                "over to you: open {}. The choice: {}. What stopped a mechanical fix: {}.",
                plain(&handoff.open),
                plain(&handoff.choice),
                plain(&handoff.fact)
            );
            for line in details {
                println!("  - {}", plain(line));
            }
        };
        let decision_reasons = match &decision {
            Decision::WorthALook(reasons) => Some(reasons.clone()),
            _ => None,
        };
        let work = match decision {
            Decision::Green | Decision::WorthALook(_) => {
                match &decision_reasons {
                    Some(reasons) => {
                        println!("green, worth a look: {}", plain(&reasons.join("; ")))
                    }
                    None => println!("green: nothing to repair"),
                }
                // What the change does, from the report's summary block.
                if let Some(summary) = &parsed.summary {
                    for line in gitops_loop::bosun::explain::lines(summary, &parsed.verdict) {
                        println!("  - {}", plain(&line));
                    }
                }
                return Ok(0);
            }
            Decision::Wait(why) => {
                println!("no decision: {}", plain(&why));
                return Ok(2);
            }
            Decision::Escalate(why) => {
                println!("nothing in this repository to change: {}", plain(&why));
                return Ok(1);
            }
            Decision::Handoff(h) => {
                handoff(&h, &[]);
                return Ok(if result.verdict.outcome == report::Outcome::Undecided {
                    2
                } else {
                    1
                });
            }
            Decision::Swap(dropped) => Work::Swap(dropped),
            Decision::Migrate(_) => Work::Migrate,
            Decision::Fix(not_served) => Work::Fix(not_served),
        };
        // The repair is made in a worktree of its own: the user's working tree stays as it is.
        let scratch = tempfile::Builder::new()
            .prefix("bosun-repair-")
            .tempdir_in(&workdir)?;
        let tree = scratch.path().join("tree");
        git(
            args.repo,
            &[
                "-c",
                "core.hooksPath=/dev/null",
                "worktree",
                "add",
                "--quiet",
                "--detach",
                &tree.display().to_string(),
                &head,
            ],
        )?;
        let guard = Worktree {
            repo: args.repo,
            tree: tree.clone(),
        };
        let head_config = render_config(&tree);
        let (rewrites, mut message, lines, summary) = match work {
            Work::Swap(dropped) => {
                let outcome =
                    repair_in(config, &head_config, &head, &dropped, model.as_deref()).await?;
                let prepared = match outcome {
                    Ok(prepared) => prepared,
                    Err((h, details)) => {
                        handoff(&h, &details);
                        return Ok(1);
                    }
                };
                let message = format!(
                    "Move {} manifest{} off API versions the new chart stops serving\n\nBosun (local mode) rewrote apiVersion values as the gate asked{}.\n",
                    prepared.swapped,
                    if prepared.swapped == 1 { "" } else { "s" },
                    if prepared.reshaped.is_empty() {
                        ""
                    } else {
                        ", and reshaped documents through its harness"
                    }
                );
                let summary = format!("{} manifest(s)", prepared.swapped);
                (
                    prepared.rewrites,
                    message,
                    prepared
                        .reshaped
                        .iter()
                        .map(|l| format!("reshaped {l}"))
                        .collect::<Vec<_>>(),
                    summary,
                )
            }
            Work::Fix(not_served) => {
                let base = result.verdict.base.clone();
                let planned = tokio::task::block_in_place(|| {
                    gitops_loop::bosun::triage::fix_plan(
                        &head_config,
                        &head,
                        &base,
                        &not_served,
                        &markdown,
                    )
                });
                let (fix, rendering) = match planned {
                    Ok(planned) => planned,
                    Err((h, details)) => {
                        handoff(&h, &details);
                        return Ok(1);
                    }
                };
                let mut say = |line: String| println!("{}", plain(&line));
                let prepared = match gitops_loop::bosun::triage::fix_finish(
                    &fix,
                    &not_served,
                    model.as_deref(),
                    &mut say,
                )
                .await
                {
                    Ok(prepared) => prepared,
                    Err((h, details)) => {
                        handoff(&h, &details);
                        return Ok(1);
                    }
                };
                let policy =
                    gitops_loop::bosun::triage::fix_policy(config, &head_config, &rendering)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                if let Err(refusals) = applier::admit_rewrites(&tree, &policy, &prepared.rewrites) {
                    handoff(
                        &classify::applier_handoff(&refusals, "which key to set"),
                        &[],
                    );
                    return Ok(1);
                }
                let summary = format!("{} key(s)", prepared.edits.len());
                (
                    prepared.rewrites,
                    "Stop rendering objects where the cluster does not serve their kind\n\nBosun (local mode) set keys a model selected from its inventory of editable keys.\n".to_string(),
                    prepared
                        .edits
                        .iter()
                        .map(|e| format!("set {}", e.line()))
                        .collect::<Vec<_>>(),
                    summary,
                )
            }
            Work::Migrate => {
                let base = result.verdict.base.clone();
                let outcome = match tokio::task::block_in_place(|| {
                    gitops_loop::bosun::triage::migration_plan(&head_config, &head, &base)
                }) {
                    Ok(Some(migrations)) => {
                        let mut say = |line: String| println!("{}", plain(&line));
                        gitops_loop::bosun::triage::migration_finish(
                            &migrations,
                            &head_config,
                            model.as_deref(),
                            &mut say,
                        )
                        .await
                    }
                    Ok(None) => {
                        println!("no decision: the head renders for Bosun");
                        return Ok(2);
                    }
                    Err(refusal) => Err(refusal),
                };
                let prepared = match outcome {
                    Ok(prepared) => prepared,
                    Err((h, details)) => {
                        handoff(&h, &details);
                        return Ok(1);
                    }
                };
                let policy = applier::Policy::new(&config.deny, &config.allow, None)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                if let Err(refusals) = applier::admit_rewrites(&tree, &policy, &prepared.rewrites) {
                    handoff(
                        &classify::applier_handoff(&refusals, "which settings to migrate"),
                        &[],
                    );
                    return Ok(1);
                }
                let summary = format!("values in {} file(s)", prepared.rewrites.len());
                (
                    prepared.rewrites,
                    "Migrate values the new chart's values schema refuses\n\nBosun (local mode) applied its harness's accepted proposal key by key.\n".to_string(),
                    prepared
                        .lines
                        .iter()
                        .map(|l| format!("migrated {l}"))
                        .collect::<Vec<_>>(),
                    summary,
                )
            }
        };
        applier::write(&tree, &rewrites)?;
        let mut add = vec!["add", "--"];
        add.extend(rewrites.iter().map(|r| r.path.as_str()));
        git_quiet(&tree, &add)?;
        for line in &lines {
            message.push_str(&format!("- {}\n", plain(line)));
        }
        git_quiet(
            &tree,
            &[
                "-c",
                &format!("user.name={}", config.commit.name),
                "-c",
                &format!("user.email={}", config.commit.email),
                "commit",
                "--quiet",
                "--no-verify",
                "-m",
                &message,
            ],
        )?;
        let commit = git(&tree, &["rev-parse", "HEAD"])?;
        drop(guard);
        for line in &lines {
            println!("{}", plain(line));
        }
        // A branch of its own, never moved over something else: when the name is taken, the
        // commit's id is added; the ref is created only if it does not exist.
        let mut branch = format!("bosun/repair-{}", head.get(..12).unwrap_or(&head));
        if git(
            args.repo,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ],
        )
        .is_ok()
        {
            branch = format!("{branch}-{}", commit.get(..7).unwrap_or(""));
        }
        git(
            args.repo,
            &[
                "update-ref",
                &format!("refs/heads/{branch}"),
                &commit,
                "0000000000000000000000000000000000000000",
            ],
        )
        .with_context(|| format!("cannot create branch {branch} (it exists)"))?;
        println!(
            "repaired: {summary} in {} file(s), commit {} on branch {branch}",
            rewrites.len(),
            commit.get(..7).unwrap_or("")
        );
        // Judged by commit id (a tag of the same name would win over the branch).
        let (again, _) = tokio::task::block_in_place(|| judge(&commit));
        println!(
            "gate on {}: {}",
            commit.get(..7).unwrap_or(""),
            plain(&gitops_loop::gate::publish::title(&again))
        );
        Ok(match again.verdict.outcome {
            report::Outcome::Green => 0,
            report::Outcome::Blocked => 1,
            report::Outcome::Undecided => 2,
        })
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
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
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

    async fn repair_in(
        config: &Config,
        head_config: &RenderConfig,
        head: &str,
        dropped: &[gitops_loop::gate::rules::DroppedServedVersion],
        model: Option<&dyn gitops_loop::model::Model>,
    ) -> Result<Result<repair::Prepared, repair::Refusal>> {
        let planned =
            match tokio::task::block_in_place(|| repair::plan(config, head_config, head, dropped))
                .map_err(|e| anyhow::anyhow!("{e}"))?
            {
                Ok(planned) => planned,
                Err(refusal) => return Ok(Err(refusal)),
            };
        let needed = planned.calls_needed(model.is_some());
        let cap = config.model.max_calls_per_pull_request;
        if needed > cap {
            return Ok(Err(planned.cap_refusal(needed, 0, cap)));
        }
        Ok(repair::finish(planned, dropped, model, &mut |line| {
            println!("{}", plain(&line))
        })
        .await)
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
