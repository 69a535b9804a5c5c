//! The real helm pulls from the chart repository double: `gate charts pull` fills an empty
//! mirror through a pull-through mapping, and a newly published version becomes pullable.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use ground::charts::ChartRepositoryDouble;

#[tokio::test(flavor = "multi_thread")]
async fn gate_charts_pull_fills_the_mirror_with_real_helm() {
    let sample = common::sample_dir();
    let helm = common::project_root().join("target/tools/helm");
    let stable = sample.join("charts/charts.example.test/stable");
    let repository = ChartRepositoryDouble::start(
        "https://charts.example.test/stable",
        &stable,
        &helm,
        &["cert-manager-lite@1.19.3".to_string()],
    )
    .await
    .unwrap();
    assert!(
        repository
            .versions("cert-manager-lite")
            .contains(&"1.19.2".to_string())
    );
    assert!(
        !repository
            .versions("cert-manager-lite")
            .contains(&"1.19.3".to_string())
    );

    let repo = common::TestRepo::from_fixture(&sample.join("repo"));
    let mirror = tempfile::tempdir().unwrap();
    // The OCI chart is not served by this double: seed it.
    ground::git::copy_tree(
        &sample.join("charts/registry.example.test"),
        &mirror.path().join("registry.example.test"),
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let pull = |revision: &str| {
        common::gate(cache.path())
            .args([
                "--quiet",
                "charts",
                "pull",
                "--revision",
                revision,
                "--repo-url",
                common::SAMPLE_REPO_URL,
            ])
            .arg("--repo")
            .arg(repo.path())
            .arg("--inventory")
            .arg(sample.join("inventory.yaml"))
            .arg("--charts")
            .arg(mirror.path())
            .arg("--chart-repo-mirror")
            .arg(format!(
                "https://charts.example.test/stable={}",
                repository.url()
            ))
            .output()
            .unwrap()
    };
    let output = pull("main");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let pulled = mirror
        .path()
        .join("charts.example.test/stable/cert-manager-lite/1.19.2/Chart.yaml");
    assert!(
        pulled.is_file(),
        "helm pull --untar wrote the chart where the mirror layout says"
    );

    // A head that needs an unpublished version cannot be pulled until it appears.
    let bump = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(bump.path().join("targets")).unwrap();
    let targets = std::fs::read_to_string(sample.join("repo/targets/addons.yaml"))
        .unwrap()
        .replace("version: 1.19.2", "version: 1.19.3");
    std::fs::write(bump.path().join("targets/addons.yaml"), targets).unwrap();
    let head = repo.commit_overlay(bump.path(), "bump", "bump cert-manager-lite");
    let refused = pull(&head);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("cert-manager-lite version 1.19.3"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    repository.publish("cert-manager-lite", "1.19.3").unwrap();
    let output = pull(&head);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        mirror
            .path()
            .join("charts.example.test/stable/cert-manager-lite/1.19.3/Chart.yaml")
            .is_file()
    );
}
