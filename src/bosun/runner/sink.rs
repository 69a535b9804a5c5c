//! A repair on a pull request: the head checked out, the repair planned on the round's
//! renders, then run by the one executor (`repair::execute`) with the forge as its sink:
//! commit as Bosun, count the attempt, push without force, comment.

use std::path::Path;

use super::comments::protected_branch;
use super::git_ops::detach_clean;
use super::{Bosun, Run, RunPath, TriageError, model_calls, short};
use crate::bosun::applier::Rewrite;
use crate::bosun::repair::{
    self, CapHit, Executed, Planning, Prepared, Refusal, Renders, Sink, Work,
};
use crate::forge::{PullRequest, RepoSlug};
use crate::gate::check::Kept;
use crate::render::RenderConfig;

impl Bosun {
    /// Repairs what `work` names on the pull request's head, from the renders the round's
    /// gate `kept` when they are of this head: `Ok(None)` when a repair was pushed (pr
    /// updated), else the status description.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn repair(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut PullRequest,
        work: Work,
        kept: Option<Kept>,
        base: &str,
        report_body: &str,
        attempts: u32,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let started = std::time::Instant::now();
        let head = pr.head_sha.clone();
        let head_config = match self
            .head_checkout(slug, config, pr, work.protected(), run)
            .await?
        {
            HeadCheckout::Ready(head_config) => *head_config,
            HeadCheckout::HandedOff(description) => return Ok(Some(description)),
        };
        // The head is rendered once per round: the gate's render of this head is used.
        let renders = Renders::new(&head_config, &head, base).kept(kept);
        let planned = tokio::task::block_in_place(|| {
            repair::plan(&work, &self.config, &renders, report_body)
        })
        .map_err(TriageError::Plan)?;
        let planned = match planned {
            Planning::Ready(planned) => planned,
            Planning::Refused((handoff, details)) => {
                return self
                    .hand_off(slug, pr.number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
            Planning::HeadRenders => {
                run.say("the head renders for Bosun; nothing to migrate");
                run.path = RunPath::Wait;
                return Ok(Some("the head renders; waiting for the gate".into()));
            }
        };
        let mut sink = ForgeSink {
            bosun: self,
            slug,
            pr: &*pr,
            head: &head,
            checkout: &config.repo_dir,
            attempts,
            run: &mut *run,
            started,
        };
        let executed = repair::execute(planned.as_ref(), self.model.as_deref(), &mut sink).await?;
        match executed {
            Executed::HandedOff(description) => Ok(Some(description)),
            Executed::Pushed(commit) => self.confirm_push(slug, pr, commit, run).await,
        }
    }

    /// Where a repair starts: the pull request's head checked out detached and clean in the
    /// checkout `config` renders, and a copy of `config` with a fresh parsed store (the
    /// checkout changed). A protected branch is handed to a person instead (with what
    /// `hand_off` returned; `protected` is its open and choice).
    async fn head_checkout(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &PullRequest,
        protected: (&str, &str),
        run: &mut Run,
    ) -> Result<HeadCheckout, TriageError> {
        if let Some(handoff) = protected_branch(&self.config, slug, pr, protected) {
            return self
                .hand_off(slug, pr.number, &handoff, &[], run)
                .await
                .map(HeadCheckout::HandedOff);
        }
        detach_clean(&config.repo_dir, &pr.head_sha)?;
        let mut head_config = config.clone();
        head_config.parsed = Default::default();
        Ok(HeadCheckout::Ready(Box::new(head_config)))
    }

    /// After a push: the commit is recorded on the run and must be the pull request's head
    /// as the forge now reports it (`pr` is read again).
    async fn confirm_push(
        &self,
        slug: &RepoSlug,
        pr: &mut PullRequest,
        commit: String,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        run.pushed.push(commit.clone());
        *pr = self.forge.pull_request(slug, pr.number).await?;
        if pr.head_sha != commit {
            return Err(TriageError::Git(format!(
                "pushed {} but the pull request's head is {}",
                short(&commit),
                short(&pr.head_sha)
            )));
        }
        Ok(None)
    }
}

/// Where a repair on a pull request starts: its head checked out, or the pull request handed
/// to a person (a protected branch), with the status description `hand_off` returned.
enum HeadCheckout {
    Ready(Box<RenderConfig>),
    HandedOff(String),
}

/// The forge as a repair's sink: the pull request's checkout, its branch, Bosun's comment.
struct ForgeSink<'a> {
    bosun: &'a Bosun,
    slug: &'a RepoSlug,
    pr: &'a PullRequest,
    head: &'a str,
    checkout: &'a Path,
    attempts: u32,
    run: &'a mut Run,
    started: std::time::Instant,
}

impl ForgeSink<'_> {
    fn attempt(&self) -> String {
        format!(
            "{}{}",
            self.bosun.config.labels.attempt_prefix,
            self.attempts + 1
        )
    }
}

#[async_trait::async_trait]
impl Sink for ForgeSink<'_> {
    type Error = TriageError;

    fn tree(&self) -> &Path {
        self.checkout
    }

    async fn reserve(&mut self, needed: u32) -> Result<Result<(), CapHit>, TriageError> {
        model_calls::reserve(
            self.bosun.forge.as_ref(),
            &self.bosun.me,
            &self.bosun.config.model,
            self.slug,
            self.pr.number,
            self.head,
            needed,
        )
        .await
    }

    fn say(&mut self, line: String) {
        self.run.say(line);
    }

    async fn hand_off(&mut self, (handoff, details): Refusal) -> Result<String, TriageError> {
        self.bosun
            .hand_off(self.slug, self.pr.number, &handoff, &details, self.run)
            .await
    }

    fn write_failed(&self, error: std::io::Error) -> TriageError {
        TriageError::Write(error.to_string())
    }

    async fn commit(&mut self, rewrites: &[Rewrite], message: &str) -> Result<String, TriageError> {
        self.bosun
            .checkouts()
            .commit(self.tree(), rewrites, message)
    }

    /// Counts the attempt (its label), then pushes to the pull request's branch without force.
    async fn push(&mut self, _commit: &str) -> Result<(), TriageError> {
        let attempt = self.attempt();
        // The attempt is counted before the push: a repair that lands always counts, whatever
        // fails after it.
        self.bosun
            .label(self.slug, self.pr.number, &attempt)
            .await?;
        self.bosun
            .checkouts()
            .push(self.slug, self.tree(), &self.pr.head_ref, self.head)?;
        self.run.repair_seconds = Some(self.started.elapsed().as_secs_f64());
        Ok(())
    }

    async fn comment(&mut self, prepared: &Prepared, commit: &str) -> Result<(), TriageError> {
        let (repaired, body) = prepared.comment.body(commit);
        self.run.repaired = Some(repaired);
        self.bosun.comment(self.slug, self.pr.number, &body).await?;
        let line = format!(
            "{}, pushed {} to {} (label {})",
            prepared.done,
            short(commit),
            self.pr.head_ref,
            self.attempt()
        );
        self.run.say(line);
        Ok(())
    }
}
