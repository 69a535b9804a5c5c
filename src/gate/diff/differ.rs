//! The diff's room for computing diffs: per Application, memoised per distinct pair of inputs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::Value;

use super::crds::CrdChange;
use super::fields::{FieldChange, diff_values};
use super::identity::{AppKey, ObjectKey, key_of};
use super::{AppDiff, AppStatus, ChartMove, ObjectChange, ObjectsDiff, REDACTED, RenderDiff};
use crate::render::parsed::Object;
use crate::render::{RenderedApplication, Rendering};

/// Charts an Application renders from: (repoURL, chart) -> version.
pub fn charts_of(app: &RenderedApplication) -> BTreeMap<(String, String), String> {
    app.sources
        .iter()
        .filter_map(|s| {
            let chart = s.get("chart")?.as_str()?;
            let repo = s.get("repoURL").and_then(Value::as_str).unwrap_or("");
            let version = s
                .get("targetRevision")
                .and_then(Value::as_str)
                .unwrap_or("");
            Some(((repo.to_string(), chart.to_string()), version.to_string()))
        })
        .collect()
}

/// The two objects a field diff was computed for, and the diff.
type FieldsOfPair = (
    Object,
    Object,
    Arc<Vec<FieldChange>>,
    Option<Arc<CrdChange>>,
);

/// Computes object diffs once per distinct pair of renders and field diffs once per distinct
/// pair of objects, however many Applications share them.
#[derive(Default)]
pub struct Differ {
    by_renders: HashMap<(Vec<String>, Vec<String>), Arc<ObjectsDiff>>,
    /// Keyed by the objects' addresses; the objects are kept so an address is never reused.
    by_objects: HashMap<(usize, usize), FieldsOfPair>,
}

impl Differ {
    /// The diff of two Applications' objects (`None`: the Application is absent).
    pub fn applications(
        &mut self,
        old: Option<&RenderedApplication>,
        new: Option<&RenderedApplication>,
    ) -> Arc<ObjectsDiff> {
        let keys =
            |a: Option<&RenderedApplication>| a.map(|a| a.render_keys.clone()).unwrap_or_default();
        let (old_keys, new_keys) = (keys(old), keys(new));
        // Equal render keys: the same objects, nothing to compare. (Keys are empty for an
        // Application built without the engine; those are always compared.)
        if old.is_some() && new.is_some() && !old_keys.is_empty() && old_keys == new_keys {
            return Arc::default();
        }
        let memo = !old_keys.is_empty() || !new_keys.is_empty();
        if memo && let Some(diff) = self.by_renders.get(&(old_keys.clone(), new_keys.clone())) {
            return diff.clone();
        }
        let diff = Arc::new(self.objects(
            old.map(|a| a.objects.as_slice()).unwrap_or_default(),
            new.map(|a| a.objects.as_slice()).unwrap_or_default(),
        ));
        if memo {
            self.by_renders.insert((old_keys, new_keys), diff.clone());
        }
        diff
    }

    /// Objects added, removed and changed (with fields) between two object lists.
    pub fn objects(&mut self, old: &[Object], new: &[Object]) -> ObjectsDiff {
        let index = |objects: &[Object]| -> BTreeMap<ObjectKey, Object> {
            objects
                .iter()
                .map(|o| (ObjectKey::of(o), o.clone()))
                .collect()
        };
        let (old, new) = (index(old), index(new));
        let added = new
            .keys()
            .filter(|k| !old.contains_key(*k))
            .cloned()
            .collect();
        let removed = old
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect();
        let mut changed = Vec::new();
        for (key, new_object) in &new {
            let Some(old_object) = old.get(key) else {
                continue;
            };
            if Arc::ptr_eq(old_object, new_object) {
                continue;
            }
            let pair = (
                Arc::as_ptr(old_object) as usize,
                Arc::as_ptr(new_object) as usize,
            );
            let (fields, crd) = match self.by_objects.get(&pair) {
                Some((_, _, fields, crd)) => (fields.clone(), crd.clone()),
                None => {
                    let fields = Arc::new(field_changes(key, old_object, new_object));
                    let crd = if key.kind == "CustomResourceDefinition" && !fields.is_empty() {
                        CrdChange::of(old_object, new_object, &fields).map(Arc::new)
                    } else {
                        None
                    };
                    self.by_objects.insert(
                        pair,
                        (
                            old_object.clone(),
                            new_object.clone(),
                            fields.clone(),
                            crd.clone(),
                        ),
                    );
                    (fields, crd)
                }
            };
            if fields.is_empty() {
                continue;
            }
            changed.push(ObjectChange {
                object: key.clone(),
                fields,
                crd,
            });
        }
        ObjectsDiff {
            added,
            removed,
            changed,
        }
    }
}

