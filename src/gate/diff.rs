//! The diff of two renderings: Applications added, removed and changed per cluster; per
//! Application, objects added, removed and changed; per changed object, the fields.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::render::parsed::Object;
use crate::render::{RenderedApplication, Rendering, object_sort_key};

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

/// Shown instead of a Secret's values.
pub const REDACTED: &str = "(secret value hidden)";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    /// `spec.template.spec.containers[0].image`
    pub path: String,
    /// Absent from the JSON when the field was absent; `null` when it was null.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub old: Option<Value>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub new: Option<Value>,
}

/// A key present in the JSON is `Some`, even when its value is `null`.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectChange {
    pub object: ObjectKey,
    /// Shared by every Application whose render produced the same pair of objects.
    pub fields: Arc<Vec<FieldChange>>,
    /// For a CustomResourceDefinition: its versions at both commits and how many schema
    /// fields moved (the report shows this table, not the schema diff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd: Option<Arc<CrdChange>>,
}

/// A CustomResourceDefinition's change, summarised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdChange {
    pub before: Vec<CrdVersion>,
    pub after: Vec<CrdVersion>,
    /// Schema fields (paths under a version's `schema`) added, removed and changed, in the
    /// versions both commits have.
    pub schema_fields_added: usize,
    pub schema_fields_removed: usize,
    pub schema_fields_changed: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrdVersion {
    pub name: String,
    pub served: bool,
    pub storage: bool,
}

impl CrdChange {
    fn of(old: &Value, new: &Value, fields: &[FieldChange]) -> Option<CrdChange> {
        let versions = |crd: &Value| -> Option<Vec<CrdVersion>> {
            if crd.get("kind")?.as_str()? != "CustomResourceDefinition" {
                return None;
            }
            Some(
                crd.pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| {
                        Some(CrdVersion {
                            name: v.get("name")?.as_str()?.to_string(),
                            served: v.get("served").and_then(Value::as_bool) == Some(true),
                            storage: v.get("storage").and_then(Value::as_bool) == Some(true),
                        })
                    })
                    .collect(),
            )
        };
        let (before, after) = (versions(old)?, versions(new)?);
        let mut change = CrdChange {
            before,
            after,
            schema_fields_added: 0,
            schema_fields_removed: 0,
            schema_fields_changed: 0,
        };
        for field in fields.iter().filter(|f| is_schema_field(&f.path)) {
            match (&field.old, &field.new) {
                (None, Some(_)) => change.schema_fields_added += 1,
                (Some(_), None) => change.schema_fields_removed += 1,
                _ => change.schema_fields_changed += 1,
            }
        }
        Some(change)
    }
}

/// The part of a CRD field path after `spec.versions[...]`, when it is one.
fn version_rest(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("spec.versions[")?;
    // Version names are DNS labels (the gate refuses others): no `]` inside.
    Some(&rest[rest.find(']')? + 1..])
}

/// A path inside a CRD version's schema (`spec.versions[name=v1].schema.…`).
pub fn is_schema_field(path: &str) -> bool {
    version_rest(path).is_some_and(|rest| rest == ".schema" || rest.starts_with(".schema."))
}

/// A path the CRD table summarises: a whole version added or removed, its served and storage
/// flags, its schema. Other version fields (deprecated, subresources, printer columns) are
/// listed like any field.
pub fn is_crd_version_field(path: &str) -> bool {
    version_rest(path)
        .is_some_and(|rest| rest.is_empty() || rest == ".served" || rest == ".storage")
        || is_schema_field(path)
}

/// Objects added, removed and changed between two object lists. One value is shared by every
/// Application whose pair of renders is the same.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectsDiff {
    pub added: Vec<ObjectKey>,
    pub removed: Vec<ObjectKey>,
    pub changed: Vec<ObjectChange>,
}

