//! The forge double's GitLab face: GitLab's REST API v4 under `/api/v4`, over the same
//! repositories, pull requests (merge requests here), comments (notes), labels and statuses as
//! the GitHub and Gitea faces. Each behaviour is cited to GitLab's documentation
//! (`[D path]`, gitlab-org/gitlab `doc/`) or source (`[S path]`):
//!
//! - a project is named by its full path URL-encoded as one segment (`platform%2Fgitops`, a
//!   project in a subgroup `platform%2Fteam%2Fgitops`), found ignoring case, or by its numeric
//!   id ([D api/rest/_index.md "Namespaced paths"], [S lib/api/helpers.rb] `find_project`); a
//!   path with its slashes unencoded matches no route and is 404 `{"error": "404 Not Found"}`
//!   ([S lib/api/api.rb] `NO_SLASH_URL_PART_REGEX`); a merge request is named by its `iid`;
//! - the token goes as `PRIVATE-TOKEN` or `Authorization: Bearer` ([D
//!   api/rest/authentication.md]); no known token is 401 `{"message": "401 Unauthorized"}`; a
//!   token whose scopes do not cover the request is 403 `insufficient_scope` ([S
//!   lib/api/api_guard.rb], [S lib/gitlab/auth/auth_finders.rb]): `api` covers everything,
//!   `read_api` every read and no write, `read_user` only `GET /user` ([D
//!   user/profile/personal_access_tokens.md "Personal access token scopes"]);
//! - lists page with `page` and `per_page` (20 by default, at most 100) and answer `x-page`,
//!   `x-per-page`, `x-next-page` and `x-prev-page` (empty when there is none), `x-total` and
//!   `x-total-pages` (left out past 10,000 items) and a `Link` header ([D api/rest/_index.md
//!   "Pagination"]);
//! - notes list newest first by default (`sort=desc`, `order_by=created_at`), a note is at most
//!   1,000,000 characters (`MAX_TEXT_SIZE_LIMIT`, [S lib/gitlab/database.rb], [S
//!   app/models/note.rb]): a longer one is 400 and not created; only its author edits a note
//!   (403 otherwise); labels added or removed on a merge request show as system notes ([D
//!   api/notes.md], "system": true);
//! - labels are project labels with a required colour; a title with a comma is refused ([S
//!   app/models/label.rb]); a second label of the same title is 409 "Label already exists";
//!   `PUT .../merge_requests/:iid` takes `add_labels` and `remove_labels` as comma-separated
//!   titles and creates a title the project lacks ([D api/merge_requests.md "Update MR"]);
//! - a commit status is set with `state` (pending, running, success, failed, canceled) and
//!   `name` (or `context`, `default` when neither) ([D api/commits.md "Set the pipeline status
//!   of a commit"]); a status still pending or running is updated in place, and setting it to
//!   the state it has (pending again, running again) is 400 "Cannot transition status via
//!   :enqueue from :pending" ([S lib/api/commit_statuses.rb]: the state machine refuses the
//!   event; a known failure of the real API clients must take); statuses read back with
//!   `status`, `name` and `author`, newest first;
//! - a merge (`PUT .../merge`) of a merge request whose pipeline has not succeeded, where the
//!   project says "Pipelines must succeed", is 405 "405 Method Not Allowed" ([D
//!   api/merge_requests.md "Merge a merge request"]): the double's `protect` names the statuses
//!   that stand for the pipeline, and a merge request reads `detailed_merge_status:
//!   ci_must_pass` until they succeed, `mergeable` after (what Kargo's provider waits on);
//! - a merge request's changed files come from `GET .../diffs`, paged ([D
//!   api/merge_requests.md "List merge request diffs"]).

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};

use super::gitea::RepoLabel;
use super::{Comment, JsonBody, Repo, Shared, Status, check_passed, lock, resolve};
use crate::git;

/// GitLab's note size limit, in characters.
pub const NOTE_LIMIT: usize = 1_000_000;

