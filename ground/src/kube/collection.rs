//! Collection reads: list pages with continue tokens, and watch streams with their faults.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::store::{ApiError, Event, Selector};
use crate::kube::{Inner, Target, faults, store};

pub(super) fn list(
    inner: &Inner,
    target: &Target,
    labels: &Selector,
    fields: &Selector,
    query: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let expired = || {
        ApiError::new(
            410,
            "Expired",
            "the provided continue parameter is too old or invalid",
        )
    };
    // The token is the last object's `namespace/name` (neither holds a slash).
    let after = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => Some(token.split_once('/').ok_or_else(expired)?),
        None => None,
    };
    let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
    let page = store.list_page(
        &target.resource,
        &target.namespace,
        labels,
        fields,
        after,
        limit,
    );
    let rv = store.resource_version();
    drop(store);
    let (page, following) = page.ok_or_else(expired)?;
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if following.more
        && let Some(last) = page.last()
    {
        metadata["continue"] = json!(continue_key(last));
        if let Some(count) = following.count {
            metadata["remainingItemCount"] = json!(count);
        }
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

pub(super) async fn watch(
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
    let options = WatchOptions::of(&query);
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(1024);
    // A resourceVersion the store has not reached: a watch that sends initial events fails
    // with 504 Timeout (as the API server, after waiting for it); a plain watch waits for it,
    // delivering nothing older.
    let too_large = {
        let store = inner.store.lock().unwrap_or_else(|p| p.into_inner());
        options
            .since
            .filter(|since| *since > store.resource_version())
            .map(|since| too_large_error(since, store.resource_version()))
    };
    if let (true, Some(error)) = (options.send_initial, &too_large) {
        let line = event_line("ERROR", &error.status());
        let _ = sender.send(Ok(line)).await;
        return stream_response(receiver);
    }
    let watcher = Watcher {
        inner,
        target,
        labels,
        fields,
        options,
        path,
    };
    let start = watcher.start();
    tokio::spawn(watcher.stream(start, sender));
    stream_response(receiver)
}

/// What a watch request asks for, read from its query.
struct WatchOptions {
    send_initial: bool,
    bookmarks: bool,
    timeout: Duration,
    /// The resourceVersion to start after (none: from now, after a list).
    since: Option<u64>,
}

impl WatchOptions {
    fn of(query: &BTreeMap<String, String>) -> WatchOptions {
        WatchOptions {
            send_initial: query.get("sendInitialEvents").map(String::as_str) == Some("true"),
            bookmarks: query.get("allowWatchBookmarks").map(String::as_str) == Some("true"),
            timeout: query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs)
                .unwrap_or(Duration::from_secs(1800)),
            since: query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0),
        }
    }
}

/// One open watch: what it watches and how.
struct Watcher {
    inner: Arc<Inner>,
    target: Target,
    labels: Selector,
    fields: Selector,
    options: WatchOptions,
    /// What its fault decisions are keyed by.
    path: String,
}

/// Where a watch starts: the events it sends first, the live subscription taken with them,
/// the resourceVersion they reach, or why it cannot start (410 Expired).
struct Start {
    initial: Vec<(&'static str, Value)>,
    live: tokio::sync::broadcast::Receiver<Event>,
    rv: u64,
    gone: Option<String>,
}

impl Watcher {
    /// Takes the starting point and subscribes under one lock, so no event falls in between.
    fn start(&self) -> Start {
        let (target, labels, fields) = (&self.target, &self.labels, &self.fields);
        let send_initial = self.options.send_initial;
        let store = self.inner.store.lock().unwrap_or_else(|p| p.into_inner());
        let live = store.subscribe();
        let rv = store.resource_version();
        let served_since = store.served_since(&target.resource);
        let (initial, gone) = match self.options.since {
            Some(_) if !send_initial && self.inner.faults.gone(&self.path) => {
                (Vec::new(), Some("too old resource version".to_string()))
            }
            Some(since) if !send_initial && since < served_since => (
                Vec::new(),
                Some(format!(
                    "too old resource version: {since} ({served_since})"
                )),
            ),
            Some(since) if !send_initial => match store.events_since(since) {
                Some(events) => (
                    events
                        .into_iter()
                        .filter(|e| matches_target(e, target, labels, fields))
                        .map(|e| (e.kind.as_str(), e.object))
                        .collect::<Vec<_>>(),
                    None,
                ),
                None => (Vec::new(), Some("too old resource version".to_string())),
            },
            _ => {
                let objects = store.list(&target.resource, &target.namespace, labels, fields);
                (objects.into_iter().map(|o| ("ADDED", o)).collect(), None)
            }
        };
        Start {
            initial,
            live,
            rv,
            gone,
        }
    }

    /// Sends the starting events, then each live event of the target (with bookmarks when
    /// asked, and the watch faults), until the timeout, the client leaves, or a fault ends it.
    async fn stream(
        self,
        start: Start,
        sender: tokio::sync::mpsc::Sender<Result<Bytes, Infallible>>,
    ) {
        let Start {
            initial,
            mut live,
            rv: start_rv,
            gone,
        } = start;
        let (target, labels, fields) = (&self.target, &self.labels, &self.fields);
        let floor = self.options.since.unwrap_or(0);
        if let Some(message) = gone {
            let error = ApiError::new(410, "Expired", message);
            let _ = sender.send(Ok(event_line("ERROR", &error.status()))).await;
            return;
        }
        for (kind, object) in initial {
            if sender.send(Ok(event_line(kind, &object))).await.is_err() {
                return;
            }
        }
        if self.options.send_initial {
            let _ = sender
                .send(Ok(event_line(
                    "BOOKMARK",
                    &bookmark(target, start_rv, true),
                )))
                .await;
        }
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let mut last_rv = start_rv;
        loop {
            let tick = tokio::time::sleep(Duration::from_millis(500));
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tick => {
                    if self.options.bookmarks && sender.send(Ok(event_line("BOOKMARK", &bookmark(target, last_rv, false)))).await.is_err() {
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
                    if event.rv <= floor || !matches_target(&event, target, labels, fields) {
                        continue;
                    }
                    match self.inner.faults.watch_event(
                        &self.path,
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
    }
}

fn stream_response(receiver: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The API server's answer to a resourceVersion it has not reached.
fn too_large_error(asked: u64, current: u64) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {asked}, current: {current}"),
    )
    .with_details(json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }))
}

/// What the API server refuses in a list or watch's options before it serves it: initial
/// events without `resourceVersionMatch=NotOlderThan` (422), a list from a resourceVersion
/// the store has not reached (504).
pub(super) fn check_list_options(
    inner: &Inner,
    query: &BTreeMap<String, String>,
    is_watch: bool,
) -> Result<(), ApiError> {
    let rv_match = query.get("resourceVersionMatch").map(String::as_str);
    if is_watch
        && query.get("sendInitialEvents").map(String::as_str) == Some("true")
        && rv_match != Some("NotOlderThan")
    {
        let message =
            "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan";
        return Err(ApiError::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: {message}"),
        )
        .with_details(json!({
            "group": "meta.k8s.io", "kind": "ListOptions",
            "causes": [{"reason": "FieldValueForbidden", "message": message, "field": "resourceVersionMatch"}],
        })));
    }
    if !is_watch
        && rv_match != Some("Exact")
        && let Some(asked) = query
            .get("resourceVersion")
            .and_then(|v| v.parse::<u64>().ok())
    {
        let current = inner
            .store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resource_version();
        if asked > current {
            return Err(too_large_error(asked, current));
        }
    }
    Ok(())
}
