//! Pull request steps over the forge's REST API: git-open-pr, git-wait-for-pr, git-merge-pr.
//!
//! [K pkg/promotion/runner/builtin/git_pr_opener.go, git_pr_waiter.go]: every forge error is a
//! recoverable error (step status Errored), which the orchestrator retries only below the
//! step's `retry.errorThreshold` (default 1): with the default, the first forge 5xx or rate
//! limit ends the Promotion Errored. Kargo's GitHub client does not retry on its own
//! (pkg/github/github.go: a plain transport).

use serde_json::Value;
use serde_json::json;

use crate::kargo::steps::{Outcome, StepContext, git_url, http_client, text};

mod gitlab;

/// Whether a step's config names Kargo's GitLab provider.
fn on_gitlab(config: &Value) -> bool {
    text(config, "provider") == "gitlab"
}

/// A forge request that failed, worded as Kargo's GitHub client (go-github's `ErrorResponse`)
/// words it: `METHOD URL: STATUS MESSAGE []`, or the transport's error.
async fn forge_error(
    method: &str,
    url: &str,
    response: Result<reqwest::Response, reqwest::Error>,
) -> Result<reqwest::Response, String> {
    let response = response.map_err(|e| format!("{method} {url}: {e}"))?;
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    Err(format!(
        "{method} {url}: {status} {} []",
        text(&body, "message")
    ))
}

pub(super) async fn git_open_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    if on_gitlab(config) {
        return gitlab::open(ctx, config).await;
    }
    let repo_url = text(config, "repoURL");
    let (slug, _) = match git_url(ctx, repo_url) {
        Ok(found) => found.clone(),
        Err(said) => return Outcome::Failed { said },
    };
    let (source, target) = (text(config, "sourceBranch"), text(config, "targetBranch"));
    let target = if target.is_empty() { "main" } else { target };
    let title = if text(config, "title").is_empty() {
        format!("Promote to {}", ctx.stage)
    } else {
        text(config, "title").to_string()
    };
    let client = http_client();
    // Adopt an open pull request for the same branches (a retried step must not open two);
    // a forge error while looking Errors the step, as Kargo's does.
    let list_url = format!(
        "{}/repos/{slug}/pulls?state=open&head={source}",
        ctx.kargo.forge_url
    );
    let listed = client
        .get(&list_url)
        .bearer_auth(&ctx.kargo.forge_token)
        .send()
        .await;
    let existing = match forge_error("GET", &list_url, listed).await {
        Ok(response) => response.json::<Value>().await.unwrap_or(Value::Null),
        Err(e) => {
            return Outcome::Errored {
                said: format!(
                    "error determining if pull request already exists: error listing pull requests: {e}"
                ),
            };
        }
    };
    if let Some(pull) = existing
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p.pointer("/base/ref").and_then(Value::as_str) == Some(target))
    {
        let number = pull["number"].clone();
        return Outcome::Done {
            output: json!({"pr": {"id": number, "url": pull["html_url"]}}),
            said: format!("adopted open pull request #{number}"),
        };
    }
    let create_url = format!("{}/repos/{slug}/pulls", ctx.kargo.forge_url);
    let response = client
        .post(&create_url)
        .bearer_auth(&ctx.kargo.forge_token)
        .json(&json!({"title": title, "head": source, "base": target, "body": text(config, "description")}))
        .send()
        .await;
    // Kargo compares the branches first and Skips when they do not differ; the forge's 422
    // "No commits between" says the same here.
    let response = match response {
        Ok(r) if r.status().as_u16() == 422 => {
            let body: Value = r.json().await.unwrap_or(Value::Null);
            if text(&body, "message").contains("No commits between") {
                return Outcome::Skipped {
                    output: json!({}),
                    said: "no difference between the branches".to_string(),
                };
            }
            return Outcome::Errored {
                said: format!(
                    "error creating pull request: POST {create_url}: 422 {} []",
                    text(&body, "message")
                ),
            };
        }
        other => other,
    };
    let body: Value = match forge_error("POST", &create_url, response).await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(e) => {
            return Outcome::Errored {
                said: format!("error creating pull request: {e}"),
            };
        }
    };
    let number = body["number"].clone();
    let labels: Vec<Value> = config
        .get("labels")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !labels.is_empty() {
        let labels_url = format!(
            "{}/repos/{slug}/issues/{number}/labels",
            ctx.kargo.forge_url
        );
        let labelled = client
            .post(&labels_url)
            .bearer_auth(&ctx.kargo.forge_token)
            .json(&json!({"labels": labels}))
            .send()
            .await;
        // [K pkg/gitprovider/github/github.go CreatePullRequest]: a label error is the step's.
        if let Err(e) = forge_error("POST", &labels_url, labelled).await {
            return Outcome::Errored {
                said: format!("error creating pull request: {e}"),
            };
        }
    }
    Outcome::Done {
        output: json!({"pr": {"id": number, "url": body["html_url"]}}),
        said: format!("opened pull request #{number} \"{title}\" ({source} -> {target})"),
    }
}

