//! charts/kargo-pipelines against the process cluster (real/): every object the chart renders
//! for its example values is applied to upstream kube-apiserver v1.34 serving the upstream
//! Kargo v1.11.2 CRDs, with strict field validation, so the real schemas, defaults and CEL
//! rules judge them (the ground's CRDs and the gate's schema engine are not the judge here).
//! Kargo's own programs cannot be built from the Go module proxy (real/README.md), so its
//! admission webhooks are not in the loop; Argo Rollouts' AnalysisTemplate has no CRD there
//! and is named as unchecked.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::core::params::ValidationDirective;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn the_pipelines_chart_is_accepted_by_the_real_kargo_crds() {
    let Some(real) = common::real::real("the_pipelines_chart_is_accepted_by_the_real_kargo_crds")
    else {
        return;
    };
    let client = real.client().await;
    let namespace = format!("platform-addons-{}", std::process::id());
    let namespaces: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "Namespace"),
            "namespaces",
        ),
    );
    namespaces
        .patch(
            &namespace,
            &PatchParams::apply("real-pipelines-test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {"kargo.akuity.io/project": "true"}}})),
        )
        .await
        .unwrap();
    let example = common::project_root().join("charts/kargo-pipelines/examples/addons.yaml");
    let rendered = common::rendered_objects(&common::helm_template(
        "kargo-pipelines",
        &namespace,
        &["-f", example.to_str().unwrap()],
    ));
    let mut applied = Vec::new();
    let mut unchecked = Vec::new();
    for object in &rendered {
        let (group, version) = object["apiVersion"]
            .as_str()
            .unwrap()
            .split_once('/')
            .unwrap();
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        if group != "kargo.akuity.io" {
            unchecked.push(format!("{group}/{kind}"));
            continue;
        }
        let plural = format!("{}s", kind.to_lowercase());
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            &plural,
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        let mut object: Value = object.clone();
        object["metadata"]["namespace"] = json!(namespace);
        let params = PatchParams {
            field_validation: Some(ValidationDirective::Strict),
            ..PatchParams::apply("real-pipelines-test")
        };
        api.patch(name, &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("the real API server refuses {kind} {name}: {e}"));
        applied.push(format!("{kind}/{name}"));
    }
    assert!(
        applied.iter().filter(|a| a.starts_with("Stage/")).count() >= 2,
        "{applied:?}"
    );
    assert!(
        applied.iter().any(|a| a.starts_with("Warehouse/")),
        "{applied:?}"
    );
    unchecked.sort();
    unchecked.dedup();
    assert_eq!(
        unchecked,
        ["argoproj.io/AnalysisTemplate"],
        "only Argo Rollouts' kind goes unchecked"
    );
}
