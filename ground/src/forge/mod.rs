//! `ForgeDouble`: a stand-in for GitHub on loopback. It speaks the REST subset the product
//! uses (same paths, same payload shapes as api.github.com) over real bare git repositories,
//! resolves users from tokens, records every request, and enforces branch protection on merge.

// Handlers short-circuit with a ready `Response` as the error; boxing it buys nothing here.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post, put};
use serde_json::{Value, json};

use crate::git;

mod gitea;

/// A request as the double received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub user: Option<String>,
    pub body: Value,
    /// The double's answer (0 until it has answered).
    pub status: u16,
}

#[derive(Debug, Clone)]
struct Pull {
    number: u64,
    title: String,
    body: String,
    user: String,
    head_ref: String,
    base_ref: String,
    head_repo: String,
    state: String,
    merged: bool,
    merge_commit_sha: Option<String>,
    labels: Vec<String>,
    created_at: String,
}

#[derive(Debug, Clone)]
struct Comment {
    id: u64,
    issue: u64,
    user: String,
    body: String,
    created_at: String,
    updated_at: String,
}

#[derive(Debug, Clone)]
struct Status {
    id: u64,
    sha: String,
    context: String,
    state: String,
    description: String,
    creator: String,
}

#[derive(Debug, Clone)]
struct CheckRun {
    id: u64,
    name: String,
    head_sha: String,
    status: String,
    conclusion: Option<String>,
    title: String,
    summary: String,
    external_id: String,
    app: String,
}

#[derive(Debug)]
struct Repo {
    id: u64,
    owner: String,
    name: String,
    bare: PathBuf,
    pulls: Vec<Pull>,
    comments: Vec<Comment>,
    statuses: Vec<Status>,
    check_runs: Vec<CheckRun>,
    /// branch -> check names that must have succeeded on the head commit before a merge.
    protection: BTreeMap<String, Vec<String>>,
    /// The repository's labels, with ids (the Gitea face's; GitHub's adds names on the fly).
    labels: Vec<gitea::RepoLabel>,
}

/// Seeded faults for the forge: per mille of REST requests answered 500/502, or rate-limited
/// (403 with `x-ratelimit-remaining: 0`, as GitHub does). Each decision draws from the stream of
/// the request's `METHOD path` (see `crate::draws`), so the same seed gives each request the
/// same answer whatever order the products send them in; requests sharing a key draw in
/// arrival order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForgeFaults {
    pub seed: u64,
    pub server_error: u32,
    pub rate_limit: u32,
}

#[derive(Debug, Default)]
struct ForgeState {
    faults: ForgeFaults,
    draws: crate::draws::Draws,
    /// Per login: the method an outage hits (any when `None`) and how many more of its REST
    /// requests are answered 502 (`outage`).
    outages: BTreeMap<String, (Option<String>, u32)>,
    injected: u64,
    users: BTreeMap<String, String>,
    /// token -> Gitea scopes (`read:user`, `write:issue`, `all`, ...); a token without an
    /// entry has every scope.
    scopes: BTreeMap<String, Vec<String>>,
    repos: BTreeMap<String, Repo>,
    /// Releases of source repositories (`owner/name` -> GitHub release objects, newest
    /// first), as `GET /repos/{owner}/{repo}/releases` lists them.
    releases: BTreeMap<String, Vec<serde_json::Value>>,
    /// Where the bare repositories live (`owner/name.git`), served over smart HTTP.
    git_root: PathBuf,
    next_id: u64,
    /// The ground's one clock (its own when the double runs alone).
    clock: crate::clock::Clock,
    requests: Vec<RecordedRequest>,
    writes: usize,
}

impl ForgeState {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A deterministic timestamp: the ground's clock, which only its tick moves.
    fn now(&mut self) -> String {
        self.clock.rfc3339()
    }
}

type Shared = Arc<Mutex<ForgeState>>;

