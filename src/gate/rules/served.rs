//! Rules about what a cluster serves: a CRD that stops serving a version the repository
//! declares, a chart that renders a version its cluster no longer serves, an object of an API
//! group its cluster does not serve at all.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{
    CHART_RENDERS_UNSERVED_VERSION, CrdsByCluster, DROPPED_SERVED_VERSION, DROPPED_VERSION_UNUSED,
    DroppedServedVersion, Finding, Inputs, KIND_NOT_SERVED, LISTED_VERSION_REMOVED, NotServed,
    REPOSITORY_CHART_RENDERS_UNSERVED_VERSION, STORED_VERSION_REMOVED, Severity, UnservedRendered,
    grouped_objects, split_api_version,
};
use crate::gate::diff::ObjectKey;
use crate::render::Rendering;
use crate::render::inventory::Inventory;

/// API groups every Kubernetes cluster serves: the rule never raises objects of these (an
/// inventory's API list is often partial for them).
const NATIVE_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Applications a `not-served` block lists (the rest are counted).
const NOT_SERVED_LISTED: usize = 25;

/// The first `n` items joined, and how many more.
fn listed(items: &[String], n: usize) -> String {
    let shown = items.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > n {
        format!("{shown} and {} more", items.len() - n)
    } else {
        shown
    }
}

/// `stored-version-removed`: a CRD rendered at both commits on a cluster whose head
/// `spec.versions` no longer lists the version that was its storage version at the merge base.
/// Every object written while the base ran is stored in that version, so it is in the CRD's
/// `status.storedVersions`, and the API server refuses a CRD whose `spec.versions` leaves out
/// a stored version (apiextensions validation: "must appear in spec.versions"): Argo CD's sync
/// of the new CRD fails. Blocking. Any other version the base listed and the head drops may be
/// stored too (an older release's storage version): `listed-version-removed`, a note. One
/// finding per CRD and version, listing its clusters.
pub(super) fn stored_versions_removed(inputs: &Inputs<'_>) -> Vec<Finding> {
    // (CRD, version removed) -> (certain: it was the base's storage version, head storage,
    // clusters).
    let mut removed: BTreeMap<(String, String), (bool, String, Vec<String>)> = BTreeMap::new();
    for (cluster, head_map) in &inputs.head_crds {
        let Some(base_map) = inputs.base_crds.get(cluster) else {
            continue;
        };
        for (name, now) in head_map {
            let Some(before) = base_map.get(name) else {
                continue;
            };
            for version in before.versions.difference(&now.versions) {
                let entry = removed
                    .entry((name.clone(), version.clone()))
                    .or_insert_with(|| (false, now.storage.clone(), Vec::new()));
                entry.0 |= *version == before.storage;
                entry.2.push(cluster.clone());
            }
        }
    }
    removed
        .into_iter()
        .map(|((crd, version), (certain, storage, mut clusters))| {
            clusters.sort();
            clusters.dedup();
            let to = if storage.is_empty() {
                "the new storage version".to_string()
            } else {
                storage.clone()
            };
            let (rule, severity, summary) = if certain {
                (
                    STORED_VERSION_REMOVED,
                    Severity::Blocking,
                    format!(
                        "CustomResourceDefinition/{crd}: drops {version} from spec.versions, the version it stores objects in at the merge base; the API server refuses that update (status.storedVersions must appear in spec.versions) until the objects are migrated to {to} and {version} is taken out of status.storedVersions. Keep {version} listed with served: false"
                    ),
                )
            } else {
                (
                    LISTED_VERSION_REMOVED,
                    Severity::Note,
                    format!(
                        "CustomResourceDefinition/{crd}: drops {version} from spec.versions; if objects were ever stored in {version} (an older release's storage version), it is still in status.storedVersions and the API server refuses the update until they are migrated to {to} and it is taken out"
                    ),
                )
            };
            Finding {
                rule: rule.into(),
                severity,
                summary,
                evidence: serde_json::json!({
                    "crd": crd,
                    "version": version,
                    "storage": storage,
                    "clusters": clusters,
                }),
            }
        })
        .collect()
}

