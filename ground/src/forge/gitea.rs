//! The forge double's Gitea face: Gitea 1.24's REST API under `/api/v1`, over the same
//! repositories, pull requests, comments and statuses as the GitHub face. What differs from
//! GitHub is modelled where the product meets it, each cited to Gitea's source
//! (`[G path]`, go-gitea/gitea):
//!
//! - tokens carry scopes; a missing scope is 403 "token does not have at least one of required
//!   scope(s): [read:user]" ([G routers/api/v1/api.go tokenRequiresScopes]), and no token is
//!   401 "token is required" (`reqToken`);
//! - lists page with `page` and `limit`: 30 by default, at most 50 (`MAX_RESPONSE_ITEMS`),
//!   with `X-Total-Count` and a `Link` header ([G routers/api/v1/utils/page.go],
//!   [G services/convert/utils.go ToCorrectPageSize]); an issue's comments come unpaged
//!   ([G routers/api/v1/repo/issue_comment.go ListIssueComments]);
//! - labels are repository objects with ids and a required colour; adding labels to an issue
//!   takes ids or names, never both (400), and drops names and ids the repository does not
//!   have without a word; removing is by id, 422 for an id that is no label, 204 otherwise
//!   ([G routers/api/v1/repo/issue_label.go], [G routers/api/v1/repo/label.go]);
//! - a commit status is created with `state` and read back with `status`
//!   ([G modules/structs/status.go]); `GET .../statuses/{sha}` lists every status ever set,
//!   newest first;
//! - a merge is `POST .../pulls/{n}/merge` with `Do`; a protected branch whose required
//!   contexts are not all successful answers 405 "Not all required status checks successful"
//!   ([G services/pull/merge.go CheckPullBranchProtections]).
//!
//! Errors are Gitea's `{"message", "url"}`; a missing object is 404 "The target couldn't be
//! found.".

use std::collections::BTreeMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use serde_json::{Value, json};

use super::{Comment, JsonBody, Repo, Shared, Status, check_passed, lock, resolve};
use crate::git;

const SWAGGER: &str = "http://gitea.example.test/api/swagger";

/// A label of a repository (Gitea keeps them per repository, with ids).
#[derive(Debug, Clone)]
pub(super) struct RepoLabel {
    pub id: u64,
    pub name: String,
    pub color: String,
}

pub(super) fn router() -> Router<Shared> {
    Router::new()
        .route("/user", get(get_user))
        .route("/repos/{owner}/{repo}/pulls/{number}", get(get_pull))
        .route("/repos/{owner}/{repo}/pulls/{number}/merge", post(merge))
        .route(
            "/repos/{owner}/{repo}/issues/{number}/comments",
            get(list_comments).post(create_comment),
        )
        .route("/repos/{owner}/{repo}/issues/{number}", get(get_issue))
        .route(
            "/repos/{owner}/{repo}/issues/{number}/timeline",
            get(list_timeline),
        )
        .route(
            "/repos/{owner}/{repo}/issues/comments/{id}",
            patch(update_comment).get(get_comment),
        )
        .route(
            "/repos/{owner}/{repo}/labels",
            get(list_repo_labels).post(create_label),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/labels",
            get(list_issue_labels).post(add_issue_labels),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/labels/{id}",
            axum::routing::delete(remove_issue_label),
        )
        .route(
            "/repos/{owner}/{repo}/statuses/{sha}",
            get(list_statuses).post(create_status),
        )
        .fallback(not_found_route)
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"message": message, "url": SWAGGER})),
    )
        .into_response()
}

pub(super) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(
            json!({"errors": [], "message": "The target couldn't be found.", "url": SWAGGER}),
        ),
    )
        .into_response()
}

async fn not_found_route() -> Response {
    not_found()
}

/// Which scope category a route needs ([G routers/api/v1/api.go]: `/user` is `user`; pulls,
/// statuses and merges `repository`; comments and labels `issue`).
#[derive(Clone, Copy)]
enum Category {
    User,
    Repository,
    Issue,
}

impl Category {
    fn name(self) -> &'static str {
        match self {
            Category::User => "user",
            Category::Repository => "repository",
            Category::Issue => "issue",
        }
    }
}

