//! Tests of the kind path: the plans' dry-run snapshots, their secrets, quoting and staging.

use std::collections::HashMap;
use std::path::Path;

use super::run::{dry_run_text, fill, quote};
use super::scenario::KargoSource;
use super::stage::{rewrite, unpublished};
use super::*;

fn happy() -> KargoSource {
    KargoSource::Pipelines("pipelines.yaml".into())
}

/// The real scenario files, read from this checkout.
fn scenario(name: &str) -> serde_json::Value {
    read_scenario(&project_root(), name).expect("scenario")
}

#[test]
fn plan_up_triage_dry_run() {
    let source = kargo_source(&scenario("triage"), "triage").unwrap();
    assert_eq!(source, KargoSource::Pipelines("pipelines.yaml".into()));
    let text = dry_run_text(&plan_up(Path::new("/work/gitops-loop"), "triage", &source));
    insta::assert_snapshot!(text);
}

#[test]
fn plan_play_triage_dry_run() {
    let steps = plan_play(
        Path::new("/work/gitops-loop"),
        "triage",
        &scenario("triage"),
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
        let steps = plan_play(Path::new("/r"), &name, &yaml).unwrap();
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
            plan_play(Path::new("/r"), "s", &yaml(bad.clone())).is_err(),
            "{bad}"
        );
    }
    let slug = serde_json::json!({"repository": {"slug": "a/b/../c"}, "timeline": []});
    assert!(plan_play(Path::new("/r"), "s", &slug).is_err());
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
    ));
    insta::assert_snapshot!(text);
}

#[test]
fn plan_does_not_depend_on_the_root() {
    let here = plan_up(Path::new("/work/gitops-loop"), "happy-path", &happy());
    let there = plan_up(
        Path::new("/home/someone/src/gitops-loop"),
        "happy-path",
        &happy(),
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
fn plan_down_deletes_the_cluster() {
    assert_eq!(
        dry_run_text(&plan_down()),
        "# delete the cluster and everything in it\nkind delete cluster --name gitops-loop\n"
    );
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
    let steps = plan_up(Path::new("/r"), "happy-path", &happy());
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