pub(super) fn router() -> Router<Shared> {
    Router::new()
        .route("/user", get(get_user))
        .route("/projects/{id}", get(get_project))
        .route(
            "/projects/{id}/merge_requests",
            get(list_merge_requests).post(create_merge_request),
        )
        .route(
            "/projects/{id}/merge_requests/{iid}",
            get(get_merge_request).put(update_merge_request),
        )
        .route("/projects/{id}/merge_requests/{iid}/merge", put(merge))
        .route("/projects/{id}/merge_requests/{iid}/diffs", get(list_diffs))
        .route(
            "/projects/{id}/merge_requests/{iid}/notes",
            get(list_notes).post(create_note),
        )
        .route(
            "/projects/{id}/merge_requests/{iid}/notes/{note}",
            put(update_note),
        )
        .route("/projects/{id}/labels", get(list_labels).post(create_label))
        .route(
            "/projects/{id}/statuses/{sha}",
            axum::routing::post(create_status),
        )
        .route(
            "/projects/{id}/repository/commits/{sha}/statuses",
            get(list_statuses),
        )
        .fallback(not_found_route)
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"message": message}))).into_response()
}

fn not_found(what: &str) -> Response {
    error(StatusCode::NOT_FOUND, &format!("404 {what} Not Found"))
}

async fn not_found_route() -> Response {
    route_not_found()
}

/// GitLab's answer to a path no API route takes (its catch-all `route :any, '*path'` in [S
/// lib/api/api.rb]: `error!('404 Not Found', 404)`), a project path with unencoded slashes
/// included.
pub(super) fn route_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": "404 Not Found"})),
    )
        .into_response()
}

/// What a route needs of a token.
#[derive(Clone, Copy, PartialEq)]
enum Need {
    /// `GET /user`: `read_user`, `read_api` or `api`.
    User,
    Read,
    Write,
}

/// The token's user, or GitLab's 401/403. A token registered without scopes has them all.
fn authorize(state: &Shared, headers: &HeaderMap, need: Need) -> Result<String, Response> {
    let token = headers
        .get("private-token")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::trim)
        .unwrap_or("");
    let guard = lock(state);
    let Some(login) = guard.users.get(token).cloned() else {
        return Err(error(StatusCode::UNAUTHORIZED, "401 Unauthorized"));
    };
    if let Some(scopes) = guard.scopes.get(token) {
        let has = |s: &str| scopes.iter().any(|g| g == s);
        let (granted, wanted) = match need {
            Need::User => (
                has("api") || has("read_api") || has("read_user"),
                "api read_api read_user",
            ),
            Need::Read => (has("api") || has("read_api"), "api read_api"),
            Need::Write => (has("api"), "api"),
        };
        if !granted {
            return Err((
                StatusCode::FORBIDDEN,
                axum::Json(json!({
                    "error": "insufficient_scope",
                    "error_description": "The request requires higher privileges than provided by the access token.",
                    "scope": wanted,
                })),
            )
                .into_response());
        }
    }
    Ok(login)
}

const USER: u8 = 0;
const READ: u8 = 1;
const WRITE: u8 = 2;

/// The token's user when it may do what the route does, else GitLab's 401/403.
struct Scoped<const NEED: u8>(String);

impl<const NEED: u8> axum::extract::FromRequestParts<Shared> for Scoped<NEED> {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Shared,
    ) -> Result<Self, Response> {
        let need = match NEED {
            USER => Need::User,
            READ => Need::Read,
            _ => Need::Write,
        };
        authorize(state, &parts.headers, need).map(Scoped)
    }
}

fn user_json(login: &str) -> Value {
    json!({"id": login.len() as u64 * 1000 + login.bytes().map(u64::from).sum::<u64>(), "username": login, "name": login, "state": "active", "bot": login.contains("bot")})
}

