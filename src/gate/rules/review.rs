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
use crate::render::{Origin, RenderedApplication};

/// `applications-removed`, a note: Applications the merge base generates and the head no
/// longer does, by namespace and name as Argo CD knows them (one that moves to another
/// cluster is not removed), and Applications that move from one ApplicationSet to another.
///
/// What Argo CD does, read from the ApplicationSets as the head declares them (Argo CD's
/// applicationset controller, `applicationsSync` and `preserveResourcesOnDeletion`):
/// - an ApplicationSet that stops generating an Application deletes it, unless its
///   `syncPolicy.applicationsSync` is `create-only` or `create-update` (then it is kept);
/// - an ApplicationSet deleted takes its Applications with it (they are its owned objects);
/// - a deleted Application carrying Argo CD's resources finalizer deletes what it deployed,
///   unless its ApplicationSet sets `syncPolicy.preserveResourcesOnDeletion` (the controller
///   takes the finalizer off first);
/// - an Application another ApplicationSet now generates under the same name is not taken
///   over: Argo CD refuses to update an Application another ApplicationSet owns, so the new one
///   creates it only once the old one has deleted it (with what it deployed, through the
///   finalizer), and never while the old one's policy keeps it.
///
/// The controller's own policy flag (`applicationsetcontroller.policy`) can override all of
/// this, and the gate cannot see it: the summary says what the repository declares.
pub(super) fn applications_removed(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs { base, head, .. } = inputs;
    let at_head: std::collections::HashMap<(&str, &str), &RenderedApplication> = head
        .applications
        .iter()
        .map(|a| ((a.namespace.as_str(), a.name.as_str()), a))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let mut changed: Vec<(&RenderedApplication, Option<&RenderedApplication>)> = Vec::new();
    for app in &base.applications {
        let key = (app.namespace.as_str(), app.name.as_str());
        if !seen.insert(key) {
            continue;
        }
        match at_head.get(&key) {
            None => changed.push((app, None)),
            Some(now) if moved(&app.origin, &now.origin) => changed.push((app, Some(now))),
            Some(_) => {}
        }
    }
    if changed.is_empty() {
        return Vec::new();
    }
    // The ApplicationSets as the head and the merge base declare them (read only now: most
    // pull requests remove nothing).
    let head_sets = application_sets(head, Some(inputs.head_snapshot));
    let base_sets = application_sets(base, inputs.base_snapshot);
    let (mut removed, mut kept, mut cascading, mut moves) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (app, now) in changed {
        let name = format!("{}/{}", app.namespace, app.name);
        // Whether Argo CD deletes it, and with which ApplicationSet's preservation.
        let (deleted, preserves) = match &app.origin {
            Origin::ApplicationSet { namespace, name } => {
                let key = (namespace.clone(), name.clone());
                match head_sets.get(&key) {
                    Some(set) => (!set.keeps, set.preserves),
                    // The ApplicationSet itself is gone: its Applications go with it, as the
                    // merge base's (the live one) preserves them or not.
                    None => (true, base_sets.get(&key).is_some_and(|s| s.preserves)),
                }
            }
            _ => (true, false),
        };
        if let Some(now) = now {
            let Origin::ApplicationSet { name: from, .. } = &app.origin else {
                continue;
            };
            let to = match &now.origin {
                Origin::ApplicationSet { name, .. } => format!("ApplicationSet {name}"),
                other => other.to_string(),
            };
            moves.push(if deleted {
                format!(
                    "{name} moves from ApplicationSet {from} to {to}: {from} deletes it first{}, then {to} creates it again",
                    if cascades(app) && !preserves {
                        " with what it deployed (resources finalizer)"
                    } else {
                        ""
                    }
                )
            } else {
                format!(
                    "{name} moves from ApplicationSet {from} to {to}, but {from}'s applicationsSync policy keeps it, so {to} cannot take it over (Argo CD refuses an Application another ApplicationSet owns)"
                )
            });
            continue;
        }
        if !deleted {
            kept.push(name);
            continue;
        }
        if cascades(app) && !preserves {
            cascading.push(name.clone());
        }
        removed.push(name);
    }
    let list = |names: &[String]| {
        let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
        let more = names.len() - shown.len();
        format!(
            "{}{}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    };
    let mut parts = Vec::new();
    if !removed.is_empty() {
        parts.push(format!(
            "{} Application{} no longer generated, so Argo CD deletes {}: {}{}",
            removed.len(),
            if removed.len() == 1 { " is" } else { "s are" },
            if removed.len() == 1 { "it" } else { "them" },
            list(&removed),
            match cascading.len() {
                0 => String::new(),
                n => format!(
                    "; {n} carr{} Argo CD's resources finalizer, so what {} deployed is deleted too: {}",
                    if n == 1 { "ies" } else { "y" },
                    if n == 1 { "it" } else { "they" },
                    list(&cascading)
                ),
            }
        ));
    }
    if !kept.is_empty() {
        parts.push(format!(
            "{} Application{} no longer generated but kept by {} ApplicationSet's applicationsSync policy (create-only or create-update): {}",
            kept.len(),
            if kept.len() == 1 { " is" } else { "s are" },
            if kept.len() == 1 { "its" } else { "their" },
            list(&kept)
        ));
    }
    let shown_moves: Vec<&str> = moves.iter().take(10).map(String::as_str).collect();
    if !moves.is_empty() {
        parts.push(shown_moves.join("; "));
    }
    vec![Finding {
        rule: APPLICATIONS_REMOVED.into(),
        severity: Severity::Note,
        summary: parts.join(". "),
        evidence: serde_json::json!({
            "applications": removed,
            "cascading": cascading,
            "keptByPolicy": kept,
            "moved": moves,
        }),
    }]
}

/// Whether an Application changes owner: it was generated by an ApplicationSet and now comes
/// from another ApplicationSet, a file or a parent Application.
fn moved(before: &Origin, now: &Origin) -> bool {
    matches!(before, Origin::ApplicationSet { .. }) && before != now
}

/// Whether an Application carries Argo CD's resources finalizer.
fn cascades(app: &RenderedApplication) -> bool {
    app.stored
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|f| {
            f == RESOURCES_FINALIZER
                || f.strip_prefix(RESOURCES_FINALIZER)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
}

/// What an ApplicationSet declares about deleting what it generated.
struct DeletionPolicy {
    /// `applicationsSync` is `create-only` or `create-update`: it never deletes an Application.
    keeps: bool,
    /// `preserveResourcesOnDeletion`: a deleted Application leaves what it deployed.
    preserves: bool,
}

/// Every ApplicationSet a commit declares, by (namespace, name): those its files hold (the
/// roots) and those its Applications render (app-of-apps).
fn application_sets(
    rendering: &crate::render::Rendering,
    snapshot: Option<&crate::git::Snapshot>,
) -> std::collections::HashMap<(String, String), DeletionPolicy> {
    let mut out = std::collections::HashMap::new();
    let mut add = |doc: &Value| {
        let is_set = doc.get("kind").and_then(Value::as_str) == Some("ApplicationSet")
            && doc
                .get("apiVersion")
                .and_then(Value::as_str)
                .is_some_and(|v| v.starts_with("argoproj.io/"));
        if !is_set {
            return;
        }
        let text = |p: &str| doc.pointer(p).and_then(Value::as_str);
        let Some(name) = text("/metadata/name") else {
            return;
        };
        let namespace = text("/metadata/namespace").unwrap_or("argocd");
        out.insert(
            (namespace.to_string(), name.to_string()),
            DeletionPolicy {
                keeps: matches!(
                    text("/spec/syncPolicy/applicationsSync"),
                    Some("create-only" | "create-update")
                ),
                preserves: doc
                    .pointer("/spec/syncPolicy/preserveResourcesOnDeletion")
                    .and_then(Value::as_bool)
                    == Some(true),
            },
        );
    };
    for app in &rendering.applications {
        for object in &app.objects {
            add(object);
        }
    }
    for path in snapshot.map(|s| s.manifest_files()).unwrap_or_default() {
        let Some(bytes) = snapshot.and_then(|s| s.read(path)) else {
            continue;
        };
        // Only files that can hold one are parsed.
        if !bytes.windows(14).any(|w| w == b"ApplicationSet") {
            continue;
        }
        let Ok(text) = crate::yaml::utf8(bytes, path) else {
            continue;
        };
        for doc in crate::yaml::parse_documents(text, path).unwrap_or_default() {
            add(&doc);
        }
    }
    out
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
