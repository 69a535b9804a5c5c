//! The forge over GitHub's REST API (`api.github.com`, GitHub Enterprise's `/api/v3`, or any
//! server speaking the same subset, such as the proving ground's forge double).
//!
//! Plain HTTP with reqwest rather than octocrab: the product needs a dozen endpoints, and
//! octocrab would add a second TLS stack and ~90 s of build for them.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    CheckRun, Comment, CommitStatus, Conclusion, Forge, ForgeError, PullRequest, RepoSlug,
    StatusState,
};

/// Installs the process-wide TLS crypto provider (ring) once; later calls are no-ops.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Clone)]
pub struct GitHub {
    client: reqwest::Client,
    base: String,
    token: String,
    /// Retries for idempotent requests that meet 5xx or a rate limit.
    retries: u32,
}

impl GitHub {
    /// `base` is the API root: `https://api.github.com`, `https://ghe.example/api/v3`, or a
    /// double on loopback.
    pub fn new(base: &str, token: &str) -> Result<GitHub, ForgeError> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("gitops-loop/", env!("CARGO_PKG_VERSION")))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ForgeError::Transport {
                method: "-".into(),
                path: base.into(),
                message: e.to_string(),
            })?;
        Ok(GitHub {
            client,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            retries: 3,
        })
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ForgeError> {
        let idempotent = method != Method::POST;
        let mut attempt = 0;
        loop {
            let mut request = self
                .client
                .request(method.clone(), format!("{}{path}", self.base))
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28");
            if !self.token.is_empty() {
                request = request.bearer_auth(&self.token);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let outcome = request.send().await;
            let error = |message: String| ForgeError::Transport {
                method: method.to_string(),
                path: path.to_string(),
                message,
            };
            let response = match outcome {
                Ok(response) => response,
                Err(e) if idempotent && attempt < self.retries => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                    let _ = e;
                    continue;
                }
                Err(e) => return Err(error(e.to_string())),
            };
            let status = response.status();
            let rate_limited = status == StatusCode::TOO_MANY_REQUESTS
                || (status == StatusCode::FORBIDDEN
                    && response
                        .headers()
                        .get("x-ratelimit-remaining")
                        .is_some_and(|v| v == "0"));
            // A rate-limited request was not processed, so even a POST may be retried.
            let retry = (rate_limited || (idempotent && status.is_server_error()))
                && attempt < self.retries;
            if retry {
                attempt += 1;
                let wait = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(|s| Duration::from_secs(s.min(10)))
                    .unwrap_or_else(|| backoff(attempt));
                tokio::time::sleep(wait).await;
                continue;
            }
            let text = response.text().await.map_err(|e| error(e.to_string()))?;
            if !status.is_success() {
                let message = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_else(|| text.chars().take(200).collect());
                return Err(ForgeError::Http {
                    method: method.to_string(),
                    path: path.to_string(),
                    status: status.as_u16(),
                    message,
                });
            }
            if text.trim().is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_str(&text).map_err(|e| ForgeError::Decode {
                method: method.to_string(),
                path: path.to_string(),
                message: e.to_string(),
            });
        }
    }

    fn decode<T: for<'de> Deserialize<'de>>(
        value: Value,
        method: &str,
        path: &str,
    ) -> Result<T, ForgeError> {
        serde_json::from_value(value).map_err(|e| ForgeError::Decode {
            method: method.into(),
            path: path.into(),
            message: e.to_string(),
        })
    }

    /// One request whose answer decodes into `T`.
    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ForgeError> {
        let value = self.request(method.clone(), path, body).await?;
        Self::decode(value, method.as_str(), path)
    }

    /// Every page of a list endpoint (`per_page=100`).
    async fn list(&self, path: &str) -> Result<Vec<Value>, ForgeError> {
        let mut all = Vec::new();
        for page in 1.. {
            let separator = if path.contains('?') { '&' } else { '?' };
            let value = self
                .request(
                    Method::GET,
                    &format!("{path}{separator}per_page=100&page={page}"),
                    None,
                )
                .await?;
            let items = match value {
                Value::Array(items) => items,
                other => {
                    return Err(ForgeError::Decode {
                        method: "GET".into(),
                        path: path.into(),
                        message: format!("expected a list, got {other}"),
                    });
                }
            };
            let done = items.len() < 100;
            all.extend(items);
            if done {
                break;
            }
        }
        Ok(all)
    }
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 * 2u64.pow(attempt.min(5)))
}

