//! Promotion steps, run for real: git (clone, commit, push) against the forge's repositories,
//! YAML edits that keep every other byte, pull requests through the forge's REST API, HTTP.
//! Config fields follow Kargo v1.11's step schemas (reference sheet section 6).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::Kargo;
use crate::git::git;

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

/// [K yaml_parser.go]: reads the file's first YAML document and evaluates each output's
/// `fromExpression` against it; any error Errors the step.
fn yaml_parse(ctx: &StepContext, config: &Value) -> Outcome {
    let result = (|| -> Result<Value, String> {
        let path = inside(ctx.workdir, text(config, "path"))?;
        let bytes = std::fs::read_to_string(&path)
            .map_err(|e| format!("error reading YAML file {:?}: {e}", text(config, "path")))?;
        if bytes.is_empty() {
            return Err(format!(
                "could not parse empty YAML file: {:?}",
                text(config, "path")
            ));
        }
        let data: Value = serde_saphyr::from_multiple::<Value>(&bytes)
            .map_err(|e| format!("could not parse YAML file: {e}"))?
            .into_iter()
            .next()
            .unwrap_or(Value::Null);
        let mut outputs = serde_json::Map::new();
        for output in config
            .get("outputs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let value = super::expr::evaluate_in(text(output, "fromExpression"), &data)?;
            outputs.insert(text(output, "name").to_string(), value);
        }
        Ok(Value::Object(outputs))
    })();
    match result {
        Ok(output) => {
            let said = format!(
                "read {} from {}",
                output
                    .as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default(),
                text(config, "path")
            );
            Outcome::Done { output, said }
        }
        Err(said) => Outcome::Errored {
            said: format!("failed to extract outputs: {said}"),
        },
    }
}

