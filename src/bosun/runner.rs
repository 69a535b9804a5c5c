//! Bosun's runner of a triage: one pull request, round by round. Each round runs the gate (the
//! same code path as `gate publish`), reads the verdict back from the published report only,
//! classifies, acts, and repeats on the commit a repair pushed until the gate has judged it.
//!
//! Its rooms: round.rs the entry and dispatch; setup.rs the render setup (free functions);
//! verdict.rs the gate's published verdict read back (free functions); comments.rs Bosun's
//! words on the pull request (comment, labels, status, hand-offs); model_calls.rs the model-call
//! caps (free functions); green.rs the green paths; sink.rs the forge as a repair's sink;
//! git_ops.rs the checkouts and the git run on them (`Checkouts`).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use super::config::Config;
use crate::forge::{Forge, ForgeError, RepoSlug};
use crate::render::tools::Tool;

mod comments;
mod git_ops;
mod green;
mod model_calls;
mod round;
mod setup;
mod sink;
mod verdict;

pub use self::comments::attempts_of;
pub use self::setup::{remote_cache, render_config};

use self::git_ops::Checkouts;

/// The marker of Bosun's own comment (one per pull request, updated in place).
pub const COMMENT_MARKER: &str = "<!-- bosun:triage v1 -->";
/// Bosun's own commit status. Never `failure`.
pub const STATUS_CONTEXT: &str = "bosun";

#[derive(Debug, thiserror::Error)]
pub enum TriageError {
    #[error("{0} is not a repository in bosun.yaml")]
    UnknownRepository(RepoSlug),
    /// The forge answered 404 (or 410) for the pull request itself: a definite answer.
    #[error("{slug} has no pull request {number} (the forge says {status})")]
    NoSuchPullRequest {
        slug: RepoSlug,
        number: u64,
        status: u16,
    },
    #[error(transparent)]
    Forge(#[from] ForgeError),
    #[error("{0}")]
    Git(String),
    #[error("cluster inventory: {0}")]
    Inventory(String),
    #[error("gate: {0}")]
    Gate(String),
    /// The repair could not be planned on the head (it does not render for Bosun).
    #[error("gate: {0}")]
    Plan(crate::bosun::repair::PlanError),
    #[error("cannot write the repair: {0}")]
    Write(String),
}

/// What one triage did, for logs, the intake's job list and the proving ground's transcript.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub repository: String,
    pub pull_request: u64,
    /// The head the triage started from.
    pub head: String,
    /// The path taken last.
    pub path: RunPath,
    /// Commits Bosun pushed.
    pub pushed: Vec<String>,
    /// What happened, one line each.
    pub lines: Vec<String>,
    /// Seconds from reading the gate's verdict to the repair pushed (the last repair).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair_seconds: Option<f64>,
    /// The comment paragraph of a repair pushed in this run (kept when the gate re-runs).
    #[serde(skip)]
    pub repaired: Option<String>,
}

/// The path a triage took last, by the name the intake's job list and metrics give it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunPath {
    /// None yet (a triage stopped after too many rounds, each of which pushed a repair).
    #[default]
    #[serde(rename = "")]
    Unset,
    /// No verdict to act on yet.
    Wait,
    Green,
    WorthALook,
    /// Green after a repair Bosun pushed (whichever kind).
    Swap,
    Escalate,
    Handoff,
    Closed,
    /// The intake's: a repository Bosun does not serve, or a pull request the forge does not
    /// have.
    Dropped,
    /// The intake's: the triage failed (the forge or git failing); it is tried again.
    Error,
}

impl RunPath {
    pub fn as_str(self) -> &'static str {
        match self {
            RunPath::Unset => "",
            RunPath::Wait => "wait",
            RunPath::Green => "green",
            RunPath::WorthALook => "worth-a-look",
            RunPath::Swap => "swap",
            RunPath::Escalate => "escalate",
            RunPath::Handoff => "handoff",
            RunPath::Closed => "closed",
            RunPath::Dropped => "dropped",
            RunPath::Error => "error",
        }
    }
}

impl std::fmt::Display for RunPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Run {
    fn say(&mut self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!(repository = %self.repository, pr = self.pull_request, "{line}");
        self.lines.push(line);
    }
}

/// Bosun as a triage runs it: bosun.yaml, the forge and the login its token acts as, the tools,
/// the work folder, the model and the release-notes reader.
pub struct Bosun {
    pub config: Config,
    pub forge: Arc<dyn Forge>,
    /// Bosun's forge token (for git over HTTPS).
    pub token: String,
    /// The login the token acts as.
    pub me: String,
    pub helm: Tool,
    pub kubectl: Option<Tool>,
    /// The Kubernetes client for the live inventory (None with a file inventory).
    pub kube: Option<kube::Client>,
    pub workdir: PathBuf,
    /// The model behind the harness (`model.provider: none`: None, the model paths hand off).
    pub model: Option<Arc<dyn crate::model::Model>>,
    /// The release-notes reader (`releaseNotes.enabled: false`: None), with its caches.
    pub notes: Option<Arc<super::notes::Notes>>,
    /// The remote render cache bosun.yaml's `render.cacheUrl` names, read-only.
    pub remote_cache: Option<Arc<crate::remote_cache::RemoteCache>>,
}

impl Bosun {
    /// Bosun's checkouts in its work folder, and the git it runs on them with its token.
    fn checkouts(&self) -> Checkouts<'_> {
        Checkouts {
            config: &self.config,
            workdir: &self.workdir,
            token: &self.token,
        }
    }
}

/// `error` with Bosun's forge token taken out (git echoes URLs, forges echo requests).
fn scrubbed(error: TriageError, token: &str) -> TriageError {
    let text = error.to_string();
    if !token.is_empty() && text.contains(token) {
        TriageError::Git(text.replace(token, "***"))
    } else {
        error
    }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

#[cfg(test)]
mod tests;
