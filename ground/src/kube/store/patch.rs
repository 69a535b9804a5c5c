//! The store's patches: merge, JSON and server-side apply patches with field ownership.

use serde_json::Value;

use crate::kube::store::Store;
use crate::kube::store::admission::User;
use crate::kube::store::objects::ObjectKey;
use crate::kube::store::resources::{ApiError, Resource};

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

impl Store {
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
                        self.claim(&key, &object, &manager, true);
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
            let mut conflicts: Vec<(String, String)> = Vec::new();
            for (path, value) in applied_leaves(object) {
                if old.pointer(&path) == Some(&value) {
                    continue;
                }
                for owner in owned.and_then(|o| o.get(&path)).into_iter().flatten() {
                    if owner != manager {
                        conflicts.push((owner.clone(), path.replace('/', ".")));
                    }
                }
            }
            conflicts.sort();
            if !conflicts.is_empty() && !force {
                // As structured-merge-diff words it: one conflict inline, several grouped
                // by manager.
                let listed = if conflicts.len() == 1 {
                    format!("conflict with \"{}\": {}", conflicts[0].0, conflicts[0].1)
                } else {
                    let mut groups: Vec<String> = Vec::new();
                    let mut last: Option<&str> = None;
                    for (owner, field) in &conflicts {
                        if last != Some(owner.as_str()) {
                            groups.push(format!("conflicts with \"{owner}\":"));
                            last = Some(owner);
                        }
                        groups.push(format!("- {field}"));
                    }
                    groups.join("\n")
                };
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|(owner, field)| {
                        serde_json::json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{owner}\""), "field": field})
                    })
                    .collect();
                let count = if conflicts.len() == 1 {
                    "1 conflict".to_string()
                } else {
                    format!("{} conflicts", conflicts.len())
                };
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!("Apply failed with {count}: {listed}"),
                )
                .with_details(serde_json::json!({"causes": causes})));
            }
            applied = Some((object.clone(), manager.clone(), *force));
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
        if let Some((object, manager, force)) = applied {
            self.claim(&key, &object, &manager, force);
        }
        Ok(updated)
    }

    /// `manager` now owns every field its apply set: alone when forced (the others lose
    /// it), beside the managers that applied the same value otherwise.
    fn claim(&mut self, key: &ObjectKey, applied: &Value, manager: &str, force: bool) {
        let owned = self.owners.entry(key.clone()).or_default();
        for (path, _) in applied_leaves(applied) {
            let managers = owned.entry(path).or_default();
            if force {
                managers.clear();
            }
            managers.insert(manager.to_string());
        }
    }
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
