//! The pull-request host, seen through one trait: what the gate and Bosun need from it.
//! `github` implements it over GitHub's REST API, `gitea` over Gitea's (and Forgejo's),
//! `gitlab` over GitLab's v4 (a pull request is a merge request); all share the HTTP plumbing
//! in `http`. Merging and branch protection are not here: the trait
//! Bosun holds cannot merge (the safety model), and administration lives in the ground and
//! xtask.

pub mod gitea;
pub mod github;
pub mod gitlab;
mod http;
mod wire;

use serde::{Deserialize, Serialize};

/// Which forge API a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    /// GitHub's REST API (api.github.com, GitHub Enterprise's `/api/v3`).
    #[default]
    Github,
    /// Gitea's REST API (`/api/v1`), which Forgejo serves too.
    Gitea,
    /// GitLab's REST API v4 (`/api/v4`): merge requests, notes, commit statuses.
    Gitlab,
}

impl ForgeKind {
    /// The client for this API at `api_url`.
    pub fn connect(
        self,
        api_url: &str,
        token: &str,
    ) -> Result<std::sync::Arc<dyn Forge>, ForgeError> {
        Ok(match self {
            ForgeKind::Github => std::sync::Arc::new(github::GitHub::new(api_url, token)?),
            ForgeKind::Gitea => std::sync::Arc::new(gitea::Gitea::new(api_url, token)?),
            ForgeKind::Gitlab => std::sync::Arc::new(gitlab::GitLab::new(api_url, token)?),
        })
    }

    /// Whether the forge has check runs (Gitea and GitLab have commit statuses only).
    pub fn has_check_runs(self) -> bool {
        self == ForgeKind::Github
    }
}

/// A repository on a forge: `owner/name` on GitHub and Gitea; on GitLab a project's full path,
/// where `owner` is its namespace (`group`, or `group/sub/...` for a project in a subgroup) and
/// `name` the project's own path. Displayed as the full path, `owner/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RepoSlug {
    pub owner: String,
    pub name: String,
}

/// `OWNER/NAME` as GitHub and Gitea name a repository: two segments of ASCII letters, digits,
/// `-`, `_` and `.` (GitHub's and Gitea's own rules: `alphaDashDot`), neither `.` nor `..`.
/// A longer path is GitLab's (a project in a subgroup): [`RepoSlug::for_forge`].
impl std::str::FromStr for RepoSlug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shown = || s.chars().take(80).collect::<String>();
        let segment_ok = |part: &str| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        match s.split_once('/') {
            Some((owner, name)) if name.contains('/') && segment_ok(owner) => Err(format!(
                "{:?} is not OWNER/NAME: a GitHub or Gitea repository has one owner (a path of subgroups names a GitLab project: --forge gitlab, forge.kind: gitlab)",
                shown()
            )),
            Some((owner, name)) if segment_ok(owner) && segment_ok(name) => Ok(RepoSlug {
                owner: owner.to_string(),
                name: name.to_string(),
            }),
            _ => Err(format!(
                "{:?} is not OWNER/NAME (letters, digits, '-', '_' and '.')",
                shown()
            )),
        }
    }
}

impl RepoSlug {
    /// The repository `text` names on a forge of `kind`: exactly `OWNER/NAME` on GitHub and
    /// Gitea; on GitLab a project's full path, `group/project` or `group/sub/.../project`
    /// ([`gitlab::project_path`]). The error is one line naming the text.
    pub fn for_forge(kind: ForgeKind, text: &str) -> Result<RepoSlug, SlugError> {
        match kind {
            ForgeKind::Github | ForgeKind::Gitea => text.parse(),
            ForgeKind::Gitlab => gitlab::project_path(text),
        }
        .map_err(SlugError)
    }

    /// Whether two slugs name the same repository on a forge that ignores ASCII case in names
    /// (GitHub, Gitea and GitLab all do).
    pub fn same_ignoring_case(&self, other: &RepoSlug) -> bool {
        self.owner.eq_ignore_ascii_case(&other.owner) && self.name.eq_ignore_ascii_case(&other.name)
    }
}

/// Text that names no repository the forge could have: one line saying why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SlugError(pub String);

