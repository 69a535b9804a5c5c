//! The gate's verdict: the outcome, the counts and rules behind it, and everything a check
//! publishes (`GateResult`). The report (`report`) writes it as Markdown and machine blocks;
//! `check` builds it; Bosun reads it back from the report.

use serde::{Deserialize, Serialize};

use super::diff::{DiffCounts, RenderDiff};
use super::rules::{self, DroppedServedVersion, Finding, Severity};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Exit 0: nothing blocks.
    Green,
    /// Exit 1: at least one blocking finding.
    Blocked,
    /// Exit 2: the gate could not decide (a render failed, bad input): red, never green.
    Undecided,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Green => 0,
            Outcome::Blocked => 1,
            Outcome::Undecided => 2,
        }
    }
}

/// The verdict as scripts (`--json`) and Bosun (the `verdict` block) read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub outcome: Outcome,
    pub base: String,
    pub head: String,
    pub counts: DiffCounts,
    /// Blocking findings per rule id.
    pub blocking: std::collections::BTreeMap<String, usize>,
    /// Notes (not blocking) per rule id: what a reviewer of a green change may want to see.
    #[serde(default)]
    pub notes: std::collections::BTreeMap<String, usize>,
    /// Manifests in the repository that declare a dropped version (what a repair would touch).
    pub repository_consumers: usize,
    /// Why the gate could not decide, when it could not.
    pub errors: Vec<String>,
}

/// Everything published: the verdict, the findings, and the diff behind them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GateResult {
    pub verdict: Verdict,
    pub findings: Vec<Finding>,
    pub diff: RenderDiff,
    /// Per chart version move: the chart's default values that changed (its values.yaml at
    /// both versions), so the value that made an object appear is in front of the reader.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chart_defaults: Vec<ChartDefaults>,
    /// How helm and kubectl ran for this check (the report's footer says it); absent when
    /// nothing was rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<crate::render::confine::Confinement>,
}

/// A chart's default values that changed between two versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartDefaults {
    pub chart: String,
    pub repo_url: String,
    pub from: String,
    pub to: String,
    /// The first changes, by path (`gate check --json` keeps at most 200).
    pub changes: Vec<crate::gate::diff::FieldChange>,
    /// Changes beyond those listed.
    #[serde(default)]
    pub more: usize,
    /// Why the values could not be compared (a chart not in the mirror, YAML that does not
    /// parse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

impl GateResult {
    /// The verdict agrees with what it was built from; a disagreement is a bug that would
    /// publish a wrong verdict without a word, so it stops the process instead (on in
    /// production: a stopped gate publishes nothing and its check stays red):
    /// - the per-rule counts add up to the findings of each severity, and name only rules that
    ///   have such a finding;
    /// - a blocked outcome has a blocking finding, a green one has no blocking finding and no
    ///   error;
    /// - the verdict's diff counts are the diff's.
    pub fn assert_consistent(&self) {
        if let Err(disagreement) = self.consistency() {
            panic!("{disagreement}");
        }
    }

    /// What [`GateResult::assert_consistent`] asserts, as an answer: a verdict read from a file
    /// (`gate publish --result`) is checked with it and refused, not believed, when it
    /// disagrees with its own findings.
    pub fn consistency(&self) -> Result<(), String> {
        let verdict = &self.verdict;
        for (severity, counted) in [
            (Severity::Blocking, &verdict.blocking),
            (Severity::Note, &verdict.notes),
        ] {
            let findings = self.findings.iter().filter(|f| f.severity == severity);
            if counted.values().sum::<usize>() != findings.clone().count() {
                return Err(format!(
                    "verdict of {}: {severity:?} counts per rule disagree with the findings",
                    verdict.head
                ));
            }
            for rule in counted.keys() {
                if !(counted[rule] == 0 || findings.clone().any(|f| &f.rule == rule)) {
                    return Err(format!(
                        "verdict of {}: {severity:?} count for {rule} without such a finding",
                        verdict.head
                    ));
                }
            }
        }
        let blocks = self
            .findings
            .iter()
            .any(|f| f.severity == Severity::Blocking);
        match verdict.outcome {
            Outcome::Blocked if !blocks => {
                return Err(format!(
                    "verdict of {}: blocked without a blocking finding",
                    verdict.head
                ));
            }
            Outcome::Green if blocks || !verdict.errors.is_empty() => {
                return Err(format!(
                    "verdict of {}: green with a blocking finding or an error",
                    verdict.head
                ));
            }
            _ => {}
        }
        if verdict.counts != self.diff.counts {
            return Err(format!(
                "verdict of {}: its diff counts are not the diff's",
                verdict.head
            ));
        }
        Ok(())
    }

    pub fn dropped(&self) -> Vec<DroppedServedVersion> {
        self.findings
            .iter()
            .filter(|f| f.rule == rules::DROPPED_SERVED_VERSION)
            .filter_map(|f| serde_json::from_value(f.evidence.clone()).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    /// A consistent verdict, blocked by one finding, for the assertions' tests.
    fn blocked_by_one() -> GateResult {
        GateResult {
            verdict: Verdict {
                outcome: Outcome::Blocked,
                base: "a".repeat(40),
                head: "b".repeat(40),
                counts: Default::default(),
                blocking: [(rules::KIND_NOT_SERVED.to_string(), 1)].into(),
                notes: Default::default(),
                repository_consumers: 0,
                errors: vec![],
            },
            findings: vec![Finding {
                rule: rules::KIND_NOT_SERVED.into(),
                severity: Severity::Blocking,
                summary: "X is rendered".into(),
                evidence: Value::Null,
            }],
            diff: Default::default(),
            chart_defaults: vec![],
            confinement: None,
        }
    }

    #[test]
    fn a_consistent_verdict_passes_its_assertions() {
        blocked_by_one().assert_consistent();
    }

    #[test]
    #[should_panic(expected = "blocked without a blocking finding")]
    fn a_blocked_verdict_without_a_blocking_finding_stops() {
        let mut result = blocked_by_one();
        result.findings[0].severity = Severity::Note;
        result.verdict.notes = result.verdict.blocking.clone();
        result.verdict.blocking.clear();
        result.assert_consistent();
    }

    #[test]
    #[should_panic(expected = "green with a blocking finding")]
    fn a_green_verdict_with_a_blocking_finding_stops() {
        let mut result = blocked_by_one();
        result.verdict.outcome = Outcome::Green;
        result.assert_consistent();
    }

    #[test]
    #[should_panic(expected = "counts per rule disagree with the findings")]
    fn per_rule_counts_that_miss_a_finding_stop() {
        let mut result = blocked_by_one();
        result.findings.push(result.findings[0].clone());
        result.assert_consistent();
    }

    #[test]
    #[should_panic(expected = "its diff counts are not the diff's")]
    fn verdict_counts_other_than_the_diffs_stop() {
        let mut result = blocked_by_one();
        result.verdict.counts.objects_added = 1;
        result.assert_consistent();
    }
}
