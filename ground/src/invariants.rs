//! What the ground's state must never show, checked after every tick of `Ground::settle`
//! (ARCHITECTURE.md's invariants, written once as checks over the doubles' state). A violation
//! stops the run with the fault seed, the tick and the transcript's tail, so a schedule that
//! breaks the loop comes with what reproduces it.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::forge::ForgeDouble;
use crate::kube::KubeDouble;
use crate::kube::store::Selector;

/// Every invariant the state breaks, one line each (empty: all hold).
pub fn violations(
    kube: &KubeDouble,
    forge: &ForgeDouble,
    project: &str,
    slug: &str,
) -> Vec<String> {
    violations_with(kube, forge, project, slug, &Exemptions::default())
}

/// Invariants a scenario breaks on purpose (a test that plays an attack), and so skips.
#[derive(Debug, Clone, Default)]
pub struct Exemptions {
    /// (pull request, author) pairs under which the test itself posts one forged report
    /// comment (a shared CI identity): one comment more is allowed there, no more.
    pub forged_reports: Vec<(u64, String)>,
}

pub fn violations_with(
    kube: &KubeDouble,
    forge: &ForgeDouble,
    project: &str,
    slug: &str,
    exempt: &Exemptions,
) -> Vec<String> {
    let mut found = Vec::new();
    let promotions = {
        let store = kube.store();
        store
            .resource(crate::kargo::GROUP, crate::kargo::VERSION, "promotions")
            .cloned()
            .map(|r| store.list(&r, project, &Selector::default(), &Selector::default()))
            .unwrap_or_default()
    };
    let text = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    // At most one Promotion Running per Stage (Kargo runs one at a time).
    let mut running: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // At most one observer-made Promotion per (Stage, Freight) that did not succeed: the
    // observer never retries what Kargo refused or failed.
    let mut observer_failed: BTreeMap<(String, String), usize> = BTreeMap::new();
    // At most one observer-made Promotion in flight per Stage (the observer waits for the one
    // it made before it decides again).
    let mut observer_in_flight: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for promotion in &promotions {
        let stage = text(promotion, "/spec/stage");
        let phase = text(promotion, "/status/phase");
        if phase == "Running" {
            running
                .entry(stage.clone())
                .or_default()
                .push(text(promotion, "/metadata/name"));
        }
        let by_observer = promotion
            .pointer(&format!(
                "/metadata/labels/{}",
                gitops_loop::observer::decision::MANAGED_BY_LABEL.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            == Some(gitops_loop::observer::decision::MANAGED_BY);
        if by_observer && matches!(phase.as_str(), "" | "Pending" | "Running") {
            observer_in_flight
                .entry(stage.clone())
                .or_default()
                .push(text(promotion, "/metadata/name"));
        }
        if by_observer && matches!(phase.as_str(), "Failed" | "Errored") {
            *observer_failed
                .entry((stage, text(promotion, "/spec/freight")))
                .or_default() += 1;
        }
    }
    for (stage, names) in running {
        if names.len() > 1 {
            found.push(format!(
                "Stage {stage} has {} Promotions Running at once: {}",
                names.len(),
                names.join(", ")
            ));
        }
    }
    for (stage, names) in observer_in_flight {
        if names.len() > 1 {
            found.push(format!(
                "the observer has {} Promotions in flight to Stage {stage}: {}",
                names.len(),
                names.join(", ")
            ));
        }
    }
    for ((stage, freight), count) in observer_failed {
        if count > 1 {
            found.push(format!(
                "the observer made {count} failed Promotions of Freight {freight} to Stage {stage}"
            ));
        }
    }
    let (reports_by, statuses, check_runs) = forge.audit(slug, gitops_loop::gate::report::MARKER);
    // One gate report comment per pull request and publisher, updated in place (a comment
    // that only looks like a report, by anyone else, is not the gate's: scenarios post such
    // forgeries on purpose).
    let mut reports: BTreeMap<(u64, &str), usize> = BTreeMap::new();
    for (number, author) in &reports_by {
        *reports.entry((*number, author.as_str())).or_default() += 1;
    }
    for ((number, author), count) in reports {
        let allowed = 1 + exempt
            .forged_reports
            .iter()
            .filter(|(n, a)| *n == number && a == author)
            .count();
        if count > allowed {
            found.push(format!(
                "pull request #{number} has {count} gate report comments by {author}"
            ));
        }
    }
    // One addons-gate check run per head commit.
    let mut checks: BTreeMap<&str, usize> = BTreeMap::new();
    for (sha, name) in &check_runs {
        if name == gitops_loop::gate::publish::CHECK_NAME {
            *checks.entry(sha).or_default() += 1;
        }
    }
    for (sha, count) in checks {
        if count > 1 {
            found.push(format!(
                "commit {} has {count} addons-gate check runs",
                &sha[..sha.len().min(12)]
            ));
        }
    }
    found.extend(bosun_scope(forge, slug));
    // Bosun never fails a check: its own status is pending or success, never failure/error.
    for (sha, context, state) in &statuses {
        if context == "bosun" && matches!(state.as_str(), "failure" | "error") {
            found.push(format!(
                "commit {} has a `bosun` status {state}",
                &sha[..sha.len().min(12)]
            ));
        }
    }
    found
}

/// Bosun's forge writes stay inside what its applier (and the gate it runs) may do:
/// comments, labels, its own `bosun` status and the gate's `addons-gate` verdict, and pushes
/// that move the head branch of one of the repository's pull requests (never its base, a
/// tag, a deletion or another branch). Every attempt counts, applied or refused. It pushes
/// nothing to a pull request's branch after it handed that pull request to a person (the
/// `needs-human` label, by name on GitHub's face, by id on Gitea's, in `add_labels` on
/// GitLab's) until someone else's
/// push there lands (a new head is a new triage).
fn bosun_scope(forge: &ForgeDouble, slug: &str) -> Vec<String> {
    const BOSUN: &str = "bosun[bot]";
    const HAND_OFF: &str = "needs-human";
    let mut found = Vec::new();
    let branches: BTreeMap<u64, String> = forge.pull_branches(slug).into_iter().collect();
    let repo = format!("/repos/{slug}/");
    let gitea = format!("/api/v1/repos/{slug}/");
    let gitlab = format!("/api/v4/projects/{}/", slug.replace('/', "%2F"));
    let git = format!("/{slug}.git/");
    let gate_check = gitops_loop::gate::publish::CHECK_NAME;
    // Branches Bosun handed to a person, until someone else's push lands there.
    let mut handed: Vec<String> = Vec::new();
    for write in forge.writes_and_pushes(BOSUN) {
        let updates: Vec<(String, String)> = write.body["refs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| {
                let text = |k: &str| u[k].as_str().unwrap_or("").to_string();
                (text("ref"), text("new"))
            })
            .collect();
        let by_bosun = write.user.as_deref() == Some(BOSUN);
        if !by_bosun {
            if write.applied && write.user.is_some() {
                handed.retain(|b| !updates.iter().any(|(r, _)| *r == format!("refs/heads/{b}")));
            }
            continue;
        }
        let (method, path, body) = (&write.method, &write.path, &write.body);
        let api = path
            .strip_prefix(&repo)
            .or_else(|| path.strip_prefix(&gitea))
            .map(|rest| rest.split('/').collect::<Vec<_>>());
        // GitLab's face: notes, labels (only `add_labels`/`remove_labels` on a merge request,
        // never its title, state or branches) and statuses.
        let on_gitlab = path
            .strip_prefix(&gitlab)
            .map(|rest| rest.split('/').collect::<Vec<_>>());
        let label_update_only = || {
            body.as_object().is_some_and(|b| {
                b.keys()
                    .all(|k| matches!(k.as_str(), "add_labels" | "remove_labels"))
            })
        };
        let allowed_on_gitlab = match (method.as_str(), on_gitlab.as_deref()) {
            ("POST", Some(["merge_requests", _, "notes"]))
            | ("PUT", Some(["merge_requests", _, "notes", _]))
            | ("POST", Some(["labels"])) => Some(true),
            ("PUT", Some(["merge_requests", _])) => Some(label_update_only()),
            ("POST", Some(["statuses", _])) => {
                let name = body.get("name").or_else(|| body.get("context"));
                Some(name.is_some_and(|n| n == "bosun" || n == gate_check))
            }
            (_, Some(_)) => Some(false),
            _ => None,
        };
        let allowed = match (method.as_str(), api.as_deref()) {
            _ if allowed_on_gitlab.is_some() => allowed_on_gitlab == Some(true),
            ("POST", Some(["issues", _, "comments"]))
            | ("PATCH", Some(["issues", "comments", _]))
            | ("POST", Some(["issues", _, "labels"]))
            | ("DELETE", Some(["issues", _, "labels", _]))
            | ("POST", Some(["labels"])) => true,
            // Bosun runs the gate for the pull requests it watches: the gate's verdict is its
            // check run (GitHub) or commit status (Gitea) `addons-gate`.
            ("POST", Some(["statuses", _])) => {
                body["context"] == "bosun" || body["context"] == gate_check
            }
            ("POST", Some(["check-runs"])) => body["name"] == gate_check,
            ("PATCH", Some(["check-runs", _])) => true,
            ("POST", None) => match path.strip_prefix(&git) {
                Some("git-upload-pack") => true,
                Some("git-receive-pack") => {
                    for (reference, new) in &updates {
                        let head = reference
                            .strip_prefix("refs/heads/")
                            .filter(|b| branches.values().any(|h| h == b));
                        if head.is_none() || new.bytes().all(|b| b == b'0') {
                            found.push(format!(
                                "bosun pushed outside its scope: {reference} -> {new}"
                            ));
                        }
                    }
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !allowed {
            found.push(format!("bosun wrote outside its scope: {method} {path}"));
        }
        if method == "POST"
            && let Some(["issues", number, "labels"]) = api.as_deref()
            && let Some(branch) = number.parse::<u64>().ok().and_then(|n| branches.get(&n))
        {
            // GitHub takes `{"labels": [names]}` or a bare array; Gitea takes ids.
            let labels = body.get("labels").unwrap_or(body);
            let hands_off = labels.as_array().into_iter().flatten().any(|l| {
                l == HAND_OFF
                    || l.as_u64()
                        .and_then(|id| forge.label_name(slug, id))
                        .is_some_and(|name| name == HAND_OFF)
            });
            if hands_off && write.applied {
                handed.push(branch.clone());
            }
        }
        // GitLab takes `add_labels` as comma-separated titles.
        if method == "PUT"
            && let Some(["merge_requests", iid]) = on_gitlab.as_deref()
            && let Some(branch) = iid.parse::<u64>().ok().and_then(|n| branches.get(&n))
            && body["add_labels"]
                .as_str()
                .is_some_and(|l| l.split(',').any(|t| t.trim() == HAND_OFF))
            && write.applied
        {
            handed.push(branch.clone());
        }
        for (reference, _) in &updates {
            if let Some(branch) = reference.strip_prefix("refs/heads/")
                && handed.iter().any(|b| b == branch)
            {
                found.push(format!(
                    "bosun pushed to {branch} after handing its pull request to a person"
                ));
            }
        }
    }
    found
}