#[derive(Deserialize)]
struct User {
    login: String,
}

#[derive(Deserialize)]
struct Label {
    name: String,
}

#[derive(Deserialize)]
struct RepoRef {
    full_name: String,
}

#[derive(Deserialize)]
struct Branch {
    sha: String,
    #[serde(rename = "ref")]
    reference: String,
    repo: Option<RepoRef>,
}

#[derive(Deserialize)]
struct Pull {
    number: u64,
    state: String,
    title: String,
    user: User,
    head: Branch,
    base: Branch,
    #[serde(default)]
    labels: Vec<Label>,
    #[serde(default)]
    merged: bool,
}

#[derive(Deserialize)]
struct IssueComment {
    id: u64,
    user: User,
    #[serde(default)]
    body: String,
}

impl From<IssueComment> for Comment {
    fn from(c: IssueComment) -> Self {
        Comment {
            id: c.id,
            author: c.user.login,
            body: c.body,
        }
    }
}

#[derive(Deserialize)]
struct CheckRunPayload {
    id: u64,
    name: String,
    head_sha: String,
    conclusion: Option<String>,
    #[serde(default)]
    output: Option<CheckOutput>,
    #[serde(default)]
    external_id: Option<String>,
    #[serde(default)]
    app: Option<AppPayload>,
}

#[derive(Deserialize, Default)]
struct AppPayload {
    #[serde(default)]
    slug: String,
}

#[derive(Deserialize, Default)]
struct CreatorPayload {
    #[serde(default)]
    login: String,
}

#[derive(Deserialize, Default)]
struct CheckOutput {
    title: Option<String>,
    summary: Option<String>,
}

#[derive(Deserialize)]
struct CheckRunList {
    check_runs: Vec<CheckRunPayload>,
}

#[derive(Deserialize)]
struct StatusPayload {
    context: String,
    state: StatusState,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    creator: Option<CreatorPayload>,
}

#[derive(Deserialize)]
struct CombinedStatus {
    statuses: Vec<StatusPayload>,
}

fn conclusion_text(conclusion: Conclusion) -> &'static str {
    match conclusion {
        Conclusion::Success => "success",
        Conclusion::Failure => "failure",
        Conclusion::Neutral => "neutral",
    }
}

/// GitHub caps a check run's summary at 65,535 characters.
fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        text.chars().take(max).collect()
    }
}

#[async_trait::async_trait]
impl Forge for GitHub {
    async fn current_user(&self) -> Result<String, ForgeError> {
        let user: User = self.call(Method::GET, "/user", None).await?;
        Ok(user.login)
    }

    async fn pull_request(&self, repo: &RepoSlug, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("/repos/{repo}/pulls/{number}");
        let pull: Pull = self.call(Method::GET, &path, None).await?;
        Ok(PullRequest {
            number: pull.number,
            state: pull.state,
            title: pull.title,
            author: pull.user.login,
            head_sha: pull.head.sha,
            head_ref: pull.head.reference,
            head_repo: pull.head.repo.map(|r| r.full_name).unwrap_or_default(),
            base_sha: pull.base.sha,
            base_ref: pull.base.reference,
            labels: pull.labels.into_iter().map(|l| l.name).collect(),
            merged: pull.merged,
        })
    }