/// The running double.
pub struct ForgeDouble {
    state: Shared,
    addr: SocketAddr,
    root: PathBuf,
    _root_dir: Option<tempfile::TempDir>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ForgeDouble {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock(state: &Shared) -> MutexGuard<'_, ForgeState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl ForgeDouble {
    /// Starts the double on an ephemeral loopback port, keeping repositories in a temporary
    /// folder (or `root` when given).
    pub async fn start(root: Option<&Path>) -> Result<ForgeDouble> {
        let (root, root_dir) = match root {
            Some(root) => (root.to_path_buf(), None),
            None => {
                let dir = git::tempfile_dir()?;
                (dir.path().to_path_buf(), Some(dir))
            }
        };
        let state: Shared = Arc::new(Mutex::new(ForgeState {
            git_root: root.clone(),
            ..ForgeState::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = router(state.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ForgeDouble {
            state,
            addr,
            root,
            _root_dir: root_dir,
            server,
        })
    }

    /// Stamps what the double writes with the ground's clock from now on.
    pub fn set_clock(&self, clock: crate::clock::Clock) {
        lock(&self.state).clock = clock;
    }

    /// The API root, as a client's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A token that authenticates as `login`.
    /// Publishes a release of `owner/name` (a source repository an image names): GitHub's
    /// release object fields `tag_name`, `name`, `body`, `html_url`, `draft`, `prerelease`.
    pub fn add_release(&self, repository: &str, tag: &str, name: &str, body: &str) {
        let url = format!("https://github.com/{repository}/releases/tag/{tag}");
        lock(&self.state)
            .releases
            .entry(repository.to_string())
            .or_default()
            .insert(
                0,
                serde_json::json!({"tag_name": tag, "name": name, "body": body,
                    "html_url": url, "draft": false, "prerelease": tag.contains('-')}),
            );
    }

    pub fn add_user(&self, token: &str, login: &str) {
        lock(&self.state)
            .users
            .insert(token.to_string(), login.to_string());
    }

    /// A Gitea access token for `login` with these scopes (`read:user`, `write:issue`,
    /// `write:repository`, `all`, ...), as `gitea admin user generate-access-token --scopes`
    /// makes one.
    pub fn add_scoped_user(&self, token: &str, login: &str, scopes: &[&str]) {
        let mut state = lock(&self.state);
        state.users.insert(token.to_string(), login.to_string());
        state.scopes.insert(
            token.to_string(),
            scopes.iter().map(|s| s.to_string()).collect(),
        );
    }

    /// The Gitea face's API root (`/api/v1`).
    pub fn gitea_url(&self) -> String {
        format!("{}/api/v1", self.url())
    }

    /// Creates `owner/name` with `content` as the first commit of `main`; returns its git URL.
    pub fn create_repo(&self, slug: &str, content: &Path) -> Result<String> {
        let (owner, name) = slug.split_once('/').context("slug is owner/name")?;
        let bare = self.root.join(owner).join(format!("{name}.git"));
        git::init_bare_from(&bare, content, "initial commit")?;
        let mut state = lock(&self.state);
        let id = state.id();
        state.repos.insert(
            slug.to_string(),
            Repo {
                id,
                owner: owner.to_string(),
                name: name.to_string(),
                bare: bare.clone(),
                pulls: Vec::new(),
                comments: Vec::new(),
                statuses: Vec::new(),
                check_runs: Vec::new(),
                protection: BTreeMap::new(),
                labels: Vec::new(),
            },
        );
        Ok(format!("file://{}", bare.display()))
    }

    /// The smart-HTTP URL of a repository, as GitHub serves it (`https://github.com/o/n.git`):
    /// `git http-backend` behind it, every request authenticated with a user's token the way
    /// GitHub takes one (HTTP Basic, any user name, the token as the password).
    pub fn http_git_url(&self, slug: &str) -> String {
        format!("{}/{slug}.git", self.url())
    }

    /// The smart-HTTP URL with a user's token in it, as a CI checkout or a person's clone
    /// keeps it (`https://x-access-token:<token>@github.com/o/n.git`).
    pub fn http_git_url_as(&self, slug: &str, token: &str) -> String {
        format!("http://x-access-token:{token}@{}/{slug}.git", self.addr)
    }

    /// The git URL of a repository (clone and push with real git).
    pub fn git_url(&self, slug: &str) -> Option<String> {
        lock(&self.state)
            .repos
            .get(slug)
            .map(|r| format!("file://{}", r.bare.display()))
    }

    /// Branch protection: merges into `branch` need these checks successful on the head.
    pub fn protect(&self, slug: &str, branch: &str, required_checks: &[&str]) {
        if let Some(repo) = lock(&self.state).repos.get_mut(slug) {
            repo.protection.insert(
                branch.to_string(),
                required_checks.iter().map(|s| s.to_string()).collect(),
            );
        }
    }

    /// The bare repository behind `owner/name`.
    pub fn bare_path(&self, slug: &str) -> Option<PathBuf> {
        lock(&self.state).repos.get(slug).map(|r| r.bare.clone())
    }

    /// Open pull requests with their live head commits: (number, head sha, head branch).
    pub fn open_pulls(&self, slug: &str) -> Vec<(u64, String, String)> {
        let state = lock(&self.state);
        let Some(repo) = state.repos.get(slug) else {
            return Vec::new();
        };
        repo.pulls
            .iter()
            .filter(|p| p.state == "open")
            .filter_map(|p| {
                Some((
                    p.number,
                    git::rev_parse(&repo.bare, &format!("refs/heads/{}", p.head_ref))?,
                    p.head_ref.clone(),
                ))
            })
            .collect()
    }

    /// What the ground's invariants read after every tick, in one lock: the comments that
    /// open with `marker` as (number, author) (never their bodies: a report is tens of
    /// kilobytes), every status ever set as (sha, context, state), and every check run as
    /// (sha, name).
    #[allow(clippy::type_complexity)]
    pub fn audit(
        &self,
        slug: &str,
        marker: &str,
    ) -> (
        Vec<(u64, String)>,
        Vec<(String, String, String)>,
        Vec<(String, String)>,
    ) {
        let state = lock(&self.state);
        let Some(repo) = state.repos.get(slug) else {
            return Default::default();
        };
        (
            repo.comments
                .iter()
                .filter(|c| c.body.starts_with(marker))
                .map(|c| (c.issue, c.user.clone()))
                .collect(),
            repo.statuses
                .iter()
                .map(|s| (s.sha.clone(), s.context.clone(), s.state.clone()))
                .collect(),
            repo.check_runs
                .iter()
                .map(|r| (r.head_sha.clone(), r.name.clone()))
                .collect(),
        )
    }

    /// A pull request's labels (empty when there is no such pull request).
    pub fn labels(&self, slug: &str, number: u64) -> Vec<String> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .and_then(|r| r.pulls.iter().find(|p| p.number == number))
            .map(|p| p.labels.clone())
            .unwrap_or_default()
    }

    /// A pull request's comments as (author, body), oldest first.
    pub fn comments(&self, slug: &str, number: u64) -> Vec<(String, String)> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.comments
                    .iter()
                    .filter(|c| c.issue == number)
                    .map(|c| (c.user.clone(), c.body.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The commit statuses of a commit as (context, state, description), oldest first.
    pub fn statuses(&self, slug: &str, sha: &str) -> Vec<(String, String, String)> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.statuses
                    .iter()
                    .filter(|s| s.sha == sha)
                    .map(|s| (s.context.clone(), s.state.clone(), s.description.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Turns seeded faults on (or off with `ForgeFaults::default()`).
    pub fn set_faults(&self, faults: ForgeFaults) {
        let mut state = lock(&self.state);
        state.faults = faults;
    }

    /// Answers `user`'s next `requests` REST requests (of `method` only, when given) with 502
    /// Bad Gateway.
    pub fn outage(&self, user: &str, method: Option<&str>, requests: u32) {
        lock(&self.state).outages.insert(
            user.to_string(),
            (method.map(str::to_ascii_uppercase), requests),
        );
    }

    /// How many faults were injected.
    pub fn injected_faults(&self) -> u64 {
        lock(&self.state).injected
    }

    /// Every request received so far.
    /// How many writes (anything but GET and HEAD) the double has been asked for: a cheap
    /// mark of a product changing something.
    pub fn write_count(&self) -> usize {
        lock(&self.state).writes
    }

    /// Every write (anything but GET and HEAD) `user` attempted, and every push by anyone,
    /// in order, each with whether the double applied it (answered 2xx).
    pub fn writes_and_pushes(&self, user: &str) -> Vec<Write> {
        lock(&self.state)
            .requests
            .iter()
            .filter(|r| r.method != "GET" && r.method != "HEAD")
            .filter(|r| r.user.as_deref() == Some(user) || r.path.ends_with("/git-receive-pack"))
            .map(|r| Write {
                user: r.user.clone(),
                method: r.method.clone(),
                path: r.path.clone(),
                body: r.body.clone(),
                applied: (200..300).contains(&r.status),
            })
            .collect()
    }

    /// The name of the repository label `id` (the Gitea face adds labels by id).
    pub fn label_name(&self, slug: &str, id: u64) -> Option<String> {
        let state = lock(&self.state);
        let repo = state.repos.get(slug)?;
        repo.labels
            .iter()
            .find(|l| l.id == id)
            .map(|l| l.name.clone())
    }

    /// Every pull request's number and head branch, open or not.
    pub fn pull_branches(&self, slug: &str) -> Vec<(u64, String)> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.pulls
                    .iter()
                    .map(|p| (p.number, p.head_ref.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state).requests.clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.state).requests.clear();
    }
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/user", get(get_user))
        .route("/repos/{owner}/{repo}", get(get_repo))
        .route("/repos/{owner}/{repo}/releases", get(list_releases))
        .route(
            "/repos/{owner}/{repo}/pulls",
            get(list_pulls).post(create_pull),
        )
        .route("/repos/{owner}/{repo}/pulls/{number}", get(get_pull))
        .route(
            "/repos/{owner}/{repo}/pulls/{number}/merge",
            put(merge_pull),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/comments",
            get(list_comments).post(create_comment),
        )
        .route(
            "/repos/{owner}/{repo}/issues/comments/{id}",
            patch(update_comment),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/labels",
            get(list_labels).post(add_labels),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/labels/{label}",
            axum::routing::delete(remove_label),
        )
        .route("/repos/{owner}/{repo}/statuses/{sha}", post(create_status))
        .route(
            "/repos/{owner}/{repo}/commits/{reference}/status",
            get(combined_status),
        )
        .route("/repos/{owner}/{repo}/check-runs", post(create_check_run))
        .route(
            "/repos/{owner}/{repo}/check-runs/{id}",
            patch(update_check_run),
        )
        .route(
            "/repos/{owner}/{repo}/commits/{reference}/check-runs",
            get(list_check_runs),
        )
        .nest("/api/v1", gitea::router())
        .route("/{owner}/{repo}/{*rest}", get(smart_http).post(smart_http))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), record))
        .with_state(state)
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(
            json!({"message": message, "documentation_url": "https://docs.github.com/rest"}),
        ),
    )
        .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "Not Found")
}

/// Records every request (method, path, query, user, JSON body) before handling it.
async fn record(
    State(state): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = request.into_parts();
    // A git push can be large; the smart-HTTP handler takes the same bound.
    let bytes = axum::body::to_bytes(body, 256 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let user = user_of(&state, &parts.headers).or_else(|| git_user(&state, &parts.headers));
    // Injected faults model the REST API's; git over HTTP is left alone.
    let is_git = parts.uri.path().contains(".git/");
    let fault = if is_git {
        None
    } else {
        let mut guard = lock(&state);
        let faults = guard.faults;
        let key = format!("{} {}", parts.method, parts.uri.path());
        let outage = user
            .as_ref()
            .and_then(|user| guard.outages.get_mut(user))
            .filter(|(method, left)| {
                *left > 0 && method.as_deref().is_none_or(|m| m == parts.method.as_str())
            })
            .map(|(_, left)| *left -= 1)
            .is_some();
        let server_error = (faults.server_error > 0)
            .then(|| guard.draws.next(faults.seed, &key))
            .filter(|draw| draw % 1000 < u64::from(faults.server_error));
        let fault = if outage {
            Some(StatusCode::BAD_GATEWAY)
        } else if let Some(draw) = server_error {
            Some(if (draw / 1000).is_multiple_of(2) {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::BAD_GATEWAY
            })
        } else if guard
            .draws
            .roll(faults.seed, &format!("rate {key}"), faults.rate_limit)
        {
            // GitHub answers 403 with `x-ratelimit-remaining: 0`; Gitea has no rate limit of
            // its own, so on its face (`/api/v1`) it is what a proxy in front answers: 429.
            Some(if parts.uri.path().starts_with("/api/v1/") {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::FORBIDDEN
            })
        } else {
            None
        };
        if fault.is_some() {
            guard.injected += 1;
        }
        fault
    };
    if let Some(status) = fault {
        let mut response = error(
            status,
            if status.is_client_error() {
                "API rate limit exceeded (injected fault)"
            } else {
                "Server Error (injected fault)"
            },
        );
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("0"));
        }
        if status == StatusCode::FORBIDDEN {
            response.headers_mut().insert(
                "x-ratelimit-remaining",
                axum::http::HeaderValue::from_static("0"),
            );
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("0"));
        }
        return response;
    }
    let write = parts.method != axum::http::Method::GET && parts.method != axum::http::Method::HEAD;
    let index = {
        let mut guard = lock(&state);
        guard.requests.push(RecordedRequest {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            user,
            body: serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| pushed_refs(parts.uri.path(), &bytes)),
            status: 0,
        });
        guard.requests.len() - 1
    };
    let response = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        ))
        .await;
    // Counted once answered: a push's refs have moved by then.
    let mut guard = lock(&state);
    if let Some(recorded) = guard.requests.get_mut(index) {
        recorded.status = response.status().as_u16();
    }
    if write {
        guard.writes += 1;
    }
    drop(guard);
    response
}

