//! The report's room for the head: the verdict line, blocking findings, notes, chart defaults.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use super::blocks::{VERDICT_ERROR_CHARS, VERDICT_ERRORS, kept_errors};
use super::escape::{code, text, value_text};
use super::{counts_sentence, heading};
use crate::gate::rules::{self, DroppedServedVersion, Finding, Severity};
use crate::gate::text::clip;
use crate::gate::verdict::{GateResult, Outcome};

/// The characters of a finding's summary in the head: a summary quotes names and values a
/// chart or a pull request chose.
const SUMMARY_CHARS: usize = 1_000;

/// Consumers a blocking bullet names before it says how many more there are.
const LISTED_CONSUMERS: usize = 25;

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

/// The bullets of one rule beyond `limit`, as a count line.
fn more_line(out: &mut String, counts: &BTreeMap<&str, usize>, limit: Option<usize>) {
    let Some(limit) = limit else { return };
    for (rule, n) in counts {
        if *n > limit {
            let _ = writeln!(
                out,
                "- {}: {} more (every one is in the full report and `gate check --json`)",
                code(rule),
                n - limit
            );
        }
    }
}

pub(super) fn head_section(result: &GateResult, limit: Option<usize>) -> String {
    let v = &result.verdict;
    let mut out = heading(v.outcome);
    if v.outcome == Outcome::Undecided {
        let _ = writeln!(
            out,
            "`{}` (merge base) → `{}` (head)\n",
            short(&v.base),
            short(&v.head)
        );
        undecided_errors(&mut out, &v.errors);
    } else {
        let _ = writeln!(
            out,
            "`{}` (merge base) → `{}` (head): {}.\n",
            short(&v.base),
            short(&v.head),
            counts_sentence(&v.counts)
        );
    }
    blocking_section(&mut out, result, limit);
    notes_section(&mut out, result, limit);
    chart_defaults_section(&mut out, result, limit);
    out
}

/// Why an undecided change is undecided: the render errors, each chart's own text quoted.
fn undecided_errors(out: &mut String, errors: &[String]) {
    let _ = writeln!(
        out,
        "The gate could not render this change, so nothing was compared. The check stays red until it renders.\n"
    );
    let kept = kept_errors(errors, VERDICT_ERRORS);
    let more = errors.len() - kept.len();
    for error in kept {
        // A chart's own error text (a `fail` message) is quoted, not reprinted whole.
        let (first, items) = split_error(&clip(error, VERDICT_ERROR_CHARS));
        let _ = writeln!(out, "- {}", text(&first));
        for item in items {
            let _ = writeln!(out, "  - {}", code(&item));
        }
    }
    if more > 0 {
        let _ = writeln!(
            out,
            "- and {more} more (every one is in `gate check --json`)"
        );
    }
    out.push('\n');
}

/// The blocking findings: dropped served versions first, with their consumers, then one
/// line per finding (at most `limit` per rule).
fn blocking_section(out: &mut String, result: &GateResult, limit: Option<usize>) {
    // Render failures were quoted above, in full.
    let blocking: Vec<&Finding> = result
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Blocking && f.rule != rules::RENDER_FAILED)
        .collect();
    if !blocking.is_empty() {
        let _ = writeln!(out, "**Blocking**\n");
    }
    let dropped: Vec<&Finding> = blocking
        .iter()
        .copied()
        .filter(|f| f.rule == rules::DROPPED_SERVED_VERSION)
        .collect();
    if !dropped.is_empty() {
        dropped_versions(out, &dropped);
    }
    let mut counts: BTreeMap<&str, usize> = Default::default();
    for finding in blocking
        .iter()
        .filter(|f| f.rule != rules::DROPPED_SERVED_VERSION)
    {
        let n = counts.entry(finding.rule.as_str()).or_insert(0);
        *n += 1;
        if limit.is_some_and(|l| *n > l) {
            continue;
        }
        let _ = writeln!(
            out,
            "- {}: {}",
            code(&finding.rule),
            text(&clip(&finding.summary, SUMMARY_CHARS))
        );
    }
    more_line(out, &counts, limit);
}

