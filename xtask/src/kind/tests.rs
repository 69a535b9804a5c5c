//! Tests of the kind path: the plans' dry-run snapshots, their secrets, quoting and staging.

use std::collections::HashMap;
use std::path::Path;

use super::run::{dry_run_text, fill, quote};
use super::scenario::{KargoSource, WorkloadCluster};
use super::stage::{PAUSE_VALUES, lay_out, pause_workloads, rewrite, unpublished};
use super::*;

fn happy() -> KargoSource {
    KargoSource::Pipelines("pipelines.yaml".into())
}

/// The Stage-to-chart map of a real scenario's pipelines values.
fn stage_charts_of(name: &str) -> std::collections::BTreeMap<String, String> {
    let yaml = scenario(name);
    let source = kargo_source(&yaml, name).expect("source");
    scenario::scenario_stage_charts(&project_root(), name, &source).expect("stage charts")
}

/// The workload clusters of a real scenario (every scenario names the sample inventory).
fn clusters(name: &str) -> Vec<WorkloadCluster> {
    workload_clusters(&project_root(), &scenario(name), name).expect("clusters")
}

/// The real scenario files, read from this checkout.
fn scenario(name: &str) -> serde_json::Value {
    read_scenario(&project_root(), name).expect("scenario")
}

#[test]
fn plan_up_triage_dry_run() {
    let source = kargo_source(&scenario("triage"), "triage").unwrap();
    assert_eq!(source, KargoSource::Pipelines("pipelines.yaml".into()));
    let text = dry_run_text(&plan_up(
        Path::new("/work/gitops-loop"),
        "triage",
        &source,
        &clusters("triage"),
    ));
    insta::assert_snapshot!(text);
}

#[test]
fn plan_play_triage_dry_run() {
    let steps = plan_play(
        Path::new("/work/gitops-loop"),
        "triage",
        &scenario("triage"),
        &stage_charts_of("triage"),
    )
    .unwrap();
    insta::assert_snapshot!(dry_run_text(&steps));
}

#[test]
fn every_scenario_has_a_play_plan_and_says_what_it_skips() {
    let root = project_root();
    for entry in std::fs::read_dir(root.join("scenarios")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if !entry.path().join("scenario.yaml").exists() {
            continue;
        }
        let yaml = scenario(&name);
        kargo_source(&yaml, &name).unwrap();
        let steps = plan_play(Path::new("/r"), &name, &yaml, &stage_charts_of(&name)).unwrap();
        let timeline = yaml["timeline"].as_array().map_or(0, Vec::len);
        assert!(
            timeline == 0 || steps.len() > 1,
            "{name}: the timeline was not planned"
        );
    }
}

#[test]
fn hostile_scenario_values_do_not_reach_a_command() {
    let yaml = |timeline: serde_json::Value| serde_json::json!({"timeline": timeline});
    for bad in [
        serde_json::json!([{"publish": "x@1.0.0; rm -rf /"}]),
        serde_json::json!([{"publish": "../../etc@1"}]),
        serde_json::json!([{"refresh": "a b"}]),
        serde_json::json!([{"merge": {"by": "x"}}]),
        serde_json::json!([7]),
    ] {
        assert!(
            plan_play(
                Path::new("/r"),
                "s",
                &yaml(bad.clone()),
                &Default::default()
            )
            .is_err(),
            "{bad}"
        );
    }
    let slug = serde_json::json!({"repository": {"slug": "a/b/../c"}, "timeline": []});
    assert!(plan_play(Path::new("/r"), "s", &slug, &Default::default()).is_err());
    for (kargo, ok) in [
        (serde_json::json!({"pipelines": "../../x.yaml"}), false),
        (serde_json::json!({"pipelines": "/etc/x.yaml"}), false),
        (serde_json::json!({"pipelines": "a/../../../x"}), false),
        (serde_json::json!({"pipelines": "a", "objects": "b"}), false),
        (serde_json::json!({"pipelines": "../sample/p.yaml"}), true),
    ] {
        let source = kargo_source(&serde_json::json!({ "kargo": kargo }), "s");
        assert_eq!(source.is_ok(), ok, "{kargo}");
    }
    assert!(read_scenario(Path::new("/r"), "../etc").is_err());
}

#[test]
fn plan_up_dry_run() {
    let text = dry_run_text(&plan_up(
        Path::new("/work/gitops-loop"),
        "happy-path",
        &happy(),
        &clusters("happy-path"),
    ));
    insta::assert_snapshot!(text);
}

