//! `gate check`: the merge base and the head rendered, diffed and judged.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::diff::{self, AppKey, AppStatus, ChartMove, RenderDiff};
use super::rules::{self, Finding, Severity};
use super::verdict::{ChartDefaults, GateResult, Outcome, Verdict};
use crate::git;
use crate::render::{self, RenderConfig, RenderFailure};

/// Which commits to compare.
#[derive(Debug, Clone)]
pub struct Revisions {
    /// The merge base, as given (`--base`); when absent it is computed from `head` and
    /// `target`.
    pub base: Option<String>,
    /// The pull request's head: any revision git resolves (`HEAD`, a branch, a commit).
    pub head: String,
    /// What the pull request merges into, to compute the merge base from: a branch name
    /// (`gate check --default-branch`) or a commit (`publish::check_and_publish`, for `gate
    /// publish` and Bosun's triage, passes the base commit the forge reports). Default:
    /// [`default_branch`].
    pub target: Option<String>,
}

/// The branch a pull request merges into, as the repository knows it: origin's HEAD, else
/// main, else master (local or origin's).
pub fn default_branch(repo: &Path) -> Option<String> {
    let run = |args: &[&str]| git::Git::local(repo).args(args).run_text().ok();
    if let Some(reference) = run(&["symbolic-ref", "--quiet", "refs/remotes/origin/HEAD"]) {
        return Some(reference.trim_start_matches("refs/remotes/").to_string());
    }
    ["main", "master", "origin/main", "origin/master"]
        .into_iter()
        .find(|b| git::resolve_commit(repo, b).is_ok())
        .map(str::to_string)
}

pub(super) fn undecided(base: String, head: String, errors: Vec<String>) -> GateResult {
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
            notes: Default::default(),
            repository_consumers: 0,
            errors,
        },
        findings,
        diff: RenderDiff::default(),
        chart_defaults: Vec::new(),
        confinement: None,
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
    check_keeping(config, revisions).0
}

/// The two renders a check made, kept for a caller that acts on the head (Bosun renders
/// the head once per round): the head's render or its failure, and the merge base's.
pub struct Kept {
    /// The checkout rendered (a render names its values files by it).
    pub repo_dir: std::path::PathBuf,
    pub head: String,
    pub head_render: Result<render::Rendering, RenderFailure>,
    pub base: String,
    pub base_render: Option<render::Rendering>,
}

/// [`check`], keeping the renders it made (None when it made none).
pub fn check_keeping(config: &RenderConfig, revisions: &Revisions) -> (GateResult, Option<Kept>) {
    match resolve(&config.repo_dir, revisions) {
        Ok((base, head)) => {
            let mut kept = None;
            let result = judge_commits(config, base, head, Some(&mut kept));
            result.assert_consistent();
            (result, kept)
        }
        Err(undecided) => {
            undecided.assert_consistent();
            (*undecided, None)
        }
    }
}

/// The merge base's and the head's commits (in that order), or the `Undecided` verdict
/// saying why they cannot be known. Only reads the repository: a caller may resolve while it
/// reads its inventory.
pub fn resolve(repo: &Path, revisions: &Revisions) -> Result<(String, String), Box<GateResult>> {
    /// What the merge base comes from.
    enum Base {
        /// `--base`, resolved.
        Given(Result<String, String>),
        /// What the pull request merges into (named as given), resolved.
        Target(String, Result<String, git::GitError>),
        /// Nothing to compute it from.
        None,
    }
    // The head and the base (or the target) are resolved at once, a git process each; the
    // merge base needs both.
    let base = || match &revisions.base {
        Some(base) => Base::Given(git::resolve_commit(repo, base).map_err(|e| e.to_string())),
        None => match revisions.target.clone().or_else(|| default_branch(repo)) {
            // The target is resolved to a commit first: merge-base then sees two commit ids,
            // never a string that could read as one of its options.
            Some(target) => {
                let commit = git::resolve_commit(repo, &target);
                Base::Target(target, commit)
            }
            None => Base::None,
        },
    };
    let (head, base) = std::thread::scope(|scope| {
        let base = scope.spawn(base);
        let head = git::resolve_commit(repo, &revisions.head);
        (head, super::joined(base.join()))
    });
    let undecided =
        |head: String, error: String| Box::new(undecided(String::new(), head, vec![error]));
    let head = head.map_err(|e| undecided(revisions.head.clone(), e.to_string()))?;
    let base = match base {
        Base::Given(base) => base,
        Base::Target(target, commit) => commit
            .and_then(|target| git::merge_base(repo, &head, &target))
            .map_err(|e| format!("no merge base of {head} and {target}: {e}")),
        Base::None => Err("no default branch found to compute the merge base from (pass --base or --default-branch)".to_string()),
    };
    match base {
        Ok(base) => Ok((base, head)),
        Err(e) => Err(undecided(head, e)),
    }
}

