//! `ForgeDouble`: a stand-in for GitHub on loopback. It speaks the REST subset the product
//! uses (same paths, same payload shapes as api.github.com) over real bare git repositories,
//! resolves users from tokens, records every request, and enforces branch protection on merge.

// Handlers short-circuit with a ready `Response` as the error; boxing it buys nothing here.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post, put};
use serde_json::{Value, json};

mod gitea;
mod gitlab;

macro_rules! repo_or_404 {
    ($state:expr, $owner:expr, $repo:expr) => {
        match $state.repos.get_mut(&format!("{}/{}", $owner, $repo)) {
            Some(repo) => repo,
            None => return error(StatusCode::NOT_FOUND, "Not Found"),
        }
    };
}

mod checks;
mod double;
mod git_http;
mod issues;
mod pulls;

use self::checks::{
    combined_status, create_check_run, create_status, list_check_runs, resolve, update_check_run,
};
use self::git_http::{git_user, pushed_refs, smart_http};
use self::issues::{
    add_labels, create_comment, list_comments, list_labels, remove_label, update_comment,
};
use self::pulls::{check_passed, create_pull, get_pull, list_pulls, merge_pull};

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
    /// The bodies it had before each edit, oldest first (what a reader saw at the time).
    earlier: Vec<String>,
}

impl Comment {
    /// Edits the body, keeping the one it replaces.
    fn edit(&mut self, body: &str, now: String) {
        let old = std::mem::replace(&mut self.body, body.to_string());
        self.earlier.push(old);
        self.updated_at = now;
    }
}

impl Repo {
    /// Adds a comment to pull request `issue` (both faces comment on pulls only); `None`
    /// when there is no such pull.
    fn add_comment(
        &mut self,
        id: u64,
        issue: u64,
        user: String,
        body: &str,
        now: String,
    ) -> Option<&Comment> {
        if !self.pulls.iter().any(|p| p.number == issue) {
            return None;
        }
        self.comments.push(Comment {
            id,
            issue,
            user,
            body: body.to_string(),
            created_at: now.clone(),
            updated_at: now,
            earlier: Vec::new(),
        });
        self.comments.last()
    }
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
    /// Per login: scripted outages of the REST API (answered 502).
    outages: crate::draws::Outages,
    injected: u64,
    users: BTreeMap<String, String>,
    /// token -> Gitea scopes (`read:user`, `write:issue`, `all`, ...) or GitLab scopes (`api`,
    /// `read_api`, `read_user`); a token without an entry has every scope.
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
    /// Paths whose requests are recorded and then held, unanswered, until released (a forge
    /// that hangs on one pull request: a test kills a product in the middle of its work).
    holds: Vec<String>,
    released: Arc<tokio::sync::Notify>,
    /// Bytes of comment bodies served by the comment lists (both faces, timeline included).
    comment_bytes: usize,
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
        .nest("/api/v4", gitlab::router())
        // `owner/name.git/...` on GitHub's and Gitea's faces, `group/sub/.../project.git/...`
        // on GitLab's (a project in a subgroup clones at its full path).
        .route("/{owner}/{*rest}", get(smart_http).post(smart_http))
        .fallback(fallback)
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

/// A path no route takes, answered as the face it is under answers one: GitLab's catch-all
/// under `/api/v4` (where a project path whose slashes were not encoded lands), Gitea's under
/// `/api/v1`, GitHub's elsewhere.
async fn fallback(uri: axum::http::Uri) -> Response {
    face_not_found(uri.path())
}

fn face_not_found(path: &str) -> Response {
    if path.starts_with("/api/v4/") {
        gitlab::route_not_found()
    } else if path.starts_with("/api/v1/") {
        gitea::not_found()
    } else {
        error(StatusCode::NOT_FOUND, "Not Found")
    }
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
        let outage = user.as_ref().is_some_and(|user| {
            guard
                .outages
                .take_at(user, parts.method.as_str(), parts.uri.path())
        });
        // The seeded draws are taken whatever an outage says, so each key's stream stays the
        // same (as on the API double): the server-error draw, then the rate-limit draw unless
        // the first hit.
        let server_error = (faults.server_error > 0)
            .then(|| guard.draws.next(faults.seed, &key))
            .filter(|draw| draw % 1000 < u64::from(faults.server_error));
        let rate_limited = server_error.is_none()
            && guard
                .draws
                .roll(faults.seed, &format!("rate {key}"), faults.rate_limit);
        let fault = if outage {
            Some(StatusCode::BAD_GATEWAY)
        } else if let Some(draw) = server_error {
            Some(if (draw / 1000).is_multiple_of(2) {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::BAD_GATEWAY
            })
        } else if rate_limited {
            // GitHub answers 403 with `x-ratelimit-remaining: 0`; Gitea has no rate limit of
            // its own, so on its face (`/api/v1`) it is what a proxy in front answers: 429.
            // GitLab answers 429 with `retry-after` and `ratelimit-reset` (its
            // doc/administration/settings/user_and_ip_rate_limits.md, "Response headers").
            Some(
                if parts.uri.path().starts_with("/api/v1/")
                    || parts.uri.path().starts_with("/api/v4/")
                {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::FORBIDDEN
                },
            )
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
            if parts.uri.path().starts_with("/api/v4/") {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let headers = response.headers_mut();
                headers.insert("ratelimit-reset", axum::http::HeaderValue::from(now));
                headers.insert(
                    "ratelimit-remaining",
                    axum::http::HeaderValue::from_static("0"),
                );
            }
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
    let path = parts.uri.path().to_string();
    loop {
        let released = lock(&state).released.clone();
        let wait = released.notified();
        tokio::pin!(wait);
        wait.as_mut().enable();
        if !lock(&state).holds.contains(&path) {
            break;
        }
        wait.await;
    }
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
    // GitLab's access tokens come as `PRIVATE-TOKEN`.
    if let Some(token) = headers.get("private-token").and_then(|v| v.to_str().ok()) {
        return lock(state).users.get(token.trim()).cloned();
    }
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
