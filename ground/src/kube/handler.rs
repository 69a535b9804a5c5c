//! The double's HTTP face: authentication, faults, discovery, and routing a request to a verb.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::collection::{check_list_options, list, watch};
use super::schema::FieldValidation;
use super::store::{ApiError, PatchBody, Selector};
use crate::kube::store::{Store, User};
use crate::kube::{Inner, Target};

fn status_response(error: &ApiError) -> Response {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(error.status())).into_response()
}

fn json_response(value: Value) -> Response {
    axum::Json(value).into_response()
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

pub(super) async fn handle(
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
    let Some(user) = authenticate(&inner, &headers) else {
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
    if let Some(response) = discovery(&inner, &segments) {
        return response;
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
    let RequestOptions {
        labels,
        fields,
        content_type,
        validation,
    } = match RequestOptions::read(&query, &headers) {
        Ok(options) => options,
        Err(e) => return status_response(&e),
    };
    if method == Method::GET && target.name.is_none() {
        if let Err(e) = check_list_options(&inner, &query, is_watch) {
            return status_response(&e);
        }
        if is_watch {
            return watch(inner, target, labels, fields, query).await;
        }
    }
    let call = Call {
        inner: &inner,
        method: &method,
        path: &path,
        user: &user,
        target: &target,
        labels: &labels,
        fields: &fields,
        content_type: &content_type,
        validation,
        query: &query,
        body: &body,
    };
    let (result, created, warnings) = call.serve();
    answer(result, created, warnings)
}

/// One request to a resource's collection or one of its objects, as it was read.
#[derive(Clone, Copy)]
struct Call<'a> {
    inner: &'a Inner,
    method: &'a Method,
    path: &'a str,
    user: &'a User,
    target: &'a Target,
    labels: &'a Selector,
    fields: &'a Selector,
    content_type: &'a str,
    validation: FieldValidation,
    query: &'a BTreeMap<String, String>,
    body: &'a Bytes,
}

impl Call<'_> {
    /// The verb run against the store: the result, whether it created the object, and the
    /// warnings a write earned.
    fn serve(self) -> (Result<Value, ApiError>, bool, Vec<String>) {
        let Call {
            inner,
            method,
            path,
            user,
            target,
            labels,
            fields,
            content_type,
            validation,
            query,
            body,
        } = self;
        let store_lock = || inner.store.lock().unwrap_or_else(|p| p.into_inner());
        // A write runs under one lock with its request's fieldValidation, and takes the warnings
        // it earned.
        let write = |op: &mut dyn FnMut(&mut Store) -> Result<Value, ApiError>| {
            let mut store = store_lock();
            store.field_validation = Some(validation);
            store.warnings.clear();
            let result = op(&mut store);
            store.field_validation = None;
            (result, std::mem::take(&mut store.warnings))
        };
        let mut created = *method == Method::POST;
        let (result, warnings) = match (method, &target.name) {
            (&Method::GET, None) => (list(inner, target, labels, fields, query), Vec::new()),
            (&Method::GET, Some(name)) => (
                store_lock().get(&target.resource, &target.namespace, name),
                Vec::new(),
            ),
            (&Method::POST, None) => match parse_json(body) {
                Ok(object) => {
                    let mut object = Some(object);
                    write(&mut |store| {
                        store.create(
                            &target.resource,
                            &target.namespace,
                            object.take().unwrap_or_default(),
                            user,
                        )
                    })
                }
                Err(e) => (Err(e), Vec::new()),
            },
            (&Method::PUT, Some(name)) => match put_body(inner, body, name, path) {
                Ok(object) => {
                    let mut object = Some(object);
                    write(&mut |store| {
                        store.update(
                            &target.resource,
                            &target.namespace,
                            name,
                            object.take().unwrap_or_default(),
                            user,
                            target.status,
                        )
                    })
                }
                Err(e) => (Err(e), Vec::new()),
            },
            (&Method::PATCH, Some(name)) => match patch_body(body, content_type, query, target) {
                Ok(patch) => {
                    let mut patch = Some(patch);
                    write(&mut |store| match patch.take() {
                        Some(patch) => {
                            // An apply that creates the object answers 201, as a create does.
                            created = store
                                .get(&target.resource, &target.namespace, name)
                                .is_err();
                            store.patch(
                                &target.resource,
                                &target.namespace,
                                name,
                                patch,
                                user,
                                target.status,
                            )
                        }
                        None => Err(ApiError::new(
                            500,
                            "InternalError",
                            "the patch was taken twice",
                        )),
                    })
                }
                Err(e) => (Err(e), Vec::new()),
            },
            (&Method::DELETE, Some(name)) => (
                store_lock().delete(&target.resource, &target.namespace, name, user),
                Vec::new(),
            ),
            _ => (
                Err(ApiError::new(
                    405,
                    "MethodNotAllowed",
                    format!("{method} is not supported on {path}"),
                )),
                Vec::new(),
            ),
        };
        (result, created, warnings)
    }
}

/// What a request asks of a collection or an object besides its verb: the label and field
/// selectors, the body's content type, the field validation of a write.
struct RequestOptions {
    labels: Selector,
    fields: Selector,
    content_type: String,
    validation: FieldValidation,
}

impl RequestOptions {
    fn read(query: &BTreeMap<String, String>, headers: &HeaderMap) -> Result<Self, ApiError> {
        let labels = Selector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?;
        let fields = Selector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or(""))?;
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        let validation = FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?;
        Ok(RequestOptions {
            labels,
            fields,
            content_type,
            validation,
        })
    }
}

