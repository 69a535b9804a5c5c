//! Scores the recorded incidents in evals/ (see evals/README.md): gate verdict, Bosun's path,
//! and for a swap the exact files it would rewrite, each checked through the same code a triage
//! runs. Prints a score table; anything below 100% fails.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::collections::BTreeMap;

use gitops_loop::bosun::applier::{self, Policy};
use gitops_loop::bosun::classify::{self, Path, Situation};
use gitops_loop::bosun::swap;
use gitops_loop::gate::{check, report};
use gitops_loop::render::{self, RenderConfig, cache::RenderCache, inventory::Inventory, tools};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[allow(dead_code)]
    description: String,
    expect: Expect,
}

#[derive(Deserialize, PartialEq, Debug)]
#[serde(deny_unknown_fields)]
struct Expect {
    outcome: String,
    path: String,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    mentions: Option<String>,
}

fn config(repo: &std::path::Path, cache: &std::path::Path) -> RenderConfig {
    let root = common::project_root();
    let tool = |name: &'static str| tools::Tool {
        name,
        path: root.join("target/tools").join(name),
        source: tools::ToolSource::Flag,
        limits: Default::default(),
    };
    let inventory_path = common::sample_dir().join("inventory.yaml");
    RenderConfig {
        repo_dir: repo.to_path_buf(),
        revision: "pr".into(),
        repo_url: Some(common::SAMPLE_REPO_URL.into()),
        inventory: Inventory::parse(
            &std::fs::read_to_string(&inventory_path).unwrap(),
            "inventory.yaml",
        )
        .unwrap(),
        charts: Some(common::sample_dir().join("charts")),
        git_mirrors: Vec::new(),
        helm: tool("helm"),
        kubectl: Some(tool("kubectl")),
        cache: RenderCache::at(cache.to_path_buf()),
        max_depth: render::DEFAULT_MAX_DEPTH,
        jobs: 2,
        chart_pulls: Default::default(),
        chart_repo_mirrors: Vec::new(),
        kustomize_enable_helm: false,
        parsed: Default::default(),
    }
}

/// (outcome, path, files, text) as a triage would leave them.
fn score(dir: &std::path::Path, cache: &std::path::Path) -> Expect {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    if dir.join("base").is_dir() {
        repo.commit_overlay(&dir.join("base"), "main", "base");
    }
    repo.commit_overlay(&dir.join("head"), "pr", "the pull request");
    let config = config(repo.path(), cache);
    let result = check::check(
        &config,
        &check::Revisions {
            base: None,
            head: "pr".into(),
            default_branch: Some("main".into()),
        },
    );
    // Bosun reads the report as published, not the in-memory result.
    let (markdown, _) = report::render(&result);
    let parsed = report::parse(&markdown).unwrap();
    let outcome = serde_json::to_value(parsed.verdict.outcome)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    let situation = Situation {
        report: Some(&parsed),
        head_sha: &parsed.verdict.head,
        fork: false,
        attempts: 0,
        attempt_cap: 2,
    };
    let (path, files, text) = match classify::classify(&situation) {
        Path::Wait(why) => ("wait", vec![], why),
        Path::Green => ("green", vec![], String::new()),
        Path::WorthALook(reasons) => ("worth-a-look", vec![], reasons.join(", and ")),
        Path::Escalate(line) => ("escalate", vec![], line),
        Path::Handoff(h) => (
            "handoff",
            vec![],
            format!("{} {} {}", h.open, h.choice, h.fact),
        ),
        Path::Swap(dropped) => {
            let plan = swap::plan(&dropped);
            let policy = Policy::new(
                &[".github/**".into()],
                &["**/*.yaml".into(), "**/*.yml".into()],
                None,
            )
            .unwrap();
            match applier::prepare(repo.path(), &policy, &plan) {
                Err(refusals) => (
                    "handoff",
                    vec![],
                    refusals
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                Ok(rewrites) => {
                    let rendering = render::render(&config).unwrap();
                    let losses = gitops_loop::bosun::reshape::reshape_losses(
                        &rewrites, &plan, &dropped, &rendering,
                    );
                    if losses.is_empty() {
                        (
                            "swap",
                            rewrites.iter().map(|r| r.path.clone()).collect(),
                            String::new(),
                        )
                    } else {
                        (
                            "handoff",
                            vec![],
                            losses
                                .iter()
                                .map(|(d, l)| format!("{d}: {l}"))
                                .collect::<Vec<_>>()
                                .join("; "),
                        )
                    }
                }
            }
        }
    };
    Expect {
        outcome,
        path: path.into(),
        files,
        mentions: Some(text),
    }
}

#[test]
fn evals() {
    let root = common::project_root().join("evals");
    let cache = tempfile::tempdir().unwrap();
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("case.yaml").is_file())
        .map(|e| e.path())
        .collect();
    cases.sort();
    let mut results: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    for dir in &cases {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let case: Case =
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
                .unwrap();
        let got = score(dir, cache.path());
        let want = case.expect;
        let mut misses = Vec::new();
        if got.outcome != want.outcome {
            misses.push(format!("outcome {} (want {})", got.outcome, want.outcome));
        }
        if got.path != want.path {
            misses.push(format!("path {} (want {})", got.path, want.path));
        }
        if got.files != want.files {
            misses.push(format!("files {:?} (want {:?})", got.files, want.files));
        }
        let text = got.mentions.unwrap_or_default();
        if let Some(wanted) = &want.mentions
            && !text.contains(wanted.as_str())
        {
            misses.push(format!("text {text:?} lacks {wanted:?}"));
        }
        results.insert(
            name,
            if misses.is_empty() {
                Ok(())
            } else {
                Err(misses.join("; "))
            },
        );
    }
    let passed = results.values().filter(|r| r.is_ok()).count();
    println!("evals: {passed}/{} passed", results.len());
    for (name, result) in &results {
        match result {
            Ok(()) => println!("  pass  {name}"),
            Err(why) => println!("  FAIL  {name}: {why}"),
        }
    }
    assert_eq!(passed, results.len(), "evals below 100%: {results:#?}");
    assert!(results.len() >= 7, "evals went missing");
}
