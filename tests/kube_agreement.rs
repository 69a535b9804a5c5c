//! Agreement tests: the ground's Kubernetes double (`ground::kube::KubeDouble`) checked against
//! the real kube-apiserver of the process cluster (`real/`, `cargo xtask real up`).
//!
//! Each behaviour is ONE async function of a `kube::Client` and a namespace that returns what a
//! client can observe (status code, reason, `details` and `details.causes`, warnings, the
//! resulting object's fields, watch events) as JSON. [`agree`] runs it on the double (always)
//! and, when the real tier is on (`GITOPS_LOOP_REAL=1`), on the real API server in a namespace
//! of its own, and asserts that both equal the expected value. A disagreement is fixed in the
//! double (`ground/src/kube/`); the test stays as its regression.
//!
//! The double is given the same upstream Kargo and Argo CD CRDs the process cluster installs,
//! read from the Go module cache (never copied into the repository). Without Go they cannot be
//! read: the behaviours that need them skip their double half and say so.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::future::Future;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use ground::kube::{FaultPlan, KubeDouble};
use http_body_util::BodyExt;
use serde_json::{Value, json};

const TOKEN: &str = "agreement-token";

/// The upstream CRD files the process cluster installs, from the Go module cache; Err says why
/// they cannot be read.
fn upstream_crds() -> &'static Result<Vec<PathBuf>, String> {
    static FILES: OnceLock<Result<Vec<PathBuf>, String>> = OnceLock::new();
    FILES.get_or_init(|| {
        if !real_cluster::go_present() {
            return Err("the Go toolchain is absent, so the upstream CRDs cannot be read".into());
        }
        let layout = real_cluster::Layout::new(&common::project_root());
        let kargo = real_cluster::module_dir(&layout, "kargo", "github.com/akuity/kargo")
            .map_err(|e| format!("{e:#}"))?
            .join("charts/kargo/resources/crds");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&kargo)
            .map_err(|e| format!("read {}: {e}", kargo.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let argocd = real_cluster::module_dir(&layout, "argocd", "github.com/argoproj/argo-cd/v3")
            .map_err(|e| format!("{e:#}"))?
            .join("manifests/crds");
        for name in [
            "application-crd.yaml",
            "applicationset-crd.yaml",
            "appproject-crd.yaml",
        ] {
            files.push(argocd.join(name));
        }
        Ok(files)
    })
}

/// Whether a behaviour reads the upstream Kargo / Argo CD custom resources.
#[derive(Clone, Copy, PartialEq)]
enum Crds {
    Upstream,
    None,
}

/// A double with the upstream CRDs (when `crds` asks for them) and a client of it, or None
/// (said on stderr) when they cannot be read.
async fn double(test: &str, crds: Crds) -> Option<(KubeDouble, kube::Client)> {
    gitops_loop::forge::github::install_crypto_provider();
    let double = KubeDouble::start(FaultPlan::none()).await.unwrap();
    double.add_user(TOKEN, "tester", &["system:masters"]);
    if crds == Crds::Upstream {
        match upstream_crds() {
            Ok(files) => {
                let loaded = double.load_crd_files(files).unwrap();
                assert_eq!(loaded, 12, "the upstream Kargo and Argo CD CRDs load");
            }
            Err(why) => {
                eprintln!("skipped the double half of {test}: {why}");
                return None;
            }
        }
    }
    let mut config = kube::Config::new(double.url().parse().unwrap());
    config.auth_info.token = Some(TOKEN.to_string().into());
    // The tests compare first answers: kube-rs would retry a 504 (and 429, 503) itself.
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    Some((double, client))
}

/// Runs `behaviour` on the double and, when the real tier is on, on the real API server, and
/// asserts that both answer `expected`.
async fn agree<F, Fut>(test: &str, crds: Crds, behaviour: F, expected: Value)
where
    F: Fn(kube::Client, String) -> Fut,
    Fut: Future<Output = Value>,
{
    let started = std::time::Instant::now();
    let mut answers = Vec::new();
    if let Some((_double, client)) = double(test, crds).await {
        let namespace = "agreement".to_string();
        create_namespace(&client, &namespace).await;
        answers.push(("the double", behaviour(client, namespace).await));
        eprintln!("{test}: the double answered in {:?}", started.elapsed());
    }
    if let Some(real) = common::real::real(test) {
        let started = std::time::Instant::now();
        let client = client_without_retries(&real).await;
        // Tests share one cluster and run in parallel: each gets a namespace of its own.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let namespace = format!("agree-{:x}-{}", nanos % 0xffff_ffff, std::process::id());
        create_namespace(&client, &namespace).await;
        let got = behaviour(client.clone(), namespace.clone()).await;
        let _ = call(
            &client,
            "DELETE",
            &format!("/api/v1/namespaces/{namespace}"),
            "",
            None,
        )
        .await;
        answers.push(("kube-apiserver", got));
        eprintln!("{test}: kube-apiserver answered in {:?}", started.elapsed());
    }
    // Both halves run before either is judged, so a failure shows both answers.
    for (who, got) in &answers {
        assert_eq!(
            got,
            &expected,
            "{who} disagrees with the expected answer for {test}:\n{}\nall answers: {}",
            serde_json::to_string_pretty(got).unwrap(),
            serde_json::to_string_pretty(
                &answers
                    .iter()
                    .map(|(w, a)| json!({"who": w, "answer": a}))
                    .collect::<Vec<_>>()
            )
            .unwrap()
        );
    }
}