/// For a push (`git-receive-pack`), the ref updates it asks for as
/// `{"refs": [{"old": OID, "new": OID, "ref": NAME}]}` (read from the command pkt-lines before
/// the pack); `null` for anything else that is not JSON.
fn pushed_refs(path: &str, bytes: &[u8]) -> Value {
    if !path.ends_with("/git-receive-pack") {
        return Value::Null;
    }
    let mut refs = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 4 {
        let Some(length) = std::str::from_utf8(&rest[..4])
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
        else {
            break;
        };
        if length < 4 || length > rest.len() {
            break; // "0000" ends the commands; the pack follows
        }
        let line = String::from_utf8_lossy(&rest[4..length]);
        let command = line.split('\0').next().unwrap_or("").trim_end();
        let mut fields = command.split(' ');
        if let (Some(old), Some(new), Some(name)) = (fields.next(), fields.next(), fields.next()) {
            refs.push(json!({"old": old, "new": new, "ref": name}));
        }
        rest = &rest[length..];
    }
    json!({ "refs": refs })
}

/// A write the double took and answered 2xx (or, for `user`, attempted at all), in order.
#[derive(Debug, Clone)]
pub struct Write {
    pub user: Option<String>,
    pub method: String,
    pub path: String,
    pub body: Value,
    pub applied: bool,
}

