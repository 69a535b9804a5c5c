//! The scenario's expectations, checked against the end state.

use serde_json::{Value, json};

use crate::kube::store::Selector;
use crate::{Ground, git, kargo, scenario};

impl Ground {
    pub(crate) fn kargo_objects(&self, plural: &str) -> Vec<Value> {
        let store = self.kube.store();
        let Some(resource) = store
            .resource(kargo::GROUP, kargo::VERSION, plural)
            .cloned()
        else {
            return Vec::new();
        };
        store.list(
            &resource,
            &self.scenario.kargo.project,
            &Selector::default(),
            &Selector::default(),
        )
    }

    pub fn unmet_expectations(&self) -> Vec<String> {
        // A model call held past Bosun's timeout by a seeded fault is a refusal: Bosun must
        // hand the pull request to a person and guess nothing, so the story's end (a merge, a
        // promotion, its verification) is not reached. What must hold instead: every pull
        // request the story merges is merged or handed off (`needs-human`), and the model
        // double saw nothing it refuses.
        if let Some(model) = &self.model
            && model.injected_timeouts() > 0
        {
            let mut failures: Vec<String> = model
                .failures()
                .into_iter()
                .map(|f| format!("model double: {f}"))
                .collect();
            let pulls = self.forge.open_pulls(&self.scenario.repository.slug);
            for number in &self.scenario.expect.merged {
                let open = pulls.iter().any(|(n, _, _)| n == number);
                let labels = self.forge.labels(&self.scenario.repository.slug, *number);
                if open && !labels.iter().any(|l| l == "needs-human") {
                    failures.push(format!(
                        "pull request #{number}: a model call timed out, yet it is neither merged nor handed to a person (labels: {})",
                        labels.join(", ")
                    ));
                }
            }
            return failures;
        }
        let mut failures = Vec::new();
        let expect = &self.scenario.expect;
        let stages = self.kargo_objects("stages");
        for (stage, phase) in &expect.promotions {
            let last = stages
                .iter()
                .find(|s| s.pointer("/metadata/name").and_then(Value::as_str) == Some(stage))
                .and_then(|s| {
                    s.pointer("/status/lastPromotion/status/phase")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
            if last.as_deref() != Some(phase.as_str()) {
                failures.push(format!(
                    "Stage {stage}: last promotion {last:?}, expected {phase}"
                ));
            }
        }
        for stage in &expect.verified {
            let verified = stages
                .iter()
                .find(|s| s.pointer("/metadata/name").and_then(Value::as_str) == Some(stage))
                .and_then(|s| {
                    s.pointer("/status/freightHistory/0/verificationHistory/0/phase")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
            if verified.as_deref() != Some("Successful") {
                failures.push(format!("Stage {stage}: not verified"));
            }
        }
        let promotions = self.kargo_objects("promotions");
        for (stage, count) in &expect.promotion_count {
            let actual = promotions
                .iter()
                .filter(|p| p.pointer("/spec/stage").and_then(Value::as_str) == Some(stage))
                .count();
            if actual != *count {
                failures.push(format!(
                    "Stage {stage}: {actual} Promotions, expected {count}"
                ));
            }
        }
        if let Some(model) = &self.model {
            failures.extend(
                model
                    .failures()
                    .into_iter()
                    .map(|f| format!("model double: {f}")),
            );
            if model.unused() > 0 {
                failures.push(format!(
                    "model double: {} scripted repl{} never asked for",
                    model.unused(),
                    if model.unused() == 1 {
                        "y was"
                    } else {
                        "ies were"
                    }
                ));
            }
        }
        let pulls = self.forge.open_pulls(&self.scenario.repository.slug);
        for number in &expect.merged {
            if pulls.iter().any(|(n, _, _)| n == number) {
                failures.push(format!("pull request #{number} is still open"));
            }
        }
        for number in &expect.open {
            if !pulls.iter().any(|(n, _, _)| n == number) {
                failures.push(format!("pull request #{number} is not open"));
            }
        }
        for (number, wants) in &expect.reports {
            failures.extend(self.unmet_reports(*number, wants));
        }
        failures.extend(self.touched_files(&expect.untouched));
        for (number, labels) in &expect.labels {
            let have = self.forge.labels(&self.scenario.repository.slug, *number);
            for label in labels {
                if !have.contains(label) {
                    failures.push(format!(
                        "pull request #{number} has no label {label} (has {})",
                        have.join(", ")
                    ));
                }
            }
        }
        failures
    }

    /// The gate's reports on pull request `number`, one per head commit in the order the gate
    /// reported on them (the last body the report comment had for that head), against what
    /// the scenario expects of each.
    fn unmet_reports(&self, number: u64, wants: &[scenario::ReportExpect]) -> Vec<String> {
        use gitops_loop::gate::report;
        let slug = &self.scenario.repository.slug;
        let mut heads: Vec<(String, report::ParsedReport)> = Vec::new();
        for body in self.forge.comment_bodies(slug, number, report::MARKER) {
            let Ok(parsed) = report::parse(&body) else {
                return vec![format!(
                    "pull request #{number}: a gate report comment does not parse"
                )];
            };
            match heads.iter_mut().find(|(h, _)| *h == parsed.verdict.head) {
                Some(entry) => entry.1 = parsed,
                None => heads.push((parsed.verdict.head.clone(), parsed)),
            }
        }
        if heads.len() != wants.len() {
            return vec![format!(
                "pull request #{number}: the gate reported on {} head(s), expected {}",
                heads.len(),
                wants.len()
            )];
        }
        heads
            .iter()
            .zip(wants)
            .enumerate()
            .flat_map(|(i, ((head, parsed), want))| {
                want.unmet(parsed).into_iter().map(move |f| {
                    format!(
                        "pull request #{number}: report {} (head {}): {f}",
                        i + 1,
                        &head[..head.len().min(7)]
                    )
                })
            })
            .collect()
    }

    /// Files that differ on the default branch from the repository's first commit.
    fn touched_files(&self, paths: &[String]) -> Vec<String> {
        if paths.is_empty() {
            return Vec::new();
        }
        let Some(bare) = self.forge.bare_path(&self.scenario.repository.slug) else {
            return vec!["the repository is not on the forge".to_string()];
        };
        let first = match git::git(&bare, &["rev-list", "--max-parents=0", "main"]) {
            Ok(out) => out.trim().to_string(),
            Err(e) => return vec![format!("the first commit of main: {e}")],
        };
        paths
            .iter()
            .filter_map(|path| {
                let was = git::git(&bare, &["show", &format!("{first}:{path}")]);
                let is = git::git(&bare, &["show", &format!("main:{path}")]);
                match (was, is) {
                    (Ok(was), Ok(is)) if was == is => None,
                    (Ok(_), Ok(_)) => Some(format!("{path} was changed on main")),
                    (Err(e), _) | (_, Err(e)) => Some(format!("{path}: {e}")),
                }
            })
            .collect()
    }

    /// A JSON summary of the end state (Stages and Promotions), for snapshots.
    pub fn kargo_state(&self) -> Value {
        let pick = |objects: Vec<Value>, fields: &[&str]| -> Vec<Value> {
            objects
                .into_iter()
                .map(|o| {
                    let mut out = serde_json::Map::new();
                    for field in fields {
                        if let Some(v) = o.pointer(field) {
                            out.insert(field.to_string(), v.clone());
                        }
                    }
                    Value::Object(out)
                })
                .collect()
        };
        json!({
            "stages": pick(self.kargo_objects("stages"), &["/metadata/name", "/status/freightHistory", "/status/lastPromotion/name", "/status/lastPromotion/status/phase"]),
            "promotions": pick(self.kargo_objects("promotions"), &["/metadata/name", "/metadata/labels", "/metadata/annotations", "/spec/stage", "/spec/freight", "/status/phase"]),
        })
    }
}