#[test]
fn plan_does_not_depend_on_the_root() {
    let clusters = clusters("happy-path");
    let here = plan_up(
        Path::new("/work/gitops-loop"),
        "happy-path",
        &happy(),
        &clusters,
    );
    let there = plan_up(
        Path::new("/home/someone/src/gitops-loop"),
        "happy-path",
        &happy(),
        &clusters,
    );
    assert_eq!(here, there);
    for step in &here {
        for arg in &step.argv {
            assert!(
                !arg.starts_with('/') || arg == "/dev/null",
                "{arg} in {step:?}"
            );
        }
    }
}

#[test]
fn plan_down_deletes_the_clusters() {
    assert_eq!(
        dry_run_text(&plan_down(&clusters("triage"))),
        "# delete the cluster and everything in it\nkind delete cluster --name gitops-loop\n\
         # delete the scenario's cluster prod-eu\nkind delete cluster --name gitops-loop-prod-eu\n\
         # delete the scenario's cluster prod-us\nkind delete cluster --name gitops-loop-prod-us\n\
         # delete the scenario's cluster staging\nkind delete cluster --name gitops-loop-staging\n"
    );
}

/// The triage story's argocd-update names external-secrets-<cluster> Applications: each
/// cluster of the inventory but Argo CD's own is a kind cluster, registered with the labels
/// the addons ApplicationSet selects on.
#[test]
fn the_inventory_clusters_become_registered_kind_clusters() {
    let clusters = clusters("triage");
    let names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["prod-eu", "prod-us", "staging"]);
    assert!(
        clusters[0]
            .labels
            .contains(&("addons".to_string(), "enabled".to_string()))
    );
    let steps = plan_up(Path::new("/r"), "triage", &happy(), &clusters);
    let text = dry_run_text(&steps);
    for name in names {
        assert!(text.contains(&format!("kind create cluster --name gitops-loop-{name} ")));
        assert!(text.contains(&format!(
            "--from-literal=server=https://gitops-loop-{name}-control-plane:6443"
        )));
    }
    assert!(text.contains(
        "kubectl --context kind-gitops-loop label secret cluster-prod-eu --namespace argocd argocd.argoproj.io/secret-type=cluster addons=enabled env=prod region=eu"
    ));
    // The token and CA are captured by their own steps and land in the config where Argo CD
    // reads them, each cluster's own.
    let mut values = HashMap::new();
    for step in &steps {
        if let Some(secret) = step.captures {
            values.insert(secret, format!("{secret:?}"));
        }
    }
    let position = |what: &str| {
        steps
            .iter()
            .position(|s| s.what.starts_with(what))
            .expect(what)
    };
    let used = position("cluster staging: Argo CD's cluster Secret");
    let argv = fill(&steps[used], &values).expect("filled");
    let config = argv
        .iter()
        .find_map(|a| a.strip_prefix("--from-literal=config="))
        .expect("config");
    let config: serde_json::Value = serde_json::from_str(config).expect("JSON");
    assert_eq!(config["bearerToken"], "ClusterToken(2)");
    assert_eq!(config["tlsClientConfig"]["caData"], "ClusterCa(2)");
    assert!(position("cluster staging: a token") < used);
    assert!(position("cluster staging: its CA certificate") < used);
}

#[test]
fn hostile_inventory_values_do_not_reach_a_command() {
    let dir = tempfile::tempdir().unwrap();
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir_all(scenarios.join("s")).unwrap();
    let yaml = serde_json::json!({"inventory": "../inventory.yaml"});
    for (inventory, ok) in [
        ("clusters: [{name: a, labels: {env: prod}}]", true),
        (
            "clusters: [{name: in-cluster, server: https://kubernetes.default.svc}]",
            true,
        ),
        ("clusters: [{name: 'a;rm -rf /'}]", false),
        ("clusters: [{name: Prod}]", false),
        ("clusters: [{name: a, labels: {'x y': z}}]", false),
        ("clusters: [{name: a, labels: {env: '$(id)'}}]", false),
        ("clusters: [{name: a, annotations: {'a/b/c': z}}]", false),
        ("clusters: [{name: a, annotations: {team: '--all'}}]", false),
        ("clusters: [{name: a, labels: {'-l/x': y}}]", false),
        ("clusters: [{name: a, labels: {'x.-/y': z}}]", false),
        (
            "clusters: [{name: a, labels: {'argocd.argoproj.io/secret-type': x}}]",
            false,
        ),
        (
            "clusters: [{name: a, annotations: {'gitops-gate.io/kube-version': '1.1'}}]",
            false,
        ),
        ("clusters: [{name: a, labels: {env: 'prod-'}}]", false),
        (
            "clusters: [{name: a, labels: {env: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'}}]",
            false,
        ),
        (
            "clusters: [{name: a, labels: {example.test/env: EU}}]",
            true,
        ),
    ] {
        std::fs::write(scenarios.join("inventory.yaml"), inventory).unwrap();
        let result = workload_clusters(dir.path(), &yaml, "s");
        assert_eq!(result.is_ok(), ok, "{inventory}: {result:?}");
    }
    let outside = serde_json::json!({"inventory": "../../etc/x.yaml"});
    assert!(workload_clusters(dir.path(), &outside, "s").is_err());
}