/// [`check`] of two resolved commits.
pub fn check_commits(config: &RenderConfig, base: String, head: String) -> GateResult {
    let result = judge_commits(config, base, head, None);
    result.assert_consistent();
    result
}

/// [`check_commits`], the renders put in `kept` when asked.
fn judge_commits(
    config: &RenderConfig,
    base: String,
    head: String,
    kept: Option<&mut Option<Kept>>,
) -> GateResult {
    let repo = &config.repo_dir;
    // One parsed-output store per check: both commits share it, nothing outlives the check
    // (a transient render failure is not remembered by the next one).
    let mut owned = config.clone();
    owned.parsed = Default::default();
    let config = &owned;
    // No network namespace and no opt-in: one line, and the gate cannot decide (never green).
    let confinement = match render::confine::confinement(&config.helm.limits) {
        Ok(confinement) => confinement,
        Err(refusal) => return undecided(base, head, vec![refusal]),
    };
    // A failure after this point happened under that confinement: the report says it too.
    let undecided = |base, head, errors| GateResult {
        confinement: Some(confinement),
        ..undecided(base, head, errors)
    };
    let (head_rendering, base_rendering) =
        render_both(&head, &base, |revision| render::render(config, revision));
    let (base_rendering, head_rendering) = match (base_rendering, head_rendering) {
        (Ok(b), Ok(h)) => (b, h),
        (b, h) => {
            let errors = error_lines(h.as_ref().err(), b.as_ref().err());
            if let Some(kept) = kept {
                *kept = Some(Kept {
                    repo_dir: repo.to_path_buf(),
                    head: head.clone(),
                    head_render: h,
                    base: base.clone(),
                    base_render: b.ok(),
                });
            }
            return undecided(base, head, errors);
        }
    };
    let head_snapshot = match config.parsed.snapshot(repo, &head) {
        Ok(s) => s,
        Err(e) => return undecided(base, head, vec![e.to_string()]),
    };
    // Loaded by the merge base's render (the store keeps it): what its manifests held.
    let base_snapshot = config.parsed.snapshot(repo, &base).ok();
    render::trace("check", "both commits rendered");
    let head_commit = head.clone();
    let result = judge(
        Judged {
            base,
            head,
            base_rendering: &base_rendering,
            head_rendering: &head_rendering,
            head_snapshot: &head_snapshot,
            base_snapshot: base_snapshot.as_deref(),
            inventory: &config.inventory,
            confinement,
        },
        |base_rendering, head_rendering| {
            render_old_versions(config, &head_commit, base_rendering, head_rendering)
        },
        |render_diff| chart_defaults(config, render_diff),
    );
    // The renderings are freed on a thread of its own, off the verdict's path: 600
    // Applications' objects take 15 ms to free, and a process may end before that thread
    // does. They hold nothing but memory; the snapshots (whose checked-out trees are
    // temporary folders) and the parsed-output store are freed here, before the verdict is
    // returned. (When no thread can be started, the failed spawn frees them at once.)
    match kept {
        Some(kept) => {
            *kept = Some(Kept {
                repo_dir: repo.to_path_buf(),
                head: result.verdict.head.clone(),
                head_render: Ok(head_rendering),
                base: result.verdict.base.clone(),
                base_render: Some(base_rendering),
            });
        }
        None => {
            let renderings = (base_rendering, head_rendering);
            let _ = std::thread::Builder::new().spawn(move || drop(renderings));
        }
    }
    drop((head_snapshot, base_snapshot, owned));
    result
}