fn user_of(state: &Shared, headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("token "))?;
    lock(state).users.get(token.trim()).cloned()
}

/// The authenticated user, or a 401 like GitHub's.
fn authenticate(state: &Shared, headers: &HeaderMap) -> Result<String, Response> {
    user_of(state, headers).ok_or_else(|| error(StatusCode::UNAUTHORIZED, "Bad credentials"))
}

fn user_json(login: &str) -> Value {
    let kind = if login.ends_with("[bot]") {
        "Bot"
    } else {
        "User"
    };
    json!({"login": login, "id": login.len() as u64 * 1000 + login.bytes().map(u64::from).sum::<u64>(), "type": kind, "site_admin": false})
}

fn repo_json(repo: &Repo) -> Value {
    json!({
        "id": repo.id,
        "name": repo.name,
        "full_name": format!("{}/{}", repo.owner, repo.name),
        "owner": user_json(&repo.owner),
        "private": false,
        "default_branch": "main",
        "clone_url": format!("file://{}", repo.bare.display()),
    })
}

fn pull_json(repo: &Repo, pull: &Pull) -> Value {
    let sha = |r: &str| git::rev_parse(&repo.bare, &format!("refs/heads/{r}")).unwrap_or_default();
    let full_name = format!("{}/{}", repo.owner, repo.name);
    json!({
        "url": format!("/repos/{full_name}/pulls/{}", pull.number),
        "id": repo.id * 100_000 + pull.number,
        "number": pull.number,
        "state": pull.state,
        "title": pull.title,
        "body": pull.body,
        "user": user_json(&pull.user),
        "labels": pull.labels.iter().map(|l| label_json(l)).collect::<Vec<_>>(),
        "head": {"label": format!("{}:{}", repo.owner, pull.head_ref), "ref": pull.head_ref, "sha": sha(&pull.head_ref), "repo": {"full_name": pull.head_repo}},
        "base": {"label": format!("{}:{}", repo.owner, pull.base_ref), "ref": pull.base_ref, "sha": sha(&pull.base_ref), "repo": repo_json(repo)},
        "merged": pull.merged,
        "merge_commit_sha": pull.merge_commit_sha,
        "created_at": pull.created_at,
        "html_url": format!("https://forge.example.test/{full_name}/pull/{}", pull.number),
    })
}

