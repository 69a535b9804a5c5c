//! `KubeDouble`: a stand-in for kube-apiserver on loopback HTTP. It serves the REST subset real
//! clients use (discovery; get, list with label/field selectors and pagination, watch with
//! resourceVersions, bookmarks, `sendInitialEvents` and 410 Gone; create with generateName;
//! update with 409 on a stale resourceVersion; merge, JSON and apply patches; delete; status
//! subresources), validates custom resources against the CRDs loaded into it, runs admission
//! hooks (the ground's Kargo webhook), and writes a kubeconfig. kube-rs and the real kubectl
//! talk to it unchanged.

pub mod faults;
pub mod schema;
pub mod store;

mod collection;
mod handler;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;
use axum::Router;
use serde_json::{Value, json};

pub use self::faults::{FaultPlan, Faults};
use self::handler::handle;
use self::store::{Resource, Store, User};

/// The shared state of one double.
pub struct Inner {
    pub store: Mutex<Store>,
    users: Mutex<BTreeMap<String, User>>,
    pub faults: Faults,
}

#[derive(Clone)]
pub struct KubeDouble {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: Arc<tokio::task::JoinHandle<()>>,
}

impl KubeDouble {
    /// Starts the double on an ephemeral loopback port.
    pub async fn start(faults: FaultPlan) -> Result<KubeDouble> {
        let inner = Arc::new(Inner {
            store: Mutex::new(Store::new()),
            users: Mutex::new(BTreeMap::new()),
            faults: Faults::new(faults),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(KubeDouble {
            inner,
            addr,
            server: Arc::new(server),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.inner.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ground's one clock, which the store stamps objects with.
    pub fn clock(&self) -> crate::clock::Clock {
        self.store().clock.clone()
    }

    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// A bearer token that authenticates as `name` (in `groups`).
    pub fn add_user(&self, token: &str, name: &str, groups: &[&str]) {
        self.inner
            .users
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                token.to_string(),
                User {
                    name: name.to_string(),
                    groups: groups.iter().map(|g| g.to_string()).collect(),
                },
            );
    }

    /// Writes a kubeconfig for `token` (user `user`) with `namespace` as the default.
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        token: &str,
        namespace: &str,
    ) -> Result<PathBuf> {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "ground", "cluster": {"server": self.url()}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "ground", "context": {"cluster": "ground", "user": user, "namespace": namespace}}],
            "current-context": "ground",
        });
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&config)?)?;
        Ok(path.to_path_buf())
    }

    /// Loads CRDs (the YAML files of a folder) as if applied by an administrator.
    pub fn load_crds(&self, dir: &Path) -> Result<usize> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        entries.sort();
        self.load_crd_files(&entries)
    }

    /// Loads the CRDs in these YAML files (other documents are skipped), as an administrator.
    pub fn load_crd_files(&self, files: &[PathBuf]) -> Result<usize> {
        let admin = User {
            name: "system:admin".into(),
            groups: vec!["system:masters".into()],
        };
        let mut count = 0;
        for path in files {
            let text = std::fs::read_to_string(path)?;
            for document in gitops_loop::yaml::parse_documents(&text, &path.display().to_string())?
            {
                if document.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition")
                {
                    continue;
                }
                let mut store = self.store();
                let resource = store
                    .resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
                    .cloned()
                    .ok_or_else(|| anyhow::anyhow!("no CRD resource"))?;
                store
                    .create(&resource, "", document, &admin)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Creates a namespace (with labels), as an administrator.
    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        let admin = User {
            name: "system:admin".into(),
            groups: vec!["system:masters".into()],
        };
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let mut store = self.store();
        let resource = store
            .resource("", "v1", "namespaces")
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no namespaces"))?;
        store
            .create(
                &resource,
                "",
                json!({"metadata": {"name": name, "labels": labels}}),
                &admin,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }
}

impl Drop for KubeDouble {
    fn drop(&mut self) {
        if Arc::strong_count(&self.server) == 1 {
            self.server.abort();
        }
    }
}

/// Where a request points.
struct Target {
    resource: Resource,
    namespace: String,
    name: Option<String>,
    status: bool,
}

impl std::fmt::Debug for KubeDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KubeDouble({})", self.url())
    }
}