fn pr_number(config: &Value) -> Option<u64> {
    match config.get("prNumber") {
        Some(Value::Number(n)) => n.as_u64().or_else(|| n.as_f64().map(|f| f as u64)),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    }
}

async fn get_pull(ctx: &StepContext<'_>, slug: &str, number: u64) -> Result<Value, String> {
    let url = format!("{}/repos/{slug}/pulls/{number}", ctx.kargo.forge_url);
    let response = http_client()
        .get(&url)
        .bearer_auth(&ctx.kargo.forge_token)
        .send()
        .await;
    let response = forge_error("GET", &url, response).await?;
    response.json().await.map_err(|e| format!("GET {url}: {e}"))
}

pub(super) async fn git_wait_for_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    if on_gitlab(config) {
        return gitlab::wait(ctx, config).await;
    }
    let Some(number) = pr_number(config) else {
        return Outcome::Failed {
            said: "prNumber is required".into(),
        };
    };
    let (slug, _) = match git_url(ctx, text(config, "repoURL")) {
        Ok(found) => found.clone(),
        Err(said) => return Outcome::Failed { said },
    };
    match get_pull(ctx, &slug, number).await {
        Ok(pull) if pull["merged"] == json!(true) => {
            let commit = text(&pull, "merge_commit_sha").to_string();
            Outcome::Done {
                output: json!({"commit": commit, "pr": {"id": number, "open": false, "merged": true}}),
                said: format!(
                    "pull request #{number} merged as {}",
                    &commit[..commit.len().min(7)]
                ),
            }
        }
        // [K git_pr_waiter.go]: a terminal failure.
        Ok(pull) if text(&pull, "state") == "closed" => Outcome::Failed {
            said: format!("pull request {number} was closed without being merged"),
        },
        Ok(_) => Outcome::Waiting {
            said: format!("pull request #{number} is open"),
        },
        // [K git_pr_waiter.go]: a forge error is Errored, not a wait.
        Err(e) => Outcome::Errored {
            said: format!("error getting pull request {number}: {e}"),
        },
    }
}

pub(super) async fn git_merge_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    if on_gitlab(config) {
        return gitlab::merge(ctx, config).await;
    }
    let Some(number) = pr_number(config) else {
        return Outcome::Failed {
            said: "prNumber is required".into(),
        };
    };
    let (slug, _) = match git_url(ctx, text(config, "repoURL")) {
        Ok(found) => found.clone(),
        Err(said) => return Outcome::Failed { said },
    };
    // [K git_pr_merger.go, pkg/gitprovider/github/github.go MergePullRequest]: any error
    // reading or merging the pull request is a terminal failure of the step.
    let pull = match get_pull(ctx, &slug, number).await {
        Ok(pull) => pull,
        Err(e) => {
            return Outcome::Failed {
                said: format!(
                    "error merging pull request {number}: error getting pull request {number}: {e}"
                ),
            };
        }
    };
    if pull["merged"] == json!(true) {
        let commit = text(&pull, "merge_commit_sha").to_string();
        return Outcome::Done {
            output: json!({"commit": commit}),
            said: format!("pull request #{number} was already merged"),
        };
    }
    if text(&pull, "state") == "closed" {
        return Outcome::Failed {
            said: format!(
                "error merging pull request {number}: pull request {number} is closed but not merged"
            ),
        };
    }
    let response = http_client()
        .put(format!(
            "{}/repos/{slug}/pulls/{number}/merge",
            ctx.kargo.forge_url
        ))
        .bearer_auth(&ctx.kargo.forge_token)
        .json(&json!({"merge_method": text(config, "mergeMethod")}))
        .send()
        .await;
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            return Outcome::Failed {
                said: format!("error merging pull request {number}: {e}"),
            };
        }
    };
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    match status {
        200 => {
            let commit = text(&body, "sha").to_string();
            Outcome::Done {
                output: json!({"commit": commit}),
                said: format!(
                    "merged pull request #{number} as {}",
                    &commit[..commit.len().min(7)]
                ),
            }
        }
        405 | 409 if config.get("wait").and_then(Value::as_bool).unwrap_or(false) => {
            Outcome::Waiting {
                said: format!(
                    "the forge will not merge #{number} yet: {}",
                    text(&body, "message")
                ),
            }
        }
        405 | 409 => Outcome::Failed {
            said: format!("pull request {number} is not ready to merge and wait is disabled"),
        },
        _ => Outcome::Failed {
            said: format!(
                "error merging pull request {number}: PUT {}/repos/{slug}/pulls/{number}/merge: {status} {} []",
                ctx.kargo.forge_url,
                text(&body, "message")
            ),
        },
    }
}
