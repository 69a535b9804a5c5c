//! The store's objects: keys, get/list, create, update and delete.

use serde_json::Value;
use serde_json::json;

use super::selectors::fields_of;
use crate::kube::store::Store;
use crate::kube::store::admission::{Operation, User};
use crate::kube::store::history::EventType;
use crate::kube::store::resources::{ApiError, Resource};
use crate::kube::store::selectors::{Selector, labels_of};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub name: String,
}

/// What follows a page of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Following {
    /// Whether a matching object follows.
    pub more: bool,
    /// How many do (a list without selectors only).
    pub count: Option<usize>,
}

impl ObjectKey {
    pub fn new(group: &str, plural: &str, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: group.into(),
            plural: plural.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl Store {
    pub(super) fn key(resource: &Resource, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey::new(
            &resource.group,
            &resource.plural,
            if resource.namespaced { namespace } else { "" },
            name,
        )
    }

    fn random_suffix(&mut self) -> String {
        // Deterministic per store: a counter spread over the alphabet Kubernetes uses.
        self.counter += 1;
        let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
        let mut n = self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..5)
            .map(|_| {
                let c = alphabet[(n % alphabet.len() as u64) as usize] as char;
                n /= alphabet.len() as u64;
                c
            })
            .collect()
    }

    fn uid(&mut self) -> String {
        self.counter += 1;
        let n = self.counter;
        format!("00000000-0000-4000-8000-{n:012x}")
    }

    pub fn get(&self, resource: &Resource, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&Self::key(resource, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// Objects of a resource, in a namespace or all, matching selectors, sorted by namespace/name.
    pub fn list(
        &self,
        resource: &Resource,
        namespace: &str,
        labels: &Selector,
        fields: &Selector,
    ) -> Vec<Value> {
        self.of_resource(resource, namespace)
            .filter(|(_, v)| labels.matches(&labels_of(v)) && fields.matches(&fields_of(v)))
            .map(|(_, v)| with_api_version(v, resource))
            .collect()
    }

    /// The stored objects of a resource (in `namespace`, or all when empty), in key order: a
    /// range of the map, not a scan of every object of every resource.
    fn of_resource<'a>(
        &'a self,
        resource: &'a Resource,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + 'a {
        let from = ObjectKey::new(&resource.group, &resource.plural, namespace, "");
        self.objects.range(from..).take_while(move |(k, _)| {
            k.group == resource.group
                && k.plural == resource.plural
                && (namespace.is_empty() || k.namespace == namespace)
        })
    }

    /// One page of `list`: at most `limit` objects after the object `after` names (none: from
    /// the first), and what follows the page. `None` when `after` names no object the list
    /// holds (an expired continue token). Each page costs its own objects, not the whole list:
    /// a watcher lists 50,000 Applications in 100 pages. Like kube-apiserver (its storage sets
    /// `remainingItemCount` only when the list's predicate is empty), a list without selectors
    /// counts the objects that follow, and one with a selector only finds whether one does:
    /// matching every following object for each page made a watcher's list of 100,000
    /// Applications quadratic.
    pub fn list_page(
        &self,
        resource: &Resource,
        namespace: &str,
        labels: &Selector,
        fields: &Selector,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Option<(Vec<Value>, Following)> {
        let selected = !labels.is_empty() || !fields.is_empty();
        let matches = |v: &Value| {
            !selected || (labels.matches(&labels_of(v)) && fields.matches(&fields_of(v)))
        };
        let mut rest: Box<dyn Iterator<Item = (&ObjectKey, &Value)> + '_> = match after {
            None => Box::new(self.of_resource(resource, namespace)),
            Some((token_namespace, token_name)) => {
                let key = Self::key(resource, token_namespace, token_name);
                let object = self.objects.get(&key)?;
                let listed = (namespace.is_empty() || key.namespace == namespace)
                    && matches(object)
                    && object
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        == token_namespace
                    && object
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        == token_name;
                if !listed {
                    return None;
                }
                Box::new(
                    self.objects
                        .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
                        .take_while(move |(k, _)| {
                            k.group == resource.group
                                && k.plural == resource.plural
                                && (namespace.is_empty() || k.namespace == namespace)
                        }),
                )
            }
        };
        let mut filtered = rest.by_ref().filter(|(_, v)| matches(v));
        let page: Vec<Value> = filtered
            .by_ref()
            .take(limit)
            .map(|(_, v)| with_api_version(v, resource))
            .collect();
        let following = if selected {
            Following {
                more: filtered.next().is_some(),
                count: None,
            }
        } else {
            let count = filtered.count();
            Following {
                more: count > 0,
                count: Some(count),
            }
        };
        Some((page, following))
    }

    pub fn create(
        &mut self,
        resource: &Resource,
        namespace: &str,
        mut object: Value,
        user: &User,
    ) -> Result<Value, ApiError> {
        if !object.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the object must be a JSON object",
            ));
        }
        if !object.get("metadata").is_some_and(Value::is_object) {
            object["metadata"] = json!({});
        }
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = if name.is_empty() {
            let prefix = object
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if prefix.is_empty() {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "{} is invalid: metadata.name: Required value: name or generateName is required",
                        resource.kind
                    ),
                ));
            }
            format!("{prefix}{}", self.random_suffix())
        } else {
            name
        };
        if resource.namespaced {
            let ns = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or(namespace)
                .to_string();
            if !namespace.is_empty() && ns != namespace {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            if ns.is_empty() {
                return Err(ApiError::new(400, "BadRequest", "a namespace is required"));
            }
            if resource.plural != "namespaces"
                && !self
                    .objects
                    .contains_key(&ObjectKey::new("", "namespaces", "", &ns))
            {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                ));
            }
            object["metadata"]["namespace"] = json!(ns);
        } else if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("namespace");
        }
        if resource.plural != "namespaces" {
            crate::kube::schema::check_name(resource, &name)?;
        }
        object["metadata"]["name"] = json!(name);
        let ns = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // As the API server: mutating admission (Kargo's webhook), then the schema.
        self.admit(Operation::Create, user, resource, &mut object, None)?;
        self.prepare(resource, &mut object)?;
        // The webhook may rename the object (Kargo replaces Promotion names).
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or(&name)
            .to_string();
        let key = Self::key(resource, &ns, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", resource.plural),
            ));
        }
        let rv = self.next_rv();
        let uid = self.uid();
        let meta = &mut object["metadata"];
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(self.clock.rfc3339());
        meta["generation"] = json!(1);
        if resource.plural == "customresourcedefinitions" {
            object["status"] = crd_status(&object, None, &self.clock.rfc3339());
            self.register_crd(&object);
        }
        self.objects.insert(key, object.clone());
        self.record(resource, EventType::Added, object.clone());
        Ok(object)
    }

    /// Replaces an object (PUT). A stale resourceVersion is a 409 Conflict. With `status`,
    /// only the status changes (the status subresource); without, status is kept when the
    /// resource has a status subresource.
    pub fn update(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        mut object: Value,
        user: &User,
        status: bool,
    ) -> Result<Value, ApiError> {
        if !object.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the object must be a JSON object",
            ));
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let key = Self::key(resource, namespace, name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        if let Some(rv) = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            let current = old
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            if rv != current {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                        resource.qualified_plural()
                    ),
                )
                .with_details(ApiError::object_details(resource, name, &resource.plural)));
            }
        }
        let mut merged = if status {
            let mut next = old.clone();
            next["status"] = object.get("status").cloned().unwrap_or(Value::Null);
            next
        } else {
            let mut next = object;
            if resource.status_subresource {
                match old.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(m) = next.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            next
        };
        // Identity fields are the server's.
        for field in ["uid", "creationTimestamp", "name", "namespace"] {
            if let Some(v) = old.pointer(&format!("/metadata/{field}")) {
                merged["metadata"][field] = v.clone();
            }
        }
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        if resource.plural == "customresourcedefinitions" && !status {
            // The CRD's status is the server's: a new storage version joins storedVersions,
            // and a stored version may not leave spec.versions.
            merged["status"] = crd_status(&merged, old.get("status"), &self.clock.rfc3339());
            check_stored_versions(&merged, name)?;
        }
        let spec_changed = old.get("spec") != merged.get("spec");
        merged["metadata"]["generation"] = json!(if spec_changed && !status {
            generation + 1
        } else {
            generation
        });
        if !status {
            self.admit(Operation::Update, user, resource, &mut merged, Some(&old))?;
        }
        self.prepare(resource, &mut merged)?;
        merged["metadata"]["resourceVersion"] = json!(
            old.pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(json!(""))
        );
        if merged == old {
            return Ok(old); // no-op updates do not bump the resourceVersion
        }
        let rv = self.next_rv();
        merged["metadata"]["resourceVersion"] = json!(rv.to_string());
        if resource.plural == "customresourcedefinitions" {
            self.register_crd(&merged);
        }
        if let Some(owned) = self.owners.get_mut(&key) {
            owned.retain(|path, _| merged.pointer(path) == old.pointer(path));
        }
        self.objects.insert(key, merged.clone());
        self.record(resource, EventType::Modified, merged.clone());
        Ok(merged)
    }

    pub fn delete(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        user: &User,
    ) -> Result<Value, ApiError> {
        let key = Self::key(resource, namespace, name);
        let mut old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        self.admit(
            Operation::Delete,
            user,
            resource,
            &mut old.clone(),
            Some(&old),
        )?;
        self.objects.remove(&key);
        self.owners.remove(&key);
        self.next_rv();
        old["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(resource, EventType::Deleted, old.clone());
        Ok(old)
    }
}

