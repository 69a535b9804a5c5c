//! The gate against Argo CD itself (the real tier): every render case is played on the process
//! cluster's upstream Argo CD (applicationset-controller, repo-server and API server built from
//! their Go module) and rendered by the gate, and the two must agree:
//!
//! - the Applications the real applicationset-controller generates (names, namespaces,
//!   metadata, spec) against the ones the gate generates;
//! - the manifests the real repo-server renders for each Application (read through the API
//!   server's `GET /api/v1/applications/{name}/manifests`, as `argocd app manifests --source
//!   git` reads them) against the gate's objects, normalised as Argo CD normalises them;
//! - a case Argo CD refuses (an ApplicationSet in ErrorOccurred, a manifest generation error,
//!   an object the API server rejects) is a case the gate refuses, and the other way round.
//!
//! Both sides get the same facts: the case's repository is served to Argo CD as a `file://`
//! repository (the gate reads the same commit), its chart repository by the ground's chart
//! double, and its clusters become Argo CD cluster Secrets pointing (through a loopback
//! forwarder each, so every cluster has a URL of its own) at the real API server, while the
//! gate gets the same clusters with the version and API groups that server really serves.
//! The URLs are rewritten in the case's files before the commit, identically for both.
//!
//! A difference is a failure unless [`DOCUMENTED`] lists it (with the reason it is deliberate);
//! the summary is written to `target/real/oracle.txt`.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

/// Cases the oracle cannot play yet, and why (each one is said in the summary).
const NOT_PLAYED: &[(&str, &str)] = &[
    (
        "helm-oci",
        "an OCI Helm repository needs a registry Argo CD can pull from with TLS or an `enableOCI` repository Secret; the ground's OCI double speaks plain HTTP",
    ),
    (
        "error-unknown-revision",
        "it asks the gate for a revision the repository lacks (`gate render --revision`); Argo CD has no such input",
    ),
    (
        "kustomize-helm-charts",
        "kustomize v5.6.0 (the one the pinned kubectl embeds, built for the repo-server) runs `helm version -c`, which the pinned helm v4 no longer has; Argo CD v3.2 ships helm v3",
    ),
];

/// An AppProject sync window that is always open and denies every sync: the oracle compares
/// renders, and an Application with automated sync would otherwise apply its children (an
/// app-of-apps) on its own, racing the oracle and outliving its case.
static NO_SYNC: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    json!([{"kind": "deny", "schedule": "* * * * *", "duration": "24h",
            "applications": ["*"], "manualSync": false}])
});

/// Differences that are deliberate, each with its reason: (case, a substring of the difference,
/// why), for that case only. Anything else the oracle finds fails the test. One more, in every
/// case, is matched whole by `version_difference`.
const DOCUMENTED: &[(&str, &str, &str)] = &[
    (
        "error-cycle",
        "the gate refuses (error: Application argocd/app-a: app-of-apps cycle",
        "deliberate: Argo CD creates both Applications and each then manages the other; the gate fails closed on a cycle instead of rendering it without end",
    ),
    (
        "error-unknown-destination",
        "cluster \"https://staging.example.test\" not found",
        "deliberate: Argo CD generates the Application and cannot render it; the gate lists it with no objects and `gate check`'s destination-unknown rule decides",
    ),
];

/// Why Argo CD refuses each case both sides refuse (substrings of its error, any one of them: a
/// case with several faults sees Argo CD name whichever it met first): "both refuse" passes only
/// for a reason the case is about, not for a repo-server hiccup or a timeout.
const REFUSALS: &[(&str, &[&str])] = &[
    (
        "error-appset-without-template",
        &["spec.template: Required value"],
    ),
    (
        "error-duplicate-names",
        &["contains applications with duplicate name"],
    ),
    (
        "error-generated-application-refused",
        &[
            "is invalid: metadata.name",
            "which does not exist",
            "both name and server",
        ],
    ),
    (
        "error-generator-template-incomplete",
        &["template.spec: Required value"],
    ),
    ("error-helm-failure", &["failed to execute helm template"]),
    ("error-malformed-yaml", &["malformed YAML"]),
    ("error-missing-chart", &["error fetching chart"]),
    (
        "error-template-source-no-repourl",
        &["template.spec.source.repoURL: Required value"],
    ),
    (
        "error-unsupported-generator",
        &["error listing pull requests"],
    ),
    (
        "gen-list-nonstring-fasttemplate",
        &["error parsing value as string"],
    ),
    ("gen-matrix-key-clash", &["found duplicate key"]),
    (
        "gen-merge-duplicate-base",
        &["were not unique by the given mergeKeys"],
    ),
    ("gotemplate-missingkey-error", &["map has no entry for key"]),
    ("gotemplate-refused-functions", &["getHostByName"]),
];

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.email=oracle@example.test",
            "-c",
            "user.name=oracle",
        ])
        .args(args)
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?} in {}", dir.display());
}

/// A cluster of the case's inventory, in either of the forms the gate reads.
#[derive(Clone, Debug)]
struct Cluster {
    name: String,
    server: String,
    project: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The gate's own annotations say what the oracle states from the real server instead.
fn without_gate_annotations(mut map: BTreeMap<String, String>) -> BTreeMap<String, String> {
    map.retain(|k, _| !k.starts_with("gitops-gate.io/"));
    map
}

fn read_inventory(path: &Path) -> Vec<Cluster> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(path).unwrap();
    let documents = gitops_loop::yaml::parse_documents(&text, "inventory").unwrap();
    let mut clusters = Vec::new();
    for document in documents {
        if let Some(list) = document.get("clusters").and_then(Value::as_array) {
            for c in list {
                clusters.push(Cluster {
                    name: c["name"].as_str().unwrap().to_string(),
                    server: c["server"].as_str().unwrap().to_string(),
                    project: c["project"].as_str().unwrap_or("").to_string(),
                    labels: string_map(c.get("labels")),
                    annotations: without_gate_annotations(string_map(c.get("annotations"))),
                });
            }
            continue;
        }
        let items = if document["kind"] == "List" {
            document["items"].as_array().cloned().unwrap_or_default()
        } else {
            vec![document]
        };
        for secret in items {
            let mut labels = string_map(secret.pointer("/metadata/labels"));
            if labels.remove("argocd.argoproj.io/secret-type").as_deref() != Some("cluster") {
                continue;
            }
            let field = |key: &str| -> Option<String> {
                if let Some(s) = secret.pointer(&format!("/stringData/{key}")) {
                    return s.as_str().map(str::to_string);
                }
                let encoded = secret.pointer(&format!("/data/{key}"))?.as_str()?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .ok()?;
                String::from_utf8(bytes).ok()
            };
            let server = field("server").unwrap();
            clusters.push(Cluster {
                name: field("name").unwrap_or_else(|| server.clone()),
                server,
                project: field("project").unwrap_or_default(),
                labels,
                annotations: without_gate_annotations(string_map(
                    secret.pointer("/metadata/annotations"),
                )),
            });
        }
    }
    clusters
}