/// A verb's answer: the object (201 when the request created it) or the error's Status, with
/// the warnings the write earned as the API server words them: `299 - "<text>"`.
fn answer(result: Result<Value, ApiError>, created: bool, warnings: Vec<String>) -> Response {
    let mut response = match result {
        Ok(object) if created => (StatusCode::CREATED, axum::Json(object)).into_response(),
        Ok(object) => json_response(object),
        Err(e) => status_response(&e),
    };
    for warning in warnings {
        let text = format!("299 - \"{}\"", warning.replace('"', "\\\""));
        if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

/// The request's user: a bearer token names one; a request without one is anonymous (as with
/// the API server's default --anonymous-auth); an unknown token is refused (`None`). client-go
/// does not send bearer tokens over plain http, so kubectl against the double is anonymous.
fn authenticate(inner: &Inner, headers: &HeaderMap) -> Option<User> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match token {
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
    }
}

/// The answer to a discovery request (the version, API groups and their resources); `None`
/// for any other path.
fn discovery(inner: &Inner, segments: &[&str]) -> Option<Response> {
    let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
    match segments {
        ["version"] => Some(json_response(
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-ground", "platform": "linux/amd64"}),
        )),
        ["api"] => Some(json_response(
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        )),
        ["api", "v1"] => Some(json_response(discovery_resources(&store, "", "v1"))),
        ["apis"] => Some(json_response(group_list(&store))),
        ["apis", group] => {
            let list = group_list(&store);
            Some(
                match list["groups"]
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
                },
            )
        }
        ["apis", group, version] => {
            Some(json_response(discovery_resources(&store, group, version)))
        }
        _ => None,
    }
}

/// A PUT's object: valid JSON whose name (when it has one) is the URL's, unless a seeded
/// conflict answers first.
fn put_body(inner: &Inner, body: &Bytes, name: &str, path: &str) -> Result<Value, ApiError> {
    let object = parse_json(body)?;
    let body_name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(name);
    if body_name != name {
        return Err(ApiError::new(
            400,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        ));
    }
    if let Some(error) = inner.faults.conflict(path) {
        return Err(error);
    }
    Ok(object)
}

/// A PATCH's body as its content type says: a JSON patch, a server-side apply (with its
/// field manager), a merge patch, or a strategic merge patch on a built-in (served as a merge
/// patch: lists are replaced whole; a custom resource has no strategy and refuses it).
fn patch_body(
    body: &Bytes,
    content_type: &str,
    query: &BTreeMap<String, String>,
    target: &Target,
) -> Result<PatchBody, ApiError> {
    let patch = parse_json(body)?;
    if content_type.starts_with("application/json-patch+json") {
        Ok(PatchBody::Json(patch))
    } else if content_type.starts_with("application/apply-patch") {
        let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        };
        Ok(PatchBody::Apply {
            object: patch,
            manager: manager.clone(),
            force: query.get("force").is_some_and(|f| f == "true"),
        })
    } else if content_type.starts_with("application/merge-patch+json")
        || (content_type.starts_with("application/strategic-merge-patch+json")
            && !target.resource.custom)
    {
        Ok(PatchBody::Merge(patch))
    } else {
        Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ))
    }
}
