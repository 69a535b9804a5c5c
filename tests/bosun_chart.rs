//! Bosun's Helm chart, rendered with the real helm: the config it writes is one Bosun reads,
//! and its only permission in the cluster is reading Secrets in Argo CD's namespace.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use serde_json::{Value, json};

fn template(args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "--set",
        "config.repositories[0].slug=platform/gitops",
        "--set",
        "config.repositories[0].url=https://github.com/platform/gitops.git",
    ];
    all.extend_from_slice(args);
    common::helm_template("bosun", "bosun", &all)
}

fn objects(args: &[&str]) -> Vec<Value> {
    common::rendered_objects(&template(args))
}

#[test]
fn the_config_is_one_bosun_reads_and_the_rbac_is_read_only_secrets_in_argocd() {
    let rendered = objects(&[]);
    let kinds: Vec<&str> = rendered.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert!(
        !kinds.contains(&"ClusterRole") && !kinds.contains(&"ClusterRoleBinding"),
        "{kinds:?}"
    );
    let role = rendered.iter().find(|o| o["kind"] == "Role").unwrap();
    assert_eq!(role["metadata"]["namespace"], "argocd");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}])
    );
    let binding = rendered
        .iter()
        .find(|o| o["kind"] == "RoleBinding")
        .unwrap();
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": "bosun", "namespace": "bosun"})
    );

    let config_map = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let text = config_map["data"]["bosun.yaml"].as_str().unwrap();
    let config = gitops_loop::bosun::config::Config::parse(text, "bosun.yaml").unwrap();
    assert_eq!(config.forge.token_env, "BOSUN_FORGE_TOKEN");
    assert_eq!(config.webhook.secret_env, "BOSUN_WEBHOOK_SECRET");
    assert_eq!(
        config.workdir.as_deref(),
        Some(std::path::Path::new("/var/lib/bosun"))
    );
    assert!(
        matches!(config.inventory, gitops_loop::bosun::config::InventoryConfig::Kubernetes { ref namespace } if namespace == "argocd")
    );

    let deployment = rendered.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().unwrap();
    let secret_of = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["secretKeyRef"].clone())
            .unwrap()
    };
    assert_eq!(
        secret_of("BOSUN_FORGE_TOKEN"),
        json!({"name": "bosun-forge", "key": "token"})
    );
    assert_eq!(
        secret_of("BOSUN_WEBHOOK_SECRET"),
        json!({"name": "bosun-webhook", "key": "secret"})
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    // With a read-only root, everything Bosun writes has a volume: its work folder and /tmp.
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert!(
        mounts.contains(&"/var/lib/bosun") && mounts.contains(&"/tmp"),
        "{mounts:?}"
    );
}

#[test]
fn two_replicas_and_a_config_that_moves_the_workdir_are_refused() {
    for args in [
        ["--set", "replicaCount=2"],
        ["--set", "config.workdir=/elsewhere"],
    ] {
        let output = template(&args);
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(
            String::from_utf8_lossy(&output.stderr)
                .contains("values don't meet the specifications")
        );
    }
}