/// The error lines of a check whose render failed at one commit or both: the head's, then the
/// merge base's, each sorted and without repeats (a sharded check's merge gives the same
/// lines whichever shard met them).
pub(super) fn error_lines(
    head: Option<&RenderFailure>,
    base: Option<&RenderFailure>,
) -> Vec<String> {
    let lines = |at: &str, failure: Option<&RenderFailure>| -> Vec<String> {
        let mut lines = failure.map(|f| failure_lines(at, f)).unwrap_or_default();
        lines.sort();
        lines.dedup();
        lines
    };
    let mut errors = lines("head", head);
    errors.extend(lines("merge base", base));
    errors
}

/// What [`judge`] reads: both commits rendered, the repository at both, the inventory.
pub(super) struct Judged<'a> {
    pub base: String,
    pub head: String,
    pub base_rendering: &'a render::Rendering,
    pub head_rendering: &'a render::Rendering,
    pub head_snapshot: &'a git::Snapshot,
    pub base_snapshot: Option<&'a git::Snapshot>,
    pub inventory: &'a render::inventory::Inventory,
    pub confinement: render::confine::Confinement,
}

/// The verdict of two renderings: the diff, the rules, each moved chart's own change (the
/// head's Applications rendered at the base's chart versions, from `old_versions`) and its
/// default values (`chart_defaults`). One code path for a check and a sharded check's merge.
pub(super) fn judge(
    judged: Judged<'_>,
    old_versions: impl FnOnce(
        &render::Rendering,
        &render::Rendering,
    ) -> BTreeMap<AppKey, render::RenderedApplication>
    + Send,
    chart_defaults: impl FnOnce(&RenderDiff) -> Vec<ChartDefaults> + Send,
) -> GateResult {
    let Judged {
        base,
        head,
        base_rendering,
        head_rendering,
        head_snapshot,
        base_snapshot,
        inventory,
        confinement,
    } = judged;
    // The chart moves' own render and diff need only the two renderings: they run while the
    // renderings are diffed and judged, on the core the renders have just left (their helm
    // runs, when values moved too, overlap the diff).
    let (mut render_diff, chart_only, findings, chart_defaults) = std::thread::scope(|scope| {
        let moves = scope.spawn(|| {
            let old_versions = old_versions(base_rendering, head_rendering);
            chart_moves_alone(base_rendering, head_rendering, &old_versions)
        });
        let render_diff = diff::diff(base_rendering, head_rendering);
        render::trace("check", "diffed");
        let (findings, chart_defaults) = std::thread::scope(|judging| {
            let defaults = judging.spawn(|| chart_defaults(&render_diff));
            let findings = rules::evaluate(
                base_rendering,
                head_rendering,
                &render_diff,
                head_snapshot,
                base_snapshot,
                inventory,
            );
            (findings, super::joined(defaults.join()))
        });
        let chart_only = super::joined(moves.join());
        (render_diff, chart_only, findings, chart_defaults)
    });
    // A chart-only diff equal to the Application's whole diff adds nothing.
    let at: BTreeMap<&AppKey, usize> = render_diff
        .applications
        .iter()
        .enumerate()
        .filter(|(_, a)| a.status == AppStatus::Changed && !a.chart_moves.is_empty())
        .map(|(at, a)| (&a.app, at))
        .collect();
    let chart_only: Vec<(usize, std::sync::Arc<diff::ObjectsDiff>)> = chart_only
        .into_iter()
        .filter_map(|(key, objects)| {
            let at = *at.get(&key)?;
            let whole = &render_diff.applications[at].objects;
            (objects != *whole).then_some((at, objects))
        })
        .collect();
    for (at, objects) in chart_only {
        render_diff.applications[at].chart_only = Some(objects);
    }
    render::trace("check", "rules evaluated, chart moves isolated");
    let mut blocking = std::collections::BTreeMap::new();
    let mut notes = std::collections::BTreeMap::new();
    for finding in &findings {
        let counts = match finding.severity {
            Severity::Blocking => &mut blocking,
            Severity::Note => &mut notes,
        };
        *counts.entry(finding.rule.clone()).or_insert(0) += 1;
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
            notes,
            repository_consumers: 0,
            errors: Vec::new(),
        },
        findings,
        diff: render_diff,
        chart_defaults,
        confinement: Some(confinement),
    };
    result.verdict.repository_consumers = result.dropped().iter().map(|d| d.consumers.len()).sum();
    result
}

