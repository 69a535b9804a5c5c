//! The repair, one shape for every kind: `plan` (from the head's render and the gate's
//! report), then a pure `decide` (ask the model these requests, or done: a [`Prepared`] or a
//! [`Refusal`]), then one executor ([`execute`]) that makes the model calls, has the applier
//! admit the rewrites, writes them, commits, pushes and comments through a [`Sink`]. The
//! apiVersion swap (with its reshape, `swap.rs`), the values migration (`migrate.rs`) and the
//! scalar fix (`fix.rs`) are its three instances. The triage plugs in the forge
//! (`runner/sink.rs`); `bosun repair` plugs in a local branch and worktree
//! (`bosun::local`). No forge and no git here.

use std::path::Path;

use super::applier::{self, Policy, PolicyError, Rewrite, Scope};
use super::classify::{self, Handoff};
use super::config::{Config, PromotionScope};
use crate::gate::rules::{DroppedServedVersion, NotServed};
use crate::model::{Model, Reply, Request};
use crate::render::{RenderConfig, RenderFailure, Rendering};

mod execute;
mod fix;
mod migrate;
mod swap;

pub use self::execute::{Executed, Sink, execute};
pub use self::fix::{FixRepair, fix_plan};
pub use self::migrate::{MigrationRepair, migration_plan};
pub use self::swap::{Planned, SwapRepair, Swapped, decide};

/// A handoff and the detail lines that go under it.
pub type Refusal = (Handoff, Vec<String>);

/// What a repair needs next: the model's answers to these requests (in order), or nothing
/// more. A function of data (the plan and the replies so far), so the evals and tests can
/// drive it with scripted replies, and the executor only makes calls. `T` is what a repair
/// decides (each kind's own; [`Prepared`] once it is ready to write).
pub enum Step<T = Prepared> {
    /// Ask the model these, one at a time, then decide again with the replies appended.
    Ask(Vec<Request>),
    /// Decided: the rewrites to write, or the handoff (and then nothing is written).
    Done(Result<T, Refusal>),
}

/// A repair ready to write: the rewrites, the commit message and the comment.
pub struct Prepared {
    pub rewrites: Vec<Rewrite>,
    pub message: String,
    pub comment: Comment,
    /// What was done, for a triage's log: `swapped apiVersions in 2 files (3 manifests)`.
    pub done: String,
    /// What was done, counted, for `bosun repair`: `8 manifest(s)`.
    pub summary: String,
    /// One line per change, as `bosun repair` prints them.
    pub changes: Vec<String>,
}

/// Bosun's comment on a repair: the opening names the commit.
pub struct Comment {
    /// The opening paragraph, before and after the commit's short id.
    pub opening: (String, String),
    /// The lines after it (Markdown).
    pub rest: String,
    /// The closing line (not kept when the gate re-runs).
    pub closing: String,
}

impl Comment {
    /// The comment for `commit`: (the repair's paragraph, the whole comment).
    pub fn body(&self, commit: &str) -> (String, String) {
        let repaired = format!(
            "{}`{}`{}{}",
            self.opening.0,
            &commit[..commit.len().min(7)],
            self.opening.1,
            self.rest
        );
        let full = format!("{repaired}{}", self.closing);
        (repaired, full)
    }
}

/// One repair of one head, planned: what the executor needs to run it.
pub trait Repair: Send + Sync {
    /// Model calls `decide` will ask for with a model configured (reserved before the first).
    fn calls_needed(&self, model: bool) -> u32;
    /// The handoff when the model-call cap does not allow `needed` calls.
    fn cap_refusal(&self, needed: u32, hit: &CapHit) -> Refusal;
    /// The replies so far -> the next requests, or the repair decided. Pure but for the
    /// values migration's helm render.
    fn decide(&self, model: bool, replies: &[Result<Reply, crate::model::Refusal>]) -> Step;
    /// The applier's policy the rewrites are admitted under.
    fn policy(&self) -> &Policy;
    /// The choice a person is given when the applier refuses a file.
    fn choice(&self) -> &str;
}

/// What the gate asked to repair (the classified path's evidence).
pub enum Work {
    Swap(Vec<DroppedServedVersion>),
    Migrate,
    Fix(Vec<NotServed>),
}

impl Work {
    /// The handoff's open and choice when the head branch is protected.
    pub fn protected(&self) -> (&'static str, &'static str) {
        match self {
            Work::Swap(_) => (
                "the consumer files the gate's report lists",
                "move each manifest's apiVersion to the version the gate names",
            ),
            _ => (
                "the files the gate's report names",
                "how to repair the change",
            ),
        }
    }
}

/// The head's render (and the merge base's, when a repair needs it): made once per round and
/// passed down; what was not given is rendered here on first use.
pub struct Renders<'a> {
    config: &'a RenderConfig,
    head: String,
    base: String,
    head_render: std::sync::OnceLock<Result<Rendering, RenderFailure>>,
    base_render: std::sync::OnceLock<Option<Rendering>>,
}

impl<'a> Renders<'a> {
    /// Renders of `head` and `base` (the merge base the gate used; "" for none) of the
    /// checkout `config` renders.
    pub fn new(config: &'a RenderConfig, head: &str, base: &str) -> Self {
        Renders {
            config,
            head: head.to_string(),
            base: base.to_string(),
            head_render: Default::default(),
            base_render: Default::default(),
        }
    }

    /// With the renders the gate already made of these commits in this checkout (one of
    /// another commit is left out: a person may have pushed since; one of another checkout
    /// too: a render names its values files by their checkout).
    pub fn kept(self, kept: Option<crate::gate::check::Kept>) -> Self {
        if let Some(kept) = kept.filter(|k| k.repo_dir == self.config.repo_dir) {
            if kept.head == self.head {
                let _ = self.head_render.set(kept.head_render);
            }
            if kept.base == self.base {
                let _ = self.base_render.set(kept.base_render);
            }
        }
        self
    }

