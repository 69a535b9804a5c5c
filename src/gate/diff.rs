//! The diff of two renderings: Applications added, removed and changed per cluster; per
//! Application, objects added, removed and changed; per changed object, the fields.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod crds;
mod differ;
mod fields;
mod identity;
/// The JSON shape of a diff: each distinct object change once, with the Applications it
/// applies to, and per Application the ids of its changes. A CRD schema change an operator
/// chart makes on 600 clusters is written once, not 600 times.
mod wire;

pub use self::crds::{CrdChange, CrdVersion, is_crd_version_field, is_schema_field};
pub use self::differ::{Differ, chart_moves, charts_of, diff, diff_objects, diff_with};
pub use self::fields::{FieldChange, diff_values, diff_values_limited};
pub use self::identity::{AppKey, ObjectKey, key_of};

/// Shown instead of a Secret's values.
pub const REDACTED: &str = "(secret value hidden)";

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
    /// The counts are the list's (each Application's status and objects summed) and the list
    /// has one entry per Application, sorted: the report's numbers and its lists come from one
    /// diff. A disagreement is a bug that would publish wrong numbers silently, so it stops
    /// the process (on in production).
    pub fn assert_consistent(&self) {
        let mut counted = DiffCounts::default();
        for app in &self.applications {
            match app.status {
                AppStatus::Added => counted.applications_added += 1,
                AppStatus::Removed => counted.applications_removed += 1,
                AppStatus::Changed => counted.applications_changed += 1,
            }
            counted.objects_added += app.objects.added.len();
            counted.objects_removed += app.objects.removed.len();
            counted.objects_changed += app.objects.changed.len();
        }
        assert_eq!(
            counted, self.counts,
            "the diff's counts disagree with its Applications"
        );
        assert!(
            self.applications.windows(2).all(|w| w[0].app < w[1].app),
            "the diff's Applications are not sorted or one is listed twice"
        );
    }

    /// How many distinct object changes the diff holds (as `--json` lists them).
    pub fn distinct_changes(&self) -> usize {
        wire::count(self)
    }
}

#[cfg(test)]
mod tests;