/// The token's user, or Gitea's 401/403: reads need `read:<category>` or `write:<category>`,
/// writes `write:<category>`; `all` grants everything. A token registered without scopes
/// (the GitHub face's users) has them all.
fn authorize(
    state: &Shared,
    headers: &HeaderMap,
    category: Category,
    write: bool,
) -> Result<String, Response> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("token ")
                .or_else(|| v.strip_prefix("Bearer "))
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or("");
    let guard = lock(state);
    let Some(login) = guard.users.get(token).cloned() else {
        return Err(error(StatusCode::UNAUTHORIZED, "token is required"));
    };
    if let Some(scopes) = guard.scopes.get(token) {
        let name = category.name();
        let granted = scopes.iter().any(|s| {
            s == "all" || *s == format!("write:{name}") || (!write && *s == format!("read:{name}"))
        });
        if !granted {
            let needed = if write {
                format!("[write:{name}]")
            } else {
                format!("[read:{name}]")
            };
            return Err(error(
                StatusCode::FORBIDDEN,
                &format!("token does not have at least one of required scope(s): {needed}"),
            ));
        }
    }
    Ok(login)
}

/// Scope categories as const parameters of [`Scoped`].
const USER: u8 = 0;
const REPOSITORY: u8 = 1;
const ISSUE: u8 = 2;

/// The token's user when it holds the scope a route needs (`CATEGORY`, written when `WRITE`),
/// else Gitea's 401/403: one extractor for every handler of this face.
struct Scoped<const CATEGORY: u8, const WRITE: bool>(String);

impl<const CATEGORY: u8, const WRITE: bool> axum::extract::FromRequestParts<Shared>
    for Scoped<CATEGORY, WRITE>
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Shared,
    ) -> Result<Self, Response> {
        let category = match CATEGORY {
            USER => Category::User,
            REPOSITORY => Category::Repository,
            _ => Category::Issue,
        };
        authorize(state, &parts.headers, category, WRITE).map(Scoped)
    }
}

pub(super) fn parse_body(body: &Bytes) -> Result<Value, Response> {
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("invalid JSON: {e}"),
        )
    })
}

fn user_json(login: &str) -> Value {
    json!({"id": login.len() as u64 * 1000 + login.bytes().map(u64::from).sum::<u64>(), "login": login, "login_name": "", "full_name": "", "email": format!("{login}@noreply.gitea.example.test"), "is_admin": false})
}

fn label_json(label: &RepoLabel) -> Value {
    json!({"id": label.id, "name": label.name, "color": label.color, "description": "", "exclusive": false, "is_archived": false})
}

/// The repository's label named `name`, as an issue carries it.
fn issue_label(repo: &Repo, name: &str) -> Value {
    match repo.labels.iter().find(|l| l.name == name) {
        Some(label) => label_json(label),
        None => json!({"id": 0, "name": name, "color": "ededed"}),
    }
}

fn pull_json(repo: &Repo, pull: &super::Pull) -> Value {
    let sha = |r: &str| git::rev_parse(&repo.bare, &format!("refs/heads/{r}")).unwrap_or_default();
    let full_name = format!("{}/{}", repo.owner, repo.name);
    let repo_ref = json!({"id": repo.id, "name": repo.name, "full_name": full_name, "owner": user_json(&repo.owner)});
    json!({
        "id": repo.id * 100_000 + pull.number,
        "number": pull.number,
        "state": pull.state,
        "title": pull.title,
        "body": pull.body,
        "user": user_json(&pull.user),
        "labels": pull.labels.iter().map(|l| issue_label(repo, l)).collect::<Vec<_>>(),
        "head": {"label": pull.head_ref, "ref": pull.head_ref, "sha": sha(&pull.head_ref), "repo_id": repo.id, "repo": {"full_name": pull.head_repo}},
        "base": {"label": pull.base_ref, "ref": pull.base_ref, "sha": sha(&pull.base_ref), "repo_id": repo.id, "repo": repo_ref},
        "mergeable": pull.state == "open",
        "merged": pull.merged,
        "merge_commit_sha": pull.merge_commit_sha,
        "created_at": pull.created_at,
        "html_url": format!("http://gitea.example.test/{full_name}/pulls/{}", pull.number),
    })
}

fn comment_json(repo: &Repo, comment: &Comment) -> Value {
    json!({
        "id": comment.id,
        "body": comment.body,
        "user": user_json(&comment.user),
        "created_at": comment.created_at,
        "updated_at": comment.updated_at,
        "html_url": format!("http://gitea.example.test/{}/{}/pulls/{}#issuecomment-{}", repo.owner, repo.name, comment.issue, comment.id),
    })
}

fn status_json(status: &Status) -> Value {
    json!({"id": status.id, "status": status.state, "context": status.context, "description": status.description, "target_url": "", "creator": user_json(&status.creator)})
}

