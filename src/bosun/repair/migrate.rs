//! The values migration as a repair: planned from the head's render failure, one call per
//! chart, the harness with helm rendering each proposal, key-level edits read back.

use std::fmt::Write as _;

use super::{CapHit, Comment, Prepared, Refusal, Renders, Repair, Step};
use crate::bosun::applier::Policy;
use crate::bosun::migration;
use crate::model::Reply;
use crate::render::{HelmRunError, RenderConfig};

/// Plans the values migration on `head_revision` of the checkout `head_config` renders:
/// `Ok(None)` when the head renders after all. The base (the merge base the gate used) is
/// rendered for the old charts' schemas, which the model is shown. (The evals' entry; the
/// runners plan through [`super::plan`].)
pub fn migration_plan(
    head_config: &RenderConfig,
    head_revision: &str,
    base: &str,
) -> Result<Option<Vec<migration::Migration>>, Refusal> {
    plan_on(&Renders::new(head_config, head_revision, base))
}

/// Plans the values migration on the head `renders` holds.
pub(super) fn plan_on(renders: &Renders<'_>) -> Result<Option<Vec<migration::Migration>>, Refusal> {
    let failure = match renders.head() {
        Ok(_) => return Ok(None),
        Err(failure) => failure,
    };
    let head_config = renders.config();
    let migrations = migration::plan(failure, &head_config.repo_dir, &failure.revision, &|f| {
        renders
            .base()
            .and_then(|b| migration::old_schema_in(b, head_config.charts.as_deref(), f))
    })?;
    Ok(Some(migrations))
}

/// The values migration as a [`Repair`]: the migrations, the config whose helm renders each
/// proposal, and the lists (no promotion scope: the values files are the head's).
pub struct MigrationRepair {
    migrations: Vec<migration::Migration>,
    config: RenderConfig,
    policy: Policy,
}

const CHOICE: &str =
    "which settings to remove, rename or add so the new chart's values schema accepts them";

impl MigrationRepair {
    pub fn new(
        migrations: Vec<migration::Migration>,
        config: RenderConfig,
        policy: Policy,
    ) -> Self {
        MigrationRepair {
            migrations,
            config,
            policy,
        }
    }

    /// The commit message, the comment and the lines of a decided migration.
    fn prepared(&self, migrated: migration::Prepared) -> Prepared {
        let migration::Prepared { rewrites, lines } = migrated;
        let charts: Vec<&str> = self.migrations.iter().map(|m| m.chart.as_str()).collect();
        let mut message = format!(
            "Migrate values for {}\n\nThe new chart's values.schema.json refuses settings this repository makes. A model proposed each values file; Bosun's harness checked it (declared values kept, every value from the original or the new chart, the schema validates, helm renders) and applied it key by key:\n",
            charts.join(", ")
        );
        for line in &lines {
            let _ = writeln!(message, "- {}", line.replace('`', ""));
        }
        let opening = (
            "**Repaired.** The new chart refuses values this repository sets, so the head did not render. Bosun migrated the values (commit ".to_string(),
            "): a model proposed each file, and Bosun's harness checked that every value the new chart still declares is unchanged, every value comes from the original file or the new chart, the values validate against the new `values.schema.json` and helm renders the chart with them; then it applied the changes key by key, so every other line and comment stays:\n\n".to_string(),
        );
        let mut rest = String::new();
        for line in &lines {
            let _ = writeln!(rest, "- {line}");
        }
        Prepared {
            done: format!(
                "migrated values in {} file{}",
                rewrites.len(),
                crate::plural(rewrites.len())
            ),
            summary: format!("values in {} file(s)", rewrites.len()),
            changes: lines.iter().map(|l| format!("migrated {l}")).collect(),
            message,
            comment: Comment {
                opening,
                rest,
                closing: "\nThe gate re-runs on the pushed commit.\n".into(),
            },
            rewrites,
        }
    }
}

impl Repair for MigrationRepair {
    /// One call per chart; none when the precheck refuses (a required key nothing supplies).
    fn calls_needed(&self, model: bool) -> u32 {
        let precheck_refuses = self
            .migrations
            .iter()
            .any(|m| !migration::unsuppliable(m).is_empty());
        if model && !precheck_refuses {
            self.migrations.len() as u32
        } else {
            0
        }
    }

    fn cap_refusal(&self, needed: u32, hit: &CapHit) -> Refusal {
        (
            crate::bosun::classify::Handoff {
                open: self
                    .migrations
                    .iter()
                    .map(migration::Migration::open)
                    .collect::<Vec<_>>()
                    .join(", "),
                choice: CHOICE.into(),
                fact: format!(
                    "a values migration needs {needed} model call{} and {hit}; nothing was pushed",
                    crate::plural(needed)
                ),
            },
            vec![],
        )
    }

    /// `migration::decide`, its harness's render check running the real helm.
    fn decide(&self, model: bool, replies: &[Result<Reply, crate::model::Refusal>]) -> Step {
        let render = |job: &crate::render::source::HelmJob| -> Result<(), HelmRunError> {
            crate::render::run_helm(&self.config, job).map(|_| ())
        };
        match migration::decide(&self.migrations, model, replies, &render) {
            Step::Ask(requests) => Step::Ask(requests),
            Step::Done(done) => Step::Done(done.map(|migrated| self.prepared(migrated))),
        }
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn choice(&self) -> &str {
        CHOICE
    }
}
