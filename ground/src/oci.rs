//! An OCI registry double: the distribution v2 API's read side (the OCI distribution spec's
//! `GET /v2/<name>/manifests/<reference>` and `GET /v2/<name>/blobs/<digest>`), behind the
//! anonymous bearer-token flow Docker Hub, GHCR and Quay use: a request without a token gets
//! 401 with `WWW-Authenticate: Bearer realm=...,service=...,scope=repository:<name>:pull`; the
//! token endpoint answers `{"token": ...}` for that scope. Images are served as an OCI image
//! index (linux/amd64 and linux/arm64) or a single manifest, their labels in the config blob
//! (where `docker build --label` and most release pipelines put
//! `org.opencontainers.image.source`). Faults a real registry has: 404 for an unknown name or
//! tag, a scripted status for a named image.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use axum::Router;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::Digest as _;

const TOKEN: &str = "ground-registry-token";

/// One image tag the registry serves.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OciImage {
    /// The repository as references write it, host included (`quay.io/jetstack/x`).
    pub repository: String,
    pub tag: String,
    /// Config labels (`org.opencontainers.image.source`, ...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Served as an image index of two platforms (default) or one manifest.
    #[serde(default = "yes")]
    pub multi_arch: bool,
    /// Answer every request for this image with this status (a registry fault).
    #[serde(default)]
    pub status: Option<u16>,
}

fn yes() -> bool {
    true
}

#[derive(Default)]
struct Store {
    /// name (no host) -> reference (tag or digest) -> (media type, body)
    manifests: BTreeMap<String, BTreeMap<String, (String, Vec<u8>)>>,
    blobs: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    faults: BTreeMap<String, u16>,
    requests: Vec<String>,
    /// The token realm challenges name instead of this registry's own `/token`.
    realm: Option<String>,
    /// Blob downloads answer 307 to this base URL, as registries redirect to a CDN.
    blob_redirect: Option<String>,
    /// Blob downloads answer other bytes than their digest names (a registry or CDN that swaps
    /// content).
    swap_blobs: bool,
}

type Shared = Arc<Mutex<Store>>;

pub struct OciRegistryDouble {
    addr: SocketAddr,
    store: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for OciRegistryDouble {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// The repository name a registry sees: the reference without its host.
fn name_of(repository: &str) -> String {
    match repository.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') => rest.to_string(),
        _ => repository.to_string(),
    }
}

/// Pushes one image: its config blob, one manifest per platform, and the tag (an index or a
/// manifest). A tag pushed again moves to the new content, as a registry's does.
fn add(store: &mut Store, image: &OciImage) {
    let name = name_of(&image.repository);
    match image.status {
        Some(status) => store.faults.insert(format!("{name}:{}", image.tag), status),
        None => store.faults.remove(&format!("{name}:{}", image.tag)),
    };
    let mut manifest_for = |arch: &str| -> (String, Vec<u8>) {
        let config = serde_json::to_vec(&json!({
            "architecture": arch, "os": "linux",
            "config": {"Labels": image.labels},
            "rootfs": {"type": "layers", "diff_ids": []}
        }))
        .unwrap_or_default();
        let config_digest = digest(&config);
        store
            .blobs
            .entry(name.clone())
            .or_default()
            .insert(config_digest.clone(), config.clone());
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config.len()},
            "layers": []
        }))
        .unwrap_or_default();
        let d = digest(&manifest);
        store.manifests.entry(name.clone()).or_default().insert(
            d.clone(),
            (
                "application/vnd.oci.image.manifest.v1+json".into(),
                manifest.clone(),
            ),
        );
        (d, manifest)
    };
    if image.multi_arch {
        let entries: Vec<Value> = ["arm64", "amd64"]
            .iter()
            .map(|arch| {
                let (d, m) = manifest_for(arch);
                json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": d, "size": m.len(),
                           "platform": {"os": "linux", "architecture": arch}})
            })
            .collect();
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": entries
        }))
        .unwrap_or_default();
        store.manifests.entry(name.clone()).or_default().insert(
            image.tag.clone(),
            ("application/vnd.oci.image.index.v1+json".into(), index),
        );
    } else {
        let (_, m) = manifest_for("amd64");
        store.manifests.entry(name.clone()).or_default().insert(
            image.tag.clone(),
            ("application/vnd.oci.image.manifest.v1+json".into(), m),
        );
    }
}