/// The play plans' placeholders are the Gitea password `up` wrote, and nothing else.
#[test]
fn play_plans_fill_from_the_credentials_up_wrote() {
    let values = HashMap::from([(Secret::GiteaPassword, "pw".to_string())]);
    for name in ["triage", "happy-path"] {
        let steps = plan_play(
            Path::new("/r"),
            name,
            &scenario(name),
            &stage_charts_of(name),
        )
        .unwrap();
        for step in &steps {
            let argv = fill(step, &values).unwrap_or_else(|e| panic!("{}: {e}", step.what));
            assert!(argv.iter().all(|a| !a.contains(GENERATED)));
        }
    }
}

/// Every placeholder has its secret, and every secret is known before a step uses it:
/// generated ones from the start, captured ones once the capturing step has run.
#[test]
fn secrets_fill_every_placeholder_in_order() {
    let mut values: HashMap<Secret, String> = HashMap::from([
        (Secret::KargoPasswordHash, "hash".to_string()),
        (Secret::KargoTokenSigningKey, "key".to_string()),
        (Secret::GiteaPassword, "pw".to_string()),
        (Secret::BosunWebhook, "hook".to_string()),
    ]);
    let steps = plan_up(
        Path::new("/r"),
        "happy-path",
        &happy(),
        &clusters("happy-path"),
    );
    for step in &steps {
        let placeholders: usize = step.argv.iter().map(|a| a.matches(GENERATED).count()).sum();
        assert_eq!(placeholders, step.secrets.len(), "{}", step.what);
        let argv = fill(step, &values).expect("filled");
        assert!(argv.iter().all(|a| !a.contains(GENERATED)));
        if let Some(secret) = step.captures {
            values.insert(secret, "token".to_string());
        }
    }
    let kargo = steps
        .iter()
        .find(|s| s.what.starts_with("Kargo,"))
        .expect("kargo");
    let argv = fill(kargo, &values).expect("filled");
    assert!(argv.contains(&"api.adminAccount.passwordHash=hash".to_string()));
    assert!(argv.contains(&"api.adminAccount.tokenSigningKey=key".to_string()));
    let push = steps
        .iter()
        .find(|s| s.what == "push the staged sample repository")
        .expect("push");
    assert!(
        fill(push, &values)
            .expect("filled")
            .contains(&"http://gitops-admin:pw@127.0.0.1:31082/platform/gitops.git".into())
    );
}

#[test]
fn a_secret_used_before_it_is_known_is_an_error() {
    let step = Step::new("x", argv!["echo", GENERATED]).with_secrets(&[Secret::GiteaToken]);
    assert!(fill(&step, &HashMap::new()).is_err());
    let step = Step::new("x", argv!["echo", GENERATED]);
    assert!(fill(&step, &HashMap::new()).is_err());
}

#[test]
fn quoting() {
    assert_eq!(quote("kind/cluster.yaml"), "kind/cluster.yaml");
    assert_eq!(quote("crds.enabled=true"), "crds.enabled=true");
    assert_eq!(quote(""), "''");
    assert_eq!(quote("a b"), "'a b'");
    assert_eq!(quote("x=<generated>"), "'x=<generated>'");
    assert_eq!(quote("it's"), r"'it'\''s'");
}

#[test]
fn rewrite_points_the_scenario_urls_at_gitea() {
    let text = "repoURL: https://git.example.test/platform/gitops.git\n\
                chart: https://charts.example.test/stable\n\
                oci: registry.example.test/charts\n";
    assert_eq!(
        rewrite(text),
        "repoURL: http://gitea-http.gitea.svc.cluster.local:3000/platform/gitops.git\n\
         chart: http://gitea-http.gitea.svc.cluster.local:3000/platform/charts/raw/branch/main\n\
         oci: registry.example.test/charts\n"
    );
    assert!(
        URL_MAP
            .iter()
            .all(|(_, to)| to.starts_with(GITEA_IN_CLUSTER)
                || *to == BOSUN_IN_CLUSTER
                || *to == PROMETHEUS_IN_CLUSTER)
    );
}

