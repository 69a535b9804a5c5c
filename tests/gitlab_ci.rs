//! The copy-paste `.gitlab-ci.yml` in docs/examples, checked by structure (no GitLab CI schema
//! linter is on a registry here): the gate runs as a job of merge request pipelines only, with
//! the whole history, never allowed to fail (so "Pipelines must succeed" makes it required),
//! and every `gate` command line in its script takes only flags the real binary has, the token
//! named by `--token-env` and never pasted.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use serde_json::Value;

const EXAMPLE: &str = "docs/examples/addons-gate.gitlab-ci.yml";

fn read() -> String {
    std::fs::read_to_string(common::project_root().join(EXAMPLE)).unwrap()
}

/// What is wrong with a `.gitlab-ci.yml` meant to run the gate (empty: nothing).
fn problems(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ci: Value = match serde_saphyr::from_str(text) {
        Ok(ci) => ci,
        Err(e) => return vec![format!("not YAML: {e}")],
    };
    let mr_only = |rules: &Value| {
        rules.as_array().is_some_and(|rules| {
            !rules.is_empty()
                && rules.iter().all(|r| {
                    r["if"].as_str().is_some_and(|c| {
                        c.contains("$CI_PIPELINE_SOURCE == \"merge_request_event\"")
                    }) && r.get("when").is_none_or(|w| w != "never")
                })
        })
    };
    if !mr_only(&ci["workflow"]["rules"]) {
        out.push("workflow: rules must run merge request pipelines only".into());
    }
    let Some(job) = ci.get("gate") else {
        out.push("no `gate` job".into());
        return out;
    };
    if !mr_only(&job["rules"]) {
        out.push("gate: rules must run on merge request events only".into());
    }
    if job["variables"]["GIT_DEPTH"] != "0" {
        out.push("gate: GIT_DEPTH must be \"0\" (the merge base is read from git)".into());
    }
    if job.get("allow_failure").is_some_and(|a| a != false) {
        out.push("gate: allow_failure would let a red gate pass the pipeline".into());
    }
    let script: Vec<String> = job["script"]
        .as_array()
        .map(|lines| {
            lines
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let publish: Vec<&String> = script
        .iter()
        .filter(|l| l.starts_with("gate publish"))
        .collect();
    if publish.len() != 1 {
        out.push(format!(
            "gate: {} `gate publish` lines, not one",
            publish.len()
        ));
    }
    for wanted in [
        "--forge gitlab",
        "--forge-url \"$CI_API_V4_URL\"",
        "--repo-slug \"$CI_MERGE_REQUEST_PROJECT_PATH\"",
        "--pr \"$CI_MERGE_REQUEST_IID\"",
        "--expect-head \"$HEAD_SHA\"",
        "--token-env ADDONS_GATE_TOKEN",
    ] {
        if !publish.iter().any(|l| l.contains(wanted)) {
            out.push(format!("gate publish: missing `{wanted}`"));
        }
    }
    // The HTML report: written by `gate publish`, kept as an artifact also when the gate is
    // red, exposed on the merge request, and linked from a clipped note.
    let html = publish
        .first()
        .and_then(|l| l.split("--html ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string);
    match html {
        None => out.push("gate publish: no --html FILE".into()),
        Some(file) => {
            let paths: Vec<&str> = job["artifacts"]["paths"]
                .as_array()
                .map(|p| p.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if !paths.contains(&file.as_str()) {
                out.push(format!("gate: artifacts: paths must hold {file}"));
            }
            if job["artifacts"]["when"] != "always" {
                out.push("gate: artifacts: when must be always (a red gate's report)".into());
            }
            if job["artifacts"]["expose_as"].as_str().is_none() {
                out.push("gate: artifacts: expose_as links the report on the merge request".into());
            }
            let url = format!("--html-url \"$CI_JOB_URL/artifacts/file/{file}\"");
            if !publish.iter().any(|l| l.contains(&url)) {
                out.push(format!("gate publish: missing `{url}`"));
            }
        }
    }
    if text.contains("$ADDONS_GATE_TOKEN") || text.contains("${ADDONS_GATE_TOKEN") {
        out.push("the token is pasted into the script: name it with --token-env".into());
    }
    // Every flag of every `gate` line exists on that subcommand of the real binary.
    let cache = tempfile::tempdir().unwrap();
    for line in script.iter().filter(|l| l.starts_with("gate ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let command: Vec<&str> = words
            .iter()
            .skip(1)
            .take_while(|w| !w.starts_with("--"))
            .copied()
            .collect();
        let help = common::gate(cache.path())
            .args(&command)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout).to_string();
        for flag in words.iter().filter(|w| w.starts_with("--")) {
            if !help.contains(&format!("{flag} ")) && !help.contains(&format!("{flag}\n")) {
                out.push(format!("gate {}: no flag {flag}", command.join(" ")));
            }
        }
    }
    out
}

#[test]
fn the_gitlab_ci_example_runs_the_gate_as_a_required_merge_request_job() {
    assert_eq!(problems(&read()), Vec::<String>::new());
}

#[test]
fn the_structural_check_catches_what_would_make_the_gate_optional_or_broken() {
    let example = read();
    let cases = [
        ("--forge gitlab", "--froge gitlab", "no flag --froge"),
        ("GIT_DEPTH: \"0\"", "GIT_DEPTH: \"1\"", "GIT_DEPTH"),
        (
            "  timeout: 30m",
            "  timeout: 30m\n  allow_failure: true",
            "allow_failure",
        ),
        (
            "--token-env ADDONS_GATE_TOKEN",
            "--token-env ADDONS_GATE_TOKEN --author \"$ADDONS_GATE_TOKEN\"",
            "pasted",
        ),
        (
            "    when: always\n",
            "    when: on_success\n",
            "when must be always",
        ),
        (
            "paths: [addons-gate.html]",
            "paths: [report.html]",
            "paths must hold",
        ),
        (
            "    - if: $CI_PIPELINE_SOURCE == \"merge_request_event\"\n\nstages",
            "    - if: $CI_PIPELINE_SOURCE == \"push\"\n\nstages",
            "workflow",
        ),
    ];
    for (from, to, said) in cases {
        assert!(example.contains(from), "{from}");
        let broken = example.replacen(from, to, 1);
        let found = problems(&broken);
        assert!(found.iter().any(|p| p.contains(said)), "{said}: {found:?}");
    }
}
