//! The scalar fix (the "mechanical fix" of Bosun's comments and docs): a red the render proves,
//! that a scalar fixes. Today that is `kind-not-served-on-cluster` (a chart renders a kind its
//! cluster does not serve, typically because a new chart default turned it on). Bosun builds an
//! inventory of editable keys (each leaf of the values files the Applications layer, each chart
//! default that changed, settable in any of those files, and each version-shaped line of the YAML
//! files the pull request changed); a model classifies and selects edits from it; the harness
//! enforces what the prompt only describes: the key is in the inventory, the value is a scalar, a
//! version-shaped value is one the gate's report names in a machine block (never in its prose), a
//! string comes from the report or the chart's defaults, the file still holds the value the
//! inventory saw, and the edited file reads back with that one key changed. The gate re-runs and
//! judges the result.

use std::collections::BTreeMap;

use serde_json::Value;

use super::applier::Rewrite;
use super::classify::Handoff;
use crate::gate::rules::NotServed;
use crate::model::{Refusal as ModelRefusal, Reply};
use crate::yaml::edit::{self, Segment};

mod harness;
mod inventory;
mod prompt;
mod rewrite;

pub use self::harness::{Edit, check_reply, check_reply_without};
pub use self::inventory::{
    AppInputs, build, changed_defaults, plan, version_shaped, versions_named,
};
pub use self::prompt::{SYSTEM, reply_schema};
pub use self::rewrite::rewrite;

/// The harness's rules, by the name a refusal gives.
pub mod rule {
    /// `{"classification", "edits": [{"file", "key", "value"}]}` and nothing else.
    pub const SHAPE: &str = "reply-shape";
    /// The file and key are an entry of the inventory.
    pub const INVENTORY: &str = "inventory";
    /// The value is one the inventory entry allows (a scalar: a default pinned back, the kind
    /// turned off, a chart's new version), of the type the file holds there; a version also
    /// is one the gate's report names in a machine block.
    pub const SOURCED: &str = "sourced-value";
    /// The file still holds the value the inventory saw.
    pub const FROM_VALUE: &str = "from-value";
    /// The edited file reads back with exactly the edited keys changed.
    pub const READ_BACK: &str = "read-back";
}

/// At most this many edits in one reply.
pub const MAX_EDITS: usize = 10;

/// A key Bosun lets the model set.
#[derive(Debug, Clone, PartialEq)]
pub struct Editable {
    pub file: String,
    pub key: Vec<Segment>,
    /// The value the file holds there now (None: the file does not set it).
    pub current: Option<Value>,
    /// The values this key may take: what the harness allows, whatever the model says.
    pub allowed: Vec<Value>,
}

/// At most this many inventory entries: past it the fix hands off (a prompt of megabytes,
/// and a person reads the report faster).
pub const MAX_INVENTORY: usize = 2000;

/// A YAML file the pull request changed: its text at the head and at the base.
#[derive(Debug, Clone, Default)]
pub struct ChangedFile {
    pub path: String,
    pub text: String,
    pub base: Option<String>,
}

/// A chart default that changed between the base's and the head's chart version.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangedDefault {
    pub chart: String,
    pub from: String,
    pub to: String,
    pub key: Vec<String>,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

/// Everything the fix is decided from.
#[derive(Debug, Clone)]
pub struct Fix {
    pub not_served: Vec<NotServed>,
    pub inventory: Vec<Editable>,
    pub defaults: Vec<ChangedDefault>,
    /// The files the inventory names: path -> text at the head.
    pub files: BTreeMap<String, String>,
    /// The versions the gate's report names in its machine blocks (the `summary` block's
    /// chart moves, image tags and changed defaults): a version-shaped value must be one of
    /// them. Never its prose, which quotes what charts and pull requests wrote.
    pub versions: std::collections::BTreeSet<String>,
    /// What the prompt holds back (`model.redact` over the built-in rules).
    pub redaction: crate::model::Rules,
}

/// Why the harness refused a reply: one type for every harness (the rule and the path).
pub use super::reshape::Refused;

fn key_text(key: &[Segment]) -> String {
    edit::path_text(key)
}

fn value_at<'a>(value: &'a Value, key: &[Segment]) -> Option<&'a Value> {
    let mut node = value;
    for seg in key {
        node = match seg {
            Segment::Key(k) => node.as_object()?.get(k)?,
            Segment::Index(i) => node.as_array()?.get(*i)?,
        };
    }
    Some(node)
}

/// What the scalar fix decided.
pub struct Prepared {
    pub rewrites: Vec<Rewrite>,
    pub edits: Vec<Edit>,
}

/// What the fix needs next: one request, or decided.
pub type Step = super::repair::Step<Prepared>;

/// Decides the fix from the plan and the model's reply (if asked already).
pub fn decide(
    fix: &Fix,
    model_configured: bool,
    reply: Option<&Result<Reply, ModelRefusal>>,
) -> Step {
    let open = fix
        .inventory
        .iter()
        .map(|e| e.file.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
        .join(", ");
    let choice = "stop rendering the object where the cluster does not serve its kind (the key that turns it on), or make the cluster serve it (install its CRD, or list the API in the cluster's inventory entry)";
    let handoff = |fact: String, details: Vec<String>| {
        Step::Done(Err((
            Handoff {
                open: open.clone(),
                choice: choice.into(),
                fact,
            },
            details,
        )))
    };
    let suggestion = fix
        .suggestion()
        .map(|s| format!("; the report suggests: {s}"))
        .unwrap_or_default();
    if !model_configured {
        return handoff(
            format!(
                "a scalar fix needs a model to choose the key, which is not configured{suggestion}"
            ),
            vec![],
        );
    }
    let Some(reply) = reply else {
        return Step::Ask(vec![fix.request()]);
    };
    let reply = match reply {
        Ok(reply) => reply,
        Err(refusal) => {
            return handoff(
                format!(
                    "the model's reply was refused ({refusal}); nothing was pushed{suggestion}"
                ),
                vec![],
            );
        }
    };
    let checked = check_reply(fix, &reply.value).and_then(|edits| {
        let rewrites = rewrite(fix, &edits)?;
        Ok((edits, rewrites))
    });
    match checked {
        Ok((edits, _)) if edits.is_empty() => handoff(
            format!(
                "the model proposed no edit from the inventory of editable keys; nothing was pushed{suggestion}"
            ),
            vec![],
        ),
        Ok((edits, rewrites)) => Step::Done(Ok(Prepared { rewrites, edits })),
        Err(refused) => handoff(
            format!(
                "the harness refused the model's fix (rule {}); nothing was pushed{suggestion}",
                refused.rule
            ),
            vec![format!("the proposal was refused by {refused}")],
        ),
    }
}

#[cfg(test)]
mod tests;
