//! The store's admission: users, operations, admission hooks and schema validation.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use serde_json::json;

use crate::kube::schema;
use crate::kube::store::Store;
use crate::kube::store::objects::ObjectKey;
use crate::kube::store::resources::{ApiError, Resource};

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

impl Store {
    pub fn add_hook(&mut self, group: &str, plural: &str, hook: AdmissionHook) {
        self.hooks
            .push((group.to_string(), plural.to_string(), hook));
    }

    pub(super) fn admit(
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

    pub(super) fn prepare(
        &mut self,
        resource: &Resource,
        object: &mut Value,
    ) -> Result<(), ApiError> {
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
            let validation = self
                .field_validation
                .unwrap_or(schema::FieldValidation::Ignore);
            let pruned = schema::prune_and_validate(object, schema, resource, validation)?;
            if validation == schema::FieldValidation::Warn {
                for field in pruned {
                    let warning = format!("unknown field \"{field}\"");
                    if !self.warnings.contains(&warning) {
                        self.warnings.push(warning);
                    }
                }
            }
        }
        Ok(())
    }
}