/// For each Application whose chart version moved, the head's Application rendered again
/// with the base's chart versions pinned: the chart's own change is that against the head,
/// with the head's values at both versions ([`chart_moves_alone`]). All pinned Applications
/// render together (one snapshot of the head); if that fails, each is tried alone so one
/// that cannot render at its old version does not hide the others.
pub(super) fn render_old_versions(
    config: &RenderConfig,
    head: &str,
    base_rendering: &render::Rendering,
    head_rendering: &render::Rendering,
) -> BTreeMap<AppKey, render::RenderedApplication> {
    let base_apps: BTreeMap<AppKey, &render::RenderedApplication> = base_rendering
        .applications
        .iter()
        .map(|a| (diff::key_of(a), a))
        .collect();
    // In the diff's order (by Application key).
    let pinned: BTreeMap<AppKey, Value> = head_rendering
        .applications
        .iter()
        .filter_map(|after| {
            let key = diff::key_of(after);
            let moves = diff::chart_moves(base_apps.get(&key)?, after);
            (!moves.is_empty()).then(|| (key, pin_base_versions(&after.manifest, &moves)))
        })
        .collect();
    if pinned.is_empty() {
        return BTreeMap::new();
    }
    let pinned: Vec<Value> = pinned.into_values().collect();
    let rendered = match render::render_applications(config, head, pinned.clone()) {
        Ok(r) => r.applications,
        Err(_) => pinned
            .into_iter()
            .filter_map(|m| render::render_applications(config, head, vec![m]).ok())
            .flat_map(|r| r.applications)
            .collect(),
    };
    rendered
        .into_iter()
        .map(|a| (diff::key_of(&a), a))
        .collect()
}

/// For an Application whose chart version moved, its head diffed against its head rendered
/// at the base's chart versions ([`render_old_versions`]): the chart's own change, with the
/// head's values at both versions. When that render is the base's own (the same render keys:
/// only the version moved), it is the Application's whole diff and nothing is returned; the
/// caller drops any other that equals the whole diff too.
fn chart_moves_alone(
    base_rendering: &render::Rendering,
    head_rendering: &render::Rendering,
    old_versions: &BTreeMap<AppKey, render::RenderedApplication>,
) -> Vec<(AppKey, std::sync::Arc<diff::ObjectsDiff>)> {
    if old_versions.is_empty() {
        return Vec::new();
    }
    let base_keys: BTreeMap<AppKey, &[String]> = base_rendering
        .applications
        .iter()
        .map(|a| (diff::key_of(a), a.render_keys.as_slice()))
        .collect();
    let mut differ = diff::Differ::default();
    let mut out = Vec::new();
    for after in &head_rendering.applications {
        let key = diff::key_of(after);
        let Some(old_version) = old_versions.get(&key) else {
            continue;
        };
        if !old_version.render_keys.is_empty()
            && base_keys.get(&key) == Some(&old_version.render_keys.as_slice())
        {
            continue;
        }
        out.push((key, differ.applications(Some(old_version), Some(after))));
    }
    out
}

/// Each distinct chart version move's default values that changed (values.yaml of both
/// versions from the chart mirror).
fn chart_defaults(config: &RenderConfig, diff: &RenderDiff) -> Vec<ChartDefaults> {
    chart_defaults_of(config, moves_of(diff))
}

/// Every chart version move of a diff, in the order the report lists their default values:
/// by repository, chart and versions, each once.
pub(super) fn moves_of(diff: &RenderDiff) -> Vec<&ChartMove> {
    let mut moves: Vec<&ChartMove> = diff
        .applications
        .iter()
        .flat_map(|a| a.chart_moves.iter())
        .collect();
    moves.sort_by(|a, b| {
        (&a.repo_url, &a.chart, &a.from, &a.to).cmp(&(&b.repo_url, &b.chart, &b.from, &b.to))
    });
    moves.dedup();
    moves
}