fn label_json(name: &str) -> Value {
    json!({"name": name, "color": "ededed", "default": false})
}

fn comment_json(repo: &Repo, comment: &Comment) -> Value {
    json!({
        "id": comment.id,
        "body": comment.body,
        "user": user_json(&comment.user),
        "created_at": comment.created_at,
        "updated_at": comment.updated_at,
        "html_url": format!("https://forge.example.test/{}/{}/pull/{}#issuecomment-{}", repo.owner, repo.name, comment.issue, comment.id),
    })
}

fn check_run_json(run: &CheckRun) -> Value {
    json!({
        "id": run.id,
        "name": run.name,
        "head_sha": run.head_sha,
        "status": run.status,
        "conclusion": run.conclusion,
        "output": {"title": run.title, "summary": run.summary},
        "external_id": run.external_id,
        // GitHub names the app by its slug; the double's apps are its users, `[bot]` dropped.
        "app": {"slug": run.app.trim_end_matches("[bot]")},
    })
}

macro_rules! repo_or_404 {
    ($state:expr, $owner:expr, $repo:expr) => {
        match $state.repos.get_mut(&format!("{}/{}", $owner, $repo)) {
            Some(repo) => repo,
            None => return error(StatusCode::NOT_FOUND, "Not Found"),
        }
    };
}

/// The authenticated user of a request, or GitHub's 401: what every handler that needs a
/// user takes, instead of authenticating by hand.
struct Authed(String);

impl axum::extract::FromRequestParts<Shared> for Authed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Shared,
    ) -> Result<Self, Response> {
        authenticate(state, &parts.headers).map(Authed)
    }
}

/// A JSON request body, or the face's refusal: GitHub's 400 "Problems parsing JSON", or
/// Gitea's 422 when `GITEA`.
struct JsonBody<const GITEA: bool = false>(Value);

impl<const GITEA: bool> axum::extract::FromRequest<Shared> for JsonBody<GITEA> {
    type Rejection = Response;

    async fn from_request(
        request: axum::extract::Request,
        state: &Shared,
    ) -> Result<Self, Response> {
        let bytes = <Bytes as axum::extract::FromRequest<Shared>>::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        if GITEA {
            gitea::parse_body(&bytes)
        } else {
            parse_body(&bytes)
        }
        .map(JsonBody)
    }
}

fn parse_body(body: &Bytes) -> Result<Value, Response> {
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("Problems parsing JSON: {e}"),
        )
    })
}

async fn get_user(State(state): State<Shared>, headers: HeaderMap) -> Response {
    match authenticate(&state, &headers) {
        Ok(login) => axum::Json(user_json(&login)).into_response(),
        Err(response) => response,
    }
}

async fn get_repo(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    axum::Json(repo_json(repo)).into_response()
}

/// GitHub's list releases endpoint: public (no token needed), newest first, `per_page`
/// honoured up to 100; a repository with none answers `[]`, an unknown one 404 (as GitHub
/// does for a repository it does not have).
async fn list_releases(
    State(state): State<Shared>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let state = lock(&state);
    let per_page = query
        .get("per_page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(30)
        .min(100);
    match state.releases.get(&format!("{owner}/{repo}")) {
        Some(list) => {
            axum::Json(list.iter().take(per_page).cloned().collect::<Vec<_>>()).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"message": "Not Found"})),
        )
            .into_response(),
    }
}

