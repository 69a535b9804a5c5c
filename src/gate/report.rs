//! The report: Markdown for people, machine blocks for Bosun, JSON for scripts.
//!
//! The report is the wire format for everything downstream. Its first line is an invisible
//! marker. Every blocking finding a machine acts on is published a second time as a machine
//! block, `<!-- gitops-gate:<name> <json> -->`, whose JSON has `-`, `<`, `>` and `&` escaped as
//! `\u00XX`: nothing a chart renders (object names included) can end the comment or forge a
//! block, and nothing outside a block is ever read as an instruction.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::diff::DiffCounts;
use super::rules::{self, DroppedServedVersion};
use super::text::clip;
use super::verdict::{GateResult, Outcome, Verdict};

mod blocks;
mod details;
mod escape;
mod head;
mod summary;

pub use self::blocks::{BlockFinding, ReportError, machine_block, machine_blocks, parse};
pub use self::escape::{code, invisible, text, visible};
pub use self::summary::{
    SUMMARY_ITEMS, Summary, SummaryChart, SummaryCrd, SummaryDefault, SummaryImage,
};

use self::blocks::blocks_section;
use self::details::details_section;
use self::head::head_section;

pub const MARKER: &str = "<!-- gitops-gate:report v1 -->";
const BLOCK_PREFIX: &str = "<!-- gitops-gate:";
/// GitHub's limit for a comment body.
pub const COMMENT_LIMIT: usize = 65_536;

/// The report's heading: `<marker>` and `### addons-gate: <outcome>`.
fn heading(outcome: Outcome) -> String {
    let title = match outcome {
        Outcome::Green => "passed",
        Outcome::Blocked => "blocked",
        Outcome::Undecided => "could not decide",
    };
    format!("{MARKER}\n### addons-gate: {title}\n\n")
}

/// What a reader recovers from a published report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParsedReport {
    pub verdict: Verdict,
    pub dropped: Vec<DroppedServedVersion>,
    /// `kind-not-served-on-cluster` blockers (the `not-served` blocks).
    #[serde(default)]
    pub not_served: Vec<rules::NotServed>,
    /// Other blocking findings a reader can act on (`finding` blocks: `destination-unknown`,
    /// `field-pruned-on-apply`, `crd-name-invalid`), with their evidence.
    #[serde(default)]
    pub findings: Vec<BlockFinding>,
    /// What the change did (the `summary` block), for explaining a green gate.
    #[serde(default)]
    pub summary: Option<Summary>,
}

/// The digest of a published report comment (16 hex digits of SHA-256), which the
/// `addons-gate` check carries so a reader can tell the comment and the check belong together.
pub fn digest(body: &str) -> String {
    use sha2::{Digest as _, Sha256};
    hex::encode(&Sha256::digest(body.as_bytes())[..8])
}

/// Renders the report; the second value is the full report when the first had to be cut to
/// fit a comment.
pub fn render(result: &GateResult) -> (String, Option<String>) {
    render_linked(result, None)
}

/// Checks the address of the full report (the HTML page a CI job keeps, or its run's page)
/// before it is written into a comment: `https://` or `http://`, then only characters that
/// cannot end a Markdown link or start markup (no spaces, quotes, brackets, parentheses, `<`,
/// `>`, backslashes or backticks), at most 2,000 characters.
pub fn full_report_url(text: &str) -> Result<String, String> {
    let rest = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
        .ok_or("the full report's URL must start with https:// or http://")?;
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~:/?#@!$&*+,;=%".contains(c);
    if rest.is_empty() || text.len() > 2_000 || !rest.chars().all(allowed) {
        return Err(
            "the full report's URL may hold only letters, digits and -._~:/?#@!$&*+,;=% (at most 2000 characters)"
                .to_string(),
        );
    }
    Ok(text.to_string())
}

/// The line a clipped comment ends its note with when the full report has an address.
fn full_report_line(url: Option<&str>) -> String {
    match url.and_then(|u| full_report_url(u).ok()) {
        Some(url) => format!("\n**The full report, with every diff:** [HTML report]({url})\n"),
        None => String::new(),
    }
}