impl std::fmt::Display for RepoSlug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    pub number: u64,
    pub state: String,
    pub title: String,
    pub author: String,
    pub head_sha: String,
    pub head_ref: String,
    /// `owner/name` of the repository the head branch lives in (a fork when it differs).
    pub head_repo: String,
    pub base_sha: String,
    pub base_ref: String,
    pub labels: Vec<String>,
    pub merged: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comment {
    pub id: u64,
    pub author: String,
    pub body: String,
}

/// One page of a walk over a pull request's comments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommentPage {
    /// In the walk's order: newest first when `newest_first`, else oldest first.
    pub comments: Vec<Comment>,
    pub newest_first: bool,
    /// The bytes read for this page (every request it took).
    pub bytes: usize,
    /// The page to ask for next; `None`: the walk has seen every comment.
    pub next: Option<u64>,
}

/// The most bytes of comments one reader reads (a page past it is not asked for): a pull
/// request's comments are anyone's to write, a gigabyte of them included.
pub const COMMENT_READ_BUDGET: usize = 2 * 1024 * 1024;

/// What a bounded comment walk found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommentSearch {
    /// The comments kept, newest first, at most as many as wanted.
    pub found: Vec<Comment>,
    /// Every comment of the pull request was seen (false: the budget ended the walk first).
    pub complete: bool,
    pub bytes: usize,
}

impl CommentSearch {
    /// Whether the walk can say there is no such comment (it found none and saw them all).
    pub fn surely_none(&self) -> bool {
        self.found.is_empty() && self.complete
    }
}