/// A TCP forwarder on a loopback port of its own to `target` (TLS passes through untouched).
async fn forwarder(target: std::net::SocketAddr) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    port
}

/// What the real API server serves, as Argo CD hands it to helm: `group/version` and
/// `group/version/Kind` (`v1`, `v1/Pod` for the core group).
async fn discovery(client: &kube::Client) -> Vec<String> {
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let mut out = BTreeSet::new();
    for group in discovery.groups() {
        for version in group.versions() {
            let gv = if group.name().is_empty() {
                version.to_string()
            } else {
                format!("{}/{version}", group.name())
            };
            out.insert(gv.clone());
            for (resource, _) in group.versioned_resources(version) {
                out.insert(format!("{gv}/{}", resource.kind));
            }
        }
    }
    out.into_iter().collect()
}

fn argo_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        api_version: "argoproj.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Every place two JSON values differ, each as a path and both sides: one difference must not
/// hide another (a documented one least of all).
fn differences(path: &str, gate: &Value, argo: &Value, out: &mut Vec<String>) {
    match (gate, argo) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                differences(
                    &format!("{path}.{k}"),
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if gate == argo => {}
        _ => out.push(format!(
            "{path}: gate {} | Argo CD {}",
            clip(&gate.to_string()),
            clip(&argo.to_string())
        )),
    }
}

fn clip(text: &str) -> String {
    if text.chars().count() > 160 {
        format!("{}…", text.chars().take(160).collect::<String>())
    } else {
        text.to_string()
    }
}

/// An Application as both sides are compared: metadata that says what Argo CD generated
/// (name, namespace, labels, annotations, finalizers) and the spec; empty maps and lists as
/// absent.
fn application_view(app: &Value) -> Value {
    let mut metadata = serde_json::Map::new();
    for key in ["name", "namespace", "labels", "annotations", "finalizers"] {
        if let Some(v) = app.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.into(), v.clone());
        }
    }
    // What a sync adds to the Applications it applies (an app-of-apps' children), not what
    // the repository renders.
    if let Some(annotations) = metadata
        .get_mut("annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("argocd.argoproj.io/tracking-id");
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    prune(json!({"metadata": metadata, "spec": app.get("spec").cloned().unwrap_or(Value::Null)}))
}

fn prune(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, prune(v)))
                .filter(|(_, v)| {
                    !(v.is_null()
                        || v.as_object().is_some_and(|m| m.is_empty())
                        || v.as_array().is_some_and(|a| a.is_empty()))
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(prune).collect()),
        other => other,
    }
}

/// An object as both sides are compared: Argo CD's tracking annotation removed (the
/// repo-server adds it; the gate renders what the repository says), and a Secret's data left
/// out (the API server masks it).
fn object_view(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(annotations) = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("argocd.argoproj.io/tracking-id");
    }
    if object["kind"] == "Secret"
        && object["apiVersion"] == "v1"
        && let Some(map) = object.as_object_mut()
    {
        map.remove("data");
        map.remove("stringData");
    }
    prune(object)
}

fn object_key(object: &Value) -> String {
    format!(
        "{} {} {}/{}",
        object["apiVersion"].as_str().unwrap_or(""),
        object["kind"].as_str().unwrap_or(""),
        object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(""),
        object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    )
}

/// Argo CD's view of one case: the Applications it made (by name) with their manifests, or
/// why it refused.
#[derive(Debug, Default)]
struct ArgoSide {
    applications: BTreeMap<String, Value>,
    manifests: BTreeMap<String, Vec<Value>>,
    errors: Vec<String>,
}

struct Oracle {
    real: common::real::Real,
    client: kube::Client,
    http: reqwest::Client,
    /// The admin's session token (the API server runs with authentication on).
    token: String,
    api: String,
    namespace: String,
    kubectl: PathBuf,
    api_server: std::net::SocketAddr,
    cert_data: String,
    key_data: String,
    ca_data: String,
    kube_version: String,
    api_versions: Vec<String>,
}

