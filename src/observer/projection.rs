//! What the observer's caches keep of each kind, and how a cached object gives it back.
//!
//! A cache holds every watched object for as long as the observer runs, so each byte kept per
//! Application is 50 KB at 50,000 of them. A cached object is a [`Cached`]: its name,
//! namespace and resourceVersion (the watch resumes from the last one it saw) in `metadata`, and
//! the value at each of its kind's kept paths, in order: a string as it is (the watch mappers read
//! the authorized-stage annotation of every Application for each event), any other value as
//! its compact JSON text (a `serde_json::Value` pays ~80 bytes per node and an order-preserving
//! map far more), nothing where the object has none. The object is deserialised into this
//! form as it arrives, so the full object (status, managedFields, other annotations) is never
//! kept, and the type's own resource kind (no `ApiResource` in every store key and
//! controller queue entry, as a `DynamicObject`'s `ObjectRef` carries). [`Cached::text`] and
//! [`Cached::field`] read one kept value; [`Cached::expand`] gives the object back in its
//! Kubernetes shape, holding the kept fields only, for the decision.

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, ObjectMeta};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::decision::{
    AUTHORIZED_STAGE_ANNOTATION, IGNORE_ANNOTATION, MANAGED_BY_LABEL, OBSERVE_ANNOTATION,
};

/// A path into an object, one segment per map key or list index (no pointer escaping).
pub type Path = &'static [&'static str];

/// A kind the observer caches: where the API serves it, and the fields its cache keeps
/// (everything the decision, the Events and the watch mappers read). Kept paths do not nest
/// in one another.
pub trait Kind: Clone + std::fmt::Debug + Send + Sync + 'static {
    const GROUP: &'static str;
    const VERSION: &'static str;
    const KIND: &'static str;
    const PLURAL: &'static str;
    const FIELDS: &'static [Path];

    /// The kind for API calls on full objects (`DynamicObject`).
    fn api_resource() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(Self::GROUP, Self::VERSION, Self::KIND),
            Self::PLURAL,
        )
    }
}

const UID: Path = &["metadata", "uid"];

#[derive(Clone, Copy, Debug)]
pub struct Application;
impl Kind for Application {
    const GROUP: &'static str = "argoproj.io";
    const VERSION: &'static str = "v1alpha1";
    const KIND: &'static str = "Application";
    const PLURAL: &'static str = "applications";
    // The uid: Events name the Application by it.
    const FIELDS: &'static [Path] = &[
        &["metadata", "annotations", AUTHORIZED_STAGE_ANNOTATION],
        &["metadata", "annotations", IGNORE_ANNOTATION],
        &["metadata", "annotations", OBSERVE_ANNOTATION],
        &["status", "summary", "images"],
        UID,
    ];
}

#[derive(Clone, Copy, Debug)]
pub struct Stage;
impl Kind for Stage {
    const GROUP: &'static str = "kargo.akuity.io";
    const VERSION: &'static str = "v1alpha1";
    const KIND: &'static str = "Stage";
    const PLURAL: &'static str = "stages";
    // The uid: Events name the Stage as their related object.
    const FIELDS: &'static [Path] = &[
        &["spec", "requestedFreight"],
        &["status", "freightHistory", "0"],
        &["status", "lastPromotion", "name"],
        UID,
    ];
}

#[derive(Clone, Copy, Debug)]
pub struct Freight;
impl Kind for Freight {
    const GROUP: &'static str = "kargo.akuity.io";
    const VERSION: &'static str = "v1alpha1";
    const KIND: &'static str = "Freight";
    const PLURAL: &'static str = "freights";
    const FIELDS: &'static [Path] = &[&["origin"], &["images"]];
}

#[derive(Clone, Copy, Debug)]
pub struct Warehouse;
impl Kind for Warehouse {
    const GROUP: &'static str = "kargo.akuity.io";
    const VERSION: &'static str = "v1alpha1";
    const KIND: &'static str = "Warehouse";
    const PLURAL: &'static str = "warehouses";
    const FIELDS: &'static [Path] = &[&["spec", "subscriptions"]];
}

#[derive(Clone, Copy, Debug)]
pub struct Promotion;
impl Kind for Promotion {
    const GROUP: &'static str = "kargo.akuity.io";
    const VERSION: &'static str = "v1alpha1";
    const KIND: &'static str = "Promotion";
    const PLURAL: &'static str = "promotions";
    const FIELDS: &'static [Path] = &[
        &["metadata", "labels", MANAGED_BY_LABEL],
        &["spec", "stage"],
        &["spec", "freight"],
        &["status", "phase"],
    ];
}

pub type CachedApplication = Cached<Application>;
pub type CachedStage = Cached<Stage>;
pub type CachedFreight = Cached<Freight>;
pub type CachedWarehouse = Cached<Warehouse>;
pub type CachedPromotion = Cached<Promotion>;

