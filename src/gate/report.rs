//! The report: Markdown for people, machine blocks for Bosun, JSON for scripts.
//!
//! The report is the wire format for everything downstream. Its first line is an invisible
//! marker. Every blocking finding a machine acts on is published a second time as a machine
//! block, `<!-- gitops-gate:<name> <json> -->`, whose JSON has `-`, `<`, `>` and `&` escaped as
//! `\u00XX`: nothing a chart renders (object names included) can end the comment or forge a
//! block, and nothing outside a block is ever read as an instruction.

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::diff::{AppStatus, DiffCounts, RenderDiff};
use super::rules::{self, DroppedServedVersion, Finding, Severity};

pub const MARKER: &str = "<!-- gitops-gate:report v1 -->";
const BLOCK_PREFIX: &str = "<!-- gitops-gate:";
/// Consumers a blocking bullet names before it says how many more there are.
const LISTED_CONSUMERS: usize = 25;
/// GitHub's limit for a comment body.
pub const COMMENT_LIMIT: usize = 65_536;

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
    pub fn dropped(&self) -> Vec<DroppedServedVersion> {
        self.findings
            .iter()
            .filter(|f| f.rule == rules::DROPPED_SERVED_VERSION)
            .filter_map(|f| serde_json::from_value(f.evidence.clone()).ok())
            .collect()
    }
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