impl Oracle {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write as _;
        let mut child = Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.real.kubeconfig().display()))
            .arg("--request-timeout=60s")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        } else {
            drop(child.stdin.take());
        }
        let output = child.wait_with_output().unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
        }
    }

    /// Removes every Application, ApplicationSet and cluster Secret a case left.
    async fn clean(&self) {
        let apps: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &argo_resource("Application", "applications"),
        );
        let sets: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &argo_resource("ApplicationSet", "applicationsets"),
        );
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.client.clone(), &self.namespace);
        for set in sets.list(&ListParams::default()).await.unwrap().items {
            let name = set.metadata.name.clone().unwrap();
            let _ = sets
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
        }
        let _ = sets
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = apps.list(&ListParams::default()).await.unwrap();
            for app in &list.items {
                let name = app.metadata.name.clone().unwrap();
                let _ = apps
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
                let _ = apps.delete(&name, &DeleteParams::default()).await;
            }
            let remaining = apps.list(&ListParams::default()).await.unwrap().items.len()
                + sets.list(&ListParams::default()).await.unwrap().items.len();
            if remaining == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Applications or ApplicationSets of a case outlive 60s of deletion"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = secrets
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("argocd.argoproj.io/secret-type=cluster"),
            )
            .await;
        let projects: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &argo_resource("AppProject", "appprojects"),
        );
        let _ = projects
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("oracle.gitops-loop.dev/case=true"),
            )
            .await;
    }

    /// The cluster Secret Argo CD reads for `cluster`, reaching the real API server at `server`.
    fn cluster_secret(&self, cluster: &Cluster, server: &str, index: usize) -> Value {
        let mut labels = cluster.labels.clone();
        labels.insert("argocd.argoproj.io/secret-type".into(), "cluster".into());
        let config = json!({"tlsClientConfig": {
            "certData": self.cert_data, "keyData": self.key_data, "caData": self.ca_data}});
        let mut data =
            json!({"name": cluster.name, "server": server, "config": config.to_string()});
        if !cluster.project.is_empty() {
            data["project"] = cluster.project.clone().into();
        }
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": format!("oracle-cluster-{index}"), "namespace": self.namespace,
                         "labels": labels, "annotations": cluster.annotations},
            "stringData": data,
        })
    }

    /// The same clusters for the gate: the project's inventory form, with the version and API
    /// groups the real API server serves (what Argo CD discovers and hands to helm).
    fn gate_inventory(&self, clusters: &[(Cluster, String)]) -> Value {
        let version = &self.kube_version;
        json!({
            "defaults": {"kubeVersion": version, "apiVersions": self.api_versions},
            "clusters": clusters.iter().map(|(c, server)| json!({
                "name": c.name, "server": server, "project": c.project,
                "labels": c.labels, "annotations": c.annotations,
                "kubeVersion": version, "apiVersions": self.api_versions,
            })).collect::<Vec<_>>(),
        })
    }

    /// The AppProjects the case's Applications name (the clusters' projects, every literal
    /// `spec.project` of a root, and the projects of the Applications the gate generated): a
    /// project is cluster state, not something the repository declares, so the oracle gives
    /// Argo CD what the gate assumes, that they exist. An Application the gate gives a wrong
    /// project still differs in its spec. Each allows everything, like `default`.
    fn projects(&self, clusters: &[(Cluster, String)], roots: &[Value], generated: &[String]) {
        let mut names: BTreeSet<String> = clusters
            .iter()
            .map(|(c, _)| c.project.clone())
            .filter(|p| !p.is_empty())
            .collect();
        for root in roots {
            for pointer in ["/spec/project", "/spec/template/spec/project"] {
                if let Some(project) = root.pointer(pointer).and_then(Value::as_str)
                    && !project.contains("{{")
                {
                    names.insert(project.to_string());
                }
            }
        }
        names.extend(generated.iter().filter(|p| !p.is_empty()).cloned());
        names.remove("default");
        for name in names {
            let project = json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {"oracle.gitops-loop.dev/case": "true"}},
                "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                         "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
                         "syncWindows": NO_SYNC.clone()},
            });
            self.kubectl(&["apply", "-f", "-"], Some(&project.to_string()))
                .unwrap_or_else(|e| panic!("AppProject {name}: {e}"));
        }
    }

    async fn wait_for_sets(&self, errors: &mut Vec<String>) {
        let sets: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &argo_resource("ApplicationSet", "applicationsets"),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = sets.list(&ListParams::default()).await.unwrap();
            let mut pending = Vec::new();
            let mut failed = Vec::new();
            for set in &list.items {
                let name = set.metadata.name.clone().unwrap_or_default();
                let conditions = set.data["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let condition = |kind: &str| {
                    conditions
                        .iter()
                        .find(|c| c["type"] == kind && c["status"] == "True")
                        .cloned()
                };
                if let Some(error) = condition("ErrorOccurred") {
                    failed.push(format!(
                        "ApplicationSet {name}: {}: {}",
                        error["reason"].as_str().unwrap_or(""),
                        error["message"].as_str().unwrap_or("")
                    ));
                } else if condition("ResourcesUpToDate").is_none() {
                    pending.push(name);
                }
            }
            if pending.is_empty() {
                errors.extend(failed);
                return;
            }
            if Instant::now() > deadline {
                errors.push(format!(
                    "ApplicationSets {pending:?} had no condition after 60s; the controller's log:\n{}",
                    self.real.log_tail("argocd-applicationset-controller")
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates Argo CD objects as a client without field validation would (the API server
    /// prunes fields its schema does not declare, which the gate models; kubectl's default
    /// strict validation would refuse them instead), and without the last-applied annotation
    /// `kubectl apply` adds. An object created before (an app-of-apps child that is also a
    /// file of the repository) is left as it is.
    fn apply(&self, objects: &[Value], errors: &mut Vec<String>) {
        for object in objects {
            let mut object = object.clone();
            if object.pointer("/metadata/namespace").is_none() {
                object["metadata"]["namespace"] = self.namespace.clone().into();
            }
            if let Err(e) = self.kubectl(
                &["create", "--validate=false", "-f", "-"],
                Some(&object.to_string()),
            ) && !e.contains("AlreadyExists")
            {
                errors.push(format!(
                    "the API server refuses {} {}: {e}",
                    object["kind"].as_str().unwrap_or(""),
                    object
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ));
            }
        }
    }

    async fn manifests(&self, name: &str) -> Result<Vec<Value>, String> {
        let url = format!(
            "{}/api/v1/applications/{name}/manifests?appNamespace={}&noCache=true",
            self.api, self.namespace
        );
        // The API server reads Applications from its informer, which may not have seen one
        // created a moment ago: a NotFound is asked again until a deadline, not a refusal.
        let deadline = Instant::now() + Duration::from_secs(20);
        let body = loop {
            let response = self
                .http
                .get(&url)
                .bearer_auth(&self.token)
                .send()
                .await
                .map_err(|e| format!("Application {name}: {e}"))?;
            let status = response.status();
            let body: Value = response
                .json()
                .await
                .map_err(|e| format!("Application {name}: {e}"))?;
            if status.is_success() {
                break body;
            }
            if status == reqwest::StatusCode::NOT_FOUND && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            return Err(format!(
                "Application {name}: {}",
                body["message"].as_str().unwrap_or(&body.to_string())
            ));
        };
        body["manifests"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| {
                m.as_str()
                    .and_then(|s| serde_json::from_str(s).ok())
                    .ok_or_else(|| format!("Application {name}: a manifest that is not JSON: {m}"))
            })
            .collect()
    }

    /// Plays the repository's root objects on Argo CD, follows app-of-apps as a sync would
    /// (an Application's manifests that are Argo CD objects are applied too), and reads every
    /// Application and its manifests.
    async fn argo_side(&self, roots: Vec<Value>) -> ArgoSide {
        let mut side = ArgoSide::default();
        let apps: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &argo_resource("Application", "applications"),
        );
        self.apply(&roots, &mut side.errors);
        for _depth in 0..8 {
            self.wait_for_sets(&mut side.errors).await;
            let list = apps.list(&ListParams::default()).await.unwrap();
            let mut children = Vec::new();
            for app in list.items {
                let name = app.metadata.name.clone().unwrap();
                if side.applications.contains_key(&name) {
                    continue;
                }
                let value = serde_json::to_value(&app).unwrap();
                side.applications.insert(name.clone(), value);
                match self.manifests(&name).await {
                    Ok(manifests) => {
                        children.extend(
                            manifests
                                .iter()
                                .filter(|m| {
                                    m["apiVersion"]
                                        .as_str()
                                        .is_some_and(|v| v.starts_with("argoproj.io/"))
                                        && (m["kind"] == "Application"
                                            || m["kind"] == "ApplicationSet")
                                })
                                .map(|m| {
                                    let mut m = m.clone();
                                    if let Some(a) = m
                                        .pointer_mut("/metadata/annotations")
                                        .and_then(Value::as_object_mut)
                                    {
                                        a.remove("argocd.argoproj.io/tracking-id");
                                    }
                                    m
                                }),
                        );
                        side.manifests.insert(name, manifests);
                    }
                    Err(e) => side.errors.push(e),
                }
            }
            if children.is_empty() {
                break;
            }
            self.apply(&children, &mut side.errors);
        }
        side
    }
}

/// The repository's Argo CD objects, found as the gate finds its roots: every YAML file
/// outside hidden folders and chart folders.
fn roots(repo: &Path) -> (Vec<Value>, Vec<String>) {
    fn walk(dir: &Path, out: &mut Vec<Value>, errors: &mut Vec<String>) {
        if dir.join("Chart.yaml").exists() {
            return;
        }
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                walk(&path, out, errors);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                if !text.contains("argoproj.io") {
                    continue;
                }
                let documents = match gitops_loop::yaml::parse_documents(&text, &name) {
                    Ok(documents) => documents,
                    Err(e) => {
                        errors.push(format!(
                            "kubectl refuses {}: malformed YAML at line {}",
                            path.display(),
                            e.line
                        ));
                        continue;
                    }
                };
                out.extend(documents.into_iter().filter(|d| {
                    d["apiVersion"]
                        .as_str()
                        .is_some_and(|v| v.starts_with("argoproj.io/"))
                        && (d["kind"] == "Application" || d["kind"] == "ApplicationSet")
                }));
            }
        }
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    walk(repo, &mut out, &mut errors);
    (out, errors)
}

/// One thing to play: a repository (its layers laid over each other: content, then an
/// overlay with `*.delete` markers), the clusters, the gate's extra arguments and the URLs its
/// files write that the oracle serves.
struct OracleCase {
    name: String,
    layers: Vec<PathBuf>,
    inventory: Option<PathBuf>,
    args: Vec<String>,
    revision: Option<String>,
    /// The repository URL the files write (rewritten to the `file://` repository).
    repo_url: String,
    /// (URL the files write, the chart repository double serving it).
    chart_repo: (String, String),
    /// The gate's chart mirror (the double's charts under its URL's key, and any other
    /// repository the files name under its own).
    mirror: PathBuf,
}

impl OracleCase {
    fn render_case(dir: &Path, chart_repo: &str, mirror: &Path) -> OracleCase {
        let case: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
                .unwrap();
        OracleCase {
            name: dir.file_name().unwrap().to_string_lossy().to_string(),
            layers: vec![dir.join("repo")],
            inventory: Some(dir.join("inventory.yaml")).filter(|p| p.exists()),
            args: case["args"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            revision: case["revision"].as_str().map(str::to_string),
            repo_url: "https://git.example.test/cases/repo.git".into(),
            chart_repo: (
                "https://charts.example.test/cases".into(),
                chart_repo.to_string(),
            ),
            mirror: mirror.to_path_buf(),
        }
    }
}

/// `from` laid over `to`: files copied with each rewrite applied to their text, `NAME.delete`
/// removing NAME.
fn overlay(from: &Path, to: &Path, rewrites: &[(String, String)]) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(original) = name.strip_suffix(".delete") {
            let _ = std::fs::remove_file(to.join(original));
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            overlay(&entry.path(), &target, rewrites);
        } else {
            copy_rewritten_file(&entry.path(), &target, rewrites);
        }
    }
}

fn copy_rewritten_file(from: &Path, to: &Path, rewrites: &[(String, String)]) {
    let bytes = std::fs::read(from).unwrap();
    match String::from_utf8(bytes) {
        Ok(mut text) => {
            for (old, new) in rewrites {
                text = text.replace(old.as_str(), new);
            }
            std::fs::write(to, text).unwrap();
        }
        Err(e) => std::fs::write(to, e.into_bytes()).unwrap(),
    }
}

/// One case: both sides played, compared; the differences (empty when they agree) and a line
/// for the summary.
async fn play(oracle: &Oracle, case: &OracleCase) -> (Vec<String>, String) {
    oracle.clean().await;
    let name = case.name.clone();
    let work = tempfile::Builder::new()
        .prefix("oracle-")
        .tempdir()
        .unwrap();
    let repo = work.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let repo_url = format!("file://{}", repo.display());
    let mut rewrites = vec![
        (case.repo_url.clone(), repo_url.clone()),
        case.chart_repo.clone(),
    ];
    let clusters = case
        .inventory
        .as_deref()
        .map(read_inventory)
        .unwrap_or_default();
    let mut served = Vec::new();
    for cluster in &clusters {
        let server = if cluster.server == "https://kubernetes.default.svc" {
            cluster.server.clone()
        } else {
            let port = forwarder(oracle.api_server).await;
            let url = format!("https://127.0.0.1:{port}");
            rewrites.push((cluster.server.clone(), url.clone()));
            url
        };
        served.push((cluster.clone(), server));
    }
    // Longer URLs first, so that one URL that begins another is not rewritten inside it.
    rewrites.sort_by_key(|(old, _)| std::cmp::Reverse(old.len()));
    for layer in &case.layers {
        overlay(layer, &repo, &rewrites);
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "case"]);

    // The gate.
    let inventory = work.path().join("inventory.json");
    std::fs::write(&inventory, oracle.gate_inventory(&served).to_string()).unwrap();
    let cache = work.path().join("cache");
    let mut gate = common::gate(&cache);
    gate.args(["--quiet", "render", "--format", "json", "--no-cache"])
        .arg("--repo")
        .arg(&repo)
        .arg("--repo-url")
        .arg(&repo_url)
        .arg("--charts")
        .arg(&case.mirror)
        .arg("--inventory")
        .arg(&inventory);
    let kustomize_helm = case.args.iter().any(|a| a == "--kustomize-enable-helm");
    if kustomize_helm {
        gate.arg("--kustomize-enable-helm");
    }
    if let Some(revision) = &case.revision {
        gate.arg("--revision").arg(revision);
        // Argo CD reads the same revision: the roots name it in their targetRevision already.
    }
    let output = gate.output().unwrap();
    let gate_refuses = !output.status.success();
    let mut gate_out: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    let gate_errors: Vec<String> = gate_out["diagnostics"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|d| d["severity"] == "error")
        .map(|d| {
            format!(
                "{}: {}",
                d["subject"].as_str().unwrap_or(""),
                d["message"].as_str().unwrap_or("")
            )
        })
        .chain(
            gate_refuses
                .then(|| String::from_utf8_lossy(&output.stderr).trim().to_string())
                .filter(|s| !s.is_empty()),
        )
        .collect();

    // The ground's Argo CD double renders with the gate's engine under its own configuration
    // (ground::argocd::render_config, what the ground wires from a scenario): on the sample,
    // its render must be the gate's, which the comparison below holds to real Argo CD's.
    let mut double_differences = Vec::new();
    if case.name.starts_with("sample as") {
        let head = String::from_utf8(
            Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["rev-parse", "HEAD"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let inventory_text = std::fs::read_to_string(&inventory).unwrap();
        let config = ground::argocd::render_config(
            repo.clone(),
            repo_url.clone(),
            gitops_loop::render::inventory::Inventory::parse(
                &inventory_text,
                &inventory.display().to_string(),
            )
            .unwrap(),
            case.mirror.clone(),
            &common::project_root().join("target/tools"),
            work.path().join("double-cache"),
        );
        match gitops_loop::render::render(&config, head.trim()) {
            Ok(rendering) => {
                let mut out = Vec::new();
                gitops_loop::render::output::write_json(&rendering, &mut out).unwrap();
                let double: Value = serde_json::from_slice(&out).unwrap();
                differences(
                    "the ground's Argo CD double vs the gate:",
                    &double["applications"],
                    &gate_out["applications"],
                    &mut double_differences,
                );
            }
            Err(failure) => double_differences.push(format!(
                "the ground's Argo CD double refuses what the gate renders: {failure}"
            )),
        }
    }

    // Argo CD.
    // Argo CD.
    let cm = json!({"data": {"kustomize.buildOptions": if kustomize_helm { "--enable-helm" } else { "" }}});
    oracle
        .kubectl(
            &[
                "-n",
                &oracle.namespace,
                "patch",
                "configmap",
                "argocd-cm",
                "--type=merge",
                "-p",
                &cm.to_string(),
            ],
            None,
        )
        .unwrap();
    let secrets: Vec<Value> = served
        .iter()
        .enumerate()
        .map(|(i, (c, server))| oracle.cluster_secret(c, server, i))
        .collect();
    let mut setup_errors = Vec::new();
    oracle.apply(&secrets, &mut setup_errors);
    assert!(
        setup_errors.is_empty(),
        "{name}: cluster Secrets: {setup_errors:?}"
    );
    let (objects, refused) = roots(&repo);
    let generated_projects: Vec<String> = gate_out["applications"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["project"].as_str().map(str::to_string))
        .collect();
    oracle.projects(&served, &objects, &generated_projects);
    let mut argo = oracle.argo_side(objects).await;
    argo.errors.extend(refused);
    // Applications whose chart comes from an OCI Helm repository are left out on both sides
    // (see NOT_PLAYED's helm-oci), and said in the summary.
    let oci: BTreeSet<String> = gate_out["applications"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|app| {
            app["sources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|source| {
                    // Argo CD's OCI Helm form: `oci://…`, or a registry host and path with no
                    // scheme (`registry.example.test/charts`); not an empty, scp-like or
                    // unexpanded URL, which the comparison must see.
                    let url = source["repoURL"].as_str().unwrap_or("");
                    url.starts_with("oci://")
                        || (!url.contains("://")
                            && !url.is_empty()
                            && !url.starts_with('/')
                            && !url.contains('@')
                            && !url.contains("{{")
                            && url.split('/').next().is_some_and(|host| host.contains('.')))
                })
        })
        .filter_map(|app| app["name"].as_str().map(str::to_string))
        .collect();
    if let Some(apps) = gate_out["applications"].as_array_mut() {
        apps.retain(|app| !oci.contains(app["name"].as_str().unwrap_or("")));
    }
    argo.applications.retain(|name, _| !oci.contains(name));
    argo.manifests.retain(|name, _| !oci.contains(name));
    argo.errors.retain(|e| {
        !oci.iter()
            .any(|name| e.starts_with(&format!("Application {name}:")))
    });
    let argo_refuses = !argo.errors.is_empty();

    let mut differences = double_differences;
    let line = match (gate_refuses, argo_refuses) {
        (true, true) => {
            let argo_errors = argo.errors.join("; ");
            match REFUSALS.iter().find(|(c, _)| *c == name) {
                Some((_, why)) if why.iter().any(|w| argo_errors.contains(w)) => {}
                Some((_, why)) => differences.push(format!(
                    "both refuse, but Argo CD not for the case's reason ({why:?}): {argo_errors}"
                )),
                None => differences.push(format!(
                    "both refuse, and REFUSALS says no reason for this case: {argo_errors}"
                )),
            }
            format!(
                "{name}: both refuse (gate: {}; Argo CD: {})",
                clip(&gate_errors.join("; ")),
                clip(&argo_errors)
            )
        }
        (true, false) => {
            differences.push(format!(
                "the gate refuses ({}) but Argo CD generates {} Applications",
                gate_errors.join("; "),
                argo.applications.len()
            ));
            format!("{name}: DIFFERENT")
        }
        (false, true) => {
            differences.push(format!(
                "Argo CD refuses ({}) but the gate renders",
                argo.errors.join("; ")
            ));
            format!("{name}: DIFFERENT")
        }
        (false, false) => {
            let gate_apps: BTreeMap<String, &Value> = gate_out["applications"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|app| (app["name"].as_str().unwrap_or("").to_string(), app))
                        .collect()
                })
                .unwrap_or_default();
            let gate_names: BTreeSet<&String> = gate_apps.keys().collect();
            let argo_names: BTreeSet<&String> = argo.applications.keys().collect();
            if gate_names != argo_names {
                differences.push(format!(
                    "Applications: gate {gate_names:?} | Argo CD {argo_names:?}"
                ));
            }
            let mut objects = 0;
            for (app, gate_app) in &gate_apps {
                let Some(argo_app) = argo.applications.get(app) else {
                    continue;
                };
                self::differences(
                    &format!("Application {app}"),
                    &application_view(&gate_app["application"]),
                    &application_view(argo_app),
                    &mut differences,
                );
                let gate_objects: BTreeMap<String, Value> = gate_app["objects"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|o| (object_key(o), object_view(o)))
                    .collect();
                let argo_objects: BTreeMap<String, Value> = argo
                    .manifests
                    .get(app)
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|o| (object_key(o), object_view(o)))
                    .collect();
                objects += argo_objects.len();
                let gate_keys: BTreeSet<&String> = gate_objects.keys().collect();
                let argo_keys: BTreeSet<&String> = argo_objects.keys().collect();
                if gate_keys != argo_keys {
                    differences.push(format!(
                        "Application {app} objects: only the gate {:?} | only Argo CD {:?}",
                        gate_keys.difference(&argo_keys).collect::<Vec<_>>(),
                        argo_keys.difference(&gate_keys).collect::<Vec<_>>()
                    ));
                }
                for (key, gate_object) in &gate_objects {
                    if let Some(argo_object) = argo_objects.get(key) {
                        self::differences(
                            &format!("Application {app} {key}"),
                            gate_object,
                            argo_object,
                            &mut differences,
                        );
                    }
                }
            }
            if differences.is_empty() {
                format!(
                    "{name}: agree ({} Applications, {objects} objects{})",
                    argo.applications.len(),
                    if oci.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; not compared, charts from an OCI repository: {}",
                            oci.iter().cloned().collect::<Vec<_>>().join(", ")
                        )
                    }
                )
            } else {
                format!("{name}: DIFFERENT")
            }
        }
    };
    (differences, line)
}

