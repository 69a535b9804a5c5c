//! Promotion steps, run for real: git (clone, commit, push) against the forge's repositories,
//! YAML edits that keep every other byte, pull requests through the forge's REST API, HTTP.
//! Config fields follow Kargo v1.11's step schemas (reference sheet section 6).

mod argocd;
mod http_request;
mod pulls;
mod worktree;

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::Kargo;

use self::argocd::argocd_update;
pub use self::argocd::synced_revision;
use self::http_request::http;
use self::pulls::{git_merge_pr, git_open_pr, git_wait_for_pr};
use self::worktree::{NOTHING_TO_COMMIT, git_clone, git_commit, git_push, yaml_parse, yaml_update};

pub struct StepContext<'a> {
    pub kargo: &'a Kargo,
    pub kube: &'a crate::kube::KubeDouble,
    pub workdir: &'a Path,
    pub promotion: &'a str,
    pub stage: &'a str,
}

pub enum Outcome {
    Done {
        output: Value,
        said: String,
    },
    /// Nothing to do; the output may still say something (Kargo's git-commit with no diff is
    /// Skipped, its output the commit it is at).
    Skipped {
        output: Value,
        said: String,
    },
    Waiting {
        said: String,
    },
    Failed {
        said: String,
    },
    /// A recoverable error (a transport error): retried until `retry.errorThreshold`.
    Errored {
        said: String,
    },
}

fn text<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn inside(workdir: &Path, path: &str) -> Result<PathBuf, String> {
    let relative = gitops_loop::paths::normalize(path);
    if gitops_loop::paths::escapes_root(&relative) {
        return Err(format!(
            "path {path:?} leaves the promotion's working directory"
        ));
    }
    Ok(workdir.join(relative))
}

pub async fn run(ctx: &StepContext<'_>, uses: &str, config: &Value) -> Outcome {
    let result = match uses {
        "git-clone" => git_clone(ctx, config),
        "yaml-update" => yaml_update(ctx, config),
        // [K git_commiter.go]: with no diff the step is Skipped, its output the HEAD commit.
        "git-commit" => {
            return match git_commit(ctx, config) {
                Ok((output, said)) if said == NOTHING_TO_COMMIT => {
                    Outcome::Skipped { output, said }
                }
                Ok((output, said)) => Outcome::Done { output, said },
                Err(said) => Outcome::Failed { said },
            };
        }
        "git-push" => git_push(ctx, config),
        "git-open-pr" => return git_open_pr(ctx, config).await,
        "git-wait-for-pr" => return git_wait_for_pr(ctx, config).await,
        "git-merge-pr" => return git_merge_pr(ctx, config).await,
        "http" => return http(ctx, config).await,
        "argocd-update" => return argocd_update(ctx, config),
        // [K compose_output.go]: the config is the output.
        "compose-output" => Ok((config.clone(), "outputs composed".to_string())),
        "yaml-parse" => return yaml_parse(ctx, config),
        other => Err(format!("step {other:?} is not supported by the ground")),
    };
    match result {
        Ok((output, said)) => Outcome::Done { output, said },
        Err(said) => Outcome::Failed { said },
    }
}

fn git_url<'k>(ctx: &'k StepContext, repo_url: &str) -> Result<&'k (String, String), String> {
    let wanted = gitops_loop::git::normalize_repo_url(repo_url);
    ctx.kargo
        .git_repos
        .iter()
        .find(|(url, _)| gitops_loop::git::normalize_repo_url(url) == wanted)
        .map(|(_, v)| v)
        .ok_or(format!("no credentials for repository {repo_url}"))
}

fn http_client() -> reqwest::Client {
    crate::http::client()
}
