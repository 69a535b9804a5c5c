//! What the observer's caches keep of each kind, and how a cached object gives it back.
//!
//! A cache holds thousands of objects, and a `DynamicObject` pays for every JSON map it holds
//! (an order-preserving serde_json map costs ~400 bytes even with one entry, and the
//! reflector's clone of it keeps room for three) and for every annotation or label map (a
//! B-tree node of ~540 bytes). So a cached object keeps its name, namespace, uid and
//! resourceVersion in `metadata`, and in `data` one flat array: the value at each of its
//! kind's kept paths, in order, null where the object has none. [`Projection::field`] reads one kept value;
//! [`Projection::expand`] gives the object back in its Kubernetes shape, holding the kept
//! fields only, for the decision.

use kube::api::DynamicObject;
use serde_json::{Map, Value};

use super::decision::{
    AUTHORIZED_STAGE_ANNOTATION, IGNORE_ANNOTATION, MANAGED_BY_LABEL, OBSERVE_ANNOTATION,
};

/// A path into an object, one segment per map key or list index (no pointer escaping).
pub type Path = &'static [&'static str];

/// The fields one kind's cache keeps: everything the decision and the watch mappers read.
pub struct Projection {
    pub fields: &'static [Path],
}

pub const APPLICATION: Projection = Projection {
    fields: &[
        &["metadata", "annotations", AUTHORIZED_STAGE_ANNOTATION],
        &["metadata", "annotations", IGNORE_ANNOTATION],
        &["metadata", "annotations", OBSERVE_ANNOTATION],
        &["status", "summary", "images"],
    ],
};

pub const STAGE: Projection = Projection {
    fields: &[
        &["spec", "requestedFreight"],
        &["status", "freightHistory", "0"],
        &["status", "lastPromotion", "name"],
    ],
};

pub const FREIGHT: Projection = Projection {
    fields: &[&["origin"], &["images"]],
};

pub const WAREHOUSE: Projection = Projection {
    fields: &[&["spec", "subscriptions"]],
};

pub const PROMOTION: Projection = Projection {
    fields: &[
        &["metadata", "labels", MANAGED_BY_LABEL],
        &["spec", "stage"],
        &["spec", "freight"],
        &["status", "phase"],
    ],
};

/// The projection of a kind by its name (Application, Stage, Freight, Warehouse, Promotion).
pub fn for_kind(kind: &str) -> &'static Projection {
    match kind {
        "Application" => &APPLICATION,
        "Stage" => &STAGE,
        "Freight" => &FREIGHT,
        "Warehouse" => &WAREHOUSE,
        "Promotion" => &PROMOTION,
        _ => &Projection { fields: &[] },
    }
}

fn step<'v>(value: &'v Value, segment: &str) -> Option<&'v Value> {
    match value {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => items.get(segment.parse::<usize>().ok()?),
        _ => None,
    }
}

fn step_mut<'v>(value: &'v mut Value, segment: &str) -> Option<&'v mut Value> {
    match value {
        Value::Object(map) => map.get_mut(segment),
        Value::Array(items) => items.get_mut(segment.parse::<usize>().ok()?),
        _ => None,
    }
}