/// One kept value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kept {
    /// The object has none (or null).
    Absent,
    /// A string, as it is.
    Text(Box<str>),
    /// Any other value, as its compact JSON text.
    Json(Box<str>),
}

impl Kept {
    fn of(value: Value) -> Kept {
        match value {
            Value::Null => Kept::Absent,
            Value::String(text) => Kept::Text(text.into_boxed_str()),
            other => Kept::Json(other.to_string().into_boxed_str()),
        }
    }

    fn value(&self) -> Option<Value> {
        match self {
            Kept::Absent => None,
            Kept::Text(text) => Some(Value::String(text.to_string())),
            // Our own serialisation of a `Value`: it parses back to the same value.
            Kept::Json(text) => serde_json::from_str(text).ok(),
        }
    }
}

/// A watched object as its kind's cache keeps it.
#[derive(Clone, Debug)]
pub struct Cached<K> {
    /// Name, namespace and resourceVersion only.
    metadata: ObjectMeta,
    /// The value at each of `K::FIELDS`, in order.
    kept: Box<[Kept]>,
    kind: PhantomData<K>,
}

fn step_mut<'v>(value: &'v mut Value, segment: &str) -> Option<&'v mut Value> {
    match value {
        Value::Object(map) => map.get_mut(segment),
        Value::Array(items) => items.get_mut(segment.parse::<usize>().ok()?),
        _ => None,
    }
}

impl<K: Kind> Cached<K> {
    /// Reduces a full object (as the API serves it) to its cached form.
    pub fn from_value(mut object: Value) -> Result<Self, String> {
        let identity = |object: &Value, key: &str| {
            object
                .get("metadata")
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let Some(name) = identity(&object, "name") else {
            return Err(format!("a {} without metadata.name", K::KIND));
        };
        let metadata = ObjectMeta {
            name: Some(name),
            namespace: identity(&object, "namespace"),
            resource_version: identity(&object, "resourceVersion"),
            ..Default::default()
        };
        let kept = K::FIELDS
            .iter()
            .map(|path| {
                path.iter()
                    .try_fold(&mut object, |node, segment| step_mut(node, segment))
                    .map_or(Kept::Absent, |value| Kept::of(value.take()))
            })
            .collect();
        Ok(Cached {
            metadata,
            kept,
            kind: PhantomData,
        })
    }

    /// The kept values, in the order of `K::FIELDS`.
    pub fn kept(&self) -> &[Kept] {
        &self.kept
    }

    fn kept_at(&self, path: &[&str]) -> Option<(Path, &Kept)> {
        K::FIELDS
            .iter()
            .copied()
            .zip(self.kept.iter())
            .find(|(field, _)| path.starts_with(field))
    }

    /// The value at `path`: a kept path, or a path inside one.
    pub fn field(&self, path: &[&str]) -> Option<Value> {
        let (field, kept) = self.kept_at(path)?;
        let mut value = kept.value()?;
        let node = path[field.len()..]
            .iter()
            .try_fold(&mut value, |node, segment| step_mut(node, segment))?;
        Some(node.take()).filter(|value| !value.is_null())
    }

    /// A text field ("" when absent or not a string); a kept string is read in place.
    pub fn text(&self, path: &[&str]) -> Cow<'_, str> {
        match self.kept_at(path) {
            Some((field, Kept::Text(text))) if field.len() == path.len() => Cow::Borrowed(text),
            _ => match self.field(path) {
                Some(Value::String(text)) => Cow::Owned(text),
                _ => Cow::Borrowed(""),
            },
        }
    }

    /// The object's uid, when its kind keeps it.
    pub fn uid(&self) -> Option<&str> {
        match self.kept_at(UID) {
            Some((_, Kept::Text(uid))) => Some(uid),
            _ => None,
        }
    }

    /// The cached object in its Kubernetes shape: its identity and the kept fields.
    pub fn expand(&self) -> Value {
        let mut metadata = Map::new();
        let identity = [
            ("name", &self.metadata.name),
            ("namespace", &self.metadata.namespace),
            ("resourceVersion", &self.metadata.resource_version),
        ];
        for (key, value) in identity {
            if let Some(value) = value {
                metadata.insert(key.into(), Value::String(value.clone()));
            }
        }
        let mut out = Value::Object(Map::from_iter([("metadata".into(), metadata.into())]));
        for (path, kept) in K::FIELDS.iter().zip(self.kept.iter()) {
            let Some(value) = kept.value() else {
                continue;
            };
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
                .insert((*last).into(), value);
        }
        out
    }
}

