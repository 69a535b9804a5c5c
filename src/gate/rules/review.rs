//! Notes a reviewer needs, read from the diff: Applications the change creates, chart moves
//! across a major version, RBAC objects and CustomResourceDefinitions added or removed. None
//! of them blocks.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{
    ADDON_ADDED, APPLICATIONS_REMOVED, CRD_ADDED, CRD_REMOVED, Finding, Inputs, MAJOR_VERSION,
    RBAC_REMOVED, Severity, object_label,
};
use crate::gate::diff::AppStatus;
use crate::render::RenderedApplication;

/// `applications-removed`, a note: Applications the merge base generates and the head no
/// longer does, by namespace and name as Argo CD knows them (one that moves to another
/// cluster is not removed). Argo CD deletes an Application its ApplicationSet stops
/// generating (unless the ApplicationSet's `applicationsSync` policy is `create-only` or
/// `create-update`), and an Application carrying Argo CD's resources finalizer takes what it
/// deployed with it (unless its ApplicationSet sets `preserveResourcesOnDeletion`).
pub(super) fn applications_removed(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs { base, head, .. } = inputs;
    let at_head: std::collections::HashSet<(&str, &str)> = head
        .applications
        .iter()
        .map(|a| (a.namespace.as_str(), a.name.as_str()))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let (mut removed, mut cascading) = (Vec::new(), Vec::new());
    for app in &base.applications {
        let key = (app.namespace.as_str(), app.name.as_str());
        if at_head.contains(&key) || !seen.insert(key) {
            continue;
        }
        let name = format!("{}/{}", app.namespace, app.name);
        let finalizers = app.stored.pointer("/metadata/finalizers");
        let cascades = finalizers
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|f| {
                f == RESOURCES_FINALIZER
                    || f.strip_prefix(RESOURCES_FINALIZER)
                        .is_some_and(|rest| rest.starts_with('/'))
            });
        if cascades {
            cascading.push(name.clone());
        }
        removed.push(name);
    }
    if removed.is_empty() {
        return Vec::new();
    }
    let shown: Vec<&str> = removed.iter().take(10).map(String::as_str).collect();
    let more = removed.len() - shown.len();
    vec![Finding {
        rule: APPLICATIONS_REMOVED.into(),
        severity: Severity::Note,
        summary: format!(
            "{} Application{} no longer generated, so Argo CD deletes {} (unless the ApplicationSet's policy keeps them): {}{}{}",
            removed.len(),
            if removed.len() == 1 { " is" } else { "s are" },
            if removed.len() == 1 { "it" } else { "them" },
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            match cascading.len() {
                0 => String::new(),
                n => format!(
                    "; {n} carr{} Argo CD's resources finalizer, so what {} deployed is deleted too (unless the ApplicationSet preserves resources on deletion)",
                    if n == 1 { "ies" } else { "y" },
                    if n == 1 { "it" } else { "they" }
                ),
            }
        ),
        evidence: serde_json::json!({"applications": removed, "cascading": cascading}),
    }]
}

/// Argo CD's finalizer that deletes an Application's resources with it (also written with a
/// `/background` or `/foreground` suffix).
const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";

/// `addon-added`, a note: the expansion of every Application the change creates (its
/// cluster, destination namespace, what it renders and where it comes from), in one finding.
pub(super) fn addons_added(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs { head, diff, .. } = inputs;
    let mut findings = Vec::new();
    let added: Vec<&RenderedApplication> = diff
        .applications
        .iter()
        .filter(|a| a.status == AppStatus::Added)
        .filter_map(|a| {
            head.applications.iter().find(|h| {
                h.cluster.name == a.app.cluster
                    && h.name == a.app.name
                    && h.namespace == a.app.namespace
            })
        })
        .collect();
    if !added.is_empty() {
        let rows: Vec<Value> = added
            .iter()
            .map(|app| {
                serde_json::json!({
                    "application": app.name,
                    "namespace": app.namespace,
                    "cluster": app.cluster.name,
                    "destinationNamespace": app.destination_namespace,
                    "renders": app.sources.iter().filter(|s| s.get("chart").is_some() || s.get("path").is_some()).map(crate::render::output::source_line).collect::<Vec<_>>(),
                    "origin": app.origin.to_string(),
                })
            })
            .collect();
        findings.push(Finding {
            rule: ADDON_ADDED.into(),
            severity: Severity::Note,
            summary: format!(
                "this change creates {} Application{}",
                added.len(),
                crate::plural(added.len())
            ),
            evidence: Value::Array(rows),
        });
    }
    findings
}

