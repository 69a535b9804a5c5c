//! The inventory read from Argo CD's API (`GET /api/v1/clusters`, ADR 0008) against the
//! ground's Argo CD API double: the same render as the file inventory, the `secret-type` label
//! the API drops put back for the clusters generator, a cluster Argo CD has not discovered yet
//! failing closed unless its Secret is annotated, and Argo CD's 401.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use gitops_loop::render::inventory::{
    API_VERSIONS_ANNOTATION, Inventory, KUBE_VERSION_ANNOTATION, SECRET_TYPE_LABEL,
};
use ground::argocd_api::ArgoCdApi;
use ground::kube::store::User;
use ground::kube::{FaultPlan, KubeDouble};
use serde_json::{Value, json};

const TOKEN: &str = "argocd-read-clusters";

fn admin() -> User {
    User {
        name: "system:admin".into(),
        groups: vec!["system:masters".into()],
    }
}

/// The sample inventory as Argo CD holds it: cluster Secrets without the project's
/// annotations (Argo CD does not store discovery there), each cluster's discovery answer, and
/// an Application on every cluster that `with_apps` names (Argo CD builds a cluster's cache
/// once it manages something there).
/// An API double with Argo CD's CRDs and its namespace, and Argo CD's API over it, empty.
async fn empty_argocd() -> (KubeDouble, ArgoCdApi) {
    let kube = KubeDouble::start(FaultPlan::none()).await.unwrap();
    kube.load_crds(&common::project_root().join("kind/crds"))
        .unwrap();
    kube.create_namespace("argocd", &[]).unwrap();
    let api = ArgoCdApi::start(kube.clone(), "argocd", TOKEN)
        .await
        .unwrap();
    (kube, api)
}

async fn argocd(with_apps: &[&str]) -> (KubeDouble, ArgoCdApi, Inventory) {
    let (kube, api) = empty_argocd().await;
    let path = common::sample_dir().join("inventory.yaml");
    let inventory =
        Inventory::parse(&std::fs::read_to_string(&path).unwrap(), "inventory.yaml").unwrap();
    {
        let mut store = kube.store();
        let secrets = store.resource("", "v1", "secrets").cloned().unwrap();
        let apps = store
            .resource("argoproj.io", "v1alpha1", "applications")
            .cloned()
            .unwrap();
        for mut secret in inventory.cluster_secrets("argocd") {
            let annotations = secret["metadata"]["annotations"].as_object_mut().unwrap();
            annotations.remove(KUBE_VERSION_ANNOTATION);
            annotations.remove(API_VERSIONS_ANNOTATION);
            store.create(&secrets, "argocd", secret, &admin()).unwrap();
        }
        for cluster in &inventory.clusters {
            api.discover(
                &cluster.server,
                &format!("v{}+k3s1", cluster.kube_version.clone().unwrap()),
                &cluster.api_versions,
            );
            if with_apps.contains(&cluster.name.as_str()) {
                let app = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": format!("probe-{}", cluster.name), "namespace": "argocd"},
                    "spec": {"project": "default", "destination": {"server": cluster.server, "namespace": "default"},
                             "source": {"repoURL": "https://git.example.test/platform/gitops.git", "path": "."}}});
                store.create(&apps, "argocd", app, &admin()).unwrap();
            }
        }
    }
    (kube, api, inventory)
}