impl ObjectsDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// A chart whose version differs between the two renders of one Application.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartMove {
    pub chart: String,
    pub repo_url: String,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppStatus {
    Added,
    Removed,
    Changed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AppDiff {
    pub app: AppKey,
    pub status: AppStatus,
    pub chart_moves: Vec<ChartMove>,
    /// What the Application's render changed.
    pub objects: Arc<ObjectsDiff>,
    /// True when the Application's own spec (sources, destination) changed.
    pub spec_changed: bool,
    /// The generated Application itself, field by field (labels, annotations, finalizers,
    /// spec: a sync policy, a destination, a source), between the two commits.
    pub application_fields: Vec<FieldChange>,
    /// When the chart version moved and something else changed too: the chart's own change,
    /// rendered with the head's values at both versions.
    pub chart_only: Option<Arc<ObjectsDiff>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffCounts {
    pub applications_added: usize,
    pub applications_removed: usize,
    pub applications_changed: usize,
    pub objects_added: usize,
    pub objects_removed: usize,
    pub objects_changed: usize,
}

/// Serialised as distinct changes and where they apply (see `wire`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderDiff {
    pub counts: DiffCounts,
    /// Only Applications with a difference, sorted by cluster and name.
    pub applications: Vec<AppDiff>,
}

impl RenderDiff {
    /// How many distinct object changes the diff holds (as `--json` lists them).
    pub fn distinct_changes(&self) -> usize {
        wire::count(self)
    }
}

pub fn key_of(app: &RenderedApplication) -> AppKey {
    AppKey {
        cluster: app.cluster.name.clone(),
        namespace: app.namespace.clone(),
        name: app.name.clone(),
    }
}

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
            (Some(o), Some(n)) => {
                let (before, after) = (charts_of(o), charts_of(n));
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
    result
}

/// The JSON shape of a diff: each distinct object change once, with the Applications it
/// applies to, and per Application the ids of its changes. A CRD schema change an operator
/// chart makes on 600 clusters is written once, not 600 times.
mod wire {
    use super::*;
    use serde::{Deserializer, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Diff {
        counts: DiffCounts,
        changes: Vec<Change>,
        applications: Vec<App>,
    }

    #[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Hash)]
    #[serde(rename_all = "lowercase")]
    enum ChangeKind {
        Added,
        Removed,
        Changed,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Change {
        id: usize,
        change: ChangeKind,
        object: ObjectKey,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        fields: Arc<Vec<FieldChange>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        crd: Option<Arc<CrdChange>>,
        /// The Applications whose render makes this change.
        applications: Vec<AppKey>,
        /// The Applications whose chart version move makes it by itself.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        chart_only_in: Vec<AppKey>,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct App {
        app: AppKey,
        status: AppStatus,
        chart_moves: Vec<ChartMove>,
        /// Ids of `changes`.
        changes: Vec<usize>,
        spec_changed: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        application_fields: Vec<FieldChange>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chart_only: Option<Vec<usize>>,
    }

    #[derive(Default)]
    struct Table {
        changes: Vec<Change>,
        ids: HashMap<(ChangeKind, ObjectKey, usize), usize>,
        /// Field lists by address, then by content: each distinct list gets one number.
        by_address: HashMap<usize, usize>,
        by_text: HashMap<String, usize>,
    }

    impl Table {
        fn fields_id(&mut self, change: &ObjectChange) -> usize {
            let address = Arc::as_ptr(&change.fields) as usize;
            if let Some(&id) = self.by_address.get(&address) {
                return id;
            }
            let text = serde_json::to_string(&(&change.fields, &change.crd)).unwrap_or_default();
            let next = self.by_text.len() + 1;
            let id = *self.by_text.entry(text).or_insert(next);
            self.by_address.insert(address, id);
            id
        }

        fn id(
            &mut self,
            kind: ChangeKind,
            object: &ObjectKey,
            change: Option<&ObjectChange>,
            app: &AppKey,
            chart_only: bool,
        ) -> usize {
            let fields_id = change.map(|c| self.fields_id(c)).unwrap_or(0);
            let next = self.changes.len();
            let id = *self
                .ids
                .entry((kind, object.clone(), fields_id))
                .or_insert(next);
            if id == next {
                self.changes.push(Change {
                    id,
                    change: kind,
                    object: object.clone(),
                    fields: change.map(|c| c.fields.clone()).unwrap_or_default(),
                    crd: change.and_then(|c| c.crd.clone()),
                    applications: Vec::new(),
                    chart_only_in: Vec::new(),
                });
            }
            let change = &mut self.changes[id];
            let apps = if chart_only {
                &mut change.chart_only_in
            } else {
                &mut change.applications
            };
            if apps.last() != Some(app) {
                apps.push(app.clone());
            }
            id
        }

        fn ids(&mut self, diff: &ObjectsDiff, app: &AppKey, chart_only: bool) -> Vec<usize> {
            let mut ids = Vec::new();
            for object in &diff.added {
                ids.push(self.id(ChangeKind::Added, object, None, app, chart_only));
            }
            for object in &diff.removed {
                ids.push(self.id(ChangeKind::Removed, object, None, app, chart_only));
            }
            for change in &diff.changed {
                ids.push(self.id(
                    ChangeKind::Changed,
                    &change.object,
                    Some(change),
                    app,
                    chart_only,
                ));
            }
            ids
        }
    }

    pub(super) fn count(diff: &RenderDiff) -> usize {
        let mut table = Table::default();
        for app in &diff.applications {
            table.ids(&app.objects, &app.app, false);
            if let Some(chart_only) = &app.chart_only {
                table.ids(chart_only, &app.app, true);
            }
        }
        table.changes.len()
    }

    impl Serialize for RenderDiff {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut table = Table::default();
            let mut applications = Vec::with_capacity(self.applications.len());
            for app in &self.applications {
                let changes = table.ids(&app.objects, &app.app, false);
                let chart_only = app
                    .chart_only
                    .as_ref()
                    .map(|diff| table.ids(diff, &app.app, true));
                applications.push(App {
                    app: app.app.clone(),
                    status: app.status,
                    chart_moves: app.chart_moves.clone(),
                    changes,
                    spec_changed: app.spec_changed,
                    application_fields: app.application_fields.clone(),
                    chart_only,
                });
            }
            Diff {
                counts: self.counts.clone(),
                changes: table.changes,
                applications,
            }
            .serialize(serializer)
        }
    }

    impl<'de> Deserialize<'de> for RenderDiff {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let wire = Diff::deserialize(deserializer)?;
            let by_id: HashMap<usize, &Change> = wire.changes.iter().map(|c| (c.id, c)).collect();
            let objects = |ids: &[usize]| -> Result<ObjectsDiff, D::Error> {
                let mut diff = ObjectsDiff::default();
                for id in ids {
                    let change = by_id.get(id).ok_or_else(|| {
                        serde::de::Error::custom(format!("no change with id {id}"))
                    })?;
                    match change.change {
                        ChangeKind::Added => diff.added.push(change.object.clone()),
                        ChangeKind::Removed => diff.removed.push(change.object.clone()),
                        ChangeKind::Changed => diff.changed.push(ObjectChange {
                            object: change.object.clone(),
                            fields: change.fields.clone(),
                            crd: change.crd.clone(),
                        }),
                    }
                }
                Ok(diff)
            };
            let mut applications = Vec::with_capacity(wire.applications.len());
            for app in &wire.applications {
                applications.push(AppDiff {
                    app: app.app.clone(),
                    status: app.status,
                    chart_moves: app.chart_moves.clone(),
                    objects: Arc::new(objects(&app.changes)?),
                    spec_changed: app.spec_changed,
                    application_fields: app.application_fields.clone(),
                    chart_only: match &app.chart_only {
                        Some(ids) => Some(Arc::new(objects(ids)?)),
                        None => None,
                    },
                });
            }
            Ok(RenderDiff {
                counts: wire.counts,
                applications,
            })
        }
    }
}

fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (_, false) => format!(
            "{parent}[{}]",
            serde_json::to_string(key).unwrap_or_default()
        ),
    }
}

