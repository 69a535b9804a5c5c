//! The forge over GitLab's REST API v4 (`https://gitlab.example/api/v4`, gitlab.com's
//! `https://gitlab.com/api/v4`). A pull request is a merge request, named by the project's
//! full path (URL-encoded as one segment: `platform%2Fgitops`, or `platform%2Fteam%2Fgitops`
//! for a project in a subgroup) and its `iid`; what differs from GitHub is handled here, each
//! cited to GitLab's documentation (`doc/api/...`) or source:
//!
//! - a project's path is a namespace (a group, up to 20 levels of subgroups, or a user) and
//!   the project's own path ([`project_path`] checks one before anything uses it);
//! - a personal, project or group access token goes as `PRIVATE-TOKEN: <token>`, an OAuth
//!   token as `Authorization: Bearer <token>` (`doc/api/rest/authentication.md`);
//! - lists page with `page` and `per_page` (at most 100) and name the next page in
//!   `x-next-page`, empty on the last (`doc/api/rest/_index.md`, "Pagination"); `x-total` is
//!   left out past 10,000 items, so the walk follows `x-next-page` only;
//! - comments are notes; a merge request's notes come newest first (`sort=desc`, the default:
//!   `doc/api/notes.md`), and system notes ("added label ...", written under the acting user's
//!   name) are never read as comments; a note is updated by `PUT` under its merge request, so
//!   the client keeps which merge request each note it has read or written belongs to;
//! - a note holds at most [`NOTE_LIMIT`] characters (`Gitlab::Database::MAX_TEXT_SIZE_LIMIT`
//!   in `lib/gitlab/database.rb`, validated by `app/models/note.rb`); the report is clipped to
//!   GitHub's smaller [`COMMENT_LIMIT`], so it always fits;
//! - labels are project labels, named by title (no commas: `app/models/label.rb`); they are
//!   created first when the project lacks them, then added with `add_labels` on the merge
//!   request (`doc/api/merge_requests.md`, "Update MR");
//! - there are no check runs: the gate's verdict is a commit status with `name: addons-gate`
//!   (`doc/api/commits.md`, "Set the pipeline status of a commit"); its states are pending,
//!   running, success, failed and canceled (and skipped); a status already `pending` (or
//!   `running`) cannot be set to the same state again: GitLab answers 400 "Cannot transition
//!   status via :enqueue from :pending", which this client takes as done;
//! - a rate limit is 429 with `retry-after` and `ratelimit-reset` (the shared transport).
//!
//! Merging, approvals and "Pipelines must succeed" are administration, outside the trait.

use std::collections::HashMap;
use std::sync::Mutex;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::http::{Answer, Dialect, Http, cap, decode, segment};
use super::{
    CheckRun, Comment, CommentPage, CommitStatus, Forge, ForgeError, PullRequest, RepoSlug,
    StatusState,
};

/// GitLab's limit for a note's body, in characters (`MAX_TEXT_SIZE_LIMIT = 1_000_000`,
/// lib/gitlab/database.rb; `validates :note, length: { maximum: ... }`, app/models/note.rb).
pub const NOTE_LIMIT: usize = 1_000_000;

// GitHub's comment limit, the one the report is clipped to.
use crate::gate::report::COMMENT_LIMIT;

// The report's clipping honours GitLab's limit because it honours GitHub's smaller one.
const _: () = assert!(COMMENT_LIMIT <= NOTE_LIMIT);

/// Items a page (GitLab's maximum `per_page`).
const PAGE: usize = 100;

/// Notes a page when walking them newest first (as GitHub's walk: a page of large notes stays
/// well under the read budget).
const NOTE_PAGE: usize = 50;

/// Never more pages than this in one list (10,000 items at [`PAGE`]).
const MAX_PAGES: u64 = 100;

/// GitLab keeps a commit status's description in a 255-character column.
const DESCRIPTION_MAX: usize = 255;

/// The colour of a label this client creates (GitLab requires one).
const LABEL_COLOR: &str = "#ededed";

/// Personal, project and group access tokens.
const PRIVATE_TOKEN: Dialect = Dialect {
    auth_header: "PRIVATE-TOKEN",
    auth_scheme: "",
    headers: &[("Accept", "application/json")],
};

