//! The object store behind the Kubernetes API double: resource types, objects with
//! resourceVersions, a bounded event history for watches, label/field selectors, admission.

use crate::clock::Clock;
use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;
use tokio::sync::broadcast;

mod admission;
mod history;
mod objects;
mod patch;
mod resources;
mod selectors;

pub use self::admission::{Admission, AdmissionHook, Operation, StoreView, User};
pub use self::history::{Event, EventType, HISTORY};
pub use self::objects::{Following, ObjectKey};
pub use self::patch::PatchBody;
pub use self::resources::{ApiError, Resource};
pub use self::selectors::{Selector, labels_of};

pub struct Store {
    resources: Vec<Resource>,
    objects: BTreeMap<ObjectKey, Value>,
    rv: u64,
    history: VecDeque<Event>,
    sender: broadcast::Sender<Event>,
    hooks: Vec<(String, String, AdmissionHook)>,
    counter: u64,
    /// Resuming from a resourceVersion below this answers 410 Gone (set by `compact`).
    compacted_below: u64,
    /// Server-side apply's field ownership: object -> leaf path -> the field managers that
    /// applied it (several co-own a field they applied with the same value). A write that is
    /// not an apply gives up the ownership of the fields it changes.
    owners: BTreeMap<ObjectKey, BTreeMap<String, std::collections::BTreeSet<String>>>,
    /// The ground's one clock (creation timestamps).
    pub clock: Clock,
    /// The `fieldValidation` of the HTTP request being served (None for the ground's own
    /// writes, which prune silently), and the warnings it earned (`Warning` headers).
    pub(crate) field_validation: Option<crate::kube::schema::FieldValidation>,
    pub(crate) warnings: Vec<String>,
    /// group/plural -> the resourceVersion a custom resource began to be served at: its
    /// watch history starts there, so a watch from before it is 410 Gone (as the API
    /// server's watch cache, which starts with the CRD).
    served_since: BTreeMap<String, u64>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, Howard Hinnant).
pub fn rfc3339(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rem = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

impl Store {
    pub fn new() -> Store {
        let (sender, _) = broadcast::channel(8192);
        let mut store = Store {
            resources: Vec::new(),
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            sender,
            hooks: Vec::new(),
            counter: 0,
            compacted_below: 0,
            owners: BTreeMap::new(),
            clock: Clock::default(),
            field_validation: None,
            warnings: Vec::new(),
            served_since: BTreeMap::new(),
        };
        for resource in [
            Resource::builtin("", "v1", "Namespace", "namespaces", false),
            Resource::builtin("", "v1", "Secret", "secrets", true),
            Resource::builtin("", "v1", "ConfigMap", "configmaps", true),
            Resource::builtin("", "v1", "ServiceAccount", "serviceaccounts", true),
            Resource::builtin("", "v1", "Event", "events", true),
            Resource::builtin("events.k8s.io", "v1", "Event", "events", true),
            Resource::builtin("coordination.k8s.io", "v1", "Lease", "leases", true),
            Resource::builtin(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
                false,
            ),
        ] {
            store.resources.push(resource);
        }
        store
    }
}

#[cfg(test)]
mod tests;