/// Appends the leaf differences between `old` and `new` under `path`.
pub fn diff_values(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    walk_diff(path, old, new, &mut |path, old, new| {
        out.push(FieldChange {
            path,
            old: old.cloned(),
            new: new.cloned(),
        })
    });
}

/// The first `limit` leaf differences, and how many more there are: nothing beyond the limit
/// is copied (a chart's values.yaml can be megabytes).
pub fn diff_values_limited(old: &Value, new: &Value, limit: usize) -> (Vec<FieldChange>, usize) {
    let mut out = Vec::new();
    let mut more = 0usize;
    walk_diff("", old, new, &mut |path, old, new| {
        if out.len() < limit {
            out.push(FieldChange {
                path,
                old: old.cloned(),
                new: new.cloned(),
            });
        } else {
            more += 1;
        }
    });
    (out, more)
}

/// Receives each leaf difference: its path, the old value and the new one.
type Emit<'e> = dyn FnMut(String, Option<&Value>, Option<&Value>) + 'e;

fn walk_diff(path: &str, old: &Value, new: &Value, emit: &mut Emit<'_>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => walk_diff(&child_path(path, k), va, vb, emit),
                    None => emit(child_path(path, k), Some(va), None),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    emit(child_path(path, k), None, Some(vb));
                }
            }
        }
        (Value::Array(a), Value::Array(b))
            if named_items(a).is_some() && named_items(b).is_some() =>
        {
            // Lists of named items (containers, ports, CRD versions) are compared by name, so
            // an insertion does not show as a change of every later item.
            let (named_a, named_b) = (
                named_items(a).unwrap_or_default(),
                named_items(b).unwrap_or_default(),
            );
            for (name, x) in &named_a {
                let item_path = format!("{path}[name={name}]");
                match named_b.iter().find(|(n, _)| n == name) {
                    Some((_, y)) => walk_diff(&item_path, x, y, emit),
                    None => emit(item_path, Some(x), None),
                }
            }
            for (name, y) in &named_b {
                if !named_a.iter().any(|(n, _)| n == name) {
                    emit(format!("{path}[name={name}]"), None, Some(y));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let item_path = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => walk_diff(&item_path, x, y, emit),
                    (x, y) if x.is_some() || y.is_some() => emit(item_path, x, y),
                    _ => {}
                }
            }
        }
        (a, b) if a != b => emit(path.to_string(), Some(a), Some(b)),
        _ => {}
    }
}

/// The items of a list keyed by their `name`, when every item is an object with a distinct one.
fn named_items(items: &[Value]) -> Option<Vec<(String, &Value)>> {
    let mut out: Vec<(String, &Value)> = Vec::with_capacity(items.len());
    for item in items {
        let name = item.get("name")?.as_str()?.to_string();
        if out.iter().any(|(n, _)| *n == name) {
            return None;
        }
        out.push((name, item));
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests;
