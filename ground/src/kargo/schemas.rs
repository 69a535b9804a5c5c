//! The config schemas Kargo v1.11's built-in steps validate before they run
//! ([K pkg/promotion/runner/builtin/schemas/*-config.json]), written here for the steps the
//! ground runs and the fields they take: unknown fields are refused, required fields, types,
//! minimums and the one-of rules (a push names exactly one of a generated branch, a target
//! branch or a tag; a checkout at most one of branch, commit or tag). A config that fails is a
//! terminal error in Kargo (the Promotion Errors), and so it is here.

use serde_json::{Value, json};
use std::sync::LazyLock;

fn string() -> Value {
    json!({"type": "string"})
}

fn non_empty() -> Value {
    json!({"type": "string", "minLength": 1})
}

fn duration() -> Value {
    json!({"type": "string", "pattern": "(?:\\d+(ns|us|µs|ms|s|m|h))+"})
}

fn provider() -> Value {
    json!({"type": "string", "enum": ["azure", "bitbucket", "gitea", "github", "gitlab"]})
}

fn author() -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["name", "email"],
        "properties": {"name": non_empty(), "email": string(), "signingKey": string()}})
}

fn named_pairs() -> Value {
    json!({"type": "array", "items": {"type": "object", "additionalProperties": false,
        "required": ["name", "value"], "properties": {"name": non_empty(), "value": non_empty()}}})
}

fn expression_outputs(min: u64) -> Value {
    json!({"type": "array", "minItems": min, "items": {"type": "object",
        "additionalProperties": false, "required": ["name", "fromExpression"],
        "properties": {"name": non_empty(), "fromExpression": non_empty()}}})
}

/// Unset or empty: what Kargo's one-of rules accept as "not given".
fn absent() -> Value {
    json!({"enum": [null, ""]})
}

fn schema(step: &str) -> Option<Value> {
    Some(match step {
        "git-clone" => json!({"type": "object", "additionalProperties": false,
        "required": ["repoURL", "checkout"],
        "properties": {
            "repoURL": non_empty(), "insecureSkipTLSVerify": {"type": "boolean"},
            "recurseSubmodules": {"type": "boolean"}, "blobless": {"type": "boolean"},
            "author": author(),
            "checkout": {"type": "array", "minItems": 1, "items": {"type": "object",
                "additionalProperties": false, "required": ["path"],
                "properties": {"path": non_empty(), "branch": string(), "commit": string(),
                    "tag": string(), "create": {"type": "boolean"}, "as": string(),
                    "sparse": {"type": "array", "minItems": 1, "items": non_empty()}},
                "oneOf": [
                    {"properties": {"branch": absent(), "commit": absent(), "tag": absent()}},
                    {"required": ["branch"], "properties": {"branch": {"minLength": 1}, "commit": absent(), "tag": absent()}},
                    {"required": ["commit"], "properties": {"commit": {"minLength": 1}, "branch": absent(), "tag": absent()}},
                    {"required": ["tag"], "properties": {"tag": {"minLength": 1}, "branch": absent(), "commit": absent()}}
                ]}}}}),
        "yaml-update" => json!({"type": "object", "additionalProperties": false,
            "required": ["path", "updates"],
            "properties": {"path": non_empty(), "updates": {"type": "array", "minItems": 1,
                "items": {"type": "object", "additionalProperties": false,
                    "required": ["key", "value"], "properties": {"key": non_empty(), "value": {}}}}}}),
        "yaml-parse" => json!({"type": "object", "additionalProperties": false,
            "required": ["path", "outputs"],
            "properties": {"path": non_empty(), "outputs": expression_outputs(1)}}),
        "git-commit" => json!({"type": "object", "additionalProperties": false,
            "required": ["path", "message"],
            "properties": {"path": non_empty(), "message": non_empty(), "author": author()}}),
        "git-push" => json!({"type": "object", "additionalProperties": false, "required": ["path"],
        "properties": {"path": non_empty(), "generateTargetBranch": {"type": "boolean"},
            "targetBranch": string(), "tag": string(), "force": {"type": "boolean"},
            "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 2147483647},
            "provider": provider()},
        "oneOf": [
            {"required": ["generateTargetBranch"], "properties": {"generateTargetBranch": {"const": true}, "targetBranch": absent(), "tag": absent()}},
            {"required": ["targetBranch"], "properties": {"generateTargetBranch": {"enum": [false, null]}, "targetBranch": {"minLength": 1}, "tag": absent()}},
            {"required": ["tag"], "properties": {"generateTargetBranch": {"enum": [false, null]}, "targetBranch": absent(), "tag": {"minLength": 1}, "force": {"enum": [false, null]}}},
            {"properties": {"generateTargetBranch": {"enum": [false, null]}, "targetBranch": absent(), "tag": absent()}}
        ]}),
        "git-open-pr" => json!({"type": "object", "additionalProperties": false,
            "required": ["repoURL", "sourceBranch", "targetBranch"],
            "properties": {"repoURL": non_empty(), "sourceBranch": non_empty(),
                "targetBranch": non_empty(), "title": non_empty(), "description": non_empty(),
                "labels": {"type": "array", "items": non_empty()},
                "createTargetBranch": {"type": "boolean"},
                "insecureSkipTLSVerify": {"type": "boolean"}, "provider": provider()}}),
        "git-wait-for-pr" => json!({"type": "object", "additionalProperties": false,
            "required": ["repoURL", "prNumber"],
            "properties": {"repoURL": non_empty(), "prNumber": {"type": "integer", "minimum": 1},
                "pollInterval": duration(), "insecureSkipTLSVerify": {"type": "boolean"},
                "provider": provider()}}),
        "git-merge-pr" => json!({"type": "object", "additionalProperties": false,
            "required": ["repoURL", "prNumber"],
            "properties": {"repoURL": non_empty(), "prNumber": {"type": "integer", "minimum": 1},
                "wait": {"type": "boolean"}, "pollInterval": duration(), "mergeMethod": non_empty(),
                "insecureSkipTLSVerify": {"type": "boolean"}, "provider": provider()}}),
        "http" => json!({"type": "object", "additionalProperties": false, "required": ["url"],
            "properties": {"url": non_empty(),
                "method": {"type": "string", "pattern": "^(DELETE|GET|HEAD|PATCH|POST|PUT)$"},
                "headers": named_pairs(), "queryParams": named_pairs(), "body": string(),
                "insecureSkipTLSVerify": {"type": "boolean"},
                "proxy": {"type": "string", "pattern": "^https?://.*$"},
                "timeout": duration(), "pollInterval": duration(),
                "responseContentType": {"type": "string", "pattern": "^(application/json|application/yaml|text/plain)$"},
                "outputs": expression_outputs(0), "successExpression": string(),
                "failureExpression": string(), "errorExpression": string()}}),
        "argocd-update" => json!({"type": "object", "additionalProperties": false,
        "required": ["apps"],
        "properties": {"apps": {"type": "array", "minItems": 1, "items": {"type": "object",
            "additionalProperties": false,
            "properties": {"name": non_empty(), "namespace": non_empty(),
                "selector": {"type": "object"},
                "sources": {"type": "array", "minItems": 1, "items": {"type": "object",
                    "additionalProperties": false, "required": ["repoURL"],
                    "properties": {"repoURL": non_empty(), "chart": non_empty(),
                        "desiredRevision": non_empty(),
                        "updateTargetRevision": {"type": "boolean"},
                        "helm": {"type": "object"}, "kustomize": {"type": "object"}},
                    "oneOf": [
                        {"properties": {"desiredRevision": absent(), "updateTargetRevision": {"enum": [false, null]}}},
                        {"required": ["desiredRevision"], "properties": {"desiredRevision": {"minLength": 1}}}
                    ]}}},
            "oneOf": [
                {"required": ["name"], "properties": {"name": {"minLength": 1}, "selector": {"enum": [null]}}},
                {"required": ["selector"], "properties": {"name": absent()}}
            ]}}}}),
        "compose-output" => json!({"type": "object", "minProperties": 1}),
        _ => return None,
    })
}

