//! `bosun repair`'s runner: the gate and the repair on a local checkout, with no forge. The
//! verdict is read back from the report as it would be published, classified as the triage
//! classifies it, and a repair runs through the one executor (`repair::execute`) with a local
//! branch and worktree as its sink. What it says goes to `out`, one line each.

use std::path::{Path, PathBuf};

use super::applier::Rewrite;
use super::classify::{self, Handoff, Route, Situation};
use super::config::Config;
use super::repair::{
    self, CapHit, Executed, PlanError, Planning, Prepared, Refusal, Renders, Sink, Work,
};
use crate::gate::{check, report, verdict};
use crate::model::Model;
use crate::render::RenderConfig;

/// What `bosun repair` works on.
pub struct Local<'a> {
    pub config: &'a Config,
    /// The user's repository (never written but for the new branch).
    pub repo: &'a Path,
    pub head: &'a str,
    pub base: Option<&'a str>,
    /// Where the repair's worktree is made.
    pub workdir: &'a Path,
    /// How a checkout renders (offline: charts come from the mirror).
    pub render_config: &'a (dyn Fn(&Path) -> RenderConfig + Sync),
    pub model: Option<&'a dyn Model>,
}

/// Why `bosun repair` stopped: Bosun itself failed, not the change (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("cannot run git: {0}")]
    GitSpawn(std::io::Error),
    /// A git command failed: its arguments and what it said.
    #[error("git {args}: {stderr}")]
    Git { args: String, stderr: String },
    #[error("{0}")]
    GitOther(crate::git::GitError),
    /// The report as it would be published does not read back.
    #[error("{0}")]
    Report(report::ReportError),
    #[error("cannot make the repair's folder: {0}")]
    Scratch(std::io::Error),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("cannot write the repair: {0}")]
    Write(std::io::Error),
    #[error("cannot create branch {branch} (it exists): {error}")]
    Branch {
        branch: String,
        error: Box<LocalError>,
    },
}

/// git on the user's repository or the repair's worktree through the product's one runner:
/// nothing the repository's configuration, hooks or attributes name runs, no transport, and
/// pathspecs are literal.
fn git(dir: &Path, args: &[&str]) -> Result<String, LocalError> {
    crate::git::Git::local(dir)
        .literal_pathspecs()
        .args(args)
        .run_text()
        .map_err(|e| match e {
            crate::git::GitError::Spawn { source, .. } => LocalError::GitSpawn(source),
            crate::git::GitError::Command { stderr, .. } => LocalError::Git {
                args: args.join(" "),
                stderr,
            },
            other => LocalError::GitOther(other),
        })
}

fn short(sha: &str) -> &str {
    sha.get(..7).unwrap_or("")
}

/// The lines of a handoff as `bosun repair` says them.
fn handoff_lines(handoff: &Handoff, details: &[String]) -> Vec<String> {
    let mut lines = vec![format!(
        "over to you: open {}. The choice: {}. What stopped a mechanical fix: {}.",
        handoff.open, handoff.choice, handoff.fact
    )];
    lines.extend(details.iter().map(|line| format!("  - {line}")));
    lines
}

