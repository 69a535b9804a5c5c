//! Steps on the promotion's working tree: git-clone, yaml-update, yaml-parse, git-commit, git-push.

use serde_json::Value;
use serde_json::json;

use crate::git::git;
use crate::kargo::steps::{Outcome, StepContext, git_url, inside, text};

/// [K yaml_parser.go]: reads the file's first YAML document and evaluates each output's
/// `fromExpression` against it; any error Errors the step.
pub(super) fn yaml_parse(ctx: &StepContext, config: &Value) -> Outcome {
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
            let value = crate::kargo::expr::evaluate_in(text(output, "fromExpression"), &data)?;
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

pub(super) fn git_clone(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
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

pub(super) fn yaml_update(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
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

pub(super) const NOTHING_TO_COMMIT: &str = "nothing to commit";

pub(super) fn git_commit(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
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

pub(super) fn git_push(ctx: &StepContext, config: &Value) -> Result<(Value, String), String> {
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