/// The key of the repository a project id names, as GitLab's `find_project` reads `:id` ([S
/// lib/api/helpers.rb]): digits are the numeric id; text with a `/` is a full path, found
/// ignoring case with the exact spelling first ([S app/models/concerns/routable.rb]
/// `find_by_full_path`), at any depth of subgroups; anything else (a project's bare name)
/// names nothing. `id` arrives decoded: the router matched it as one segment, so a path whose
/// slashes were not encoded (`platform/team/gitops` in the URL) is another route, 404 ([S
/// lib/api/api.rb] `NO_SLASH_URL_PART_REGEX`; [D api/rest/_index.md "Namespaced paths"]).
fn project_key(state: &super::ForgeState, id: &str) -> Option<String> {
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        let number: u64 = id.parse().ok()?;
        return state
            .repos
            .iter()
            .find(|(_, r)| r.id == number)
            .map(|(k, _)| k.clone());
    }
    if !id.contains('/') {
        return None;
    }
    if state.repos.contains_key(id) {
        return Some(id.to_string());
    }
    state
        .repos
        .keys()
        .find(|key| key.eq_ignore_ascii_case(id))
        .cloned()
}

macro_rules! project_or_404 {
    ($state:expr, $id:expr) => {
        match project_key(&$state, &$id) {
            Some(key) => match $state.repos.get_mut(&key) {
                Some(repo) => repo,
                None => return not_found("Project"),
            },
            None => return not_found("Project"),
        }
    };
}

fn project_json(repo: &Repo) -> Value {
    let path = format!("{}/{}", repo.owner, repo.name);
    json!({"id": repo.id, "path": repo.name, "path_with_namespace": path, "default_branch": "main",
        "namespace": {"full_path": repo.owner, "path": repo.owner.rsplit('/').next().unwrap_or("")},
        "web_url": format!("http://gitlab.example.test/{path}")})
}

fn branch_sha(repo: &Repo, branch: &str) -> Option<String> {
    git::rev_parse(&repo.bare, &format!("refs/heads/{branch}"))
}

fn merge_request_json(repo: &Repo, pull: &super::Pull) -> Value {
    let head = branch_sha(repo, &pull.head_ref);
    let base = branch_sha(repo, &pull.base_ref);
    let state = if pull.merged {
        "merged"
    } else if pull.state == "open" {
        "opened"
    } else {
        "closed"
    };
    // [D api/merge_requests.md "Merge status"]: `detailed_merge_status` is `not_open` for a
    // closed or merged one, `ci_must_pass` while a status the project requires ("Pipelines
    // must succeed", the double's `protect`) has not succeeded on the head, else `mergeable`.
    let detailed = if state != "opened" {
        "not_open"
    } else if head.as_deref().is_some_and(|head| {
        repo.protection
            .get(&pull.base_ref)
            .into_iter()
            .flatten()
            .all(|name| check_passed(repo, head, name))
    }) {
        "mergeable"
    } else {
        "ci_must_pass"
    };
    let path = format!("{}/{}", repo.owner, repo.name);
    // A fork's merge request names its source project by id; the double's forks are other
    // repositories it holds.
    let source_project_id = if pull.head_repo.is_empty() || pull.head_repo == path {
        repo.id
    } else {
        repo.id + 1_000_000
    };
    json!({
        "id": repo.id * 100_000 + pull.number,
        "iid": pull.number,
        "project_id": repo.id,
        "title": pull.title,
        "description": pull.body,
        "state": state,
        "author": user_json(&pull.user),
        "source_branch": pull.head_ref,
        "target_branch": pull.base_ref,
        "source_project_id": source_project_id,
        "target_project_id": repo.id,
        "labels": pull.labels,
        "sha": head,
        "merge_commit_sha": pull.merge_commit_sha,
        "draft": false,
        "detailed_merge_status": detailed,
        "diff_refs": {"base_sha": base, "head_sha": head, "start_sha": base},
        "created_at": pull.created_at,
        "web_url": format!("http://gitlab.example.test/{path}/-/merge_requests/{}", pull.number),
    })
}

fn note_json(comment: &Comment) -> Value {
    json!({
        "id": comment.id,
        "type": null,
        "body": comment.body,
        "author": user_json(&comment.user),
        "created_at": comment.created_at,
        "updated_at": comment.updated_at,
        "system": comment.user.is_empty(),
        "noteable_type": "MergeRequest",
        "noteable_iid": comment.issue,
    })
}

fn label_json(label: &RepoLabel) -> Value {
    json!({"id": label.id, "name": label.name, "color": format!("#{}", label.color), "description": null})
}

