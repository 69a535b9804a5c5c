//! The GitHub face's pull requests: list, open, read, and merge under branch protection.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::issues::label_json;
use crate::forge::{Authed, JsonBody, Pull, Repo, Shared, error, lock, repo_json, user_json};
use crate::git;

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

pub(super) async fn list_pulls(
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

pub(super) async fn create_pull(
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

pub(super) async fn get_pull(
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
pub(super) fn check_passed(repo: &Repo, sha: &str, context: &str) -> bool {
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

pub(super) async fn merge_pull(
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
