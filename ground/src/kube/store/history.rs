//! The store's history: resourceVersions, the bounded event history and watch subscriptions.

use serde_json::Value;
use tokio::sync::broadcast;

use crate::kube::store::Store;
use crate::kube::store::resources::Resource;

/// How many events a watch can resume from; older resourceVersions answer 410 Gone.
pub const HISTORY: usize = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    /// `group/plural` of the object.
    pub resource: String,
    pub kind: EventType,
    pub object: Value,
}

impl Store {
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The oldest resourceVersion a watch may resume from.
    pub fn oldest_resumable(&self) -> u64 {
        let kept = self
            .history
            .front()
            .map(|e| e.rv.saturating_sub(1))
            .unwrap_or(self.rv);
        kept.max(self.compacted_below)
    }

    /// Events after `rv`, or None when they are no longer kept (410 Gone).
    pub fn events_since(&self, rv: u64) -> Option<Vec<Event>> {
        if rv < self.oldest_resumable() {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    pub(super) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    pub(super) fn record(&mut self, resource: &Resource, kind: EventType, object: Value) {
        let event = Event {
            rv: self.rv,
            resource: format!("{}/{}", resource.group, resource.plural),
            kind,
            object,
        };
        self.history.push_back(event.clone());
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        let _ = self.sender.send(event);
    }

    /// Forgets the event history (a compaction): older resourceVersions now answer 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_below = self.rv + 1;
    }
}