/// [`render`], and when the comment had to be clipped, a link to the full report at `url`
/// (checked with [`full_report_url`]; an address that fails the check is left out).
pub fn render_linked(result: &GateResult, url: Option<&str>) -> (String, Option<String>) {
    let full_head = head_section(result, None);
    let blocks = blocks_section(result);
    let details = details_section(result);
    let footer = footer(result);
    let full = format!("{full_head}{details}\n{footer}{blocks}");
    if full.chars().count() <= COMMENT_LIMIT {
        return (full, None);
    }
    // Too long for a comment: at most a few findings per rule in the head (the counts and
    // machine blocks stay whole), the details cut to what is left.
    let head = head_section(result, Some(LISTED_PER_RULE));
    let comment = fit(&head, &details, &format!("{footer}{blocks}"), url);
    if comment.chars().count() <= COMMENT_LIMIT {
        return (comment, Some(full));
    }
    // Still too long (thousands of blocking objects, each with its machine block; megabytes a
    // chart printed): the outcome, the counts and the verdict, which always fit.
    (minimal(result, url), Some(full))
}

/// The line that says how the renders ran (`--allow-unconfined` shows here), before the
/// machine blocks; nothing when the result says nothing of it.
fn footer(result: &GateResult) -> String {
    result
        .confinement
        .map(|c| format!("_{}_\n\n", c.footer()))
        .unwrap_or_default()
}

/// `N Applications changed, N added, N removed; objects N added, N changed, N removed`.
fn counts_sentence(c: &DiffCounts) -> String {
    format!(
        "{} Applications changed, {} added, {} removed; objects {} added, {} changed, {} removed",
        c.applications_changed,
        c.applications_added,
        c.applications_removed,
        c.objects_added,
        c.objects_changed,
        c.objects_removed
    )
}

/// The comment when even the cut report does not fit: the outcome, the counts per rule, the
/// first error lines clipped, and the verdict block. A reader (Bosun) finds no evidence block
/// in it and hands the change to a person.
fn minimal(result: &GateResult, url: Option<&str>) -> String {
    let v = &result.verdict;
    let mut out = heading(v.outcome);
    let _ = writeln!(out, "{}.\n", counts_sentence(&v.counts));
    for (label, counts) in [("Blocking", &v.blocking), ("Notes", &v.notes)] {
        if !counts.is_empty() {
            let listed: Vec<String> = counts
                .iter()
                .map(|(rule, n)| format!("{} ({n})", code(rule)))
                .collect();
            let _ = writeln!(out, "**{label}**: {}\n", listed.join(", "));
        }
    }
    for error in blocks::kept_errors(&v.errors, MINIMAL_ERRORS) {
        let _ = writeln!(out, "- {}", text(&clip(error, MINIMAL_ERROR_CHARS)));
    }
    let _ = writeln!(
        out,
        "\n_The report is too long for a comment even cut, so only its outcome is here: every finding is in the check run's output file (`gate check --report`) and in `gate check --json`._\n"
    );
    out.push_str(&full_report_line(url));
    out.push_str(&footer(result));
    out.push_str(&blocks::verdict_block(
        v,
        MINIMAL_ERRORS,
        MINIMAL_ERROR_CHARS,
    ));
    out.push('\n');
    out
}

/// What the last-resort comment quotes of a failed render: at most these error lines, each
/// clipped (with every character escaped in the verdict block, they stay far under a comment).
const MINIMAL_ERRORS: usize = 10;
const MINIMAL_ERROR_CHARS: usize = 500;

fn fit(head: &str, details: &str, blocks: &str, url: Option<&str>) -> String {
    let note = format!(
        "\n_Details are cut to fit a comment; the full report is in the check run's output file (`gate check --report`)._\n{}",
        full_report_line(url)
    );
    let budget = COMMENT_LIMIT
        .saturating_sub(head.chars().count() + blocks.chars().count() + note.chars().count() + 64);
    let cut: String = details.chars().take(budget).collect();
    let cut = match cut.rfind('\n') {
        Some(i) => cut[..i].to_string(),
        None => String::new(),
    };
    let closing = if cut.contains("<details>") {
        "\n</details>\n"
    } else {
        ""
    };
    format!("{head}{cut}{closing}{note}\n{blocks}")
}

/// Findings of one rule listed in a comment cut to fit (the full report lists every one).
const LISTED_PER_RULE: usize = 15;

#[cfg(test)]
mod tests;
