//! The object store behind the Kubernetes API double: resource types, objects with
//! resourceVersions, a bounded event history for watches, label/field selectors, admission.

use crate::clock::Clock;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::schema;

/// How many events a watch can resume from; older resourceVersions answer 410 Gone.
pub const HISTORY: usize = 20_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    /// The CRD's openAPIV3Schema; None for built-ins (not validated).
    pub schema: Option<Value>,
    pub status_subresource: bool,
}

impl Resource {
    pub fn builtin(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
    ) -> Resource {
        Resource {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            namespaced,
            short_names: Vec::new(),
            schema: None,
            status_subresource: false,
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Every served version of a CRD object as a Resource.
    pub fn from_crd(crd: &Value) -> Vec<Resource> {
        let text = |p: &str| {
            crd.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let namespaced = text("/spec/scope") != "Cluster";
        let short_names: Vec<String> = crd
            .pointer("/spec/names/shortNames")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        crd.pointer("/spec/versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
            .map(|v| Resource {
                group: text("/spec/group"),
                version: v
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                kind: text("/spec/names/kind"),
                plural: text("/spec/names/plural"),
                singular: {
                    let s = text("/spec/names/singular");
                    if s.is_empty() {
                        text("/spec/names/kind").to_lowercase()
                    } else {
                        s
                    }
                },
                namespaced,
                short_names: short_names.clone(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                status_subresource: v.pointer("/subresources/status").is_some(),
            })
            .collect()
    }
}

/// A Kubernetes API error, answered as a `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
        }
    }
    pub fn not_found(resource: &Resource, name: &str) -> ApiError {
        let group = if resource.group.is_empty() {
            String::new()
        } else {
            format!(".{}", resource.group)
        };
        ApiError::new(
            404,
            "NotFound",
            format!("{}{group} \"{name}\" not found", resource.plural),
        )
    }
    pub fn status(&self) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

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

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// What an admission hook sees; it may change `object` (mutating) or refuse (validating).
pub struct Admission<'a> {
    pub operation: Operation,
    pub user: &'a User,
    pub resource: &'a Resource,
    pub object: &'a mut Value,
    pub old: Option<&'a Value>,
    pub store: &'a StoreView<'a>,
}

pub type AdmissionHook = Arc<dyn Fn(&mut Admission) -> Result<(), ApiError> + Send + Sync>;

/// Read access to the objects, for admission hooks.
pub struct StoreView<'a> {
    objects: &'a BTreeMap<ObjectKey, Value>,
}

impl StoreView<'_> {
    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&ObjectKey::new(group, plural, namespace, name))
    }
    pub fn list(&self, group: &str, plural: &str, namespace: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|(k, _)| {
                k.group == group
                    && k.plural == plural
                    && (namespace.is_empty() || k.namespace == namespace)
            })
            .map(|(_, v)| v)
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub name: String,
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
    /// Server-side apply's field ownership: object -> leaf path -> field manager. A write
    /// that is not an apply gives up the ownership of the fields it changes.
    owners: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    /// The ground's one clock (creation timestamps).
    pub clock: Clock,
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

    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

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

    pub fn add_hook(&mut self, group: &str, plural: &str, hook: AdmissionHook) {
        self.hooks
            .push((group.to_string(), plural.to_string(), hook));
    }

    /// Finds a served resource by group, version and plural (or kind, singular, short name).
    pub fn resource(&self, group: &str, version: &str, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| {
            r.group == group
                && r.version == version
                && (r.plural == name
                    || r.singular == name
                    || r.kind == name
                    || r.short_names.iter().any(|s| s == name))
        })
    }

    pub fn resource_for_kind(&self, api_version: &str, kind: &str) -> Option<&Resource> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
    }

    /// Registers a CRD's served versions (done on CRD create/update too).
    pub fn register_crd(&mut self, crd: &Value) {
        for resource in Resource::from_crd(crd) {
            self.resources.retain(|r| {
                !(r.group == resource.group
                    && r.version == resource.version
                    && r.plural == resource.plural)
            });
            self.resources.push(resource);
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, resource: &Resource, kind: EventType, object: Value) {
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

    fn admit(
        &self,
        operation: Operation,
        user: &User,
        resource: &Resource,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let view = StoreView {
            objects: &self.objects,
        };
        for (group, plural, hook) in &self.hooks {
            if *group == resource.group && *plural == resource.plural {
                let mut admission = Admission {
                    operation,
                    user,
                    resource,
                    object,
                    old,
                    store: &view,
                };
                hook(&mut admission)?;
            }
        }
        Ok(())
    }

    fn key(resource: &Resource, namespace: &str, name: &str) -> ObjectKey {
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

    fn prepare(&self, resource: &Resource, object: &mut Value) -> Result<(), ApiError> {
        if !object.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the object must be a JSON object",
            ));
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        if let Some(schema) = &resource.schema {
            schema::prune_and_validate(object, schema, &resource.kind)?;
        }
        Ok(())
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
        self.objects
            .iter()
            .filter(|(k, _)| k.group == resource.group && k.plural == resource.plural)
            .filter(|(k, _)| namespace.is_empty() || k.namespace == namespace)
            .filter(|(_, v)| labels.matches(&labels_of(v)) && fields.matches(&fields_of(v)))
            .map(|(_, v)| with_api_version(v, resource))
            .collect()
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
                        "Operation cannot be fulfilled on {}.{} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                        resource.plural, resource.group
                    ),
                ));
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

    /// Applies a merge patch (JSON merge patch semantics) or a computed replacement.
    pub fn patch(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        patch: PatchBody,
        user: &User,
        status: bool,
    ) -> Result<Value, ApiError> {
        let key = Self::key(resource, namespace, name);
        let old = match self.objects.get(&key) {
            Some(old) => old.clone(),
            None => {
                return match patch {
                    PatchBody::Apply {
                        object, manager, ..
                    } => {
                        let created = self.create(resource, namespace, object.clone(), user)?;
                        self.claim(&key, &object, &manager);
                        Ok(created)
                    }
                    _ => Err(ApiError::not_found(resource, name)),
                };
            }
        };
        let mut next = old.clone();
        let mut applied = None;
        if let PatchBody::Apply {
            object,
            manager,
            force,
        } = &patch
        {
            // Fields another manager set to a different value conflict, unless forced.
            let owned = self.owners.get(&key);
            let conflicts: Vec<String> = applied_leaves(object)
                .into_iter()
                .filter_map(|(path, value)| {
                    let owner = owned?.get(&path)?;
                    (owner != manager && old.pointer(&path) != Some(&value))
                        .then(|| format!("conflict with \"{owner}\": {}", path.replace('/', ".")))
                })
                .collect();
            if !conflicts.is_empty() && !force {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Apply failed with {} conflict(s): {}",
                        conflicts.len(),
                        conflicts.join(", ")
                    ),
                ));
            }
            applied = Some((object.clone(), manager.clone()));
        }
        match patch {
            PatchBody::Merge(p) | PatchBody::Apply { object: p, .. } => {
                if let Some(rv) = p
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    && Some(rv)
                        != old
                            .pointer("/metadata/resourceVersion")
                            .and_then(Value::as_str)
                {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified",
                            resource.plural
                        ),
                    ));
                }
                json_patch::merge(&mut next, &p);
            }
            PatchBody::Json(ops) => {
                let ops: json_patch::Patch = serde_json::from_value(ops).map_err(|e| {
                    ApiError::new(400, "BadRequest", format!("invalid JSON patch: {e}"))
                })?;
                json_patch::patch(&mut next, &ops).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch could not be applied: {e}"),
                    )
                })?;
            }
        }
        if let Some(m) = next.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let updated = self.update(resource, namespace, name, next, user, status)?;
        if let Some((object, manager)) = applied {
            self.claim(&key, &object, &manager);
        }
        Ok(updated)
    }

    /// `manager` now owns every field its apply set.
    fn claim(&mut self, key: &ObjectKey, applied: &Value, manager: &str) {
        let owned = self.owners.entry(key.clone()).or_default();
        for (path, _) in applied_leaves(applied) {
            owned.insert(path, manager.to_string());
        }
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

pub enum PatchBody {
    Merge(Value),
    Json(Value),
    /// Server-side apply: creates when missing, merges otherwise; a field another manager
    /// applied with a different value is a 409 Conflict unless `force`.
    Apply {
        object: Value,
        manager: String,
        force: bool,
    },
}

/// The leaf fields an apply sets, as JSON pointers (maps are descended; lists and scalars are
/// leaves), without the object's identity.
fn applied_leaves(object: &Value) -> Vec<(String, Value)> {
    fn walk(value: &Value, path: String, out: &mut Vec<(String, Value)>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, value) in map {
                    let key = key.replace('~', "~0").replace('/', "~1");
                    walk(value, format!("{path}/{key}"), out);
                }
            }
            _ => out.push((path, value.clone())),
        }
    }
    let mut out = Vec::new();
    walk(object, String::new(), &mut out);
    out.retain(|(path, _)| {
        !matches!(
            path.as_str(),
            "/apiVersion"
                | "/kind"
                | "/metadata/name"
                | "/metadata/namespace"
                | "/metadata/resourceVersion"
        )
    });
    out
}

pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn fields_of(object: &Value) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    for (field, pointer) in [
        ("metadata.name", "/metadata/name"),
        ("metadata.namespace", "/metadata/namespace"),
    ] {
        fields.insert(
            field.to_string(),
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        );
    }
    fields
}

/// A parsed label or field selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    requirements: Vec<(String, String, Vec<String>)>,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, ApiError> {
        let mut requirements = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            // Split at the next comma outside parentheses.
            let mut depth = 0;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let term = rest[..end].trim();
            rest = rest.get(end + 1..).unwrap_or("").trim();
            if term.is_empty() {
                continue;
            }
            let invalid = || {
                ApiError::new(
                    400,
                    "BadRequest",
                    format!("unable to parse requirement: {term:?}"),
                )
            };
            let requirement = if let Some(key) = term.strip_prefix('!') {
                (key.trim().to_string(), "!".to_string(), vec![])
            } else if let Some((key, value)) = term.split_once("!=") {
                (
                    key.trim().to_string(),
                    "!=".to_string(),
                    vec![value.trim().to_string()],
                )
            } else if let Some((key, value)) = term.split_once("==") {
                (
                    key.trim().to_string(),
                    "=".to_string(),
                    vec![value.trim().to_string()],
                )
            } else if let Some((key, value)) = term.split_once('=') {
                (
                    key.trim().to_string(),
                    "=".to_string(),
                    vec![value.trim().to_string()],
                )
            } else if let Some(open) = term.find('(') {
                let head: Vec<&str> = term[..open].split_whitespace().collect();
                let values = term[open + 1..]
                    .trim_end_matches(')')
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                match head.as_slice() {
                    [key, "in"] => (key.to_string(), "in".to_string(), values),
                    [key, "notin"] => (key.to_string(), "notin".to_string(), values),
                    _ => return Err(invalid()),
                }
            } else {
                (term.to_string(), "exists".to_string(), vec![])
            };
            if requirement.0.is_empty() {
                return Err(invalid());
            }
            requirements.push(requirement);
        }
        Ok(Selector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|(key, op, values)| {
            let value = labels.get(key);
            match op.as_str() {
                "=" => value == values.first(),
                "!=" => value != values.first(),
                "in" => value.is_some_and(|v| values.contains(v)),
                "notin" => value.is_none_or(|v| !values.contains(v)),
                "exists" => value.is_some(),
                "!" => value.is_none(),
                _ => false,
            }
        })
    }
}

#[cfg(test)]
mod tests;
