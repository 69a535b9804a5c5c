//! `gate check`: the merge base and the head rendered, diffed and judged.

use std::path::Path;

use super::diff::{self, RenderDiff};
use super::report::{GateResult, Outcome, Verdict};
use super::rules::{self, Finding, Severity};
use crate::render::git::{self, Snapshot};
use crate::render::{self, RenderConfig, RenderFailure};

/// Which commits to compare.
#[derive(Debug, Clone)]
pub struct Revisions {
    /// The merge base; computed from `head` and the default branch when absent.
    pub base: Option<String>,
    pub head: String,
    /// The branch the pull request merges into (default: origin's HEAD, else main, else master).
    pub default_branch: Option<String>,
}

/// The branch a pull request merges into, as the repository knows it.
pub fn default_branch(repo: &Path) -> Option<String> {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(reference) = run(&["symbolic-ref", "--quiet", "refs/remotes/origin/HEAD"]) {
        return Some(reference.trim_start_matches("refs/remotes/").to_string());
    }
    ["main", "master", "origin/main", "origin/master"]
        .into_iter()
        .find(|b| git::resolve_commit(repo, b).is_ok())
        .map(str::to_string)
}

fn undecided(base: String, head: String, errors: Vec<String>) -> GateResult {
    let findings = errors
        .iter()
        .map(|e| Finding {
            rule: rules::RENDER_FAILED.into(),
            severity: Severity::Blocking,
            summary: e.clone(),
            evidence: serde_json::json!({"error": e}),
        })
        .collect::<Vec<_>>();
    let mut blocking = std::collections::BTreeMap::new();
    blocking.insert(rules::RENDER_FAILED.to_string(), findings.len());
    GateResult {
        verdict: Verdict {
            outcome: Outcome::Undecided,
            base,
            head,
            counts: Default::default(),
            blocking,
            repository_consumers: 0,
            errors,
        },
        findings,
        diff: RenderDiff::default(),
    }
}

fn failure_lines(at: &str, failure: &RenderFailure) -> Vec<String> {
    failure
        .diagnostics
        .iter()
        .filter(|d| d.severity == render::Severity::Error)
        .map(|d| format!("at {at}: {}: {}", d.subject, d.message))
        .collect()
}

/// Renders both commits and judges the change. Never fails: what cannot be decided is an
/// `Undecided` verdict carrying the reason.
pub fn check(config: &RenderConfig, revisions: &Revisions) -> GateResult {
    let repo = &config.repo_dir;
    let head = match git::resolve_commit(repo, &revisions.head) {
        Ok(head) => head,
        Err(e) => return undecided(String::new(), revisions.head.clone(), vec![e.to_string()]),
    };
    let base = match &revisions.base {
        Some(base) => git::resolve_commit(repo, base).map_err(|e| e.to_string()),
        None => match revisions.default_branch.clone().or_else(|| default_branch(repo)) {
            Some(branch) => git::merge_base(repo, &head, &branch).map_err(|e| format!("no merge base of {head} and {branch}: {e}")),
            None => Err("no default branch found to compute the merge base from (pass --base or --default-branch)".to_string()),
        },
    };
    let base = match base {
        Ok(base) => base,
        Err(e) => return undecided(String::new(), head, vec![e]),
    };
    let at = |revision: &str| {
        let mut c = config.clone();
        c.revision = revision.to_string();
        render::render(&c)
    };
    let head_rendering = at(&head);
    let base_rendering = at(&base);
    let (base_rendering, head_rendering) = match (base_rendering, head_rendering) {
        (Ok(b), Ok(h)) => (b, h),
        (b, h) => {
            let mut errors = Vec::new();
            if let Err(f) = &h {
                errors.extend(failure_lines("head", f));
            }
            if let Err(f) = &b {
                errors.extend(failure_lines("merge base", f));
            }
            return undecided(base, head, errors);
        }
    };
    let head_snapshot = match Snapshot::load(repo, &head) {
        Ok(s) => s,
        Err(e) => return undecided(base, head, vec![e.to_string()]),
    };
    let mut render_diff = diff::diff(&base_rendering, &head_rendering);
    isolate_chart_moves(
        config,
        &head,
        &base_rendering,
        &head_rendering,
        &mut render_diff,
    );
    let findings = rules::evaluate(
        &base_rendering,
        &head_rendering,
        &render_diff,
        &head_snapshot,
        &config.inventory,
    );
    let mut blocking = std::collections::BTreeMap::new();
    for finding in findings.iter().filter(|f| f.severity == Severity::Blocking) {
        *blocking.entry(finding.rule.clone()).or_insert(0) += 1;
    }
    let mut result = GateResult {
        verdict: Verdict {
            outcome: if blocking.is_empty() {
                Outcome::Green
            } else {
                Outcome::Blocked
            },
            base,
            head,
            counts: render_diff.counts.clone(),
            blocking,
            repository_consumers: 0,
            errors: Vec::new(),
        },
        findings,
        diff: render_diff,
    };
    result.verdict.repository_consumers = result.dropped().iter().map(|d| d.consumers.len()).sum();
    result
}

/// For an Application whose chart version moved, renders the head's Application again with
/// the base's chart version pinned and diffs that against the head: the chart's own change,
/// with the head's values at both versions. When only the version moved, that equals the
/// Application's diff and nothing is added; when values moved too, it is attached.
fn isolate_chart_moves(
    config: &RenderConfig,
    head: &str,
    base: &crate::render::Rendering,
    head_rendering: &crate::render::Rendering,
    render_diff: &mut RenderDiff,
) {
    for app_diff in render_diff
        .applications
        .iter_mut()
        .filter(|a| !a.chart_moves.is_empty())
    {
        let find = |rendering: &crate::render::Rendering| {
            rendering
                .applications
                .iter()
                .find(|a| {
                    a.cluster.name == app_diff.app.cluster
                        && a.name == app_diff.app.name
                        && a.namespace == app_diff.app.namespace
                })
                .cloned()
        };
        let (Some(_), Some(after)) = (find(base), find(head_rendering)) else {
            continue;
        };
        let mut pinned = after.manifest.clone();
        for chart_move in &app_diff.chart_moves {
            for pointer in ["/spec/source", "/spec/sources"] {
                match pinned.pointer_mut(pointer) {
                    Some(serde_json::Value::Array(sources)) => {
                        for source in sources.iter_mut().filter(|s| {
                            s.get("chart").and_then(serde_json::Value::as_str)
                                == Some(chart_move.chart.as_str())
                        }) {
                            source["targetRevision"] =
                                serde_json::Value::String(chart_move.from.clone());
                        }
                    }
                    Some(source)
                        if source.get("chart").and_then(serde_json::Value::as_str)
                            == Some(chart_move.chart.as_str()) =>
                    {
                        source["targetRevision"] =
                            serde_json::Value::String(chart_move.from.clone());
                    }
                    _ => {}
                }
            }
        }
        let mut c = config.clone();
        c.revision = head.to_string();
        let Ok(rendering) = render::render_applications(&c, vec![pinned]) else {
            continue;
        };
        let Some(old_version) = rendering.applications.into_iter().next() else {
            continue;
        };
        let (added, removed, changed) = diff::diff_objects(&old_version.objects, &after.objects);
        let chart_only = diff::ChartOnly {
            added,
            removed,
            changed,
        };
        if chart_only.added != app_diff.added
            || chart_only.removed != app_diff.removed
            || chart_only.changed != app_diff.changed
        {
            app_diff.chart_only = Some(chart_only);
        }
    }
}
