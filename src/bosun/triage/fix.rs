//! The mechanical fix repair: scalar edits from the editable keys, checked, pushed.

use std::fmt::Write as _;

use super::*;

impl Bosun {
    /// The mechanical fix: the model selects scalar edits from Bosun's inventory of editable
    /// keys; the harness and the applier decide; the gate re-runs and judges.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fix(
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
        let head_config = match self.head_checkout(slug, config, pr, run).await? {
            Ok(head_config) => head_config,
            Err(handed_off) => return Ok(Some(handed_off)),
        };
        let planned = tokio::task::block_in_place(|| {
            fix_plan(&head_config, &head, base, not_served, report_body)
        });
        let (fix, rendering) = match planned {
            Ok((mut fix, rendering)) => {
                fix.redaction = self.config.model.redaction();
                (fix, rendering)
            }
            Err((handoff, details)) => {
                return self
                    .hand_off(slug, number, &handoff, &details, run)
                    .await
                    .map(Some);
            }
        };
        if self.model.is_some()
            && let Err(hit) = self.reserve_calls(slug, number, &head, 1).await?
        {
            let handoff = Handoff {
                open: classify::not_served_handoff(not_served).open,
                choice: classify::not_served_handoff(not_served).choice,
                fact: format!("a scalar fix needs 1 model call and {hit}; nothing was pushed"),
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
        let prepared = match self.after_model(slug, number, said, finished, run).await? {
            Ok(prepared) => prepared,
            Err(handed_off) => return Ok(Some(handed_off)),
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
            crate::plural(prepared.edits.len()),
            prepared.rewrites.len(),
            crate::plural(prepared.rewrites.len()),
            short(&commit),
            pr.head_ref
        ));
        self.confirm_push(slug, pr, commit, run).await
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
        crate::bosun::config::PromotionScope::Deployed => {
            let url = head_config.repo_url.clone().unwrap_or_default();
            Some(applier::Scope::of(rendering, |repo| {
                repo.is_empty()
                    || crate::git::normalize_repo_url(repo) == crate::git::normalize_repo_url(&url)
            }))
        }
        crate::bosun::config::PromotionScope::Repository => None,
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