/// Walks a pull request's comments page by page, newest first where the forge allows, keeping
/// those `keep` accepts: it stops once `wanted` are kept on a newest-first walk, at the last
/// page, or once `budget` bytes have been read. Only one page and the kept comments are held.
pub async fn find_comments(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    budget: usize,
    wanted: usize,
    keep: impl Fn(&Comment) -> bool,
) -> Result<CommentSearch, ForgeError> {
    // Never more pages than the budget pays for at a kilobyte a page (empty pages included).
    const PAGE_COST: usize = 1024;
    let mut search = CommentSearch::default();
    let mut page = None;
    let mut spent = 0usize;
    loop {
        let answer = forge.comment_page(repo, number, page).await?;
        search.bytes += answer.bytes;
        spent += answer.bytes.max(PAGE_COST);
        for comment in answer.comments {
            if keep(&comment) {
                if answer.newest_first {
                    search.found.push(comment);
                } else {
                    // Oldest first: the newest `wanted` so far, newest first.
                    search.found.insert(0, comment);
                    search.found.truncate(wanted);
                }
            }
        }
        if answer.newest_first && search.found.len() >= wanted {
            search.found.truncate(wanted);
            return Ok(search);
        }
        match answer.next {
            None => {
                search.complete = true;
                return Ok(search);
            }
            Some(_) if spent >= budget => return Ok(search),
            next => page = next,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Conclusion {
    Success,
    Failure,
    Neutral,
}

/// A completed check run (the gate publishes the verdict as one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRun {
    pub name: String,
    pub head_sha: String,
    pub conclusion: Conclusion,
    pub title: String,
    pub summary: String,
    /// The publisher's own reference (the gate writes its report's digest here).
    #[serde(default)]
    pub external_id: String,
    /// Read back: the slug of the app that wrote the run (ignored when writing).
    #[serde(default)]
    pub app: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusState {
    Pending,
    Success,
    Failure,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitStatus {
    pub context: String,
    pub state: StatusState,
    pub description: String,
    /// Read back: the login that set the status (ignored when writing).
    #[serde(default)]
    pub creator: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("{method} {path}: HTTP {status}: {message}")]
    Http {
        method: String,
        path: String,
        status: u16,
        message: String,
    },
    #[error("{method} {path}: {message}")]
    Transport {
        method: String,
        path: String,
        message: String,
    },
    #[error("{method} {path}: unexpected response: {message}")]
    Decode {
        method: String,
        path: String,
        message: String,
    },
    /// The forge has no such thing (Gitea has no check runs).
    #[error("{what}")]
    Unsupported { what: String },
}

/// A pull request as a forge answered it, refused unless its head and base are commit ids
/// (a hostile or broken forge could answer `--upload-pack=...` as a head).
pub(crate) fn checked_pull(pull: PullRequest, path: &str) -> Result<PullRequest, ForgeError> {
    for (field, sha) in [("head.sha", &pull.head_sha), ("base.sha", &pull.base_sha)] {
        if !crate::git::is_commit_id(sha) {
            return Err(ForgeError::Decode {
                method: "GET".into(),
                path: path.to_string(),
                message: format!(
                    "{field} {:?} is not a commit id (40 or 64 lowercase hex digits)",
                    sha.chars().take(80).collect::<String>()
                ),
            });
        }
    }
    Ok(pull)
}

impl ForgeError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ForgeError::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// What the gate and Bosun need from a pull-request host.
#[async_trait::async_trait]
pub trait Forge: Send + Sync {
    /// The login the credentials act as (the author of the comments this tool writes).
    async fn current_user(&self) -> Result<String, ForgeError>;
    async fn pull_request(&self, repo: &RepoSlug, number: u64) -> Result<PullRequest, ForgeError>;
    async fn comments(&self, repo: &RepoSlug, number: u64) -> Result<Vec<Comment>, ForgeError>;
    /// One page of a walk over a pull request's comments (`page: None` starts it), newest
    /// first where the forge can: what every reader in the product uses ([`find_comments`]).
    async fn comment_page(
        &self,
        repo: &RepoSlug,
        number: u64,
        page: Option<u64>,
    ) -> Result<CommentPage, ForgeError>;
    async fn create_comment(
        &self,
        repo: &RepoSlug,
        number: u64,
        body: &str,
    ) -> Result<Comment, ForgeError>;
    async fn update_comment(
        &self,
        repo: &RepoSlug,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError>;
    /// Creates the check run, or updates the one with the same name on the same commit.
    async fn upsert_check_run(&self, repo: &RepoSlug, run: &CheckRun) -> Result<u64, ForgeError>;
    async fn check_runs(&self, repo: &RepoSlug, sha: &str) -> Result<Vec<CheckRun>, ForgeError>;
    async fn set_status(
        &self,
        repo: &RepoSlug,
        sha: &str,
        status: &CommitStatus,
    ) -> Result<(), ForgeError>;
    async fn statuses(&self, repo: &RepoSlug, sha: &str) -> Result<Vec<CommitStatus>, ForgeError>;
    async fn add_labels(
        &self,
        repo: &RepoSlug,
        number: u64,
        labels: &[String],
    ) -> Result<(), ForgeError>;
    async fn remove_label(
        &self,
        repo: &RepoSlug,
        number: u64,
        label: &str,
    ) -> Result<(), ForgeError>;
}

/// Finds this tool's own comment (by marker and author, the newest) and updates it, or creates
/// it: never a second comment for the same marker while the walk can find the first within
/// [`COMMENT_READ_BUDGET`]; past it (more comments after it than the budget reads), a new one
/// is created, and being the newest it is the one found next time. A write answered with a
/// 5xx or lost in transport is tried again (up to three times): the comments are walked again
/// first, so a POST that landed after all is found and not repeated.
pub async fn upsert_marked_comment(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    marker: &str,
    body: &str,
) -> Result<Comment, ForgeError> {
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match upsert_once(forge, repo, number, author, marker, body).await {
            Err(e)
                if attempt < 3
                    && (matches!(e, ForgeError::Transport { .. })
                        || e.status().is_some_and(|s| s >= 500)) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(250 * u64::from(attempt)))
                    .await;
            }
            result => return result,
        }
    }
}

async fn upsert_once(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    marker: &str,
    body: &str,
) -> Result<Comment, ForgeError> {
    let existing = find_comments(forge, repo, number, COMMENT_READ_BUDGET, 1, |c| {
        c.author == author && c.body.starts_with(marker)
    })
    .await?
    .found
    .into_iter()
    .next();
    match existing {
        Some(comment) if comment.body == body => Ok(comment),
        Some(comment) => forge.update_comment(repo, comment.id, body).await,
        None => forge.create_comment(repo, number, body).await,
    }
}