impl Local<'_> {
    /// The gate on `revision`, its report as it would be published, and its renders.
    fn judge(&self, revision: &str) -> (verdict::GateResult, String, Option<check::Kept>) {
        let (result, kept) = tokio::task::block_in_place(|| {
            check::check_keeping(
                &(self.render_config)(self.repo),
                &check::Revisions {
                    base: self.base.map(str::to_string),
                    head: revision.to_string(),
                    target: None,
                },
            )
        });
        // Bosun reads the verdict as it is published, never the in-memory result.
        let (markdown, _) = report::render(&result);
        (result, markdown, kept)
    }

    /// Judges the head, and repairs it when the verdict says how. Returns the exit code: 0
    /// green, 1 a person is needed, 2 no decision.
    pub async fn run(&self, out: &mut (dyn FnMut(String) + Send)) -> Result<i32, LocalError> {
        let (result, markdown, kept) = self.judge(self.head);
        out(format!(
            "gate on {}: {}",
            short(&result.verdict.head),
            crate::gate::publish::title(&result)
        ));
        let parsed = report::parse(&markdown).map_err(LocalError::Report)?;
        let head = result.verdict.head.clone();
        let decision = classify::classify(&Situation {
            report: Some(&parsed),
            head_sha: &head,
            fork: false,
            attempts: 0,
            attempt_cap: self.config.attempt_cap,
        });
        let work = match decision {
            Route::Green | Route::WorthALook(_) => {
                match &decision {
                    Route::WorthALook(reasons) => {
                        out(format!("green, worth a look: {}", reasons.join("; ")))
                    }
                    _ => out("green: nothing to repair".into()),
                }
                // What the change does, from the report's summary block.
                if let Some(summary) = &parsed.summary {
                    for line in super::explain::lines(summary, &parsed.verdict) {
                        out(format!("  - {line}"));
                    }
                }
                return Ok(0);
            }
            Route::Wait(why) => {
                out(format!("no decision: {why}"));
                return Ok(2);
            }
            Route::Escalate(why) => {
                out(format!("nothing in this repository to change: {why}"));
                return Ok(1);
            }
            Route::Handoff(h) => {
                handoff_lines(&h, &[]).into_iter().for_each(&mut *out);
                let undecided = result.verdict.outcome == verdict::Outcome::Undecided;
                return Ok(if undecided { 2 } else { 1 });
            }
            Route::Swap(dropped) => Work::Swap(dropped),
            Route::Migrate(_) => Work::Migrate,
            Route::Fix(not_served) => Work::Fix(not_served),
        };
        // The repair is made in a worktree of its own: the user's working tree stays as it is.
        let scratch = tempfile::Builder::new()
            .prefix("bosun-repair-")
            .tempdir_in(self.workdir)
            .map_err(LocalError::Scratch)?;
        let worktree = Worktree::add(self.repo, scratch.path().join("tree"), &head)?;
        let head_config = (self.render_config)(&worktree.tree);
        let base = if matches!(work, Work::Swap(_)) {
            String::new()
        } else {
            result.verdict.base.clone()
        };
        // The head is rendered once: the gate's render of it is the repair's.
        let renders = Renders::new(&head_config, &head, &base).kept(kept);
        let planned =
            tokio::task::block_in_place(|| repair::plan(&work, self.config, &renders, &markdown))?;
        let mut sink = LocalSink {
            config: self.config,
            repo: self.repo,
            worktree: Some(worktree),
            head: &head,
            branch: String::new(),
            out: &mut *out,
        };
        let repair = match planned {
            Planning::Ready(repair) => repair,
            Planning::Refused(refusal) => {
                sink.hand_off(refusal).await?;
                return Ok(1);
            }
            Planning::HeadRenders => {
                (sink.out)("no decision: the head renders for Bosun".into());
                return Ok(2);
            }
        };
        let commit = match repair::execute(repair.as_ref(), self.model, &mut sink).await? {
            Executed::HandedOff(_) => return Ok(1),
            Executed::Pushed(commit) => commit,
        };
        // Judged by commit id (a tag of the same name would win over the branch).
        let (again, _, _) = self.judge(&commit);
        out(format!(
            "gate on {}: {}",
            short(&commit),
            crate::gate::publish::title(&again)
        ));
        Ok(match again.verdict.outcome {
            verdict::Outcome::Green => 0,
            verdict::Outcome::Blocked => 1,
            verdict::Outcome::Undecided => 2,
        })
    }
}

/// The repair's worktree, removed however the run ends (an error, a panic): the user's
/// repository never keeps a stray worktree.
struct Worktree {
    repo: PathBuf,
    tree: PathBuf,
}

