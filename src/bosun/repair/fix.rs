//! The scalar fix as a repair: the inventory of editable keys from the head's and the
//! base's renders, one model call, the harness, the edits read back.

use std::fmt::Write as _;

use super::{CapHit, Comment, Prepared, Refusal, Renders, Repair, Step};
use crate::bosun::applier::Policy;
use crate::bosun::classify;
use crate::bosun::scalar_fix;
use crate::gate::rules::NotServed;
use crate::git::Snapshot;
use crate::model::Reply;
use crate::render::RenderConfig;

/// Plans the mechanical fix on `head_revision` of the checkout `head_config` renders: the
/// head's and the base's renders, the files the pull request changed, the inventory of
/// editable keys. (The evals' entry; the runners plan through [`super::plan`].)
pub fn fix_plan(
    head_config: &RenderConfig,
    head_revision: &str,
    base: &str,
    not_served: &[NotServed],
    report_body: &str,
) -> Result<(scalar_fix::Fix, crate::render::Rendering), Refusal> {
    let renders = Renders::new(head_config, head_revision, base);
    let fix = plan_on(&renders, not_served, report_body)?;
    let head = renders
        .head()
        .as_ref()
        .expect("plan_on refuses a head that does not render")
        .clone();
    Ok((fix, head))
}

/// Plans the mechanical fix on the head `renders` holds.
pub(super) fn plan_on(
    renders: &Renders<'_>,
    not_served: &[NotServed],
    report_body: &str,
) -> Result<scalar_fix::Fix, Refusal> {
    let head_config = renders.config();
    let base = renders.base_revision();
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
    let head = renders
        .head()
        .as_ref()
        .map_err(|f| stopped(format!("the head does not render for Bosun: {f}")))?;
    let changed: Vec<String> = if base.is_empty() {
        Vec::new()
    } else {
        crate::git::Git::local(&head_config.repo_dir)
            .args(&["diff", "--name-only", "--no-renames", base, &head.revision])
            .run()
            .map(|out| {
                String::from_utf8_lossy(&out)
                    .lines()
                    .map(str::to_string)
                    .collect()
            })
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
    scalar_fix::plan(
        not_served,
        head,
        renders.base(),
        head_config.charts.as_deref(),
        &changed,
        &read,
        &read_base,
        report_body,
    )
}

/// The scalar fix as a [`Repair`]: the inventory and the head's policy.
pub struct FixRepair {
    fix: scalar_fix::Fix,
    not_served: Vec<NotServed>,
    policy: Policy,
    choice: String,
}

impl FixRepair {
    pub fn new(fix: scalar_fix::Fix, not_served: &[NotServed], policy: Policy) -> Self {
        FixRepair {
            fix,
            not_served: not_served.to_vec(),
            policy,
            choice: classify::not_served_handoff(not_served).choice,
        }
    }

    /// The commit message, the comment and the lines of decided edits.
    fn prepared(&self, fixed: scalar_fix::Prepared) -> Prepared {
        let scalar_fix::Prepared { rewrites, edits } = fixed;
        let mut message = format!(
            "Stop rendering {} where the cluster does not serve it\n\nA model selected these edits from Bosun's inventory of editable keys; Bosun's harness and applier checked them:\n",
            self.not_served
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
        for edit in &edits {
            let _ = writeln!(message, "- {}", edit.line().replace('`', ""));
        }
        let one = edits.len() == 1;
        let opening = (
            format!(
                "**Repaired.** The gate found objects rendered on clusters that do not serve their kind. Bosun set {} (commit ",
                if one { "one key" } else { "these keys" }
            ),
            format!(
                "): a model selected {} from the keys Bosun lists as editable, and Bosun checked each is in that list, is a scalar whose text comes from the gate's report or the chart's defaults, and that the file still held the value Bosun saw:\n\n",
                if one { "it" } else { "them" }
            ),
        );
        let mut rest = String::new();
        for edit in &edits {
            let _ = writeln!(rest, "- {}", edit.line());
        }
        Prepared {
            done: format!(
                "set {} key{} in {} file{}",
                edits.len(),
                crate::plural(edits.len()),
                rewrites.len(),
                crate::plural(rewrites.len())
            ),
            summary: format!("{} key(s)", edits.len()),
            changes: edits.iter().map(|e| format!("set {}", e.line())).collect(),
            message,
            comment: Comment {
                opening,
                rest,
                closing: "\nThe gate re-runs on the pushed commit and judges the result.\n".into(),
            },
            rewrites,
        }
    }
}

impl Repair for FixRepair {
    fn calls_needed(&self, model: bool) -> u32 {
        u32::from(model)
    }

    fn cap_refusal(&self, _needed: u32, hit: &CapHit) -> Refusal {
        let object = classify::not_served_handoff(&self.not_served);
        (
            classify::Handoff {
                open: object.open,
                choice: object.choice,
                fact: format!("a scalar fix needs 1 model call and {hit}; nothing was pushed"),
            },
            vec![],
        )
    }

    /// `scalar_fix::decide`, every handoff prefixed with the object the cluster does not
    /// serve: at most one call.
    fn decide(&self, model: bool, replies: &[Result<Reply, crate::model::Refusal>]) -> Step {
        let object = classify::not_served_handoff(&self.not_served);
        match scalar_fix::decide(&self.fix, model, replies.first()) {
            Step::Ask(requests) if replies.is_empty() => Step::Ask(requests),
            // Asked again after the one call: refuse rather than loop.
            Step::Ask(_) => Step::Done(Err((object, vec![]))),
            Step::Done(done) => Step::Done(done.map(|fixed| self.prepared(fixed)).map_err(
                |(mut handoff, details)| {
                    handoff.fact = format!("{} {}", object.fact, handoff.fact);
                    (handoff, details)
                },
            )),
        }
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn choice(&self) -> &str {
        &self.choice
    }
}