/// An admin client of the process cluster that does not retry (as `Real::client` does for a
/// 504): the tests compare the server's first answer.
async fn client_without_retries(real: &common::real::Real) -> kube::Client {
    gitops_loop::forge::github::install_crypto_provider();
    let kubeconfig = kube::config::Kubeconfig::read_from(real.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

async fn create_namespace(client: &kube::Client, namespace: &str) {
    let reply = call(
        client,
        "POST",
        "/api/v1/namespaces",
        JSON,
        Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})),
    )
    .await;
    assert_eq!(reply.code, 201, "namespace {namespace}: {}", reply.body);
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

/// One HTTP answer.
struct Reply {
    code: u16,
    body: Value,
    /// The `Warning` headers' texts (`299 - "text"` unwrapped).
    warnings: Vec<String>,
}

fn request(
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<Value>,
) -> http::Request<kube::client::Body> {
    let mut builder = http::Request::builder().method(method).uri(path);
    if !content_type.is_empty() {
        builder = builder.header("content-type", content_type);
    }
    let bytes = body
        .map(|b| serde_json::to_vec(&b).unwrap())
        .unwrap_or_default();
    builder.body(kube::client::Body::from(bytes)).unwrap()
}

async fn call(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<Value>,
) -> Reply {
    let response = client
        .send(request(method, path, content_type, body))
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            v.strip_prefix("299 - \"")
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v)
                .replace("\\\"", "\"")
        })
        .collect();
    let bytes = response.into_body().collect_bytes().await.unwrap();
    let body =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)));
    Reply {
        code,
        body,
        warnings,
    }
}

/// Opens a watch and reads its events until `enough` of them came, the server ends it
/// (`timeoutSeconds` in `query`), or `limit` passed. `during` runs once the request is sent
/// (the changes the watch should or should not see).
async fn watch<D, DFut>(
    client: &kube::Client,
    path: &str,
    query: &str,
    enough: usize,
    limit: Duration,
    during: D,
) -> Vec<Value>
where
    D: FnOnce() -> DFut,
    DFut: Future<Output = ()>,
{
    let uri = format!("{path}?watch=true&{query}");
    let response = client
        .send(request("GET", &uri, "", None))
        .await
        .unwrap_or_else(|e| panic!("watch {uri}: {e}"));
    if !response.status().is_success() {
        let bytes = response.into_body().collect_bytes().await.unwrap();
        return vec![
            json!({"type": "HTTP", "object": serde_json::from_slice::<Value>(&bytes).unwrap()}),
        ];
    }
    during().await;
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while events.len() < enough {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            _ => break,
        };
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if let Ok(event) = serde_json::from_slice::<Value>(&line) {
                events.push(event);
            }
        }
    }
    events
}

/// What a failure answer shows a client: code, reason, `details` without the causes, and the
/// causes sorted by field and message (the API server's order follows its schema walk).
fn failure(reply: &Reply) -> Value {
    failure_of(reply.code, &reply.body)
}