/// OAuth 2.0 tokens.
const OAUTH: Dialect = Dialect {
    auth_header: "Authorization",
    auth_scheme: "Bearer",
    headers: &[("Accept", "application/json")],
};

/// How a token is marked as an OAuth token where only a string is given (`--token-env`,
/// bosun.yaml): `oauth2:<token>`, the user name GitLab's git over HTTPS takes OAuth tokens with.
pub const OAUTH_PREFIX: &str = "oauth2:";

pub struct GitLab {
    http: Http,
    /// Note id -> the merge request iid it belongs to (GitLab edits a note under its merge
    /// request; the trait names the note only).
    notes: Mutex<HashMap<u64, u64>>,
}

impl GitLab {
    /// `base` is the API root, `/api/v4` included: `https://gitlab.example/api/v4`. The token
    /// is an access token (sent as `PRIVATE-TOKEN`), or an OAuth token when it starts with
    /// [`OAUTH_PREFIX`] (sent as `Authorization: Bearer`).
    pub fn new(base: &str, token: &str) -> Result<GitLab, ForgeError> {
        let (token, dialect) = match token.strip_prefix(OAUTH_PREFIX) {
            Some(oauth) => (oauth, OAUTH),
            None => (token, PRIVATE_TOKEN),
        };
        Ok(GitLab {
            http: Http::new(base, token, dialect)?,
            notes: Mutex::new(HashMap::new()),
        })
    }

    fn remember(&self, note: u64, iid: u64) {
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(note, iid);
    }

    /// Every item of a list, following `x-next-page` (a next page must be later than the one
    /// read: a server that loops is stopped), at most [`MAX_PAGES`] pages.
    async fn list(&self, path: &str) -> Result<Vec<Value>, ForgeError> {
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut all = Vec::new();
        let mut page = 1u64;
        for _ in 0..MAX_PAGES {
            let answer = self
                .http
                .exchange(
                    Method::GET,
                    &format!("{path}{separator}per_page={PAGE}&page={page}"),
                    None,
                )
                .await?;
            let next = answer.next_page;
            all.extend(items(answer, path)?);
            match next {
                Some(next) if next > page => page = next,
                _ => return Ok(all),
            }
        }
        Err(ForgeError::Decode {
            method: "GET".into(),
            path: path.into(),
            message: format!("more than {MAX_PAGES} pages: refusing to read further"),
        })
    }

    async fn project_labels(&self, project: &str) -> Result<Vec<String>, ForgeError> {
        let path = format!("/projects/{project}/labels");
        self.list(&path)
            .await?
            .into_iter()
            .map(|v| decode::<LabelPayload>(v, "GET", &path).map(|l| l.name))
            .collect()
    }