async fn list_pulls(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let wanted_state = query.get("state").map(String::as_str).unwrap_or("open");
    let head = query
        .get("head")
        .map(|h| h.rsplit(':').next().unwrap_or(h).to_string());
    let pulls: Vec<Value> = repo
        .pulls
        .iter()
        .filter(|p| wanted_state == "all" || p.state == wanted_state)
        .filter(|p| head.as_ref().is_none_or(|h| *h == p.head_ref))
        .map(|p| pull_json(repo, p))
        .collect();
    axum::Json(Value::Array(pulls)).into_response()
}

async fn create_pull(
    State(state): State<Shared>,
    Authed(user): Authed,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut guard = lock(&state);
    let now = guard.now();
    let repo = repo_or_404!(guard, owner, repo);
    let field = |k: &str| {
        body.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (head, base) = (field("head"), field("base"));
    let head = head.rsplit(':').next().unwrap_or(&head).to_string();
    if git::rev_parse(&repo.bare, &format!("refs/heads/{base}")).is_none() {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Validation Failed: base {base} does not exist"),
        );
    }
    let Some(head_sha) = git::rev_parse(&repo.bare, &format!("refs/heads/{head}")) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Validation Failed: head {head} does not exist"),
        );
    };
    if git::git(
        &repo.bare,
        &[
            "merge-base",
            "--is-ancestor",
            &head_sha,
            &format!("refs/heads/{base}"),
        ],
    )
    .is_ok()
    {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Validation Failed: No commits between {base} and {head}"),
        );
    }
    if repo
        .pulls
        .iter()
        .any(|p| p.state == "open" && p.head_ref == head && p.base_ref == base)
    {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Validation Failed: A pull request already exists for {owner}:{head}."),
        );
    }
    let number = repo.pulls.len() as u64 + 1;
    let pull = Pull {
        number,
        title: field("title"),
        body: field("body"),
        user,
        head_ref: head,
        base_ref: base,
        head_repo: format!("{}/{}", repo.owner, repo.name),
        state: "open".into(),
        merged: false,
        merge_commit_sha: None,
        labels: Vec::new(),
        created_at: now,
    };
    let json = pull_json(repo, &pull);
    repo.pulls.push(pull);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn get_pull(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    match repo.pulls.iter().find(|p| p.number == number) {
        Some(pull) => axum::Json(pull_json(repo, pull)).into_response(),
        None => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// True when `context` succeeded on `sha`, as a check run or a commit status (latest wins).
fn check_passed(repo: &Repo, sha: &str, context: &str) -> bool {
    let run = repo
        .check_runs
        .iter()
        .rev()
        .find(|r| r.head_sha == sha && r.name == context);
    let status = repo
        .statuses
        .iter()
        .rev()
        .find(|s| s.sha == sha && s.context == context);
    run.is_some_and(|r| r.conclusion.as_deref() == Some("success"))
        || status.is_some_and(|s| s.state == "success")
}

async fn merge_pull(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let mut guard = lock(&state);
    let repo = repo_or_404!(guard, owner, repo);
    let Some(index) = repo.pulls.iter().position(|p| p.number == number) else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    let pull = repo.pulls[index].clone();
    if pull.state != "open" {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Pull Request is not mergeable",
        );
    }
    let Some(head_sha) = git::rev_parse(&repo.bare, &format!("refs/heads/{}", pull.head_ref))
    else {
        return error(StatusCode::METHOD_NOT_ALLOWED, "Head branch was deleted");
    };
    if let Some(expected) = body.get("sha").and_then(Value::as_str)
        && expected != head_sha
    {
        return error(
            StatusCode::CONFLICT,
            "Head branch was modified. Review and try the merge again.",
        );
    }
    // Branch protection, as GitHub enforces it: every required check green on the head.
    for required in repo
        .protection
        .get(&pull.base_ref)
        .cloned()
        .unwrap_or_default()
    {
        if !check_passed(repo, &head_sha, &required) {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("Required status check \"{required}\" is expected."),
            );
        }
    }
    let message = format!(
        "Merge pull request #{number} from {}/{}\n\n{}",
        repo.owner, pull.head_ref, pull.title
    );
    match git::merge_into(&repo.bare, &pull.base_ref, &head_sha, &message) {
        Ok(Some(commit)) => {
            let pull = &mut repo.pulls[index];
            pull.state = "closed".into();
            pull.merged = true;
            pull.merge_commit_sha = Some(commit.clone());
            axum::Json(json!({"sha": commit, "merged": true, "message": "Pull Request successfully merged"})).into_response()
        }
        Ok(None) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Pull Request is not mergeable",
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn list_comments(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let per_page: usize = query
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page: usize = query
        .get("page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let all: Vec<Value> = repo
        .comments
        .iter()
        .filter(|c| c.issue == number)
        .map(|c| comment_json(repo, c))
        .collect();
    let slice: Vec<Value> = all
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    axum::Json(Value::Array(slice)).into_response()
}

async fn create_comment(
    State(state): State<Shared>,
    Authed(user): Authed,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let Some(text) = body.get("body").and_then(Value::as_str) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: body is missing",
        );
    };
    if text.chars().count() > 65_536 {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: body is too long (maximum is 65536 characters)",
        );
    }
    let mut guard = lock(&state);
    let id = guard.id();
    let now = guard.now();
    let repo = repo_or_404!(guard, owner, repo);
    if !repo.pulls.iter().any(|p| p.number == number) {
        return error(StatusCode::NOT_FOUND, "Not Found");
    }
    let comment = Comment {
        id,
        issue: number,
        user,
        body: text.to_string(),
        created_at: now.clone(),
        updated_at: now,
    };
    let json = comment_json(repo, &comment);
    repo.comments.push(comment);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn update_comment(
    State(state): State<Shared>,
    Authed(user): Authed,
    UrlPath((owner, repo, id)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let Some(text) = body.get("body").and_then(Value::as_str) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: body is missing",
        );
    };
    let mut guard = lock(&state);
    let now = guard.now();
    let repo = repo_or_404!(guard, owner, repo);
    let Some(index) = repo.comments.iter().position(|c| c.id == id) else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    if repo.comments[index].user != user {
        return error(
            StatusCode::FORBIDDEN,
            "Resource not accessible by integration",
        );
    }
    repo.comments[index].body = text.to_string();
    repo.comments[index].updated_at = now;
    let json = comment_json(repo, &repo.comments[index]);
    axum::Json(json).into_response()
}

