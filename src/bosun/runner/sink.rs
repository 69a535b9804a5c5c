//! A repair on a pull request: the head checked out, the repair planned on the round's
//! renders, then run by the one executor (`repair::execute`) with the forge as its sink:
//! commit as Bosun, count the attempt, push without force, comment.

use super::*;
use crate::bosun::repair::{Executed, Planning, Prepared, Refusal, Renders, Sink, Work};

impl Bosun {
    /// Repairs what `work` names on the pull request's head, from the renders the round's
    /// gate `kept` when they are of this head: `Ok(None)` when a repair was pushed (pr
    /// updated), else the status description.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn repair(
        &self,
        slug: &RepoSlug,
        config: &RenderConfig,
        pr: &mut crate::forge::PullRequest,
        work: Work,
        kept: Option<crate::gate::check::Kept>,
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
            Ok(head_config) => head_config,
            Err(handed_off) => return Ok(Some(handed_off)),
        };
        // The head is rendered once per round: the gate's render of this head is used.
        let renders = Renders::new(&head_config, &head, base).kept(kept);
        let planned = tokio::task::block_in_place(|| {
            repair::plan(&work, &self.config, &renders, report_body)
        })
        .map_err(TriageError::Gate)?;
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
                run.path = "wait".into();
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
}

/// The forge as a repair's sink: the pull request's checkout, its branch, Bosun's comment.
struct ForgeSink<'a> {
    bosun: &'a Bosun,
    slug: &'a RepoSlug,
    pr: &'a crate::forge::PullRequest,
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

    async fn reserve(
        &mut self,
        needed: u32,
    ) -> Result<Result<(), crate::bosun::repair::CapHit>, TriageError> {
        self.bosun
            .reserve_calls(self.slug, self.pr.number, self.head, needed)
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

    async fn commit(
        &mut self,
        rewrites: &[applier::Rewrite],
        message: &str,
    ) -> Result<String, TriageError> {
        self.bosun.commit(self.tree(), rewrites, message)
    }

    async fn push(&mut self, _commit: &str) -> Result<(), TriageError> {
        let attempt = self.attempt();
        self.bosun
            .push(self.slug, self.tree(), self.pr, self.head, &attempt)
            .await?;
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