/// `dropped-served-version` and `dropped-version-unused`: a CRD rendered at both commits on a
/// cluster serves fewer versions at the head. Blocking when a manifest or a repository
/// chart's template declares a dropped version (its consumers must move to the storage
/// version); a note when nothing in the repository declares one. One finding per CRD.
pub(super) fn dropped_served_versions(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs {
        base_crds,
        head_crds,
        template_declarations,
        ..
    } = inputs;
    let manifests = &inputs.scan.manifests;
    let mut findings = Vec::new();
    let mut dropped_by_crd: BTreeMap<String, DroppedServedVersion> = BTreeMap::new();
    for (cluster, head_map) in head_crds {
        let Some(base_map) = base_crds.get(cluster) else {
            continue;
        };
        for (name, now) in head_map {
            let Some(before) = base_map.get(name) else {
                continue;
            };
            let dropped: Vec<String> = before.served.difference(&now.served).cloned().collect();
            if dropped.is_empty() {
                continue;
            }
            let entry =
                dropped_by_crd
                    .entry(name.clone())
                    .or_insert_with(|| DroppedServedVersion {
                        crd: name.clone(),
                        group: now.group.clone(),
                        kind: now.kind.clone(),
                        dropped: Vec::new(),
                        served: now.served.iter().cloned().collect(),
                        storage: now.storage.clone(),
                        clusters: Vec::new(),
                        consumers: Vec::new(),
                    });
            for v in dropped {
                if !entry.dropped.contains(&v) {
                    entry.dropped.push(v);
                }
            }
            entry.dropped.sort();
            entry.clusters.push(cluster.clone());
        }
    }
    for info in dropped_by_crd.values_mut() {
        for consumer in manifests
            .iter()
            .chain(template_declarations.iter().map(|(_, c)| c))
        {
            let (group, version) = split_api_version(&consumer.api_version);
            if group == info.group
                && consumer.kind == info.kind
                && info.dropped.iter().any(|d| d == version)
            {
                info.consumers.push(consumer.clone());
            }
        }
        info.consumers.sort();
        let evidence = serde_json::to_value(&*info).unwrap_or(Value::Null);
        if info.consumers.is_empty() {
            findings.push(Finding {
                rule: DROPPED_VERSION_UNUSED.into(),
                severity: Severity::Note,
                summary: format!(
                    "CustomResourceDefinition/{} no longer serves {}; nothing in this repository declares {}",
                    info.crd,
                    info.dropped.join(", "),
                    if info.dropped.len() == 1 { "it" } else { "them" }
                ),
                evidence,
            });
        } else {
            findings.push(Finding {
                rule: DROPPED_SERVED_VERSION.into(),
                severity: Severity::Blocking,
                summary: format!(
                    "CustomResourceDefinition/{}: no longer serves {}; {} manifests must move to {}",
                    info.crd,
                    info.dropped.join(", "),
                    info.kind,
                    info.storage
                ),
                evidence,
            });
        }
    }
    findings
}

