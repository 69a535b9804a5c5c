//! Pull request steps over the forge's REST API: git-open-pr, git-wait-for-pr, git-merge-pr.

use serde_json::json;

use super::*;

pub(super) async fn git_open_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
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
    // Adopt an open pull request for the same branches (a retried step must not open two).
    let existing = client
        .get(format!(
            "{}/repos/{slug}/pulls?state=open&head={source}",
            ctx.kargo.forge_url
        ))
        .bearer_auth(&ctx.kargo.forge_token)
        .send()
        .await;
    if let Ok(response) = existing
        && let Ok(Value::Array(pulls)) = response.json::<Value>().await
        && let Some(pull) = pulls
            .iter()
            .find(|p| p.pointer("/base/ref").and_then(Value::as_str) == Some(target))
    {
        let number = pull["number"].clone();
        return Outcome::Done {
            output: json!({"pr": {"id": number, "url": pull["html_url"]}}),
            said: format!("adopted open pull request #{number}"),
        };
    }
    let response = client
        .post(format!("{}/repos/{slug}/pulls", ctx.kargo.forge_url))
        .bearer_auth(&ctx.kargo.forge_token)
        .json(&json!({"title": title, "head": source, "base": target, "body": text(config, "description")}))
        .send()
        .await;
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            return Outcome::Failed {
                said: e.to_string(),
            };
        }
    };
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status.as_u16() == 422 && text(&body, "message").contains("No commits between") {
        return Outcome::Skipped {
            output: json!({}),
            said: "no difference between the branches".to_string(),
        };
    }
    if !status.is_success() {
        return Outcome::Failed {
            said: format!(
                "the forge refused the pull request: HTTP {status}: {}",
                text(&body, "message")
            ),
        };
    }
    let number = body["number"].clone();
    let labels: Vec<Value> = config
        .get("labels")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !labels.is_empty() {
        let _ = client
            .post(format!(
                "{}/repos/{slug}/issues/{number}/labels",
                ctx.kargo.forge_url
            ))
            .bearer_auth(&ctx.kargo.forge_token)
            .json(&json!({"labels": labels}))
            .send()
            .await;
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
    let response = http_client()
        .get(format!(
            "{}/repos/{slug}/pulls/{number}",
            ctx.kargo.forge_url
        ))
        .bearer_auth(&ctx.kargo.forge_token)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!(
            "HTTP {} reading pull request #{number}",
            response.status()
        ));
    }
    response.json().await.map_err(|e| e.to_string())
}

pub(super) async fn git_wait_for_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
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
        Ok(pull) if text(&pull, "state") == "closed" => Outcome::Failed {
            said: format!("pull request #{number} was closed without merging"),
        },
        Ok(_) => Outcome::Waiting {
            said: format!("pull request #{number} is open"),
        },
        Err(said) => Outcome::Waiting { said },
    }
}

pub(super) async fn git_merge_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    let Some(number) = pr_number(config) else {
        return Outcome::Failed {
            said: "prNumber is required".into(),
        };
    };
    let (slug, _) = match git_url(ctx, text(config, "repoURL")) {
        Ok(found) => found.clone(),
        Err(said) => return Outcome::Failed { said },
    };
    if let Ok(pull) = get_pull(ctx, &slug, number).await
        && pull["merged"] == json!(true)
    {
        let commit = text(&pull, "merge_commit_sha").to_string();
        return Outcome::Done {
            output: json!({"commit": commit}),
            said: format!("pull request #{number} was already merged"),
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
            return Outcome::Waiting {
                said: e.to_string(),
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
        _ => Outcome::Failed {
            said: format!(
                "the forge refused to merge #{number}: HTTP {status}: {}",
                text(&body, "message")
            ),
        },
    }
}