fn with_api_version(object: &Value, resource: &Resource) -> Value {
    let mut object = object.clone();
    object["apiVersion"] = json!(resource.api_version());
    object
}

/// A CustomResourceDefinition's status as the API server keeps it: its names accepted, it is
/// Established, and `storedVersions` holds every version that was ever the storage version.
fn crd_status(crd: &Value, old: Option<&Value>, now: &str) -> Value {
    let mut stored: Vec<Value> = old
        .and_then(|s| s.get("storedVersions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for version in crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
    {
        if let Some(name) = version.get("name")
            && !stored.contains(name)
        {
            stored.push(name.clone());
        }
    }
    let conditions = old
        .and_then(|s| s.get("conditions"))
        .cloned()
        .unwrap_or_else(|| {
            json!([
                {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
                {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
            ])
        });
    json!({
        "conditions": conditions,
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "storedVersions": stored,
    })
}

/// A version still in `status.storedVersions` may not leave `spec.versions` (422, as the API
/// server: data may still be persisted in it).
fn check_stored_versions(crd: &Value, name: &str) -> Result<(), ApiError> {
    let versions: Vec<&str> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    let errors: Vec<String> = crd
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, v)| Some((i, v.as_str()?)))
        .filter(|(_, v)| !versions.contains(v))
        .map(|(i, v)| crate::kube::schema::stored_version_missing(i, v))
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| crate::kube::schema::cause(e))
        .collect();
    let message = if errors.len() == 1 {
        errors[0].clone()
    } else {
        format!("[{}]", errors.join(", "))
    };
    Err(ApiError::new(
        422,
        "Invalid",
        format!("CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {message}"),
    )
    .with_details(json!({"name": name, "group": "apiextensions.k8s.io", "kind": "CustomResourceDefinition", "causes": causes})))
}