impl<'de, K: Kind> Deserialize<'de> for Cached<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Cached::from_value(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl<K: Kind> kube::Resource for Cached<K> {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        K::KIND.into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        K::GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        K::VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        K::PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }

    /// The uid is a kept field, not in `metadata` (where every `ObjectRef` of the object,
    /// in the store and the controller's queue, would copy it).
    fn object_ref(&self, dt: &()) -> ObjectReference {
        ObjectReference {
            name: self.metadata.name.clone(),
            namespace: self.metadata.namespace.clone(),
            uid: self.uid().map(str::to_string),
            api_version: Some(Self::api_version(dt).into_owned()),
            kind: Some(K::KIND.into()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cached<K: Kind>(value: Value) -> Cached<K> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn an_application_keeps_its_annotations_images_and_uid_only() {
        let app: CachedApplication = cached(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "web", "namespace": "argocd", "uid": "u1", "resourceVersion": "7",
                "labels": {"team": "a"},
                "annotations": {AUTHORIZED_STAGE_ANNOTATION: "kargo-demo:prod", "other": "x"},
                "managedFields": [{"manager": "argocd"}]},
            "spec": {"project": "default"},
            "status": {"health": {"status": "Healthy"}, "summary": {"images": ["nginx:1"]}}
        }));
        assert_eq!(
            app.expand(),
            json!({
                "metadata": {"name": "web", "namespace": "argocd", "uid": "u1",
                    "resourceVersion": "7", "annotations": {AUTHORIZED_STAGE_ANNOTATION: "kargo-demo:prod"}},
                "status": {"summary": {"images": ["nginx:1"]}}
            })
        );
        assert!(matches!(
            app.text(&["metadata", "annotations", AUTHORIZED_STAGE_ANNOTATION]),
            Cow::Borrowed("kargo-demo:prod")
        ));
        assert_eq!(
            app.field(&["metadata", "annotations", IGNORE_ANNOTATION]),
            None
        );
        assert_eq!(app.text(&["status", "summary", "images", "0"]), "nginx:1");
        assert_eq!(app.uid(), Some("u1"));
        // The uid is kept once, not in the metadata every ObjectRef copies.
        assert_eq!(app.metadata.uid, None);
        assert!(app.metadata.annotations.is_none() && app.metadata.labels.is_none());
        let reference = kube::Resource::object_ref(&app, &());
        assert_eq!(
            (
                reference.uid.as_deref(),
                reference.api_version.as_deref(),
                reference.kind.as_deref()
            ),
            (
                Some("u1"),
                Some("argoproj.io/v1alpha1"),
                Some("Application")
            )
        );
    }

    #[test]
    fn paths_inside_kept_fields_and_list_indexes_are_read() {
        let stage: CachedStage = cached(json!({
            "metadata": {"name": "prod", "namespace": "kargo-demo"},
            "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "w"}}]},
            "status": {"freightHistory": [{"items": {"Warehouse/w": {"name": "f1"}}}, {"old": true}]}
        }));
        assert_eq!(
            stage.text(&["spec", "requestedFreight", "0", "origin", "name"]),
            "w"
        );
        assert_eq!(stage.text(&["spec", "requestedFreight", "1"]), "");
        let expanded = stage.expand();
        assert_eq!(
            expanded.pointer("/status/freightHistory/0/items/Warehouse~1w/name"),
            Some(&json!("f1"))
        );
        assert_eq!(expanded.pointer("/status/freightHistory/1"), None);
        assert_eq!(stage.uid(), None);
    }

    #[test]
    fn a_freight_keeps_its_resource_version_for_newest_first() {
        let freight: CachedFreight = cached(json!({
            "metadata": {"name": "f", "namespace": "kargo-demo", "resourceVersion": "42"},
            "origin": {"kind": "Warehouse", "name": "w"},
            "images": [{"repoURL": "nginx", "tag": "1", "digest": "sha256:1", "n": 1.5}]
        }));
        assert_eq!(
            freight.expand(),
            json!({"metadata": {"name": "f", "namespace": "kargo-demo", "resourceVersion": "42"},
                "origin": {"kind": "Warehouse", "name": "w"},
                "images": [{"repoURL": "nginx", "tag": "1", "digest": "sha256:1", "n": 1.5}]})
        );
    }

    #[test]
    fn a_promotion_keeps_the_managed_by_label() {
        let promotion: CachedPromotion = cached(json!({
            "metadata": {"name": "p", "namespace": "kargo-demo",
                "labels": {MANAGED_BY_LABEL: "kargo-argocd-observer", "other": "x"}},
            "spec": {"stage": "prod", "freight": "f"}
        }));
        assert_eq!(
            promotion.expand(),
            json!({"metadata": {"name": "p", "namespace": "kargo-demo",
                "labels": {MANAGED_BY_LABEL: "kargo-argocd-observer"}},
                "spec": {"stage": "prod", "freight": "f"}})
        );
    }

    #[test]
    fn an_object_without_a_name_is_refused_where_it_is_read() {
        let error = serde_json::from_value::<CachedStage>(json!({"metadata": {"namespace": "x"}}))
            .unwrap_err();
        assert!(
            error.to_string().contains("a Stage without metadata.name"),
            "{error}"
        );
    }
}