impl Worktree {
    /// A detached worktree of `repo` at `head`. Checked out by a git process in the worktree
    /// itself: the configuration it reads (an `includeIf "gitdir:…"` can match only the
    /// worktree) is the one whose drivers are turned off.
    fn add(repo: &Path, tree: PathBuf, head: &str) -> Result<Worktree, LocalError> {
        let path = tree.display().to_string();
        git(
            repo,
            &[
                "worktree",
                "add",
                "--quiet",
                "--no-checkout",
                "--detach",
                &path,
                head,
            ],
        )?;
        let worktree = Worktree {
            repo: repo.to_path_buf(),
            tree,
        };
        git(&worktree.tree, &["reset", "--quiet", "--hard", head])?;
        Ok(worktree)
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        let tree = self.tree.display().to_string();
        let _ = git(&self.repo, &["worktree", "remove", "--force", &tree]);
        let _ = git(&self.repo, &["worktree", "prune"]);
    }
}

/// A local branch as a repair's sink: the worktree, a commit as Bosun, a branch of its own.
struct LocalSink<'a> {
    config: &'a Config,
    /// The user's repository, where the branch is made.
    repo: &'a Path,
    /// None once the commit is made (the worktree is removed then).
    worktree: Option<Worktree>,
    head: &'a str,
    branch: String,
    out: &'a mut (dyn FnMut(String) + Send),
}

#[async_trait::async_trait]
impl Sink for LocalSink<'_> {
    type Error = LocalError;

    fn tree(&self) -> &Path {
        self.worktree
            .as_ref()
            .map_or(Path::new("/nonexistent"), |w| w.tree.as_path())
    }

    /// A local run is one head of no pull request: both caps bound it, the smaller first.
    async fn reserve(&mut self, needed: u32) -> Result<Result<(), CapHit>, LocalError> {
        let model = &self.config.model;
        let (cap, per_head) = if model.max_calls_per_head <= model.max_calls_per_pull_request {
            (model.max_calls_per_head, true)
        } else {
            (model.max_calls_per_pull_request, false)
        };
        Ok(if needed > cap {
            Err(CapHit {
                made: 0,
                cap,
                per_head,
            })
        } else {
            Ok(())
        })
    }

    fn say(&mut self, line: String) {
        (self.out)(line);
    }

    async fn hand_off(&mut self, (handoff, details): Refusal) -> Result<String, LocalError> {
        handoff_lines(&handoff, &details)
            .into_iter()
            .for_each(&mut *self.out);
        Ok(handoff.fact)
    }

    fn write_failed(&self, error: std::io::Error) -> LocalError {
        LocalError::Write(error)
    }

    async fn commit(&mut self, rewrites: &[Rewrite], message: &str) -> Result<String, LocalError> {
        let tree = self.tree().to_path_buf();
        let mut add = vec!["add", "--"];
        add.extend(rewrites.iter().map(|r| r.path.as_str()));
        git(&tree, &add)?;
        let identity = &self.config.commit;
        let args = identity.commit_args(message);
        git(&tree, &args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let commit = git(&tree, &["rev-parse", "HEAD"])?;
        self.worktree = None;
        Ok(commit)
    }

    /// A branch of its own, never moved over something else: when the name is taken, the
    /// commit's id is added; the ref is created only if it does not exist.
    async fn push(&mut self, commit: &str) -> Result<(), LocalError> {
        let repo = self.repo;
        let mut branch = format!("bosun/repair-{}", self.head.get(..12).unwrap_or(self.head));
        let taken = format!("refs/heads/{branch}");
        if git(repo, &["rev-parse", "--verify", "--quiet", &taken]).is_ok() {
            branch = format!("{branch}-{}", short(commit));
        }
        git(
            repo,
            &[
                "update-ref",
                &format!("refs/heads/{branch}"),
                commit,
                "0000000000000000000000000000000000000000",
            ],
        )
        .map_err(|error| LocalError::Branch {
            branch: branch.clone(),
            error: Box::new(error),
        })?;
        self.branch = branch;
        Ok(())
    }

    async fn comment(&mut self, prepared: &Prepared, commit: &str) -> Result<(), LocalError> {
        for line in &prepared.changes {
            (self.out)(line.clone());
        }
        (self.out)(format!(
            "repaired: {} in {} file(s), commit {} on branch {}",
            prepared.summary,
            prepared.rewrites.len(),
            short(commit),
            self.branch
        ));
        Ok(())
    }
}
