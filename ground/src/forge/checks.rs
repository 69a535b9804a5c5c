//! The GitHub face's commit statuses and check runs.

use std::collections::BTreeMap;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::forge::{Authed, CheckRun, JsonBody, Repo, Shared, Status, error, lock, user_json};
use crate::git;

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

pub(super) fn resolve(repo: &Repo, reference: &str) -> Option<String> {
    git::rev_parse(&repo.bare, reference)
        .or_else(|| git::rev_parse(&repo.bare, &format!("refs/heads/{reference}")))
}

pub(super) async fn create_status(
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

pub(super) async fn combined_status(
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

pub(super) async fn create_check_run(
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

pub(super) async fn update_check_run(
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

pub(super) async fn list_check_runs(
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