/// `chart-renders-unserved-version` and `repository-chart-renders-unserved-version`,
/// blocking: an object rendered at the head with an apiVersion its cluster does not serve
/// (its CRD at the head, or the inventory's list for a built-in group), new since the base and
/// declared by no manifest of the repository (that is the dropped-version rule's business).
/// The repository's own chart is named when it renders the object from a computed apiVersion.
/// One finding per object, listing every Application (cluster) that renders it.
pub(super) fn charts_rendering_unserved_versions(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs {
        base,
        head,
        inventory,
        base_crds,
        head_crds,
        chart_dirs,
        template_declarations,
        ..
    } = inputs;
    let manifests = &inputs.scan.manifests;
    let mut findings = Vec::new();
    // chart-renders-unserved-version: new at head, not declared by any repository manifest.
    // One finding per object, listing every Application (cluster) that renders it.
    let base_unserved = unserved_objects(base, base_crds, inventory);
    type Unserved = (UnservedRendered, Vec<String>, Option<String>);
    let mut unserved: BTreeMap<(String, String, String), Unserved> = BTreeMap::new();
    for object in unserved_objects(head, head_crds, inventory) {
        let same = |o: &UnservedRendered| {
            o.application == object.application
                && o.cluster == object.cluster
                && o.api_version == object.api_version
                && o.kind == object.kind
                && o.name == object.name
        };
        if base_unserved.iter().any(same) {
            continue;
        }
        if manifests.iter().any(|c| {
            c.api_version == object.api_version && c.kind == object.kind && c.name == object.name
        }) {
            continue;
        }
        let local_chart = chart_dirs
            .iter()
            .find(|(_, apps)| apps.contains(&object.application))
            .map(|(dir, _)| dir.clone());
        if let Some(dir) = &local_chart
            && template_declarations.iter().any(|(d, c)| {
                d == dir && c.api_version == object.api_version && c.kind == object.kind
            })
        {
            continue;
        }
        let key = (
            object.api_version.clone(),
            object.kind.clone(),
            object.name.clone(),
        );
        let entry = unserved
            .entry(key)
            .or_insert_with(|| (object.clone(), Vec::new(), local_chart.clone()));
        entry
            .1
            .push(format!("{} on {}", object.application, object.cluster));
    }
    for (_, (object, applications, local_chart)) in unserved {
        let served = if object.served.is_empty() {
            "none".to_string()
        } else {
            object.served.join(", ")
        };
        let summary = match &local_chart {
            // The repository's own chart: there is something to change, but the template
            // computes the apiVersion, so no literal line names it.
            Some(dir) => format!(
                "{} {} is rendered by this repository's chart {dir} with apiVersion {}, which the target no longer serves (serves {served}); the apiVersion is computed by a template expression under {dir}/templates ({})",
                object.kind,
                object.name,
                object.api_version,
                applications.join(", ")
            ),
            None => format!(
                "{} {} is rendered by a chart with apiVersion {}, which the target no longer serves (serves {served}); no manifest in this repository declares it, so there are no values to change here ({})",
                object.kind,
                object.name,
                object.api_version,
                applications.join(", ")
            ),
        };
        findings.push(Finding {
            rule: if local_chart.is_some() {
                REPOSITORY_CHART_RENDERS_UNSERVED_VERSION.into()
            } else {
                CHART_RENDERS_UNSERVED_VERSION.into()
            },
            severity: Severity::Blocking,
            summary,
            evidence: match &local_chart {
                Some(dir) => serde_json::json!({"object": object, "applications": applications, "localChart": dir}),
                None => serde_json::json!({"object": object, "applications": applications}),
            },
        });
    }
    findings
}