/// What a change did, compactly, for a reader who explains a green gate (the `summary` block):
/// the chart moves, the images whose tags moved, CRDs whose served versions changed or that
/// came and went, RBAC objects added and removed, and the first chart defaults that changed.
/// Bounded: at most `SUMMARY_ITEMS` of each list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    #[serde(default)]
    pub charts: Vec<SummaryChart>,
    #[serde(default)]
    pub images: Vec<SummaryImage>,
    #[serde(default)]
    pub crds: Vec<SummaryCrd>,
    #[serde(default)]
    pub rbac_added: usize,
    #[serde(default)]
    pub rbac_removed: usize,
    #[serde(default)]
    pub defaults: Vec<SummaryDefault>,
    /// Items left out of the lists above.
    #[serde(default)]
    pub more: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SummaryChart {
    pub chart: String,
    pub from: String,
    pub to: String,
    pub clusters: Vec<String>,
    pub applications: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryImage {
    pub image: String,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryCrd {
    pub name: String,
    /// Served versions at the base (empty: the CRD is new).
    pub before: Vec<String>,
    /// Served versions at the head (empty: the CRD is gone).
    pub after: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryDefault {
    pub chart: String,
    pub path: String,
    pub old: Value,
    pub new: Value,
}

/// At most this many items per list of the `summary` block.
pub const SUMMARY_ITEMS: usize = 20;

/// The most characters the `summary` block may take, as written.
const SUMMARY_BUDGET: usize = 12_000;

/// Each text of the `summary` block is clipped to this many characters, so the block stays a
/// few kilobytes whatever a chart holds.
const SUMMARY_TEXT: usize = 120;

fn clip_text(s: &str) -> String {
    clip(s, SUMMARY_TEXT)
}

fn clip_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(clip_text(&s)),
        Value::Array(_) | Value::Object(_) => {
            let text = v.to_string();
            if text.chars().count() > SUMMARY_TEXT {
                Value::String(clip_text(&text))
            } else {
                v
            }
        }
        other => other,
    }
}

/// An image reference split at its tag or digest: (repository, tag).
fn split_image(image: &str) -> (String, String) {
    // `name:tag@digest`: the tag is what moved (the digest pins it).
    let (image, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let tagged = image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/'));
    if let (None, Some(digest)) = (tagged, digest) {
        return (image.to_string(), digest.to_string());
    }
    match tagged {
        Some((repo, tag)) if !tag.contains('/') => (repo.to_string(), tag.to_string()),
        _ => (image.to_string(), "latest".to_string()),
    }
}

impl Summary {
    /// The summary of a check's result.
    pub fn of(result: &GateResult) -> Summary {
        let mut summary = Summary::default();
        let mut more = 0;
        let mut charts: Vec<SummaryChart> = Vec::new();
        let mut images: Vec<SummaryImage> = Vec::new();
        let mut crds: Vec<SummaryCrd> = Vec::new();
        const RBAC: [&str; 4] = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];
        let is_rbac = |k: &crate::gate::diff::ObjectKey| {
            k.group == "rbac.authorization.k8s.io" && RBAC.contains(&k.kind.as_str())
        };
        let is_crd = |k: &crate::gate::diff::ObjectKey| {
            k.group == "apiextensions.k8s.io" && k.kind == "CustomResourceDefinition"
        };
        let mut seen_objects = std::collections::BTreeSet::new();
        for app in &result.diff.applications {
            for m in &app.chart_moves {
                match charts
                    .iter_mut()
                    .find(|c| c.chart == m.chart && c.from == m.from && c.to == m.to)
                {
                    Some(c) => {
                        c.applications += 1;
                        let cluster = clip_text(&app.app.cluster);
                        if c.clusters.len() < 10 && !c.clusters.contains(&cluster) {
                            c.clusters.push(cluster);
                        }
                    }
                    None => charts.push(SummaryChart {
                        chart: clip_text(&m.chart),
                        from: clip_text(&m.from),
                        to: clip_text(&m.to),
                        clusters: vec![clip_text(&app.app.cluster)],
                        applications: 1,
                    }),
                }
            }
            // Each object once across clusters (the same RBAC on three clusters is one change
            // to explain).
            for key in &app.objects.added {
                if is_rbac(key) && seen_objects.insert(("+", key.clone())) {
                    summary.rbac_added += 1;
                }
                if is_crd(key)
                    && crate::names::is_dns1123_subdomain(&key.name)
                    && seen_objects.insert(("+", key.clone()))
                {
                    crds.push(SummaryCrd {
                        name: clip_text(&key.name),
                        before: vec![],
                        after: vec!["(new)".into()],
                    });
                }
            }
            for key in &app.objects.removed {
                if is_rbac(key) && seen_objects.insert(("-", key.clone())) {
                    summary.rbac_removed += 1;
                }
                if is_crd(key)
                    && crate::names::is_dns1123_subdomain(&key.name)
                    && seen_objects.insert(("-", key.clone()))
                {
                    crds.push(SummaryCrd {
                        name: clip_text(&key.name),
                        before: vec!["(removed)".into()],
                        after: vec![],
                    });
                }
            }
            for change in &app.objects.changed {
                for field in change.fields.iter() {
                    if !(field.path.ends_with(".image") || field.path == "image") {
                        continue;
                    }
                    let (Some(Value::String(old)), Some(Value::String(new))) =
                        (&field.old, &field.new)
                    else {
                        continue;
                    };
                    let ((repo, from), (new_repo, to)) = (split_image(old), split_image(new));
                    let image = if repo == new_repo {
                        repo
                    } else {
                        format!("{repo} → {new_repo}")
                    };
                    let item = SummaryImage {
                        image: clip_text(&image),
                        from: clip_text(&from),
                        to: clip_text(&to),
                    };
                    if !images.contains(&item) {
                        images.push(item);
                    }
                }
                if let Some(crd) = &change.crd {
                    let served = |v: &[crate::gate::diff::CrdVersion]| -> Vec<String> {
                        v.iter()
                            .filter(|x| x.served)
                            .map(|x| clip_text(&x.name))
                            .collect()
                    };
                    let (before, after) = (served(&crd.before), served(&crd.after));
                    // A name Kubernetes would reject never reaches a machine block (the
                    // `crd-name-invalid` finding names it, quoted and cut, for people).
                    let valid = crate::names::is_dns1123_subdomain(&change.object.name)
                        && crd
                            .before
                            .iter()
                            .chain(&crd.after)
                            .all(|v| crate::names::is_dns1035_label(&v.name));
                    if valid && before != after && seen_objects.insert(("~", change.object.clone()))
                    {
                        crds.push(SummaryCrd {
                            name: clip_text(&change.object.name),
                            before,
                            after,
                        });
                    }
                }
            }
        }
        let mut defaults = Vec::new();
        for d in &result.chart_defaults {
            for change in &d.changes {
                defaults.push(SummaryDefault {
                    chart: clip_text(&d.chart),
                    path: clip_text(&change.path),
                    old: clip_value(change.old.clone().unwrap_or(Value::Null)),
                    new: clip_value(change.new.clone().unwrap_or(Value::Null)),
                });
            }
            more += d.more;
        }
        for (len, keep) in [
            (charts.len(), SUMMARY_ITEMS),
            (images.len(), SUMMARY_ITEMS),
            (crds.len(), SUMMARY_ITEMS),
            (defaults.len(), SUMMARY_ITEMS),
        ] {
            more += len.saturating_sub(keep);
        }
        charts.truncate(SUMMARY_ITEMS);
        images.truncate(SUMMARY_ITEMS);
        crds.truncate(SUMMARY_ITEMS);
        defaults.truncate(SUMMARY_ITEMS);
        summary.charts = charts;
        summary.images = images;
        summary.crds = crds;
        summary.defaults = defaults;
        summary.more = more;
        // A budget on the block as written (escaping can grow a text sixfold): the longest
        // lists give way first, and `more` counts what went.
        while machine_block("summary", &summary).len() > SUMMARY_BUDGET {
            let lists = [
                summary.defaults.len(),
                summary.images.len(),
                summary.crds.len(),
                summary.charts.len(),
            ];
            let Some((longest, _)) = lists.iter().enumerate().max_by_key(|(_, n)| **n) else {
                break;
            };
            match longest {
                0 if !summary.defaults.is_empty() => drop(summary.defaults.pop()),
                1 if !summary.images.is_empty() => drop(summary.images.pop()),
                2 if !summary.crds.is_empty() => drop(summary.crds.pop()),
                3 if !summary.charts.is_empty() => drop(summary.charts.pop()),
                _ => break,
            }
            summary.more += 1;
        }
        summary
    }
}

/// A blocking finding as its `finding` block carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockFinding {
    pub rule: String,
    pub evidence: Value,
}

