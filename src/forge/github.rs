//! The forge over GitHub's REST API (`api.github.com`, GitHub Enterprise's `/api/v3`, or any
//! server speaking the same subset, such as the proving ground's forge double).
//!
//! Plain HTTP with reqwest rather than octocrab: the product needs a dozen endpoints, and
//! octocrab would add a second TLS stack and ~90 s of build for them.

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

pub use super::http::install_crypto_provider;
use super::http::{Dialect, Http, cap, decode, link_page, segment};
use super::wire::{IssueComment, Pull, User};
use super::{
    CheckRun, Comment, CommentPage, CommitStatus, Conclusion, Forge, ForgeError, PullRequest,
    RepoSlug, StatusState,
};

/// Comments a page when walking them newest first.
const COMMENT_PAGE: u64 = 50;

const DIALECT: Dialect = Dialect {
    auth_header: "Authorization",
    auth_scheme: "Bearer",
    headers: &[
        ("Accept", "application/vnd.github+json"),
        ("X-GitHub-Api-Version", "2022-11-28"),
    ],
};

#[derive(Clone)]
pub struct GitHub {
    http: Http,
}

impl GitHub {
    /// `base` is the API root: `https://api.github.com`, `https://ghe.example/api/v3`, or a
    /// double on loopback.
    pub fn new(base: &str, token: &str) -> Result<GitHub, ForgeError> {
        Ok(GitHub {
            http: Http::new(base, token, DIALECT)?,
        })
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ForgeError> {
        self.http.request(method, path, body).await
    }

    fn decode<T: for<'de> Deserialize<'de>>(
        value: Value,
        method: &str,
        path: &str,
    ) -> Result<T, ForgeError> {
        decode(value, method, path)
    }

    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ForgeError> {
        self.http.call(method, path, body).await
    }

    /// Every page of a list endpoint (`per_page=100`; GitHub sends no total).
    async fn list(&self, path: &str) -> Result<Vec<Value>, ForgeError> {
        self.http.list(path, "per_page", 100).await
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

#[async_trait::async_trait]
impl Forge for GitHub {
    async fn current_user(&self) -> Result<String, ForgeError> {
        let user: User = self.call(Method::GET, "/user", None).await?;
        Ok(user.login)
    }

    async fn pull_request(&self, repo: &RepoSlug, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("/repos/{repo}/pulls/{number}");
        let pull: Pull = self.call(Method::GET, &path, None).await?;
        let head_repo = pull
            .head
            .repo
            .as_ref()
            .map(|r| r.full_name.clone())
            .unwrap_or_default();
        super::checked_pull(pull.into_pull_request(head_repo), &path)
    }

    async fn comments(&self, repo: &RepoSlug, number: u64) -> Result<Vec<Comment>, ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/comments");
        self.list(&path)
            .await?
            .into_iter()
            .map(|v| Self::decode::<IssueComment>(v, "GET", &path).map(Comment::from))
            .collect()
    }

    /// GitHub's issue comments come oldest first with no sort parameter, but its `Link` header
    /// names the `last` and `prev` pages. A first request of one comment a page learns the
    /// count (its `last` page number; no `last`: at most one comment, and that is the list),
    /// then the walk goes from the last page of [`COMMENT_PAGE`] back through `prev`. Only
    /// page numbers are taken from the header, never its URLs.
    async fn comment_page(
        &self,
        repo: &RepoSlug,
        number: u64,
        page: Option<u64>,
    ) -> Result<CommentPage, ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/comments");
        let mut bytes = 0;
        let page = match page {
            Some(page) => page,
            None => {
                let first = self
                    .http
                    .exchange(Method::GET, &format!("{path}?per_page=1&page=1"), None)
                    .await?;
                bytes += first.bytes;
                match first.link.as_deref().and_then(|l| link_page(l, "last")) {
                    Some(count) if count > 1 => count.div_ceil(COMMENT_PAGE),
                    // At most one comment: the whole list.
                    _ => {
                        let comments: Vec<IssueComment> = Self::decode(first.body, "GET", &path)?;
                        return Ok(CommentPage {
                            comments: comments.into_iter().rev().map(Comment::from).collect(),
                            newest_first: true,
                            bytes,
                            next: None,
                        });
                    }
                }
            }
        };
        let answer = self
            .http
            .exchange(
                Method::GET,
                &format!("{path}?per_page={COMMENT_PAGE}&page={page}"),
                None,
            )
            .await?;
        bytes += answer.bytes;
        let prev = answer
            .link
            .as_deref()
            .and_then(|l| link_page(l, "prev"))
            .filter(|p| *p < page);
        let comments: Vec<IssueComment> = Self::decode(answer.body, "GET", &path)?;
        Ok(CommentPage {
            comments: comments.into_iter().rev().map(Comment::from).collect(),
            newest_first: true,
            bytes,
            next: prev,
        })
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
            run.head_sha,
            segment(&run.name)
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
        // GitHub refuses descriptions over 140 characters.
        let body = super::wire::status_body(status, 140);
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
        let path = format!("/repos/{repo}/issues/{number}/labels/{}", segment(label));
        match self.request(Method::DELETE, &path, None).await {
            Err(e) if e.status() == Some(404) => Ok(()), // not there: nothing to remove
            other => other.map(|_| ()),
        }
    }
}