/// The CustomResourceDefinitions that stopped serving a version, and the manifests still
/// declaring it (the first ones; every consumer is in the machine block).
fn dropped_versions(out: &mut String, dropped: &[&Finding]) {
    let _ = writeln!(
        out,
        "A CustomResourceDefinition stopped serving a version. Anything still declaring it breaks on apply.\n"
    );
    for finding in dropped {
        let Ok(evidence) = serde_json::from_value::<DroppedServedVersion>(finding.evidence.clone())
        else {
            continue;
        };
        let _ = writeln!(
            out,
            "- CustomResourceDefinition/{}: no longer serves {}; {} manifests must move to {}",
            code(&evidence.crd),
            evidence
                .dropped
                .iter()
                .map(|v| text(v))
                .collect::<Vec<_>>()
                .join(", "),
            code(&evidence.kind),
            code(&evidence.storage)
        );
        // A person reads the first ones; every consumer is in the machine block.
        let mut files: Vec<String> = evidence
            .consumers
            .iter()
            .take(LISTED_CONSUMERS)
            .map(|c| {
                if c.template {
                    format!("{} ({} in a chart template)", code(&c.path), text(&c.kind))
                } else {
                    format!("{} ({} {})", code(&c.path), text(&c.kind), code(&c.name))
                }
            })
            .collect();
        if evidence.consumers.len() > LISTED_CONSUMERS {
            files.push(format!(
                "and {} more (all in the machine block below and in the full report)",
                evidence.consumers.len() - LISTED_CONSUMERS
            ));
        }
        let _ = writeln!(
            out,
            "  - {} manifest(s) in this repository still declare a dropped version, blocking until they move: {}",
            evidence.consumers.len(),
            files.join(", ")
        );
    }
    out.push('\n');
}

/// The notes: one line per finding (at most `limit` per rule), an added add-on with its table.
fn notes_section(out: &mut String, result: &GateResult, limit: Option<usize>) {
    let notes: Vec<&Finding> = result
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Note)
        .collect();
    if notes.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n**Notes**\n");
    let mut counts: BTreeMap<&str, usize> = Default::default();
    for finding in notes {
        let n = counts.entry(finding.rule.as_str()).or_insert(0);
        *n += 1;
        if limit.is_some_and(|l| *n > l) {
            continue;
        }
        let _ = writeln!(
            out,
            "- {}: {}",
            code(&finding.rule),
            text(&clip(&finding.summary, SUMMARY_CHARS))
        );
        if finding.rule == rules::ADDON_ADDED {
            addon_table(out, finding, limit);
        }
    }
    more_line(out, &counts, limit);
}

/// The Applications an added add-on brings: where each runs and what it renders from.
fn addon_table(out: &mut String, finding: &Finding, limit: Option<usize>) {
    let _ = writeln!(
        out,
        "\n  | Application | cluster | namespace | renders from |\n  | --- | --- | --- | --- |"
    );
    let rows = finding
        .evidence
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let shown = limit.map_or(rows.len(), |l| l.min(rows.len()));
    for row in &rows[..shown] {
        let field = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let renders: Vec<String> = row
            .get("renders")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(text).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  | {} | {} | {} | {} |",
            code(&field("application")),
            code(&field("cluster")),
            code(&field("destinationNamespace")),
            renders.join("<br>")
        );
    }
    if shown < rows.len() {
        let _ = writeln!(
            out,
            "  | and {} more | | | (every one is in the full report) |",
            rows.len() - shown
        );
    }
    out.push('\n');
}

/// The chart defaults that changed, per chart version move (chart-controlled text, escaped).
fn chart_defaults_section(out: &mut String, result: &GateResult, limit: Option<usize>) {
    if result.chart_defaults.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n**Chart defaults that changed**\n");
    let per_chart = limit.unwrap_or(40).min(40);
    for defaults in &result.chart_defaults {
        let head = format!(
            "- {} {} → {}",
            code(&defaults.chart),
            code(&defaults.from),
            code(&defaults.to)
        );
        if let Some(why) = &defaults.unreadable {
            let _ = writeln!(out, "{head}: not compared ({})", text(why));
            continue;
        }
        if defaults.changes.is_empty() {
            let _ = writeln!(out, "{head}: no default value changed");
            continue;
        }
        let _ = writeln!(out, "{head}:");
        for change in defaults.changes.iter().take(per_chart) {
            let _ = writeln!(
                out,
                "  - {}: {} → {}",
                code(&clip(&change.path, 100)),
                code(&clip(&value_text(&change.old), 60)),
                code(&clip(&value_text(&change.new), 60))
            );
        }
        let more = defaults.changes.len().saturating_sub(per_chart) + defaults.more;
        if more > 0 {
            let _ = writeln!(out, "  - and {more} more (in `gate check --json`)");
        }
    }
}

/// `first: item; item` (helm's schema error list) -> (first, items).
fn split_error(error: &str) -> (String, Vec<String>) {
    match error.find(": at '") {
        Some(i) => {
            let first = error[..i + 1].to_string();
            let items = error[i + 2..].split("; ").map(str::to_string).collect();
            (first, items)
        }
        None => (error.to_string(), Vec::new()),
    }
}
