//! The gate's rules: findings with a stable id, a severity and their evidence.
//!
//! `evaluate` runs every rule in a fixed order over both renderings, the diff and the head's
//! repository scan. The rules live by family: `served` (versions and kinds a cluster serves),
//! `review` (notes a reviewer needs, from the diff), `on_apply` (what the API server and Argo
//! CD would do with the head); `scan` reads the head's manifests and chart templates (and
//! notes the files it could not read). What a CustomResourceDefinition declares is
//! `super::crd`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::crd::CrdInfo;
use super::diff::{ObjectKey, RenderDiff};
use crate::git::Snapshot;
use crate::render::inventory::Inventory;
use crate::render::parsed::Object;
use crate::render::{RenderedApplication, Rendering};

mod on_apply;
mod review;
mod scan;
mod served;
#[cfg(test)]
mod tests;

pub use review::crosses_major;
pub use scan::{ManifestScan, scan_chart_templates, scan_manifests};

pub const DROPPED_SERVED_VERSION: &str = "dropped-served-version";
/// A CRD's new version list leaves out the version it stored objects in at the merge base.
pub const STORED_VERSION_REMOVED: &str = "stored-version-removed";
/// A CRD's new version list leaves out a version the merge base listed (stored once, maybe).
pub const LISTED_VERSION_REMOVED: &str = "listed-version-removed";
pub const CHART_RENDERS_UNSERVED_VERSION: &str = "chart-renders-unserved-version";
/// The same, from a chart in this repository whose template computes the apiVersion: there is
/// something here to change, but no literal line says where.
pub const REPOSITORY_CHART_RENDERS_UNSERVED_VERSION: &str =
    "repository-chart-renders-unserved-version";
pub const RENDER_FAILED: &str = "render-failed";
pub const ADDON_ADDED: &str = "addon-added";
pub const MAJOR_VERSION: &str = "major-version-boundary";
pub const RBAC_REMOVED: &str = "rbac-removed";
pub const CRD_ADDED: &str = "crd-added";
pub const CRD_REMOVED: &str = "crd-removed";
pub const DROPPED_VERSION_UNUSED: &str = "dropped-version-unused";
pub const UNSCANNED_FILE: &str = "unscanned-file";
/// A rendered custom object the API server would quietly prune a value from, or reject.
pub const FIELD_PRUNED_ON_APPLY: &str = "field-pruned-on-apply";
/// Applications the merge base generates and the head no longer does: Argo CD deletes them,
/// and with its resources finalizer, what they deployed.
pub const APPLICATIONS_REMOVED: &str = "applications-removed";
/// A change to generated Applications that lets Argo CD delete or overwrite on its own.
pub const SYNC_POLICY_CHANGED: &str = "sync-policy-changed";
/// An Application whose destination is no cluster of the inventory.
pub const DESTINATION_UNKNOWN: &str = "destination-unknown";
/// A rendered CustomResourceDefinition whose names the API server would reject.
pub const CRD_NAME_INVALID: &str = "crd-name-invalid";
/// An object of a group its cluster does not serve at all (no version natively, no CRD
/// rendered there): Argo CD would fail the sync. Blocking where the inventory lists the
/// cluster's APIs, a note where it does not.
pub const KIND_NOT_SERVED: &str = "kind-not-served-on-cluster";

/// A rendered object whose API group its destination cluster does not serve.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotServed {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// `namespace/name on cluster`, the Applications that render it (the first 25).
    pub applications: Vec<String>,
    /// How many more Applications render it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_applications: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Blocking,
    Note,
}

/// A manifest in the repository that declares an apiVersion.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    /// Repository-relative file path.
    pub path: String,
    /// Index of the document among the file's non-empty documents (0-based).
    pub document: usize,
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// A Helm template of a chart in this repository (not plain YAML): the apiVersion is a
    /// literal line of the template, and `document` counts the template's `---` separators.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub template: bool,
}

