//! The forge over Gitea's REST API (`https://gitea.example/api/v1`), which Forgejo serves too.
//! Modelled on Gitea 1.24 (`routers/api/v1`); every difference from GitHub the product meets
//! is handled here:
//!
//! - the token goes as `Authorization: token <token>`; `GET /user` needs the `read:user` scope;
//! - lists page with `page` and `limit`, capped by the server (`MAX_RESPONSE_ITEMS`, 50 by
//!   default) and announced in `X-Total-Count`; an issue's comments come unpaged;
//! - labels are added by id (a name Gitea does not know is dropped silently, and Forgejo
//!   versions differ on names), created first when the repository lacks them, and removed by id;
//! - there are no check runs: the gate's verdict is a commit status (`addons-gate`), and the
//!   statuses of a commit are its history, newest per context wins.

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::http::{Dialect, Http};
use super::wire::{IssueComment, Label, Pull, User};
use super::{
    CheckRun, Comment, CommentPage, CommitStatus, Forge, ForgeError, PullRequest, RepoSlug,
    StatusState,
};

const DIALECT: Dialect = Dialect {
    auth_header: "Authorization",
    auth_scheme: "token",
    headers: &[("Accept", "application/json")],
};

/// Gitea's default page cap; asking more gets this many anyway.
const PAGE: usize = 50;

/// The colour of a label this client creates (Gitea requires one).
const LABEL_COLOR: &str = "#ededed";

#[derive(Clone)]
pub struct Gitea {
    http: Http,
}

impl Gitea {
    /// `base` is the API root, `/api/v1` included: `https://gitea.example/api/v1`.
    pub fn new(base: &str, token: &str) -> Result<Gitea, ForgeError> {
        Ok(Gitea {
            http: Http::new(base, token, DIALECT)?,
        })
    }

    async fn repo_labels(&self, repo: &RepoSlug) -> Result<Vec<Label>, ForgeError> {
        let path = format!("/repos/{repo}/labels");
        self.http
            .list(&path, "limit", PAGE)
            .await?
            .into_iter()
            .map(|v| super::http::decode(v, "GET", &path))
            .collect()
    }
}

#[derive(Deserialize)]
struct StatusPayload {
    id: u64,
    context: String,
    /// Gitea's states: pending, success, error, failure, warning (and skipped on newer
    /// versions); kept as text so a new one cannot fail the read. Gitea writes the state as
    /// `status` when it answers (`structs.Status`), though it is `state` when created.
    status: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    creator: Option<User>,
}

/// A pull request as the trait sees it. Gitea names the head `refs/pull/N/head` and the base
/// repository as the head's for an AGit pull request (pushed to `refs/for/...` by anyone who
/// may read) and for one whose head branch was deleted ([G services/convert/pull.go]): its
/// head is no branch of the repository, so it is read as a fork's (no repository named) and
/// nothing is ever pushed to it.
fn pull_request(pull: Pull) -> PullRequest {
    let branch = !pull.head.reference.is_empty() && !pull.head.reference.starts_with("refs/");
    let head_repo = match &pull.head.repo {
        Some(repo) if branch => repo.full_name.clone(),
        _ => String::new(),
    };
    pull.into_pull_request(head_repo)
}

/// A Gitea state as the trait's: anything but the four it shares with GitHub is not a
/// success (`warning` and unknown states read as failure).
fn state_of(text: &str) -> StatusState {
    match text {
        "success" => StatusState::Success,
        "pending" => StatusState::Pending,
        "error" => StatusState::Error,
        _ => StatusState::Failure,
    }
}

#[async_trait::async_trait]
impl Forge for Gitea {
    async fn current_user(&self) -> Result<String, ForgeError> {
        let user: User = self.http.call(Method::GET, "/user", None).await?;
        Ok(user.login)
    }

    async fn pull_request(&self, repo: &RepoSlug, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("/repos/{repo}/pulls/{number}");
        let pull: Pull = self.http.call(Method::GET, &path, None).await?;
        super::checked_pull(pull_request(pull), &path)
    }

    async fn comments(&self, repo: &RepoSlug, number: u64) -> Result<Vec<Comment>, ForgeError> {
        // Gitea answers an issue's comments whole (no page parameters on this endpoint).
        let path = format!("/repos/{repo}/issues/{number}/comments");
        let list: Vec<IssueComment> = self.http.call(Method::GET, &path, None).await?;
        Ok(list.into_iter().map(Comment::from).collect())
    }