/// The revision an Application runs for the source a `sources[]` update names (matched by
/// repoURL and chart): `status.sync.revisions[i]` for a multi-source Application, else
/// `status.sync.revision`.
pub fn synced_revision(app: &Value, wanted: &Value) -> Option<String> {
    let (repo, chart) = (text(wanted, "repoURL"), text(wanted, "chart"));
    let matches =
        |s: &Value| text(s, "repoURL") == repo && (chart.is_empty() || text(s, "chart") == chart);
    match app.pointer("/spec/sources").and_then(Value::as_array) {
        Some(list) => {
            let at = list.iter().position(matches)?;
            app.pointer(&format!("/status/sync/revisions/{at}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        None => app
            .pointer("/spec/source")
            .filter(|s| matches(s))
            .and_then(|_| app.pointer("/status/sync/revision"))
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// The operation info naming the Promotion that started a sync.
const PROMOTION_INFO: &str = "Promotion";

/// [K pkg/promotion/runner/builtin/argocd_updater.go]: every Application must exist and carry
/// `kargo.akuity.io/authorized-stage: <project>:<stage>` (comma-separated list allowed; globs
/// refused) naming this Stage, or the step Errors; then a sync operation is started on each
/// (initiated by kargo-controller, its info naming the Promotion) and the step waits until
/// Argo CD reports each operation's result: Succeeded completes it, Failed or Error Errors it.
fn argocd_update(ctx: &StepContext, config: &Value) -> Outcome {
    let errored = |said: String| Outcome::Errored { said };
    let Some(resource) = ctx
        .kube
        .store()
        .resource("argoproj.io", "v1alpha1", "applications")
        .cloned()
    else {
        return errored(
            "Argo CD integration is disabled on this controller; cannot update Argo CD Application resources".into(),
        );
    };
    let project = &ctx.kargo.namespace;
    let mut waiting = Vec::new();
    let mut synced = Vec::new();
    for update in config
        .get("apps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(update, "name");
        let namespace = match text(update, "namespace") {
            "" => "argocd",
            n => n,
        };
        let Ok(app) = ctx.kube.store().get(&resource, namespace, name) else {
            return errored(format!(
                "unable to find Argo CD Application {name:?} in namespace {namespace:?}"
            ));
        };
        let refused = format!(
            "Argo CD Application {name:?} in namespace {namespace:?} does not permit mutation by Kargo Stage {} in namespace {project}",
            ctx.stage
        );
        let annotation = app
            .pointer("/metadata/annotations")
            .and_then(|a| a.get("kargo.akuity.io/authorized-stage"))
            .and_then(Value::as_str);
        let Some(annotation) = annotation else {
            return errored(refused);
        };
        let mut allowed = false;
        for entry in annotation
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            match entry.split_once(':').map(|(p, s)| (p.trim(), s.trim())) {
                Some((p, s)) if !p.is_empty() && !s.is_empty() && !entry.contains('*') => {
                    allowed |= p == project && s == ctx.stage;
                }
                _ => {
                    return errored(format!(
                        "unable to parse value of annotation \"kargo.akuity.io/authorized-stage\" ({annotation:?}) on Argo CD Application {name:?} in namespace {namespace:?}: invalid authorized Stage {entry:?}"
                    ));
                }
            }
        }
        if !allowed {
            return errored(refused);
        }
        // [K argocd_updater.go buildDesiredSources]: every source update must match one of
        // the Application's sources exactly (repoURL, and chart when given).
        let sources: Vec<Value> = match app.pointer("/spec/sources").and_then(Value::as_array) {
            Some(list) => list.clone(),
            None => app.pointer("/spec/source").cloned().into_iter().collect(),
        };
        for wanted in update
            .get("sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (repo, chart) = (text(wanted, "repoURL"), text(wanted, "chart"));
            let matched = sources.iter().any(|s| {
                text(s, "repoURL") == repo && (chart.is_empty() || text(s, "chart") == chart)
            });
            if !matched {
                return errored(if chart.is_empty() {
                    format!(
                        "no source of Argo CD Application {name:?} in namespace {namespace:?} matched update for source with repoURL {repo}"
                    )
                } else {
                    format!(
                        "no source of Argo CD Application {name:?} in namespace {namespace:?} matched update for source with repoURL {repo} and chart {chart:?}"
                    )
                });
            }
        }
        let ours = |state: &Value| {
            state
                .pointer("/operation/info")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|i| text(i, "name") == PROMOTION_INFO && text(i, "value") == ctx.promotion)
        };
        let state = app
            .pointer("/status/operationState")
            .cloned()
            .unwrap_or(Value::Null);
        // [K argocd_updater.go mustPerformUpdate]: a finished sync whose result is not the
        // desired revision of every named source is started again.
        let reached = update
            .get("sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|w| !text(w, "desiredRevision").is_empty())
            .all(|w| synced_revision(&app, w).as_deref() == Some(text(w, "desiredRevision")));
        if ours(&state) {
            match text(&state, "phase") {
                "Succeeded" if reached => {
                    synced.push(name.to_string());
                    continue;
                }
                "Succeeded" => {}
                "Failed" | "Error" => {
                    return errored(format!(
                        "sync operation of Argo CD Application {name:?} {}: {}",
                        text(&state, "phase"),
                        text(&state, "message")
                    ));
                }
                _ => {
                    waiting.push(name.to_string());
                    continue;
                }
            }
        }
        if app.get("operation").is_some_and(|o| !o.is_null()) {
            // Our operation is queued, or another one runs: wait for it.
            waiting.push(name.to_string());
            continue;
        }
        let operation = json!({"operation": {
            "initiatedBy": {"username": "kargo-controller", "automated": false},
            "info": [{"name": "Reason", "value": "Promotion triggered a sync of this Application resource."},
                     {"name": PROMOTION_INFO, "value": ctx.promotion}],
            "sync": {"revision": app.pointer("/spec/source/targetRevision").cloned().unwrap_or(json!("HEAD"))}}});
        let patched = ctx.kube.store().patch(
            &resource,
            namespace,
            name,
            crate::kube::store::PatchBody::Merge(operation),
            &super::controller_user(),
            false,
        );
        if let Err(e) = patched {
            return errored(format!(
                "unable to update Argo CD Application {name:?}: {e}"
            ));
        }
        waiting.push(name.to_string());
    }
    if waiting.is_empty() {
        Outcome::Done {
            output: json!({}),
            said: format!(
                "sync operations Succeeded for {}; Applications will be verified Synced and Healthy",
                synced.join(", ")
            ),
        }
    } else {
        Outcome::Waiting {
            said: format!("Argo CD is syncing {}", waiting.join(", ")),
        }
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

fn git_clone(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
    let repo_url = text(config, "repoURL");
    let (_, url) = git_url(ctx, repo_url)?;
    let mut said = Vec::new();
    let mut commits = serde_json::Map::new();
    for checkout in config
        .get("checkout")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let path = inside(ctx.workdir, text(checkout, "path"))?;
        let branch = if text(checkout, "branch").is_empty() {
            "main"
        } else {
            text(checkout, "branch")
        };
        git(
            ctx.workdir,
            &[
                "clone",
                "--quiet",
                "--branch",
                branch,
                url,
                &path.display().to_string(),
            ],
        )
        .map_err(|e| e.to_string())?;
        let commit = git(&path, &["rev-parse", "HEAD"]).map_err(|e| e.to_string())?;
        said.push(format!("{branch} of {repo_url} at {}", &commit[..7]));
        commits.insert(text(checkout, "path").to_string(), json!(commit));
    }
    Ok((
        json!({"commits": commits}),
        format!("cloned {}", said.join(", ")),
    ))
}

fn yaml_update(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
    let path = inside(ctx.workdir, text(config, "path"))?;
    let mut content =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", text(config, "path")))?;
    let origin = text(config, "path").trim_start_matches("./").to_string();
    let mut changes = Vec::new();
    for update in config
        .get("updates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = text(update, "key");
        let value = match update.get("value") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let segments = gitops_loop::yaml::edit::parse_key_path(key);
        let sites =
            gitops_loop::yaml::edit::scalar_sites(&content, &origin).map_err(|e| e.to_string())?;
        let site = gitops_loop::yaml::edit::find_site(&sites, 0, &segments)
            .ok_or(format!("{origin}: no value at key {key}"))?
            .clone();
        let rendered = gitops_loop::yaml::edit::render_scalar(&value, site.quoted);
        changes.push(format!("{key}: {} -> {value}", site.value));
        content = gitops_loop::yaml::edit::splice(&content, &[(site.start, site.end, rendered)]);
    }
    std::fs::write(&path, &content).map_err(|e| format!("{origin}: {e}"))?;
    let message = format!(
        "Updated {origin}\n\n{}",
        changes
            .iter()
            .map(|c| format!("- {c}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok((
        json!({"commitMessage": message}),
        format!("{origin}: {}", changes.join(", ")),
    ))
}

const NOTHING_TO_COMMIT: &str = "nothing to commit";

fn git_commit(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
    let path = inside(ctx.workdir, text(config, "path"))?;
    git(&path, &["add", "-A"]).map_err(|e| e.to_string())?;
    let dirty = !git(&path, &["status", "--porcelain"])
        .map_err(|e| e.to_string())?
        .is_empty();
    if dirty {
        let message = if text(config, "message").is_empty() {
            "Kargo promotion"
        } else {
            text(config, "message")
        };
        git(
            &path,
            &[
                "-c",
                "user.name=Kargo",
                "-c",
                "user.email=kargo@example.test",
                "commit",
                "--quiet",
                "-m",
                message,
            ],
        )
        .map_err(|e| e.to_string())?;
    }
    let commit = git(&path, &["rev-parse", "HEAD"]).map_err(|e| e.to_string())?;
    let first_line = text(config, "message")
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    Ok((
        json!({"commit": commit}),
        if dirty {
            format!("committed {} \"{first_line}\"", &commit[..7])
        } else {
            NOTHING_TO_COMMIT.to_string()
        },
    ))
}

fn git_push(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
    let path = inside(ctx.workdir, text(config, "path"))?;
    let branch = if config
        .get("generateTargetBranch")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        format!("kargo/promotion/{}", ctx.promotion)
    } else if !text(config, "targetBranch").is_empty() {
        text(config, "targetBranch").to_string()
    } else {
        git(&path, &["rev-parse", "--abbrev-ref", "HEAD"]).map_err(|e| e.to_string())?
    };
    git(
        &path,
        &[
            "push",
            "--quiet",
            "origin",
            &format!("HEAD:refs/heads/{branch}"),
        ],
    )
    .map_err(|e| e.to_string())?;
    let commit = git(&path, &["rev-parse", "HEAD"]).map_err(|e| e.to_string())?;
    Ok((
        json!({"branch": branch, "commit": commit}),
        format!("pushed {} to {branch}", &commit[..7]),
    ))
}

fn http_client() -> reqwest::Client {
    gitops_loop::forge::github::install_crypto_provider();
    reqwest::Client::new()
}

async fn git_open_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
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

async fn git_wait_for_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
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

async fn git_merge_pr(ctx: &StepContext<'_>, config: &Value) -> Outcome {
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

async fn http(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    let method = if text(config, "method").is_empty() {
        "GET"
    } else {
        text(config, "method")
    };
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return Outcome::Failed {
            said: format!("unknown method {method}"),
        };
    };
    // Hosts the scenario names (e.g. https://bosun.example.test) reach their loopback servers.
    let written = text(config, "url");
    let url = ctx
        .kargo
        .http_aliases
        .iter()
        .find_map(|(alias, actual)| {
            written
                .strip_prefix(alias.as_str())
                .map(|rest| format!("{actual}{rest}"))
        })
        .unwrap_or_else(|| written.to_string());
    let mut request = http_client().request(method.clone(), url);
    for header in config
        .get("headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        request = request.header(text(header, "name"), text(header, "value"));
    }
    if !text(config, "body").is_empty() {
        request = request.body(text(config, "body").to_string());
    }
    match request.send().await {
        Ok(response) if response.status().is_success() => {
            let status = response.status().as_u16();
            // [K http_requester.go buildOutputs]: the output holds only the configured
            // `outputs` (this double models none).
            Outcome::Done {
                output: json!({}),
                said: format!("{method} {} answered {status}", text(config, "url")),
            }
        }
        // Without success/failure expressions a non-2xx answer is retried.
        Ok(response) => Outcome::Waiting {
            said: format!(
                "{method} {} answered {}",
                text(config, "url"),
                response.status()
            ),
        },
        // [K http_requester.go]: a request that cannot be sent (connection refused, DNS) is
        // Errored, not retried by itself: `retry.errorThreshold` decides.
        Err(e) => Outcome::Errored {
            said: format!(
                "error sending HTTP request: {method} {}: {}",
                text(config, "url"),
                if e.is_connect() {
                    "connection refused"
                } else if e.is_timeout() {
                    "timed out"
                } else {
                    "the request failed"
                }
            ),
        },
    }
}
