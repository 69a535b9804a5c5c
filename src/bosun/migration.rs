//! The values migration (ADR 0013): the head does not render because the new chart's
//! `values.schema.json` refuses values this repository sets. A model proposes each values file
//! whole; the harness accepts a proposal only when every value the new chart still declares
//! is kept byte for byte, the layered values validate against the new schema, every value is
//! one the original or the new chart supplied, and the real helm renders the chart with it.
//! What lands is a plan of remove / rename / set operations applied on each key's own lines,
//! read back and compared with the accepted proposal.

use std::fmt::Write as _;

use serde_json::Value;

use super::applier::Rewrite;
use super::classify::Handoff;
use super::repair::Refusal;
use crate::gate::report;
use crate::model::{Refusal as ModelRefusal, Reply};
use crate::render::source::HelmJob;
use crate::render::{HelmFailure, HelmRunError};

mod harness;
mod key_edits;
mod planning;
mod prompt;
mod values;

pub use self::harness::{AcceptedFile, check_reply};
pub use self::key_edits::rewrite;
pub use self::planning::{old_schema_in, plan, unsuppliable};
pub use self::prompt::{SYSTEM, reply_schema};
pub use self::values::{coalesce, leaves};

use self::values::short;

/// The harness's rules, by the name a refusal gives.
pub mod rule {
    /// The reply is `{"files": [{"file", "values"}]}` naming exactly the files asked about.
    pub const SHAPE: &str = "reply-shape";
    /// Every value the new chart still declares is at the same path, unchanged.
    pub const KEPT: &str = "kept-values";
    /// Every value comes from the original file or the new chart (values.yaml, the schema).
    pub const ACCOUNTED: &str = "accounted-values";
    /// The layered values validate against the new chart's values.schema.json.
    pub const SCHEMA: &str = "schema-fit";
    /// The real helm renders the new chart with the proposal.
    pub const RENDERS: &str = "renders";
    /// The edited file reads back as the accepted proposal.
    pub const READ_BACK: &str = "read-back";
}

/// Why the harness refused a reply: one type for every harness (the rule and the path).
pub use super::reshape::Refused;

/// A values file of the repository the migration may rewrite.
#[derive(Debug, Clone)]
pub struct ValuesFile {
    pub path: String,
    pub text: String,
    pub value: Value,
    /// Where helm read it: this repository, the head commit, the path.
    pub place: crate::render::source::ValuesFile,
}

/// One chart's migration: the failing helm runs of that chart, the files they layer, and
/// both charts' schemas.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The chart at the new version, as the render names it.
    pub chart: String,
    pub error: String,
    pub new_schema: Value,
    pub new_defaults: Value,
    /// The chart the base deploys, when it has a schema.
    pub old_schema: Option<Value>,
    pub files: Vec<ValuesFile>,
    pub failures: Vec<HelmFailure>,
    /// What the prompt holds back (`model.redact` over the built-in rules).
    pub redaction: crate::model::Rules,
}

/// Whether a helm error is a values schema refusal.
pub fn is_schema_refusal(message: &str) -> bool {
    message.contains("values don't meet the specifications") || message.contains("values.schema")
}

fn handoff(open: String, fact: String) -> Handoff {
    Handoff {
        open,
        choice:
            "which settings to remove, rename or add so the new chart's values schema accepts them"
                .into(),
        fact,
    }
}

/// What the values migration decided.
pub struct Prepared {
    pub rewrites: Vec<Rewrite>,
    /// One comment line per change.
    pub lines: Vec<String>,
}

/// What the migration needs next: the requests, or decided.
pub type Step = super::repair::Step<Prepared>;

/// Decides the migration from the plan and the model's replies so far (one per migration, in
/// order). `render` runs the real helm on a job with the proposed values files substituted
/// (its error is the renderer's, `render::run_helm`'s, of which the harness quotes the first
/// line).
pub fn decide(
    migrations: &[Migration],
    model_configured: bool,
    replies: &[Result<Reply, ModelRefusal>],
    render: &dyn Fn(&HelmJob) -> Result<(), HelmRunError>,
) -> Step {
    if let Some(refusal) = precheck(migrations, model_configured) {
        return Step::Done(Err(refusal));
    }
    let mut prepared = Prepared {
        rewrites: Vec::new(),
        lines: Vec::new(),
    };
    for (index, m) in migrations.iter().enumerate() {
        let Some(reply) = replies.get(index) else {
            return Step::Ask(migrations[index..].iter().map(|m| m.request().0).collect());
        };
        if let Err(refusal) = migrate(m, reply, render, &mut prepared) {
            return Step::Done(Err(refusal));
        }
    }
    Step::Done(Ok(prepared))
}

/// What refuses before any model call: a required key nothing supplies (for the first chart
/// with one), then no model configured.
fn precheck(migrations: &[Migration], model_configured: bool) -> Option<Refusal> {
    for m in migrations {
        let missing = unsuppliable(m);
        if !missing.is_empty() {
            let missing = missing
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            return Some((
                Handoff {
                    open: m.open(),
                    choice: format!("what to set for {missing}"),
                    fact: format!(
                        "{} requires {missing} and nothing supplies a value (no default, not in its values.yaml, not in the old values), so no model was asked",
                        m.chart,
                    ),
                },
                vec![],
            ));
        }
    }
    if !model_configured {
        let open = migrations
            .iter()
            .map(Migration::open)
            .collect::<Vec<_>>()
            .join(", ");
        return Some((
            handoff(
                open,
                format!(
                    "the new chart refuses this repository's values, and a values migration needs a model, which is not configured: {}",
                    migrations
                        .first()
                        .map(|m| m.error.clone())
                        .unwrap_or_default()
                ),
            ),
            vec![],
        ));
    }
    None
}