/// A generated matrix of ApplicationSets, one case each: every generator the gate expands
/// (list, clusters with selectors, git files, git directories, matrix, merge), in both
/// template modes, with a generator-level template, a templatePatch,
/// ignoreApplicationDifferences, preserveResourcesOnDeletion and goTemplateOptions.
fn generated_cases(work: &Path, chart_repo: &str, mirror: &Path) -> Vec<OracleCase> {
    let repo_url = "https://git.example.test/generated/repo.git";
    let base = work.join("generated-base");
    for (path, text) in [
        (
            "services/api/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: api\ndata:\n  role: api\n",
        ),
        (
            "services/web/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  role: web\n",
        ),
        (
            "config/envs/dev.json",
            r#"{"env": "dev", "size": {"replicas": "1"}}"#,
        ),
        (
            "config/envs/prod.json",
            r#"{"env": "prod", "size": {"replicas": "3"}}"#,
        ),
    ] {
        let at = base.join(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, text).unwrap();
    }
    let inventory = work.join("generated-inventory.yaml");
    std::fs::write(
        &inventory,
        "clusters:\n\
         - {name: prod-a, server: https://prod-a.example.test, labels: {env: prod, region: eu}, annotations: {team: core}}\n\
         - {name: prod-b, server: https://prod-b.example.test, labels: {env: prod, region: us}}\n\
         - {name: dev-a, server: https://dev-a.example.test, labels: {env: dev, region: eu}}\n",
    )
    .unwrap();
    // A parameter as each mode writes it.
    let p = |go: bool, name: &str| {
        if go {
            format!("{{{{.{name}}}}}")
        } else {
            format!("{{{{{name}}}}}")
        }
    };
    let source = |path: &str| json!({"repoURL": repo_url, "targetRevision": "HEAD", "path": path});
    let mut sets: Vec<(String, Value)> = Vec::new();
    for go in [false, true] {
        let mode = if go { "go" } else { "fast" };
        let spec = |generators: Value, name: String, path: String, server: String, extra: Value| {
            let mut spec = json!({
                "generators": generators,
                "template": {
                    "metadata": {"name": name},
                    "spec": {"project": "default", "source": source(&path),
                             "destination": {"server": server, "namespace": "generated"}},
                },
            });
            if go {
                spec["goTemplate"] = true.into();
            }
            if let (Value::Object(spec), Value::Object(extra)) = (&mut spec, extra) {
                spec.extend(extra);
            }
            spec
        };
        let in_cluster = "https://kubernetes.default.svc".to_string();
        let list = json!([{"list": {"elements": [{"svc": "api", "env": "dev"}, {"svc": "web", "env": "prod"}]}}]);
        sets.push((
            format!("list-{mode}"),
            spec(
                list.clone(),
                format!("{}-{}-list-{mode}", p(go, "svc"), p(go, "env")),
                format!("services/{}", p(go, "svc")),
                in_cluster.clone(),
                json!({}),
            ),
        ));
        sets.push((
            format!("clusters-{mode}"),
            spec(
                json!([{"clusters": {"selector": {"matchLabels": {"env": "prod"}}}}]),
                format!("c-{}-{mode}", p(go, "name")),
                "services/api".into(),
                p(go, "server"),
                json!({}),
            ),
        ));
        sets.push((format!("clusters-expressions-{mode}"), spec(
            json!([{"clusters": {"selector": {"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]},
                                  "values": {"tier": "std"}}}]),
            format!("ce-{}-{}-{mode}", p(go, "name"), if go { "{{.values.tier}}".to_string() } else { "{{values.tier}}".to_string() }),
            "services/web".into(), p(go, "server"), json!({}))));
        sets.push((format!("git-files-{mode}"), spec(
            json!([{"git": {"repoURL": repo_url, "revision": "HEAD", "files": [{"path": "config/envs/*.json"}]}}]),
            format!("gf-{}-{}-{mode}", p(go, "env"), if go { "{{.size.replicas}}".to_string() } else { "{{size.replicas}}".to_string() }),
            "services/api".into(), in_cluster.clone(), json!({}))));
        let basename = if go {
            "{{.path.basename}}"
        } else {
            "{{path.basename}}"
        };
        let dir_path = if go { "{{.path.path}}" } else { "{{path}}" };
        sets.push((format!("git-directories-{mode}"), spec(
            json!([{"git": {"repoURL": repo_url, "revision": "HEAD", "directories": [{"path": "services/*"}]}}]),
            format!("gd-{basename}-{mode}"), dir_path.into(), in_cluster.clone(), json!({}))));
        sets.push((format!("matrix-{mode}"), spec(
            json!([{"matrix": {"generators": [
                {"git": {"repoURL": repo_url, "revision": "HEAD", "directories": [{"path": "services/*"}]}},
                {"clusters": {"selector": {"matchLabels": {"region": "eu"}}}}]}}]),
            format!("m-{basename}-{}-{mode}", p(go, "name")), dir_path.into(), p(go, "server"), json!({}))));
        let mut merged = spec(
            json!([{"merge": {"mergeKeys": ["name"], "generators": [
                {"clusters": {"values": {"note": "base"}}},
                {"list": {"elements": [{"name": "prod-a", "values.note": "override"}]}}]}}]),
            format!("mg-{}-{mode}", p(go, "name")),
            "services/web".into(),
            p(go, "server"),
            json!({}),
        );
        merged["template"]["metadata"]["annotations"] =
            json!({"note": if go { "{{.values.note}}" } else { "{{values.note}}" }});
        sets.push((format!("merge-{mode}"), merged));
        let mut overridden = spec(
            json!([{"list": {"elements": [{"svc": "api"}],
                "template": {"metadata": {"name": format!("override-{}-{mode}", p(go, "svc"))},
                             "spec": {"project": "default",
                                      "destination": {"server": in_cluster, "namespace": "override"}}}}},
                   {"list": {"elements": [{"svc": "web"}]}}]),
            format!("plain-{}-{mode}", p(go, "svc")),
            format!("services/{}", p(go, "svc")),
            in_cluster.clone(),
            json!({"ignoreApplicationDifferences": [{"jsonPointers": ["/spec/source/targetRevision"]}]}),
        );
        overridden["syncPolicy"] = json!({"preserveResourcesOnDeletion": true});
        sets.push((format!("generator-template-{mode}"), overridden));
        if go {
            sets.push(("template-patch-go".into(), spec(list.clone(),
                "tp-{{.svc}}-{{.env}}".into(), "services/{{.svc}}".into(), in_cluster.clone(),
                json!({
                    "goTemplateOptions": ["missingkey=error"],
                    "templatePatch": "metadata:\n  labels:\n    env: '{{.env}}'\n{{- if eq .env \"prod\" }}\nspec:\n  syncPolicy:\n    automated: {}\n{{- end }}\n",
                }))));
        }
    }
    sets.into_iter()
        .map(|(name, spec)| {
            let dir = work.join(format!("generated-{name}"));
            let appset = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
                                "metadata": {"name": name, "namespace": "argocd"}, "spec": spec});
            std::fs::create_dir_all(dir.join("apps")).unwrap();
            std::fs::write(dir.join("apps/appset.yaml"), appset.to_string()).unwrap();
            OracleCase {
                name: format!("generated {name}"),
                layers: vec![base.clone(), dir],
                inventory: Some(inventory.clone()),
                args: Vec::new(),
                revision: None,
                repo_url: repo_url.into(),
                chart_repo: (
                    "https://charts.example.test/cases".into(),
                    chart_repo.to_string(),
                ),
                mirror: mirror.to_path_buf(),
            }
        })
        .collect()
}