/// One page of `items` as Gitea answers a list: `page` (from 1) and `limit` (30 by default,
/// at most 50), `X-Total-Count` and a `Link` header naming the next and last pages.
fn paged(items: Vec<Value>, query: &BTreeMap<String, String>, path: &str) -> Response {
    let limit = match query.get("limit").and_then(|v| v.parse::<usize>().ok()) {
        Some(0) | None => 30,
        Some(n) => n.min(50),
    };
    let page = query
        .get("page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let total = items.len();
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    let mut response = axum::Json(Value::Array(slice)).into_response();
    let headers = response.headers_mut();
    headers.insert("x-total-count", HeaderValue::from(total));
    let last = total.div_ceil(limit).max(1);
    let mut links = Vec::new();
    if page < last {
        links.push(format!(
            "<{path}?page={}&limit={limit}>; rel=\"next\"",
            page + 1
        ));
        links.push(format!("<{path}?page={last}&limit={limit}>; rel=\"last\""));
    }
    if let Some(value) = (!links.is_empty())
        .then(|| links.join(","))
        .and_then(|v| HeaderValue::from_str(&v).ok())
    {
        headers.insert("link", value);
    }
    response
}

macro_rules! repo_or_404 {
    ($state:expr, $owner:expr, $repo:expr) => {
        match $state.repos.get_mut(&format!("{}/{}", $owner, $repo)) {
            Some(repo) => repo,
            None => return not_found(),
        }
    };
}

mod labels;

use self::labels::{
    add_issue_labels, create_label, list_issue_labels, list_repo_labels, remove_issue_label,
};

async fn get_user(Scoped(login): Scoped<{ USER }, false>) -> Response {
    axum::Json(user_json(&login)).into_response()
}

async fn get_pull(
    State(state): State<Shared>,
    _: Scoped<{ REPOSITORY }, false>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    match repo.pulls.iter().find(|p| p.number == number) {
        Some(pull) => axum::Json(pull_json(repo, pull)).into_response(),
        None => not_found(),
    }
}

/// `POST .../pulls/{n}/merge` with `{"Do": "merge"}` ([G routers/api/v1/repo/pull.go
/// MergePullRequest]): 200 with no body; a closed pull request 404; branch protection 405.
async fn merge(
    State(state): State<Shared>,
    _: Scoped<{ REPOSITORY }, true>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody<true>,
) -> Response {
    let style = body.get("Do").and_then(Value::as_str).unwrap_or("");
    if ![
        "merge",
        "rebase",
        "rebase-merge",
        "squash",
        "fast-forward-only",
        "manually-merged",
    ]
    .contains(&style)
    {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "[Do]: Do must be one of merge, rebase, rebase-merge, squash, fast-forward-only, manually-merged",
        );
    }
    let mut guard = lock(&state);
    let repo = repo_or_404!(guard, owner, repo);
    let Some(index) = repo.pulls.iter().position(|p| p.number == number) else {
        return not_found();
    };
    let pull = repo.pulls[index].clone();
    if pull.merged {
        return error(StatusCode::METHOD_NOT_ALLOWED, "");
    }
    if pull.state != "open" {
        return not_found();
    }
    let Some(head_sha) = git::rev_parse(&repo.bare, &format!("refs/heads/{}", pull.head_ref))
    else {
        return error(StatusCode::METHOD_NOT_ALLOWED, "Please try again later");
    };
    if let Some(expected) = body.get("head_commit_id").and_then(Value::as_str)
        && !expected.is_empty()
        && expected != head_sha
    {
        return error(StatusCode::CONFLICT, "head out of date");
    }
    let required = repo
        .protection
        .get(&pull.base_ref)
        .cloned()
        .unwrap_or_default();
    if !required
        .iter()
        .all(|context| check_passed(repo, &head_sha, context))
    {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Not all required status checks successful",
        );
    }
    let message = format!(
        "Merge pull request '{}' (#{number}) from {} into {}",
        pull.title, pull.head_ref, pull.base_ref
    );
    match git::merge_into(&repo.bare, &pull.base_ref, &head_sha, &message) {
        Ok(Some(commit)) => {
            let pull = &mut repo.pulls[index];
            pull.state = "closed".into();
            pull.merged = true;
            pull.merge_commit_sha = Some(commit);
            StatusCode::OK.into_response()
        }
        Ok(None) => error(StatusCode::METHOD_NOT_ALLOWED, "Please try again later"),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn list_comments(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, false>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    if !repo.pulls.iter().any(|p| p.number == number) {
        return not_found();
    }
    let all: Vec<Value> = repo
        .comments
        .iter()
        .filter(|c| c.issue == number)
        .map(|c| comment_json(repo, c))
        .collect();
    served_comments(&mut state.comment_bytes, all)
}

/// `GET .../issues/{n}`: the fields the product reads, `comments` the count of plain
/// comments ([G models/issues/issue.go NumComments]).
async fn get_issue(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, false>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let Some(pull) = repo.pulls.iter().find(|p| p.number == number) else {
        return not_found();
    };
    let comments = repo.comments.iter().filter(|c| c.issue == number).count();
    axum::Json(
        json!({"number": number, "title": pull.title, "state": pull.state, "comments": comments}),
    )
    .into_response()
}

/// `GET .../issues/{n}/timeline` ([G routers/api/v1/repo/issue_comment.go
/// ListIssueCommentsAndTimeline]): the issue's events oldest first, `page` and `limit`, each
/// with its `type` (here only plain comments, `comment`); `X-Total-Count` counts the page
/// answered, not the list, as Gitea's does.
async fn list_timeline(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, false>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut guard = lock(&state);
    let state = &mut *guard;
    let repo = repo_or_404!(state, owner, repo);
    if !repo.pulls.iter().any(|p| p.number == number) {
        return not_found();
    }
    let limit = match query.get("limit").and_then(|v| v.parse::<usize>().ok()) {
        Some(0) | None => 30,
        Some(n) => n.min(50),
    };
    let page = query
        .get("page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let events: Vec<Value> = repo
        .comments
        .iter()
        .filter(|c| c.issue == number)
        .skip((page - 1) * limit)
        .take(limit)
        .map(|c| {
            let mut event = comment_json(repo, c);
            event["type"] = json!("comment");
            event
        })
        .collect();
    served_comments(&mut state.comment_bytes, events)
}

/// A page of comments as Gitea answers it (`X-Total-Count` the page's count, as Gitea's list
/// and timeline both send it), their bodies' bytes added to what the double has served.
fn served_comments(served: &mut usize, comments: Vec<Value>) -> Response {
    *served += comments
        .iter()
        .map(|c| c["body"].as_str().map_or(0, str::len))
        .sum::<usize>();
    let count = comments.len();
    let mut response = axum::Json(Value::Array(comments)).into_response();
    response
        .headers_mut()
        .insert("x-total-count", HeaderValue::from(count));
    response
}

async fn create_comment(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ ISSUE }, true>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody<true>,
) -> Response {
    let Some(text) = body.get("body").and_then(Value::as_str) else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "[Body]: Required");
    };
    let mut guard = lock(&state);
    let id = guard.id();
    let now = guard.now();
    let repo = repo_or_404!(guard, owner, repo);
    let Some(comment) = repo.add_comment(id, number, user, text, now).cloned() else {
        return not_found();
    };
    let json = comment_json(repo, &comment);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn get_comment(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, false>,
    UrlPath((owner, repo, id)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    match repo.comments.iter().find(|c| c.id == id) {
        Some(comment) => axum::Json(comment_json(repo, comment)).into_response(),
        None => not_found(),
    }
}

/// Only the poster (or a writer, which the double's users are not) edits a comment: 403 with
/// no body otherwise ([G issue_comment.go editIssueComment]).
async fn update_comment(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ ISSUE }, true>,
    UrlPath((owner, repo, id)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody<true>,
) -> Response {
    let Some(text) = body.get("body").and_then(Value::as_str) else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "[Body]: Required");
    };
    let mut guard = lock(&state);
    let now = guard.now();
    let repo = repo_or_404!(guard, owner, repo);
    let Some(index) = repo.comments.iter().position(|c| c.id == id) else {
        return not_found();
    };
    if repo.comments[index].user != user {
        return StatusCode::FORBIDDEN.into_response();
    }
    if repo.comments[index].body != text {
        repo.comments[index].edit(text, now);
    }
    axum::Json(comment_json(repo, &repo.comments[index])).into_response()
}