/// A CRD that stopped serving versions the repository still declares: the evidence a repair
/// needs (the destination is the storage version at head).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedServedVersion {
    pub crd: String,
    pub group: String,
    pub kind: String,
    pub dropped: Vec<String>,
    pub served: Vec<String>,
    pub storage: String,
    pub clusters: Vec<String>,
    pub consumers: Vec<Consumer>,
}

/// An object a chart renders with an apiVersion the target no longer serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnservedRendered {
    pub application: String,
    pub cluster: String,
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub served: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    /// One line a person reads.
    pub summary: String,
    pub evidence: Value,
}

/// Work the rules do per distinct object, not per Application: an operator chart's CRDs are
/// one shared object on every cluster (and at both commits).
#[derive(Default)]
struct Memo {
    /// By object address; the object is kept so the address is not reused.
    crds: HashMap<usize, (Object, Option<NamedCrd>)>,
    /// (object, CRD, version) addresses -> the outcome of pruning and validating.
    losses: HashMap<(usize, usize), (Object, Object, Vec<String>)>,
}

/// A CRD's name and what it serves, shared by every Application that renders it.
type NamedCrd = (String, Arc<CrdInfo>);

impl Memo {
    /// [`crd_info`](super::crd::crd_info) of an object, worked out once per object.
    fn crd_info(&mut self, object: &Object) -> Option<NamedCrd> {
        self.crds
            .entry(Arc::as_ptr(object) as usize)
            .or_insert_with(|| {
                let info = super::crd::crd_info(object).map(|(name, info)| (name, Arc::new(info)));
                (object.clone(), info)
            })
            .1
            .clone()
    }
}

/// The CRDs a rendering renders, by cluster and CRD name.
type CrdsByCluster = BTreeMap<String, BTreeMap<String, Arc<CrdInfo>>>;

/// The CRDs each cluster's Applications render in one rendering.
fn crds_by_cluster(memo: &mut Memo, rendering: &Rendering) -> CrdsByCluster {
    let mut out: CrdsByCluster = BTreeMap::new();
    for app in &rendering.applications {
        for object in &app.objects {
            if let Some((name, info)) = memo.crd_info(object) {
                out.entry(app.cluster.name.clone())
                    .or_default()
                    .insert(name, info);
            }
        }
    }
    out
}

/// Each cluster's CRDs by (group, kind), borrowed from `crds`: where two CRDs of a cluster
/// define one kind, the first by name (the order `crds` lists them in): the one Argo CD
/// applies first, whose names the API server accepts (`on_apply.rs` decides the same).
fn crds_by_kind(crds: &CrdsByCluster) -> HashMap<&str, HashMap<(&str, &str), &CrdInfo>> {
    crds.iter()
        .map(|(cluster, named)| {
            let mut by_kind: HashMap<(&str, &str), &CrdInfo> = HashMap::new();
            for info in named.values() {
                by_kind
                    .entry((info.group.as_str(), info.kind.as_str()))
                    .or_insert(info);
            }
            (cluster.as_str(), by_kind)
        })
        .collect()
}

/// What the rules read: both renderings with the CRDs each renders per cluster, the diff, the
/// inventory, and the head's repository scan.
struct Inputs<'a> {
    base: &'a Rendering,
    head: &'a Rendering,
    /// The repository at the head and (when it could be read) at the merge base: the
    /// manifests it holds are checked like rendered objects.
    head_snapshot: &'a Snapshot,
    base_snapshot: Option<&'a Snapshot>,
    diff: &'a RenderDiff,
    inventory: &'a Inventory,
    base_crds: CrdsByCluster,
    head_crds: CrdsByCluster,
    /// Every manifest in the head's YAML files, and the files that could not be read.
    scan: ManifestScan,
    /// Charts in this repository that head Applications render, by directory.
    chart_dirs: BTreeMap<String, Vec<String>>,
    /// The literal apiVersions of those charts' templates, with the chart's directory.
    template_declarations: Vec<(String, Consumer)>,
}