/// A chart repository double at `alias` serving the charts of `sources` (later ones add
/// versions), and the gate's mirror: those charts under the double's URL key, and each
/// `(key, folder)` of `others`. Returns the double's URL and the mirror.
async fn chart_double(
    doubles: &mut Vec<ground::charts::ChartRepositoryDouble>,
    alias: &str,
    sources: &[PathBuf],
    others: &[(String, PathBuf)],
    helm: &Path,
    work: &Path,
) -> (String, PathBuf) {
    let merged = work.join("charts");
    std::fs::create_dir_all(&merged).unwrap();
    for source in sources.iter().filter(|s| s.exists()) {
        overlay(source, &merged, &[]);
    }
    let double = ground::charts::ChartRepositoryDouble::start(alias, &merged, helm, &[])
        .await
        .unwrap();
    let url = double.url();
    doubles.push(double);
    let mirror = work.join("mirror");
    let key = mirror.join(gitops_loop::render::charts::repo_key(&url));
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&merged, &key).unwrap();
    for (other, folder) in others {
        let at = mirror.join(other);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        if !at.exists() {
            std::os::unix::fs::symlink(folder, &at).unwrap();
        }
    }
    (url, mirror)
}

/// The distinct first commits of the scenarios (`repository.content` with its `overlay`, and
/// the scenario's chart versions), each once, named by the scenarios that start there.
async fn sample_cases(
    root: &Path,
    doubles: &mut Vec<ground::charts::ChartRepositoryDouble>,
    helm: &Path,
    work: &Path,
) -> Vec<OracleCase> {
    let scenarios = root.join("scenarios");
    let mut starts: BTreeMap<(Vec<PathBuf>, Option<PathBuf>), Vec<String>> = BTreeMap::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&scenarios)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("scenario.yaml").exists())
        .collect();
    names.sort();
    for dir in names {
        let scenario: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join("scenario.yaml")).unwrap())
                .unwrap();
        let at = |p: &str| dir.join(p).canonicalize().unwrap();
        let Some(content) = scenario
            .pointer("/repository/content")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let mut layers = vec![at(content)];
        if let Some(o) = scenario
            .pointer("/repository/overlay")
            .and_then(Value::as_str)
        {
            layers.push(at(o));
        }
        let charts = scenario
            .pointer("/charts/overlay")
            .and_then(Value::as_str)
            .map(at);
        starts
            .entry((layers, charts))
            .or_default()
            .push(dir.file_name().unwrap().to_string_lossy().to_string());
    }
    let sample = scenarios.join("sample");
    let mut cases = Vec::new();
    for (index, ((layers, charts), scenarios)) in starts.into_iter().enumerate() {
        let stable = "charts.example.test/stable";
        let mut sources = vec![sample.join("charts").join(stable)];
        let mut others = vec![(
            "registry.example.test".to_string(),
            sample.join("charts/registry.example.test"),
        )];
        if let Some(charts) = &charts {
            sources.push(charts.join(stable));
            if charts.join("registry.example.test").exists() {
                others.insert(
                    0,
                    (
                        "registry.example.test".to_string(),
                        charts.join("registry.example.test"),
                    ),
                );
            }
        }
        let (url, mirror) = chart_double(
            doubles,
            "https://charts.example.test/stable",
            &sources,
            &others,
            helm,
            &work.join(format!("sample-{index}")),
        )
        .await;
        cases.push(OracleCase {
            name: format!("sample as {} start it", scenarios.join(", ")),
            layers,
            inventory: Some(sample.join("inventory.yaml")),
            args: Vec::new(),
            revision: None,
            repo_url: "https://git.example.test/platform/gitops.git".into(),
            chart_repo: ("https://charts.example.test/stable".into(), url),
            mirror,
        });
    }
    cases
}