impl OciRegistryDouble {
    pub async fn start(images: &[OciImage]) -> Result<OciRegistryDouble> {
        let mut store = Store::default();
        for image in images {
            add(&mut store, image);
        }
        let store = Arc::new(Mutex::new(store));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/token", get(token))
            .route("/v2/", get(base))
            .route("/v2/{*rest}", get(content))
            .with_state(store.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(OciRegistryDouble {
            addr,
            store,
            server,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Pushes `image` (a tag already served moves to it).
    pub fn put(&self, image: &OciImage) {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        add(&mut store, image);
    }

    /// Challenges name `realm` as the token endpoint (a registry whose tokens come from
    /// another host, as Docker Hub's come from auth.docker.io).
    pub fn set_realm(&self, realm: &str) {
        self.store.lock().unwrap_or_else(|p| p.into_inner()).realm = Some(realm.to_string());
    }

    /// Blob downloads answer other bytes than their digest names.
    pub fn swap_blobs(&self) {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .swap_blobs = true;
    }

    /// Blob downloads answer 307 to `base` (a CDN), as Docker Hub, ghcr.io and Quay do.
    pub fn redirect_blobs_to(&self, base: &str) {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .blob_redirect = Some(base.to_string());
    }

    /// Every request path received (token and content), in order.
    pub fn requests(&self) -> Vec<String> {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .requests
            .clone()
    }
}

fn challenge(headers: &HeaderMap, scope: Option<&str>, realm: Option<&str>) -> Response {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let realm = realm.map_or_else(|| format!("http://{host}/token"), str::to_string);
    let mut value = format!("Bearer realm=\"{realm}\",service=\"ground-registry\"");
    if let Some(scope) = scope {
        value.push_str(&format!(",scope=\"{scope}\""));
    }
    let mut response = (
        StatusCode::UNAUTHORIZED,
        axum::Json(
            json!({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}),
        ),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&value) {
        response.headers_mut().insert("www-authenticate", v);
    }
    response
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

async fn base(State(store): State<Shared>, headers: HeaderMap) -> Response {
    if authorized(&headers) {
        axum::Json(json!({})).into_response()
    } else {
        let realm = store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .realm
            .clone();
        challenge(&headers, None, realm.as_deref())
    }
}

async fn token(
    State(store): State<Shared>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    store
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .requests
        .push(format!(
            "token {}",
            query.get("scope").cloned().unwrap_or_default()
        ));
    if query.get("service").map(String::as_str) != Some("ground-registry") {
        return StatusCode::BAD_REQUEST.into_response();
    }
    axum::Json(json!({"token": TOKEN, "access_token": TOKEN, "expires_in": 300})).into_response()
}

async fn content(
    State(store): State<Shared>,
    headers: HeaderMap,
    UrlPath(rest): UrlPath<String>,
) -> Response {
    let (name, kind, reference) = match rest
        .rsplit_once("/manifests/")
        .map(|(n, r)| (n, "manifests", r))
        .or_else(|| rest.rsplit_once("/blobs/").map(|(n, r)| (n, "blobs", r)))
    {
        Some(parts) => parts,
        None => return StatusCode::NOT_FOUND.into_response(),
    };
    let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
    store.requests.push(format!("{kind} {name} {reference}"));
    if !authorized(&headers) {
        return challenge(
            &headers,
            Some(&format!("repository:{name}:pull")),
            store.realm.as_deref(),
        );
    }
    if let (Some(to), "blobs") = (&store.blob_redirect, kind) {
        let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
        if let Ok(v) = HeaderValue::from_str(&format!("{to}/v2/{name}/blobs/{reference}")) {
            response.headers_mut().insert("location", v);
        }
        return response;
    }
    if let Some(status) = store.faults.get(&format!("{name}:{reference}")) {
        return StatusCode::from_u16(*status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response();
    }
    let found = match kind {
        "manifests" => store
            .manifests
            .get(name)
            .and_then(|m| m.get(reference))
            .cloned(),
        _ => store
            .blobs
            .get(name)
            .and_then(|m| m.get(reference))
            .map(|b| {
                let mut body = b.clone();
                if store.swap_blobs {
                    // Still JSON, other bytes: only a digest check notices.
                    body.push(b' ');
                }
                ("application/vnd.oci.image.config.v1+json".to_string(), body)
            }),
    };
    match found {
        Some((media_type, body)) => {
            let mut response = body.into_response();
            if let Ok(v) = HeaderValue::from_str(&media_type) {
                response.headers_mut().insert("content-type", v);
            }
            response
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(
                json!({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}),
            ),
        )
            .into_response(),
    }
}
