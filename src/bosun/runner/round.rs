//! The triage entry and dispatch: round by round, each verdict classified and acted on.

use super::comments::{attempts_of, refused_value_places};
use super::green::release_notes;
use super::setup::{chart_pulls, inventory, render_config};
use super::verdict::{check_published, published_report};
use super::{Bosun, Run, RunPath, TriageError, scrubbed, short};
use crate::bosun::classify::{self, Route, Situation};
use crate::bosun::repair::Work;
use crate::forge::{PullRequest, RepoSlug, StatusState};
use crate::gate::check::Kept;
use crate::gate::publish;
use crate::gate::report::ParsedReport;
use crate::gate::verdict::Outcome;
use crate::render::RenderConfig;

impl Bosun {
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
        let mut pr = match self.forge.pull_request(slug, number).await {
            Ok(pr) => pr,
            Err(e) => {
                return Err(match e.status() {
                    Some(status @ (404 | 410)) => TriageError::NoSuchPullRequest {
                        slug: slug.clone(),
                        number,
                        status,
                    },
                    _ => e.into(),
                });
            }
        };
        run.head = pr.head_sha.clone();
        // The checkout and the live inventory, made once for every round of this triage.
        let mut prepared: Option<RenderConfig> = None;
        // Bounded: each round either ends or pushes one repair, and pushes are capped.
        for _ in 0..=self.config.attempt_cap + 1 {
            if pr.state != "open" || pr.merged {
                run.say(format!("#{number} is {}; nothing to do", pr.state));
                run.path = RunPath::Closed;
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
                    let e = scrubbed(e, &self.token);
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
        let checkout = self.checkouts().fetch(slug)?;
        let inventory = inventory(&self.config.inventory, self.kube.as_ref()).await?;
        let pulls = chart_pulls(&self.config, slug, &checkout)?;
        Ok(render_config(
            &self.config,
            &self.workdir,
            (&self.helm, self.kubectl.as_ref()),
            self.remote_cache.as_ref(),
            &checkout,
            url,
            inventory,
            pulls,
        ))
    }

    /// One round: gate, read, classify, act. `Ok(None)`: a repair was pushed (pr updated).
    async fn round(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut PullRequest,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let number = pr.number;
        let checkout = &config.repo_dir;
        let Judged {
            kept,
            report,
            body,
            checked,
        } = self.judged(slug, config, pr, run).await?;
        let attempts = attempts_of(&pr.labels, &self.config.labels.attempt_prefix);
        let situation = Situation {
            report: report.as_ref().filter(|_| checked),
            head_sha: &pr.head_sha,
            fork: !pr.head_repo.eq_ignore_ascii_case(&slug.to_string()),
            attempts,
            attempt_cap: self.config.attempt_cap,
        };
        match classify::classify(&situation) {
            Route::Wait(why) => {
                run.say(format!("waiting: {why}"));
                run.path = RunPath::Wait;
                Ok(Some(format!("waiting: {why}")))
            }
            path @ (Route::Green | Route::WorthALook(_)) => {
                self.green_round(slug, checkout, pr, report.as_ref(), path, run)
                    .await
            }
            Route::Escalate(line) => {
                self.comment(slug, number, &format!("{line}\n")).await?;
                self.label(slug, number, &self.config.labels.needs_human)
                    .await?;
                run.say(format!(
                    "escalated (label {}): no values to change in this repository",
                    self.config.labels.needs_human
                ));
                run.path = RunPath::Escalate;
                Ok(Some(
                    "escalated: no values to change in this repository".into(),
                ))
            }
            Route::Handoff(mut handoff) => {
                // A values schema refusal names keys: point at the files that set them.
                let places = refused_value_places(checkout, &pr.head_sha, &handoff.fact);
                if !places.is_empty() {
                    handoff.open = places.join(", ");
                }
                self.hand_off(slug, number, &handoff, &[], run)
                    .await
                    .map(Some)
            }
            route @ (Route::Swap(_) | Route::Fix(_) | Route::Migrate(_)) => {
                // The fix and the migration compare with what the merge base served; the swap
                // reads the head alone.
                let base = report
                    .as_ref()
                    .map(|r| r.verdict.base.clone())
                    .unwrap_or_default();
                let (work, base) = match route {
                    Route::Swap(dropped) => (Work::Swap(dropped), ""),
                    Route::Fix(not_served) => (Work::Fix(not_served), base.as_str()),
                    _ => (Work::Migrate, base.as_str()),
                };
                self.repair(slug, config, pr, work, kept, base, &body, attempts, run)
                    .await
            }
        }
    }

    /// The gate's verdict on the head as published: the gate run first when Bosun is the
    /// gate's author (exactly what `gate publish` does; when another identity runs the gate,
    /// forge.gateAuthor, e.g. a CI job, Bosun only reads that gate's report). `pr` is read
    /// again: the verdict is judged against the pull request as it is now (a person may have
    /// pushed meanwhile).
    async fn judged(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut PullRequest,
        run: &mut Run,
    ) -> Result<Judged, TriageError> {
        let number = pr.number;
        // The renders the gate made: the repair acts on the same head's render.
        let mut kept = None;
        let published = if self.config.gate_author(&self.me) == self.me {
            let (fresh, result, published, renders) = publish::check_and_publish_keeping(
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
            kept = renders;
            run.say(format!(
                "gate on {}: {}",
                short(&pr.head_sha),
                publish::title(&result)
            ));
            Some(published.comment_id)
        } else {
            None
        };
        // Triage reads the verdict only from what was published.
        let author = self.config.gate_author(&self.me);
        let found = published_report(self.forge.as_ref(), author, slug, number, published).await?;
        *pr = self.forge.pull_request(slug, number).await?;
        let checked = check_published(
            self.forge.as_ref(),
            author,
            &self.me,
            slug,
            &pr.head_sha,
            found.as_ref().map(|(_, d, _)| d.as_str()),
            found
                .as_ref()
                .is_some_and(|(r, _, _)| r.verdict.outcome == Outcome::Green),
        )
        .await?;
        let (report, body) = match found {
            Some((report, _, body)) => (Some(report), body),
            None => (None, String::new()),
        };
        Ok(Judged {
            kept,
            report,
            body,
            checked,
        })
    }

    /// A green (or worth a look) verdict: the maintainers' release notes for the images the
    /// change moves (notes that describe a manual step make a green gate worth a look) and,
    /// with a model, a short summary checked against the report and the notes.
    async fn green_round(
        &self,
        slug: &RepoSlug,
        checkout: &std::path::Path,
        pr: &PullRequest,
        report: Option<&ParsedReport>,
        path: Route,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let number = pr.number;
        let (notes, mut manual, quoted) = match report.and_then(|r| r.summary.as_ref()) {
            Some(summary) => release_notes(self.notes.as_deref(), summary, run).await,
            None => (String::new(), Vec::new(), Vec::new()),
        };
        let short_summary = match report {
            // Not after a repair: the repair's comment is what a person reads then.
            // Known from the head itself, not only from this run: a triage tried
            // again after a fault, or after a restart, finds Bosun's own commit.
            Some(r)
                if self.model.is_some()
                    && r.summary.is_some()
                    && run.pushed.is_empty()
                    && !self.checkouts().own_repair(checkout, &pr.head_sha) =>
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
            Route::WorthALook(mut reasons) => {
                reasons.extend(manual);
                Route::WorthALook(reasons)
            }
            Route::Green if !manual.is_empty() => Route::WorthALook(manual),
            other => other,
        };
        self.green(slug, number, pr, report, path, &notes, run)
            .await
    }
}

/// What a round read of the gate's verdict.
struct Judged {
    /// The renders the gate made, when Bosun ran it.
    kept: Option<Kept>,
    /// The published report, if one parses.
    report: Option<ParsedReport>,
    /// The report comment's body.
    body: String,
    /// The gate author's `addons-gate` check on the head as it is now carries this report.
    checked: bool,
}
