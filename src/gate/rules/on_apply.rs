//! Rules about what applying the head would do: values the API server would prune or
//! reject, what Argo CD may now delete or overwrite by itself, Applications whose destination
//! is no cluster, CustomResourceDefinitions whose names the API server would reject.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use super::{
    CRD_NAME_INVALID, DESTINATION_UNKNOWN, FIELD_PRUNED_ON_APPLY, Finding, Inputs, Memo,
    SYNC_POLICY_CHANGED, Severity, grouped, object_label, split_api_version,
};
use crate::gate::crd::{crd_name_problem, serves_version};
use crate::gate::diff::ObjectKey;
use crate::gate::text::clip;
use crate::render::parsed::Object;
use crate::render::{RenderedApplication, Rendering};

/// `field-pruned-on-apply`: a value the API server would prune from a rendered custom object,
/// or a reason it would reject it, under the structural schema its cluster serves for the
/// version it declares. Blocking when the head introduces it, a note when the base has the
/// same loss in the same Application. One finding per object and loss.
pub(super) fn fields_pruned_on_apply(inputs: &Inputs<'_>, memo: &mut Memo) -> Vec<Finding> {
    let Inputs { base, head, .. } = inputs;
    let mut findings = Vec::new();
    // Values the apply would drop: every rendered object of a custom kind, through the
    // structural schema of the version it declares as its cluster serves it at this commit.
    let base_losses: std::collections::HashSet<(String, String, String)> =
        apply_losses(memo, base).into_iter().collect();
    // (severity and object, loss) -> (the Applications that render it, the files that hold it).
    let mut losses: BTreeMap<(String, String), (Vec<String>, Vec<String>)> = BTreeMap::new();
    for (app, object, loss) in apply_losses(memo, head) {
        let introduced = !base_losses.contains(&(app.clone(), object.clone(), loss.clone()));
        let severity = if loss.starts_with(UNCHECKED) {
            "unchecked"
        } else if introduced {
            "blocking"
        } else {
            "note"
        };
        losses
            .entry((format!("{severity}\u{0}{object}"), loss))
            .or_default()
            .0
            .push(app);
    }
    // Manifests the repository holds, not only what Applications render: a person's hand
    // edit of a file loses a value the same way. An object an Application renders with the
    // same loss is already named by its Application.
    let rendered: HashSet<(String, String)> = losses
        .keys()
        .map(|(key, loss)| {
            let object = key.split_once('\u{0}').map_or(key.as_str(), |(_, o)| o);
            (object.to_string(), loss.clone())
        })
        .collect();
    for (object, loss, path, introduced) in file_losses(inputs, memo) {
        if rendered.contains(&(object.clone(), loss.clone())) {
            continue;
        }
        // A file no Application renders has no cluster, and may be a kustomize patch or an
        // example: what it would lose is a note for a person, never a blocker.
        let severity = if loss.starts_with(UNCHECKED) {
            "unchecked"
        } else if introduced {
            "new"
        } else {
            "note"
        };
        let files = &mut losses
            .entry((format!("{severity}\u{0}{object}"), loss))
            .or_default()
            .1;
        if !files.contains(&path) {
            files.push(path);
        }
    }
    for ((key, loss), (apps, files)) in losses {
        let (severity, object) = key.split_once('\u{0}').unwrap_or(("note", &key));
        // Where the loss is: the Applications that render the object, or the files that hold it.
        let places: Vec<String> = if apps.is_empty() {
            files.iter().map(|f| format!("file {f}")).collect()
        } else {
            apps.clone()
        };
        let shown: Vec<&str> = places.iter().take(10).map(String::as_str).collect();
        findings.push(Finding {
            rule: FIELD_PRUNED_ON_APPLY.into(),
            severity: if severity == "blocking" {
                Severity::Blocking
            } else {
                Severity::Note
            },
            summary: format!(
                "{object}: {loss}, in {}{}{}",
                shown.join(", "),
                if places.len() > shown.len() {
                    format!(" and {} more", places.len() - shown.len())
                } else {
                    String::new()
                },
                match severity {
                    "blocking" => "",
                    "new" => " (a file the render does not apply: the gate cannot tell which cluster's schema it meets)",
                    "unchecked" => " (the gate cannot say whether the API server accepts it: check by hand)",
                    _ => " (so at the merge base too)",
                }
            ),
            evidence: if files.is_empty() {
                serde_json::json!({"object": object, "loss": loss, "applications": apps})
            } else {
                serde_json::json!({"object": object, "loss": loss, "applications": apps, "files": files})
            },
        });
    }
    findings
}