#[test]
fn unpublished_reads_block_and_flow_lists() {
    let block = "charts:\n  repositories:\n    - url: https://charts.example.test/stable\n      unpublished:\n        - cert-manager-lite@1.19.3\n        # a comment\n        - \"reloader@1.2.0\"  # quoted\n    - url: https://other.example.test\n      unpublished: [a@1, 'b@2']\nkargo:\n  project: x\n";
    assert_eq!(
        unpublished(block),
        ["cert-manager-lite@1.19.3", "reloader@1.2.0", "a@1", "b@2"]
    );
    let same_indent = "unpublished:\n- a@1\n- b@2\nnext: 1\n";
    assert_eq!(unpublished(same_indent), ["a@1", "b@2"]);
    assert!(unpublished("unpublished: []\n").is_empty());
}

#[test]
fn happy_path_holds_back_its_unpublished_charts() {
    let yaml = std::fs::read_to_string(project_root().join("scenarios/happy-path/scenario.yaml"))
        .expect("scenario");
    assert!(unpublished(&yaml).contains(&"cert-manager-lite@1.19.3".to_string()));
}

/// On kind the sample's addon charts run the pause image (their real controllers would meet
/// partial CRDs and never turn Healthy); an addon whose chart takes no `image` is left alone,
/// and so is one whose values already choose an image.
#[test]
fn staging_points_the_sample_addons_at_the_pause_image() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    std::fs::create_dir_all(repo.join("targets")).unwrap();
    std::fs::create_dir_all(repo.join("values/cert-manager-lite")).unwrap();
    std::fs::write(
        repo.join("targets/addons.yaml"),
        "- {addon: external-secrets, chart: external-secrets}\n- {addon: cert-manager-lite, chart: cert-manager-lite}\n- {addon: reloader, chart: reloader}\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("values/cert-manager-lite/base.yaml"),
        "image:\n  tag: v1\n",
    )
    .unwrap();
    let changed = pause_workloads(repo, &project_root().join(SAMPLE_CHARTS)).unwrap();
    assert_eq!(changed, ["external-secrets"]);
    let values = std::fs::read_to_string(repo.join("values/external-secrets/base.yaml")).unwrap();
    assert_eq!(values, PAUSE_VALUES);
    let parsed: serde_json::Value = serde_saphyr::from_str(&values).unwrap();
    assert_eq!(parsed["image"]["repository"], "registry.k8s.io/pause");
    assert!(!repo.join("values/reloader").exists());
}

/// kind plays the scenario's own repository: triage's overlay (the team already dropped
/// `immutable`, which v1 lacks) is laid over the sample, else kind would play the structural
/// story; a charts overlay lands in the staged mirror `play` publishes from.
#[test]
fn staging_lays_the_scenario_overlays_over_the_sample() {
    let out = tempfile::tempdir().unwrap();
    let (repo, mirror) =
        lay_out(&project_root(), "triage", &scenario("triage"), out.path()).unwrap();
    let file = |p: &str| std::fs::read_to_string(repo.join(p)).unwrap();
    let overlaid = "platform/secret-stores/database-credentials.yaml";
    assert_eq!(
        file(overlaid),
        rewrite(
            &std::fs::read_to_string(
                project_root()
                    .join("scenarios/triage/repo-overlay")
                    .join(overlaid)
            )
            .unwrap()
        )
    );
    assert!(!file(overlaid).contains("immutable"));
    assert!(file("targets/addons.yaml").contains("gitea-http.gitea.svc.cluster.local"));
    assert!(
        mirror
            .join(SERVED_CHART_REPOSITORY)
            .join("external-secrets/2.10.0/Chart.yaml")
            .is_file()
    );

    let yaml = scenario("mechanical-fix");
    if let Some(overlay) = yaml.pointer("/charts/overlay").and_then(|o| o.as_str()) {
        let out = tempfile::tempdir().unwrap();
        let (_, mirror) = lay_out(&project_root(), "mechanical-fix", &yaml, out.path()).unwrap();
        let source = project_root()
            .join("scenarios/mechanical-fix")
            .join(overlay);
        for entry in walk(&source) {
            let relative = entry.strip_prefix(&source).unwrap();
            assert_eq!(
                std::fs::read(mirror.join(relative)).unwrap(),
                std::fs::read(&entry).unwrap(),
                "{}",
                relative.display()
            );
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