    /// The files a merge request changes, with their diffs (`GET .../diffs`, GitLab 15.7+,
    /// paged; `doc/api/merge_requests.md`, "List merge request diffs"), at most `budget`
    /// bytes of answers read: past it, `complete` is false. Paths are the forge's text:
    /// the caller checks them before using one as a path.
    pub async fn diffs(
        &self,
        repo: &RepoSlug,
        iid: u64,
        budget: usize,
    ) -> Result<MergeRequestDiffs, ForgeError> {
        let path = format!("/projects/{}/merge_requests/{iid}/diffs", project(repo));
        let mut out = MergeRequestDiffs::default();
        let mut page = 1u64;
        for _ in 0..MAX_PAGES {
            let answer = self
                .http
                .exchange(
                    Method::GET,
                    &format!("{path}?per_page={PAGE}&page={page}"),
                    None,
                )
                .await?;
            out.bytes += answer.bytes;
            let next = answer.next_page;
            for value in items(answer, &path)? {
                out.files.push(decode(value, "GET", &path)?);
            }
            match next {
                Some(next) if next > page && out.bytes < budget => page = next,
                Some(next) if next > page => return Ok(out),
                _ => {
                    out.complete = true;
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }
}

/// A merge request's changed files, as [`GitLab::diffs`] read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeRequestDiffs {
    pub files: Vec<FileDiff>,
    /// Every page was read (false: the byte budget ended the walk).
    pub complete: bool,
    pub bytes: usize,
}

/// One changed file of a merge request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileDiff {
    pub old_path: String,
    pub new_path: String,
    #[serde(default)]
    pub diff: String,
    #[serde(default)]
    pub new_file: bool,
    #[serde(default)]
    pub renamed_file: bool,
    #[serde(default)]
    pub deleted_file: bool,
}

/// The project as a path parameter: its full path, URL-encoded as one segment
/// (`platform%2Fgitops`, `platform%2Fteam%2Fgitops` in a subgroup). GitLab's API routes take
/// `:id` as one segment (`NO_SLASH_URL_PART_REGEX`, lib/api/api.rb; `doc/api/rest/_index.md`,
/// "Namespaced paths"): a path with its slashes left in is another route, a 404.
fn project(repo: &RepoSlug) -> String {
    segment(&repo.to_string())
}

/// The longest full path of a namespace or a project, in characters (`app/models/route.rb`:
/// `validates :path, length: { within: 1..255 }`).
pub const MAX_PATH: usize = 255;

/// The most groups above a group: a top-level group and up to 20 levels of subgroups below it
/// (`Namespace::NUMBER_OF_ANCESTORS_ALLOWED = 20`, `nesting_level_allowed` in
/// app/models/namespace.rb, not applied to a project's own namespace;
/// `doc/user/group/subgroups/_index.md`: "nested up to 20 levels").
pub const MAX_ANCESTORS: usize = 20;

/// The most segments of a project's full path: the top-level group, [`MAX_ANCESTORS`] levels
/// of subgroups, the project.
pub const MAX_SEGMENTS: usize = MAX_ANCESTORS + 2;

/// A project's full path as GitLab allows it, as the slug the client names it by (the
/// namespace as `owner`, the project's own path as `name`): `group/project` or
/// `group/sub/.../project`, at most [`MAX_SEGMENTS`] segments and [`MAX_PATH`] characters.
/// Each segment is what `lib/gitlab/path_regex.rb` and `doc/user/reserved_names.md` allow,
/// held a little tighter: ASCII letters, digits, `_`, `-` and `.`, starting with a letter, a
/// digit or `_`, without `..`, not ending in `.git` or `.atom`. Anything else (an empty
/// segment, a leading or trailing `/`, `%`, a control character) is refused with one line
/// naming the text and why.
pub fn project_path(text: &str) -> Result<RepoSlug, String> {
    let refuse = |why: String| {
        Err(format!(
            "{:?} is not a GitLab project path (GROUP/PROJECT or GROUP/SUBGROUP/.../PROJECT): {why}",
            text.chars().take(80).collect::<String>()
        ))
    };
    let length = text.chars().count();
    if length > MAX_PATH {
        return refuse(format!(
            "{length} characters, and GitLab's paths are at most {MAX_PATH}"
        ));
    }
    if text.starts_with('/') || text.ends_with('/') {
        return refuse("it starts or ends with '/'".into());
    }
    let segments: Vec<&str> = text.split('/').collect();
    if segments.len() < 2 {
        return refuse("no group: a project lives in a group or a user's namespace".into());
    }
    if segments.len() > MAX_SEGMENTS {
        return refuse(format!(
            "{} groups deep, and GitLab nests at most {MAX_ANCESTORS} levels of subgroups below a top-level group",
            segments.len() - 1
        ));
    }
    for segment in &segments {
        let mut bytes = segment.bytes();
        let why = if segment.is_empty() {
            "an empty segment ('//')".to_string()
        } else if segment.contains("..") {
            format!("the segment {segment:?} holds '..'")
        } else if !bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            format!("the segment {segment:?} starts with neither a letter, a digit nor '_'")
        } else if !bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
            format!(
                "the segment {segment:?} holds a character other than letters, digits, '_', '-' and '.'"
            )
        } else if segment.ends_with(".git") || segment.ends_with(".atom") {
            format!("the segment {segment:?} ends in .git or .atom")
        } else {
            continue;
        };
        return refuse(why);
    }
    let (namespace, name) = text.rsplit_once('/').unwrap_or_default();
    Ok(RepoSlug {
        owner: namespace.to_string(),
        name: name.to_string(),
    })
}

fn items(answer: Answer, path: &str) -> Result<Vec<Value>, ForgeError> {
    match answer.body {
        Value::Array(items) => Ok(items),
        Value::Null => Ok(Vec::new()),
        other => Err(ForgeError::Decode {
            method: "GET".into(),
            path: path.into(),
            message: format!(
                "expected a list, got {}",
                other.to_string().chars().take(80).collect::<String>()
            ),
        }),
    }
}

