//! Tests of `inventory`.

use std::collections::BTreeMap;

use crate::render::inventory::{Inventory, expand_api_versions, parse_kube_version};

#[test]
fn an_empty_file_is_no_fleet() {
    for text in ["", "\n", "# nothing here\n"] {
        let err = Inventory::parse(text, "inv.yaml").unwrap_err().to_string();
        assert!(err.contains("holds no document"), "{err}");
    }
}

#[test]
fn a_wrong_inventory_names_the_key_and_line() {
    let err = Inventory::parse("clusters:\n", "inv.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`clusters` (line 1): invalid type: null"),
        "{err}"
    );
    let err = Inventory::parse(
            "defaults:\n  kubeVersion: 1.30.0\nclusters:\n  - name: a\n    server: https://a\n    labels: [x]\n",
            "inv.yaml",
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("`clusters[0].labels` (line 6)"), "{err}");
}

#[test]
fn kube_versions_parse_like_argo_cd() {
    assert_eq!(
        parse_kube_version("v1.30.11+IKS").as_deref(),
        Some("1.30.11")
    );
    assert_eq!(parse_kube_version("1.29").as_deref(), Some("1.29.0"));
    assert_eq!(
        parse_kube_version("v1.33.4-eks-1234").as_deref(),
        Some("1.33.4")
    );
    assert_eq!(parse_kube_version("latest"), None);
}

#[test]
fn api_versions_get_both_forms() {
    let input = vec!["apps/v1/Deployment".to_string(), "v1/Pod".to_string()];
    assert_eq!(
        expand_api_versions(&input),
        vec!["apps/v1", "apps/v1/Deployment", "v1", "v1/Pod"]
    );
}

#[test]
fn secrets_become_clusters_and_in_cluster_stays_implicit() {
    let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Secret
  metadata:
    name: prod
    labels: {argocd.argoproj.io/secret-type: cluster, env: prod}
    annotations: {gitops-gate.io/kube-version: "v1.31.2"}
  data:
    name: cHJvZA==
    server: aHR0cHM6Ly9wcm9kLmV4YW1wbGU=
- apiVersion: v1
  kind: Secret
  metadata: {name: repo, labels: {argocd.argoproj.io/secret-type: repository}}
  stringData: {url: https://x}
"#;
    let inventory = Inventory::parse(text, "inv.yaml").unwrap();
    assert_eq!(inventory.clusters.len(), 1);
    assert_eq!(inventory.clusters[0].name, "prod");
    assert_eq!(inventory.clusters[0].server, "https://prod.example");
    assert_eq!(
        inventory.clusters[0].kube_version.as_deref(),
        Some("1.31.2")
    );
    assert_eq!(
        inventory.implicit_in_cluster().map(|c| c.name),
        Some("in-cluster".to_string())
    );
}

#[test]
fn annotated_cluster_secrets_read_back_as_the_same_clusters() {
    let project = Inventory::parse(
            "defaults:\n  kubeVersion: \"1.33.4\"\n  apiVersions: [v1/Secret]\nclusters:\n  - name: prod\n    server: https://prod\n    labels: {env: prod}\n    apiVersions: [example.io/v1/Widget]\n",
            "inventory.yaml",
        )
        .unwrap();
    let secrets = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": project.cluster_secrets("argocd")});
    let live = Inventory::parse(&secrets.to_string(), "secrets").unwrap();
    type Facts = (
        String,
        String,
        Option<String>,
        Vec<String>,
        BTreeMap<String, String>,
    );
    let facts = |i: &Inventory| -> Vec<Facts> {
        i.clusters
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    c.server.clone(),
                    c.kube_version.clone(),
                    c.api_versions.clone(),
                    c.labels.clone(),
                )
            })
            .collect()
    };
    assert_eq!(facts(&live), facts(&project));
}
