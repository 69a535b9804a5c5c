//! The values migration repair: planned from the head's render failure, then pushed.

use std::fmt::Write as _;

use super::*;

impl Bosun {
    /// The values migration: the head does not render because the new chart's values schema
    /// refuses values this repository sets. Plans it from the head's render failure, asks the
    /// model once per chart (counted like the reshape), and pushes only what the harness and
    /// the applier accept.
    pub(super) async fn migrate(
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
        let head_config = match self.head_checkout(slug, config, pr, run).await? {
            Ok(head_config) => head_config,
            Err(handed_off) => return Ok(Some(handed_off)),
        };
        let decided = tokio::task::block_in_place(|| migration_plan(&head_config, &head, base));
        let migrations = match decided {
            Ok(Some(mut migrations)) => {
                for m in &mut migrations {
                    m.redaction = self.config.model.redaction();
                }
                migrations
            }
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
            && let Err(hit) = self.reserve_calls(slug, number, &head, needed).await?
        {
            let handoff = Handoff {
                    open: migrations
                        .iter()
                        .map(migration::Migration::open)
                        .collect::<Vec<_>>()
                        .join(", "),
                    choice: "which settings to remove, rename or add so the new chart's values schema accepts them".into(),
                    fact: format!(
                        "a values migration needs {needed} model call{} and {hit}; nothing was pushed",
                        crate::plural(needed)
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
        let prepared = match self.after_model(slug, number, said, finished, run).await? {
            Ok(prepared) => prepared,
            Err(handed_off) => return Ok(Some(handed_off)),
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
            crate::plural(prepared.rewrites.len()),
            short(&commit),
            pr.head_ref
        ));
        self.confirm_push(slug, pr, commit, run).await
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