#[derive(Deserialize)]
struct UserPayload {
    username: String,
}

#[derive(Deserialize)]
struct LabelPayload {
    name: String,
}

#[derive(Deserialize)]
struct NotePayload {
    id: u64,
    #[serde(default)]
    body: String,
    author: UserPayload,
    /// GitLab's own notes (label changes, pushes), attributed to the user who acted.
    #[serde(default)]
    system: bool,
}

impl From<NotePayload> for Comment {
    fn from(n: NotePayload) -> Self {
        Comment {
            id: n.id,
            author: n.author.username,
            body: n.body,
        }
    }
}

#[derive(Deserialize)]
struct DiffRefs {
    #[serde(default)]
    start_sha: Option<String>,
    #[serde(default)]
    head_sha: Option<String>,
}

#[derive(Deserialize)]
struct MergeRequestPayload {
    iid: u64,
    state: String,
    title: String,
    author: UserPayload,
    #[serde(default)]
    sha: Option<String>,
    source_branch: String,
    target_branch: String,
    source_project_id: u64,
    target_project_id: u64,
    #[serde(default)]
    diff_refs: Option<DiffRefs>,
    #[serde(default)]
    labels: Vec<String>,
}

#[derive(Deserialize)]
struct ProjectPayload {
    path_with_namespace: String,
}

#[derive(Deserialize)]
struct StatusPayload {
    id: u64,
    name: String,
    /// created, waiting_for_resource, preparing, pending, running, success, failed, canceled,
    /// skipped, manual, scheduled: kept as text so a new one cannot fail the read.
    status: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    author: Option<UserPayload>,
}

/// A GitLab state as the trait's: only `success` is a success; what still runs is pending;
/// `canceled` is an error; anything else (failed, skipped, unknown) a failure.
fn state_of(text: &str) -> StatusState {
    match text {
        "success" => StatusState::Success,
        "created" | "waiting_for_resource" | "preparing" | "pending" | "running" => {
            StatusState::Pending
        }
        "canceled" => StatusState::Error,
        _ => StatusState::Failure,
    }
}

/// The state GitLab is asked to set: it has no `error`, so an undecided gate is `failed`.
fn state_text(state: StatusState) -> &'static str {
    match state {
        StatusState::Pending => "pending",
        StatusState::Success => "success",
        StatusState::Failure | StatusState::Error => "failed",
    }
}

/// A note body GitLab takes and runs nothing of: at most [`NOTE_LIMIT`] characters, and no
/// line outside a fenced code block that opens with `/` and a letter, which GitLab would run
/// as a quick action (`/merge`, `/approve`, `/label`, ...) as the token's user
/// (`doc/user/project/quick_actions.md`). The gate's report puts hostile text on one line
/// after its own words, so such a line means a bug: refused, never sent.
fn check_note(body: &str) -> Result<(), ForgeError> {
    let count = body.chars().count();
    if count > NOTE_LIMIT {
        return Err(ForgeError::Unsupported {
            what: format!("a note of {count} characters: GitLab keeps at most {NOTE_LIMIT}"),
        });
    }
    let mut fence: Option<&str> = None;
    for line in body.lines() {
        let trimmed = line.trim_start();
        for marker in ["```", "~~~"] {
            if trimmed.starts_with(marker) {
                fence = match fence {
                    Some(open) if open == marker => None,
                    None => Some(marker),
                    other => other,
                };
            }
        }
        let mut chars = trimmed.chars();
        if fence.is_none()
            && chars.next() == Some('/')
            && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        {
            return Err(ForgeError::Unsupported {
                what: format!(
                    "a note with the line {:?}: GitLab would run it as a quick action",
                    trimmed.chars().take(80).collect::<String>()
                ),
            });
        }
    }
    Ok(())
}

/// A label title GitLab can hold and `add_labels` can carry (a comma-separated list).
fn check_label(name: &str) -> Result<(), ForgeError> {
    if name.is_empty() || name.contains(',') || name.chars().count() > 255 {
        return Err(ForgeError::Unsupported {
            what: format!(
                "label {:?}: GitLab label titles are 1 to 255 characters without commas",
                name.chars().take(80).collect::<String>()
            ),
        });
    }
    Ok(())
}

