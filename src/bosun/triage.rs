//! One triage of one pull request: run the gate (the same code path as `gate publish`), read
//! the verdict back from the published report only, classify, act, and repeat on the commit a
//! repair pushed until the gate has judged it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::applier;
use super::classify::{self, Handoff, Path as TriagePath, Situation};
use super::config::{Config, InventoryConfig};
use super::explain;
use super::mechanical;
use super::migration;
use super::repair;
use crate::forge::{CommitStatus, Forge, ForgeError, RepoSlug, StatusState, upsert_marked_comment};
use crate::gate::publish::{self, CHECK_NAME};
use crate::gate::report::{self, MARKER, ParsedReport};
use crate::gate::rules::DroppedServedVersion;
use crate::git::Snapshot;
use crate::render::cache::RenderCache;
use crate::render::charts::{self, ChartPulls};
use crate::render::inventory::Inventory;
use crate::render::tools::Tool;
use crate::render::{self, RenderConfig};

/// The marker of Bosun's own comment (one per pull request, updated in place).
pub const COMMENT_MARKER: &str = "<!-- bosun:triage v1 -->";
/// Bosun's own commit status. Never `failure`.
pub const STATUS_CONTEXT: &str = "bosun";

#[derive(Debug, thiserror::Error)]
pub enum TriageError {
    #[error("{0} is not a repository in bosun.yaml")]
    UnknownRepository(RepoSlug),
    #[error(transparent)]
    Forge(#[from] ForgeError),
    #[error("{0}")]
    Git(String),
    #[error("cluster inventory: {0}")]
    Inventory(String),
    #[error("gate: {0}")]
    Gate(String),
    #[error("cannot write the repair: {0}")]
    Write(String),
}

/// What one triage did, for logs, the intake's job list and the proving ground's transcript.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub repository: String,
    pub pull_request: u64,
    /// The head the triage started from.
    pub head: String,
    /// The path taken last: wait, green, worth-a-look, swap, escalate, handoff, closed.
    pub path: String,
    /// Commits Bosun pushed.
    pub pushed: Vec<String>,
    /// What happened, one line each.
    pub lines: Vec<String>,
    /// Seconds from reading the gate's verdict to the repair pushed (the last repair).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair_seconds: Option<f64>,
    /// The comment paragraph of a repair pushed in this run (kept when the gate re-runs).
    #[serde(skip)]
    pub repaired: Option<String>,
}

impl Run {
    fn say(&mut self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!(repository = %self.repository, pr = self.pull_request, "{line}");
        self.lines.push(line);
    }
}

pub struct Bosun {
    pub config: Config,
    pub forge: Arc<dyn Forge>,
    /// Bosun's forge token (for git over HTTPS).
    pub token: String,
    /// The login the token acts as.
    pub me: String,
    pub helm: Tool,
    pub kubectl: Option<Tool>,
    /// The Kubernetes client for the live inventory (None with a file inventory).
    pub kube: Option<kube::Client>,
    pub workdir: PathBuf,
    /// The model behind the harness (`model.provider: none`: None, the model paths hand off).
    pub model: Option<Arc<dyn crate::model::Model>>,
    /// The release-notes reader (`releaseNotes.enabled: false`: None), with its caches.
    pub notes: Option<Arc<super::notes::Notes>>,
}

/// How Bosun renders a checkout (a triage's or `bosun repair`'s): its chart mirror, render
/// cache and limits from bosun.yaml, the tools it found.
pub fn render_config(
    config: &Config,
    workdir: &Path,
    (helm, kubectl): (&Tool, Option<&Tool>),
    checkout: &Path,
    url: &str,
    inventory: Inventory,
    chart_pulls: ChartPulls,
) -> RenderConfig {
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
        cache: RenderCache::at(workdir.join("render-cache")),
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

/// The marker of Bosun's model-calls comment: a comment of its own (no other comment of
/// Bosun's ever replaces it), updated in place, holding one line per head of the pull request:
/// `<!-- bosun:model-calls HEAD N -->`. Written before the calls, so a restart, a re-delivery
/// or a poll of the same head counts them; a new head starts a new count.
const MODEL_CALLS_COMMENT: &str = "<!-- bosun:model-calls v1 -->";
const MODEL_CALLS_MARK: &str = "<!-- bosun:model-calls ";

/// Model calls already made for `head`, from Bosun's model-calls comment.
fn model_calls_made(comments: &[crate::forge::Comment], me: &str, head: &str) -> u32 {
    comments
        .iter()
        .filter(|c| c.author == me && c.body.starts_with(MODEL_CALLS_COMMENT))
        .flat_map(|c| {
            c.body
                .match_indices(MODEL_CALLS_MARK)
                .map(|(i, _)| &c.body[i + MODEL_CALLS_MARK.len()..])
        })
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            (words.next()? == head).then(|| words.next()?.parse::<u32>().ok())?
        })
        .max()
        .unwrap_or(0)
}

/// The model-calls comment with `head`'s count set to `n` (other heads' lines kept).
fn model_calls_body(
    comments: &[crate::forge::Comment],
    me: &str,
    head: &str,
    n: u32,
    cap: u32,
) -> String {
    let mut lines: Vec<String> = comments
        .iter()
        .filter(|c| c.author == me && c.body.starts_with(MODEL_CALLS_COMMENT))
        .flat_map(|c| c.body.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            l.starts_with(MODEL_CALLS_MARK) && !l.starts_with(&format!("{MODEL_CALLS_MARK}{head} "))
        })
        .collect();
    lines.push(format!("{MODEL_CALLS_MARK}{head} {n} -->"));
    format!(
        "{MODEL_CALLS_COMMENT}\nBosun's model calls on this pull request (at most {cap} per head, `model.maxCallsPerPullRequest`): {n} for `{}`.\n{}\n",
        short(head),
        lines.join("\n")
    )
}

fn git(dir: &Path, args: &[&str]) -> Result<String, TriageError> {
    git_as(dir, args, None)
}

/// The credential helper of one git process: it answers `get` with the user name and the token
/// from that process's environment, so the token is never in `.git/config`, a URL or a file,
/// and only for the forge's own protocol and host (not a redirect's or a submodule's). The
/// empty `credential.helper=` before it drops every helper a user or system configured (a
/// `store` helper would write the token to disk).
const CREDENTIAL_HELPER: &str = "credential.helper=!f() { test \"$1\" = get || exit 0; h=; p=; while IFS= read -r line; do case \"$line\" in host=*) h=\"${line#host=}\";; protocol=*) p=\"${line#protocol=}\";; esac; done; test \"$h\" = \"$BOSUN_GIT_HOST\" && test \"$p\" = \"$BOSUN_GIT_PROTOCOL\" || exit 0; echo \"username=$BOSUN_GIT_USERNAME\"; echo \"password=$BOSUN_GIT_TOKEN\"; }; f";