/// `kind-not-served-on-cluster`: an object new at the head whose API group its cluster serves
/// neither natively nor through a CRD or an APIService rendered there: Argo CD would fail the
/// sync. Blocking when any of its clusters has an API list in the inventory (and the object
/// does not skip the dry run), a note otherwise. One finding per object.
pub(super) fn kinds_not_served(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs {
        base,
        head,
        inventory,
        base_crds,
        head_crds,
        ..
    } = inputs;
    let mut findings = Vec::new();
    // kind-not-served-on-cluster: new at head (the same Application, cluster and object at
    // the base does not count), one finding per object listing every Application.
    // Whether a kind is served depends on the cluster, not the Application: an object the
    // base already rendered on that cluster (under any Application name) is not new.
    let at_base: std::collections::HashSet<(String, ObjectKey, String)> =
        not_served_objects(base, base_crds, inventory)
            .into_iter()
            .map(|(_, c, k, v, _)| (c, k, v))
            .collect();
    let mut not_served: BTreeMap<(String, ObjectKey), (NotServed, bool)> = BTreeMap::new();
    for (application, cluster, key, api_version, listed) in
        not_served_objects(head, head_crds, inventory)
    {
        if at_base.contains(&(cluster.clone(), key.clone(), api_version.clone())) {
            continue;
        }
        let entry = not_served
            .entry((api_version.clone(), key.clone()))
            .or_insert_with(|| {
                (
                    NotServed {
                        api_version: api_version.clone(),
                        kind: key.kind.clone(),
                        namespace: key.namespace.clone(),
                        name: key.name.clone(),
                        applications: Vec::new(),
                        more_applications: 0,
                    },
                    false,
                )
            });
        entry
            .0
            .applications
            .push(format!("{application} on {cluster}"));
        // Blocking when any of its clusters lists its APIs.
        entry.1 |= listed;
    }
    for (_, (mut object, blocking)) in not_served {
        let (group, _) = split_api_version(&object.api_version);
        findings.push(Finding {
            rule: KIND_NOT_SERVED.into(),
            severity: if blocking {
                Severity::Blocking
            } else {
                Severity::Note
            },
            summary: format!(
                "{} {} ({}) is rendered for {}, and {} serves no {} of the {group} API and renders no CRD for it there: Argo CD would fail the sync{}",
                object.kind,
                if object.namespace.is_empty() { object.name.clone() } else { format!("{}/{}", object.namespace, object.name) },
                object.api_version,
                listed(&object.applications, 5),
                if object.applications.len() == 1 { "that cluster" } else { "each cluster" },
                object.kind,
                if blocking { "" } else { " (a note: the inventory lists no APIs for the cluster, or the object carries Argo CD's SkipDryRunOnMissingResource option)" }
            ),
            evidence: {
                // The block stays small on a fleet: the first Applications and a count.
                let total = object.applications.len();
                object.applications.truncate(NOT_SERVED_LISTED);
                object.more_applications = total.saturating_sub(NOT_SERVED_LISTED);
                serde_json::to_value(&object).unwrap_or(Value::Null)
            },
        });
    }
    findings
}

