//! The apiVersion swap repair: plan, reshape where needed, commit, push, comment.

use std::fmt::Write as _;

use super::*;

impl Bosun {
    pub(super) async fn swap(
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
            && let Err(hit) = self.reserve_calls(slug, number, &head, needed).await?
        {
            let (handoff, details) = planned.cap_refusal(needed, &hit);
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
        let prepared = match self.after_model(slug, number, said, finished, run).await? {
            Ok(prepared) => prepared,
            Err(handed_off) => return Ok(Some(handed_off)),
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
                crate::plural(swapped)
            )
        } else {
            format!(
                "Move {swapped} manifest{} off API versions the new chart stops serving, reshaping {} for the new schema\n\nBosun rewrote apiVersion values as the addons-gate report asked, and re-serialised the reshaped documents from the structure its harness validated:\n",
                crate::plural(swapped),
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
            crate::plural(files.len()),
            short(&commit),
            pr.head_ref
        ));
        self.confirm_push(slug, pr, commit, run).await
    }
}
