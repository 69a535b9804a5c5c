//! Publishing a verdict on a pull request: the report comment (one, updated in place, found by
//! marker and author) and the `addons-gate` check.

use serde::{Deserialize, Serialize};

use super::report::{self, MARKER};
use super::verdict::{GateResult, Outcome};
use crate::forge::{
    CheckRun, CommitStatus, Conclusion, Forge, ForgeError, RepoSlug, StatusState,
    upsert_marked_comment,
};

/// The check branch protection requires.
pub const CHECK_NAME: &str = "addons-gate";

/// How the verdict is published as a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CheckMode {
    /// A check run (needs a GitHub App token).
    CheckRun,
    /// A commit status with context `addons-gate` (works with any token).
    Status,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Published {
    pub comment_id: u64,
    pub conclusion: Conclusion,
}

/// The prefix of the check run's `external_id`; the report's digest follows.
pub const REPORT_REFERENCE: &str = "addons-gate-report:";
/// How a commit status names the report's digest, at the end of its description.
pub const STATUS_REPORT_MARK: &str = " · report ";

/// A status description (GitHub keeps 140 characters) that ends with the report's digest.
pub fn status_description(title: &str, digest: &str) -> String {
    let room = 140 - STATUS_REPORT_MARK.chars().count() - digest.chars().count();
    let mut text: String = title.chars().take(room).collect();
    text.push_str(STATUS_REPORT_MARK);
    text.push_str(digest);
    text
}

/// One line for the check's title.
pub fn title(result: &GateResult) -> String {
    let v = &result.verdict;
    match v.outcome {
        Outcome::Green => format!(
            "passed: {} Applications changed, {} added, {} removed",
            v.counts.applications_changed,
            v.counts.applications_added,
            v.counts.applications_removed
        ),
        Outcome::Blocked => {
            let rules: Vec<String> = v
                .blocking
                .iter()
                .map(|(rule, n)| format!("{n} {rule}"))
                .collect();
            format!("blocked: {}", rules.join(", "))
        }
        Outcome::Undecided => format!(
            "could not decide: {}",
            v.errors
                .first()
                .map(String::as_str)
                .unwrap_or("render failed")
        ),
    }
}

/// What `gate publish` and Bosun's gate runner both do (one code path): read the pull
/// request, make sure both commits are in the local repository, judge the merge base against
/// the head, and publish the report and the `addons-gate` check.
pub async fn check_and_publish(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    config: &crate::render::RenderConfig,
    mode: CheckMode,
    full_report_url: Option<&str>,
) -> Result<(crate::forge::PullRequest, GateResult, Published), CheckError> {
    check_and_publish_inner(forge, repo, number, author, config, mode, full_report_url)
        .await
        .map(|(pr, result, published, _)| (pr, result, published))
}

/// [`check_and_publish`], keeping the renders the check made (Bosun acts on the head's).
pub async fn check_and_publish_keeping(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    config: &crate::render::RenderConfig,
    mode: CheckMode,
) -> Result<CheckedAndPublished, CheckError> {
    check_and_publish_inner(forge, repo, number, author, config, mode, None).await
}

/// The pull request, the verdict, what was published, and the renders the check kept.
pub type CheckedAndPublished = (
    crate::forge::PullRequest,
    GateResult,
    Published,
    Option<super::check::Kept>,
);

async fn check_and_publish_inner(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    config: &crate::render::RenderConfig,
    mode: CheckMode,
    full_report_url: Option<&str>,
) -> Result<CheckedAndPublished, CheckError> {
    let pr = forge.pull_request(repo, number).await?;
    crate::git::ensure_commit(&config.repo_dir, &pr.head_sha)?;
    crate::git::ensure_commit(&config.repo_dir, &pr.base_sha)?;
    let revisions = super::check::Revisions {
        base: None,
        head: pr.head_sha.clone(),
        target: Some(pr.base_sha.clone()),
    };
    let (result, kept) =
        tokio::task::block_in_place(|| super::check::check_keeping(config, &revisions));
    let published =
        publish_linked(forge, repo, number, author, &result, mode, full_report_url).await?;
    Ok((pr, result, published, kept))
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Forge(#[from] ForgeError),
    #[error(transparent)]
    Git(#[from] crate::git::GitError),
}

pub async fn publish(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    result: &GateResult,
    mode: CheckMode,
) -> Result<Published, ForgeError> {
    publish_linked(forge, repo, number, author, result, mode, None).await
}

/// [`publish`]; a comment clipped to fit links to the full report at `full_report_url`.
pub async fn publish_linked(
    forge: &dyn Forge,
    repo: &RepoSlug,
    number: u64,
    author: &str,
    result: &GateResult,
    mode: CheckMode,
    full_report_url: Option<&str>,
) -> Result<Published, ForgeError> {
    let (comment_body, full) = report::render_linked(result, full_report_url);
    let comment = upsert_marked_comment(forge, repo, number, author, MARKER, &comment_body).await?;
    // The check carries the digest of the comment it stands for: a reader that trusts a shared
    // identity (a CI bot) takes a report only with the check that names it.
    let digest = report::digest(&comment_body);
    let conclusion = if result.verdict.outcome == Outcome::Green {
        Conclusion::Success
    } else {
        Conclusion::Failure
    };
    let head = &result.verdict.head;
    match mode {
        CheckMode::CheckRun => {
            let run = CheckRun {
                name: CHECK_NAME.to_string(),
                head_sha: head.clone(),
                conclusion,
                title: title(result),
                summary: full.unwrap_or(comment_body),
                external_id: format!("{REPORT_REFERENCE}{digest}"),
                app: String::new(),
            };
            forge.upsert_check_run(repo, &run).await?;
        }
        CheckMode::Status => {
            let status = CommitStatus {
                context: CHECK_NAME.to_string(),
                state: if conclusion == Conclusion::Success {
                    StatusState::Success
                } else {
                    StatusState::Failure
                },
                description: status_description(&title(result), &digest),
                creator: String::new(),
            };
            forge.set_status(repo, head, &status).await?;
        }
    }
    Ok(Published {
        comment_id: comment.id,
        conclusion,
    })
}