/// `sync-policy-changed`, a note: what a changed or new Application now lets Argo CD do by
/// itself that can delete or overwrite ([`sync_powers`]), one finding per power with the
/// Applications that gain it.
pub(super) fn sync_policies_changed(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs { base, head, .. } = inputs;
    let mut findings = Vec::new();
    // Sync policies: what a changed Application now lets Argo CD do by itself.
    // Argo CD knows an Application by namespace and name (a move to another cluster is the
    // same Application); a new one brings all its powers.
    let base_by_key: BTreeMap<(&str, &str), &RenderedApplication> = base
        .applications
        .iter()
        .map(|a| ((a.namespace.as_str(), a.name.as_str()), a))
        .collect();
    let mut enabled: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for app in &head.applications {
        let was = base_by_key
            .get(&(app.namespace.as_str(), app.name.as_str()))
            .map(|before| sync_powers(&before.stored))
            .unwrap_or_default();
        let now = sync_powers(&app.stored);
        for power in now.difference(&was) {
            enabled
                .entry(power)
                .or_default()
                .push(format!("{}/{}", app.namespace, app.name));
        }
    }
    for (power, apps) in enabled {
        let shown: Vec<&str> = apps.iter().take(10).map(String::as_str).collect();
        findings.push(Finding {
            rule: SYNC_POLICY_CHANGED.into(),
            severity: Severity::Note,
            summary: format!(
                "{} Application{} now {power}: {}{}",
                apps.len(),
                crate::plural(apps.len()),
                shown.join(", "),
                if apps.len() > shown.len() {
                    format!(" and {} more", apps.len() - shown.len())
                } else {
                    String::new()
                }
            ),
            evidence: serde_json::json!({"enables": power, "applications": apps}),
        });
    }
    findings
}

/// `destination-unknown`: a head Application whose destination is no cluster of the
/// inventory (Argo CD reports "cluster not found" and renders nothing for it). Blocking when
/// the pull request brings it; a note when the base has the same Application with the same
/// destination, unless the inventory is Argo CD's partial view.
pub(super) fn unknown_destinations(inputs: &Inputs<'_>) -> Vec<Finding> {
    let Inputs {
        base,
        head,
        inventory,
        ..
    } = inputs;
    let mut findings = Vec::new();
    // Unknown destinations: blocking when the pull request brings one, a note when the base
    // has the same Application with the same unknown destination.
    let base_unknown: BTreeSet<(&str, &str, &str)> = base
        .applications
        .iter()
        .filter_map(|a| {
            a.destination_unknown
                .as_deref()
                .map(|d| (a.namespace.as_str(), a.name.as_str(), d))
        })
        .collect();
    for app in &head.applications {
        let Some(destination) = &app.destination_unknown else {
            continue;
        };
        let before = base_unknown.contains(&(
            app.namespace.as_str(),
            app.name.as_str(),
            destination.as_str(),
        ));
        // From Argo CD's API, a cluster the token may not read is left out silently: there an
        // unknown destination may be a hidden cluster, and is never let through as a note.
        let note = before && !inventory.partial_view;
        findings.push(Finding {
            rule: DESTINATION_UNKNOWN.into(),
            severity: if note {
                Severity::Note
            } else {
                Severity::Blocking
            },
            summary: format!(
                "Application {}/{} (from {}) has destination {destination}, which is no cluster of the inventory: Argo CD generates it and reports \"cluster not found\", and nothing is rendered for it{}",
                app.namespace,
                app.name,
                app.origin,
                if note {
                    " (so it was at the merge base too)"
                } else if before {
                    " (at the merge base too, but the inventory is Argo CD's view, which leaves out clusters its token may not read)"
                } else {
                    ""
                }
            ),
            evidence: serde_json::json!({
                "application": app.name,
                "namespace": app.namespace,
                "origin": app.origin.to_string(),
                "destination": destination,
            }),
        });
    }
    findings
}

/// `crd-name-invalid`: a CustomResourceDefinition rendered at the head whose names the API
/// server would reject ([`crd_name_problem`]); none of its versions counts as served. Blocking
/// when the pull request brings it; a note when the merge base renders the same CRD, with the
/// same problem, in the same Application on the same cluster (the pull request did not cause
/// it, and blocking would hold every change to the repository hostage to it). One finding per
/// Application, cluster and CRD.
pub(super) fn invalid_crd_names(inputs: &Inputs<'_>) -> Vec<Finding> {
    let at_base = invalid_crds(inputs.base);
    let mut findings = Vec::new();
    for key in invalid_crds(inputs.head) {
        let before = at_base.contains(&key);
        let (application, cluster, name, why) = key;
        findings.push(Finding {
            rule: CRD_NAME_INVALID.into(),
            severity: if before {
                Severity::Note
            } else {
                Severity::Blocking
            },
            summary: format!(
                "Application {application} on {cluster} renders a CustomResourceDefinition {name:?} the API server would reject: {why}; none of its versions counts as served{}",
                if before { " (at the merge base too)" } else { "" }
            ),
            evidence: serde_json::json!({"application": application, "cluster": cluster, "reason": why}),
        });
    }
    findings
}