async fn create_status(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ REPOSITORY }, true>,
    UrlPath((owner, repo, sha)): UrlPath<(String, String, String)>,
    JsonBody(body): JsonBody<true>,
) -> Response {
    let status_state = body.get("state").and_then(Value::as_str).unwrap_or("");
    if !["pending", "success", "error", "failure", "warning"].contains(&status_state) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("invalid commit status state {status_state:?}"),
        );
    }
    let mut guard = lock(&state);
    let id = guard.id();
    let repo = repo_or_404!(guard, owner, repo);
    if resolve(repo, &sha).as_deref() != Some(sha.as_str()) {
        return not_found();
    }
    let status = Status {
        id,
        sha,
        context: body
            .get("context")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string(),
        state: status_state.to_string(),
        description: body
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        creator: user,
    };
    let json = status_json(&status);
    repo.statuses.push(status);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn list_statuses(
    State(state): State<Shared>,
    _: Scoped<{ REPOSITORY }, false>,
    UrlPath((owner, repo, sha)): UrlPath<(String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let all: Vec<Value> = repo
        .statuses
        .iter()
        .rev()
        .filter(|s| s.sha == sha)
        .map(status_json)
        .collect();
    paged(
        all,
        &query,
        &format!("/api/v1/repos/{}/{}/statuses/{sha}", repo.owner, repo.name),
    )
}
