//! The pull request steps with `provider: gitlab`: Kargo v1.11.2's GitLab provider
//! (`pkg/gitprovider/gitlab/gitlab.go`) over the forge double's GitLab face (`/api/v4`).
//!
//! - The project is the repository URL's whole path after the host (`parseRepoURL` over
//!   `urls.NormalizeGit`: lowercased, without user info, a trailing `/` or `.git`), subgroups
//!   included (`platform/team/gitops`), escaped as one segment by go-gitlab (`PathEscape`: `/`
//!   as `%2F`, `.` as `%2E`); a pull request's number is the merge request's `iid`
//!   (`convertGitlabMR`), so `pr.id` is the iid.
//! - `git-open-pr` lists the open merge requests of the source and target branches first and
//!   adopts one (`ListPullRequests`), else creates it with its labels (`CreatePullRequest`:
//!   `labels` on the create call, no second request).
//! - `git-wait-for-pr` reads the merge request: `merged` is done, `closed` fails, else it waits.
//! - `git-merge-pr` reads it first (`MergePullRequest`): merged is done, not `opened` is a
//!   failure, a draft or a `detailed_merge_status` other than `mergeable` is "not yet" (the step
//!   waits with `wait: true`, else fails), and only then `PUT .../merge` (merge or squash).
//!   Every error reading or merging is terminal, as on GitHub.

use serde_json::{Value, json};

use super::super::{Outcome, StepContext, git_url, http_client, text};
use super::pr_number;

/// `METHOD URL: STATUS {message: ...}`, as go-gitlab's `ErrorResponse` words a failure.
async fn answered(
    method: &str,
    url: &str,
    response: Result<reqwest::Response, reqwest::Error>,
) -> Result<Value, String> {
    let response = response.map_err(|e| format!("{method} {url}: {e}"))?;
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        Err(format!(
            "{method} {url}: {status} {{message: {}}}",
            text(&body, "message")
        ))
    }
}

/// The project Kargo's GitLab provider names for a repository URL (`parseRepoURL` in
/// `pkg/gitprovider/gitlab/gitlab.go`, over `NormalizeGit` in `pkg/urls/git.go`): the URL
/// lowercased, its path after the host without the leading `/`, one trailing `/` and then one
/// `.git` trimmed. A URL with a query is left as written by `NormalizeGit` (not lowercased).
fn project_of(repo_url: &str) -> String {
    let url = if repo_url.contains('?') {
        repo_url.to_string()
    } else {
        repo_url.to_lowercase()
    };
    let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let path = after_scheme
        .split_once('/')
        .map_or("", |(_, path)| path)
        .split(['?', '#'])
        .next()
        .unwrap_or("");
    let path = path.strip_suffix('/').unwrap_or(path);
    path.strip_suffix(".git").unwrap_or(path).to_string()
}