    async fn comments(&self, repo: &RepoSlug, number: u64) -> Result<Vec<Comment>, ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/comments");
        self.list(&path)
            .await?
            .into_iter()
            .map(|v| Self::decode::<IssueComment>(v, "GET", &path).map(Comment::from))
            .collect()
    }

    async fn create_comment(
        &self,
        repo: &RepoSlug,
        number: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/comments");
        let c: IssueComment = self
            .call(Method::POST, &path, Some(&json!({"body": body})))
            .await?;
        Ok(c.into())
    }

    async fn update_comment(
        &self,
        repo: &RepoSlug,
        comment_id: u64,
        body: &str,
    ) -> Result<Comment, ForgeError> {
        let path = format!("/repos/{repo}/issues/comments/{comment_id}");
        let c: IssueComment = self
            .call(Method::PATCH, &path, Some(&json!({"body": body})))
            .await?;
        Ok(c.into())
    }

    async fn upsert_check_run(&self, repo: &RepoSlug, run: &CheckRun) -> Result<u64, ForgeError> {
        let list_path = format!(
            "/repos/{repo}/commits/{}/check-runs?check_name={}",
            run.head_sha, run.name
        );
        let existing: CheckRunList = self.call(Method::GET, &list_path, None).await?;
        let body = json!({
            "name": run.name,
            "head_sha": run.head_sha,
            "status": "completed",
            "conclusion": conclusion_text(run.conclusion),
            "output": {"title": cap(&run.title, 1000), "summary": cap(&run.summary, 65_535)},
            "external_id": run.external_id,
        });
        let (method, path) = match existing.check_runs.iter().find(|r| r.name == run.name) {
            Some(found) => (
                Method::PATCH,
                format!("/repos/{repo}/check-runs/{}", found.id),
            ),
            None => (Method::POST, format!("/repos/{repo}/check-runs")),
        };
        let created: CheckRunPayload = self.call(method, &path, Some(&body)).await?;
        Ok(created.id)
    }

    async fn check_runs(&self, repo: &RepoSlug, sha: &str) -> Result<Vec<CheckRun>, ForgeError> {
        let path = format!("/repos/{repo}/commits/{sha}/check-runs");
        let list: CheckRunList = self.call(Method::GET, &path, None).await?;
        Ok(list
            .check_runs
            .into_iter()
            .map(|r| {
                let output = r.output.unwrap_or_default();
                CheckRun {
                    name: r.name,
                    head_sha: r.head_sha,
                    conclusion: match r.conclusion.as_deref() {
                        Some("success") => Conclusion::Success,
                        Some("neutral") | Some("skipped") => Conclusion::Neutral,
                        _ => Conclusion::Failure,
                    },
                    title: output.title.unwrap_or_default(),
                    summary: output.summary.unwrap_or_default(),
                    external_id: r.external_id.unwrap_or_default(),
                    app: r.app.unwrap_or_default().slug,
                }
            })
            .collect())
    }

    async fn set_status(
        &self,
        repo: &RepoSlug,
        sha: &str,
        status: &CommitStatus,
    ) -> Result<(), ForgeError> {
        let path = format!("/repos/{repo}/statuses/{sha}");
        let state = match status.state {
            StatusState::Pending => "pending",
            StatusState::Success => "success",
            StatusState::Failure => "failure",
            StatusState::Error => "error",
        };
        // GitHub refuses descriptions over 140 characters.
        let body = json!({"state": state, "context": status.context, "description": cap(&status.description, 140)});
        self.request(Method::POST, &path, Some(&body))
            .await
            .map(|_| ())
    }

    async fn statuses(&self, repo: &RepoSlug, sha: &str) -> Result<Vec<CommitStatus>, ForgeError> {
        let path = format!("/repos/{repo}/commits/{sha}/status");
        let combined: CombinedStatus = self.call(Method::GET, &path, None).await?;
        Ok(combined
            .statuses
            .into_iter()
            .map(|s| CommitStatus {
                context: s.context,
                state: s.state,
                description: s.description.unwrap_or_default(),
                creator: s.creator.unwrap_or_default().login,
            })
            .collect())
    }

    async fn add_labels(
        &self,
        repo: &RepoSlug,
        number: u64,
        labels: &[String],
    ) -> Result<(), ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/labels");
        self.request(Method::POST, &path, Some(&json!({"labels": labels})))
            .await
            .map(|_| ())
    }

    async fn remove_label(
        &self,
        repo: &RepoSlug,
        number: u64,
        label: &str,
    ) -> Result<(), ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/labels/{label}");
        match self.request(Method::DELETE, &path, None).await {
            Err(e) if e.status() == Some(404) => Ok(()), // not there: nothing to remove
            other => other.map(|_| ()),
        }
    }
}
