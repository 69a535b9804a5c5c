//! The real observer against the process cluster (real/): upstream etcd and kube-apiserver
//! built from the pinned Go modules, the upstream Kargo v1.11.2 and Argo CD v3.5.1 CRDs (so
//! every object here, and the Promotion the observer writes, passes the real schemas and CEL
//! rules), no Docker. `cargo xtask test` runs them whenever Go is present; without it each
//! says on stderr that it was skipped. What they check:
//!
//! - one drifted Application gives exactly one Promotion, also after further reconciles;
//! - two observer replicas under leader election: one leader, one Promotion;
//! - the observer survives an API server restart and acts on drift after it;
//! - the live inventory reads real cluster Secrets as it reads the exported file;
//! - the observer chart's RBAC, applied as the chart renders it, is enough for the observer
//!   run with its ServiceAccount's token, and every verb it grants is one the observer used
//!   (read from the API server's audit log) or, for `promote`, one the real authorizer grants
//!   for Kargo's admission check.
//!
//! The tests share one cluster: each works in namespaces of its own, and the restart test
//! holds the cluster alone while the API server is down. Waits are conditions polled against a
//! deadline, never fixed sleeps.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::real::{Real, real, wait_for, wait_for_explained};
use gitops_loop::render::inventory::Inventory;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

const REPO: &str = "ghcr.io/example/web";

/// Tests hold it shared; the restart test holds it alone while the API server is down.
static APISERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
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

/// The namespaces one test works in: a Kargo Project and an Argo CD namespace.
#[derive(Clone)]
struct Names {
    project: String,
    argocd: String,
}

impl Names {
    /// Unique to this run too: the cluster outlives a `cargo test` run (a second run on the
    /// same cluster must not find the first one's Promotions).
    fn new(tag: &str) -> Self {
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1_000_000_000;
        let run = format!("{}-{run}", std::process::id());
        Names {
            project: format!("kargo-{tag}-{run}"),
            argocd: format!("argocd-{tag}-{run}"),
        }
    }
}

async fn create(api: &Api<DynamicObject>, value: Value) {
    match api
        .create(
            &PostParams::default(),
            &serde_json::from_value(value.clone()).unwrap(),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("the real API server refuses {value}: {e}"),
    }
}

async fn namespaces(client: &Client, names: &Names) {
    let namespaces: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("", "v1", "Namespace", "namespaces"),
    );
    create(
        &namespaces,
        json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": names.project, "labels": {"kargo.akuity.io/project": "true"}}}),
    )
    .await;
    create(
        &namespaces,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": names.argocd}}),
    )
    .await;
}

/// A Warehouse, two Freight (v1, v2), a Stage whose current Freight is v1, and the Application
/// `stage` authorizes, running `running`.
async fn drift(client: &Client, names: &Names, stage: &str, running: &str) {
    namespaces(client, names).await;
    let k = "kargo.akuity.io";
    let project = &names.project;
    create(
        &api(client, k, "Warehouse", "warehouses", project),
        json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Warehouse",
            "metadata": {"name": "web"}, "spec": {"subscriptions": [{"image": {"repoURL": REPO}}]}}),
    )
    .await;
    for (name, tag) in [("f-v1", "v1.0.0"), ("f-v2", "v2.0.0")] {
        create(
            &api(client, k, "Freight", "freights", project),
            json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight",
                "metadata": {"name": name}, "origin": {"kind": "Warehouse", "name": "web"},
                "images": [{"repoURL": REPO, "tag": tag}]}),
        )
        .await;
    }
    create_stage(client, names, stage).await;
    // Argo CD's Application CRD has no status subresource: status is written with the object.
    create(
        &api(client, "argoproj.io", "Application", "applications", &names.argocd),
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": stage, "annotations": {"kargo.akuity.io/authorized-stage": format!("{project}:{stage}")}},
            "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc", "namespace": "web"},
                     "source": {"repoURL": "https://git.example.test/platform/gitops.git", "path": "web"}},
            "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"},
                       "summary": {"images": [format!("{REPO}:{running}")]}}}),
    )
    .await;
}