/// Every (Application, cluster, CRD name as shown, problem) of a rendering's CRDs whose names
/// the API server would reject.
fn invalid_crds(rendering: &Rendering) -> BTreeSet<(String, String, String, String)> {
    let mut invalid = BTreeSet::new();
    // Applications share their rendered objects: each is judged once.
    let mut judged: HashMap<*const Value, Option<String>> = HashMap::new();
    for app in &rendering.applications {
        for object in &app.objects {
            let problem = judged
                .entry(Arc::as_ptr(object))
                .or_insert_with(|| crd_name_problem(object));
            if let Some(why) = problem.clone() {
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                // The name is chart-controlled: shown quoted and cut, never as raw text.
                let shown: String = name.chars().take(80).collect();
                invalid.insert((app.name.clone(), app.cluster.name.clone(), shown, why));
            }
        }
    }
    invalid
}

/// Every value the API server would prune from, or every reason it would reject, a rendered
/// object of a custom kind: (Application `ns/name on cluster`, object, what happens). The
/// schema is the one the object's cluster serves at this render for the version the object
/// declares; an object whose CRD or version is not there is another rule's business.
fn apply_losses(memo: &mut Memo, rendering: &Rendering) -> Vec<(String, String, String)> {
    // What each distinct render holds, read once however many Applications share it
    // (Applications with equal render keys rendered the same objects; one built without the
    // engine has no keys and is read on its own): the CRDs it renders, by group and kind, and
    // its objects of a kind with a group.
    let mut held: Vec<Held<'_>> = Vec::new();
    let mut by_keys: HashMap<&[String], usize> = HashMap::new();
    let mut at = Vec::with_capacity(rendering.applications.len());
    for app in &rendering.applications {
        let keys = app.render_keys.as_slice();
        if let Some(index) = by_keys.get(keys).filter(|_| !keys.is_empty()) {
            at.push(*index);
            continue;
        }
        let mut crds = Vec::new();
        for object in &app.objects {
            if memo.crd_info(object).is_some() {
                let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
                crds.push((text("/spec/group"), text("/spec/names/kind"), object));
            }
        }
        let grouped = app.objects.iter().filter_map(grouped).collect();
        held.push(Held { crds, grouped });
        if !keys.is_empty() {
            by_keys.insert(keys, held.len() - 1);
        }
        at.push(held.len() - 1);
    }
    // Only objects of a kind some rendered CRD defines can lose anything; the clusters that
    // render one are the only ones whose CRDs are looked up.
    let defined: HashSet<(&str, &str)> = held
        .iter()
        .flat_map(|h| h.crds.iter().map(|(group, kind, _)| (*group, *kind)))
        .collect();
    let custom = |(_, api_version, kind): &(&Object, &str, &str)| {
        defined.contains(&(split_api_version(api_version).0, *kind))
    };
    let clusters: HashSet<&str> = rendering
        .applications
        .iter()
        .zip(&at)
        .filter(|(_, i)| held[**i].grouped.iter().any(custom))
        .map(|(app, _)| app.cluster.name.as_str())
        .collect();
    if clusters.is_empty() {
        return Vec::new();
    }
    // (cluster, group, kind) -> the CRD, borrowed from the rendering (no copies per cluster).
    // Two CRDs of one kind on a cluster: the API server accepts the first it meets and refuses
    // the other's names (`NamesAccepted=False`); Argo CD applies CRDs in name order, so the
    // first by name is the one that serves, as `served.rs` decides too (`crds_by_kind`).
    let mut crds: HashMap<(&str, &str, &str), &Object> = HashMap::new();
    let name = |crd: &Object| {
        crd.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for (app, i) in rendering.applications.iter().zip(&at) {
        if !clusters.contains(app.cluster.name.as_str()) {
            continue;
        }
        for (group, kind, crd) in &held[*i].crds {
            crds.entry((app.cluster.name.as_str(), group, kind))
                .and_modify(|kept| {
                    if name(crd) < name(kept) {
                        *kept = crd;
                    }
                })
                .or_insert(crd);
        }
    }
    let mut out = Vec::new();
    for (app, i) in rendering.applications.iter().zip(&at) {
        for (object, api_version, kind) in held[*i].grouped.iter().filter(|o| custom(o)) {
            let (group, version) = split_api_version(api_version);
            let Some(crd) = crds.get(&(app.cluster.name.as_str(), group, kind)) else {
                continue;
            };
            let served = serves_version(crd, version);
            let Some(schema) = crate::schema::version_schema(crd, version).filter(|_| served)
            else {
                continue;
            };
            let losses = &memo
                .losses
                .entry((Arc::as_ptr(object) as usize, Arc::as_ptr(crd) as usize))
                .or_insert_with(|| {
                    (
                        Object::clone(object),
                        Object::clone(crd),
                        losses_of(object, schema, version),
                    )
                })
                .2;
            if losses.is_empty() {
                continue;
            }
            let label = format!("{} {}", api_version, object_label(&ObjectKey::of(object)));
            let where_ = format!("{}/{} on {}", app.namespace, app.name, app.cluster.name);
            for loss in losses {
                out.push((where_.clone(), label.clone(), loss.clone()));
            }
        }
    }
    out
}

/// Every value the API server would prune from, or every reason it would reject, a custom
/// object a YAML file of the repository holds: (object, what happens, file, whether the pull
/// request introduces it). A file has no cluster of its own: the object is checked under each
/// distinct CRD of its kind the head renders. The loss is the base's too when the file holds
/// the same object at the merge base and it loses the same under the base's CRDs.
fn file_losses(inputs: &Inputs<'_>, memo: &mut Memo) -> Vec<(String, String, String, bool)> {
    // Most repositories hold no custom object of a kind their charts define: decided from the
    // clusters' CRD facts before any rendered object is walked again.
    let defined: HashSet<(&str, &str)> = inputs
        .head_crds
        .values()
        .flat_map(|named| named.values())
        .map(|info| (info.group.as_str(), info.kind.as_str()))
        .collect();
    let mut by_path: BTreeMap<&str, Vec<&super::Consumer>> = BTreeMap::new();
    for consumer in &inputs.scan.manifests {
        let (group, _) = split_api_version(&consumer.api_version);
        if defined.contains(&(group, consumer.kind.as_str())) {
            by_path
                .entry(consumer.path.as_str())
                .or_default()
                .push(consumer);
        }
    }
    if by_path.is_empty() {
        return Vec::new();
    }
    let head_crds = crds_of_kinds(memo, inputs.head);
    let base_crds = crds_of_kinds(memo, inputs.base);
    let documents = |snapshot: &crate::git::Snapshot, path: &str| -> Vec<Value> {
        snapshot
            .read(path)
            .and_then(|bytes| crate::yaml::utf8(bytes, path).ok())
            .and_then(|text| crate::yaml::parse_documents(text, path).ok())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for (path, consumers) in by_path {
        let at_head = documents(inputs.head_snapshot, path);
        // The file's objects at the merge base, by apiVersion and identity.
        let at_base: HashMap<(String, ObjectKey), Value> = inputs
            .base_snapshot
            .map(|s| documents(s, path))
            .unwrap_or_default()
            .into_iter()
            .map(|d| {
                let api_version = d
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                ((api_version, ObjectKey::of(&d)), d)
            })
            .collect();
        for consumer in consumers {
            let Some(document) = at_head.get(consumer.document) else {
                continue;
            };
            let (group, version) = split_api_version(&consumer.api_version);
            let kind = consumer.kind.as_str();
            // A file may be a partial object (a kustomize patch): a missing required field
            // and a patch directive (`$patch`) are not losses of the object it patches.
            let losses: Vec<String> =
                losses_under(document, version, head_crds.get(&(group, kind)))
                    .into_iter()
                    .filter(|l| {
                        let path = l.split_once(" = ").map_or("", |(path, _)| path);
                        !l.ends_with(": Required value") && !path.contains('$')
                    })
                    .collect();
            if losses.is_empty() {
                continue;
            }
            let key = ObjectKey::of(document);
            let before = at_base.get(&(consumer.api_version.clone(), key.clone()));
            let base_losses = before
                .map(|d| losses_under(d, version, base_crds.get(&(group, kind))))
                .unwrap_or_default();
            let label = format!("{} {}", consumer.api_version, object_label(&key));
            for loss in losses {
                let introduced = !base_losses.contains(&loss);
                out.push((label.clone(), loss, path.to_string(), introduced));
            }
        }
    }
    out
}

/// What one object loses under any of these CRDs (each that serves its version), each loss
/// once.
fn losses_under(document: &Value, version: &str, crds: Option<&Vec<&Object>>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for crd in crds.into_iter().flatten() {
        if !serves_version(crd, version) {
            continue;
        }
        let Some(schema) = crate::schema::version_schema(crd, version) else {
            continue;
        };
        for loss in losses_of(document, schema, version) {
            if !out.contains(&loss) {
                out.push(loss);
            }
        }
    }
    out
}

/// The distinct CRDs a rendering renders (any cluster), by group and kind.
fn crds_of_kinds<'r>(
    memo: &mut Memo,
    rendering: &'r Rendering,
) -> HashMap<(&'r str, &'r str), Vec<&'r Object>> {
    let mut seen: HashSet<*const Value> = HashSet::new();
    let mut out: HashMap<(&str, &str), Vec<&Object>> = HashMap::new();
    for app in &rendering.applications {
        for object in &app.objects {
            if !seen.insert(Arc::as_ptr(object)) || memo.crd_info(object).is_none() {
                continue;
            }
            let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
            out.entry((text("/spec/group"), text("/spec/names/kind")))
                .or_default()
                .push(object);
        }
    }
    out
}

