//! `bosun repair`: the gate and the repair decision on a local checkout, with no forge.

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

/// git on the user's repository or the repair's worktree through the product's one runner:
/// nothing the repository's configuration, hooks or attributes name runs, and no transport
/// (the repository may have been received as it is).
fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let output = gitops_loop::git::git(dir)
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

/// Git in the repair's worktree with literal pathspecs (a file named like pathspec magic is
/// only ever that file).
fn git_quiet(dir: &Path, args: &[&str]) -> Result<String> {
    let mut all = vec!["--literal-pathspecs"];
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
    // Checked out by a git process in the worktree itself: the configuration it reads (an
    // `includeIf "gitdir:…"` can match only the worktree) is the one whose drivers are
    // turned off.
    git(
        args.repo,
        &[
            "worktree",
            "add",
            "--quiet",
            "--no-checkout",
            "--detach",
            &tree.display().to_string(),
            &head,
        ],
    )?;
    let guard = Worktree {
        repo: args.repo,
        tree: tree.clone(),
    };
    git(&tree, &["reset", "--quiet", "--hard", &head])?;
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
                gitops_loop::plural(prepared.swapped),
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
                Ok((mut fix, rendering)) => {
                    fix.redaction = config.model.redaction();
                    (fix, rendering)
                }
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
            let policy = gitops_loop::bosun::triage::fix_policy(config, &head_config, &rendering)
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
                Ok(Some(mut migrations)) => {
                    for m in &mut migrations {
                        m.redaction = config.model.redaction();
                    }
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
    // A local run is one head of no pull request: both caps bound it, the smaller first.
    let (cap, per_head) =
        if config.model.max_calls_per_head <= config.model.max_calls_per_pull_request {
            (config.model.max_calls_per_head, true)
        } else {
            (config.model.max_calls_per_pull_request, false)
        };
    if needed > cap {
        let hit = repair::CapHit {
            made: 0,
            cap,
            per_head,
        };
        return Ok(Err(planned.cap_refusal(needed, &hit)));
    }
    Ok(repair::finish(planned, dropped, model, &mut |line| {
        println!("{}", plain(&line))
    })
    .await)
}