async fn list_labels(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    match repo.pulls.iter().find(|p| p.number == number) {
        Some(pull) => axum::Json(
            pull.labels
                .iter()
                .map(|l| label_json(l))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        None => error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

async fn add_labels(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let labels: Vec<String> = body
        .get("labels")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let Some(pull) = repo.pulls.iter_mut().find(|p| p.number == number) else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    for label in labels {
        if !pull.labels.contains(&label) {
            pull.labels.push(label);
        }
    }
    axum::Json(
        pull.labels
            .iter()
            .map(|l| label_json(l))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

async fn remove_label(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, number, label)): UrlPath<(String, String, u64, String)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let Some(pull) = repo.pulls.iter_mut().find(|p| p.number == number) else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    if !pull.labels.contains(&label) {
        return error(StatusCode::NOT_FOUND, "Label does not exist");
    }
    pull.labels.retain(|l| *l != label);
    axum::Json(
        pull.labels
            .iter()
            .map(|l| label_json(l))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

fn resolve(repo: &Repo, reference: &str) -> Option<String> {
    git::rev_parse(&repo.bare, reference)
        .or_else(|| git::rev_parse(&repo.bare, &format!("refs/heads/{reference}")))
}

async fn create_status(
    State(state): State<Shared>,
    Authed(user): Authed,
    UrlPath((owner, repo, sha)): UrlPath<(String, String, String)>,
    JsonBody(body): JsonBody,
) -> Response {
    let status_state = body
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !["pending", "success", "failure", "error"].contains(&status_state.as_str()) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: state is not included in the list",
        );
    }
    let description = body
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if description.chars().count() > 140 {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: description is too long (maximum is 140 characters)",
        );
    }
    let mut guard = lock(&state);
    let id = guard.id();
    let repo = repo_or_404!(guard, owner, repo);
    if resolve(repo, &sha).as_deref() != Some(sha.as_str()) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("No commit found for SHA: {sha}"),
        );
    }
    let status = Status {
        id,
        sha,
        context: body
            .get("context")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string(),
        state: status_state,
        description,
        creator: user,
    };
    let json = json!({"id": status.id, "state": status.state, "context": status.context, "description": status.description, "creator": user_json(&status.creator)});
    repo.statuses.push(status);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn combined_status(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, reference)): UrlPath<(String, String, String)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let Some(sha) = resolve(repo, &reference) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("No commit found for SHA: {reference}"),
        );
    };
    let mut latest: BTreeMap<String, &Status> = BTreeMap::new();
    for status in repo.statuses.iter().filter(|s| s.sha == sha) {
        latest.insert(status.context.clone(), status);
    }
    let states: Vec<&str> = latest.values().map(|s| s.state.as_str()).collect();
    let combined = if states.iter().any(|s| *s == "failure" || *s == "error") {
        "failure"
    } else if states.is_empty() || states.contains(&"pending") {
        "pending"
    } else {
        "success"
    };
    let statuses: Vec<Value> = latest
        .values()
        .map(|s| json!({"id": s.id, "state": s.state, "context": s.context, "description": s.description, "creator": user_json(&s.creator)}))
        .collect();
    axum::Json(
        json!({"state": combined, "sha": sha, "total_count": statuses.len(), "statuses": statuses}),
    )
    .into_response()
}

