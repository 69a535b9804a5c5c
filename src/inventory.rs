//! The inventory loaders, above the render engine: Argo CD's cluster Secrets read live through
//! the Kubernetes API, and Argo CD's API (`GET /api/v1/clusters`, ADR 0008) fetched over HTTP.
//! What they read is parsed by `render::inventory` (the render itself never sees a client).

use serde_json::Value;

use crate::render::inventory::{Inventory, InventoryError, SECRET_TYPE_LABEL};

impl Inventory {
    /// Reads the inventory from Argo CD's API at `server` (`https://argocd.example`) with a
    /// bearer token that may `get` clusters. Errors name the server and Argo CD's message;
    /// the token never appears in them.
    pub async fn fetch_argocd(server: &str, token: &str) -> Result<Inventory, InventoryError> {
        let origin = format!("{}/api/v1/clusters", server.trim_end_matches('/'));
        let fetch = |message: String| InventoryError::Fetch {
            origin: origin.clone(),
            message,
        };
        if !(server.starts_with("https://") || server.starts_with("http://")) {
            return Err(fetch(format!("{server:?} is not an http(s) URL")));
        }
        crate::forge::github::install_crypto_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("gitops-loop/", env!("CARGO_PKG_VERSION")))
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| fetch(e.to_string()))?;
        let response = client
            .get(&origin)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| fetch(e.without_url().to_string()))?;
        let status = response.status();
        // A ClusterList of thousands of clusters is a few MB; refuse more than 64 MiB.
        if response
            .content_length()
            .is_some_and(|n| n > 64 * 1024 * 1024)
        {
            return Err(fetch("the answer is larger than 64 MiB".into()));
        }
        let mut response = response;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| fetch(e.without_url().to_string()))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > 64 * 1024 * 1024 {
                return Err(fetch("the answer is larger than 64 MiB".into()));
            }
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| fetch(format!("HTTP {}: not JSON ({e})", status.as_u16())))?;
        if !status.is_success() {
            let message = value
                .get("message")
                .or_else(|| value.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("no message");
            // Whatever the server says, the token is not repeated (replaced before the cut, so
            // no part of it survives a truncation).
            let message = if token.is_empty() {
                message.to_string()
            } else {
                message.replace(token, "***")
            };
            let message: String = message.chars().take(300).collect();
            return Err(fetch(format!("HTTP {}: {message}", status.as_u16())));
        }
        Inventory::from_argocd_clusters(&value, &origin)
    }

    /// [`Inventory::fetch_argocd`] from synchronous code (the gate's command line), on a thread
    /// of its own so that it works inside or outside an async runtime.
    pub fn fetch_argocd_blocking(server: &str, token: &str) -> Result<Inventory, InventoryError> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| InventoryError::Fetch {
                            origin: server.to_string(),
                            message: e.to_string(),
                        })?
                        .block_on(Inventory::fetch_argocd(server, token))
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(InventoryError::Fetch {
                        origin: server.to_string(),
                        message: "the reading thread panicked".into(),
                    })
                })
        })
    }

    /// Argo CD's cluster Secrets in `namespace`, read live through the Kubernetes API and parsed
    /// as an exported Secret list is (ADR 0008).
    pub async fn read_cluster_secrets(
        client: kube::Client,
        namespace: &str,
    ) -> Result<Inventory, InventoryError> {
        let origin = format!("cluster Secrets in {namespace}");
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(client, namespace);
        let list = secrets
            .list(&kube::api::ListParams::default().labels(&format!("{SECRET_TYPE_LABEL}=cluster")))
            .await
            .map_err(|e| InventoryError::Fetch {
                origin: origin.clone(),
                message: format!("cannot list them: {e}"),
            })?;
        let items: Vec<Value> = list
            .items
            .iter()
            .map(|s| {
                let mut value = serde_json::to_value(s).unwrap_or(Value::Null);
                value["apiVersion"] = "v1".into();
                value["kind"] = "Secret".into();
                value
            })
            .collect();
        Inventory::from_secret_documents(items, &origin)
    }
}