#[async_trait::async_trait]
impl Forge for GitLab {
    async fn current_user(&self) -> Result<String, ForgeError> {
        let user: UserPayload = self.http.call(Method::GET, "/user", None).await?;
        Ok(user.username)
    }

    /// `GET /projects/:id/merge_requests/:iid`. The head is `sha`, the base the target
    /// branch's commit the diff was made against (`diff_refs.start_sha`); a merge request
    /// GitLab is still preparing has no `diff_refs` and is refused (not judged on a guess).
    /// `opened` reads as `open`, `merged` as closed and merged. The head's repository is the
    /// project for a branch of the project, the source project's path for a fork.
    async fn pull_request(&self, repo: &RepoSlug, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("/projects/{}/merge_requests/{number}", project(repo));
        let mr: MergeRequestPayload = self.http.call(Method::GET, &path, None).await?;
        let head_repo = if mr.source_project_id == mr.target_project_id {
            repo.to_string()
        } else {
            let source = format!("/projects/{}", mr.source_project_id);
            match self
                .http
                .call::<ProjectPayload>(Method::GET, &source, None)
                .await
            {
                Ok(p) if p.path_with_namespace != repo.to_string() => p.path_with_namespace,
                // A fork the token cannot read (or one claiming to be the project): no
                // repository named, so nothing is ever pushed to it.
                _ => String::new(),
            }
        };
        let refs = mr.diff_refs.unwrap_or(DiffRefs {
            start_sha: None,
            head_sha: None,
        });
        let head_sha = mr.sha.or(refs.head_sha).unwrap_or_default();
        let merged = mr.state == "merged";
        let state = if mr.state == "opened" {
            "open"
        } else {
            "closed"
        };
        let pull = PullRequest {
            number: mr.iid,
            state: state.to_string(),
            title: mr.title,
            author: mr.author.username,
            head_sha,
            head_ref: mr.source_branch,
            head_repo,
            base_sha: refs.start_sha.unwrap_or_default(),
            base_ref: mr.target_branch,
            labels: mr.labels,
            merged,
        };
        super::checked_pull(pull, &path)
    }

    async fn comments(&self, repo: &RepoSlug, number: u64) -> Result<Vec<Comment>, ForgeError> {
        let path = format!(
            "/projects/{}/merge_requests/{number}/notes?sort=asc&order_by=created_at",
            project(repo)
        );
        let mut comments = Vec::new();
        for value in self.list(&path).await? {
            let note: NotePayload = decode(value, "GET", &path)?;
            if !note.system {
                self.remember(note.id, number);
                comments.push(note.into());
            }
        }
        Ok(comments)
    }

    /// Newest first, natively: `sort=desc&order_by=created_at`, the next page from
    /// `x-next-page`.
    async fn comment_page(
        &self,
        repo: &RepoSlug,
        number: u64,
        page: Option<u64>,
    ) -> Result<CommentPage, ForgeError> {
        let page = page.unwrap_or(1);
        let path = format!("/projects/{}/merge_requests/{number}/notes", project(repo));
        let answer = self
            .http
            .exchange(
                Method::GET,
                &format!("{path}?sort=desc&order_by=created_at&per_page={NOTE_PAGE}&page={page}"),
                None,
            )
            .await?;
        let bytes = answer.bytes;
        let next = answer.next_page.filter(|n| *n > page);
        let mut comments = Vec::new();
        for value in items(answer, &path)? {
            let note: NotePayload = decode(value, "GET", &path)?;
            if !note.system {
                self.remember(note.id, number);
                comments.push(note.into());
            }
        }
        Ok(CommentPage {
            comments,
            newest_first: true,
            bytes,
            next,
        })
    }

    async fn create_comment(
        &self,
        repo: &RepoSlug,
        number: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        check_note(body)?;
        let path = format!("/projects/{}/merge_requests/{number}/notes", project(repo));
        let note: NotePayload = self
            .http
            .call(Method::POST, &path, Some(&json!({"body": body})))
            .await?;
        self.remember(note.id, number);
        Ok(note.into())
    }

