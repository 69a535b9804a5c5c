//! One triage of one pull request: run the gate (the same code path as `gate publish`), read
//! the verdict back from the published report only, classify, act, and repeat on the commit a
//! repair pushed until the gate has judged it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::applier;
use super::classify::{self, Handoff, Path as TriagePath, Situation};
use super::config::{Config, InventoryConfig};
use super::explain;
use super::repair;
use crate::forge::{CommitStatus, Forge, ForgeError, RepoSlug, StatusState, upsert_marked_comment};
use crate::gate::publish::{self, CHECK_NAME};
use crate::gate::report::{self, MARKER, ParsedReport};
use crate::git::Snapshot;
use crate::render::cache::RenderCache;
use crate::render::charts::{self, ChartPulls};
use crate::render::inventory::Inventory;
use crate::render::tools::Tool;
use crate::render::{self, RenderConfig};

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
/// The planners the evals call by their triage names.
pub use super::repair::{fix_plan, migration_plan};

use self::comments::refused_value_places;
use self::git_ops::git;

#[cfg(test)]
use self::git_ops::CREDENTIAL_HELPER;
#[cfg(test)]
use self::model_calls::{
    MODEL_CALLS_COMMENT, MODEL_CALLS_MARK, calls_allowed, model_calls_body, model_calls_made,
};

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
    /// The path taken last: wait, green, worth-a-look, swap, escalate, handoff, closed.
    pub path: String,
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

impl Run {
    fn say(&mut self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!(repository = %self.repository, pr = self.pull_request, "{line}");
        self.lines.push(line);
    }
}

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

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

#[cfg(test)]
mod tests;