    pub fn config(&self) -> &RenderConfig {
        self.config
    }

    pub fn head_revision(&self) -> &str {
        &self.head
    }

    pub fn base_revision(&self) -> &str {
        &self.base
    }

    pub fn head(&self) -> &Result<Rendering, RenderFailure> {
        self.head_render
            .get_or_init(|| crate::render::render(self.config, &self.head))
    }

    /// The base's render, None without a base or when it does not render.
    pub fn base(&self) -> Option<&Rendering> {
        self.base_render
            .get_or_init(|| {
                (!self.base.is_empty())
                    .then(|| crate::render::render(self.config, &self.base).ok())
                    .flatten()
            })
            .as_ref()
    }
}

/// Why a repair could not be planned: the head does not render for Bosun (the gate's
/// question, not a person's), or bosun.yaml's lists do not build.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The swap's head render failed: its first diagnostic.
    #[error("the head does not render: {first}")]
    HeadDoesNotRender { first: String },
    /// The head render the promotion scope is read from failed.
    #[error("{0}")]
    HeadRender(Box<RenderFailure>),
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// What planning gave: a repair to run, a handoff, or (a values migration) a head that
/// renders after all.
pub enum Planning {
    Ready(Box<dyn Repair>),
    Refused(Refusal),
    HeadRenders,
}

/// Plans the repair `work` asks for, on the head `renders` holds (its checkout `renders`'
/// config renders). `report` is the gate's published report. An error is a head the swap
/// cannot render (the gate's question, not a person's).
pub fn plan(
    work: &Work,
    config: &Config,
    renders: &Renders<'_>,
    report: &str,
) -> Result<Planning, PlanError> {
    let redaction = config.model.redaction();
    Ok(match work {
        Work::Swap(dropped) => match swap::plan_on(config, renders, dropped)? {
            Ok(planned) => Planning::Ready(Box::new(SwapRepair::new(
                config, renders, planned, dropped,
            )?)),
            Err(refusal) => Planning::Refused(refusal),
        },
        Work::Fix(not_served) => match fix::plan_on(renders, not_served, report) {
            Ok(mut fix) => {
                fix.redaction = redaction;
                let policy = head_policy(config, renders)?;
                Planning::Ready(Box::new(FixRepair::new(fix, not_served, policy)))
            }
            Err(refusal) => Planning::Refused(refusal),
        },
        Work::Migrate => match migrate::plan_on(renders) {
            Ok(Some(mut migrations)) => {
                for m in &mut migrations {
                    m.redaction = redaction.clone();
                }
                let policy = Policy::new(&config.deny, &config.allow, None)?;
                Planning::Ready(Box::new(MigrationRepair::new(
                    migrations,
                    renders.config().clone(),
                    policy,
                )))
            }
            Ok(None) => Planning::HeadRenders,
            Err(refusal) => Planning::Refused(refusal),
        },
    })
}

/// The applier's policy on the head: the deny/allow lists and, with `promotionScope:
/// deployed`, the files the head's Applications of this repository deploy or render from.
pub fn head_policy(config: &Config, renders: &Renders<'_>) -> Result<Policy, PlanError> {
    let scope = match config.promotion_scope {
        PromotionScope::Deployed => {
            let rendering = renders
                .head()
                .as_ref()
                .map_err(|f| PlanError::HeadRender(Box::new(f.clone())))?;
            Some(scope_of(renders.config(), rendering))
        }
        PromotionScope::Repository => None,
    };
    Ok(Policy::new(&config.deny, &config.allow, scope)?)
}

/// The promotion scope of `rendering`: what Applications of this repository deploy.
fn scope_of(head_config: &RenderConfig, rendering: &Rendering) -> Scope {
    let url = head_config.repo_url.clone().unwrap_or_default();
    Scope::of(rendering, |repo| {
        repo.is_empty()
            || crate::git::normalize_repo_url(repo) == crate::git::normalize_repo_url(&url)
    })
}

/// The applier's admission of prepared rewrites on `tree`: a refusal hands off.
pub fn admit(repair: &dyn Repair, tree: &Path, rewrites: &[Rewrite]) -> Result<(), Refusal> {
    applier::admit_rewrites(tree, repair.policy(), rewrites).map_err(|refusals| {
        (
            classify::applier_handoff(&refusals, repair.choice()),
            vec![],
        )
    })
}

/// Makes one model call and says how it went (`say` hears one line): the one place every
/// model path calls a model.
pub async fn call(
    model: &dyn Model,
    request: &Request,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<Reply, crate::model::Refusal> {
    let reply = model.call(request).await;
    match &reply {
        Ok(reply) => say(format!(
            "model replied for {} ({} tokens in, {} out)",
            request.subject, reply.usage.input_tokens, reply.usage.output_tokens
        )),
        Err(refusal) => say(format!(
            "model call for {} refused: {refusal}",
            request.subject
        )),
    }
    reply
}

/// A model-call cap that does not allow the calls a repair needs: how many were made, the cap,
/// and which cap it is (the pull request's, across its heads, or one head's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapHit {
    pub made: u32,
    pub cap: u32,
    pub per_head: bool,
}

impl std::fmt::Display for CapHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (scope, key) = if self.per_head {
            ("for this head", "model.maxCallsPerHead")
        } else {
            (
                "on this pull request, across its heads",
                "model.maxCallsPerPullRequest",
            )
        };
        write!(
            f,
            "{} of the {} allowed {scope} ({key}) are used",
            self.made, self.cap
        )
    }
}