static VALIDATORS: LazyLock<Vec<(&'static str, jsonschema::Validator)>> = LazyLock::new(|| {
    [
        "git-clone",
        "yaml-update",
        "yaml-parse",
        "git-commit",
        "git-push",
        "git-open-pr",
        "git-wait-for-pr",
        "git-merge-pr",
        "http",
        "argocd-update",
        "compose-output",
    ]
    .into_iter()
    .filter_map(|step| {
        let compiled = jsonschema::validator_for(&schema(step)?).ok()?;
        Some((step, compiled))
    })
    .collect()
});

/// Checks a step's evaluated config; the error names the first violation as Kargo's does
/// ("invalid <step> config: ...").
pub fn validate(step: &str, config: &Value) -> Result<(), String> {
    let Some((_, validator)) = VALIDATORS.iter().find(|(s, _)| *s == step) else {
        return Err(format!("step {step:?} is not supported by the ground"));
    };
    match validator.iter_errors(config).next() {
        None => Ok(()),
        Some(error) => {
            let at = error.instance_path().to_string();
            let at = if at.is_empty() {
                "(root)".to_string()
            } else {
                at
            };
            Err(format!("invalid {step} config: {at}: {error}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_compiles() {
        assert_eq!(VALIDATORS.len(), 11);
    }

    #[test]
    fn configs_kargo_refuses_are_refused() {
        // The http body the docs once gave: a JSON-looking template became an object.
        let error = validate(
            "http",
            &json!({"url": "https://b/intake", "method": "POST",
            "body": {"repository": "platform/gitops", "pullRequest": 7}}),
        )
        .unwrap_err();
        assert!(error.contains("/body"), "{error}");
        assert!(validate("http", &json!({"url": "https://b/intake", "body": "{}"})).is_ok());
        // argocd-update needs at least one Application.
        assert!(validate("argocd-update", &json!({"apps": []})).is_err());
        assert!(validate("argocd-update", &json!({"apps": [{"name": "a"}]})).is_ok());
        // A PR number that stayed a string (quoted) is refused.
        assert!(validate("git-wait-for-pr", &json!({"repoURL": "r", "prNumber": "7"})).is_err());
        // git-push: one of a generated branch, a target branch, a tag.
        assert!(
            validate(
                "git-push",
                &json!({"path": "./out", "generateTargetBranch": true})
            )
            .is_ok()
        );
        assert!(
            validate(
                "git-push",
                &json!({"path": "./out", "generateTargetBranch": true, "targetBranch": "x"})
            )
            .is_err()
        );
        // Unknown fields.
        assert!(
            validate(
                "git-commit",
                &json!({"path": "./out", "message": "m", "extra": 1})
            )
            .is_err()
        );
        assert!(validate("no-such-step", &json!({})).is_err());
    }
}