/// Rules whose blocking findings get a `finding` block, and at most how many per rule.
const FINDING_BLOCKS: [&str; 3] = [
    rules::DESTINATION_UNKNOWN,
    rules::FIELD_PRUNED_ON_APPLY,
    rules::CRD_NAME_INVALID,
];
const FINDING_BLOCKS_PER_RULE: usize = 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReportError {
    #[error("the comment does not start with the gate's marker")]
    NoMarker,
    #[error("the report has no verdict block")]
    NoVerdict,
    #[error("machine block {name:?} is not valid: {message}")]
    BadBlock { name: String, message: String },
}

/// Serialises a machine block so its text contains no `-`, `<`, `>` or `&`.
pub fn machine_block(name: &str, value: &impl Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    let mut escaped = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '-' => escaped.push_str("\\u002d"),
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            other => escaped.push(other),
        }
    }
    format!("{BLOCK_PREFIX}{name} {escaped} -->")
}

/// Every machine block of a report, in order, as (name, JSON).
pub fn machine_blocks(markdown: &str) -> Result<Vec<(String, Value)>, ReportError> {
    let mut blocks = Vec::new();
    let mut rest = markdown;
    while let Some(start) = rest.find(BLOCK_PREFIX) {
        let after = &rest[start + BLOCK_PREFIX.len()..];
        let Some(end) = after.find("-->") else { break };
        let body = after[..end].trim();
        rest = &after[end + 3..];
        let (name, json) = body.split_once(' ').unwrap_or((body, ""));
        if name.starts_with("report") {
            continue; // the marker
        }
        let value: Value =
            serde_json::from_str(json.trim()).map_err(|e| ReportError::BadBlock {
                name: name.to_string(),
                message: e.to_string(),
            })?;
        blocks.push((name.to_string(), value));
    }
    Ok(blocks)
}