fn status_json(status: &Status) -> Value {
    json!({"id": status.id, "sha": status.sha, "status": status.state, "name": status.context,
        "description": status.description, "target_url": null, "allow_failure": false,
        "author": user_json(&status.creator)})
}

/// One page of `items` as GitLab answers a list.
fn paged(items: Vec<Value>, query: &BTreeMap<String, String>, path: &str) -> Response {
    paged_with(items, query, path, |_| {})
}

/// [`paged`], showing the page answered to `seen` first.
fn paged_with(
    items: Vec<Value>,
    query: &BTreeMap<String, String>,
    path: &str,
    seen: impl FnOnce(&[Value]),
) -> Response {
    let per_page = match query.get("per_page").and_then(|v| v.parse::<usize>().ok()) {
        Some(0) | None => 20,
        Some(n) => n.min(100),
    };
    let page = query
        .get("page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let total = items.len();
    let pages = total.div_ceil(per_page).max(1);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    seen(&slice);
    let mut response = axum::Json(Value::Array(slice)).into_response();
    let headers = response.headers_mut();
    let next = if page < pages {
        (page + 1).to_string()
    } else {
        String::new()
    };
    let prev = if page > 1 {
        (page - 1).to_string()
    } else {
        String::new()
    };
    for (name, value) in [
        ("x-page", page.to_string()),
        ("x-per-page", per_page.to_string()),
        ("x-next-page", next.clone()),
        ("x-prev-page", prev),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    if total <= 10_000 {
        headers.insert("x-total", HeaderValue::from(total));
        headers.insert("x-total-pages", HeaderValue::from(pages));
    }
    let mut links = Vec::new();
    if !next.is_empty() {
        links.push(format!(
            "<{path}?page={next}&per_page={per_page}>; rel=\"next\""
        ));
    }
    links.push(format!(
        "<{path}?page=1&per_page={per_page}>; rel=\"first\""
    ));
    if let Ok(value) = HeaderValue::from_str(&links.join(", ")) {
        headers.insert("link", value);
    }
    response
}

async fn get_user(Scoped(login): Scoped<{ USER }>) -> Response {
    axum::Json(user_json(&login)).into_response()
}

async fn get_project(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let mut state = lock(&state);
    let repo = project_or_404!(state, id);
    axum::Json(project_json(repo)).into_response()
}

async fn list_merge_requests(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = project_or_404!(state, id);
    let wanted = query.get("state").map(String::as_str).unwrap_or("all");
    let all: Vec<Value> = repo
        .pulls
        .iter()
        .rev()
        .map(|p| merge_request_json(repo, p))
        .filter(|mr| wanted == "all" || mr["state"] == wanted)
        .filter(|mr| {
            query
                .get("source_branch")
                .is_none_or(|b| mr["source_branch"] == b.as_str())
        })
        .collect();
    let path = format!("/api/v4/projects/{id}/merge_requests");
    paged(all, &query, &path)
}

/// `POST .../merge_requests` with `source_branch`, `target_branch` and `title` (all required:
/// 400 "... is missing"); a second open merge request for the same branches is 409.
async fn create_merge_request(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ WRITE }>,
    UrlPath(id): UrlPath<String>,
    JsonBody(body): JsonBody,
) -> Response {
    let field = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_string);
    let (Some(source), Some(target), Some(title)) = (
        field("source_branch"),
        field("target_branch"),
        field("title"),
    ) else {
        return error(
            StatusCode::BAD_REQUEST,
            "source_branch, target_branch, title is missing",
        );
    };
    let mut guard = lock(&state);
    let now = guard.now();
    let repo = project_or_404!(guard, id);
    if branch_sha(repo, &source).is_none() || branch_sha(repo, &target).is_none() {
        return error(StatusCode::BAD_REQUEST, "Invalid branch");
    }
    if repo
        .pulls
        .iter()
        .any(|p| p.state == "open" && p.head_ref == source && p.base_ref == target)
    {
        return error(
            StatusCode::CONFLICT,
            "Another open merge request already exists for this source branch",
        );
    }
    let number = repo.pulls.iter().map(|p| p.number).max().unwrap_or(0) + 1;
    let pull = super::Pull {
        number,
        title,
        body: field("description").unwrap_or_default(),
        user,
        head_ref: source,
        base_ref: target,
        head_repo: format!("{}/{}", repo.owner, repo.name),
        state: "open".into(),
        merged: false,
        merge_commit_sha: None,
        labels: Vec::new(),
        created_at: now,
    };
    let json = merge_request_json(repo, &pull);
    repo.pulls.push(pull);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn get_merge_request(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath((id, iid)): UrlPath<(String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = project_or_404!(state, id);
    match repo.pulls.iter().find(|p| p.number == iid) {
        Some(pull) => axum::Json(merge_request_json(repo, pull)).into_response(),
        None => not_found("Merge Request"),
    }
}

/// Comma-separated label titles, as `add_labels` and `remove_labels` take them.
fn titles(body: &Value, key: &str) -> Vec<String> {
    match body.get(key) {
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// `PUT .../merge_requests/:iid`: `add_labels` creates what the project lacks and adds it,
/// `remove_labels` removes (a title not there is no error); each change leaves a system note.
async fn update_merge_request(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ WRITE }>,
    UrlPath((id, iid)): UrlPath<(String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let add = titles(&body, "add_labels");
    let remove = titles(&body, "remove_labels");
    let mut guard = lock(&state);
    let now = guard.now();
    let mut ids = Vec::new();
    for _ in &add {
        ids.push(guard.id());
    }
    let note_id = guard.id();
    let repo = project_or_404!(guard, id);
    let Some(index) = repo.pulls.iter().position(|p| p.number == iid) else {
        return not_found("Merge Request");
    };
    let mut changed = Vec::new();
    for (title, label_id) in add.iter().zip(ids) {
        if !repo.labels.iter().any(|l| &l.name == title) {
            repo.labels.push(RepoLabel {
                id: label_id,
                name: title.clone(),
                color: "6699cc".into(),
            });
        }
        if !repo.pulls[index].labels.contains(title) {
            repo.pulls[index].labels.push(title.clone());
            changed.push(format!("added ~{title}"));
        }
    }
    for title in &remove {
        let before = repo.pulls[index].labels.len();
        repo.pulls[index].labels.retain(|l| l != title);
        if repo.pulls[index].labels.len() != before {
            changed.push(format!("removed ~{title}"));
        }
    }
    if !changed.is_empty() {
        // A system note (no author of its own in the double: shown with `system: true`).
        repo.comments.push(Comment {
            id: note_id,
            issue: iid,
            user: String::new(),
            body: format!("{} label(s) by {user}", changed.join(" ")),
            created_at: now.clone(),
            updated_at: now,
            earlier: Vec::new(),
        });
    }
    axum::Json(merge_request_json(repo, &repo.pulls[index])).into_response()
}

/// `PUT .../merge`: 405 unless the pipeline (the statuses `protect` names) succeeded on the
/// head; 409 when `sha` is given and is not the head.
async fn merge(
    State(state): State<Shared>,
    _: Scoped<{ WRITE }>,
    UrlPath((id, iid)): UrlPath<(String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let mut guard = lock(&state);
    let repo = project_or_404!(guard, id);
    let Some(index) = repo.pulls.iter().position(|p| p.number == iid) else {
        return not_found("Merge Request");
    };
    let pull = repo.pulls[index].clone();
    if pull.state != "open" {
        return error(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed");
    }
    let Some(head) = branch_sha(repo, &pull.head_ref) else {
        return error(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed");
    };
    if let Some(sha) = body.get("sha").and_then(Value::as_str)
        && sha != head
    {
        return error(
            StatusCode::CONFLICT,
            "SHA does not match HEAD of source branch",
        );
    }
    let required = repo
        .protection
        .get(&pull.base_ref)
        .cloned()
        .unwrap_or_default();
    if !required.iter().all(|name| check_passed(repo, &head, name)) {
        return error(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed");
    }
    let message = format!(
        "Merge branch '{}' into '{}'\n\n{}\n\nSee merge request !{iid}",
        pull.head_ref, pull.base_ref, pull.title
    );
    match git::merge_into(&repo.bare, &pull.base_ref, &head, &message) {
        Ok(Some(commit)) => {
            let pull = &mut repo.pulls[index];
            pull.state = "closed".into();
            pull.merged = true;
            pull.merge_commit_sha = Some(commit);
            let json = merge_request_json(repo, &repo.pulls[index]);
            axum::Json(json).into_response()
        }
        Ok(None) => error(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed"),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// `GET .../diffs`: one entry per changed file between the merge base and the head.
async fn list_diffs(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath((id, iid)): UrlPath<(String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut guard = lock(&state);
    let repo = project_or_404!(guard, id);
    let Some(pull) = repo.pulls.iter().find(|p| p.number == iid) else {
        return not_found("Merge Request");
    };
    let (Some(head), Some(base)) = (
        branch_sha(repo, &pull.head_ref),
        branch_sha(repo, &pull.base_ref),
    ) else {
        return axum::Json(json!([])).into_response();
    };
    let range = format!("{base}...{head}");
    let listing = git::git(
        &repo.bare,
        &["diff", "--name-status", "--no-renames", &range],
    )
    .unwrap_or_default();
    let mut files = Vec::new();
    for line in listing.lines() {
        let Some((kind, path)) = line.split_once('\t') else {
            continue;
        };
        let diff = git::git(&repo.bare, &["diff", &range, "--", path]).unwrap_or_default();
        // The hunks only, as GitLab gives them (no `diff --git` header).
        let hunks = diff
            .find("\n@@")
            .map(|i| diff[i + 1..].to_string())
            .unwrap_or_default();
        files.push(json!({
            "old_path": path, "new_path": path, "a_mode": "100644", "b_mode": "100644",
            "diff": hunks, "new_file": kind == "A", "renamed_file": false,
            "deleted_file": kind == "D", "generated_file": false,
        }));
    }
    let path = format!("/api/v4/projects/{id}/merge_requests/{iid}/diffs");
    paged(files, &query, &path)
}

async fn list_notes(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath((id, iid)): UrlPath<(String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut guard = lock(&state);
    let state = &mut *guard;
    let repo = project_or_404!(state, id);
    if !repo.pulls.iter().any(|p| p.number == iid) {
        return not_found("Merge Request");
    }
    let mut notes: Vec<&Comment> = repo.comments.iter().filter(|c| c.issue == iid).collect();
    if query.get("order_by").map(String::as_str) == Some("updated_at") {
        notes.sort_by(|a, b| (&a.updated_at, a.id).cmp(&(&b.updated_at, b.id)));
    }
    if query.get("sort").map(String::as_str) != Some("asc") {
        notes.reverse();
    }
    let all: Vec<Value> = notes.into_iter().map(note_json).collect();
    let path = format!("/api/v4/projects/{id}/merge_requests/{iid}/notes");
    // The bodies served count towards what the comment walks' budgets are measured by.
    let served = &mut state.comment_bytes;
    paged_with(all, &query, &path, |page| {
        *served += page
            .iter()
            .map(|c| c["body"].as_str().map_or(0, str::len))
            .sum::<usize>();
    })
}

/// A note body GitLab takes: present, at most [`NOTE_LIMIT`] characters.
fn check_note(body: &Value) -> Result<String, Response> {
    let Some(text) = body.get("body").and_then(Value::as_str) else {
        return Err(error(StatusCode::BAD_REQUEST, "body is missing"));
    };
    if text.trim().is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "Note {:note=>[\"can't be blank\"]}",
        ));
    }
    if text.chars().count() > NOTE_LIMIT {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "Note {:note=>[\"is too long (maximum is 1000000 characters)\"]}",
        ));
    }
    Ok(text.to_string())
}

async fn create_note(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ WRITE }>,
    UrlPath((id, iid)): UrlPath<(String, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let text = match check_note(&body) {
        Ok(text) => text,
        Err(response) => return response,
    };
    let mut guard = lock(&state);
    let note_id = guard.id();
    let now = guard.now();
    let repo = project_or_404!(guard, id);
    let Some(comment) = repo.add_comment(note_id, iid, user, &text, now).cloned() else {
        return not_found("Merge Request");
    };
    (StatusCode::CREATED, axum::Json(note_json(&comment))).into_response()
}

/// Only the author edits a note: 403 "403 Forbidden" otherwise; a note of another merge
/// request is 404.
async fn update_note(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ WRITE }>,
    UrlPath((id, iid, note)): UrlPath<(String, u64, u64)>,
    JsonBody(body): JsonBody,
) -> Response {
    let text = match check_note(&body) {
        Ok(text) => text,
        Err(response) => return response,
    };
    let mut guard = lock(&state);
    let now = guard.now();
    let repo = project_or_404!(guard, id);
    let Some(index) = repo
        .comments
        .iter()
        .position(|c| c.id == note && c.issue == iid)
    else {
        return not_found("Note");
    };
    if repo.comments[index].user != user {
        return error(StatusCode::FORBIDDEN, "403 Forbidden");
    }
    if repo.comments[index].body != text {
        repo.comments[index].edit(&text, now);
    }
    axum::Json(note_json(&repo.comments[index])).into_response()
}

async fn list_labels(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = project_or_404!(state, id);
    let all: Vec<Value> = repo.labels.iter().map(label_json).collect();
    paged(all, &query, &format!("/api/v4/projects/{id}/labels"))
}

async fn create_label(
    State(state): State<Shared>,
    _: Scoped<{ WRITE }>,
    UrlPath(id): UrlPath<String>,
    JsonBody(body): JsonBody,
) -> Response {
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    let color = body.get("color").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() || color.is_empty() {
        return error(StatusCode::BAD_REQUEST, "name, color is missing");
    }
    if name.contains(',') {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"message": {"title": ["is invalid"]}})),
        )
            .into_response();
    }
    let mut guard = lock(&state);
    let label_id = guard.id();
    let repo = project_or_404!(guard, id);
    if repo.labels.iter().any(|l| l.name == name) {
        return error(StatusCode::CONFLICT, "Label already exists");
    }
    let label = RepoLabel {
        id: label_id,
        name: name.to_string(),
        color: color.trim_start_matches('#').to_string(),
    };
    let json = label_json(&label);
    repo.labels.push(label);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn create_status(
    State(state): State<Shared>,
    Scoped(user): Scoped<{ WRITE }>,
    UrlPath((id, sha)): UrlPath<(String, String)>,
    JsonBody(body): JsonBody,
) -> Response {
    let wanted = body.get("state").and_then(Value::as_str).unwrap_or("");
    if ![
        "pending", "running", "success", "failed", "canceled", "skipped",
    ]
    .contains(&wanted)
    {
        return error(StatusCode::BAD_REQUEST, "state does not have a valid value");
    }
    let name = body
        .get("name")
        .or_else(|| body.get("context"))
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let description = body
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut guard = lock(&state);
    let status_id = guard.id();
    let repo = project_or_404!(guard, id);
    if resolve(repo, &sha).as_deref() != Some(sha.as_str()) {
        return not_found("Commit");
    }
    // A status still pending or running is the one the new state moves.
    let live = repo.statuses.iter().rposition(|s| {
        s.sha == sha && s.context == name && (s.state == "pending" || s.state == "running")
    });
    if let Some(index) = live {
        let from = repo.statuses[index].state.clone();
        if from == wanted {
            let event = if wanted == "pending" {
                "enqueue"
            } else {
                "run"
            };
            return error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "Cannot transition status via :{event} from :{from} (Reason(s): Status cannot transition via \"{event}\")"
                ),
            );
        }
        let status = &mut repo.statuses[index];
        status.state = wanted.to_string();
        status.description = description;
        status.creator = user;
        return (StatusCode::CREATED, axum::Json(status_json(status))).into_response();
    }
    let status = Status {
        id: status_id,
        sha,
        context: name,
        state: wanted.to_string(),
        description,
        creator: user,
    };
    let json = status_json(&status);
    repo.statuses.push(status);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

async fn list_statuses(
    State(state): State<Shared>,
    _: Scoped<{ READ }>,
    UrlPath((id, sha)): UrlPath<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = project_or_404!(state, id);
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
        &format!("/api/v4/projects/{id}/repository/commits/{sha}/statuses"),
    )
}
