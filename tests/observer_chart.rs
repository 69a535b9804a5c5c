//! The observer's Helm chart, rendered with the real helm: the RBAC is exactly the seed's.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use serde_json::Value;

fn template(args: &[&str]) -> std::process::Output {
    common::helm_template("kargo-argocd-observer", "kargo-observer", args)
}

fn objects(args: &[&str]) -> Vec<Value> {
    common::rendered_objects(&template(args))
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Option<&'a Value> {
    objects.iter().find(|o| o["kind"] == kind)
}

#[test]
fn cluster_role_grants_exactly_the_seeds_rbac_with_promote_separate() {
    let rendered = objects(&[]);
    let role = find(&rendered, "ClusterRole").unwrap();
    let expected_text = std::fs::read_to_string(
        common::project_root().join("tests/observer-chart/expected-rules.yaml"),
    )
    .unwrap();
    let expected =
        gitops_loop::yaml::parse_document(&expected_text, "expected-rules.yaml").unwrap();
    assert_eq!(role["rules"], expected);
    // Kargo's virtual `promote` verb is its own rule, not folded into `create` on promotions.
    let rules = role["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["resources"] == serde_json::json!(["stages"])
                && r["verbs"] == serde_json::json!(["promote"]))
    );
    let binding = find(&rendered, "ClusterRoleBinding").unwrap();
    assert_eq!(binding["subjects"][0]["name"], "kargo-argocd-observer");
    assert_eq!(binding["subjects"][0]["namespace"], "kargo-observer");
    // Leader election: a Role for Leases in the release namespace.
    let lease_role = find(&rendered, "Role").unwrap();
    assert_eq!(
        lease_role["rules"][0]["resources"],
        serde_json::json!(["leases"])
    );
}

#[test]
fn values_reach_the_flags_and_bad_values_are_refused() {
    let rendered = objects(&[
        "--set",
        "observeMode=opt-in",
        "--set",
        "leaderElection.enabled=false",
    ]);
    let deployment = find(&rendered, "Deployment").unwrap();
    let args: Vec<&str> = deployment
        .pointer("/spec/template/spec/containers/0/args")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--observe-mode=opt-in"), "{args:?}");
    assert!(args.contains(&"--leader-elect=false"), "{args:?}");
    assert!(
        find(&rendered, "Role").is_none(),
        "no Lease permissions without leader election"
    );
    let refused = template(&["--set", "observeMode=sometimes"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("observeMode"));
}

#[test]
fn egress_is_dns_and_the_api_server_only() {
    let rendered = objects(&["--set", "networkPolicy.apiServer.cidrs[0]=192.0.2.10/32"]);
    let policy = find(&rendered, "NetworkPolicy").expect("a NetworkPolicy by default");
    assert_eq!(
        policy["spec"],
        serde_json::json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kargo-argocd-observer",
                                            "app.kubernetes.io/instance": "kargo-argocd-observer"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
                 "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}
            ]
        })
    );
    assert!(
        find(
            &objects(&["--set", "networkPolicy.enabled=false"]),
            "NetworkPolicy"
        )
        .is_none()
    );
}
