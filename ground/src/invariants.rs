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