/// Objects rendered with an apiVersion their cluster does not serve: a CRD of that group and
/// kind at this render without that version served, or a built-in group the inventory lists
/// without that version.
fn unserved_objects(
    rendering: &Rendering,
    crds: &CrdsByCluster,
    inventory: &Inventory,
) -> Vec<UnservedRendered> {
    let mut out = Vec::new();
    let destinations = inventory.destinations();
    // The first cluster of a name, as `Inventory::destination` resolves Applications.
    let mut by_name: std::collections::HashMap<&str, &crate::render::inventory::Cluster> =
        std::collections::HashMap::new();
    for cluster in &destinations {
        by_name.entry(cluster.name.as_str()).or_insert(cluster);
    }
    let destinations = by_name;
    let crds = super::crds_by_kind(crds);
    for (app, object, api_version, kind) in grouped_objects(rendering) {
        let cluster_crds = crds.get(app.cluster.name.as_str());
        let cluster = destinations.get(app.cluster.name.as_str());
        let (group, version) = split_api_version(api_version);
        {
            let crd = cluster_crds.and_then(|m| m.get(&(group, kind)));
            let served: Option<Vec<String>> = match crd {
                Some(crd) => {
                    (!crd.served.contains(version)).then(|| crd.served.iter().cloned().collect())
                }
                None => cluster.as_ref().and_then(|c| {
                    let versions: Vec<String> = c
                        .api_versions
                        .iter()
                        .filter_map(|entry| {
                            let (g, rest) = entry.split_once('/')?;
                            (g == group && !rest.contains('/')).then(|| rest.to_string())
                        })
                        .collect();
                    (!versions.is_empty() && !versions.iter().any(|v| v == version))
                        .then_some(versions)
                }),
            };
            if let Some(served) = served {
                let text = |p: &str| {
                    object
                        .pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                out.push(UnservedRendered {
                    application: format!("{}/{}", app.namespace, app.name),
                    cluster: app.cluster.name.clone(),
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                    namespace: text("/metadata/namespace"),
                    name: text("/metadata/name"),
                    served,
                });
            }
        }
    }
    out
}

/// Objects whose group the destination cluster serves neither natively (the inventory's API
/// list) nor through a CRD rendered at this commit for that cluster. Argo CD's own kinds are
/// left to Argo CD. Returns (application, cluster, object key, whether the cluster's API list
/// is known).
fn not_served_objects(
    rendering: &Rendering,
    crds: &CrdsByCluster,
    inventory: &Inventory,
) -> Vec<(String, String, ObjectKey, String, bool)> {
    // The first cluster of a name, as `Inventory::destination` resolves Applications.
    let all = inventory.destinations();
    let mut destinations: std::collections::HashMap<&str, &crate::render::inventory::Cluster> =
        std::collections::HashMap::new();
    for cluster in &all {
        destinations.entry(cluster.name.as_str()).or_insert(cluster);
    }
    // Groups an APIService rendered for the cluster serves (an aggregated API, not a CRD).
    let mut aggregated: BTreeSet<(&str, &str)> = BTreeSet::new();
    for app in &rendering.applications {
        for object in &app.objects {
            if object.get("kind").and_then(Value::as_str) == Some("APIService")
                && object
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .is_some_and(|v| v.starts_with("apiregistration.k8s.io/"))
                && let Some(group) = object.pointer("/spec/group").and_then(Value::as_str)
            {
                aggregated.insert((app.cluster.name.as_str(), group));
            }
        }
    }
    let crds = super::crds_by_kind(crds);
    let mut out = Vec::new();
    for (app, object, api_version, kind) in grouped_objects(rendering) {
        let (group, _) = split_api_version(api_version);
        if NATIVE_GROUPS.contains(&group) || group == "argoproj.io" {
            continue;
        }
        if app.destination_unknown.is_some()
            || aggregated.contains(&(app.cluster.name.as_str(), group))
        {
            continue;
        }
        if crds
            .get(app.cluster.name.as_str())
            .is_some_and(|m| m.contains_key(&(group, kind)))
        {
            continue;
        }
        let Some(cluster) = destinations.get(app.cluster.name.as_str()) else {
            continue;
        };
        if serves_kind(&cluster.api_versions, group, kind) {
            continue;
        }
        // Argo CD's escape for a CRD installed from elsewhere: a note, not a blocker.
        let skip_dry_run = object
            .pointer("/metadata/annotations/argocd.argoproj.io~1sync-options")
            .and_then(Value::as_str)
            .is_some_and(|o| {
                o.split(',')
                    .any(|x| x.trim() == "SkipDryRunOnMissingResource=true")
            });
        let listed = !cluster.api_versions.is_empty() && !skip_dry_run;
        out.push((
            format!("{}/{}", app.namespace, app.name),
            app.cluster.name.clone(),
            ObjectKey::of(object),
            api_version.to_string(),
            listed,
        ));
    }
    out
}

/// Whether an inventory API list serves `kind` of `group` at some version: an entry
/// `group/version/Kind`, or `group/version` when the list names no kind of that
/// group/version (then every kind of it counts).
pub(super) fn serves_kind(entries: &[String], group: &str, kind: &str) -> bool {
    let parts: Vec<Vec<&str>> = entries.iter().map(|e| e.split('/').collect()).collect();
    parts.iter().any(|p| match p.as_slice() {
        [g, _, k] => *g == group && *k == kind,
        [g, v] => {
            *g == group
                && !parts
                    .iter()
                    .any(|q| matches!(q.as_slice(), [qg, qv, _] if qg == g && qv == v))
        }
        _ => false,
    })
}
