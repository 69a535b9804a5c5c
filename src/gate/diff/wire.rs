//! The diff's room for its JSON shape: distinct changes once, with the Applications they apply to.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::crds::CrdChange;
use super::fields::FieldChange;
use super::identity::{AppKey, ObjectKey};
use super::{AppDiff, AppStatus, ChartMove, DiffCounts, ObjectChange, ObjectsDiff, RenderDiff};

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
    // A diff shared by many Applications (one `Arc`) adds no change after its first reading.
    let mut read = std::collections::HashSet::new();
    for app in &diff.applications {
        if read.insert(Arc::as_ptr(&app.objects)) {
            table.ids(&app.objects, &app.app, false);
        }
        if let Some(chart_only) = &app.chart_only
            && read.insert(Arc::as_ptr(chart_only))
        {
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
                let change = by_id
                    .get(id)
                    .ok_or_else(|| serde::de::Error::custom(format!("no change with id {id}")))?;
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