    /// Gitea 1.24 offers no newest-first walk: an issue's comments come whole (`since` and
    /// `before` only), and the timeline (`/issues/{n}/timeline`, `page` and `limit`) is oldest
    /// first with an `X-Total-Count` that counts the page, not the list. So the walk reads the
    /// timeline forward a page at a time, keeping the plain comments (`type: comment`). The
    /// timeline drops inline review comments after paging, so a page may come back empty
    /// before the end: the walk goes on while it has seen fewer plain comments than the issue
    /// counts (`comments`, asked first).
    async fn comment_page(
        &self,
        repo: &RepoSlug,
        number: u64,
        page: Option<u64>,
    ) -> Result<CommentPage, ForgeError> {
        #[derive(Deserialize)]
        struct Count {
            #[serde(default)]
            comments: u64,
        }
        #[derive(Deserialize)]
        struct Event {
            #[serde(rename = "type", default)]
            kind: String,
        }
        // The page cursor carries the comments still expected: page + (expected << 32).
        let mut bytes = 0;
        let (page, expected) = match page {
            Some(cursor) => (cursor & 0xffff_ffff, cursor >> 32),
            None => {
                let path = format!("/repos/{repo}/issues/{number}");
                let answer = self.http.exchange(Method::GET, &path, None).await?;
                bytes += answer.bytes;
                let count: Count = super::http::decode(answer.body, "GET", &path)?;
                (1, count.comments)
            }
        };
        let path = format!("/repos/{repo}/issues/{number}/timeline");
        let answer = self
            .http
            .exchange(
                Method::GET,
                &format!("{path}?limit={PAGE}&page={page}"),
                None,
            )
            .await?;
        bytes += answer.bytes;
        let events: Vec<serde_json::Value> = super::http::decode(answer.body, "GET", &path)?;
        let empty = events.is_empty();
        let mut comments = Vec::new();
        for event in events {
            let kind: Event = super::http::decode(event.clone(), "GET", &path)?;
            if kind.kind == "comment" {
                let comment: IssueComment = super::http::decode(event, "GET", &path)?;
                comments.push(Comment::from(comment));
            }
        }
        let expected = expected.saturating_sub(comments.len() as u64);
        let more = !empty || expected > 0;
        // Never past 2^32 pages (the cursor's room); the caller's budget ends it long before.
        let next = (more && page < 0xffff_ffff).then(|| (page + 1) | (expected << 32));
        Ok(CommentPage {
            comments,
            newest_first: false,
            bytes,
            next,
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
            .http
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
        let answer = self
            .http
            .request(Method::PATCH, &path, Some(&json!({"body": body})))
            .await?;
        // Gitea answers 204 for a comment kind without content; read it back then.
        let value = if answer.is_null() {
            self.http.request(Method::GET, &path, None).await?
        } else {
            answer
        };
        let c: IssueComment = super::http::decode(value, "PATCH", &path)?;
        Ok(c.into())
    }

    async fn upsert_check_run(&self, _repo: &RepoSlug, run: &CheckRun) -> Result<u64, ForgeError> {
        Err(ForgeError::Unsupported {
            what: format!(
                "check run {:?}: Gitea has no check runs; publish the verdict as a commit status (checkMode: status)",
                run.name
            ),
        })
    }

    async fn check_runs(&self, _repo: &RepoSlug, _sha: &str) -> Result<Vec<CheckRun>, ForgeError> {
        // None exist on Gitea; readers fall back to commit statuses.
        Ok(Vec::new())
    }

    async fn set_status(
        &self,
        repo: &RepoSlug,
        sha: &str,
        status: &CommitStatus,
    ) -> Result<(), ForgeError> {
        let path = format!("/repos/{repo}/statuses/{sha}");
        // Gitea keeps descriptions in a 255-character column on some databases.
        let body = super::wire::status_body(status, 255);
        self.http
            .request(Method::POST, &path, Some(&body))
            .await
            .map(|_| ())
    }

    async fn statuses(&self, repo: &RepoSlug, sha: &str) -> Result<Vec<CommitStatus>, ForgeError> {
        // Every status ever set on the commit; the newest (highest id) per context stands.
        let path = format!("/repos/{repo}/statuses/{sha}");
        let mut latest: std::collections::BTreeMap<String, StatusPayload> = Default::default();
        for value in self.http.list(&path, "limit", PAGE).await? {
            let status: StatusPayload = super::http::decode(value, "GET", &path)?;
            if latest
                .get(&status.context)
                .is_none_or(|seen| seen.id < status.id)
            {
                latest.insert(status.context.clone(), status);
            }
        }
        Ok(latest
            .into_values()
            .map(|s| CommitStatus {
                state: state_of(s.status.as_deref().unwrap_or("")),
                context: s.context,
                description: s.description.unwrap_or_default(),
                creator: s.creator.map(|u| u.login).unwrap_or_default(),
            })
            .collect())
    }

    async fn add_labels(
        &self,
        repo: &RepoSlug,
        number: u64,
        labels: &[String],
    ) -> Result<(), ForgeError> {
        if labels.is_empty() {
            return Ok(());
        }
        let mut known = self.repo_labels(repo).await?;
        let mut ids = Vec::new();
        for name in labels {
            let id = match known.iter().find(|l| &l.name == name) {
                Some(label) => label.id,
                None => {
                    let path = format!("/repos/{repo}/labels");
                    let created: Label = self
                        .http
                        .call(
                            Method::POST,
                            &path,
                            Some(&json!({"name": name, "color": LABEL_COLOR})),
                        )
                        .await?;
                    let id = created.id;
                    known.push(created);
                    id
                }
            };
            ids.push(id);
        }
        let path = format!("/repos/{repo}/issues/{number}/labels");
        let answer: Vec<Label> = self
            .http
            .call(Method::POST, &path, Some(&json!({"labels": ids})))
            .await?;
        // Gitea drops an id it no longer knows (a label deleted meanwhile) without an error:
        // what Bosun counts by a label (its attempts) must not silently fail to land.
        let missing: Vec<&String> = labels
            .iter()
            .filter(|name| !answer.iter().any(|l| &l.name == *name))
            .collect();
        if !missing.is_empty() {
            return Err(ForgeError::Decode {
                method: "POST".into(),
                path,
                message: format!("Gitea did not add the labels {missing:?}"),
            });
        }
        Ok(())
    }

    async fn remove_label(
        &self,
        repo: &RepoSlug,
        number: u64,
        label: &str,
    ) -> Result<(), ForgeError> {
        let path = format!("/repos/{repo}/issues/{number}/labels");
        let on_issue: Vec<Label> = self.http.call(Method::GET, &path, None).await?;
        let Some(found) = on_issue.into_iter().find(|l| l.name == label) else {
            return Ok(()); // not there: nothing to remove
        };
        let path = format!("/repos/{repo}/issues/{number}/labels/{}", found.id);
        match self.http.request(Method::DELETE, &path, None).await {
            // Removed meanwhile (404) or the label deleted (422): nothing left to remove.
            Err(e) if matches!(e.status(), Some(404 | 422)) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(head_ref: &str, head_repo: Option<&str>) -> Pull {
        serde_json::from_value(json!({
            "number": 7, "state": "open", "title": "t", "user": {"login": "someone"},
            "head": {"ref": head_ref, "sha": "abc", "repo": head_repo.map(|r| json!({"full_name": r}))},
            "base": {"ref": "main", "sha": "def", "repo": {"full_name": "platform/gitops"}},
        }))
        .unwrap()
    }

    #[test]
    fn an_agit_or_branchless_head_is_no_branch_of_the_repository() {
        // [G services/convert/pull.go]: AGit and deleted heads are `refs/pull/N/head` with the
        // base repository as the head's.
        let agit = pull_request(pull("refs/pull/7/head", Some("platform/gitops")));
        assert_eq!(agit.head_repo, "");
        let branch = pull_request(pull("kargo/bump", Some("platform/gitops")));
        assert_eq!(branch.head_repo, "platform/gitops");
        let fork = pull_request(pull("main", Some("someone/gitops")));
        assert_eq!(fork.head_repo, "someone/gitops");
        assert_eq!(
            pull_request(pull("", Some("platform/gitops"))).head_repo,
            ""
        );
    }
}