impl Projection {
    /// Reduces a watched object to its cached form, in place.
    pub fn project(&self, object: &mut DynamicObject) {
        let mut body = std::mem::take(&mut object.data);
        let metadata = std::mem::take(&mut object.metadata);
        let kept = self
            .fields
            .iter()
            .map(|path| match path {
                // Kept metadata is an annotation or a label (the identity is kept apart).
                ["metadata", "annotations", key] => metadata
                    .annotations
                    .as_ref()
                    .and_then(|map| map.get(*key))
                    .map(|v| Value::String(v.clone())),
                ["metadata", "labels", key] => metadata
                    .labels
                    .as_ref()
                    .and_then(|map| map.get(*key))
                    .map(|v| Value::String(v.clone())),
                _ => path
                    .iter()
                    .try_fold(&mut body, |node, segment| step_mut(node, segment))
                    .map(Value::take),
            })
            .map(|value| value.unwrap_or(Value::Null))
            .collect();
        object.data = Value::Array(kept);
        object.types = None;
        // The resourceVersion orders Freight (the newest match wins) and tells one version of
        // an object from the next in the Events about it.
        object.metadata = kube::api::ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            ..Default::default()
        };
    }

    /// The value at `path` of a cached object: a kept path, or a path inside one.
    pub fn field<'a>(&self, object: &'a DynamicObject, path: &[&str]) -> Option<&'a Value> {
        let kept = object.data.as_array()?;
        self.fields
            .iter()
            .zip(kept)
            .find(|(field, _)| path.starts_with(field))
            .and_then(|(field, value)| {
                path[field.len()..]
                    .iter()
                    .try_fold(value, |node, segment| step(node, segment))
            })
            .filter(|value| !value.is_null())
    }

    /// A text field of a cached object ("" when absent).
    pub fn text<'a>(&self, object: &'a DynamicObject, path: &[&str]) -> &'a str {
        self.field(object, path)
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The cached object in its Kubernetes shape: its identity and the kept fields.
    pub fn expand(&self, object: &DynamicObject) -> Value {
        let mut metadata = Map::new();
        let identity = [
            ("name", &object.metadata.name),
            ("namespace", &object.metadata.namespace),
            ("uid", &object.metadata.uid),
            ("resourceVersion", &object.metadata.resource_version),
        ];
        for (key, value) in identity {
            if let Some(value) = value {
                metadata.insert(key.into(), Value::String(value.clone()));
            }
        }
        let mut out = Value::Object(Map::from_iter([("metadata".into(), metadata.into())]));
        let kept = object.data.as_array().map(Vec::as_slice).unwrap_or(&[]);
        for (path, value) in self.fields.iter().zip(kept) {
            if value.is_null() {
                continue;
            }
            let (last, parents) = path.split_last().expect("a kept path is not empty");
            let mut node = &mut out;
            for segment in parents {
                node = node
                    .as_object_mut()
                    .expect("parents are maps")
                    .entry(*segment)
                    .or_insert_with(|| Value::Object(Map::new()));
            }
            node.as_object_mut()
                .expect("parents are maps")
                .insert((*last).into(), value.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_application_keeps_its_annotations_and_images_only() {
        let mut app = object(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "web", "namespace": "argocd", "uid": "u1", "resourceVersion": "7",
                "labels": {"team": "a"},
                "annotations": {AUTHORIZED_STAGE_ANNOTATION: "kargo-demo:prod", "other": "x"},
                "managedFields": [{"manager": "argocd"}]},
            "spec": {"project": "default"},
            "status": {"health": {"status": "Healthy"}, "summary": {"images": ["nginx:1"]}}
        }));
        APPLICATION.project(&mut app);
        assert_eq!(
            APPLICATION.expand(&app),
            json!({
                "metadata": {"name": "web", "namespace": "argocd", "uid": "u1",
                    "resourceVersion": "7", "annotations": {AUTHORIZED_STAGE_ANNOTATION: "kargo-demo:prod"}},
                "status": {"summary": {"images": ["nginx:1"]}}
            })
        );
        assert_eq!(
            APPLICATION.text(
                &app,
                &["metadata", "annotations", AUTHORIZED_STAGE_ANNOTATION]
            ),
            "kargo-demo:prod"
        );
        assert_eq!(
            APPLICATION.field(&app, &["metadata", "annotations", IGNORE_ANNOTATION]),
            None
        );
        assert!(app.metadata.annotations.is_none() && app.metadata.labels.is_none());
    }

    #[test]
    fn paths_inside_kept_fields_and_list_indexes_are_read() {
        let mut stage = object(json!({
            "metadata": {"name": "prod", "namespace": "kargo-demo"},
            "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "w"}}]},
            "status": {"freightHistory": [{"items": {"Warehouse/w": {"name": "f1"}}}, {"old": true}]}
        }));
        STAGE.project(&mut stage);
        assert_eq!(
            STAGE.text(&stage, &["spec", "requestedFreight", "0", "origin", "name"]),
            "w"
        );
        let expanded = STAGE.expand(&stage);
        assert_eq!(
            expanded.pointer("/status/freightHistory/0/items/Warehouse~1w/name"),
            Some(&json!("f1"))
        );
        assert_eq!(expanded.pointer("/status/freightHistory/1"), None);
    }

    #[test]
    fn a_freight_keeps_its_resource_version_for_newest_first() {
        let mut freight = object(json!({
            "metadata": {"name": "f", "namespace": "kargo-demo", "resourceVersion": "42"},
            "origin": {"kind": "Warehouse", "name": "w"},
            "images": [{"repoURL": "nginx", "tag": "1"}]
        }));
        FREIGHT.project(&mut freight);
        assert_eq!(
            FREIGHT
                .expand(&freight)
                .pointer("/metadata/resourceVersion"),
            Some(&json!("42"))
        );
    }

    #[test]
    fn a_promotion_keeps_the_managed_by_label() {
        let mut promotion = object(json!({
            "metadata": {"name": "p", "namespace": "kargo-demo",
                "labels": {MANAGED_BY_LABEL: "kargo-argocd-observer", "other": "x"}},
            "spec": {"stage": "prod", "freight": "f"}
        }));
        PROMOTION.project(&mut promotion);
        assert_eq!(
            PROMOTION.expand(&promotion),
            json!({"metadata": {"name": "p", "namespace": "kargo-demo",
                "labels": {MANAGED_BY_LABEL: "kargo-argocd-observer"}},
                "spec": {"stage": "prod", "freight": "f"}})
        );
    }
}