/// The default values that changed, per chart version move (in the order given).
pub(super) fn chart_defaults_of(
    config: &RenderConfig,
    moves: Vec<&ChartMove>,
) -> Vec<ChartDefaults> {
    use crate::render::charts::ChartRef;
    const KEPT: usize = 200;
    let values = |version: &str, chart_move: &ChartMove| -> Result<Value, String> {
        crate::render::charts::default_values(
            config.charts.as_deref(),
            &ChartRef {
                repo_url: chart_move.repo_url.clone(),
                chart: chart_move.chart.clone(),
                version: version.to_string(),
            },
        )
    };
    moves
        .into_iter()
        .map(|chart_move| {
            let mut out = ChartDefaults {
                chart: chart_move.chart.clone(),
                repo_url: chart_move.repo_url.clone(),
                from: chart_move.from.clone(),
                to: chart_move.to.clone(),
                changes: Vec::new(),
                more: 0,
                unreadable: None,
            };
            match (
                values(&chart_move.from, chart_move),
                values(&chart_move.to, chart_move),
            ) {
                (Ok(before), Ok(after)) => {
                    let (changes, more) = diff::diff_values_limited(&before, &after, KEPT);
                    out.changes = changes;
                    out.more = more;
                }
                (Err(e), _) | (_, Err(e)) => out.unreadable = Some(e),
            }
            out
        })
        .collect()
}

/// The Application with each moved chart's `targetRevision` set back to the base's version.
fn pin_base_versions(manifest: &Value, moves: &[ChartMove]) -> Value {
    let mut pinned = manifest.clone();
    let mut sources: Vec<&mut Value> = Vec::new();
    for (key, value) in pinned["spec"].as_object_mut().into_iter().flatten() {
        match (key.as_str(), value) {
            ("source", source) => sources.push(source),
            ("sources", Value::Array(list)) => sources.extend(list.iter_mut()),
            _ => {}
        }
    }
    for source in sources {
        let field = |key: &str| source.get(key).and_then(Value::as_str).unwrap_or("");
        if let Some(chart_move) = moves
            .iter()
            .find(|m| field("chart") == m.chart && field("repoURL") == m.repo_url)
        {
            source["targetRevision"] = Value::String(chart_move.from.clone());
        }
    }
    pinned
}

/// Renders both commits at once with `at`: their helm processes share the cores (the
/// `--jobs` slots are shared too), and one commit's planning overlaps the other's helm runs.
/// A render that panics is a render failure (the check fails closed). (head, base).
pub(crate) fn render_both(
    head: &str,
    base: &str,
    at: impl Fn(&str) -> Result<render::Rendering, RenderFailure> + Sync,
) -> (
    Result<render::Rendering, RenderFailure>,
    Result<render::Rendering, RenderFailure>,
) {
    render_pair(head, base, || at(head), || at(base))
}

/// [`render_both`] with a render of its own for each commit (`head`, `base` name them for a
/// render that stops). (head, base).
pub(crate) fn render_pair(
    head: &str,
    base: &str,
    at_head: impl FnOnce() -> Result<render::Rendering, RenderFailure> + Send,
    at_base: impl FnOnce() -> Result<render::Rendering, RenderFailure> + Send,
) -> (
    Result<render::Rendering, RenderFailure>,
    Result<render::Rendering, RenderFailure>,
) {
    let stopped = |revision: &str| {
        Err(RenderFailure {
            revision: revision.to_string(),
            diagnostics: vec![render::Diagnostic {
                severity: render::Severity::Error,
                subject: "render".into(),
                message: "the render stopped unexpectedly".into(),
            }],
            helm_failures: Vec::new(),
            values_users: Vec::new(),
        })
    };
    std::thread::scope(|scope| {
        let head_thread = scope.spawn(at_head);
        let base_thread = scope.spawn(at_base);
        (
            head_thread.join().unwrap_or_else(|_| stopped(head)),
            base_thread.join().unwrap_or_else(|_| stopped(base)),
        )
    })
}
