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

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Result;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub use self::faults::{FaultPlan, Faults};
use self::store::{ApiError, Event, PatchBody, Resource, Selector, Store, User};

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

    /// Loads CRDs (YAML files) as if applied by an administrator.
    pub fn load_crds(&self, dir: &Path) -> Result<usize> {
        let admin = User {
            name: "system:admin".into(),
            groups: vec!["system:masters".into()],
        };
        let mut count = 0;
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        {
            let text = std::fs::read_to_string(&path)?;
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

fn status_response(error: &ApiError) -> Response {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(error.status())).into_response()
}

fn json_response(value: Value) -> Response {
    axum::Json(value).into_response()
}

/// Where a request points.
struct Target {
    resource: Resource,
    namespace: String,
    name: Option<String>,
    status: bool,
}

fn discovery_resources(store: &Store, group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in store
        .resources()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": r.short_names,
        }));
        if r.status_subresource {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

fn group_list(store: &Store) -> Value {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in store.resources().iter().filter(|r| !r.group.is_empty()) {
        let versions = groups.entry(r.group.clone()).or_default();
        if !versions.contains(&r.version) {
            versions.push(r.version.clone());
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(name, versions)| {
            let list: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "versions": list, "preferredVersion": list[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn parse_target(store: &Store, segments: &[&str]) -> Result<Option<Target>, ApiError> {
    // segments start after /api/v1 or /apis/{g}/{v}: [plural] [name] [status] or
    // [namespaces, ns, plural, name, status].
    let (group, version, rest) = match segments {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Ok(None),
    };
    if rest.is_empty() {
        return Ok(None);
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty() && *plural == "status" && tail.is_empty()) =>
        {
            (ns.to_string(), [&[*plural][..], tail].concat())
        }
        other => (String::new(), other.to_vec()),
    };
    let plural = rest[0];
    let resource = store
        .resource(group, version, plural)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({plural}.{version}.{group})"
                ),
            )
        })?;
    let name = rest.get(1).map(|s| s.to_string());
    let status = rest.get(2) == Some(&"status");
    if rest.len() > 3 || (rest.len() == 3 && !status) {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    Ok(Some(Target {
        resource,
        namespace,
        name,
        status,
    }))
}

fn query_map(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                    out.push(b);
                    i += 2;
                } else {
                    out.push(b'%');
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::new(
            400,
            "BadRequest",
            "the request body is empty",
        ));
    }
    serde_json::from_slice(body).or_else(|e| {
        // kubectl and SSA may send YAML.
        gitops_loop::yaml::parse_document(&String::from_utf8_lossy(body), "request body").map_err(
            |_| {
                ApiError::new(
                    400,
                    "BadRequest",
                    format!("the request body is not valid JSON: {e}"),
                )
            },
        )
    })
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().trim_end_matches('/').to_string();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if segments.as_slice() == ["healthz"] || segments.as_slice() == ["readyz"] {
        return "ok".into_response();
    }
    // A bearer token names a user; a request without one is anonymous (as with the API
    // server's default --anonymous-auth); an unknown token is refused. client-go does not
    // send bearer tokens over plain http, so kubectl against the double is anonymous.
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let user = match token {
        None | Some("") => Some(User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }),
        Some(token) => inner
            .users
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned(),
    };
    let Some(user) = user else {
        return status_response(&ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    let query = query_map(&uri);
    let is_watch = matches!(
        query.get("watch").map(String::as_str),
        Some("true") | Some("1")
    );
    if let Some(delay) = inner.faults.latency() {
        tokio::time::sleep(delay).await;
    }
    if let Some(delay) = segments
        .last()
        .and_then(|last| inner.faults.list_delay(last, is_watch))
    {
        tokio::time::sleep(delay).await;
    }
    if !is_watch {
        // The seeded draw is taken whatever the outage says, so its stream stays the same.
        let drawn = inner.faults.request_error(&method, &path);
        if let Some(error) = inner.faults.outage_error(&user.name, &method).or(drawn) {
            return status_response(&error);
        }
    }
    {
        let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
        match segments.as_slice() {
            ["version"] => {
                return json_response(
                    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-ground", "platform": "linux/amd64"}),
                );
            }
            ["api"] => {
                return json_response(
                    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                );
            }
            ["api", "v1"] => return json_response(discovery_resources(&store, "", "v1")),
            ["apis"] => return json_response(group_list(&store)),
            ["apis", group] => {
                let list = group_list(&store);
                return match list["groups"]
                    .as_array()
                    .and_then(|g| g.iter().find(|x| x["name"] == *group))
                {
                    Some(g) => json_response(
                        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g["name"], "versions": g["versions"], "preferredVersion": g["preferredVersion"]}),
                    ),
                    None => status_response(&ApiError::new(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    )),
                };
            }
            ["apis", group, version] => {
                return json_response(discovery_resources(&store, group, version));
            }
            _ => {}
        }
    }
    let target = {
        let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
        parse_target(&store, &segments)
    };
    let target = match target {
        Ok(Some(t)) => t,
        Ok(None) => {
            return status_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        Err(e) => return status_response(&e),
    };
    let labels = match Selector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))
    {
        Ok(s) => s,
        Err(e) => return status_response(&e),
    };
    let fields = match Selector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or(""))
    {
        Ok(s) => s,
        Err(e) => return status_response(&e),
    };
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let result = match (&method, &target.name) {
        (&Method::GET, None) if is_watch => return watch(inner, target, labels, fields, query).await,
        (&Method::GET, None) => list(&inner, &target, &labels, &fields, &query),
        (&Method::GET, Some(name)) => inner.store.lock().unwrap_or_else(|p| p.into_inner()).get(&target.resource, &target.namespace, name),
        (&Method::POST, None) => parse_json(&body).and_then(|object| {
            let mut store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
            store.create(&target.resource, &target.namespace, object, &user)
        }),
        (&Method::PUT, Some(name)) => parse_json(&body).and_then(|object| {
            let body_name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(name);
            if body_name != name {
                return Err(ApiError::new(400, "BadRequest", "the name of the object does not match the name on the URL"));
            }
            if let Some(error) = inner.faults.conflict(&path) {
                return Err(error);
            }
            inner.store.lock().unwrap_or_else(|p| p.into_inner()).update(&target.resource, &target.namespace, name, object, &user, target.status)
        }),
        (&Method::PATCH, Some(name)) => parse_json(&body).and_then(|patch| {
            let patch = if content_type.starts_with("application/json-patch+json") {
                PatchBody::Json(patch)
            } else if content_type.starts_with("application/apply-patch") {
                let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
                    return Err(ApiError::new(400, "BadRequest", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
                };
                PatchBody::Apply {
                    object: patch,
                    manager: manager.clone(),
                    force: query.get("force").is_some_and(|f| f == "true"),
                }
            } else if content_type.starts_with("application/merge-patch+json") || content_type.starts_with("application/strategic-merge-patch+json") {
                // Strategic merge is served as a JSON merge patch: lists are replaced whole.
                PatchBody::Merge(patch)
            } else {
                return Err(ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type})")));
            };
            inner.store.lock().unwrap_or_else(|p| p.into_inner()).patch(&target.resource, &target.namespace, name, patch, &user, target.status)
        }),
        (&Method::DELETE, Some(name)) => inner.store.lock().unwrap_or_else(|p| p.into_inner()).delete(&target.resource, &target.namespace, name, &user),
        _ => Err(ApiError::new(405, "MethodNotAllowed", format!("{method} is not supported on {path}"))),
    };
    match result {
        Ok(object) if method == Method::POST => {
            (StatusCode::CREATED, axum::Json(object)).into_response()
        }
        Ok(object) => json_response(object),
        Err(e) => status_response(&e),
    }
}