/// git with Bosun's token given through [`CREDENTIAL_HELPER`] when `credentials` is set.
fn git_as(
    dir: &Path,
    args: &[&str],
    credentials: Option<(&str, &str, &str)>,
) -> Result<String, TriageError> {
    let mut command = crate::git::git(dir);
    if let Some((url, username, token)) = credentials {
        let (protocol, rest) = url.split_once("://").unwrap_or(("", url));
        let host = rest.split('/').next().unwrap_or("");
        command
            .args(["-c", "credential.helper=", "-c", CREDENTIAL_HELPER])
            .env("BOSUN_GIT_HOST", host)
            .env("BOSUN_GIT_PROTOCOL", protocol)
            .env("BOSUN_GIT_USERNAME", username)
            .env("BOSUN_GIT_TOKEN", token)
            .env("GIT_TERMINAL_PROMPT", "0");
    }
    let output = command
        .args(args)
        // A file named like pathspec magic (`:(exclude)x`) is only ever that file.
        .env("GIT_LITERAL_PATHSPECS", "1")
        .output()
        .map_err(|e| TriageError::Git(format!("cannot run git: {e}")))?;
    if !output.status.success() {
        // Never echo a URL with a token in it.
        let args: Vec<&str> = args
            .iter()
            .map(|a| if a.contains('@') { "<url>" } else { a })
            .collect();
        return Err(TriageError::Git(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

impl Bosun {
    fn checkout_dir(&self, slug: &RepoSlug) -> PathBuf {
        self.workdir
            .join("checkouts")
            .join(&slug.owner)
            .join(&slug.name)
    }

    /// A clone of the repository, fetched up to date.
    fn checkout(&self, slug: &RepoSlug) -> Result<PathBuf, TriageError> {
        let dir = self.checkout_dir(slug);
        let remote = self.config.git_remote(slug);
        if !dir.join(".git").exists() {
            std::fs::create_dir_all(&dir).map_err(|e| TriageError::Git(e.to_string()))?;
            git(&dir, &["init", "--quiet"])?;
            git(&dir, &["remote", "add", "origin", &remote.url])?;
        } else {
            // Also rewrites a URL an older Bosun stored with the token in it.
            git(&dir, &["remote", "set-url", "origin", &remote.url])?;
        }
        self.git_remote_command(
            &dir,
            &[
                "fetch",
                "--quiet",
                "--prune",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
            ],
            slug,
        )?;
        Ok(dir)
    }

    /// A git command that talks to the forge: the token goes to that process only.
    fn git_remote_command(
        &self,
        dir: &Path,
        args: &[&str],
        slug: &RepoSlug,
    ) -> Result<String, TriageError> {
        let remote = self.config.git_remote(slug);
        let credentials = remote
            .username
            .as_deref()
            .filter(|_| !self.token.is_empty())
            .map(|user| (remote.url.as_str(), user, self.token.as_str()));
        git_as(dir, args, credentials).map_err(|e| self.scrub(e))
    }

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
            checkout,
            url,
            inventory,
            chart_pulls,
        )
    }

    async fn status(&self, slug: &RepoSlug, sha: &str, state: StatusState, description: &str) {
        let status = CommitStatus {
            context: STATUS_CONTEXT.into(),
            state,
            // GitHub caps a status description at 140 characters.
            description: description.chars().take(140).collect(),
            creator: String::new(),
        };
        if let Err(e) = self.forge.set_status(slug, sha, &status).await {
            tracing::warn!("cannot set the bosun status on {sha}: {e}");
        }
    }

    /// The gate's report for this pull request: the comment that starts with the marker and
    /// was written by the gate's identity. Anything else is ignored.
    async fn published_report(
        &self,
        slug: &RepoSlug,
        number: u64,
        published: Option<u64>,
    ) -> Result<Option<(ParsedReport, String, String)>, TriageError> {
        let author = self.config.gate_author(&self.me);
        let comments = self.forge.comments(slug, number).await?;
        let trusted = |c: &&crate::forge::Comment| c.author == author && c.body.starts_with(MARKER);
        // The comment the gate run just updated, when Bosun ran it; else the newest.
        let chosen = published
            .and_then(|id| comments.iter().filter(trusted).find(|c| c.id == id))
            .or_else(|| comments.iter().rfind(trusted));
        Ok(chosen.and_then(|c| {
            report::parse(&c.body)
                .ok()
                .map(|parsed| (parsed, report::digest(&c.body), c.body.clone()))
        }))
    }

    /// An error with Bosun's token taken out (git echoes URLs, forges echo requests).
    fn scrub(&self, error: TriageError) -> TriageError {
        let text = error.to_string();
        if !self.token.is_empty() && text.contains(&self.token) {
            TriageError::Git(text.replace(&self.token, "***"))
        } else {
            error
        }
    }

    /// The `addons-gate` check (run or status) on a commit, if the gate published one. When
    /// another identity runs the gate (`forge.gateAuthor`, often a CI bot other workflows share),
    /// the check must be that identity's and carry the digest of the report comment read:
    /// a comment posted alone under the shared identity is not the gate's verdict.
    async fn check_published(
        &self,
        slug: &RepoSlug,
        sha: &str,
        report_digest: Option<&str>,
        report_green: bool,
    ) -> Result<bool, TriageError> {
        let author = self.config.gate_author(&self.me);
        let shared = author != self.me;
        let app = author.trim_end_matches("[bot]");
        let runs = self.forge.check_runs(slug, sha).await?;
        // Under a shared identity the check must also agree with the report it names.
        let run_ok = |r: &crate::forge::CheckRun| {
            r.name == CHECK_NAME
                && (!shared
                    || (r.app.trim_end_matches("[bot]") == app
                        && (r.conclusion == crate::forge::Conclusion::Success) == report_green
                        && report_digest.is_some_and(|d| {
                            r.external_id == format!("{}{d}", publish::REPORT_REFERENCE)
                        })))
        };
        if runs.iter().any(run_ok) {
            return Ok(true);
        }
        let statuses = self.forge.statuses(slug, sha).await?;
        Ok(statuses.iter().any(|s| {
            s.context == CHECK_NAME
                && (!shared
                    || (s.creator == author
                        && (s.state == StatusState::Success) == report_green
                        && report_digest.is_some_and(|d| {
                            s.description
                                .ends_with(&format!("{}{d}", publish::STATUS_REPORT_MARK))
                        })))
        }))
    }

    async fn comment(&self, slug: &RepoSlug, number: u64, body: &str) -> Result<(), TriageError> {
        // A forge refuses a comment past 65,536 characters: whatever a chart or a release
        // note made it, it is cut to fit (the gate's report has the whole of it).
        const LIMIT: usize = 60_000;
        let body = if body.chars().count() > LIMIT {
            let cut: String = body.chars().take(LIMIT).collect();
            let cut = cut
                .rsplit_once('\n')
                .map_or(cut.as_str(), |(head, _)| head)
                .to_string();
            format!(
                "{cut}\n\n(cut here: the comment would be too long; the gate's report has the rest)\n"
            )
        } else {
            body.to_string()
        };
        let body = format!("{COMMENT_MARKER}\n{body}");
        upsert_marked_comment(
            self.forge.as_ref(),
            slug,
            number,
            &self.me,
            COMMENT_MARKER,
            &body,
        )
        .await?;
        Ok(())
    }

    async fn label(&self, slug: &RepoSlug, number: u64, label: &str) -> Result<(), TriageError> {
        self.forge
            .add_labels(slug, number, &[label.to_string()])
            .await?;
        Ok(())
    }

    async fn hand_off(
        &self,
        slug: &RepoSlug,
        number: u64,
        handoff: &Handoff,
        details: &[String],
        run: &mut Run,
    ) -> Result<String, TriageError> {
        let body = classify::handoff_comment(handoff, details);
        self.comment(slug, number, &body).await?;
        self.label(slug, number, &self.config.labels.needs_human)
            .await?;
        run.say(format!(
            "handed off to a person (label {}): {}",
            self.config.labels.needs_human, handoff.fact
        ));
        for line in details {
            run.say(format!("  {line}"));
        }
        run.path = "handoff".into();
        Ok(format!("handed off: {}", handoff.fact))
    }

    /// Triage one pull request until the gate has judged its latest head.
    pub async fn triage(&self, slug: &RepoSlug, number: u64) -> Result<Run, TriageError> {
        let repository = self
            .config
            .repository(slug)
            .ok_or_else(|| TriageError::UnknownRepository(slug.clone()))?
            .clone();
        // One triage at a time per work folder, across processes (`bosun triage` beside a
        // running `bosun serve` shares its checkouts): an advisory lock, released on drop.
        let lock_path = self.workdir.join(".lock");
        let _lock = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)?;
            file.lock()?;
            Ok(file)
        })
        .await
        .map_err(|e| TriageError::Git(format!("cannot lock the work folder: {e}")))?
        .map_err(|e| TriageError::Git(format!("cannot lock the work folder: {e}")))?;
        let mut run = Run {
            repository: slug.to_string(),
            pull_request: number,
            ..Run::default()
        };
        let mut pr = self.forge.pull_request(slug, number).await?;
        run.head = pr.head_sha.clone();
        // The checkout and the live inventory, made once for every round of this triage.
        let mut prepared: Option<RenderConfig> = None;
        // Bounded: each round either ends or pushes one repair, and pushes are capped.
        for _ in 0..=self.config.attempt_cap + 1 {
            if pr.state != "open" || pr.merged {
                run.say(format!("#{number} is {}; nothing to do", pr.state));
                run.path = "closed".into();
                return Ok(run);
            }
            let head = pr.head_sha.clone();
            self.status(slug, &head, StatusState::Pending, "reading addons-gate")
                .await;
            let config = match prepared.take() {
                Some(config) => Ok(config),
                None => self.prepare(slug, &repository.url).await,
            };
            let outcome = match config {
                Ok(config) => {
                    let outcome = self.round(slug, &config, &mut pr, &mut run).await;
                    prepared = Some(config);
                    outcome
                }
                Err(e) => Err(e),
            };
            let description = match outcome {
                Ok(Some(description)) => description,
                Ok(None) => continue, // a repair was pushed: judge the new head
                Err(e) => {
                    let e = self.scrub(e);
                    // Never a failure: say what went wrong and leave the verdict to the gate.
                    self.status(slug, &head, StatusState::Success, &format!("stopped: {e}"))
                        .await;
                    return Err(e);
                }
            };
            self.status(slug, &pr.head_sha, StatusState::Success, &description)
                .await;
            return Ok(run);
        }
        run.say("stopped: too many rounds");
        self.status(
            slug,
            &pr.head_sha,
            StatusState::Success,
            "stopped: too many rounds; the gate's check decides",
        )
        .await;
        Ok(run)
    }

    /// The repository fetched and the render configuration with the live inventory.
    async fn prepare(&self, slug: &RepoSlug, url: &str) -> Result<RenderConfig, TriageError> {
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

    /// One round: gate, read, classify, act. `Ok(None)`: a repair was pushed (pr updated).
    async fn round(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut crate::forge::PullRequest,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let number = pr.number;
        let checkout = &config.repo_dir;
        // The gate runner: exactly what `gate publish` does. When another identity runs the
        // gate (forge.gateAuthor, e.g. a CI job), Bosun only reads that gate's report.
        let published = if self.config.gate_author(&self.me) == self.me {
            let (fresh, result, published) = publish::check_and_publish(
                self.forge.as_ref(),
                slug,
                number,
                &self.me,
                config,
                self.config.forge.check_mode(),
            )
            .await
            .map_err(|e| TriageError::Gate(e.to_string()))?;
            *pr = fresh;
            run.say(format!(
                "gate on {}: {}",
                short(&pr.head_sha),
                publish::title(&result)
            ));
            Some(published.comment_id)
        } else {
            None
        };
        // Triage reads the verdict only from what was published, and judges it against the
        // pull request as it is now (a person may have pushed meanwhile).
        let published_report = self.published_report(slug, number, published).await?;
        *pr = self.forge.pull_request(slug, number).await?;
        let checked = self
            .check_published(
                slug,
                &pr.head_sha,
                published_report.as_ref().map(|(_, d, _)| d.as_str()),
                published_report
                    .as_ref()
                    .is_some_and(|(r, _, _)| r.verdict.outcome == report::Outcome::Green),
            )
            .await?;
        let (report, body) = match published_report {
            Some((report, _, body)) => (Some(report), body),
            None => (None, String::new()),
        };
        let attempts = attempts_of(&pr.labels, &self.config.labels.attempt_prefix);
        let situation = Situation {
            report: report.as_ref().filter(|_| checked),
            head_sha: &pr.head_sha,
            fork: !pr.head_repo.eq_ignore_ascii_case(&slug.to_string()),
            attempts,
            attempt_cap: self.config.attempt_cap,
        };
        match classify::classify(&situation) {
            TriagePath::Wait(why) => {
                run.say(format!("waiting: {why}"));
                run.path = "wait".into();
                Ok(Some(format!("waiting: {why}")))
            }
            path @ (TriagePath::Green | TriagePath::WorthALook(_)) => {
                // The maintainers' release notes for the images the change moves; notes that
                // describe a manual step make a green gate worth a look.
                let (notes, mut manual, quoted) =
                    match report.as_ref().and_then(|r| r.summary.as_ref()) {
                        Some(summary) => self.release_notes(summary, run).await,
                        None => (String::new(), Vec::new(), Vec::new()),
                    };
                // With a model: a short summary, checked against the report and the notes.
                let short_summary = match report.as_ref() {
                    // Not after a repair: the repair's comment is what a person reads then.
                    Some(r)
                        if self.model.is_some() && r.summary.is_some() && run.pushed.is_empty() =>
                    {
                        self.model_summary(slug, number, &pr.head_sha, r, &quoted, run)
                            .await?
                    }
                    _ => None,
                };
                let notes = match short_summary {
                    Some((line, step)) => {
                        // The model judged the notes to describe a step: worth a look (it can
                        // only add the label, never block), beside the phrase rule.
                        if step && !quoted.is_empty() {
                            manual.push(
                                "a model reading the release notes found a step to take around the merge"
                                    .to_string(),
                            );
                        }
                        format!("{notes}\n{line}\n")
                    }
                    None => notes,
                };
                let path = match path {
                    TriagePath::WorthALook(mut reasons) => {
                        reasons.extend(manual);
                        TriagePath::WorthALook(reasons)
                    }
                    TriagePath::Green if !manual.is_empty() => TriagePath::WorthALook(manual),
                    other => other,
                };
                self.green(slug, number, pr, report.as_ref(), path, &notes, run)
                    .await
            }
            TriagePath::Escalate(line) => {
                self.comment(slug, number, &format!("{line}\n")).await?;
                self.label(slug, number, &self.config.labels.needs_human)
                    .await?;
                run.say(format!(
                    "escalated (label {}): no values to change in this repository",
                    self.config.labels.needs_human
                ));
                run.path = "escalate".into();
                Ok(Some(
                    "escalated: no values to change in this repository".into(),
                ))
            }
            TriagePath::Handoff(mut handoff) => {
                // A values schema refusal names keys: point at the files that set them.
                let places = refused_value_places(checkout, &pr.head_sha, &handoff.fact);
                if !places.is_empty() {
                    handoff.open = places.join(", ");
                }
                self.hand_off(slug, number, &handoff, &[], run)
                    .await
                    .map(Some)
            }
            TriagePath::Swap(dropped) => self.swap(slug, config, pr, &dropped, attempts, run).await,
            TriagePath::Fix(not_served) => {
                let base = report
                    .as_ref()
                    .map(|r| r.verdict.base.clone())
                    .unwrap_or_default();
                self.fix(slug, config, pr, &not_served, &base, &body, attempts, run)
                    .await
            }
            TriagePath::Migrate(_) => {
                let base = report
                    .as_ref()
                    .map(|r| r.verdict.base.clone())
                    .unwrap_or_default();
                self.migrate(slug, config, pr, &base, attempts, run).await
            }
        }
    }

    /// The release notes for the images a green change moves (at most 5 images, 5 releases
    /// each), as a comment section, and the manual steps they describe (worth-a-look
    /// reasons). Notes are hostile text: one escaped, clipped line each. Whatever cannot be
    /// read is said in one line; it never fails the triage.
    async fn release_notes(
        &self,
        summary: &crate::gate::report::Summary,
        run: &mut Run,
    ) -> (String, Vec<String>, Vec<(String, String, String)>) {
        let Some(notes) = &self.notes else {
            return (String::new(), Vec::new(), Vec::new());
        };
        let mut quoted: Vec<(String, String, String)> = Vec::new();
        let mut lines = Vec::new();
        let mut manual = Vec::new();
        let mut unread = Vec::new();
        // One deadline for every look-up of this triage, whatever the per-request ones add up
        // to; the same move of one source repository is read once.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen_moves = std::collections::BTreeSet::new();
        for image in summary.images.iter().take(5) {
            if image.image.contains(" → ") {
                unread.push(format!(
                    "{}: the repository changed, not one image's tags",
                    image.image
                ));
                continue;
            }
            let Ok(found) = tokio::time::timeout_at(
                deadline,
                notes.for_image(&image.image, &image.from, &image.to),
            )
            .await
            else {
                unread.push("the look-ups ran past their deadline".into());
                break;
            };
            if let Some(why) = found.unread {
                unread.push(why);
            }
            let move_key = (found.source.clone(), image.from.clone(), image.to.clone());
            if found.source.is_some() && !seen_moves.insert(move_key) {
                continue;
            }
            for (index, release) in found.releases.iter().enumerate() {
                // Every release in the range is read for a manual step; the first few shown.
                if let Some(phrase) = super::notes::manual_step(&release.body) {
                    // The image and the tag come from a chart and a source host: escaped.
                    manual.push(format!(
                        "the release notes of {} {} describe a manual step (\"{phrase}\")",
                        report::code(&image.image),
                        report::code(&release.tag)
                    ));
                }
                if index >= super::notes::MAX_RELEASES {
                    continue;
                }
                quoted.push((
                    image.image.clone(),
                    release.tag.clone(),
                    release.body.clone(),
                ));
                let first: String = release
                    .body
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(400)
                    .collect();
                // A mention in a note must not notify anyone: a zero-width space after `@`.
                let quiet = |t: &str| t.replace('@', "@\u{200b}");
                lines.push(format!(
                    "- {} {}{}: {}{}",
                    report::code(&image.image),
                    report::code(&release.tag),
                    if release.url.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", report::text(&quiet(&release.url)))
                    },
                    report::text(&quiet(&first)),
                    if release.body.chars().count() > 400 {
                        "…"
                    } else {
                        ""
                    }
                ));
            }
            if found.releases.len() > super::notes::MAX_RELEASES {
                lines.push(format!(
                    "- and {} earlier release{} in the range (read for manual steps, not shown)",
                    found.releases.len() - super::notes::MAX_RELEASES,
                    if found.releases.len() - super::notes::MAX_RELEASES == 1 {
                        ""
                    } else {
                        "s"
                    }
                ));
            }
        }
        if summary.images.len() > 5 {
            unread.push(format!(
                "{} more images (Bosun reads the first 5)",
                summary.images.len() - 5
            ));
        }
        manual.dedup();
        let unread: Vec<String> = unread
            .into_iter()
            .map(|u| {
                u.chars()
                    .take(200)
                    .collect::<String>()
                    .replace('@', "@\u{200b}")
            })
            .collect();
        let mut out = String::new();
        if !lines.is_empty() {
            out.push_str("\nRelease notes (the maintainers' own, for the image tags this change moves; quoted, not checked):\n\n");
            for line in &lines {
                out.push_str(line);
                out.push('\n');
            }
        }
        if !unread.is_empty() {
            let _ = writeln!(
                out,
                "\nRelease notes not read: {}.",
                unread
                    .iter()
                    .map(|u| report::text(u))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        run.say(format!(
            "release notes: {} release{} read{}",
            lines.len(),
            if lines.len() == 1 { "" } else { "s" },
            if unread.is_empty() {
                String::new()
            } else {
                format!(", {} not read", unread.len())
            }
        ));
        (out, manual, quoted)
    }

    /// One model call for a short summary of a green change, counted with the other calls of
    /// this head; the harness (`summary::check`) lets it through only when every version,
    /// image, key and kind it names is in the report or the notes. None otherwise (the
    /// deterministic explanation stands alone).
    async fn model_summary(
        &self,
        slug: &RepoSlug,
        number: u64,
        head: &str,
        report: &ParsedReport,
        quoted: &[(String, String, String)],
        run: &mut Run,
    ) -> Result<Option<(String, bool)>, TriageError> {
        let (Some(model), Some(summary)) = (self.model.as_deref(), report.summary.as_ref()) else {
            return Ok(None);
        };
        if self.reserve_calls(slug, number, head, 1).await?.is_err() {
            run.say("no model summary: the call cap for this head is used");
            return Ok(None);
        }
        let material = super::summary::material(summary, &report.verdict, quoted);
        let reply = model.call(&super::summary::request(&material)).await;
        match reply.map_err(|r| r.to_string()).and_then(|reply| {
            super::summary::check(&reply.value, &material)
                .map_err(|r| format!("rule {}: {}", r.rule, r.detail))
        }) {
            Ok((text, step)) => {
                run.say("model summary accepted");
                Ok(Some((
                    format!(
                        "In short (a model's summary; every version, image, key and kind it names was checked against the report and the notes): {}",
                        report::text(&text.replace('@', "@\u{200b}"))
                    ),
                    step,
                )))
            }
            Err(why) => {
                run.say(format!(
                    "model summary refused ({why}); the explanation stands alone"
                ));
                Ok(None)
            }
        }
    }

    /// The green paths: explained, worth a look, or green on a repair.
    #[allow(clippy::too_many_arguments)]
    async fn green(
        &self,
        slug: &RepoSlug,
        number: u64,
        pr: &crate::forge::PullRequest,
        report: Option<&ParsedReport>,
        path: TriagePath,
        notes: &str,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let explained = report
            .and_then(|r| r.summary.as_ref().map(|s| explain::section(s, &r.verdict)))
            .map(|e| format!("{e}{notes}"));
        match path {
            TriagePath::Green => {
                run.path = if run.pushed.is_empty() {
                    "green".into()
                } else {
                    "swap".into()
                };
                if run.pushed.is_empty() {
                    // A held pull request with a green gate: say what it does, so the person
                    // who merges reads it in one place.
                    if let Some(explained) = &explained {
                        self.comment(
                            slug,
                            number,
                            &format!("**The gate is green.** Nothing here needs a change; the merge is a person's.\n\n{explained}"),
                        )
                        .await?;
                        run.say("addons-gate is green; explained");
                        return Ok(Some("addons-gate is green; explained".into()));
                    }
                    run.say("addons-gate is green; nothing to do");
                    Ok(Some("addons-gate is green; nothing to do".into()))
                } else {
                    if let Some(repaired) = &run.repaired {
                        let body = format!(
                            "{repaired}\nThe gate re-ran on `{}` and is green.\n{}",
                            short(&pr.head_sha),
                            explained.map(|e| format!("\n{e}")).unwrap_or_default()
                        );
                        self.comment(slug, number, &body).await?;
                    }
                    run.say("addons-gate is green on the repair");
                    Ok(Some(format!(
                        "repaired in {}; addons-gate is green",
                        short(&pr.head_sha)
                    )))
                }
            }
            TriagePath::WorthALook(reasons) => {
                let mut body = String::new();
                if let Some(repaired) = &run.repaired {
                    let _ = writeln!(
                        body,
                        "{repaired}\nThe gate re-ran on `{}` and is green.\n",
                        short(&pr.head_sha)
                    );
                }
                let _ = writeln!(
                    body,
                    "**Worth a look before merging.** The gate is green, and the render shows that {}. Nothing blocks; the gate's report has the details.",
                    reasons.join(", and ")
                );
                if let Some(explained) = &explained {
                    let _ = write!(body, "\n{explained}");
                }
                self.comment(slug, number, &body).await?;
                self.label(slug, number, &self.config.labels.worth_a_look)
                    .await?;
                run.say(format!(
                    "worth a look (label {}): {}",
                    self.config.labels.worth_a_look,
                    reasons.join("; ")
                ));
                run.path = "worth-a-look".into();
                Ok(Some(format!("green; worth a look: {}", reasons.join("; "))))
            }
            _ => unreachable!("green() is called with a green path"),
        }
    }

    async fn swap(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut crate::forge::PullRequest,
        dropped: &[DroppedServedVersion],
        attempts: u32,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let checkout = config.repo_dir.as_path();
        let started = std::time::Instant::now();
        let number = pr.number;
        let head = pr.head_sha.clone();
        let default_branch = self
            .config
            .repository(slug)
            .map(|r| r.default_branch.clone())
            .unwrap_or_default();
        if pr.head_ref == default_branch || pr.head_ref == pr.base_ref {
            let handoff = Handoff {
                open: "the consumer files the gate's report lists".into(),
                choice: "move each manifest's apiVersion to the version the gate names".into(),
                fact: format!(
                    "the pull request's head branch is {}, and Bosun never pushes to the default or the base branch",
                    pr.head_ref
                ),
            };
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        git(
            checkout,
            &["checkout", "--quiet", "--force", "--detach", &head],
        )?;
        git(checkout, &["clean", "--quiet", "-fdx"])?;
        let mut head_config = config.clone();
        head_config.parsed = Default::default();
        let planned = match tokio::task::block_in_place(|| {
            repair::plan(&self.config, &head_config, &head, dropped)
        })
        .map_err(TriageError::Gate)?
        {
            Ok(planned) => planned,
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        // Model calls are counted per head before they are made, in a comment of Bosun's
        // own: a restart, a re-delivery or a poll of this head counts them.
        let needed = planned.calls_needed(self.model.is_some());
        if needed > 0
            && let Err((made, cap)) = self.reserve_calls(slug, number, &head, needed).await?
        {
            let (handoff, details) = planned.cap_refusal(needed, made, cap);
            return self
                .hand_off(slug, number, &handoff, &details, run)
                .await
                .map(Some);
        }
        let mut said = Vec::new();
        let finished = repair::finish(planned, dropped, self.model.as_deref(), &mut |line| {
            said.push(line)
        })
        .await;
        for line in said {
            run.say(line);
        }
        let prepared = match finished {
            Ok(prepared) => prepared,
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        let repair::Prepared {
            rewrites,
            swapped,
            reshaped,
        } = prepared;
        let files: Vec<&str> = rewrites.iter().map(|r| r.path.as_str()).collect();
        let mut message = if reshaped.is_empty() {
            format!(
                "Move {swapped} manifest{} off API versions the new chart stops serving\n\nBosun rewrote apiVersion values only, as the addons-gate report asked:\n",
                if swapped == 1 { "" } else { "s" }
            )
        } else {
            format!(
                "Move {swapped} manifest{} off API versions the new chart stops serving, reshaping {} for the new schema\n\nBosun rewrote apiVersion values as the addons-gate report asked, and re-serialised the reshaped documents from the structure its harness validated:\n",
                if swapped == 1 { "" } else { "s" },
                reshaped.len()
            )
        };
        for file in &files {
            let _ = writeln!(message, "- {file}");
        }
        let commit = self
            .commit_and_push(slug, checkout, pr, &head, &rewrites, &message, attempts)
            .await?;
        let attempt = format!("{}{}", self.config.labels.attempt_prefix, attempts + 1);
        run.repair_seconds = Some(started.elapsed().as_secs_f64());
        let mut body = format!(
            "**Repaired.** The gate found manifests declaring API versions the new chart stops serving. Bosun moved {swapped} of them to the versions the gate named (commit `{}`), {}:\n\n",
            short(&commit),
            if reshaped.is_empty() {
                "changing apiVersion values only"
            } else {
                "changing apiVersion values, and reshaping the documents listed below"
            }
        );
        for crd in dropped {
            let _ = writeln!(
                body,
                "- {} {} → {}: {}",
                report::code(&crd.kind),
                report::text(&crd.dropped.join(", ")),
                report::code(&format!("{}/{}", crd.group, crd.storage)),
                crd.consumers
                    .iter()
                    .map(|c| report::code(&c.path))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !reshaped.is_empty() {
            body.push_str("\nThe new schema has no place for some values as they were written, so these documents were reshaped (a model proposed each one; Bosun's harness checked that it keeps the object's identity, fits the new schema and carries no value the original or the schema did not supply, then wrote the YAML itself):\n\n");
            for line in &reshaped {
                let _ = writeln!(body, "- {line}");
            }
        }
        run.repaired = Some(body.clone());
        body.push_str("\nThe gate re-runs on the pushed commit and counts the consumers again.\n");
        self.comment(slug, number, &body).await?;
        run.say(format!(
            "swapped apiVersions in {} file{} ({swapped} manifests), pushed {} to {} (label {attempt})",
            files.len(),
            if files.len() == 1 { "" } else { "s" },
            short(&commit),
            pr.head_ref
        ));
        run.pushed.push(commit.clone());
        *pr = self.forge.pull_request(slug, number).await?;
        if pr.head_sha != commit {
            return Err(TriageError::Git(format!(
                "pushed {} but the pull request's head is {}",
                short(&commit),
                short(&pr.head_sha)
            )));
        }
        Ok(None)
    }

    /// The values migration: the head does not render because the new chart's values schema
    /// refuses values this repository sets. Plans it from the head's render failure, asks the
    /// model once per chart (counted like the reshape), and pushes only what the harness and
    /// the applier accept.
    async fn migrate(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut crate::forge::PullRequest,
        base: &str,
        attempts: u32,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let checkout = config.repo_dir.as_path();
        let started = std::time::Instant::now();
        let number = pr.number;
        let head = pr.head_sha.clone();
        if let Some(handoff) = self.protected_branch(slug, pr) {
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        git(
            checkout,
            &["checkout", "--quiet", "--force", "--detach", &head],
        )?;
        git(checkout, &["clean", "--quiet", "-fdx"])?;
        let mut head_config = config.clone();
        head_config.parsed = Default::default();
        let decided = tokio::task::block_in_place(|| migration_plan(&head_config, &head, base));
        let migrations = match decided {
            Ok(Some(migrations)) => migrations,
            Ok(None) => {
                run.say("the head renders for Bosun; nothing to migrate");
                run.path = "wait".into();
                return Ok(Some("the head renders; waiting for the gate".into()));
            }
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        // Calls are counted per head before they are made (as for the reshape).
        let needed = if self.model.is_some() {
            migrations.len() as u32
        } else {
            0
        };
        let precheck_refuses = migrations
            .iter()
            .any(|m| !migration::unsuppliable(m).is_empty());
        if needed > 0
            && !precheck_refuses
            && let Err((made, cap)) = self.reserve_calls(slug, number, &head, needed).await?
        {
            let handoff = Handoff {
                    open: migrations
                        .iter()
                        .map(migration::Migration::open)
                        .collect::<Vec<_>>()
                        .join(", "),
                    choice: "which settings to remove, rename or add so the new chart's values schema accepts them".into(),
                    fact: format!(
                        "a values migration needs {needed} model call{} for this head and {made} of the {cap} allowed (model.maxCallsPerPullRequest) are used; nothing was pushed",
                        if needed == 1 { "" } else { "s" }
                    ),
                };
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        let mut said = Vec::new();
        let finished = migration_finish(
            &migrations,
            &head_config,
            self.model.as_deref(),
            &mut |line| said.push(line),
        )
        .await;
        for line in said {
            run.say(line);
        }
        let prepared = match finished {
            Ok(prepared) => prepared,
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        let policy = applier::Policy::new(&self.config.deny, &self.config.allow, None)
            .map_err(TriageError::Gate)?;
        if let Err(refusals) = applier::admit_rewrites(checkout, &policy, &prepared.rewrites) {
            let handoff = classify::applier_handoff(
                &refusals,
                "which settings to remove, rename or add so the new chart's values schema accepts them",
            );
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        let charts: Vec<&str> = migrations.iter().map(|m| m.chart.as_str()).collect();
        let mut message = format!(
            "Migrate values for {}\n\nThe new chart's values.schema.json refuses settings this repository makes. A model proposed each values file; Bosun's harness checked it (declared values kept, every value from the original or the new chart, the schema validates, helm renders) and applied it key by key:\n",
            charts.join(", ")
        );
        for line in &prepared.lines {
            let _ = writeln!(message, "- {}", line.replace('`', ""));
        }
        let commit = self
            .commit_and_push(
                slug,
                checkout,
                pr,
                &head,
                &prepared.rewrites,
                &message,
                attempts,
            )
            .await?;
        let attempt = format!("{}{}", self.config.labels.attempt_prefix, attempts + 1);
        run.repair_seconds = Some(started.elapsed().as_secs_f64());
        let mut body = format!(
            "**Repaired.** The new chart refuses values this repository sets, so the head did not render. Bosun migrated the values (commit `{}`): a model proposed each file, and Bosun's harness checked that every value the new chart still declares is unchanged, every value comes from the original file or the new chart, the values validate against the new `values.schema.json` and helm renders the chart with them; then it applied the changes key by key, so every other line and comment stays:\n\n",
            short(&commit)
        );
        for line in &prepared.lines {
            let _ = writeln!(body, "- {line}");
        }
        run.repaired = Some(body.clone());
        body.push_str("\nThe gate re-runs on the pushed commit.\n");
        self.comment(slug, number, &body).await?;
        run.say(format!(
            "migrated values in {} file{}, pushed {} to {} (label {attempt})",
            prepared.rewrites.len(),
            if prepared.rewrites.len() == 1 {
                ""
            } else {
                "s"
            },
            short(&commit),
            pr.head_ref
        ));
        run.pushed.push(commit.clone());
        *pr = self.forge.pull_request(slug, number).await?;
        if pr.head_sha != commit {
            return Err(TriageError::Git(format!(
                "pushed {} but the pull request's head is {}",
                short(&commit),
                short(&pr.head_sha)
            )));
        }
        Ok(None)
    }

    /// The mechanical fix: the model selects scalar edits from Bosun's inventory of editable
    /// keys; the harness and the applier decide; the gate re-runs and judges.
    #[allow(clippy::too_many_arguments)]
    async fn fix(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut crate::forge::PullRequest,
        not_served: &[crate::gate::rules::NotServed],
        base: &str,
        report_body: &str,
        attempts: u32,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let checkout = config.repo_dir.as_path();
        let started = std::time::Instant::now();
        let number = pr.number;
        let head = pr.head_sha.clone();
        if let Some(handoff) = self.protected_branch(slug, pr) {
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        git(
            checkout,
            &["checkout", "--quiet", "--force", "--detach", &head],
        )?;
        git(checkout, &["clean", "--quiet", "-fdx"])?;
        let mut head_config = config.clone();
        head_config.parsed = Default::default();
        let planned = tokio::task::block_in_place(|| {
            fix_plan(&head_config, &head, base, not_served, report_body)
        });
        let (fix, rendering) = match planned {
            Ok(planned) => planned,
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        if self.model.is_some()
            && let Err((made, cap)) = self.reserve_calls(slug, number, &head, 1).await?
        {
            let handoff = Handoff {
                open: classify::not_served_handoff(not_served).open,
                choice: classify::not_served_handoff(not_served).choice,
                fact: format!(
                    "a scalar fix needs 1 model call for this head and {made} of the {cap} allowed (model.maxCallsPerPullRequest) are used; nothing was pushed"
                ),
            };
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        let mut said = Vec::new();
        let finished = fix_finish(&fix, not_served, self.model.as_deref(), &mut |line| {
            said.push(line)
        })
        .await;
        for line in said {
            run.say(line);
        }
        let prepared = match finished {
            Ok(prepared) => prepared,
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        let policy =
            fix_policy(&self.config, &head_config, &rendering).map_err(TriageError::Gate)?;
        if let Err(refusals) = applier::admit_rewrites(checkout, &policy, &prepared.rewrites) {
            let handoff = classify::applier_handoff(
                &refusals,
                &classify::not_served_handoff(not_served).choice,
            );
            return self
                .hand_off(slug, number, &handoff, &[], run)
                .await
                .map(Some);
        }
        let mut message = format!(
            "Stop rendering {} where the cluster does not serve it\n\nA model selected these edits from Bosun's inventory of editable keys; Bosun's harness and applier checked them:\n",
            not_served
                .iter()
                .map(|n| n
                    .kind
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(63)
                    .collect::<String>())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        );
        for edit in &prepared.edits {
            let _ = writeln!(message, "- {}", edit.line().replace('`', ""));
        }
        let commit = self
            .commit_and_push(
                slug,
                checkout,
                pr,
                &head,
                &prepared.rewrites,
                &message,
                attempts,
            )
            .await?;
        let attempt = format!("{}{}", self.config.labels.attempt_prefix, attempts + 1);
        run.repair_seconds = Some(started.elapsed().as_secs_f64());
        let mut body = format!(
            "**Repaired.** The gate found objects rendered on clusters that do not serve their kind. Bosun set {} (commit `{}`): a model selected {} from the keys Bosun lists as editable, and Bosun checked each is in that list, is a scalar whose text comes from the gate's report or the chart's defaults, and that the file still held the value Bosun saw:\n\n",
            if prepared.edits.len() == 1 {
                "one key"
            } else {
                "these keys"
            },
            short(&commit),
            if prepared.edits.len() == 1 {
                "it"
            } else {
                "them"
            },
        );
        for edit in &prepared.edits {
            let _ = writeln!(body, "- {}", edit.line());
        }
        run.repaired = Some(body.clone());
        body.push_str("\nThe gate re-runs on the pushed commit and judges the result.\n");
        self.comment(slug, number, &body).await?;
        run.say(format!(
            "set {} key{} in {} file{}, pushed {} to {} (label {attempt})",
            prepared.edits.len(),
            if prepared.edits.len() == 1 { "" } else { "s" },
            prepared.rewrites.len(),
            if prepared.rewrites.len() == 1 {
                ""
            } else {
                "s"
            },
            short(&commit),
            pr.head_ref
        ));
        run.pushed.push(commit.clone());
        *pr = self.forge.pull_request(slug, number).await?;
        if pr.head_sha != commit {
            return Err(TriageError::Git(format!(
                "pushed {} but the pull request's head is {}",
                short(&commit),
                short(&pr.head_sha)
            )));
        }
        Ok(None)
    }

    /// Counts `needed` model calls for this head before they are made, in Bosun's own
    /// comment (restart-safe): `Err((made, cap))` when the cap does not allow them.
    async fn reserve_calls(
        &self,
        slug: &RepoSlug,
        number: u64,
        head: &str,
        needed: u32,
    ) -> Result<Result<(), (u32, u32)>, TriageError> {
        let cap = self.config.model.max_calls_per_pull_request;
        let comments = self.forge.comments(slug, number).await?;
        let made = model_calls_made(&comments, &self.me, head);
        if made + needed > cap {
            return Ok(Err((made, cap)));
        }
        upsert_marked_comment(
            self.forge.as_ref(),
            slug,
            number,
            &self.me,
            MODEL_CALLS_COMMENT,
            &model_calls_body(&comments, &self.me, head, made + needed, cap),
        )
        .await?;
        Ok(Ok(()))
    }

    /// The handoff when the pull request's head branch is the default or the base branch.
    fn protected_branch(&self, slug: &RepoSlug, pr: &crate::forge::PullRequest) -> Option<Handoff> {
        let default_branch = self
            .config
            .repository(slug)
            .map(|r| r.default_branch.clone())
            .unwrap_or_default();
        (pr.head_ref == default_branch || pr.head_ref == pr.base_ref).then(|| Handoff {
            open: "the files the gate's report names".into(),
            choice: "how to repair the change".into(),
            fact: format!(
                "the pull request's head branch is {}, and Bosun never pushes to the default or the base branch",
                pr.head_ref
            ),
        })
    }

    /// Writes the rewrites, commits them as Bosun, counts the attempt (label) and pushes to the
    /// pull request's branch without force. Returns the commit.
    #[allow(clippy::too_many_arguments)]
    async fn commit_and_push(
        &self,
        slug: &RepoSlug,
        checkout: &Path,
        pr: &crate::forge::PullRequest,
        head: &str,
        rewrites: &[applier::Rewrite],
        message: &str,
        attempts: u32,
    ) -> Result<String, TriageError> {
        applier::write(checkout, rewrites).map_err(|e| TriageError::Write(e.to_string()))?;
        let files: Vec<&str> = rewrites.iter().map(|r| r.path.as_str()).collect();
        let identity = &self.config.commit;
        let mut add = vec!["add", "--"];
        add.extend(files.iter().copied());
        git(checkout, &add)?;
        git(
            checkout,
            &[
                "-c",
                &format!("user.name={}", identity.name),
                "-c",
                &format!("user.email={}", identity.email),
                "commit",
                "--quiet",
                "--no-verify",
                "-m",
                message,
            ],
        )?;
        let commit = git(checkout, &["rev-parse", "HEAD"])?;
        // The attempt is counted before the push: a repair that lands always counts, whatever
        // fails after it.
        let attempt = format!("{}{}", self.config.labels.attempt_prefix, attempts + 1);
        self.label(slug, pr.number, &attempt).await?;
        // No force: if the branch moved since the gate read it, the push fails and the
        // branch stays as it is.
        if let Err(e) = self.git_remote_command(
            checkout,
            &[
                "push",
                "--quiet",
                "origin",
                &format!("HEAD:refs/heads/{}", pr.head_ref),
            ],
            slug,
        ) {
            git(
                checkout,
                &["checkout", "--quiet", "--force", "--detach", head],
            )?;
            return Err(e);
        }
        Ok(commit)
    }
}

/// Plans the mechanical fix on `head_revision` of the checkout `head_config` renders: the
/// head's and the base's renders, the files the pull request changed, the inventory of
/// editable keys.
pub fn fix_plan(
    head_config: &RenderConfig,
    head_revision: &str,
    base: &str,
    not_served: &[crate::gate::rules::NotServed],
    report_body: &str,
) -> Result<(mechanical::Fix, crate::render::Rendering), repair::Refusal> {
    let stopped = |e: String| {
        (
            classify::Handoff {
                open: classify::not_served_handoff(not_served).open,
                choice: classify::not_served_handoff(not_served).choice,
                fact: e,
            },
            vec![],
        )
    };
    let head = crate::render::render(head_config, head_revision)
        .map_err(|f| stopped(format!("the head does not render for Bosun: {f}")))?;
    let base_rendering = (!base.is_empty()).then(|| crate::render::render(head_config, base).ok());
    let changed: Vec<String> = if base.is_empty() {
        Vec::new()
    } else {
        git(
            &head_config.repo_dir,
            &["diff", "--name-only", "--no-renames", base, &head.revision],
        )
        .map(|out| out.lines().map(str::to_string).collect())
        .unwrap_or_default()
    };
    let snapshot = Snapshot::load(&head_config.repo_dir, &head.revision)
        .map_err(|e| stopped(e.to_string()))?;
    let read = |path: &str| -> Option<String> {
        if snapshot.is_symlink(path) {
            return None;
        }
        snapshot
            .read(path)
            .and_then(|b| String::from_utf8(b.to_vec()).ok())
    };
    let base_snapshot = (!base.is_empty())
        .then(|| Snapshot::load(&head_config.repo_dir, base).ok())
        .flatten();
    let read_base = |path: &str| -> Option<String> {
        let snapshot = base_snapshot.as_ref()?;
        if snapshot.is_symlink(path) {
            return None;
        }
        snapshot
            .read(path)
            .and_then(|b| String::from_utf8(b.to_vec()).ok())
    };
    let fix = mechanical::plan(
        not_served,
        &head,
        base_rendering.flatten().as_ref(),
        head_config.charts.as_deref(),
        &changed,
        &read,
        &read_base,
        report_body,
    )?;
    Ok((fix, head))
}

/// The applier's policy for the mechanical fix: the deny/allow lists and the promotion scope
/// of the head's render.
pub fn fix_policy(
    config: &Config,
    head_config: &RenderConfig,
    rendering: &crate::render::Rendering,
) -> Result<applier::Policy, String> {
    let scope = match config.promotion_scope {
        super::config::PromotionScope::Deployed => {
            let url = head_config.repo_url.clone().unwrap_or_default();
            Some(applier::Scope::of(rendering, |repo| {
                repo.is_empty()
                    || crate::git::normalize_repo_url(repo) == crate::git::normalize_repo_url(&url)
            }))
        }
        super::config::PromotionScope::Repository => None,
    };
    applier::Policy::new(&config.deny, &config.allow, scope)
}

/// Runs `mechanical::decide` to the end: at most one call.
pub async fn fix_finish(
    fix: &mechanical::Fix,
    not_served: &[crate::gate::rules::NotServed],
    model: Option<&dyn crate::model::Model>,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<mechanical::Prepared, repair::Refusal> {
    let object = classify::not_served_handoff(not_served);
    let with_object = |result: Result<mechanical::Prepared, repair::Refusal>| {
        result.map_err(|(mut handoff, details)| {
            handoff.fact = format!("{} {}", object.fact, handoff.fact);
            (handoff, details)
        })
    };
    let request = match mechanical::decide(fix, model.is_some(), None) {
        mechanical::Step::Done(result) => return with_object(result),
        mechanical::Step::Ask(request) => request,
    };
    let Some(model) = model else {
        return with_object(Err((object.clone(), vec![])));
    };
    let reply = repair::call(model, &request, say).await;
    match mechanical::decide(fix, true, Some(&reply)) {
        mechanical::Step::Done(result) => with_object(result),
        mechanical::Step::Ask(_) => with_object(Err((object.clone(), vec![]))),
    }
}

/// Plans the values migration on `head_revision` of the checkout `head_config` renders:
/// `Ok(None)` when the head renders after all. The base (the merge base the gate used) is
/// rendered for the old charts' schemas, which the model is shown.
pub fn migration_plan(
    head_config: &RenderConfig,
    head_revision: &str,
    base: &str,
) -> Result<Option<Vec<migration::Migration>>, repair::Refusal> {
    let failure = match crate::render::render(head_config, head_revision) {
        Ok(_) => return Ok(None),
        Err(failure) => failure,
    };
    let base_rendering = if base.is_empty() {
        None
    } else {
        crate::render::render(head_config, base).ok()
    };
    let migrations = migration::plan(&failure, &head_config.repo_dir, &failure.revision, &|f| {
        base_rendering
            .as_ref()
            .and_then(|b| migration::old_schema_in(b, head_config.charts.as_deref(), f))
    })?;
    Ok(Some(migrations))
}

/// Runs `migration::decide` to the end: makes each call it asks for, one at a time; the
/// harness's render check runs the real helm of `config`.
pub async fn migration_finish(
    migrations: &[migration::Migration],
    config: &RenderConfig,
    model: Option<&dyn crate::model::Model>,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<migration::Prepared, repair::Refusal> {
    let render = |job: &crate::render::source::HelmJob| -> Result<(), String> {
        crate::render::run_helm(config, job).map(|_| ())
    };
    let mut replies = Vec::new();
    loop {
        let step = tokio::task::block_in_place(|| {
            migration::decide(migrations, model.is_some(), &replies, &render)
        });
        match step {
            migration::Step::Done(result) => return result,
            migration::Step::Ask(requests) => {
                let (Some(model), Some(request)) = (model, requests.into_iter().next()) else {
                    return Err((
                        Handoff {
                            open: String::new(),
                            choice: "which settings to migrate".into(),
                            fact: "a values migration needs a model, which is not configured"
                                .into(),
                        },
                        vec![],
                    ));
                };
                let reply = repair::call(model, &request, say).await;
                replies.push(reply);
            }
        }
    }
}

/// Repairs already pushed, from the attempt labels: the highest N of `<prefix>N`, or how many
/// such labels there are if that is more (a person removing one label does not reset the cap).
pub fn attempts_of(labels: &[String], prefix: &str) -> u32 {
    let numbered = labels
        .iter()
        .filter_map(|l| l.strip_prefix(prefix)?.parse::<u32>().ok());
    let count = labels.iter().filter(|l| l.starts_with(prefix)).count() as u32;
    numbered.max().unwrap_or(0).max(count)
}

/// The keys a values schema refused (`additional properties 'KEY' not allowed`), and the YAML
/// files at `revision` that set them, as `file (key KEY)`.
fn refused_value_places(checkout: &Path, revision: &str, error: &str) -> Vec<String> {
    let mut keys: Vec<&str> = error
        .split("additional properties '")
        .skip(1)
        .filter_map(|rest| rest.split_once('\'').map(|(key, _)| key))
        .filter(|key| {
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut places = Vec::new();
    for key in keys {
        let pattern = format!("^[[:space:]]*{key}:");
        // No pathspec globs: pathspecs are literal here (GIT_LITERAL_PATHSPECS).
        let Ok(found) = git(checkout, &["grep", "-l", "-E", &pattern, revision]) else {
            continue;
        };
        for line in found.lines() {
            let file = line.strip_prefix(&format!("{revision}:")).unwrap_or(line);
            if file.ends_with(".yaml") || file.ends_with(".yml") {
                places.push(format!("{file} (key {key})"));
            }
        }
    }
    places
}

#[cfg(test)]
mod tests;
