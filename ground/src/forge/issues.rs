//! The GitHub face's issue comments and labels on pull requests.

use std::collections::BTreeMap;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::forge::{Authed, Comment, JsonBody, Repo, Shared, error, lock, user_json};

pub(super) fn label_json(name: &str) -> Value {
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

pub(super) async fn list_comments(
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
    let all: Vec<&Comment> = repo.comments.iter().filter(|c| c.issue == number).collect();
    let total = all.len();
    let slice: Vec<Value> = all
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|c| comment_json(repo, c))
        .collect();
    let served: usize = slice
        .iter()
        .map(|c| c["body"].as_str().map_or(0, str::len))
        .sum();
    // GitHub's `Link` header ("Using pagination in the REST API", docs.github.com): `prev`
    // and `first` from the second page on, `next` and `last` before the last page; the
    // other query parameters are kept.
    let last = total.div_ceil(per_page).max(1);
    let url = |page: usize| {
        format!(
            "<https://api.github.com/repos/{owner}/{}/issues/{number}/comments?per_page={per_page}&page={page}>",
            repo.name
        )
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", url(page - 1)));
    }
    if page < last {
        links.push(format!("{}; rel=\"next\"", url(page + 1)));
        links.push(format!("{}; rel=\"last\"", url(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"first\"", url(1)));
    }
    state.comment_bytes += served;
    let mut response = axum::Json(Value::Array(slice)).into_response();
    if let Some(value) = (!links.is_empty())
        .then(|| links.join(", "))
        .and_then(|v| axum::http::HeaderValue::from_str(&v).ok())
    {
        response.headers_mut().insert("link", value);
    }
    response
}

pub(super) async fn create_comment(
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
    let Some(comment) = repo.add_comment(id, number, user, text, now).cloned() else {
        return error(StatusCode::NOT_FOUND, "Not Found");
    };
    let json = comment_json(repo, &comment);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

pub(super) async fn update_comment(
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
    repo.comments[index].edit(text, now);
    let json = comment_json(repo, &repo.comments[index]);
    axum::Json(json).into_response()
}

pub(super) async fn list_labels(
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

pub(super) async fn add_labels(
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

pub(super) async fn remove_label(
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