fn list(
    inner: &Inner,
    target: &Target,
    labels: &Selector,
    fields: &Selector,
    query: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
    let all = store.list(&target.resource, &target.namespace, labels, fields);
    let rv = store.resource_version();
    drop(store);
    let start = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let position = all.iter().position(|o| continue_key(o) == *token);
            match position {
                Some(p) => p + 1,
                None => {
                    return Err(ApiError::new(
                        410,
                        "Expired",
                        "the provided continue parameter is too old or invalid",
                    ));
                }
            }
        }
        None => 0,
    };
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let page: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    let more = start + page.len() < all.len();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if more && let Some(last) = page.last() {
        metadata["continue"] = json!(continue_key(last));
        metadata["remainingItemCount"] = json!(all.len() - start - page.len());
    }
    Ok(json!({
        "kind": format!("{}List", target.resource.kind),
        "apiVersion": target.resource.api_version(),
        "metadata": metadata,
        "items": page,
    }))
}

fn continue_key(object: &Value) -> String {
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    format!("{}/{}", text("/metadata/namespace"), text("/metadata/name"))
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn matches_target(event: &Event, target: &Target, labels: &Selector, fields: &Selector) -> bool {
    let resource = format!("{}/{}", target.resource.group, target.resource.plural);
    if event.resource != resource {
        return false;
    }
    let namespace = event
        .object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !target.namespace.is_empty() && namespace != target.namespace {
        return false;
    }
    let mut field_map = BTreeMap::new();
    field_map.insert(
        "metadata.name".to_string(),
        event
            .object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    );
    field_map.insert("metadata.namespace".to_string(), namespace.to_string());
    labels.matches(&store::labels_of(&event.object)) && fields.matches(&field_map)
}

fn bookmark(target: &Target, rv: u64, initial_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": target.resource.kind, "apiVersion": target.resource.api_version(), "metadata": metadata})
}

async fn watch(
    inner: Arc<Inner>,
    target: Target,
    labels: Selector,
    fields: Selector,
    query: BTreeMap<String, String>,
) -> Response {
    // What this watch's fault decisions are keyed by.
    let path = format!(
        "{}/{} in {:?}",
        target.resource.group, target.resource.plural, target.namespace
    );
    let send_initial = query.get("sendInitialEvents").map(String::as_str) == Some("true");
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let since: Option<u64> = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .filter(|v| *v > 0);
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(1024);
    // Take the starting point and subscribe under one lock, so no event falls in between.
    let (initial, mut live, start_rv, gone) = {
        let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
        let live = store.subscribe();
        let rv = store.resource_version();
        match since {
            Some(_) if !send_initial && inner.faults.gone(&path) => (Vec::new(), live, rv, true),
            Some(since) if !send_initial => match store.events_since(since) {
                Some(events) => (
                    events
                        .into_iter()
                        .filter(|e| matches_target(e, &target, &labels, &fields))
                        .map(|e| (e.kind.as_str(), e.object))
                        .collect::<Vec<_>>(),
                    live,
                    rv,
                    false,
                ),
                None => (Vec::new(), live, rv, true),
            },
            _ => {
                let objects = store.list(&target.resource, &target.namespace, &labels, &fields);
                (
                    objects.into_iter().map(|o| ("ADDED", o)).collect(),
                    live,
                    rv,
                    false,
                )
            }
        }
    };
    let faults_inner = inner.clone();
    tokio::spawn(async move {
        if gone {
            let error = ApiError::new(410, "Expired", "too old resource version");
            let _ = sender.send(Ok(event_line("ERROR", &error.status()))).await;
            return;
        }
        for (kind, object) in initial {
            if sender.send(Ok(event_line(kind, &object))).await.is_err() {
                return;
            }
        }
        if send_initial {
            let _ = sender
                .send(Ok(event_line(
                    "BOOKMARK",
                    &bookmark(&target, start_rv, true),
                )))
                .await;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last_rv = start_rv;
        loop {
            let tick = tokio::time::sleep(Duration::from_millis(500));
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tick => {
                    if bookmarks && sender.send(Ok(event_line("BOOKMARK", &bookmark(&target, last_rv, false)))).await.is_err() {
                        return;
                    }
                }
                received = live.recv() => {
                    let event = match received {
                        Ok(event) => event,
                        // A watcher that fell behind is closed, as the API server does.
                        Err(_) => return,
                    };
                    last_rv = event.rv;
                    if !matches_target(&event, &target, &labels, &fields) {
                        continue;
                    }
                    match faults_inner.faults.watch_event(
                        &path,
                        &format!(
                            "{}/{}",
                            event.object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
                            event.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
                        ),
                    ) {
                        faults::WatchFault::Deliver => {}
                        // An API server never skips an event inside an open watch: an
                        // event is lost only with its connection. The line is cut mid-way
                        // (a proxy resetting the stream) and the watch ends; the client
                        // resumes from the last event it decoded, so the lost one replays.
                        faults::WatchFault::Drop => {
                            let line = event_line(event.kind.as_str(), &event.object);
                            let _ = sender.send(Ok(line.slice(..line.len() / 2))).await;
                            return;
                        }
                        faults::WatchFault::Duplicate => {
                            let _ = sender.send(Ok(event_line(event.kind.as_str(), &event.object))).await;
                        }
                        faults::WatchFault::Close => return,
                    }
                    if sender.send(Ok(event_line(event.kind.as_str(), &event.object))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

impl std::fmt::Debug for KubeDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KubeDouble({})", self.url())
    }
}