/// Reads the verdict and the repair evidence back from a report's machine blocks.
pub fn parse(markdown: &str) -> Result<ParsedReport, ReportError> {
    if !markdown.starts_with(MARKER) {
        return Err(ReportError::NoMarker);
    }
    let mut verdict = None;
    let mut dropped = Vec::new();
    let mut not_served = Vec::new();
    let mut findings = Vec::new();
    let mut summary = None;
    let blocks = machine_blocks(markdown)?;
    // The gate writes its blocks last, verdict first: nothing before the last verdict block
    // is read (a second line of defence behind the escaping of everything a chart controls).
    let start = blocks
        .iter()
        .rposition(|(name, _)| name == "verdict")
        .unwrap_or(0);
    for (name, value) in blocks.into_iter().skip(start) {
        match name.as_str() {
            "verdict" => {
                verdict =
                    Some(
                        serde_json::from_value(value).map_err(|e| ReportError::BadBlock {
                            name,
                            message: e.to_string(),
                        })?,
                    );
            }
            "dropped" => {
                let block: DroppedBlock =
                    serde_json::from_value(value).map_err(|e| ReportError::BadBlock {
                        name,
                        message: e.to_string(),
                    })?;
                dropped.push(block.into());
            }
            "finding" => {
                findings.push(serde_json::from_value(value).map_err(|e| {
                    ReportError::BadBlock {
                        name,
                        message: e.to_string(),
                    }
                })?);
            }
            "summary" => {
                summary =
                    Some(
                        serde_json::from_value(value).map_err(|e| ReportError::BadBlock {
                            name,
                            message: e.to_string(),
                        })?,
                    );
            }
            "not-served" => {
                not_served.push(serde_json::from_value(value).map_err(|e| {
                    ReportError::BadBlock {
                        name,
                        message: e.to_string(),
                    }
                })?);
            }
            _ => {}
        }
    }
    Ok(ParsedReport {
        verdict: verdict.ok_or(ReportError::NoVerdict)?,
        dropped,
        not_served,
        findings,
        summary,
    })
}

/// The digest of a published report comment (16 hex digits of SHA-256), which the
/// `addons-gate` check carries so a reader can tell the comment and the check belong together.
pub fn digest(body: &str) -> String {
    use sha2::{Digest as _, Sha256};
    hex::encode(&Sha256::digest(body.as_bytes())[..8])
}

/// Text a chart or a repository controls, made safe for Markdown: no HTML, no comments, one
/// line (a line break shows as `␤`, so nothing can start a heading, a list or a block), and
/// the characters that open emphasis, code, links, images, tables or autolinks escaped.
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push('␤');
                }
            }
            '\n' => out.push('␤'),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' | '#' => {
                out.push('\\');
                out.push(c);
            }
            // `scheme://`, `www.` and `user@host` are autolinks on GitHub: break them.
            ':' if chars.peek() == Some(&'/') => out.push_str("\\:"),
            '.' if out.ends_with("www") || out.ends_with("WWW") => out.push_str("\\."),
            '@' => out.push_str("\\@"),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A code span when the text is plain, escaped text otherwise.
pub fn code(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:@+=,-[]\" ".contains(c))
        && !s.contains('`')
    {
        format!("`{s}`")
    } else {
        text(s)
    }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

