//! Contract tests: real clients (kube-rs, the real kubectl) against the Kubernetes API double.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use ground::kube::{FaultPlan, KubeDouble};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::json;

const TOKEN: &str = "test-token";

async fn double() -> (KubeDouble, kube::Client) {
    gitops_loop::forge::github::install_crypto_provider();
    let double = KubeDouble::start(FaultPlan::none()).await.unwrap();
    double.add_user(TOKEN, "tester", &["system:authenticated"]);
    double.create_namespace("default", &[]).unwrap();
    double
        .create_namespace("kargo-demo", &[("kargo.akuity.io/project", "true")])
        .unwrap();
    let crds = double
        .load_crds(&common::project_root().join("kind/crds"))
        .unwrap();
    assert!(crds >= 7, "the project's CRDs load ({crds})");
    let mut config = kube::Config::new(double.url().parse().unwrap());
    config.default_namespace = "default".into();
    config.auth_info.token = Some(TOKEN.to_string().into());
    let client = kube::Client::try_from(config).unwrap();
    (double, client)
}

fn configmaps(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("", "v1", "ConfigMap"),
        "configmaps",
    );
    Api::namespaced_with(client.clone(), namespace, &resource)
}

fn stages(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kargo.akuity.io", "v1alpha1", "Stage"),
        "stages",
    );
    Api::namespaced_with(client.clone(), "kargo-demo", &resource)
}

fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_rs_crud_selectors_and_conflicts() {
    let (_double, client) = double().await;
    let api = configmaps(&client, "default");
    let created = api
        .create(&PostParams::default(), &object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cm-", "labels": {"app": "web", "tier": "a"}}, "data": {"k": "v"}})))
        .await
        .unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(name.starts_with("cm-") && name.len() == 8, "{name}");
    api.create(&PostParams::default(), &object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "labels": {"app": "db"}}})))
        .await
        .unwrap();
    let listed = api
        .list(&ListParams::default().labels("app in (web,api),tier"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].metadata.name.as_deref(),
        Some(name.as_str())
    );
    let by_field = api
        .list(&ListParams::default().fields("metadata.name=other"))
        .await
        .unwrap();
    assert_eq!(by_field.items.len(), 1);
    // Pagination with limit/continue.
    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let token = page.metadata.continue_.clone().unwrap();
    let rest = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_ne!(rest.items[0].metadata.name, page.items[0].metadata.name);

    let patched = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k2": "v2"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["data"]["k2"], "v2");
    let json_patched = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(
                    json!([{"op": "replace", "path": "/data/k", "value": "v3"}]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(json_patched.data["data"]["k"], "v3");
    let applied = api
        .patch("applied", &PatchParams::apply("tester"), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}})))
        .await
        .unwrap();
    assert_eq!(applied.data["data"]["a"], "1");

    // A stale resourceVersion is a 409 Conflict.
    let mut stale = created.clone();
    stale.data["data"] = json!({"k": "stale"});
    let err = api
        .replace(&name, &PostParams::default(), &stale)
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 409),
        other => panic!("expected a conflict, got {other}"),
    }
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let err = api.get(&name).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404 && s.reason == "NotFound"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_resources_are_validated_and_pruned() {
    let (_double, client) = double().await;
    let api = stages(&client);
    let err = api
        .create(&PostParams::default(), &object(json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "bad"}, "spec": {"requestedFreight": [{"origin": {"kind": "Bucket", "name": "x"}, "sources": {"direct": true}}]}})))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422);
            assert!(
                status.message.contains(
                    "spec.requestedFreight[0].origin.kind: Unsupported value: \"Bucket\""
                ),
                "{}",
                status.message
            );
        }
        other => panic!("expected 422, got {other}"),
    }
    let created = api
        .create(&PostParams::default(), &object(json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "prod"}, "spec": {"notAField": 1, "requestedFreight": [{"origin": {"kind": "Warehouse", "name": "charts"}, "sources": {"direct": true}}]}})))
        .await
        .unwrap();
    assert!(
        created.data["spec"].get("notAField").is_none(),
        "unknown fields are pruned, as the API server does"
    );
    // The status subresource: the main endpoint keeps status, /status changes only status.
    let status = api
        .patch_status(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"freightSummary": "abc"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["status"]["freightSummary"], "abc");
    let replaced = api
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"freightSummary": "ignored"}, "spec": {"shard": "a"}})),
        )
        .await
        .unwrap();
    assert_eq!(replaced.data["status"]["freightSummary"], "abc");
    assert_eq!(replaced.metadata.generation, Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn watcher_sees_changes_and_relists_after_410() {
    let (double, client) = double().await;
    let api = configmaps(&client, "default");
    api.create(
        &PostParams::default(),
        &object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "first"}})),
    )
    .await
    .unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    // Wait for the initial list, then change things, force a 410 and change more.
    while let Some(event) = tokio::time::timeout_at(deadline, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        match event {
            watcher::Event::InitDone => break,
            watcher::Event::InitApply(o) => seen.push(o.metadata.name.unwrap()),
            _ => {}
        }
    }
    assert_eq!(seen, vec!["first"]);
    api.create(
        &PostParams::default(),
        &object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "second"}})),
    )
    .await
    .unwrap();
    let mut names = Vec::new();
    while names.is_empty() {
        if let watcher::Event::Apply(o) = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            names.push(o.metadata.name.unwrap());
        }
    }
    assert_eq!(names, vec!["second"]);
    // Compact the history and cut watches: the watcher's resume point is gone (410), it relists.
    double.store().compact();
    double.faults().set(FaultPlan {
        close_watch: 1000,
        ..FaultPlan::none()
    });
    api.create(
        &PostParams::default(),
        &object(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "third"}})),
    )
    .await
    .unwrap();
    // The fault stays on until the watcher has relisted: cleared earlier, the open watch could
    // still deliver "third" as a plain event and never need to relist.
    let mut relisted = false;
    loop {
        match tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap()
        {
            Ok(Some(watcher::Event::Init)) => relisted = true,
            Ok(Some(watcher::Event::InitApply(o))) | Ok(Some(watcher::Event::Apply(o)))
                if o.metadata.name.as_deref() == Some("third") =>
            {
                break;
            }
            Ok(_) => {}
            Err(_) => relisted = true, // the 410 surfaces as an error before the relist
        }
    }
    double.faults().set(FaultPlan::none());
    assert!(
        relisted,
        "the watcher relisted after its resourceVersion expired"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_a_status_not_a_hang() {
    let (double, _client) = double().await;
    let http = reqwest::Client::new();
    let unknown = http
        .get(format!(
            "{}/apis/example.test/v1/namespaces/default/widgets",
            double.url()
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let body: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(
        (body["kind"].as_str(), body["reason"].as_str()),
        (Some("Status"), Some("NotFound"))
    );
    let malformed = http
        .post(format!(
            "{}/api/v1/namespaces/default/configmaps",
            double.url()
        ))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let unknown_token = http
        .get(format!("{}/api/v1/namespaces", double.url()))
        .bearer_auth("forged")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_token.status(), 401);
}

fn kubectl(kubeconfig: &std::path::Path) -> std::process::Command {
    let mut command =
        std::process::Command::new(common::project_root().join("target/tools/kubectl"));
    command.arg("--kubeconfig").arg(kubeconfig);
    command
}

#[tokio::test(flavor = "multi_thread")]
async fn real_kubectl_gets_applies_and_watches() {
    let (double, _client) = double().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = double
        .write_kubeconfig(&dir.path().join("kubeconfig"), "tester", TOKEN, "default")
        .unwrap();
    let manifest = dir.path().join("cm.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-kubectl\ndata:\n  k: one\n",
    )
    .unwrap();
    let apply = kubectl(&kubeconfig)
        .args(["apply", "--validate=false", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&apply.stdout).trim(),
        "configmap/from-kubectl created"
    );
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-kubectl\ndata:\n  k: two\n",
    )
    .unwrap();
    let again = kubectl(&kubeconfig)
        .args(["apply", "--validate=false", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        "configmap/from-kubectl configured"
    );
    let get = kubectl(&kubeconfig)
        .args([
            "get",
            "configmap",
            "from-kubectl",
            "-o",
            "jsonpath={.data.k}",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&get.stdout),
        "two",
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let crds = kubectl(&kubeconfig)
        .args(["get", "stages.kargo.akuity.io", "-A", "-o", "name"])
        .output()
        .unwrap();
    assert!(
        crds.status.success(),
        "{}",
        String::from_utf8_lossy(&crds.stderr)
    );

    // kubectl get -w: the first line is the existing object, the next one arrives on change.
    use std::io::{BufRead, BufReader};
    let mut watch = kubectl(&kubeconfig)
        .args(["get", "configmaps", "-w", "-o", "name"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = lines_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(first, "configmap/from-kubectl");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: watched\n",
    )
    .unwrap();
    let created = kubectl(&kubeconfig)
        .args(["apply", "--validate=false", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(created.status.success());
    let next = lines_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(next, "configmap/watched");
    let _ = watch.kill();
    let _ = watch.wait();
}
