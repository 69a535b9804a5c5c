//! The Gitea face's labels: repository labels (ids, colours) and an issue's labels, added by
//! id or name and removed by id ([G routers/api/v1/repo/issue_label.go], [G
//! routers/api/v1/repo/label.go]).

use std::collections::BTreeMap;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::forge::gitea::{
    ISSUE, RepoLabel, Scoped, error, issue_label, label_json, not_found, paged,
};
use crate::forge::{JsonBody, Shared, lock};

pub(super) async fn list_repo_labels(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, false>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    let all: Vec<Value> = repo.labels.iter().map(label_json).collect();
    paged(
        all,
        &query,
        &format!("/api/v1/repos/{}/{}/labels", repo.owner, repo.name),
    )
}

/// A colour as Gitea's `label.NormalizeColor` takes it: `#rgb` or `#rrggbb`, `#` optional.
fn normalize_color(color: &str) -> Option<String> {
    let hex = color.strip_prefix('#').unwrap_or(color);
    let ok = matches!(hex.len(), 3 | 6) && hex.chars().all(|c| c.is_ascii_hexdigit());
    ok.then(|| format!("#{}", hex.to_ascii_lowercase()))
}

pub(super) async fn create_label(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, true>,
    UrlPath((owner, repo)): UrlPath<(String, String)>,
    JsonBody(body): JsonBody<true>,
) -> Response {
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "[Name]: Required");
    }
    let Some(color) = body
        .get("color")
        .and_then(Value::as_str)
        .and_then(normalize_color)
    else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "StringToColor: invalid color format",
        );
    };
    let mut guard = lock(&state);
    let id = guard.id();
    let repo = repo_or_404!(guard, owner, repo);
    let label = RepoLabel {
        id,
        name: name.to_string(),
        color: color.trim_start_matches('#').to_string(),
    };
    let json = label_json(&label);
    repo.labels.push(label);
    (StatusCode::CREATED, axum::Json(json)).into_response()
}

pub(super) async fn list_issue_labels(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, false>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
) -> Response {
    let mut state = lock(&state);
    let repo = repo_or_404!(state, owner, repo);
    match repo.pulls.iter().find(|p| p.number == number) {
        Some(pull) => axum::Json(
            pull.labels
                .iter()
                .map(|l| issue_label(repo, l))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        None => not_found(),
    }
}

pub(super) async fn add_issue_labels(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, true>,
    UrlPath((owner, repo, number)): UrlPath<(String, String, u64)>,
    JsonBody(body): JsonBody<true>,
) -> Response {
    let wanted = body
        .get("labels")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let (mut ids, mut names) = (Vec::new(), Vec::new());
    for label in &wanted {
        match label {
            Value::Number(n) => ids.push(n.as_f64().unwrap_or(0.0) as u64),
            Value::String(s) => names.push(s.clone()),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "a label must be an integer or a string",
                );
            }
        }
    }
    if !ids.is_empty() && !names.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "labels should be an array of strings or integers",
        );
    }
    let mut guard = lock(&state);
    let repo = repo_or_404!(guard, owner, repo);
    // Names and ids the repository does not have are dropped without a word.
    let known: Vec<String> = repo
        .labels
        .iter()
        .filter(|l| ids.contains(&l.id) || names.contains(&l.name))
        .map(|l| l.name.clone())
        .collect();
    let Some(index) = repo.pulls.iter().position(|p| p.number == number) else {
        return not_found();
    };
    for name in known {
        if !repo.pulls[index].labels.contains(&name) {
            repo.pulls[index].labels.push(name);
        }
    }
    let labels: Vec<Value> = repo.pulls[index]
        .labels
        .iter()
        .map(|l| issue_label(repo, l))
        .collect();
    axum::Json(labels).into_response()
}

pub(super) async fn remove_issue_label(
    State(state): State<Shared>,
    _: Scoped<{ ISSUE }, true>,
    UrlPath((owner, repo, number, id)): UrlPath<(String, String, u64, String)>,
) -> Response {
    let mut guard = lock(&state);
    let repo = repo_or_404!(guard, owner, repo);
    let Some(index) = repo.pulls.iter().position(|p| p.number == number) else {
        return not_found();
    };
    // The id path parameter is an int64; a name there is a label that does not exist.
    let label = id
        .parse::<u64>()
        .ok()
        .and_then(|id| repo.labels.iter().find(|l| l.id == id))
        .cloned();
    let Some(label) = label else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("label does not exist [label_id: {id}]"),
        );
    };
    repo.pulls[index].labels.retain(|l| *l != label.name);
    StatusCode::NO_CONTENT.into_response()
}