/// A Stage of the Warehouse `web` whose current Freight is v1, with one promotion step.
async fn create_stage(client: &Client, names: &Names, stage: &str) {
    let stages = api(client, "kargo.akuity.io", "Stage", "stages", &names.project);
    create(
        &stages,
        json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": stage},
            "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "web"}, "sources": {"direct": true}}],
                     "promotionTemplate": {"spec": {"steps": [{"uses": "argocd-update", "config": {"apps": [{"name": stage}]}}]}}}}),
    )
    .await;
    stages
        .patch_status(
            stage,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"freightHistory": [{"id": "web-f-v1", "items": {"Warehouse/web":
                {"name": "f-v1", "origin": {"kind": "Warehouse", "name": "web"}, "images": [{"repoURL": REPO, "tag": "v1.0.0"}]}}}]}})),
        )
        .await
        .unwrap();
}

struct Observer {
    child: std::process::Child,
    metrics: String,
    log: PathBuf,
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Observer {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn observer(kubeconfig: &Path, names: &Names, pod: &str, extra: &[&str]) -> Observer {
    let port = || format!("127.0.0.1:{}", free_port());
    let (metrics, health) = (port(), port());
    let log = std::env::temp_dir().join(format!(
        "real-observer-{}-{pod}-{}.log",
        names.argocd,
        std::process::id()
    ));
    let out = std::fs::File::create(&log).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_observer"))
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", pod)
        .env("POD_NAMESPACE", &names.argocd)
        .args([
            "--metrics-addr",
            &metrics,
            "--health-addr",
            &health,
            "--log-format",
            "text",
            "--resync",
            "2s",
            "--namespace",
            &names.argocd,
            "--lease-namespace",
            &names.argocd,
        ])
        .args(extra)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Observer {
        child,
        metrics,
        log,
    }
}

/// The sum of a metric's samples on the observer's /metrics (0 when it does not answer yet).
async fn metric(observer: &Observer, name: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("http://{}/metrics", observer.metrics)).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn promotions(client: &Client, names: &Names, stage: &str) -> usize {
    api(
        client,
        "kargo.akuity.io",
        "Promotion",
        "promotions",
        &names.project,
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

/// Waits for a Promotion, failing with the observer's and the API server's logs.
async fn wait_promotion(real: &Real, client: &Client, names: &Names, stage: &str, o: &[&Observer]) {
    wait_for_explained(
        &format!("a Promotion for {stage}"),
        Duration::from_secs(90),
        || async { promotions(client, names, stage).await >= 1 },
        || {
            format!(
                "observer:\n{}\nkube-apiserver:\n{}",
                o.iter()
                    .map(|o| o.log())
                    .collect::<Vec<_>>()
                    .join("\n---\n"),
                real.log_tail("kube-apiserver")
            )
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_gives_exactly_one_promotion_on_a_real_api_server() {
    let Some(real) = real("drift_gives_exactly_one_promotion_on_a_real_api_server") else {
        return;
    };
    let _shared = APISERVER.read().await;
    let client = real.client().await;
    let names = Names::new("one");
    drift(&client, &names, "web", "v2.0.0").await;
    let observer = observer(&real.kubeconfig(), &names, "observer-0", &[]);
    wait_promotion(&real, &client, &names, "web", &[&observer]).await;
    let seen = metric(&observer, "kargo_observer_reconciles_total").await;
    wait_for("three more reconciles", Duration::from_secs(60), || async {
        metric(&observer, "kargo_observer_reconciles_total").await >= seen + 3.0
    })
    .await;
    assert_eq!(promotions(&client, &names, "web").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_elect_one_leader_and_promote_once() {
    let Some(real) = real("two_replicas_elect_one_leader_and_promote_once") else {
        return;
    };
    let _shared = APISERVER.read().await;
    let client = real.client().await;
    let names = Names::new("leader");
    drift(&client, &names, "web", "v2.0.0").await;
    let a = observer(
        &real.kubeconfig(),
        &names,
        "observer-a",
        &["--leader-elect"],
    );
    let b = observer(
        &real.kubeconfig(),
        &names,
        "observer-b",
        &["--leader-elect"],
    );
    let leases: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &names.argocd,
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
    wait_promotion(&real, &client, &names, "web", &[&a, &b]).await;
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
    assert_eq!(promotions(&client, &names, "web").await, 1);
    // The replica that does not hold the Lease never reconciled at all (the live re-check
    // before a create would hide a second actor from the Promotion count alone).
    let holder = leases.get("kargo-argocd-observer").await.unwrap().data["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_string();
    let standby = if holder == "observer-a" { &b } else { &a };
    assert_eq!(
        metric(standby, "kargo_observer_reconciles_total").await,
        0.0,
        "the replica standing by reconciled"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_observer_survives_an_api_server_restart() {
    let Some(real) = real("the_observer_survives_an_api_server_restart") else {
        return;
    };
    // Alone on the cluster: the other tests would see the API server go away.
    let _alone = APISERVER.write().await;
    let client = real.client().await;
    let names = Names::new("restart");
    let observer = observer(&real.kubeconfig(), &names, "observer-0", &[]);
    drift(&client, &names, "before", "v2.0.0").await;
    wait_promotion(&real, &client, &names, "before", &[&observer]).await;
    let layout = real.layout.clone();
    tokio::task::spawn_blocking(move || real_cluster::restart(&layout, "kube-apiserver"))
        .await
        .unwrap()
        .unwrap();
    wait_for(
        "the API server answers again",
        Duration::from_secs(120),
        || async { client.apiserver_version().await.is_ok() },
    )
    .await;
    drift(&client, &names, "after", "v2.0.0").await;
    wait_promotion(&real, &client, &names, "after", &[&observer]).await;
    assert_eq!(promotions(&client, &names, "before").await, 1);
    assert!(metric(&observer, "kargo_observer_reconciles_total").await > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_inventory_reads_real_cluster_secrets_as_the_file() {
    let Some(real) = real("the_live_inventory_reads_real_cluster_secrets_as_the_file") else {
        return;
    };
    let _shared = APISERVER.read().await;
    let client = real.client().await;
    let names = Names::new("inventory");
    namespaces(&client, &names).await;
    let path = common::sample_dir().join("inventory.yaml");
    let file =
        Inventory::parse(&std::fs::read_to_string(&path).unwrap(), "inventory.yaml").unwrap();
    let secrets = api(&client, "", "Secret", "secrets", &names.argocd);
    for secret in file.cluster_secrets(&names.argocd) {
        create(&secrets, secret).await;
    }
    let live = Inventory::read_cluster_secrets(client.clone(), &names.argocd)
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

/// (group, resource, verb) for every verb a rendered Role or ClusterRole grants.
fn granted(objects: &[Value]) -> BTreeSet<(String, String, String)> {
    let mut grants = BTreeSet::new();
    for object in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for rule in object["rules"].as_array().into_iter().flatten() {
            for group in rule["apiGroups"].as_array().into_iter().flatten() {
                for resource in rule["resources"].as_array().into_iter().flatten() {
                    for verb in rule["verbs"].as_array().into_iter().flatten() {
                        grants.insert((
                            group.as_str().unwrap().to_string(),
                            resource.as_str().unwrap().to_string(),
                            verb.as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
        }
    }
    grants
}

/// Applies what the chart rendered (its RBAC and ServiceAccount) with server-side apply.
async fn apply_rendered(client: &Client, objects: &[Value], namespace: &str) {
    for object in objects {
        let kind = object["kind"].as_str().unwrap();
        let (group, version, plural, namespaced) = match kind {
            "ServiceAccount" => ("", "v1", "serviceaccounts", true),
            "ClusterRole" => ("rbac.authorization.k8s.io", "v1", "clusterroles", false),
            "ClusterRoleBinding" => (
                "rbac.authorization.k8s.io",
                "v1",
                "clusterrolebindings",
                false,
            ),
            "Role" => ("rbac.authorization.k8s.io", "v1", "roles", true),
            "RoleBinding" => ("rbac.authorization.k8s.io", "v1", "rolebindings", true),
            _ => continue,
        };
        let ar = resource(group, version, kind, plural);
        let api: Api<DynamicObject> = if namespaced {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(namespace);
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let name = object["metadata"]["name"].as_str().unwrap();
        api.patch(
            name,
            &PatchParams::apply("real-observer-test").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("the real API server refuses the chart's {kind} {name}: {e}"));
    }
}

/// A kubeconfig that authenticates with a token of the ServiceAccount (TokenRequest API).
async fn service_account_kubeconfig(
    real: &Real,
    client: &Client,
    namespace: &str,
    name: &str,
) -> PathBuf {
    let accounts = api(client, "", "ServiceAccount", "serviceaccounts", namespace);
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}});
    let answer: Value = accounts
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .map(|o: DynamicObject| serde_json::to_value(o).unwrap())
        .unwrap();
    let token = answer["status"]["token"].as_str().unwrap();
    let ca = real.layout.pki().join("ca.crt");
    let path = real
        .layout
        .root
        .join(format!("{namespace}-{name}.kubeconfig"));
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // It holds a bearer token: readable by this user only.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    file.write_all(
        json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "real", "cluster": {"server": real.state.server, "certificate-authority": ca}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": name}}],
            "current-context": "real"})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    path
}

/// What the real authorizer answers for `user` doing `verb` on `group/resource` in `namespace`.
async fn allowed(
    client: &Client,
    user: &str,
    verb: &str,
    group: &str,
    resource_name: &str,
    namespace: &str,
) -> bool {
    let reviews: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            "subjectaccessreviews",
        ),
    );
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource_name, "namespace": namespace}}});
    let answer = reviews
        .create(
            &PostParams::default(),
            &serde_json::from_value(review).unwrap(),
        )
        .await
        .unwrap();
    answer.data["status"]["allowed"] == true
}

#[tokio::test(flavor = "multi_thread")]
async fn the_observer_chart_grants_exactly_what_the_observer_uses() {
    let Some(real) = real("the_observer_chart_grants_exactly_what_the_observer_uses") else {
        return;
    };
    let _shared = APISERVER.read().await;
    let client = real.client().await;
    let names = Names::new("rbac");
    namespaces(&client, &names).await;
    // The chart as a user installs it, leader election on, its Lease in the release namespace.
    let rendered = common::rendered_objects(&common::helm_template(
        "kargo-argocd-observer",
        &names.argocd,
        &["--set", "leaderElection.enabled=true"],
    ));
    apply_rendered(&client, &rendered, &names.argocd).await;
    let account = rendered
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("the chart renders a ServiceAccount")
        .to_string();
    let user = format!("system:serviceaccount:{}:{account}", names.argocd);
    let kubeconfig = service_account_kubeconfig(&real, &client, &names.argocd, &account).await;

    // The observer under that token: a drift it promotes, and a drift it cannot match (no
    // Freight for the tag: a FreightMissing Event, recorded again on later reconciles).
    drift(&client, &names, "web", "v2.0.0").await;
    drift(&client, &names, "lost", "v9.9.9").await;
    // And a Stage with no promotion steps: no Promotion, a StageHasNoSteps Event on every
    // reconcile, which the recorder turns into a patch of the Event's series.
    drift(&client, &names, "nosteps", "v2.0.0").await;
    api(
        &client,
        "kargo.akuity.io",
        "Stage",
        "stages",
        &names.project,
    )
    .patch(
        "nosteps",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"promotionTemplate": null}})),
    )
    .await
    .unwrap();
    // The same Application also authorizes a Stage that has steps: the Stage without them
    // must not keep it from its Promotion.
    create_stage(&client, &names, "second").await;
    api(
        &client,
        "argoproj.io",
        "Application",
        "applications",
        &names.argocd,
    )
    .patch(
        "nosteps",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"kargo.akuity.io/authorized-stage":
                format!("{0}:nosteps,{0}:second", names.project)}}}),
        ),
    )
    .await
    .unwrap();
    let observer = observer(&kubeconfig, &names, "observer-0", &["--leader-elect"]);
    wait_promotion(&real, &client, &names, "web", &[&observer]).await;
    wait_promotion(&real, &client, &names, "second", &[&observer]).await;
    let events: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &names.argocd,
        &resource("events.k8s.io", "v1", "Event", "events"),
    );
    wait_for(
        "a repeated StageHasNoSteps Event",
        Duration::from_secs(60),
        || async {
            events.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().any(|e| {
                    e.data["reason"] == "StageHasNoSteps"
                        && e.data["series"]["count"].as_u64().unwrap_or(0) >= 2
                })
            })
        },
    )
    .await;
    assert_eq!(
        promotions(&client, &names, "nosteps").await,
        0,
        "a Stage without steps gets no Promotion"
    );
    let seen = metric(&observer, "kargo_observer_reconciles_total").await;
    wait_for("five more reconciles", Duration::from_secs(60), || async {
        metric(&observer, "kargo_observer_reconciles_total").await >= seen + 5.0
    })
    .await;
    drop(observer);

    let events = real.audit_events(&user);
    let refused: Vec<String> = events
        .iter()
        .filter(|e| e["responseStatus"]["code"] == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(
        refused.is_empty(),
        "the chart's RBAC refused the observer: {refused:?}"
    );
    let used: BTreeSet<(String, String, String)> = events
        .iter()
        .filter(|e| e["objectRef"]["resource"].is_string())
        .map(|e| {
            (
                e["objectRef"]["apiGroup"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                e["objectRef"]["resource"].as_str().unwrap().to_string(),
                e["verb"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let grants = granted(&rendered);
    // `promote` is never a request of the observer's: Kargo's Promotion admission webhook
    // asks the API server's authorizer whether the creator may promote the Stage. The real
    // authorizer must say yes for the chart's account (and no without the grant).
    let promote = (
        "kargo.akuity.io".to_string(),
        "stages".to_string(),
        "promote".to_string(),
    );
    assert!(
        allowed(
            &client,
            &user,
            "promote",
            "kargo.akuity.io",
            "stages",
            &names.project
        )
        .await,
        "the real authorizer does not grant promote on stages to {user}"
    );
    // Without the chart's rule nobody may: the namespace's default account is refused.
    assert!(
        !allowed(
            &client,
            &format!("system:serviceaccount:{}:default", names.argocd),
            "promote",
            "kargo.akuity.io",
            "stages",
            &names.project
        )
        .await,
        "promote is granted to an account the chart did not bind"
    );
    assert!(
        !allowed(&client, &user, "get", "", "secrets", &names.project).await,
        "the observer's account reads Secrets"
    );
    let unused: Vec<_> = grants
        .iter()
        .filter(|g| **g != promote && !used.contains(*g))
        .collect();
    assert!(
        unused.is_empty(),
        "the chart grants verbs no test saw the observer use: {unused:?}\nused: {used:?}"
    );
    let ungranted: Vec<_> = used.iter().filter(|u| !grants.contains(*u)).collect();
    assert!(
        ungranted.is_empty(),
        "the observer used verbs the chart does not grant: {ungranted:?}"
    );
}
