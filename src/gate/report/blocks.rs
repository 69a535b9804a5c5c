//! The report's room for machine blocks: writing them, reading them back (`parse`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::escape::invisible;
use super::summary::Summary;
use super::{BLOCK_PREFIX, MARKER, ParsedReport};
use crate::gate::rules::{self, DroppedServedVersion, Severity};
use crate::gate::text::clip;
use crate::gate::verdict::{GateResult, Outcome, Verdict};

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

/// Serialises a machine block so its text contains no `-`, `<`, `>` or `&`, and no invisible
/// character (`escape::invisible`: written as JSON escapes, read back as themselves).
pub fn machine_block(name: &str, value: &impl Serialize) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    let mut escaped = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '-' => escaped.push_str("\\u002d"),
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            // Only inside JSON strings can such a character be (serde_json writes none
            // elsewhere), where a `\uXXXX` escape (a surrogate pair past U+FFFF) reads back.
            c if invisible(c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    escaped.push_str(&format!("\\u{unit:04x}"));
                }
            }
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

/// The verdict as its block carries it: the error lines a render failure gives (a chart's
/// `fail` message, helm's stderr) clipped, so a chart cannot make the block outgrow a comment.
/// `gate check --json` keeps them whole.
pub(super) fn verdict_block(verdict: &Verdict, errors: usize, chars: usize) -> String {
    let mut bounded = verdict.clone();
    bounded.errors = kept_errors(&verdict.errors, errors)
        .into_iter()
        .map(|error| clip(error, chars))
        .collect();
    // A revision the caller named that did not resolve is quoted here too.
    bounded.base = clip(&bounded.base, 200);
    bounded.head = clip(&bounded.head, 200);
    machine_block("verdict", &bounded)
}

/// At most `limit` of a failed render's error lines, in order, keeping both sides: the lines
/// at the head and the others (at the merge base, or about a revision) each keep up to half
/// the room when the other side has lines. A reader that asks whether every error is at the
/// head (Bosun, before a values migration) gets the same answer from the kept lines as from
/// all of them.
pub(super) fn kept_errors(errors: &[String], limit: usize) -> Vec<&String> {
    let at_head = |e: &String| e.starts_with("at head");
    let heads = errors.iter().filter(|e| at_head(e)).count();
    let others = errors.len() - heads;
    let keep_others = others.min(limit.div_ceil(2).max(limit.saturating_sub(heads)));
    let keep_heads = heads.min(limit - keep_others);
    let (mut heads_left, mut others_left) = (keep_heads, keep_others);
    errors
        .iter()
        .filter(|e| {
            let left = if at_head(e) {
                &mut heads_left
            } else {
                &mut others_left
            };
            let keep = *left > 0;
            *left = left.saturating_sub(1);
            keep
        })
        .collect()
}

/// Every string of a finding's evidence clipped to `chars` characters: a value a chart renders
/// (quoted by a schema's refusal) cannot make one block outgrow a comment.
fn clipped(value: &Value, chars: usize) -> Value {
    match value {
        Value::String(s) => Value::String(clip(s, chars)),
        Value::Array(items) => Value::Array(items.iter().map(|v| clipped(v, chars)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (clip(k, chars), clipped(v, chars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The characters of one string in a `finding` block.
const FINDING_BLOCK_STRING: usize = 1_000;
/// The error lines a verdict block carries, and the characters of each.
pub(super) const VERDICT_ERRORS: usize = 20;
pub(super) const VERDICT_ERROR_CHARS: usize = 2_000;

pub(super) fn blocks_section(result: &GateResult) -> String {
    let mut out = verdict_block(&result.verdict, VERDICT_ERRORS, VERDICT_ERROR_CHARS);
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
            let mut evidence = clipped(&finding.evidence, FINDING_BLOCK_STRING);
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