/// The fields that differ between two versions of one object, Secret values hidden.
fn field_changes(key: &ObjectKey, old: &Value, new: &Value) -> Vec<FieldChange> {
    let mut fields = Vec::new();
    if old == new {
        return fields;
    }
    diff_values("", old, new, &mut fields);
    if key.kind == "Secret" && key.group.is_empty() {
        for field in &mut fields {
            if field.path.starts_with("data") || field.path.starts_with("stringData") {
                field.old = field.old.as_ref().map(|_| Value::String(REDACTED.into()));
                field.new = field.new.as_ref().map(|_| Value::String(REDACTED.into()));
            }
        }
    }
    fields
}

/// Objects added, removed and changed between two object lists (a one-off `Differ`).
pub fn diff_objects(old: &[Object], new: &[Object]) -> ObjectsDiff {
    Differ::default().objects(old, new)
}

pub fn diff(base: &Rendering, head: &Rendering) -> RenderDiff {
    diff_with(&mut Differ::default(), base, head)
}

/// The charts an Application renders at another version at the head than at the base (a
/// chart it did not render before is no move).
pub fn chart_moves(old: &RenderedApplication, new: &RenderedApplication) -> Vec<ChartMove> {
    let (before, after) = (charts_of(old), charts_of(new));
    after
        .iter()
        .filter_map(|((repo, chart), to)| {
            let from = before.get(&(repo.clone(), chart.clone()))?;
            (from != to).then(|| ChartMove {
                chart: chart.clone(),
                repo_url: repo.clone(),
                from: from.clone(),
                to: to.clone(),
            })
        })
        .collect()
}

pub fn diff_with(differ: &mut Differ, base: &Rendering, head: &Rendering) -> RenderDiff {
    let base_apps: BTreeMap<AppKey, &RenderedApplication> =
        base.applications.iter().map(|a| (key_of(a), a)).collect();
    let head_apps: BTreeMap<AppKey, &RenderedApplication> =
        head.applications.iter().map(|a| (key_of(a), a)).collect();
    let mut keys: Vec<&AppKey> = base_apps.keys().chain(head_apps.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut result = RenderDiff::default();
    for key in keys {
        let (old, new) = (base_apps.get(key).copied(), head_apps.get(key).copied());
        let objects = differ.applications(old, new);
        let status = match (old, new) {
            (None, Some(_)) => AppStatus::Added,
            (Some(_), None) => AppStatus::Removed,
            _ => AppStatus::Changed,
        };
        let spec_changed = match (old, new) {
            (Some(o), Some(n)) => {
                o.sources != n.sources || o.destination_namespace != n.destination_namespace
            }
            _ => false,
        };
        let mut application_fields = Vec::new();
        if let (Some(o), Some(n)) = (old, new)
            && o.stored != n.stored
        {
            diff_values("", &o.stored, &n.stored, &mut application_fields);
        }
        let chart_moves = match (old, new) {
            (Some(o), Some(n)) => chart_moves(o, n),
            _ => Vec::new(),
        };
        if status == AppStatus::Changed
            && objects.is_empty()
            && !spec_changed
            && application_fields.is_empty()
        {
            continue;
        }
        match status {
            AppStatus::Added => result.counts.applications_added += 1,
            AppStatus::Removed => result.counts.applications_removed += 1,
            AppStatus::Changed => result.counts.applications_changed += 1,
        }
        result.counts.objects_added += objects.added.len();
        result.counts.objects_removed += objects.removed.len();
        result.counts.objects_changed += objects.changed.len();
        result.applications.push(AppDiff {
            app: key.clone(),
            status,
            chart_moves,
            objects,
            spec_changed,
            application_fields,
            chart_only: None,
        });
    }
    result.assert_consistent();
    result
}