fn names(inventory: &Inventory) -> Vec<&str> {
    inventory.clusters.iter().map(|c| c.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_gives_what_the_file_gives_with_the_generators_label_restored() {
    let all = ["prod-eu", "prod-us", "staging", "in-cluster"];
    let (_kube, api, file) = argocd(&all).await;
    let mut live = Inventory::fetch_argocd(&api.url(), TOKEN).await.unwrap();
    let mut file = file;
    live.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    file.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(names(&live), names(&file));
    for (live, file) in live.clusters.iter().zip(&file.clusters) {
        assert_eq!(live.server, file.server);
        assert_eq!(live.kube_version, file.kube_version, "{}", live.name);
        assert_eq!(live.api_versions, file.api_versions, "{}", live.name);
        // The API view drops the label; the clusters generator selects on it.
        assert_eq!(
            live.labels.get(SECRET_TYPE_LABEL).map(String::as_str),
            Some("cluster")
        );
        assert_eq!(live.labels, file.labels, "{}", live.name);
        assert!(live.has_secret);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_argo_cd_has_not_discovered_fails_closed_unless_its_secret_says() {
    // staging has no Application yet: Argo CD's cache has no API list for it.
    let (kube, api, _file) = argocd(&["prod-eu", "prod-us", "in-cluster"]).await;
    let err = Inventory::fetch_argocd(&api.url(), TOKEN)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cluster staging"), "{err}");
    assert!(err.contains(API_VERSIONS_ANNOTATION), "{err}");
    // The operator annotates the Secret: the annotation stands in until Argo CD discovers.
    {
        let mut store = kube.store();
        let secrets = store.resource("", "v1", "secrets").cloned().unwrap();
        let mut secret = store.get(&secrets, "argocd", "cluster-staging").unwrap();
        secret["metadata"]["annotations"][API_VERSIONS_ANNOTATION] =
            json!("apps/v1/Deployment,v1/Service");
        store
            .update(
                &secrets,
                "argocd",
                "cluster-staging",
                secret,
                &admin(),
                false,
            )
            .unwrap();
    }
    let live = Inventory::fetch_argocd(&api.url(), TOKEN).await.unwrap();
    let staging = live.clusters.iter().find(|c| c.name == "staging").unwrap();
    assert!(
        staging
            .api_versions
            .contains(&"apps/v1/Deployment".to_string())
    );
    assert!(staging.api_versions.contains(&"apps/v1".to_string()));
    assert_eq!(
        staging.kube_version, None,
        "nothing discovered, nothing annotated"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_in_cluster_destination_argo_cd_lists_is_a_destination() {
    let (kube, api) = empty_argocd().await;
    let apis = vec!["v1".to_string(), "apps/v1".to_string()];
    api.discover("https://kubernetes.default.svc", "v1.33.4", &apis);
    {
        let mut store = kube.store();
        let apps = store
            .resource("argoproj.io", "v1alpha1", "applications")
            .cloned()
            .unwrap();
        let app = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "local", "namespace": "argocd"},
            "spec": {"project": "default", "destination": {"name": "in-cluster", "namespace": "default"},
                     "source": {"repoURL": "https://git.example.test/platform/gitops.git", "path": "."}}});
        store.create(&apps, "argocd", app, &admin()).unwrap();
    }
    let live = Inventory::fetch_argocd(&api.url(), TOKEN).await.unwrap();
    // Argo CD lists it without a Secret; the API's view cannot tell, so it is read as listed
    // (a selector on the secret-type label matches it: one Application more, never one less).
    assert_eq!(names(&live), ["in-cluster"]);
    let local = live
        .destination(Some("https://kubernetes.default.svc"), None)
        .unwrap();
    assert_eq!(local.kube_version.as_deref(), Some("1.33.4"));
    assert_eq!(local.api_versions, ["apps/v1", "v1"]);
    assert_eq!(live.default_kube_version.as_deref(), Some("1.33.4"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_gets_argo_cds_answer_and_the_token_stays_out_of_it() {
    let (_kube, api, _file) = argocd(&[]).await;
    let err = Inventory::fetch_argocd(&api.url(), "not-the-token")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("HTTP 401") && err.contains("no session information"),
        "{err}"
    );
    assert!(!err.contains("not-the-token"));
    let err = Inventory::fetch_argocd("file:///etc/passwd", TOKEN)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an http(s) URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gate_render_from_argo_cds_api_renders_what_the_file_renders() {
    let all = ["prod-eu", "prod-us", "staging", "in-cluster"];
    let (_kube, api, _file) = argocd(&all).await;
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let cache = tempfile::tempdir().unwrap();
    let sample = common::sample_dir();
    let render = |inventory: &[&str]| -> Value {
        let output = common::gate(cache.path())
            .args([
                "render",
                "--format",
                "json",
                "--repo-url",
                common::SAMPLE_REPO_URL,
            ])
            .arg("--repo")
            .arg(repo.path())
            .args(inventory)
            .arg("--charts")
            .arg(sample.join("charts"))
            .env("ARGOCD_AUTH_TOKEN", TOKEN)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let document: Value = serde_json::from_slice(&output.stdout).unwrap();
        // Name, cluster and what was rendered: helm's capabilities come from the inventory.
        document["applications"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| json!([a["name"], a["cluster"], a["objects"]]))
            .collect()
    };
    let file = sample.join("inventory.yaml").display().to_string();
    let from_file = render(&["--inventory", &file]);
    let from_api = render(&["--inventory-argocd", &api.url()]);
    assert!(from_file.as_array().unwrap().len() > 3);
    assert_eq!(from_api, from_file);
    // Without a token the gate says which variable to set.
    let output = common::gate(cache.path())
        .args([
            "render",
            "--format",
            "summary",
            "--inventory-argocd",
            &api.url(),
        ])
        .arg("--repo")
        .arg(repo.path())
        .env_remove("ARGOCD_AUTH_TOKEN")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("$ARGOCD_AUTH_TOKEN"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_listed_a_failed_connection_and_no_in_cluster_are_not_read_as_a_fleet() {
    // A token that sees no cluster (or an Argo CD with none) gets an empty list: not a fleet.
    let (_kube, empty) = empty_argocd().await;
    empty.set_in_cluster_enabled(false);
    let err = Inventory::fetch_argocd(&empty.url(), TOKEN)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("lists no cluster"), "{err}");

    // A cluster whose connection failed keeps a stale API list in Argo CD's cache: refused.
    let all = ["prod-eu", "prod-us", "staging", "in-cluster"];
    let (_kube, api, _file) = argocd(&all).await;
    api.disconnect("https://prod-us.k8s.example.test");
    let err = Inventory::fetch_argocd(&api.url(), TOKEN)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cluster prod-us") && err.contains("did not succeed"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_in_cluster_in_argo_cd_there_is_no_implicit_one() {
    let (kube, api) = empty_argocd().await;
    api.set_in_cluster_enabled(false);
    let path = common::sample_dir().join("inventory.yaml");
    let file =
        Inventory::parse(&std::fs::read_to_string(&path).unwrap(), "inventory.yaml").unwrap();
    {
        let mut store = kube.store();
        let secrets = store.resource("", "v1", "secrets").cloned().unwrap();
        for secret in file.cluster_secrets("argocd") {
            if secret["metadata"]["name"] != "cluster-in-cluster" {
                store.create(&secrets, "argocd", secret, &admin()).unwrap();
            }
        }
    }
    let live = Inventory::fetch_argocd(&api.url(), TOKEN).await.unwrap();
    assert!(live.implicit_in_cluster().is_none());
    assert!(
        live.destination(Some("https://kubernetes.default.svc"), None)
            .is_none()
    );
    assert!(
        live.destinations()
            .iter()
            .all(|c| c.server != "https://kubernetes.default.svc")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_the_token_cannot_see_is_never_let_through_as_a_note() {
    // Argo CD's API leaves out the clusters a token may not `get`. An Application aimed at
    // one is `destination-unknown` at the merge base and at the head alike; from a file that
    // is a note, from Argo CD's view it blocks: the cluster may be there, hidden.
    let (kube, api, _file) = argocd(&["prod-eu", "prod-us", "staging", "in-cluster"]).await;
    {
        let mut store = kube.store();
        let secrets = store.resource("", "v1", "secrets").cloned().unwrap();
        store
            .delete(&secrets, "argocd", "cluster-in-cluster", &admin())
            .unwrap();
    }
    // Hidden from the token (or disabled): Argo CD lists no in-cluster destination, while
    // apps/ingress.yaml names https://kubernetes.default.svc.
    api.set_in_cluster_enabled(false);
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let cache = tempfile::tempdir().unwrap();
    let head = repo.head();
    let output = common::gate(cache.path())
        .args(["check", "--base", &head, "--head", &head])
        .args(["--repo-url", common::SAMPLE_REPO_URL])
        .arg("--repo")
        .arg(repo.path())
        .args(["--inventory-argocd", &api.url()])
        .arg("--charts")
        .arg(common::sample_dir().join("charts"))
        .env("ARGOCD_AUTH_TOKEN", TOKEN)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(report.contains("destination-unknown"), "{report}");
    assert!(
        report.contains("leaves out clusters its token may not read"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_argo_cd_cannot_make_the_gate_read_without_end_or_echo_the_token() {
    // An answer with no length that never stops at 64 MiB is cut off, not buffered whole.
    let huge = std::sync::Arc::new(vec![b' '; 65 * 1024 * 1024]);
    let (url, _) = common::same_answer(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
        huge,
    )
    .await;
    let err = Inventory::fetch_argocd(&url, TOKEN)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("larger than 64 MiB"), "{err}");
    // An error message that repeats the token, past the 300 characters kept, keeps none of it.
    let message = format!("{}{TOKEN}", "x".repeat(290));
    let body =
        serde_json::to_vec(&json!({"error": message, "code": 16, "message": message})).unwrap();
    let (url, _) = common::same_answer(
        "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
        std::sync::Arc::new(body),
    )
    .await;
    let err = Inventory::fetch_argocd(&url, TOKEN)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("HTTP 401"), "{err}");
    assert!(!err.contains(&TOKEN[..8]), "{err}");
}
