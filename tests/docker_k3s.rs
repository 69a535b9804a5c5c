//! The real observer against a real kube-apiserver: k3s in a container (testcontainers' k3s
//! module), with the project's own CRDs (kind/crds) installed there.
//!
//! These need Docker, which the development machines of this project do not have: they run
//! only with `GITOPS_LOOP_DOCKER=1` (`cargo xtask test --docker` sets it). Without it each test
//! says on stderr that it was skipped and why, and `cargo xtask test` prints the same in its
//! summary, so a skip is never silent. What they check:
//!
//! - one drifted Application gives exactly one Promotion, also after further reconciles;
//! - two observer replicas under leader election: one leader, one Promotion;
//! - the observer survives an API server restart and acts on drift after it;
//! - the live inventory reads real cluster Secrets as it reads the exported file.
//!
//! Waits are conditions polled against a deadline, never fixed sleeps.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gitops_loop::render::inventory::Inventory;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, ImageExt};
use testcontainers_modules::k3s::{K3s, KUBE_SECURE_PORT};

const PROJECT: &str = "kargo-demo";
const REPO: &str = "ghcr.io/example/web";

/// True when Docker tests are asked for; otherwise says which test is skipped and why.
fn docker(test: &str) -> bool {
    if std::env::var("GITOPS_LOOP_DOCKER").as_deref() == Ok("1") {
        return true;
    }
    eprintln!(
        "skipped {test}: needs Docker; run with GITOPS_LOOP_DOCKER=1 (cargo xtask test --docker)"
    );
    false
}

struct Cluster {
    container: ContainerAsync<K3s>,
    client: Client,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// k3s with a fixed host port for its API server (so a restart keeps the address), the
/// kubeconfig pointed at it, and the project's CRDs installed and established.
async fn cluster() -> Cluster {
    gitops_loop::forge::github::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let container = K3s::default()
        .with_conf_mount(dir.path())
        .with_privileged(true)
        .with_userns_mode("host")
        .with_mapped_port(port, KUBE_SECURE_PORT)
        .start()
        .await
        .unwrap();
    let yaml = container.image().read_kube_config().unwrap();
    let mut config = Kubeconfig::from_yaml(&yaml).unwrap();
    for cluster in &mut config.clusters {
        if let Some(server) = cluster.cluster.as_mut().and_then(|c| c.server.as_mut()) {
            *server = format!("https://127.0.0.1:{port}");
        }
    }
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    std::fs::write(&kubeconfig, serde_json::to_string(&config).unwrap()).unwrap();
    let client = Client::try_from(
        kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .unwrap(),
    )
    .unwrap();
    install_crds(&client).await;
    Cluster {
        container,
        client,
        kubeconfig,
        _dir: dir,
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

async fn install_crds(client: &Client) {
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    let mut names = Vec::new();
    for entry in std::fs::read_dir(common::project_root().join("kind/crds")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let value: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        names.push(value["metadata"]["name"].as_str().unwrap().to_string());
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(value).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: the real API server refuses it: {e}", path.display()));
    }
    for name in names {
        wait_for(
            &format!("CRD {name} established"),
            Duration::from_secs(60),
            || {
                let crds = crds.clone();
                let name = name.clone();
                async move {
                    crds.get(&name).await.ok().is_some_and(|crd| {
                        crd.data["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    })
                }
            },
        )
        .await;
    }
}

/// Polls `condition` until it holds, failing the test at `limit` with what it waited for.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(
            start.elapsed() < limit,
            "still waiting after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn api(
    client: &Client,
    group: &str,
    kind: &str,
    plural: &str,
    namespace: &str,
) -> Api<DynamicObject> {
    let version = if group.is_empty() { "v1" } else { "v1alpha1" };
    Api::namespaced_with(
        client.clone(),
        namespace,
        &resource(group, version, kind, plural),
    )
}

/// A Project namespace with a Warehouse, two Freight (v1, v2), a Stage whose current Freight is
/// v1, and the Application `stage` authorizes, running `running`.
async fn drift(client: &Client, stage: &str, running: &str) {
    let namespaces: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("", "v1", "Namespace", "namespaces"),
    );
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": PROJECT, "labels": {"kargo.akuity.io/project": "true"}}}))
            .unwrap(),
        )
        .await;
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "argocd"}}),
            )
            .unwrap(),
        )
        .await;
    let create = |api: Api<DynamicObject>, value: Value| async move {
        api.create(
            &PostParams::default(),
            &serde_json::from_value(value).unwrap(),
        )
        .await
        .unwrap()
    };
    let k = "kargo.akuity.io";
    let _ = api(client, k, "Warehouse", "warehouses", PROJECT)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Warehouse",
                "metadata": {"name": "web"}, "spec": {"subscriptions": [{"image": {"repoURL": REPO}}]}}))
            .unwrap(),
        )
        .await;
    for (name, tag) in [("f-v1", "v1.0.0"), ("f-v2", "v2.0.0")] {
        let _ = api(client, k, "Freight", "freights", PROJECT)
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight",
                    "metadata": {"name": name}, "origin": {"kind": "Warehouse", "name": "web"},
                    "images": [{"repoURL": REPO, "tag": tag}]}),
                )
                .unwrap(),
            )
            .await;
    }
    let stages = api(client, k, "Stage", "stages", PROJECT);
    create(
        stages.clone(),
        json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": stage},
            "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "web"}, "sources": {"direct": true}}],
                     "promotionTemplate": {"spec": {"steps": [{"uses": "argocd-update", "config": {"apps": [{"name": stage}]}}]}}}}),
    )
    .await;
    stages
        .patch_status(
            stage,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"freightHistory": [{"items": {"Warehouse/web":
                {"name": "f-v1", "origin": {"kind": "Warehouse", "name": "web"}, "images": [{"repoURL": REPO, "tag": "v1.0.0"}]}}}]}})),
        )
        .await
        .unwrap();
    // Argo CD's Application CRD has no status subresource: status is written with the object.
    create(
        api(client, "argoproj.io", "Application", "applications", "argocd"),
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": stage, "annotations": {"kargo.akuity.io/authorized-stage": format!("{PROJECT}:{stage}")}},
            "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc", "namespace": "web"},
                     "source": {"repoURL": "https://git.example.test/platform/gitops.git", "path": "web"}},
            "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"},
                       "summary": {"images": [format!("{REPO}:{running}")]}}}),
    )
    .await;
}