fn failure_of(code: u16, body: &Value) -> Value {
    let mut details = body.get("details").cloned().unwrap_or(Value::Null);
    let mut causes: Vec<Value> = details
        .get("causes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|c| json!({"field": c.get("field").cloned().unwrap_or(json!("")), "reason": c["reason"], "message": c["message"]}))
        .collect();
    causes.sort_by_key(|c| (c["field"].to_string(), c["message"].to_string()));
    if let Some(map) = details.as_object_mut() {
        map.remove("causes");
    }
    json!({"code": code, "reason": body["reason"], "details": details, "causes": causes})
}

fn text(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn warehouses(namespace: &str) -> String {
    format!("/apis/kargo.akuity.io/v1alpha1/namespaces/{namespace}/warehouses")
}

fn configmaps(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/configmaps")
}

fn warehouse(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Warehouse", "metadata": {"name": name}, "spec": spec})
}

fn git_subscription() -> Value {
    json!([{"git": {"repoURL": "https://git.example.com/app.git"}}])
}

// --- 409, 404 ---

async fn stale_update(client: kube::Client, ns: String) -> Value {
    let mut outcome = json!({});
    for (kind, collection, object) in [
        (
            "configmap",
            configmaps(&ns),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "1"}}),
        ),
        (
            "warehouse",
            warehouses(&ns),
            warehouse("w", json!({"subscriptions": git_subscription()})),
        ),
    ] {
        let created = call(&client, "POST", &collection, JSON, Some(object)).await;
        assert_eq!(created.code, 201, "{}", created.body);
        let name = text(&created.body, "/metadata/name");
        let mut first = created.body.clone();
        first["metadata"]["labels"] = json!({"step": "one"});
        let updated = call(
            &client,
            "PUT",
            &format!("{collection}/{name}"),
            JSON,
            Some(first),
        )
        .await;
        // The second writer still holds the first resourceVersion.
        let mut stale = created.body.clone();
        stale["metadata"]["labels"] = json!({"step": "two"});
        let refused = call(
            &client,
            "PUT",
            &format!("{collection}/{name}"),
            JSON,
            Some(stale),
        )
        .await;
        outcome[kind] = json!({
            "update": updated.code,
            "stale": failure(&refused),
            "message": text(&refused.body, "/message"),
        });
    }
    outcome
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_resource_version_update_is_409_conflict() {
    let expected = |kind: &str, group: Option<&str>, plural: &str, name: &str| {
        let mut details = json!({"name": name, "kind": plural});
        let mut qualified = plural.to_string();
        if let Some(group) = group {
            details["group"] = json!(group);
            qualified = format!("{plural}.{group}");
        }
        let _ = kind;
        json!({
            "update": 200,
            "stale": {"code": 409, "reason": "Conflict", "details": details, "causes": []},
            "message": format!("Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
        })
    };
    agree(
        "a_stale_resource_version_update_is_409_conflict",
        Crds::Upstream,
        stale_update,
        json!({
            "configmap": expected("configmap", None, "configmaps", "c"),
            "warehouse": expected("warehouse", Some("kargo.akuity.io"), "warehouses", "w"),
        }),
    )
    .await;
}

async fn missing(client: kube::Client, ns: String) -> Value {
    let cm = call(
        &client,
        "GET",
        &format!("{}/nope", configmaps(&ns)),
        "",
        None,
    )
    .await;
    let wh = call(
        &client,
        "GET",
        &format!("{}/nope", warehouses(&ns)),
        "",
        None,
    )
    .await;
    let patched = call(
        &client,
        "PATCH",
        &format!("{}/nope", warehouses(&ns)),
        MERGE,
        Some(json!({"spec": {"interval": "1m"}})),
    )
    .await;
    json!({
        "configmap": [failure(&cm), text(&cm.body, "/message")],
        "warehouse": [failure(&wh), text(&wh.body, "/message")],
        "patch": failure(&patched),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_object_is_404_not_found() {
    let not_found = |details: Value| json!({"code": 404, "reason": "NotFound", "details": details, "causes": []});
    agree(
        "a_missing_object_is_404_not_found",
        Crds::Upstream,
        missing,
        json!({
            "configmap": [not_found(json!({"name": "nope", "kind": "configmaps"})), "configmaps \"nope\" not found"],
            "warehouse": [not_found(json!({"name": "nope", "group": "kargo.akuity.io", "kind": "warehouses"})), "warehouses.kargo.akuity.io \"nope\" not found"],
            "patch": not_found(json!({"name": "nope", "group": "kargo.akuity.io", "kind": "warehouses"})),
        }),
    )
    .await;
}

// --- 422 Invalid: the structural schema and CEL rules of the upstream CRDs ---

async fn schema_violations(client: kube::Client, ns: String) -> Value {
    let broken = call(
        &client,
        "POST",
        &warehouses(&ns),
        JSON,
        Some(warehouse(
            "w",
            json!({"interval": "soon", "subscriptions": [], "freightCreationPolicy": "Sometimes"}),
        )),
    )
    .await;
    let required = call(
        &client,
        "POST",
        &warehouses(&ns),
        JSON,
        Some(warehouse("w", json!({"interval": "1m"}))),
    )
    .await;
    let typed = call(
        &client,
        "POST",
        &warehouses(&ns),
        JSON,
        Some(warehouse(
            "w",
            json!({"subscriptions": git_subscription(), "shard": ["a"]}),
        )),
    )
    .await;
    let badly_named = call(
        &client,
        "POST",
        &warehouses(&ns),
        JSON,
        Some(warehouse(
            "Bad_Name-",
            json!({"subscriptions": git_subscription()}),
        )),
    )
    .await;
    json!({
        "broken": failure(&broken),
        "message_starts": text(&broken.body, "/message").starts_with("Warehouse.kargo.akuity.io \"w\" is invalid: ["),
        "required": failure(&required),
        "typed": failure(&typed)["causes"],
        "badly_named": [failure(&badly_named), text(&badly_named.body, "/message")],
    })
}

const NAME_RULE: &str = "Invalid value: \"Bad_Name-\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_resource_breaking_the_upstream_schema_is_422_with_causes() {
    let details = json!({"name": "w", "group": "kargo.akuity.io", "kind": "Warehouse"});
    agree(
        "a_custom_resource_breaking_the_upstream_schema_is_422_with_causes",
        Crds::Upstream,
        schema_violations,
        json!({
            "broken": {"code": 422, "reason": "Invalid", "details": details, "causes": [
                {"field": "spec.freightCreationPolicy", "reason": "FieldValueNotSupported", "message": "Unsupported value: \"Sometimes\": supported values: \"Automatic\", \"Manual\""},
                {"field": "spec.interval", "reason": "FieldValueInvalid", "message": "Invalid value: \"soon\": spec.interval in body should match '^([0-9]+(\\.[0-9]+)?(s|m|h))+$'"},
                {"field": "spec.subscriptions", "reason": "FieldValueInvalid", "message": "Invalid value: 0: spec.subscriptions in body should have at least 1 items"},
            ]},
            "message_starts": true,
            "required": {"code": 422, "reason": "Invalid", "details": details, "causes": [
                {"field": "spec.subscriptions", "reason": "FieldValueRequired", "message": "Required value"},
            ]},
            "typed": [{"field": "spec.shard", "reason": "FieldValueTypeInvalid", "message": "Invalid value: \"array\": spec.shard in body must be of type string: \"array\""}],
            "badly_named": [
                {"code": 422, "reason": "Invalid", "details": {"name": "Bad_Name-", "group": "kargo.akuity.io", "kind": "Warehouse"}, "causes": [{"field": "metadata.name", "reason": "FieldValueInvalid", "message": NAME_RULE}]},
                format!("Warehouse.kargo.akuity.io \"Bad_Name-\" is invalid: metadata.name: {NAME_RULE}"),
            ],
        }),
    )
    .await;
}

async fn cel_rules(client: kube::Client, ns: String) -> Value {
    let promotions = format!("/apis/kargo.akuity.io/v1alpha1/namespaces/{ns}/promotions");
    let promotion = |spec: Value| json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Promotion", "metadata": {"name": "p"}, "spec": spec});
    // Kargo's rules: exactly one of freight or origin; a step uses a step kind, not a task.
    let broken = call(
        &client,
        "POST",
        &promotions,
        JSON,
        Some(promotion(
            json!({"stage": "test", "steps": [{"uses": "git-clone", "task": {"name": "t"}}]}),
        )),
    )
    .await;
    let fine = call(
        &client,
        "POST",
        &promotions,
        JSON,
        Some(promotion(
            json!({"stage": "test", "freight": "abc123", "steps": [{"uses": "git-clone"}]}),
        )),
    )
    .await;
    json!({"broken": failure(&broken), "fine": fine.code})
}

#[tokio::test(flavor = "multi_thread")]
async fn cel_validation_rules_of_the_upstream_crds_are_enforced() {
    agree(
        "cel_validation_rules_of_the_upstream_crds_are_enforced",
        Crds::Upstream,
        cel_rules,
        json!({
            "broken": {"code": 422, "reason": "Invalid", "details": {"name": "p", "group": "kargo.akuity.io", "kind": "Promotion"}, "causes": [
                {"field": "spec", "reason": "FieldValueInvalid", "message": "Invalid value: \"object\": exactly one of freight or origin must be set"},
                {"field": "spec.steps[0]", "reason": "FieldValueInvalid", "message": "Invalid value: \"object\": Promotion step must have uses set and must not reference a task"},
            ]},
            "fine": 201,
        }),
    )
    .await;
}

// --- pruning, defaults and fieldValidation ---

async fn pruning_defaults_and_field_validation(client: kube::Client, ns: String) -> Value {
    let with_unknown = |name: &str| {
        warehouse(
            name,
            json!({"subscriptions": git_subscription(), "unknownField": 1, "freightCreationCriteria": {"expression": "true", "extra": "x"}}),
        )
    };
    let mut outcome = json!({});
    for mode in ["Ignore", "Warn", "", "Strict"] {
        let name = format!(
            "w-{}",
            if mode.is_empty() { "default" } else { mode }.to_lowercase()
        );
        let query = if mode.is_empty() {
            String::new()
        } else {
            format!("?fieldValidation={mode}")
        };
        let reply = call(
            &client,
            "POST",
            &format!("{}{query}", warehouses(&ns)),
            JSON,
            Some(with_unknown(&name)),
        )
        .await;
        let mut warnings = reply.warnings.clone();
        warnings.sort();
        outcome[if mode.is_empty() { "default" } else { mode }] = if reply.code == 201 {
            json!({"code": reply.code, "spec": reply.body["spec"], "warnings": warnings})
        } else {
            json!({"code": reply.code, "reason": reply.body["reason"], "message": reply.body["message"], "warnings": warnings})
        };
    }
    outcome
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_fields_are_pruned_defaults_filled_and_field_validation_honoured() {
    let spec = json!({
        "subscriptions": git_subscription(),
        "freightCreationCriteria": {"expression": "true"},
        "freightCreationPolicy": "Automatic",
        "interval": "5m0s",
    });
    let warned = json!([
        "unknown field \"spec.freightCreationCriteria.extra\"",
        "unknown field \"spec.unknownField\"",
    ]);
    agree(
        "unknown_fields_are_pruned_defaults_filled_and_field_validation_honoured",
        Crds::Upstream,
        pruning_defaults_and_field_validation,
        json!({
            "Ignore": {"code": 201, "spec": spec, "warnings": []},
            "Warn": {"code": 201, "spec": spec, "warnings": warned},
            "default": {"code": 201, "spec": spec, "warnings": warned},
            "Strict": {"code": 400, "reason": "BadRequest", "warnings": [],
                "message": "Warehouse in version \"v1alpha1\" cannot be handled as a Warehouse: strict decoding error: unknown field \"spec.freightCreationCriteria.extra\", unknown field \"spec.unknownField\""},
        }),
    )
    .await;
}

// --- CRD versions ---

async fn stored_versions(client: kube::Client, ns: String) -> Value {
    let group = format!("{ns}.example.com");
    let name = format!("widgets.{group}");
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}})
    };
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let created = call(
        &client,
        "POST",
        crds,
        JSON,
        Some(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [version("v1", true)]}})),
    )
    .await;
    let path = format!("{crds}/{name}");
    // v2 replaces v1 outright: refused, v1 may still be persisted.
    let replaced = call(
        &client,
        "PATCH",
        &path,
        MERGE,
        Some(json!({"spec": {"versions": [version("v2", true)]}})),
    )
    .await;
    // v2 becomes the storage version beside v1: both are stored versions now.
    let added = call(
        &client,
        "PATCH",
        &path,
        MERGE,
        Some(json!({"spec": {"versions": [version("v1", false), version("v2", true)]}})),
    )
    .await;
    let dropped = call(
        &client,
        "PATCH",
        &path,
        MERGE,
        Some(json!({"spec": {"versions": [version("v2", true)]}})),
    )
    .await;
    let _ = call(&client, "DELETE", &path, "", None).await;
    let mut replaced_failure = failure(&replaced);
    replaced_failure["details"]["name"] = json!("<the CRD>");
    json!({
        "created": [created.code, created.body.pointer("/status/storedVersions")],
        "replaced": replaced_failure,
        "replaced_message": text(&replaced.body, "/message").replace(&name, "<the CRD>"),
        "added": [added.code, added.body.pointer("/status/storedVersions")],
        "dropped": failure(&dropped)["causes"],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crd_update_removing_a_stored_version_is_refused() {
    let cause = |i: usize, v: &str| {
        json!({"field": format!("status.storedVersions[{i}]"), "reason": "FieldValueInvalid",
            "message": format!("Invalid value: \"{v}\": missing from spec.versions; {v} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {v} and removes {v} from status.storedVersions")})
    };
    agree(
        "a_crd_update_removing_a_stored_version_is_refused",
        Crds::None,
        stored_versions,
        json!({
            "created": [201, ["v1"]],
            "replaced": {"code": 422, "reason": "Invalid",
                "details": {"name": "<the CRD>", "group": "apiextensions.k8s.io", "kind": "CustomResourceDefinition"},
                "causes": [cause(0, "v1")]},
            "replaced_message": format!("CustomResourceDefinition.apiextensions.k8s.io \"<the CRD>\" is invalid: {}: {}", "status.storedVersions[0]", cause(0, "v1")["message"].as_str().unwrap()),
            "added": [200, ["v1", "v2"]],
            "dropped": [cause(0, "v1")],
        }),
    )
    .await;
}

// --- server-side apply ---

async fn apply_ownership(client: kube::Client, ns: String) -> Value {
    let path = format!("{}/w", warehouses(&ns));
    let apply = |manager: &str, force: bool, interval: &str| {
        let path = path.clone();
        let client = client.clone();
        let manager = manager.to_string();
        let interval = interval.to_string();
        async move {
            let force = if force { "&force=true" } else { "" };
            let mut spec = json!({"interval": interval});
            if manager == "alice" {
                spec["subscriptions"] = git_subscription();
            }
            call(
                &client,
                "PATCH",
                &format!("{path}?fieldManager={manager}{force}"),
                APPLY,
                Some(warehouse("w", spec)),
            )
            .await
        }
    };
    let created = apply("alice", false, "1m").await;
    // The same value is no conflict: bob co-owns the field.
    let same = apply("bob", false, "1m").await;
    let conflict = apply("carol", false, "2m").await;
    let forced = apply("carol", true, "2m").await;
    let back = apply("alice", false, "3m").await;
    json!({
        "created": [created.code, created.body["spec"]["interval"]],
        "same": same.code,
        "conflict": [failure(&conflict), text(&conflict.body, "/message")],
        "forced": [forced.code, forced.body["spec"]["interval"]],
        "back": [failure(&back), text(&back.body, "/message")],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_owns_fields_conflicts_between_managers_and_force_takes_over() {
    let conflict = |managers: &[&str]| {
        let causes: Vec<Value> = managers
            .iter()
            .map(|m| json!({"field": ".spec.interval", "reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\"")}))
            .collect();
        json!({"code": 409, "reason": "Conflict", "details": {}, "causes": causes})
    };
    agree(
        "server_side_apply_owns_fields_conflicts_between_managers_and_force_takes_over",
        Crds::Upstream,
        apply_ownership,
        json!({
            "created": [201, "1m"],
            "same": 200,
            "conflict": [conflict(&["alice", "bob"]), "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.interval\nconflicts with \"bob\":\n- .spec.interval"],
            "forced": [200, "2m"],
            "back": [conflict(&["carol"]), "Apply failed with 1 conflict: conflict with \"carol\": .spec.interval"],
        }),
    )
    .await;
}

// --- merge patch and strategic merge patch ---

async fn patch_kinds(client: kube::Client, ns: String) -> Value {
    let path = format!("{}/w", warehouses(&ns));
    let created = call(
        &client,
        "POST",
        &warehouses(&ns),
        JSON,
        Some(warehouse(
            "w",
            json!({"subscriptions": [{"git": {"repoURL": "https://a.example.com/a.git"}}, {"git": {"repoURL": "https://b.example.com/b.git"}}]}),
        )),
    )
    .await;
    let strategic = call(
        &client,
        "PATCH",
        &path,
        STRATEGIC,
        Some(json!({"spec": {"interval": "3m"}})),
    )
    .await;
    // A merge patch replaces a list whole.
    let merged = call(
        &client,
        "PATCH",
        &path,
        MERGE,
        Some(json!({"spec": {"interval": "3m", "subscriptions": [{"git": {"repoURL": "https://c.example.com/c.git"}}]}})),
    )
    .await;
    // A built-in takes strategic merge.
    let cm = configmaps(&ns);
    call(
        &client,
        "POST",
        &cm,
        JSON,
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}})),
    )
    .await;
    let builtin = call(
        &client,
        "PATCH",
        &format!("{cm}/c"),
        STRATEGIC,
        Some(json!({"data": {"b": "2"}})),
    )
    .await;
    json!({
        "created": created.code,
        "strategic": [strategic.code, strategic.body["reason"], strategic.body["message"]],
        "merged": [merged.code, merged.body["spec"]["interval"], merged.body["spec"]["subscriptions"]],
        "builtin": [builtin.code, builtin.body["data"]],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_resource_takes_merge_patch_and_refuses_strategic_merge_with_415() {
    agree(
        "a_custom_resource_takes_merge_patch_and_refuses_strategic_merge_with_415",
        Crds::Upstream,
        patch_kinds,
        json!({
            "created": 201,
            "strategic": [415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"],
            "merged": [200, "3m", [{"git": {"repoURL": "https://c.example.com/c.git"}}]],
            "builtin": [200, {"a": "1", "b": "2"}],
        }),
    )
    .await;
}

// --- resourceVersions and watches ---

fn configmap(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"agreement": "yes"}}, "data": {"v": value}})
}

