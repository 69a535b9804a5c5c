//! Argo CD's API server, for the one endpoint the product reads: `GET /api/v1/clusters`
//! (Argo CD v3.5, [A server/cluster/cluster.go List]). Built at each request from what the
//! API double holds:
//!
//! - one item per cluster Secret (`argocd.argoproj.io/secret-type=cluster`) in Argo CD's
//!   namespace: `server` (trailing `/` trimmed), `name`, `project`, and the Secret's labels and
//!   annotations with the system ones dropped: the `secret-type` label, the last-applied and
//!   managed-by annotations ([A util/db/cluster.go SecretToCluster]);
//! - the in-cluster destination appended when no Secret names `https://kubernetes.default.svc`
//!   ([A util/db/cluster.go ListClusters]);
//! - `info` from the cluster cache ([A server/cluster/cluster.go toAPIResponse]): the server
//!   version and API versions a live cluster answers discovery with ([`ArgoCdApi::discover`]),
//!   known only once an Application targets the cluster (Argo CD builds a cluster's cache when
//!   it first manages something there), with `applicationsCount`.
//!
//! Without a valid bearer token the answer is 401 with grpc-gateway v1's error body
//! (`{"error", "code": 16, "message", "details"}`, "no session information").

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::kube::KubeDouble;
use crate::kube::store::Selector;

const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

/// What a live cluster answers to discovery: its version and `group/version` (and
/// `group/version/Kind`) entries.
#[derive(Debug, Clone, Default)]
struct Discovery {
    server_version: String,
    api_versions: Vec<String>,
    /// False once the cluster stopped answering: Argo CD keeps the last API list it had and
    /// reports the connection `Failed`.
    connected: bool,
}

struct ApiState {
    kube: KubeDouble,
    namespace: String,
    token: String,
    discovery: BTreeMap<String, Discovery>,
    /// Argo CD's `cluster.inClusterEnabled` (argocd-cm); true by default.
    in_cluster_enabled: bool,
}

type Shared = Arc<Mutex<ApiState>>;

/// The running double.
pub struct ArgoCdApi {
    state: Shared,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ArgoCdApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, ApiState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl ArgoCdApi {
    /// Serves Argo CD's API for the cluster Secrets of `namespace` in `kube`, to `token`.
    pub async fn start(kube: KubeDouble, namespace: &str, token: &str) -> Result<ArgoCdApi> {
        let state: Shared = Arc::new(Mutex::new(ApiState {
            kube,
            namespace: namespace.to_string(),
            token: token.to_string(),
            discovery: BTreeMap::new(),
            in_cluster_enabled: true,
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/api/v1/clusters", get(list_clusters))
            .with_state(state.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ArgoCdApi {
            state,
            addr,
            server,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the cluster at `server` answers to discovery (`v1.33.4`, API versions).
    pub fn discover(&self, server: &str, server_version: &str, api_versions: &[String]) {
        lock(&self.state).discovery.insert(
            server.trim_end_matches('/').to_string(),
            Discovery {
                server_version: server_version.to_string(),
                api_versions: api_versions.to_vec(),
                connected: true,
            },
        );
    }

    /// The cluster at `server` stops answering: its cached API list stays, the connection
    /// state turns `Failed`.
    pub fn disconnect(&self, server: &str) {
        if let Some(d) = lock(&self.state)
            .discovery
            .get_mut(server.trim_end_matches('/'))
        {
            d.connected = false;
        }
    }

    /// Argo CD's `cluster.inClusterEnabled: "false"`: no in-cluster destination without a
    /// Secret ([A util/db/cluster.go ListClusters]).
    pub fn set_in_cluster_enabled(&self, enabled: bool) {
        lock(&self.state).in_cluster_enabled = enabled;
    }
}

fn unauthenticated() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": "no session information", "code": 16, "message": "no session information", "details": []})),
    )
        .into_response()
}

fn decode(secret: &Value, key: &str) -> String {
    secret
        .pointer(&format!("/data/{key}"))
        .and_then(Value::as_str)
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .and_then(|v| String::from_utf8(v).ok())
        .unwrap_or_default()
}

async fn list_clusters(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let state = lock(&state);
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if state.token.is_empty() || presented != state.token {
        return unauthenticated();
    }
    let store = state.kube.store();
    let secrets = store
        .resource("", "v1", "secrets")
        .cloned()
        .map(|r| {
            store.list(
                &r,
                &state.namespace,
                &Selector::parse("argocd.argoproj.io/secret-type=cluster").unwrap_or_default(),
                &Selector::default(),
            )
        })
        .unwrap_or_default();
    let applications = store
        .resource("argoproj.io", "v1alpha1", "applications")
        .cloned()
        .map(|r| store.list(&r, "", &Selector::default(), &Selector::default()))
        .unwrap_or_default();
    drop(store);
    let count = |server: &str, name: &str| {
        applications
            .iter()
            .filter(|a| {
                let text = |p: &str| a.pointer(p).and_then(Value::as_str).unwrap_or("");
                let dest = text("/spec/destination/server").trim_end_matches('/');
                (!dest.is_empty() && dest == server)
                    || (dest.is_empty() && text("/spec/destination/name") == name)
            })
            .count() as i64
    };
    let info = |server: &str, name: &str| {
        let applications = count(server, name);
        match state.discovery.get(server).filter(|_| applications > 0) {
            Some(d) => json!({
                "connectionState": if d.connected {
                    json!({"status": "Successful", "message": ""})
                } else {
                    json!({"status": "Failed", "message": "dial tcp: i/o timeout"})
                },
                "serverVersion": d.server_version,
                "cacheInfo": {"apisCount": d.api_versions.len(), "resourcesCount": 0},
                "applicationsCount": applications,
                "apiVersions": d.api_versions,
            }),
            None => json!({
                "connectionState": {"status": "Unknown", "message": ""},
                "cacheInfo": {},
                "applicationsCount": applications,
            }),
        }
    };
    let mut items = Vec::new();
    for secret in &secrets {
        let server = decode(secret, "server").trim_end_matches('/').to_string();
        let name = decode(secret, "name");
        let mut labels = secret
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        if let Some(map) = labels.as_object_mut() {
            map.remove("argocd.argoproj.io/secret-type");
        }
        let mut annotations = secret
            .pointer("/metadata/annotations")
            .cloned()
            .unwrap_or(json!({}));
        if let Some(map) = annotations.as_object_mut() {
            map.remove("kubectl.kubernetes.io/last-applied-configuration");
            map.remove("managed-by");
        }
        let mut item = json!({
            "server": server,
            "name": name,
            "config": {"tlsClientConfig": {"insecure": false}},
            "info": info(&server, &name),
            "labels": labels,
            "annotations": annotations,
        });
        let project = decode(secret, "project");
        if !project.is_empty() {
            item["project"] = json!(project);
        }
        items.push(item);
    }
    if state.in_cluster_enabled && !items.iter().any(|i| i["server"] == IN_CLUSTER_SERVER) {
        items.push(json!({
            "server": IN_CLUSTER_SERVER,
            "name": "in-cluster",
            "config": {"tlsClientConfig": {"insecure": false}},
            "info": info(IN_CLUSTER_SERVER, "in-cluster"),
        }));
    }
    Json(json!({"metadata": {}, "items": items})).into_response()
}