/// One chart's migration from the model's reply: the harness's verdict, the rewrites added to
/// `prepared` (a file two charts' migrations rewrite is refused) and the comment's lines.
fn migrate(
    m: &Migration,
    reply: &Result<Reply, ModelRefusal>,
    render: &dyn Fn(&HelmJob) -> Result<(), HelmRunError>,
    prepared: &mut Prepared,
) -> Result<(), Refusal> {
    let (_, held) = m.request();
    let refused = |fact: String, details: Vec<String>| (handoff(m.open(), fact), details);
    let reply = reply.as_ref().map_err(|refusal| {
        refused(
            format!(
                "the model's values migration for {} was refused ({refusal}); nothing was pushed",
                m.chart
            ),
            vec![],
        )
    })?;
    let (accepted, written) = check_and_write(m, &reply.value, &held, render).map_err(|by| {
        refused(
            format!(
                "the harness refused the model's values migration for {} (rule {}); nothing was pushed",
                m.chart, by.rule
            ),
            vec![format!("the proposal was refused by {by}")],
        )
    })?;
    if written.is_empty() {
        return Err(refused(
            format!(
                "the model's values migration for {} changes nothing, and the chart refuses the values as they are",
                m.chart
            ),
            vec![],
        ));
    }
    for w in written {
        if prepared.rewrites.iter().any(|r| r.path == w.path) {
            return Err(refused(
                format!(
                    "{} is layered by two charts' migrations; a person decides",
                    w.path
                ),
                vec![],
            ));
        }
        prepared.rewrites.push(w);
    }
    prepared.lines.extend(comment_lines(m, &held, &accepted));
    Ok(())
}

/// The harness on a reply: its rules (`check_reply`), the files rewritten on their own lines,
/// and (d) the real helm rendering the new chart with the bytes that would land.
fn check_and_write(
    m: &Migration,
    reply: &Value,
    held: &crate::model::Held,
    render: &dyn Fn(&HelmJob) -> Result<(), HelmRunError>,
) -> Result<(Vec<AcceptedFile>, Vec<Rewrite>), Refused> {
    let accepted = check_reply(m, reply, held, &[])?;
    let written = rewrites(m, &accepted)?;
    renders(m, &written, render)?;
    Ok((accepted, written))
}

/// The rewrite of each file the accepted proposal changes.
fn rewrites(m: &Migration, accepted: &[AcceptedFile]) -> Result<Vec<Rewrite>, Refused> {
    let mut written = Vec::new();
    for a in accepted {
        let Some(file) = m.files.iter().find(|f| f.path == a.path) else {
            continue;
        };
        if a.values == file.value {
            continue;
        }
        written.push(Rewrite {
            path: a.path.clone(),
            before: file.text.clone(),
            after: rewrite(&a.path, &file.text, &file.value, &a.values)?,
        });
    }
    Ok(written)
}

/// The rule `renders`: every failing run of the chart, its values files as `written` leaves
/// them, renders.
fn renders(
    m: &Migration,
    written: &[Rewrite],
    render: &dyn Fn(&HelmJob) -> Result<(), HelmRunError>,
) -> Result<(), Refused> {
    for failure in &m.failures {
        let mut job = failure.job.clone();
        for input in &mut job.values {
            if let Some(place) = &input.file
                && let Some(file) = m.files.iter().find(|f| &f.place == place)
                && let Some(w) = written.iter().find(|w| w.path == file.path)
            {
                input.content = w.after.clone().into_bytes();
            }
        }
        render(&job).map_err(|e| Refused {
            rule: rule::RENDERS,
            detail: format!(
                "{}: helm does not render the chart with it ({})",
                failure.application,
                e.to_string()
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            ),
        })?;
    }
    Ok(())
}

/// The comment's line for each accepted file that changes: what moved, was removed or set. A
/// sensitive value is named, never shown (the comment and the commit message are read by more
/// people than the file).
fn comment_lines(
    m: &Migration,
    held: &crate::model::Held,
    accepted: &[AcceptedFile],
) -> Vec<String> {
    let shown = |path: &str, value: &Value| {
        if path.split('.').any(|k| m.redaction.key(k)) || held.shows_held(value) {
            "(a sensitive value, not shown)".to_string()
        } else {
            report::text(&short(value))
        }
    };
    let mut lines = Vec::new();
    for a in accepted {
        let mut parts = Vec::new();
        for (from, to, value) in &a.moved {
            parts.push(format!(
                "moved {} = {} to {}",
                report::code(from),
                shown(from, value),
                report::code(to)
            ));
        }
        for (path, value) in &a.dropped {
            parts.push(format!(
                "removed {} = {} (the new chart has no setting for it)",
                report::code(path),
                shown(path, value)
            ));
        }
        for (path, value) in &a.set {
            parts.push(format!(
                "set {} = {} (from the new chart)",
                report::code(path),
                shown(path, value)
            ));
        }
        if !parts.is_empty() {
            let mut line = String::new();
            let _ = write!(line, "{}: {}", report::code(&a.path), parts.join("; "));
            lines.push(line);
        }
    }
    lines
}

#[cfg(test)]
mod tests;