fn check_run_fields(run: &mut CheckRun, body: &Value) {
    if let Some(s) = body.get("status").and_then(Value::as_str) {
        run.status = s.to_string();
    }
    if let Some(c) = body.get("conclusion").and_then(Value::as_str) {
        run.conclusion = Some(c.to_string());
        run.status = "completed".into();
    }
    if let Some(t) = body.pointer("/output/title").and_then(Value::as_str) {
        run.title = t.to_string();
    }
    if let Some(s) = body.pointer("/output/summary").and_then(Value::as_str) {
        run.summary = s.to_string();
    }
    if let Some(s) = body.get("external_id").and_then(Value::as_str) {
        run.external_id = s.to_string();
    }
}

async fn create_check_run(
    State(state): State<Shared>,
    Authed(user): Authed,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    JsonBody(body): JsonBody,
) -> Response {
    let (Some(name), Some(head_sha)) = (
        body.get("name").and_then(Value::as_str),
        body.get("head_sha").and_then(Value::as_str),
    ) else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: name and head_sha are required",
        );
    };
    if body
        .pointer("/output/summary")
        .and_then(Value::as_str)
        .is_some_and(|s| s.chars().count() > 65_535)
    {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Validation Failed: output.summary is too long",
        );
    }
    let mut guard = lock(&state);
    let id = guard.id();
    let repo = repo_or_404!(guard, owner, repo);
    let mut run = CheckRun {
        id,
        name: name.to_string(),
        head_sha: head_sha.to_string(),
        status: "queued".into(),
        conclusion: None,
        title: String::new(),
        summary: String::new(),
        external_id: String::new(),
        app: user,
    };
    check_run_fields(&mut run, &body);
    let json = check_run_json(&run);
    repo.check_runs.push(run);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn update_check_run(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, id)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let Some(run) = repo.check_runs.iter_mut().find(|r| r.id == id) else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    check_run_fields(run, &body);
    axum::Json(check_run_json(run)).into_response()
}

async fn list_check_runs(
    State(state): State<Shared>,
    _: Authed,
    UrlPath((owner, repo, reference)): UrlPath<(String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let Some(sha) = resolve(repo, &reference) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("No commit found for SHA: {reference}"),
        );
    };
    let runs: Vec<Value> = repo
        .check_runs
        .iter()
        .filter(|r| r.head_sha == sha)
        .filter(|r| query.get("check_name").is_none_or(|n| *n == r.name))
        .map(check_run_json)
        .collect();
    axum::Json(json!({"total_count": runs.len(), "check_runs": runs})).into_response()
}

/// The user a git client authenticates as: HTTP Basic with the token as the password (GitHub
/// takes any user name, `x-access-token` for installation tokens).
fn git_user(state: &Shared, headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (_, token) = decoded.split_once(':')?;
    lock(state).users.get(token).cloned()
}

/// git's smart HTTP protocol, served by the real `git http-backend` (CGI) over the bare
/// repositories. Without valid credentials: 401 with a Basic challenge, as GitHub answers a
/// private repository, so git asks its credential helper.
async fn smart_http(
    State(state): State<Shared>,
    UrlPath((owner, repo, rest)): UrlPath<(String, String, String)>,
    request: axum::extract::Request,
) -> Response {
    let Some(name) = repo.strip_suffix(".git") else {
        return not_found().await;
    };
    let slug = format!("{owner}/{name}");
    let (root, known) = {
        let guard = lock(&state);
        (guard.git_root.clone(), guard.repos.contains_key(&slug))
    };
    let (parts, body) = request.into_parts();
    let Some(login) = git_user(&state, &parts.headers) else {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Basic realm=\"GitHub\"")],
            "Invalid username or token.\n",
        )
            .into_response();
    };
    if !known || rest.contains("..") {
        return (StatusCode::NOT_FOUND, "Repository not found.\n").into_response();
    }
    let body = axum::body::to_bytes(body, 256 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{owner}/{repo}/{rest}"))
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        // http-backend allows receive-pack (push) to an authenticated user only.
        .env("REMOTE_USER", &login)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let Ok(mut child) = command.spawn() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot run git http-backend",
        );
    };
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&body).await;
    }
    let Ok(output) = child.wait_with_output().await else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed");
    };
    cgi_response(&output.stdout)
}

/// A CGI answer (headers, a blank line, the body) as an HTTP response.
fn cgi_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            raw.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((end, body_start)) = split else {
        return error(
            StatusCode::BAD_GATEWAY,
            "git http-backend printed no headers",
        );
    };
    let mut builder = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(&raw[..end]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .split_whitespace()
                .next()
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            builder = builder.status(code);
        } else {
            builder = builder.header(name.trim(), value);
        }
    }
    builder
        .body(axum::body::Body::from(raw[body_start..].to_vec()))
        .unwrap_or_else(|_| error(StatusCode::BAD_GATEWAY, "bad CGI headers"))
}