struct Observer {
    child: std::process::Child,
    metrics: String,
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn observer(kubeconfig: &Path, pod: &str, extra: &[&str]) -> Observer {
    let port = || format!("127.0.0.1:{}", free_port());
    let (metrics, health) = (port(), port());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_observer"))
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", pod)
        .env("POD_NAMESPACE", "kargo-observer")
        .args([
            "--metrics-addr",
            &metrics,
            "--health-addr",
            &health,
            "--log-format",
            "text",
            "--resync",
            "2s",
            "--lease-namespace",
            "argocd",
        ])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    Observer { child, metrics }
}

/// The sum of a metric's samples on the observer's /metrics (0 when it does not answer yet).
async fn metric(observer: &Observer, name: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("http://{}/metrics", observer.metrics)).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn promotions(client: &Client, stage: &str) -> usize {
    api(
        client,
        "kargo.akuity.io",
        "Promotion",
        "promotions",
        PROJECT,
    )
    .list(&ListParams::default())
    .await
    .map(|l| {
        l.items
            .iter()
            .filter(|p| p.data["spec"]["stage"] == stage)
            .count()
    })
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_gives_exactly_one_promotion_on_a_real_api_server() {
    if !docker("drift_gives_exactly_one_promotion_on_a_real_api_server") {
        return;
    }
    let cluster = cluster().await;
    drift(&cluster.client, "web", "v2.0.0").await;
    let observer = observer(&cluster.kubeconfig, "observer-0", &[]);
    wait_for(
        "a Promotion for the drift",
        Duration::from_secs(90),
        || async { promotions(&cluster.client, "web").await >= 1 },
    )
    .await;
    let seen = metric(&observer, "kargo_observer_reconciles_total").await;
    wait_for("three more reconciles", Duration::from_secs(60), || async {
        metric(&observer, "kargo_observer_reconciles_total").await >= seen + 3.0
    })
    .await;
    assert_eq!(promotions(&cluster.client, "web").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_elect_one_leader_and_promote_once() {
    if !docker("two_replicas_elect_one_leader_and_promote_once") {
        return;
    }
    let cluster = cluster().await;
    drift(&cluster.client, "web", "v2.0.0").await;
    let a = observer(&cluster.kubeconfig, "observer-a", &["--leader-elect"]);
    let b = observer(&cluster.kubeconfig, "observer-b", &["--leader-elect"]);
    let leases: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        "argocd",
        &resource("coordination.k8s.io", "v1", "Lease", "leases"),
    );
    wait_for(
        "a Lease held by one replica",
        Duration::from_secs(60),
        || async {
            leases
                .get("kargo-argocd-observer")
                .await
                .ok()
                .is_some_and(|lease| {
                    matches!(
                        lease.data["spec"]["holderIdentity"].as_str(),
                        Some("observer-a" | "observer-b")
                    )
                })
        },
    )
    .await;
    wait_for(
        "a Promotion for the drift",
        Duration::from_secs(90),
        || async { promotions(&cluster.client, "web").await >= 1 },
    )
    .await;
    let created = || async {
        metric(&a, "kargo_observer_promotions_created_total").await
            + metric(&b, "kargo_observer_promotions_created_total").await
    };
    wait_for(
        "the creating replica's counter",
        Duration::from_secs(30),
        || async { created().await >= 1.0 },
    )
    .await;
    // Let both replicas reconcile again before counting: a late duplicate would show now.
    let seen = metric(&a, "kargo_observer_reconciles_total").await
        + metric(&b, "kargo_observer_reconciles_total").await;
    wait_for("three more reconciles", Duration::from_secs(60), || async {
        metric(&a, "kargo_observer_reconciles_total").await
            + metric(&b, "kargo_observer_reconciles_total").await
            >= seen + 3.0
    })
    .await;
    assert_eq!(created().await, 1.0, "one replica created one Promotion");
    assert_eq!(promotions(&cluster.client, "web").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_observer_survives_an_api_server_restart() {
    if !docker("the_observer_survives_an_api_server_restart") {
        return;
    }
    let cluster = cluster().await;
    let observer = observer(&cluster.kubeconfig, "observer-0", &[]);
    drift(&cluster.client, "before", "v2.0.0").await;
    wait_for(
        "a Promotion before the restart",
        Duration::from_secs(90),
        || async { promotions(&cluster.client, "before").await >= 1 },
    )
    .await;
    cluster.container.stop().await.unwrap();
    cluster.container.start().await.unwrap();
    wait_for(
        "the API server answers again",
        Duration::from_secs(120),
        || async { cluster.client.apiserver_version().await.is_ok() },
    )
    .await;
    drift(&cluster.client, "after", "v2.0.0").await;
    wait_for(
        "a Promotion after the restart",
        Duration::from_secs(120),
        || async { promotions(&cluster.client, "after").await >= 1 },
    )
    .await;
    assert_eq!(promotions(&cluster.client, "before").await, 1);
    assert!(metric(&observer, "kargo_observer_reconciles_total").await > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_inventory_reads_real_cluster_secrets_as_the_file() {
    if !docker("the_live_inventory_reads_real_cluster_secrets_as_the_file") {
        return;
    }
    let cluster = cluster().await;
    let path = common::sample_dir().join("inventory.yaml");
    let file =
        Inventory::parse(&std::fs::read_to_string(&path).unwrap(), "inventory.yaml").unwrap();
    drift(&cluster.client, "web", "v1.0.0").await; // creates the argocd namespace
    let secrets: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        "argocd",
        &resource("", "v1", "Secret", "secrets"),
    );
    for secret in file.cluster_secrets("argocd") {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(secret).unwrap(),
            )
            .await
            .unwrap();
    }
    let live = Inventory::read_cluster_secrets(cluster.client.clone(), "argocd")
        .await
        .unwrap();
    let key = |i: &Inventory| {
        let mut clusters: Vec<_> = i
            .clusters
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    c.server.clone(),
                    c.labels.clone(),
                    c.kube_version.clone(),
                    c.api_versions.clone(),
                )
            })
            .collect();
        clusters.sort();
        clusters
    };
    assert_eq!(key(&live), key(&file));
}