/// What one distinct render holds, for [`apply_losses`].
struct Held<'r> {
    /// Its CRDs: (group, kind, the CRD).
    crds: Vec<(&'r str, &'r str, &'r Object)>,
    /// Its objects of a kind with a group: (object, apiVersion, kind).
    grouped: Vec<(&'r Object, &'r str, &'r str)>,
}

/// What the API server would prune from, or why it would reject, one object under a schema.
fn losses_of(object: &Value, schema: &Value, version: &str) -> Vec<String> {
    let mut copy = object.clone();
    let outcome = crate::schema::prune_and_validate(&mut copy, schema);
    let mut out = Vec::new();
    for (path, value) in outcome.pruned {
        let path = clip(&path, 200);
        let value = clip(&value.to_string(), 80);
        out.push(format!(
            "{path} = {value} would be pruned (the {version} schema has no such field)"
        ));
    }
    for error in outcome.errors {
        // A refusal quotes the value: a chart's or a person's megabyte string stays a line.
        out.push(format!("rejected: {}", clip(&error, 300)));
    }
    // A validation rule or pattern not run here (past the evaluator's cost bound, or what it
    // cannot run at all) is said, never passed in silence; it is a note, since the API server
    // may well accept the object.
    for why in outcome.unevaluated {
        out.push(format!("{UNCHECKED}{}", clip(&why, 300)));
    }
    out
}

/// How a loss that is a validation not run here starts.
const UNCHECKED: &str = "not checked: ";

/// What an Application (as stored) lets Argo CD do by itself that can delete or overwrite:
/// automated sync, pruning, self-healing, syncing to empty, cascading deletion, forced or
/// replacing applies.
fn sync_powers(stored: &Value) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    let policy = stored.pointer("/spec/syncPolicy");
    let automated = policy.and_then(|p| p.get("automated"));
    let truthy = |v: Option<&Value>| v.and_then(Value::as_bool) == Some(true);
    if let Some(automated) = automated.filter(|a| a.is_object())
        && automated.get("enabled").and_then(Value::as_bool) != Some(false)
    {
        out.insert("sync automatically (syncPolicy.automated)");
        if truthy(automated.get("prune")) {
            out.insert("prune resources automatically, deleting what leaves the render (syncPolicy.automated.prune)");
        }
        if truthy(automated.get("selfHeal")) {
            out.insert("self-heal, overwriting changes made in the cluster (syncPolicy.automated.selfHeal)");
        }
        if truthy(automated.get("allowEmpty")) {
            out.insert(
                "sync an empty render, deleting everything (syncPolicy.automated.allowEmpty)",
            );
        }
    }
    for option in policy
        .and_then(|p| p.get("syncOptions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        match option.trim() {
            "Replace=true" => {
                out.insert("replace resources instead of applying them (syncOptions Replace=true)");
            }
            "Force=true" => {
                out.insert(
                    "force syncs, deleting and recreating resources (syncOptions Force=true)",
                );
            }
            _ => {}
        }
    }
    if stored
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| {
            f.iter().filter_map(Value::as_str).any(|f| {
                f == "resources-finalizer.argocd.argoproj.io"
                    || f.starts_with("resources-finalizer.argocd.argoproj.io/")
            })
        })
    {
        out.insert("delete their resources when the Application is deleted (resources-finalizer)");
    }
    out
}