/// The one difference every case may show, matched whole (values included) at any path, so it
/// hides nothing else: Argo CD v3.2 hands helm the server's `major.minor` (gitops-engine's
/// GetServerVersion before v3.5), so a chart reading `.Capabilities.KubeVersion.Version` sees
/// `v1.34`; v3.5, which the gate follows, hands it `major.minor.patch` (`v1.34.4`).
fn version_difference(difference: &str, kube_version: &str) -> bool {
    let minor: Vec<&str> = kube_version.split('.').take(2).collect();
    difference.ends_with(&format!(
        ": gate \"v{kube_version}\" | Argo CD \"v{}\"",
        minor.join(".")
    ))
}

/// Runs its closure when dropped, a panic's unwinding included.
struct Restore<F: FnMut()>(F);

impl<F: FnMut()> Drop for Restore<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Logs in as `admin` with the password Argo CD's API server made on its first start.
async fn login(
    client: &kube::Client,
    http: &reqwest::Client,
    api: &str,
    namespace: &str,
) -> String {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get("argocd-initial-admin-secret")
        .await
        .expect("Argo CD's API server made its admin password");
    let password = secret
        .data
        .and_then(|d| d.get("password").cloned())
        .expect("argocd-initial-admin-secret has a password");
    let password = String::from_utf8(password.0).expect("the password is text");
    let response = http
        .post(format!("{api}/api/v1/session"))
        .json(&json!({"username": "admin", "password": password}))
        .send()
        .await
        .expect("Argo CD's API answers");
    let status = response.status();
    let body: Value = response.json().await.expect("the session answer is JSON");
    assert!(status.is_success(), "log in to Argo CD: {status} {body}");
    body["token"].as_str().expect("a session token").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_renders_what_argo_cd_renders() {
    let Some(real) = common::real::real("the_gate_renders_what_argo_cd_renders") else {
        return;
    };
    let argocd = real
        .state
        .argocd
        .clone()
        .expect("the process cluster runs Argo CD (cargo xtask real build builds it)");
    let client = real.client().await;
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(real.kubeconfig()).unwrap()).unwrap();
    let read = |key: &str, p: &str| -> String {
        use base64::Engine as _;
        let path = config
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{key}"));
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
    };
    let cert_data = read("cert", "/users/0/user/client-certificate");
    let key_data = read("key", "/users/0/user/client-key");
    let ca_data = read("ca", "/clusters/0/cluster/certificate-authority");
    let server_url = real.state.server.clone();
    let api_server: std::net::SocketAddr =
        server_url.trim_start_matches("https://").parse().unwrap();
    let version = client.apiserver_version().await.unwrap();
    let kube_version = version.git_version.trim_start_matches('v').to_string();
    let api_versions = discovery(&client).await;
    let root = common::project_root();
    // Every call has a deadline: a stuck repo-server fails the case, not the CI job's limit.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let token = login(&client, &http, &argocd.api, &argocd.namespace).await;
    let oracle = Oracle {
        http,
        token,
        api: argocd.api.clone(),
        namespace: argocd.namespace.clone(),
        kubectl: root.join("target/tools/kubectl"),
        api_server,
        cert_data,
        key_data,
        ca_data,
        kube_version,
        api_versions,
        client,
        real,
    };

    // The render cases' chart repository, served by the ground's double (the real helm
    // packages and indexes it); the gate reads the same charts from a mirror keyed by its URL.
    let helm = root.join("target/tools/helm");
    let scratch = tempfile::tempdir().unwrap();
    let mut doubles = Vec::new();
    let mut cases: Vec<OracleCase> = Vec::new();
    let render_cases = root.join("tests/render-cases");
    let (chart_url, mirror) = chart_double(
        &mut doubles,
        "https://charts.example.test/cases",
        &[render_cases.join("_charts/charts.example.test/cases")],
        &[],
        &helm,
        &scratch.path().join("render-cases"),
    )
    .await;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&render_cases)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.yaml").exists())
        .collect();
    dirs.sort();
    cases.extend(
        dirs.iter()
            .map(|d| OracleCase::render_case(d, &chart_url, &mirror)),
    );
    cases.extend(generated_cases(scratch.path(), &chart_url, &mirror));
    // The sample repository as every scenario starts it: its content with the scenario's
    // overlay, its inventory, and its chart repository with the scenario's own chart versions.
    cases.extend(sample_cases(&root, &mut doubles, &helm, scratch.path()).await);
    for (name, _) in NOT_PLAYED {
        assert!(
            cases.iter().any(|c| c.name == *name),
            "NOT_PLAYED names {name}, which is no case"
        );
    }
    for (name, _) in REFUSALS {
        assert!(
            cases.iter().any(|c| c.name == *name),
            "REFUSALS names {name}, which is no case"
        );
    }
    for (name, _, _) in DOCUMENTED {
        assert!(
            cases.iter().any(|c| c.name == *name),
            "DOCUMENTED names {name}, which is no case"
        );
    }
    let only = std::env::var("ORACLE_CASE").ok();
    if let Some(only) = &only {
        cases.retain(|c| c.name.starts_with(only.as_str()));
        assert!(!cases.is_empty(), "ORACLE_CASE={only} matches no case");
    }
    let mut summary = vec![format!(
        "The gate against Argo CD {} (process cluster, Kubernetes {}): {} cases",
        argocd.version,
        oracle.kube_version,
        cases.len()
    )];
    let window = |windows: &Value| json!({"spec": {"syncWindows": windows}}).to_string();
    let patch_default = |windows: &Value| {
        oracle.kubectl(
            &[
                "-n",
                &oracle.namespace,
                "patch",
                "appproject",
                "default",
                "--type=merge",
                "-p",
                &window(windows),
            ],
            None,
        )
    };
    patch_default(&NO_SYNC).expect("the default AppProject takes a sync window");
    // Whatever happens below (a panic included), the window goes again.
    let _restore = Restore(|| {
        let _ = patch_default(&Value::Null);
    });
    let mut failures = Vec::new();
    let started = Instant::now();
    for case in &cases {
        let name = case.name.clone();
        if let Some((_, why)) = NOT_PLAYED.iter().find(|(c, _)| *c == name) {
            summary.push(format!("{name}: not played ({why})"));
            continue;
        }
        let (differences, line) = play(&oracle, case).await;
        let index = summary.len();
        summary.push(line);
        let mut undocumented = 0;
        let mut versions = 0;
        for difference in differences {
            if version_difference(&difference, &oracle.kube_version) {
                versions += 1;
                continue;
            }
            match DOCUMENTED
                .iter()
                .find(|(c, what, _)| *c == name && difference.contains(what))
            {
                Some((_, _, why)) => summary.push(format!("  documented: {difference} ({why})")),
                None => {
                    summary.push(format!("  {difference}"));
                    failures.push(format!("{name}: {difference}"));
                    undocumented += 1;
                }
            }
        }
        if versions > 0 {
            summary.push(format!(
                "  documented: {versions} × .Capabilities.KubeVersion.Version v{} | v{} (see version_difference)",
                oracle.kube_version,
                oracle.kube_version.split('.').take(2).collect::<Vec<_>>().join(".")
            ));
        }
        if undocumented == 0 && summary[index].ends_with("DIFFERENT") {
            summary[index] = format!("{name}: agree but for documented differences");
        }
    }
    oracle.clean().await;
    summary.push(format!(
        "{} cases in {:.1}s",
        cases.len(),
        started.elapsed().as_secs_f64()
    ));
    let text = summary.join("\n");
    eprintln!("{text}");
    // A run narrowed by ORACLE_CASE leaves the whole run's summary alone.
    let file = if only.is_some() {
        "target/real/oracle-partial.txt"
    } else {
        "target/real/oracle.txt"
    };
    let _ = std::fs::write(root.join(file), format!("{text}\n"));
    assert!(
        failures.is_empty(),
        "the gate and Argo CD disagree on {} points:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