/// A value as the report quotes it: the start of its JSON text (every caller clips it to a
/// few dozen characters, so a 40 KB CRD version is never serialised whole).
fn value_text(value: &Option<Value>) -> String {
    const LIMIT: usize = 1024;
    struct Bounded(Vec<u8>);
    impl std::io::Write for Bounded {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0.len() >= LIMIT {
                return Err(std::io::Error::other("enough"));
            }
            let n = buf.len().min(LIMIT - self.0.len());
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    match value {
        None => "(absent)".to_string(),
        Some(Value::String(s)) => s.chars().take(LIMIT).collect(),
        Some(other) => {
            let mut out = Bounded(Vec::new());
            let _ = serde_json::to_writer(&mut out, other);
            String::from_utf8_lossy(&out.0).into_owned()
        }
    }
}

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// Renders the report; the second value is the full report when the first had to be cut to
/// fit a comment.
pub fn render(result: &GateResult) -> (String, Option<String>) {
    let full_head = head_section(result, None);
    let blocks = blocks_section(result);
    let details = details_section(result);
    let full = format!("{full_head}{details}\n{blocks}");
    if full.chars().count() <= COMMENT_LIMIT {
        return (full, None);
    }
    // Too long for a comment: at most a few findings per rule in the head (the counts and
    // machine blocks stay whole), the details cut to what is left.
    let head = head_section(result, Some(LISTED_PER_RULE));
    let comment = fit(&head, &details, &blocks);
    (comment, Some(full))
}

fn fit(head: &str, details: &str, blocks: &str) -> String {
    let note = "\n_Details are cut to fit a comment; the full report is in the check run's output file (`gate check --report`)._\n";
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

/// The bullets of one rule beyond `limit`, as a count line.
fn more_line(
    out: &mut String,
    counts: &std::collections::BTreeMap<&str, usize>,
    limit: Option<usize>,
) {
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

fn head_section(result: &GateResult, limit: Option<usize>) -> String {
    let v = &result.verdict;
    let mut out = String::new();
    let _ = writeln!(out, "{MARKER}");
    let title = match v.outcome {
        Outcome::Green => "passed",
        Outcome::Blocked => "blocked",
        Outcome::Undecided => "could not decide",
    };
    let _ = writeln!(out, "### addons-gate: {title}\n");
    let c = &v.counts;
    if v.outcome == Outcome::Undecided {
        let _ = writeln!(
            out,
            "`{}` (merge base) → `{}` (head)\n",
            short(&v.base),
            short(&v.head)
        );
    } else {
        let _ = writeln!(
            out,
            "`{}` (merge base) → `{}` (head): {} Applications changed, {} added, {} removed; objects {} added, {} changed, {} removed.\n",
            short(&v.base),
            short(&v.head),
            c.applications_changed,
            c.applications_added,
            c.applications_removed,
            c.objects_added,
            c.objects_changed,
            c.objects_removed
        );
    }
    if v.outcome == Outcome::Undecided {
        let _ = writeln!(
            out,
            "The gate could not render this change, so nothing was compared. The check stays red until it renders.\n"
        );
        for error in &v.errors {
            let (first, items) = split_error(error);
            let _ = writeln!(out, "- {}", text(&first));
            for item in items {
                let _ = writeln!(out, "  - {}", code(&item));
            }
        }
        out.push('\n');
    }
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
        let _ = writeln!(
            out,
            "A CustomResourceDefinition stopped serving a version. Anything still declaring it breaks on apply.\n"
        );
        for finding in dropped {
            let Ok(evidence) =
                serde_json::from_value::<DroppedServedVersion>(finding.evidence.clone())
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
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for finding in blocking
        .iter()
        .filter(|f| f.rule != rules::DROPPED_SERVED_VERSION)
    {
        let n = counts.entry(finding.rule.as_str()).or_insert(0);
        *n += 1;
        if limit.is_some_and(|l| *n > l) {
            continue;
        }
        let _ = writeln!(out, "- {}: {}", code(&finding.rule), text(&finding.summary));
    }
    more_line(&mut out, &counts, limit);
    let notes: Vec<&Finding> = result
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Note)
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\n**Notes**\n");
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for finding in notes {
            let n = counts.entry(finding.rule.as_str()).or_insert(0);
            *n += 1;
            if limit.is_some_and(|l| *n > l) {
                continue;
            }
            let _ = writeln!(out, "- {}: {}", code(&finding.rule), text(&finding.summary));
            if finding.rule == rules::ADDON_ADDED {
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
                    let field =
                        |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("").to_string();
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
        }
        more_line(&mut out, &counts, limit);
    }
    chart_defaults_section(&mut out, result, limit);
    out
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

/// The Markdown lines of one Application's changes (identical for Applications that change the
/// same way, whatever their names).
fn app_changes(app: &crate::gate::diff::AppDiff) -> String {
    let mut out = String::new();
    if !app.application_fields.is_empty() {
        let paths: Vec<String> = app
            .application_fields
            .iter()
            .take(10)
            .map(|f| code(&f.path))
            .collect();
        let _ = writeln!(
            out,
            "- the Application itself: {}{}",
            paths.join(", "),
            if app.application_fields.len() > paths.len() {
                format!(" and {} more", app.application_fields.len() - paths.len())
            } else {
                String::new()
            }
        );
    }
    for chart_move in &app.chart_moves {
        let _ = writeln!(
            out,
            "- chart {} {} → {}",
            code(&chart_move.chart),
            code(&chart_move.from),
            code(&chart_move.to)
        );
    }
    if let Some(chart_only) = &app.chart_only {
        let _ = writeln!(
            out,
            "- the chart's own change (this change's values at both versions):"
        );
        for object in &chart_only.added {
            let _ = writeln!(out, "  - added {}", code(&object.to_string()));
        }
        for object in &chart_only.removed {
            let _ = writeln!(out, "  - removed {}", code(&object.to_string()));
        }
        for change in &chart_only.changed {
            let fields: Vec<String> = change
                .fields
                .iter()
                .filter(|f| {
                    change.crd.is_none() || !crate::gate::diff::is_crd_version_field(&f.path)
                })
                .take(20)
                .map(|f| code(&f.path))
                .collect();
            if change.crd.is_some() && fields.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "  - changed {}: {}",
                code(&change.object.to_string()),
                fields.join(", ")
            );
        }
        crd_table(&mut out, &chart_only.changed, "  ");
        let _ = writeln!(out, "- everything this change deploys differently:");
    }
    for object in &app.objects.added {
        let _ = writeln!(out, "- added {}", code(&object.to_string()));
    }
    for object in &app.objects.removed {
        let _ = writeln!(out, "- removed {}", code(&object.to_string()));
    }
    for change in &app.objects.changed {
        // A CRD's schema diff runs to thousands of lines on real charts: its versions and
        // schema field counts are in the table below (`--json` has every field); its other
        // fields (labels, names, conversion) are listed here.
        let shown: Vec<_> = change
            .fields
            .iter()
            .filter(|f| change.crd.is_none() || !crate::gate::diff::is_crd_version_field(&f.path))
            .collect();
        if change.crd.is_some() && shown.is_empty() {
            continue;
        }
        let _ = writeln!(out, "- changed {}", code(&change.object.to_string()));
        for field in shown {
            let _ = writeln!(
                out,
                "  - {}: {} → {}",
                code(&field.path),
                code(&clip(&value_text(&field.old), 80)),
                code(&clip(&value_text(&field.new), 80))
            );
        }
    }
    crd_table(&mut out, &app.objects.changed, "");
    out
}

/// The CustomResourceDefinitions among `changes` as one table: versions (served, storage)
/// at both commits and schema fields added, removed and changed.
fn crd_table(out: &mut String, changes: &[crate::gate::diff::ObjectChange], indent: &str) {
    let rows: Vec<_> = changes
        .iter()
        .filter_map(|c| Some((c, c.crd.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let versions = |list: &[crate::gate::diff::CrdVersion]| -> String {
        let shown: Vec<String> = list
            .iter()
            .map(|v| {
                let flags = match (v.served, v.storage) {
                    (true, true) => "served, storage",
                    (true, false) => "served",
                    (false, true) => "not served, storage",
                    (false, false) => "not served",
                };
                format!("{} ({flags})", code(&v.name))
            })
            .collect();
        if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join(", ")
        }
    };
    let _ = writeln!(
        out,
        "\n{indent}| CustomResourceDefinition | versions at the merge base | versions at the head | schema fields added / removed / changed (versions at both) |\n{indent}|---|---|---|---|"
    );
    for (change, crd) in rows {
        let _ = writeln!(
            out,
            "{indent}| {} | {} | {} | {} / {} / {} |",
            code(&change.object.name),
            versions(&crd.before),
            versions(&crd.after),
            crd.schema_fields_added,
            crd.schema_fields_removed,
            crd.schema_fields_changed
        );
    }
    out.push('\n');
}

fn details_section(result: &GateResult) -> String {
    if result.verdict.outcome == Outcome::Undecided {
        return String::new();
    }
    let diff = &result.diff;
    if diff.applications.is_empty() {
        return "\nThe render is identical at both commits.\n".to_string();
    }
    let mut out = String::new();
    // The generated Applications themselves: each distinct field change once, with the
    // Applications it applies to (an ApplicationSet change reaches many at once).
    let mut groups: Vec<(String, String, String, Vec<String>)> = Vec::new();
    let mut index: std::collections::HashMap<(String, String, String), usize> =
        std::collections::HashMap::new();
    for app in &diff.applications {
        for field in &app.application_fields {
            let (old, new) = (
                clip(&value_text(&field.old), 80),
                clip(&value_text(&field.new), 80),
            );
            let name = format!("{}/{}", app.app.namespace, app.app.name);
            let key = (field.path.clone(), old, new);
            match index.get(&key) {
                Some(&at) => groups[at].3.push(name),
                None => {
                    index.insert(key.clone(), groups.len());
                    groups.push((key.0, key.1, key.2, vec![name]));
                }
            }
        }
    }
    if !groups.is_empty() {
        let _ = writeln!(out, "\n**The generated Applications change**\n");
        for (path, old, new, apps) in &groups {
            let shown: Vec<String> = apps.iter().take(5).map(|a| code(a)).collect();
            let more = if apps.len() > shown.len() {
                format!(" and {} more", apps.len() - shown.len())
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "- {} Application{}: {} {} → {} ({}{more})",
                apps.len(),
                if apps.len() == 1 { "" } else { "s" },
                code(path),
                code(&clip(old, 80)),
                code(&clip(new, 80)),
                shown.join(", ")
            );
        }
    }
    let _ = writeln!(
        out,
        "\n<details><summary>What this change deploys ({} Applications)</summary>\n",
        diff.applications.len()
    );
    // Applications whose changes read the same (one ApplicationSet's change on every
    // cluster) are shown once, with the list of where they apply: the report grows with the
    // distinct changes, not with the Applications.
    let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut index: std::collections::HashMap<(&'static str, String), usize> =
        std::collections::HashMap::new();
    for app in &diff.applications {
        let status = match app.status {
            AppStatus::Added => "added",
            AppStatus::Removed => "removed",
            AppStatus::Changed => "changed",
        };
        let body = app_changes(app);
        let name = format!(
            "{}/{} on {}",
            app.app.namespace, app.app.name, app.app.cluster
        );
        match index.get(&(status, body.clone())) {
            Some(&at) => groups[at].2.push(name),
            None => {
                index.insert((status, body.clone()), groups.len());
                groups.push((status.to_string(), body, vec![name]));
            }
        }
    }
    for (status, body, apps) in &groups {
        if apps.len() == 1 {
            let _ = writeln!(out, "#### {} ({status})\n", text(&apps[0]));
        } else {
            let shown: Vec<String> = apps.iter().take(8).map(|a| text(a)).collect();
            let _ = writeln!(
                out,
                "#### {} Applications ({status}): {}{}\n",
                apps.len(),
                shown.join(", "),
                if apps.len() > shown.len() {
                    format!(" and {} more", apps.len() - shown.len())
                } else {
                    String::new()
                }
            );
        }
        out.push_str(body);
        out.push('\n');
    }
    let _ = writeln!(out, "</details>");
    out
}

/// The `dropped` block's wire form: consumers grouped by file, each document as
/// `[index, version, name, namespace]`, so a report with hundreds of consumers still fits a
/// comment (a consumer costs its name and a few characters, its file path once).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DroppedBlock {
    crd: String,
    group: String,
    kind: String,
    dropped: Vec<String>,
    served: Vec<String>,
    storage: String,
    clusters: Vec<String>,
    files: Vec<FileBlock>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileBlock {
    path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    template: bool,
    documents: Vec<(usize, String, String, String)>,
}

impl From<&DroppedServedVersion> for DroppedBlock {
    fn from(d: &DroppedServedVersion) -> Self {
        let mut files: Vec<FileBlock> = Vec::new();
        for c in &d.consumers {
            let version = c
                .api_version
                .rsplit_once('/')
                .map(|(_, v)| v)
                .unwrap_or(&c.api_version)
                .to_string();
            let document = (c.document, version, c.name.clone(), c.namespace.clone());
            match files.last_mut() {
                Some(f) if f.path == c.path && f.template == c.template => {
                    f.documents.push(document)
                }
                _ => files.push(FileBlock {
                    path: c.path.clone(),
                    template: c.template,
                    documents: vec![document],
                }),
            }
        }
        DroppedBlock {
            crd: d.crd.clone(),
            group: d.group.clone(),
            kind: d.kind.clone(),
            dropped: d.dropped.clone(),
            served: d.served.clone(),
            storage: d.storage.clone(),
            clusters: d.clusters.clone(),
            files,
        }
    }
}

impl From<DroppedBlock> for DroppedServedVersion {
    fn from(b: DroppedBlock) -> Self {
        let consumers = b
            .files
            .iter()
            .flat_map(|f| {
                let group = &b.group;
                let kind = &b.kind;
                f.documents
                    .iter()
                    .map(
                        move |(document, version, name, namespace)| rules::Consumer {
                            path: f.path.clone(),
                            document: *document,
                            api_version: if group.is_empty() {
                                version.clone()
                            } else {
                                format!("{group}/{version}")
                            },
                            kind: kind.clone(),
                            namespace: namespace.clone(),
                            name: name.clone(),
                            template: f.template,
                        },
                    )
            })
            .collect();
        DroppedServedVersion {
            crd: b.crd,
            group: b.group,
            kind: b.kind,
            dropped: b.dropped,
            served: b.served,
            storage: b.storage,
            clusters: b.clusters,
            consumers,
        }
    }
}

fn blocks_section(result: &GateResult) -> String {
    let mut out = machine_block("verdict", &result.verdict);
    out.push('\n');
    if result.verdict.outcome != Outcome::Undecided {
        out.push_str(&machine_block("summary", &Summary::of(result)));
        out.push('\n');
    }
    for dropped in result.dropped() {
        out.push_str(&machine_block("dropped", &DroppedBlock::from(&dropped)));
        out.push('\n');
    }
    for finding in result
        .findings
        .iter()
        .filter(|f| f.rule == rules::KIND_NOT_SERVED && f.severity == Severity::Blocking)
    {
        out.push_str(&machine_block("not-served", &finding.evidence));
        out.push('\n');
    }
    for rule in FINDING_BLOCKS {
        for finding in result
            .findings
            .iter()
            .filter(|f| f.rule == rule && f.severity == Severity::Blocking)
            .take(FINDING_BLOCKS_PER_RULE)
        {
            let mut evidence = finding.evidence.clone();
            // A block stays small: the first Applications and a count.
            if let Some(apps) = evidence
                .get_mut("applications")
                .and_then(Value::as_array_mut)
                && apps.len() > 25
            {
                let more = apps.len() - 25;
                apps.truncate(25);
                evidence["moreApplications"] = more.into();
            }
            out.push_str(&machine_block(
                "finding",
                &BlockFinding {
                    rule: rule.to_string(),
                    evidence,
                },
            ));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests;
