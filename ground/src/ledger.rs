//! What a run did that anyone could see, with the tick it was first seen at: Freight,
//! Promotions and their phases, Stages' current Freight, Applications' sync and health, the
//! observer's Events, and on the forge pull requests and their heads, comments (by place and
//! author), labels, commit statuses and check runs. Two runs of one seed are compared on it
//! (`tests/demo.rs`).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::forge::ForgeDouble;
use crate::kube::KubeDouble;
use crate::kube::store::Selector;

/// Events in the order they were first seen: (tick, event).
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    seen: BTreeSet<String>,
    pub entries: Vec<(u64, String)>,
}

impl Ledger {
    /// Records what is visible now and was not before, at `tick`.
    pub fn record(
        &mut self,
        tick: u64,
        kube: &KubeDouble,
        forge: &ForgeDouble,
        project: &str,
        slug: &str,
    ) {
        let mut now: Vec<String> = visible_in_cluster(kube, project);
        now.extend(visible_on_forge(forge, slug));
        now.sort();
        for event in now {
            if self.seen.insert(event.clone()) {
                self.entries.push((tick, event));
            }
        }
    }
}

fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn visible_in_cluster(kube: &KubeDouble, project: &str) -> Vec<String> {
    let store = kube.store();
    let list = |group: &str, version: &str, plural: &str, namespace: &str| {
        store
            .resource(group, version, plural)
            .cloned()
            .map(|r| store.list(&r, namespace, &Selector::default(), &Selector::default()))
            .unwrap_or_default()
    };
    let (g, v) = (crate::kargo::GROUP, crate::kargo::VERSION);
    let mut out = Vec::new();
    for f in list(g, v, "freight", project) {
        out.push(format!("freight {}", text(&f, "/metadata/name")));
    }
    for p in list(g, v, "promotions", project) {
        let name = text(&p, "/metadata/name");
        out.push(format!(
            "promotion {name} of {} to {}",
            text(&p, "/spec/freight"),
            text(&p, "/spec/stage"),
        ));
        // An empty phase (created, not yet seen by Kargo) lasts less than a tick or not at
        // all, depending on when the observer's write lands: only phases Kargo set count.
        let phase = text(&p, "/status/phase");
        if !phase.is_empty() {
            out.push(format!("promotion {name}: {phase}"));
        }
    }
    for s in list(g, v, "stages", project) {
        let current = s
            .pointer("/status/freightHistory/0/items")
            .and_then(Value::as_object)
            .map(|items| {
                let names: Vec<&str> = items.values().map(|i| text(i, "/name")).collect();
                names.join(",")
            })
            .unwrap_or_default();
        out.push(format!("stage {} at {current}", text(&s, "/metadata/name")));
    }
    for a in list("argoproj.io", "v1alpha1", "applications", "") {
        out.push(format!(
            "application {}/{} {} at {} {}",
            text(&a, "/metadata/namespace"),
            text(&a, "/metadata/name"),
            text(&a, "/status/sync/status"),
            text(&a, "/status/sync/revision"),
            text(&a, "/status/health/status")
        ));
    }
    // Which of a Stage's Applications the observer names in an Event is whichever it
    // reconciled first (its reconciles run concurrently): the reason and note are what count.
    for e in list("events.k8s.io", "v1", "events", "") {
        out.push(format!(
            "event {}: {}",
            text(&e, "/reason"),
            text(&e, "/note")
        ));
    }
    out
}

fn visible_on_forge(forge: &ForgeDouble, slug: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (_, statuses, checks) = forge.audit(slug, "");
    for (sha, context, state) in statuses {
        out.push(format!("status {context} {state} on {sha}"));
    }
    for (sha, name) in checks {
        out.push(format!("check run {name} on {sha}"));
    }
    for (number, sha, branch) in forge.open_pulls(slug) {
        out.push(format!("pull request #{number} from {branch} at {sha}"));
        for label in forge.labels(slug, number) {
            out.push(format!("label {label} on #{number}"));
        }
        // A comment by its place and author, not its body: Bosun and the gate edit theirs in
        // place, and a body that lives between two edits may or may not meet a tick.
        for (place, (author, _)) in forge.comments(slug, number).into_iter().enumerate() {
            out.push(format!("comment {} on #{number} by {author}", place + 1));
        }
    }
    out
}