/// A project path as go-gitlab escapes it into one segment (`PathEscape`: Go's
/// `url.PathEscape`, then every `.` as `%2E`), here every byte but letters, digits, `-`, `_`
/// and `~` percent-encoded.
fn path_escape(project: &str) -> String {
    project
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The project's API root for a step's `repoURL` (the repository must be one Kargo holds
/// credentials for: `git_url`).
fn project_url(ctx: &StepContext<'_>, repo_url: &str) -> String {
    format!(
        "{}/api/v4/projects/{}",
        ctx.kargo.forge_url,
        path_escape(&project_of(repo_url))
    )
}

async fn get(ctx: &StepContext<'_>, url: &str) -> Result<Value, String> {
    let response = http_client()
        .get(url)
        .bearer_auth(&ctx.kargo.forge_token)
        .send()
        .await;
    answered("GET", url, response).await
}

pub(super) async fn open(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    if let Err(said) = git_url(ctx, text(config, "repoURL")) {
        return Outcome::Failed { said };
    }
    let (source, target) = (text(config, "sourceBranch"), text(config, "targetBranch"));
    let target = if target.is_empty() { "main" } else { target };
    let title = if text(config, "title").is_empty() {
        format!("Promote to {}", ctx.stage)
    } else {
        text(config, "title").to_string()
    };
    let project = project_url(ctx, text(config, "repoURL"));
    let list = format!(
        "{project}/merge_requests?state=opened&source_branch={source}&target_branch={target}&per_page=100"
    );
    match get(ctx, &list).await {
        Ok(Value::Array(open)) if !open.is_empty() => {
            let iid = open[0]["iid"].clone();
            return Outcome::Done {
                output: json!({"pr": {"id": iid, "url": open[0]["web_url"]}}),
                said: format!("adopted open merge request !{iid}"),
            };
        }
        Ok(_) => {}
        Err(e) => {
            return Outcome::Errored {
                said: format!(
                    "error determining if pull request already exists: error listing pull requests: {e}"
                ),
            };
        }
    }
    let labels: Vec<String> = config
        .get("labels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_string))
        .collect();
    let create = format!("{project}/merge_requests");
    let response = http_client()
        .post(&create)
        .bearer_auth(&ctx.kargo.forge_token)
        .json(&json!({
            "title": title,
            "description": text(config, "description"),
            "source_branch": source,
            "target_branch": target,
            "labels": labels.join(","),
        }))
        .send()
        .await;
    match answered("POST", &create, response).await {
        Ok(mr) => {
            let iid = mr["iid"].clone();
            Outcome::Done {
                output: json!({"pr": {"id": iid, "url": mr["web_url"]}}),
                said: format!("opened merge request !{iid} \"{title}\" ({source} -> {target})"),
            }
        }
        Err(e) => Outcome::Errored {
            said: format!("error creating pull request: {e}"),
        },
    }
}

pub(super) async fn wait(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    let Some(iid) = pr_number(config) else {
        return Outcome::Failed {
            said: "prNumber is required".into(),
        };
    };
    if let Err(said) = git_url(ctx, text(config, "repoURL")) {
        return Outcome::Failed { said };
    }
    let url = format!(
        "{}/merge_requests/{iid}",
        project_url(ctx, text(config, "repoURL"))
    );
    match get(ctx, &url).await {
        Ok(mr) if text(&mr, "state") == "merged" => {
            let commit = text(&mr, "merge_commit_sha").to_string();
            Outcome::Done {
                output: json!({"commit": commit, "pr": {"id": iid, "open": false, "merged": true}}),
                said: format!(
                    "merge request !{iid} merged as {}",
                    &commit[..commit.len().min(7)]
                ),
            }
        }
        Ok(mr) if matches!(text(&mr, "state"), "opened" | "locked") => Outcome::Waiting {
            said: format!("merge request !{iid} is open"),
        },
        Ok(_) => Outcome::Failed {
            said: format!("pull request {iid} was closed without being merged"),
        },
        Err(e) => Outcome::Errored {
            said: format!("error getting pull request {iid}: {e}"),
        },
    }
}

pub(super) async fn merge(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    let Some(iid) = pr_number(config) else {
        return Outcome::Failed {
            said: "prNumber is required".into(),
        };
    };
    if let Err(said) = git_url(ctx, text(config, "repoURL")) {
        return Outcome::Failed { said };
    }
    let url = format!(
        "{}/merge_requests/{iid}",
        project_url(ctx, text(config, "repoURL"))
    );
    let mr = match get(ctx, &url).await {
        Ok(mr) => mr,
        Err(e) => {
            return Outcome::Failed {
                said: format!(
                    "error merging pull request {iid}: error getting merge request {iid}: {e}"
                ),
            };
        }
    };
    match text(&mr, "state") {
        "merged" => {
            return Outcome::Done {
                output: json!({"commit": text(&mr, "merge_commit_sha")}),
                said: format!("merge request !{iid} was already merged"),
            };
        }
        "opened" => {}
        _ => {
            return Outcome::Failed {
                said: format!(
                    "error merging pull request {iid}: pull request {iid} is closed but not merged"
                ),
            };
        }
    }
    let squash = match text(config, "mergeMethod") {
        "" | "merge" => false,
        "squash" => true,
        other => {
            return Outcome::Failed {
                said: format!(
                    "error merging pull request {iid}: unsupported merge method {other:?}"
                ),
            };
        }
    };
    if mr["draft"] == json!(true) || text(&mr, "detailed_merge_status") != "mergeable" {
        let why = text(&mr, "detailed_merge_status").to_string();
        return if config.get("wait").and_then(Value::as_bool).unwrap_or(false) {
            Outcome::Waiting {
                said: format!("merge request !{iid} is not mergeable yet ({why})"),
            }
        } else {
            Outcome::Failed {
                said: format!("pull request {iid} is not ready to merge and wait is disabled"),
            }
        };
    }
    let merge_url = format!("{url}/merge");
    let body = if squash {
        json!({"squash": true})
    } else {
        json!({})
    };
    let response = http_client()
        .put(&merge_url)
        .bearer_auth(&ctx.kargo.forge_token)
        .json(&body)
        .send()
        .await;
    match answered("PUT", &merge_url, response).await {
        Ok(merged) => {
            let commit = text(&merged, "merge_commit_sha").to_string();
            Outcome::Done {
                output: json!({"commit": commit}),
                said: format!(
                    "merged merge request !{iid} as {}",
                    &commit[..commit.len().min(7)]
                ),
            }
        }
        Err(e) => Outcome::Failed {
            said: format!(
                "error merging pull request {iid}: error merging merge request {iid}: {e}"
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{path_escape, project_of};

    /// Kargo's GitLab provider names the project by the URL's whole path: subgroups included,
    /// lowercased, without `.git`.
    #[test]
    fn the_project_is_the_urls_whole_path() {
        for (url, project) in [
            (
                "https://gitlab.example.com/platform/gitops.git",
                "platform/gitops",
            ),
            (
                "https://gitlab.example.com/Platform/Team/GitOps.git/",
                "platform/team/gitops",
            ),
            (
                "https://oauth2:x@gitlab.example.com:8443/a/b/c/d",
                "a/b/c/d",
            ),
        ] {
            assert_eq!(project_of(url), project, "{url}");
        }
        assert_eq!(
            path_escape("platform/team/git.ops"),
            "platform%2Fteam%2Fgit%2Eops"
        );
    }
}
