//! The diff's room for identity: an Application's key and an object's key across two renders.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::render::{RenderedApplication, object_sort_key};

/// An Application's identity across two renders.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AppKey {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} on {}", self.namespace, self.name, self.cluster)
    }
}

/// An object's identity inside one Application.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn of(object: &Value) -> ObjectKey {
        let (group, kind, namespace, name) = object_sort_key(object);
        ObjectKey {
            group,
            kind,
            namespace,
            name,
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}/{}", self.group, self.kind)
        };
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

pub fn key_of(app: &RenderedApplication) -> AppKey {
    AppKey {
        cluster: app.cluster.name.clone(),
        namespace: app.namespace.clone(),
        name: app.name.clone(),
    }
}
