//! The JSON both forge APIs answer alike (GitHub's and Gitea's pull requests, labels and
//! comments share these fields), decoded once for both clients.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Comment, CommitStatus, PullRequest, StatusState};

/// The body that sets a commit status, on either forge (GitHub and Gitea share it), with the
/// description cut to what the forge keeps.
pub(crate) fn status_body(status: &CommitStatus, description_max: usize) -> Value {
    let state = match status.state {
        StatusState::Pending => "pending",
        StatusState::Success => "success",
        StatusState::Failure => "failure",
        StatusState::Error => "error",
    };
    json!({"state": state, "context": status.context, "description": super::http::cap(&status.description, description_max)})
}

#[derive(Deserialize)]
pub(crate) struct User {
    pub login: String,
}

#[derive(Deserialize)]
pub(crate) struct Label {
    /// Gitea adds and removes labels by id; GitHub by name.
    #[serde(default)]
    pub id: u64,
    pub name: String,
}

#[derive(Deserialize)]
pub(crate) struct RepoRef {
    pub full_name: String,
}

#[derive(Deserialize)]
pub(crate) struct Branch {
    #[serde(default)]
    pub sha: String,
    #[serde(rename = "ref")]
    pub reference: String,
    pub repo: Option<RepoRef>,
}

#[derive(Deserialize)]
pub(crate) struct Pull {
    pub number: u64,
    pub state: String,
    pub title: String,
    pub user: User,
    pub head: Branch,
    pub base: Branch,
    #[serde(default)]
    pub labels: Vec<Label>,
    #[serde(default)]
    pub merged: bool,
}

impl Pull {
    /// The pull request as the trait sees it, with `head_repo` as given.
    pub fn into_pull_request(self, head_repo: String) -> PullRequest {
        PullRequest {
            number: self.number,
            state: self.state,
            title: self.title,
            author: self.user.login,
            head_sha: self.head.sha,
            head_ref: self.head.reference,
            head_repo,
            base_sha: self.base.sha,
            base_ref: self.base.reference,
            labels: self.labels.into_iter().map(|l| l.name).collect(),
            merged: self.merged,
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct IssueComment {
    pub id: u64,
    pub user: User,
    #[serde(default)]
    pub body: String,
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