/// Every rendered object of an API group (not the core group), with its Application, its
/// apiVersion and its kind.
fn grouped_objects(
    rendering: &Rendering,
) -> impl Iterator<Item = (&RenderedApplication, &Object, &str, &str)> {
    rendering.applications.iter().flat_map(|app| {
        app.objects
            .iter()
            .filter_map(move |object| grouped(object).map(|(o, v, k)| (app, o, v, k)))
    })
}

/// An object of an API group (not the core group), with its apiVersion and its kind.
fn grouped(object: &Object) -> Option<(&Object, &str, &str)> {
    let api_version = object.get("apiVersion").and_then(Value::as_str)?;
    let kind = object.get("kind").and_then(Value::as_str)?;
    (!split_api_version(api_version).0.is_empty()).then_some((object, api_version, kind))
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

fn object_label(object: &ObjectKey) -> String {
    format!(
        "{} {}",
        object.kind,
        if object.namespace.is_empty() {
            object.name.clone()
        } else {
            format!("{}/{}", object.namespace, object.name)
        }
    )
}

/// The rules that compare two renderings, in a fixed order; the findings come out sorted by
/// severity (blocking first) and rule id, each rule's findings in the order it found them.
pub fn evaluate(
    base: &Rendering,
    head: &Rendering,
    diff: &RenderDiff,
    head_snapshot: &Snapshot,
    base_snapshot: Option<&Snapshot>,
    inventory: &Inventory,
) -> Vec<Finding> {
    // The repository's scan and the CRDs each cluster renders are read at once, and so are
    // the rules after them: they only read, and a check's verdict waits for the slowest.
    let ((scan, chart_dirs, template_declarations), (mut memo, base_crds, head_crds)) =
        std::thread::scope(|scope| {
            let crds = scope.spawn(|| {
                let mut memo = Memo::default();
                let base_crds = crds_by_cluster(&mut memo, base);
                let head_crds = crds_by_cluster(&mut memo, head);
                (memo, base_crds, head_crds)
            });
            let scan = scan_manifests(head_snapshot);
            // Templates of the repository's own charts declare apiVersions too, and a person
            // can edit them: they are consumers with a file path, like plain manifests.
            let chart_dirs = scan::local_chart_dirs(head, head_snapshot);
            let template_declarations: Vec<(String, Consumer)> = chart_dirs
                .keys()
                .flat_map(|dir| {
                    scan_chart_templates(head_snapshot, dir)
                        .into_iter()
                        .map(move |c| (dir.clone(), c))
                })
                .collect();
            (
                (scan, chart_dirs, template_declarations),
                super::joined(crds.join()),
            )
        });
    let inputs = Inputs {
        base,
        head,
        head_snapshot,
        base_snapshot,
        diff,
        inventory,
        base_crds,
        head_crds,
        scan,
        chart_dirs,
        template_declarations,
    };
    let inputs = &inputs;
    // The two rules that read every rendered object run on threads of their own; findings
    // keep the rules' order.
    let mut findings = std::thread::scope(|scope| {
        let unserved = scope.spawn(|| served::charts_rendering_unserved_versions(inputs));
        let not_served = scope.spawn(|| served::kinds_not_served(inputs));
        let mut findings = served::dropped_served_versions(inputs);
        findings.extend(served::stored_versions_removed(inputs));
        let mut rest = review::addons_added(inputs);
        rest.extend(review::applications_removed(inputs));
        rest.extend(review::major_versions(inputs));
        rest.extend(review::rbac_removed(inputs));
        rest.extend(review::crds_added_or_removed(inputs));
        rest.extend(on_apply::fields_pruned_on_apply(inputs, &mut memo));
        rest.extend(on_apply::sync_policies_changed(inputs));
        rest.extend(on_apply::unknown_destinations(inputs));
        rest.extend(on_apply::invalid_crd_names(inputs));
        rest.extend(scan::unscanned_files(inputs));
        findings.extend(super::joined(unserved.join()));
        findings.extend(super::joined(not_served.join()));
        findings.extend(rest);
        findings
    });
    findings.sort_by(|a, b| (a.severity, &a.rule).cmp(&(b.severity, &b.rule)));
    findings
}