    async fn update_comment(
        &self,
        repo: &RepoSlug,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        check_note(body)?;
        let iid = self
            .notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&comment_id)
            .copied();
        let Some(iid) = iid else {
            return Err(ForgeError::Unsupported {
                what: format!(
                    "note {comment_id} on {repo}: GitLab edits a note under its merge request, and this client has not read that note"
                ),
            });
        };
        let path = format!(
            "/projects/{}/merge_requests/{iid}/notes/{comment_id}",
            project(repo)
        );
        let note: NotePayload = self
            .http
            .call(Method::PUT, &path, Some(&json!({"body": body})))
            .await?;
        Ok(note.into())
    }

    async fn upsert_check_run(&self, _repo: &RepoSlug, run: &CheckRun) -> Result<u64, ForgeError> {
        Err(ForgeError::Unsupported {
            what: format!(
                "check run {:?}: GitLab has no check runs; publish the verdict as a commit status (checkMode: status)",
                run.name
            ),
        })
    }

    async fn check_runs(&self, _repo: &RepoSlug, _sha: &str) -> Result<Vec<CheckRun>, ForgeError> {
        Ok(Vec::new())
    }

    async fn set_status(
        &self,
        repo: &RepoSlug,
        sha: &str,
        status: &CommitStatus,
    ) -> Result<(), ForgeError> {
        let path = format!("/projects/{}/statuses/{sha}", project(repo));
        let body = json!({
            "state": state_text(status.state),
            "name": status.context,
            "description": cap(&status.description, DESCRIPTION_MAX),
        });
        match self.http.request(Method::POST, &path, Some(&body)).await {
            // Already in that state (pending or running again): GitLab refuses the
            // transition, and the status stands as asked.
            Err(ForgeError::Http {
                status: 400,
                message,
                ..
            }) if message.starts_with("Cannot transition status") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn statuses(&self, repo: &RepoSlug, sha: &str) -> Result<Vec<CommitStatus>, ForgeError> {
        // The newest (highest id) per name stands.
        let path = format!(
            "/projects/{}/repository/commits/{sha}/statuses",
            project(repo)
        );
        let mut latest: std::collections::BTreeMap<String, StatusPayload> = Default::default();
        for value in self.list(&path).await? {
            let status: StatusPayload = decode(value, "GET", &path)?;
            if latest
                .get(&status.name)
                .is_none_or(|seen| seen.id < status.id)
            {
                latest.insert(status.name.clone(), status);
            }
        }
        Ok(latest
            .into_values()
            .map(|s| CommitStatus {
                state: state_of(&s.status),
                context: s.name,
                description: s.description.unwrap_or_default(),
                creator: s.author.map(|u| u.username).unwrap_or_default(),
            })
            .collect())
    }

    async fn add_labels(
        &self,
        repo: &RepoSlug,
        number: u64,
        labels: &[String],
    ) -> Result<(), ForgeError> {
        if labels.is_empty() {
            return Ok(());
        }
        for name in labels {
            check_label(name)?;
        }
        let project = project(repo);
        let mut known = self.project_labels(&project).await?;
        for name in labels {
            if !known.contains(name) {
                let path = format!("/projects/{project}/labels");
                match self
                    .http
                    .request(
                        Method::POST,
                        &path,
                        Some(&json!({"name": name, "color": LABEL_COLOR})),
                    )
                    .await
                {
                    // Created meanwhile by someone else: there now, which is all we need.
                    Err(e) if e.status() == Some(409) => {}
                    other => {
                        other?;
                    }
                }
                known.push(name.clone());
            }
        }
        let path = format!("/projects/{project}/merge_requests/{number}");
        let answer: MergeRequestPayload = self
            .http
            .call(
                Method::PUT,
                &path,
                Some(&json!({"add_labels": labels.join(",")})),
            )
            .await?;
        let missing: Vec<&String> = labels
            .iter()
            .filter(|name| !answer.labels.contains(name))
            .collect();
        if !missing.is_empty() {
            return Err(ForgeError::Decode {
                method: "PUT".into(),
                path,
                message: format!("GitLab did not add the labels {missing:?}"),
            });
        }
        Ok(())
    }

    async fn remove_label(
        &self,
        repo: &RepoSlug,
        number: u64,
        label: &str,
    ) -> Result<(), ForgeError> {
        check_label(label)?;
        let path = format!("/projects/{}/merge_requests/{number}", project(repo));
        self.http
            .request(Method::PUT, &path, Some(&json!({"remove_labels": label})))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map_both_ways() {
        assert_eq!(state_of("success"), StatusState::Success);
        assert_eq!(state_of("running"), StatusState::Pending);
        assert_eq!(state_of("canceled"), StatusState::Error);
        assert_eq!(state_of("skipped"), StatusState::Failure);
        assert_eq!(state_of("something new"), StatusState::Failure);
        assert_eq!(state_text(StatusState::Error), "failed");
    }

    #[test]
    fn a_label_gitlab_cannot_carry_is_refused() {
        assert!(check_label("bosun/held").is_ok());
        assert!(check_label("needs human").is_ok());
        assert!(check_label("a,b").is_err(), "a comma splits add_labels");
        assert!(check_label("").is_err());
    }

    #[test]
    fn a_note_gitlab_would_run_or_refuse_is_never_sent() {
        assert!(check_note("<!-- marker -->\nreport\n- `a` /merge").is_ok());
        assert!(check_note("text\n/merge\n").is_err());
        assert!(check_note("text\n   /approve").is_err());
        assert!(
            check_note("```\n/etc/passwd\n```\n").is_ok(),
            "inside a fence"
        );
        assert!(
            check_note("```\n~~~\n```\n/merge").is_err(),
            "the fence closed"
        );
        assert!(check_note("// a comment, not an action").is_ok());
        assert!(check_note(&"x".repeat(NOTE_LIMIT)).is_ok());
        assert!(check_note(&"x".repeat(NOTE_LIMIT + 1)).is_err());
    }

    #[test]
    fn a_project_path_is_one_encoded_segment() {
        for (path, encoded) in [
            ("platform/gitops", "platform%2Fgitops"),
            ("platform/team/gitops", "platform%2Fteam%2Fgitops"),
            ("a/b.c/d_e/f-g", "a%2Fb.c%2Fd_e%2Ff-g"),
        ] {
            let slug = project_path(path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(slug.to_string(), path);
            assert_eq!(project(&slug), encoded);
        }
        // Even a slug built by hand with text GitLab paths never hold stays one segment.
        let slug = RepoSlug {
            owner: "platform/a b".into(),
            name: "x?y#z".into(),
        };
        assert_eq!(project(&slug), "platform%2Fa%20b%2Fx%3Fy%23z");
    }

    #[test]
    fn a_subgroup_path_is_the_namespace_and_the_project() {
        let slug = project_path("platform/team/addons/gitops").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (slug.owner.as_str(), slug.name.as_str()),
            ("platform/team/addons", "gitops")
        );
        // The deepest GitLab makes: a top-level group, 20 levels of subgroups, the project.
        let deepest = vec!["g"; MAX_SEGMENTS].join("/");
        assert!(project_path(&deepest).is_ok(), "{deepest}");
        assert!(project_path("_under/score.s-and-dashes_").is_ok());
    }

    /// Hostile paths: each refused with one line naming it.
    #[test]
    fn a_hostile_project_path_is_refused_in_one_line() {
        let too_deep = vec!["g"; MAX_SEGMENTS + 1].join("/");
        let too_long = format!("platform/{}", "a".repeat(MAX_PATH));
        for path in [
            "",
            "gitops",
            "a/../b",
            "../b",
            "a/..",
            "a/b..c/d",
            "a//b",
            "/a/b",
            "a/b/",
            "a/./b",
            "%2e%2e/b",
            "a/%2e%2e/b",
            "a%2Fb",
            "a/b?x=1",
            "a/b#frag",
            "a/b c",
            "a/b\n",
            "a/b\u{0}",
            "a/\tb",
            "a\r/b",
            "a/b\u{7f}",
            "a/-b",
            "a/.b",
            "a/b.git",
            "a/b.atom",
            "a/gitøps",
            "a\\b/c",
            too_deep.as_str(),
            too_long.as_str(),
        ] {
            let refused = project_path(path).expect_err(path);
            assert!(!refused.contains('\n'), "{refused}");
            assert!(
                refused.contains("is not a GitLab project path"),
                "{refused}"
            );
        }
        let refused = project_path(&too_deep).unwrap_err();
        assert!(refused.contains("20 levels"), "{refused}");
    }
}