/// The test's own ConfigMaps (a real namespace also holds the controller-manager's
/// kube-root-ca.crt).
const OURS: &str = "labelSelector=agreement%3Dyes";

/// A watch event as compared: its type and object name (or, for an error, its status).
fn event_summary(event: &Value) -> Value {
    match event["type"].as_str() {
        Some("ERROR") | Some("HTTP") => {
            let code = event["object"]["code"].as_u64().unwrap_or(0) as u16;
            let mut failure = failure_of(code, &event["object"]);
            failure["type"] = event["type"].clone();
            failure["message_head"] = json!(
                text(&event["object"], "/message")
                    .split(" (")
                    .next()
                    .unwrap_or("")
                    .split(", current")
                    .next()
                    .unwrap_or("")
                    .to_string()
            );
            failure
        }
        _ => json!([
            event["type"],
            text(&event["object"], "/metadata/name"),
            text(&event["object"], "/data/v")
        ]),
    }
}

async fn watch_from_list_version(client: kube::Client, ns: String) -> Value {
    let cm = configmaps(&ns);
    call(&client, "POST", &cm, JSON, Some(configmap("before", "0"))).await;
    let list = call(&client, "GET", &format!("{cm}?{OURS}"), "", None).await;
    let rv = text(&list.body, "/metadata/resourceVersion");
    call(&client, "POST", &cm, JSON, Some(configmap("after", "1"))).await;
    call(
        &client,
        "PATCH",
        &format!("{cm}/after"),
        MERGE,
        Some(json!({"data": {"v": "2"}})),
    )
    .await;
    call(&client, "DELETE", &format!("{cm}/before"), "", None).await;
    let events = watch(
        &client,
        &cm,
        &format!("{OURS}&resourceVersion={rv}&timeoutSeconds=10"),
        3,
        Duration::from_secs(15),
        || async {},
    )
    .await;
    // A list at that version again is refused nowhere: it is not newer than the store.
    let relist = call(
        &client,
        "GET",
        &format!("{cm}?resourceVersion={rv}"),
        "",
        None,
    )
    .await;
    json!({
        "listed": list.body["items"].as_array().map(|i| i.len()),
        "events": events.iter().map(event_summary).collect::<Vec<_>>(),
        "relist": relist.code,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_from_a_list_resource_version_sees_the_later_changes_only() {
    agree(
        "a_watch_from_a_list_resource_version_sees_the_later_changes_only",
        Crds::None,
        watch_from_list_version,
        json!({
            "listed": 1,
            "events": [["ADDED", "after", "1"], ["MODIFIED", "after", "2"], ["DELETED", "before", "0"]],
            "relist": 200,
        }),
    )
    .await;
}

/// A page of a list: what follows it is counted (`remainingItemCount`) for a list without
/// selectors only; with a selector the server says only that more follow (the `continue`).
async fn remaining_count_of_a_page(client: kube::Client, ns: String) -> Value {
    let cm = configmaps(&ns);
    for name in ["a", "b", "c"] {
        call(&client, "POST", &cm, JSON, Some(configmap(name, "0"))).await;
    }
    let page = |query: String| {
        let client = client.clone();
        let cm = cm.clone();
        async move {
            let listed = call(&client, "GET", &format!("{cm}?{query}"), "", None).await;
            let metadata = &listed.body["metadata"];
            json!({
                "code": listed.code,
                "continue": metadata["continue"].as_str().is_some_and(|c| !c.is_empty()),
                "remainingItemCount": metadata["remainingItemCount"].is_u64(),
            })
        }
    };
    json!({
        "plain": page("limit=1".into()).await,
        "selected": page(format!("{OURS}&limit=1")).await,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_counts_what_follows_only_without_a_selector() {
    agree(
        "a_page_counts_what_follows_only_without_a_selector",
        Crds::None,
        remaining_count_of_a_page,
        json!({
            "plain": {"code": 200, "continue": true, "remainingItemCount": true},
            "selected": {"code": 200, "continue": true, "remainingItemCount": false},
        }),
    )
    .await;
}

async fn future_resource_version(client: kube::Client, ns: String) -> Value {
    let cm = configmaps(&ns);
    let list = call(&client, "GET", &cm, "", None).await;
    let rv: u64 = text(&list.body, "/metadata/resourceVersion")
        .parse()
        .unwrap();
    let future = rv + 1_000_000;
    let listed = call(
        &client,
        "GET",
        &format!("{cm}?resourceVersion={future}"),
        "",
        None,
    )
    .await;
    // A plain watch from there waits for it: the change made meanwhile is older, not shown.
    let plain = watch(
        &client,
        &cm,
        &format!("{OURS}&resourceVersion={future}&timeoutSeconds=3"),
        1,
        Duration::from_secs(8),
        || async {
            call(
                &client,
                "POST",
                &cm,
                JSON,
                Some(configmap("meanwhile", "1")),
            )
            .await;
        },
    )
    .await;
    let initial = watch(
        &client,
        &cm,
        &format!("resourceVersion={future}&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=10"),
        1,
        Duration::from_secs(15),
        || async {},
    )
    .await;
    json!({
        "list": {"failure": failure(&listed), "message_head": text(&listed.body, "/message").split(", current").next().unwrap_or("").to_string(),
            "retry": listed.body.pointer("/details/retryAfterSeconds")},
        "plain_watch": plain.iter().map(event_summary).collect::<Vec<_>>(),
        "initial_events_watch": initial.iter().map(event_summary).collect::<Vec<_>>(),
    })
    .to_string()
    .replace(&future.to_string(), "<future>")
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_version_the_server_has_not_reached_is_504_or_awaited() {
    let too_large = json!({"code": 504, "reason": "Timeout", "details": {"retryAfterSeconds": 1},
        "causes": [{"field": "", "reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]});
    let mut event = too_large.clone();
    event["type"] = json!("ERROR");
    event["message_head"] = json!("Timeout: Too large resource version: <future>");
    agree(
        "a_resource_version_the_server_has_not_reached_is_504_or_awaited",
        Crds::None,
        future_resource_version,
        json!({
            "list": {"failure": too_large, "message_head": "Timeout: Too large resource version: <future>", "retry": 1},
            "plain_watch": [],
            "initial_events_watch": [event],
        }),
    )
    .await;
}

async fn too_old_resource_version(client: kube::Client, ns: String) -> Value {
    // A custom resource's watch history starts when its CRD began to be served: resource
    // version 1 predates it on any server.
    let events = watch(
        &client,
        &warehouses(&ns),
        "resourceVersion=1&timeoutSeconds=5",
        1,
        Duration::from_secs(10),
        || async {},
    )
    .await;
    json!(events.iter().map(event_summary).collect::<Vec<_>>())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_from_before_the_kept_history_is_410_gone() {
    agree(
        "a_watch_from_before_the_kept_history_is_410_gone",
        Crds::Upstream,
        too_old_resource_version,
        json!([{"type": "ERROR", "code": 410, "reason": "Expired", "details": null, "causes": [],
            "message_head": "too old resource version: 1"}]),
    )
    .await;
}

async fn initial_events_and_bookmarks(client: kube::Client, ns: String) -> Value {
    let cm = configmaps(&ns);
    let mut last = String::new();
    for name in ["a", "b"] {
        let created = call(&client, "POST", &cm, JSON, Some(configmap(name, "1"))).await;
        last = text(&created.body, "/metadata/resourceVersion");
    }
    let refused = watch(
        &client,
        &cm,
        "sendInitialEvents=true&allowWatchBookmarks=true&timeoutSeconds=5",
        1,
        Duration::from_secs(10),
        || async {},
    )
    .await;
    let events = watch(
        &client,
        &cm,
        &format!("{OURS}&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=10"),
        3,
        Duration::from_secs(15),
        || async {},
    )
    .await;
    let bookmark = events.get(2).cloned().unwrap_or(Value::Null);
    let bookmark_rv: u64 = text(&bookmark, "/object/metadata/resourceVersion")
        .parse()
        .unwrap_or(0);
    // A periodic bookmark (the API server sends one about a minute into a watch): only
    // apiVersion, kind and metadata.resourceVersion.
    let periodic = watch(
        &client,
        &cm,
        &format!("{OURS}&resourceVersion={last}&allowWatchBookmarks=true&timeoutSeconds=90"),
        1,
        Duration::from_secs(95),
        || async {},
    )
    .await;
    let periodic = periodic.first().cloned().unwrap_or(Value::Null);
    let mut periodic_keys: Vec<String> = periodic["object"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    periodic_keys.sort();
    let mut metadata_keys: Vec<String> = periodic["object"]["metadata"]
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    metadata_keys.sort();
    json!({
        "without_match": refused.iter().map(event_summary).collect::<Vec<_>>(),
        "initial": events.iter().take(2).map(event_summary).collect::<Vec<_>>(),
        "end": [bookmark["type"], bookmark.pointer("/object/metadata/annotations"), bookmark_rv >= last.parse::<u64>().unwrap()],
        "periodic": [periodic["type"], periodic_keys, metadata_keys,
            text(&periodic, "/object/metadata/resourceVersion").parse::<u64>().unwrap_or(0) >= last.parse::<u64>().unwrap()],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_bookmarks_and_initial_events_end() {
    agree(
        "watch_bookmarks_and_initial_events_end",
        Crds::None,
        initial_events_and_bookmarks,
        json!({
            "without_match": [{"type": "HTTP", "code": 422, "reason": "Invalid",
                "details": {"group": "meta.k8s.io", "kind": "ListOptions"},
                "causes": [{"field": "resourceVersionMatch", "reason": "FieldValueForbidden", "message": "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"}],
                "message_head": "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"}],
            "initial": [["ADDED", "a", "1"], ["ADDED", "b", "1"]],
            "end": ["BOOKMARK", {"k8s.io/initial-events-end": "true"}, true],
            "periodic": ["BOOKMARK", ["apiVersion", "kind", "metadata"], ["resourceVersion"], true],
        }),
    )
    .await;
}