/// `major-version-boundary`, a note: a chart version move that crosses a major version
/// ([`crosses_major`]), one finding per chart and move with the Applications it applies to.
pub(super) fn major_versions(inputs: &Inputs<'_>) -> Vec<Finding> {
    let diff = inputs.diff;
    let mut findings = Vec::new();
    let mut majors: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    for app in &diff.applications {
        for chart_move in &app.chart_moves {
            if crosses_major(&chart_move.from, &chart_move.to) {
                majors
                    .entry((
                        chart_move.chart.clone(),
                        chart_move.from.clone(),
                        chart_move.to.clone(),
                    ))
                    .or_default()
                    .push(app.app.to_string());
            }
        }
    }
    for ((chart, from, to), apps) in majors {
        findings.push(Finding {
            rule: MAJOR_VERSION.into(),
            severity: Severity::Note,
            summary: format!("chart {chart} {from} → {to} crosses a major version boundary ({} Application{})", apps.len(), crate::plural(apps.len())),
            evidence: serde_json::json!({"chart": chart, "from": from, "to": to, "applications": apps}),
        });
    }
    findings
}

/// `rbac-removed`, a note: Roles, ClusterRoles and their bindings the change removes, in one
/// finding.
pub(super) fn rbac_removed(inputs: &Inputs<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    let rbac_kinds = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];
    let mut rbac_removed: Vec<String> = Vec::new();
    for app in &inputs.diff.applications {
        for object in &app.objects.removed {
            if object.group == "rbac.authorization.k8s.io"
                && rbac_kinds.contains(&object.kind.as_str())
            {
                rbac_removed.push(format!("{} ({})", object_label(object), app.app));
            }
        }
    }
    if !rbac_removed.is_empty() {
        findings.push(Finding {
            rule: RBAC_REMOVED.into(),
            severity: Severity::Note,
            summary: format!(
                "{} RBAC object{} removed",
                rbac_removed.len(),
                crate::plural(rbac_removed.len())
            ),
            evidence: serde_json::json!(rbac_removed),
        });
    }
    findings
}

/// `crd-added` and `crd-removed`, notes: the CustomResourceDefinitions the change adds and
/// removes, by name, one finding each.
pub(super) fn crds_added_or_removed(inputs: &Inputs<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut crds_added: BTreeSet<String> = BTreeSet::new();
    let mut crds_removed: BTreeSet<String> = BTreeSet::new();
    for app in &inputs.diff.applications {
        for object in &app.objects.removed {
            if object.kind == "CustomResourceDefinition" {
                crds_removed.insert(object.name.clone());
            }
        }
        for object in &app.objects.added {
            if object.kind == "CustomResourceDefinition" {
                crds_added.insert(object.name.clone());
            }
        }
    }
    for (rule, set, verb) in [
        (CRD_ADDED, &crds_added, "added"),
        (CRD_REMOVED, &crds_removed, "removed"),
    ] {
        if !set.is_empty() {
            findings.push(Finding {
                rule: rule.into(),
                severity: Severity::Note,
                summary: format!(
                    "{} CustomResourceDefinition{} {verb}",
                    set.len(),
                    crate::plural(set.len())
                ),
                evidence: serde_json::json!(set),
            });
        }
    }
    findings
}

/// True when a version move crosses a major boundary (for 0.x, a minor change counts).
pub fn crosses_major(from: &str, to: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.trim_start_matches('v').split(['.', '-', '+']);
        Some((
            parts.next()?.parse().ok()?,
            parts.next().and_then(|m| m.parse().ok()).unwrap_or(0),
        ))
    };
    match (parse(from), parse(to)) {
        (Some((a_major, a_minor)), Some((b_major, b_minor))) => {
            a_major != b_major || (a_major == 0 && a_minor != b_minor)
        }
        _ => false,
    }
}
