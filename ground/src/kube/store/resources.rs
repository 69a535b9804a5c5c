//! The store's resources: served types and discovery, CRD registration, and API errors.

use serde_json::Value;
use serde_json::json;

use crate::kube::store::Store;

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
    /// Served from a CustomResourceDefinition.
    pub custom: bool,
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
            custom: false,
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group`, or the plural alone for the core group, as the API server's messages
    /// name a resource.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
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
                custom: true,
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
    /// The Status's `details` (name, group, kind, causes), as the API server fills it (boxed:
    /// every store call returns this error, and a bare `Value` makes it 128 bytes).
    pub details: Option<Box<Value>>,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(Box::new(details));
        self
    }

    /// The `details` the API server gives an error about one object: its name, its group
    /// (omitted for the core group) and `kind` (the server puts the plural there for
    /// NotFound and Conflict, the Kind for Invalid).
    pub fn object_details(resource: &Resource, name: &str, kind: &str) -> Value {
        let mut details = json!({"name": name, "kind": kind});
        if !resource.group.is_empty() {
            details["group"] = json!(resource.group);
        }
        details
    }
    pub fn not_found(resource: &Resource, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified_plural()),
        )
        .with_details(Self::object_details(resource, name, &resource.plural))
    }
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = (**details).clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl Store {
    pub fn resources(&self) -> &[Resource] {
        &self.resources
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

    /// The resourceVersion a custom resource began to be served at (0 for a built-in).
    pub fn served_since(&self, resource: &Resource) -> u64 {
        self.served_since
            .get(&format!("{}/{}", resource.group, resource.plural))
            .copied()
            .unwrap_or(0)
    }

    /// Registers a CRD's served versions (done on CRD create/update too).
    pub fn register_crd(&mut self, crd: &Value) {
        for resource in Resource::from_crd(crd) {
            let rv = self.rv;
            self.served_since
                .entry(format!("{}/{}", resource.group, resource.plural))
                .or_insert(rv);
            self.resources.retain(|r| {
                !(r.group == resource.group
                    && r.version == resource.version
                    && r.plural == resource.plural)
            });
            self.resources.push(resource);
        }
    }
}
