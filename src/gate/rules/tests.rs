use super::served::serves_kind;
use super::*;

use crate::render::{ClusterRef, Origin, RenderStats};
use serde_json::json;

fn crd(served: &[&str]) -> Value {
    let versions: Vec<Value> = ["v1beta1", "v1"]
        .iter()
        .map(|v| json!({"name": v, "served": served.contains(v), "storage": *v == "v1"}))
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "externalsecrets.external-secrets.io"},
        "spec": {"group": "external-secrets.io", "names": {"kind": "ExternalSecret", "plural": "externalsecrets"}, "versions": versions}})
}

/// One cluster runs the CRD (from a registry chart) and this repository's own chart, which
/// renders an ExternalSecret at v1beta1.
fn rendering(served: &[&str]) -> Rendering {
    let app = |name: &str, source: Value, objects: Vec<Value>| RenderedApplication {
        name: name.into(),
        namespace: "argocd".into(),
        project: "default".into(),
        origin: Origin::File {
            path: "apps.yaml".into(),
            document: 0,
        },
        cluster: ClusterRef {
            name: "prod".into(),
            server: "https://prod".into(),
        },
        destination_namespace: "web".into(),
        sources: vec![source],
        objects: objects.into_iter().map(std::sync::Arc::new).collect(),
        render_keys: vec![],
        manifest: Value::Null,
        stored: Value::Null,
        destination_unknown: None,
        values_files: Vec::new(),
    };
    let secret = json!({"apiVersion": "external-secrets.io/v1beta1", "kind": "ExternalSecret",
        "metadata": {"name": "web-tls", "namespace": "web"}});
    Rendering {
        revision: "r".into(),
        applications: vec![
            app(
                "external-secrets",
                json!({"repoURL": "https://charts", "chart": "external-secrets"}),
                vec![crd(served)],
            ),
            app(
                "web",
                json!({"repoURL": "https://git", "path": "charts/web"}),
                vec![secret],
            ),
        ],
        diagnostics: Vec::new(),
        stats: RenderStats::default(),
    }
}

fn evaluate_with_template(template: &str) -> Vec<Finding> {
    let files = [
        ("charts/web/Chart.yaml", "name: web\nversion: 1.0.0\n"),
        ("charts/web/templates/tls.yaml", template),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
    .collect();
    let snapshot = Snapshot::from_files("r", files);
    evaluate(
        &rendering(&["v1beta1", "v1"]),
        &rendering(&["v1"]),
        &RenderDiff::default(),
        &snapshot,
        None,
        &Inventory::default(),
    )
}

#[test]
fn a_repository_chart_template_is_a_consumer_with_its_path() {
    let findings = evaluate_with_template(
        "{{- if .Values.tls }}\napiVersion: external-secrets.io/v1beta1\nkind: ExternalSecret\nmetadata:\n  name: {{ .Release.Name }}-tls\n{{- end }}\n",
    );
    let rules: Vec<&str> = findings.iter().map(|f| f.rule.as_str()).collect();
    assert_eq!(rules, [DROPPED_SERVED_VERSION]);
    let consumers = &findings[0].evidence["consumers"];
    assert_eq!(consumers[0]["path"], "charts/web/templates/tls.yaml");
    assert_eq!(consumers[0]["template"], true);
}

#[test]
fn a_computed_api_version_in_a_repository_chart_names_the_chart() {
    let findings = evaluate_with_template(
        "apiVersion: {{ .Values.apiVersion }}\nkind: ExternalSecret\nmetadata:\n  name: x\n",
    );
    let unserved: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.rule == REPOSITORY_CHART_RENDERS_UNSERVED_VERSION)
        .collect();
    assert_eq!(unserved.len(), 1);
    assert_eq!(unserved[0].evidence["localChart"], "charts/web");
    assert!(
        unserved[0]
            .summary
            .contains("this repository's chart charts/web")
    );
    assert!(!unserved[0].summary.contains("no values to change"));
}

#[test]
fn major_boundaries() {
    assert!(crosses_major("0.10.3", "2.10.0"));
    assert!(crosses_major("0.10.3", "0.11.0"));
    assert!(!crosses_major("1.19.2", "1.19.3"));
    assert!(!crosses_major("3.4.0", "3.5.0"));
    assert!(crosses_major("v3.4.0", "4.0.0"));
}

#[test]
fn an_inventory_serves_a_kind_by_its_kind_entry_or_a_bare_group_version() {
    let list = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let kinds = list(&[
        "monitoring.coreos.com/v1",
        "monitoring.coreos.com/v1/ServiceMonitor",
    ]);
    assert!(serves_kind(
        &kinds,
        "monitoring.coreos.com",
        "ServiceMonitor"
    ));
    assert!(!serves_kind(&kinds, "monitoring.coreos.com", "Probe"));
    let versions = list(&["monitoring.coreos.com/v1"]);
    assert!(serves_kind(&versions, "monitoring.coreos.com", "Probe"));
    assert!(!serves_kind(
        &versions,
        "grafana.integreatly.org",
        "GrafanaDashboard"
    ));
}
