//! The sample GitOps repository (scenarios/sample) rendered end to end with the real binaries.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use assert_cmd::prelude::*;
use serde_json::Value;

fn render_sample(
    format: &str,
    inventory: &str,
    cache: &std::path::Path,
    repo: &common::TestRepo,
) -> std::process::Output {
    let sample = common::sample_dir();
    common::gate(cache)
        .args([
            "render",
            "--format",
            format,
            "--repo-url",
            common::SAMPLE_REPO_URL,
        ])
        .arg("--repo")
        .arg(repo.path())
        .arg("--inventory")
        .arg(sample.join(inventory))
        .arg("--charts")
        .arg(sample.join("charts"))
        .output()
        .expect("gate runs")
}

fn sample_repo() -> common::TestRepo {
    common::TestRepo::from_fixture(&common::sample_dir().join("repo"))
}

#[test]
fn sample_summary_lists_every_application_per_cluster() {
    let repo = sample_repo();
    let cache = tempfile::tempdir().unwrap();
    let output = render_sample("summary", "inventory.yaml", cache.path(), &repo);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout).replace(&repo.head()[..12], "[COMMIT12]");
    insta::assert_snapshot!(stdout);
}

#[test]
fn sample_json_document() {
    let repo = sample_repo();
    let cache = tempfile::tempdir().unwrap();
    let output = render_sample("json", "inventory.yaml", cache.path(), &repo);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    insta::assert_json_snapshot!(document, { ".revision" => "[COMMIT]" });
}

#[test]
fn cluster_secrets_inventory_renders_the_same_applications() {
    let repo = sample_repo();
    let cache = tempfile::tempdir().unwrap();
    let names = |inventory: &str| -> Vec<(String, String)> {
        let output = render_sample("json", inventory, cache.path(), &repo);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let document: Value = serde_json::from_slice(&output.stdout).unwrap();
        document["applications"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["name"].as_str().unwrap().to_string(),
                    a["cluster"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(names("inventory.yaml"), names("inventory-secrets.yaml"));
}

#[test]
fn warm_cache_runs_no_helm() {
    let repo = sample_repo();
    let cache = tempfile::tempdir().unwrap();
    let cold = render_sample("json", "inventory.yaml", cache.path(), &repo);
    let warm = render_sample("json", "inventory.yaml", cache.path(), &repo);
    assert!(cold.status.success() && warm.status.success());
    assert_eq!(
        cold.stdout, warm.stdout,
        "a cached render must print the same document"
    );
    let cold_stats = String::from_utf8_lossy(&cold.stderr).to_string();
    let warm_stats = String::from_utf8_lossy(&warm.stderr).to_string();
    assert!(cold_stats.contains(" 0 from cache"), "{cold_stats}");
    assert!(
        warm_stats.contains(": 0 helm, 0 kustomize,"),
        "{warm_stats}"
    );
}

#[test]
fn another_helm_version_renders_afresh_then_is_cached_too() {
    // The persistent cache keys a render by its inputs and the version of the helm that made
    // it: a helm upgrade must not be answered with the old helm's output.
    let repo = sample_repo();
    let cache = tempfile::tempdir().unwrap();
    let real = common::project_root().join("target/tools/helm");
    let bin = tempfile::tempdir().unwrap();
    let upgraded = bin.path().join("helm");
    std::fs::write(
        &upgraded,
        format!(
            "#!/bin/sh\nif [ \"$1\" = version ]; then echo v9.9.9+upgraded; exit 0; fi\nexec '{}' \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&upgraded, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = |helm: &std::path::Path| {
        let sample = common::sample_dir();
        let output = common::gate(cache.path())
            .args(["render", "--format", "json", "--repo-url"])
            .arg(common::SAMPLE_REPO_URL)
            .arg("--repo")
            .arg(repo.path())
            .arg("--inventory")
            .arg(sample.join("inventory.yaml"))
            .arg("--charts")
            .arg(sample.join("charts"))
            .arg("--helm")
            .arg(helm)
            .output()
            .expect("gate runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        (
            output.stdout,
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let (first, _) = run(&real);
    let (again, stats) = run(&upgraded);
    assert_eq!(first, again, "the same charts render the same document");
    assert!(!stats.contains(": 0 helm,"), "{stats}");
    let (_, stats) = run(&upgraded);
    assert!(stats.contains(": 0 helm, 0 kustomize,"), "{stats}");
}

#[test]
fn missing_helm_says_what_to_do() {
    let repo = sample_repo();
    let cache = tempfile::tempdir().unwrap();
    common::gate(cache.path())
        .args(["render", "--helm", "/nonexistent/helm"])
        .arg("--repo")
        .arg(repo.path())
        .assert()
        .failure()
        .stderr(predicates::str::contains(
            "no helm found: tried --helm /nonexistent/helm",
        ))
        .stderr(predicates::str::contains("cargo xtask tools"));
}

#[test]
fn tools_reports_which_helm() {
    let cache = tempfile::tempdir().unwrap();
    let helm = common::project_root().join("target/tools/helm");
    common::gate(cache.path())
        .args(["tools", "--helm"])
        .arg(&helm)
        .assert()
        .success()
        .stdout(predicates::str::contains("helm v4.1.4"))
        .stdout(predicates::str::contains("(command-line flag)"));
}
