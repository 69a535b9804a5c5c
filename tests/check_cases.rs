//! Data-driven `gate check` tests on the sample repository: every folder in tests/check-cases/
//! is one pull request. `base/` (optional) is committed on `main` over the sample repository,
//! `head/` on the branch `pr`; the gate compares the merge base with `pr`. The snapshot holds
//! the exit code, the report as published, and the JSON verdict. A case's `expect` (the
//! scenarios' report expectation: outcome, blocking counts, CRDs per dropped version, kinds
//! left alone) is asserted on the published report besides the snapshot.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    /// What the published report must say, beyond the snapshot (the counts a story quotes).
    #[serde(default)]
    expect: Option<ground::scenario::ReportExpect>,
}

pub fn redact_shas(text: &str, shas: &[String]) -> String {
    let mut out = text.to_string();
    for (index, sha) in shas.iter().enumerate() {
        out = out
            .replace(sha, &format!("[SHA{index}]"))
            .replace(&sha[..7], &format!("[SHA{index}]"));
    }
    out
}

#[test]
fn check_cases() {
    let root = common::project_root().join("tests/check-cases");
    // Where snapshots are only checked (`INSTA_UPDATE=no`, as the test command and CI run),
    // one render cache for every case (content-addressed): most cases share the sample's
    // renders at the base, and a hit can only make a case differ from its snapshot, so the
    // sharing also checks that a render key misses no input. Where a snapshot may be written,
    // each case renders cold, so none is recorded from another case's renders.
    let shared = (std::env::var("INSTA_UPDATE").as_deref() == Ok("no"))
        .then(|| tempfile::tempdir().expect("cache"));
    insta::glob!(root.as_path(), "*/case.yaml", |case_path| {
        let case_dir = case_path.parent().expect("case dir");
        let case: Case = serde_saphyr::from_str(&std::fs::read_to_string(case_path).expect("read"))
            .expect("case.yaml");
        let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
        if case_dir.join("base").is_dir() {
            repo.commit_overlay(&case_dir.join("base"), "main", "base change");
        }
        let base = repo.head();
        let head = repo.commit_overlay(&case_dir.join("head"), "pr", "the pull request");
        let own = shared
            .is_none()
            .then(|| tempfile::tempdir().expect("cache"));
        let cache = shared.as_ref().or(own.as_ref()).expect("a cache");
        let out = tempfile::tempdir().expect("out");
        // The gate's temporary folders (render trees, checked-out commits) live here, and
        // nothing of them may outlive the process.
        let scratch = tempfile::tempdir().expect("scratch");
        let output = common::gate(cache.path())
            .env("TMPDIR", scratch.path())
            .args([
                "--quiet",
                "check",
                "--head",
                "pr",
                "--default-branch",
                "main",
            ])
            .args(["--repo-url", common::SAMPLE_REPO_URL])
            .arg("--repo")
            .arg(repo.path())
            .arg("--inventory")
            .arg(common::sample_dir().join("inventory.yaml"))
            .arg("--charts")
            .arg(common::sample_dir().join("charts"))
            .arg("--report")
            .arg(out.path().join("report.md"))
            .arg("--json")
            .arg(out.path().join("verdict.json"))
            .arg("--html")
            .arg(out.path().join("report.html"))
            .output()
            .expect("gate runs");
        let left: Vec<_> = std::fs::read_dir(scratch.path())
            .expect("scratch")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(left.is_empty(), "the check left {left:?} in its TMPDIR");
        let report = std::fs::read_to_string(out.path().join("report.md")).expect("report written");
        // The HTML page: the same outcome, one script (its own), every <details> closed.
        let page = std::fs::read_to_string(out.path().join("report.html")).expect("html written");
        assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
        assert_eq!(page.matches("<script").count(), 1, "one script");
        assert_eq!(
            page.matches("<details").count(),
            page.matches("</details>").count()
        );
        let json_text = std::fs::read_to_string(out.path().join("verdict.json")).expect("json");
        let verdict: Value = serde_json::from_str(&json_text).expect("json");
        // The JSON reads back into the result it was written from.
        let result: gitops_loop::gate::verdict::GateResult =
            serde_json::from_str(&json_text).expect("the JSON is a GateResult");
        assert_eq!(serde_json::to_value(&result).unwrap(), verdict);
        assert!(
            page.contains(&format!(
                "addons-gate: {}</h1>",
                match result.verdict.outcome {
                    gitops_loop::gate::verdict::Outcome::Green => "passed",
                    gitops_loop::gate::verdict::Outcome::Blocked => "blocked",
                    gitops_loop::gate::verdict::Outcome::Undecided => "could not decide",
                }
            )),
            "the page's outcome"
        );
        // Quiet: stdout is the outcome line only.
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!(
                "addons-gate: {}\n",
                gitops_loop::gate::publish::title(&result)
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect::<String>()
            ),
            "quiet stdout is the outcome line"
        );
        // The diff as distinct changes, each with how many Applications it applies to.
        let changes: Vec<String> = verdict["diff"]["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .map(|c| {
                format!(
                    "{} {} {}/{} {}: {} fields, {} applications, {} chart-only",
                    c["id"],
                    c["change"].as_str().unwrap_or(""),
                    c["object"]["group"].as_str().unwrap_or(""),
                    c["object"]["kind"].as_str().unwrap_or(""),
                    c["object"]["name"].as_str().unwrap_or(""),
                    c["fields"].as_array().map_or(0, Vec::len),
                    c["applications"].as_array().map_or(0, Vec::len),
                    c["chartOnlyIn"].as_array().map_or(0, Vec::len),
                )
            })
            .collect();
        // The comment as published fits one GitHub comment and carries the same verdict.
        let (comment, _) = gitops_loop::gate::report::render(&result);
        assert!(
            comment.chars().count() <= gitops_loop::gate::report::COMMENT_LIMIT,
            "the comment is {} characters",
            comment.chars().count()
        );
        let published = gitops_loop::gate::report::parse(&comment)
            .expect("comment parses")
            .verdict;
        assert_eq!(
            (
                &published.outcome,
                &published.blocking,
                &published.notes,
                &published.counts
            ),
            (
                &result.verdict.outcome,
                &result.verdict.blocking,
                &result.verdict.notes,
                &result.verdict.counts
            )
        );
        // No invisible character (Cf, line and paragraph separators) reaches the comment or
        // the report: each is shown as `\u{...}` (told by the regex crate's Unicode tables).
        let invisible = regex::Regex::new(r"[\p{Cf}\p{Zl}\p{Zp}]").unwrap();
        for (what, text) in [("comment", &comment), ("report", &report)] {
            assert!(
                !invisible.is_match(text),
                "an invisible character in the {what}: {:?}",
                invisible.find(text).map(|m| m.as_str())
            );
        }
        // The machine blocks carry the same verdict the JSON does.
        let parsed = gitops_loop::gate::report::parse(&report).expect("report parses");
        if let Some(expect) = &case.expect {
            let unmet = expect.unmet(&parsed);
            assert!(unmet.is_empty(), "{}: {unmet:#?}", case_dir.display());
        }
        assert_eq!(
            serde_json::to_value(&parsed.verdict).unwrap(),
            verdict["verdict"]
        );
        // What Bosun makes of this report (the path and, for a handoff, what a person reads).
        let bosun = {
            use gitops_loop::bosun::classify::{self, Route, Situation};
            let head_sha = parsed.verdict.head.clone();
            match classify::classify(&Situation {
                report: Some(&parsed),
                head_sha: &head_sha,
                fork: false,
                attempts: 0,
                attempt_cap: 2,
            }) {
                Route::Wait(why) => format!("wait: {why}"),
                Route::Green => "green".to_string(),
                Route::WorthALook(reasons) => format!("worth a look: {}", reasons.join("; ")),
                Route::Swap(dropped) => format!(
                    "swap: {}",
                    dropped
                        .iter()
                        .map(|d| format!("{} -> {}/{}", d.kind, d.group, d.storage))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Route::Escalate(line) => format!("escalate: {line}"),
                Route::Migrate(error) => format!("migrate values: {error}"),
                Route::Fix(objects) => format!(
                    "mechanical fix: {}",
                    objects
                        .iter()
                        .map(|o| format!(
                            "{} {}/{} on {}",
                            o.kind,
                            o.namespace,
                            o.name,
                            o.applications.join(", ")
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                // The comment a person reads, exactly as Bosun writes it.
                Route::Handoff(h) => format!("handoff:\n{}", classify::handoff_comment(&h, &[])),
            }
        };
        assert!(
            !invisible.is_match(&bosun),
            "an invisible character in what Bosun writes"
        );
        // How the renders ran depends on the machine (a network namespace, or the scrubbed
        // environment opted in where none can be made): the report says it in one footer line,
        // which `tests/confinement.rs` checks per mode; here it is named, not quoted.
        use gitops_loop::render::confine::Confinement;
        let footers = [
            Confinement::NetworkNamespace.footer(),
            Confinement::ScrubbedEnvironmentOnly.footer(),
        ];
        assert_eq!(
            footers
                .iter()
                .map(|f| report.matches(f).count())
                .sum::<usize>(),
            1,
            "one footer says how the renders ran:\n{report}"
        );
        let report = footers
            .iter()
            .fold(report, |r, f| r.replace(f, "[how the renders ran]"));
        let shas = [base, head];
        let snapshot = format!(
            "# {}\nexit: {}\nstderr: {}\n--- report\n{}\n--- verdict\n{}\n--- findings\n{}\n--- distinct changes\n{}\n--- bosun\n{}",
            case.description.trim(),
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).trim(),
            redact_shas(&report, &shas),
            redact_shas(
                &serde_json::to_string_pretty(&verdict["verdict"]).unwrap(),
                &shas
            ),
            serde_json::to_string_pretty(&verdict["findings"]).unwrap(),
            changes.join("\n"),
            redact_shas(&bosun, &shas),
        );
        insta::assert_snapshot!(snapshot);
    });
    assert_eq!(
        common::NetworkWatch::get().connections(),
        0,
        "a render reached the network (the proxy variables point at the watch)"
    );
}

/// Without `--quiet`, stdout is the whole report (what `--report` writes) and stderr says
/// how long the check took and how many distinct changes it found.
#[test]
fn check_prints_the_report_unless_quiet() {
    let case_dir = common::project_root().join("tests/check-cases/es-major-bump");
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(&case_dir.join("head"), "pr", "the pull request");
    let cache = tempfile::tempdir().expect("cache");
    let out = tempfile::tempdir().expect("out");
    let output = common::gate_check_sample(cache.path(), repo.path())
        .arg("--report")
        .arg(out.path().join("report.md"))
        .output()
        .expect("gate runs");
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report written");
    assert_eq!(String::from_utf8_lossy(&output.stdout), report);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("gate: checked in ") && stderr.contains(" distinct changes"),
        "{stderr}"
    );
}

/// The progress line (renders done out of planned, cache hits, the slowest render) is on
/// stderr when it is a terminal; `GATE_PROGRESS=always` stands for one here. Without it (a
/// pipe, as here) and with `-q`, stderr has no progress line.
#[test]
fn progress_shows_on_a_terminal_and_nowhere_else() {
    let case_dir = common::project_root().join("tests/check-cases/es-major-bump");
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(&case_dir.join("head"), "pr", "the pull request");
    let run = |progress: Option<&str>, quiet: bool, render: bool| -> String {
        let cache = tempfile::tempdir().expect("cache");
        let mut command = if render {
            let mut command = common::gate(cache.path());
            command
                .args(["render", "--revision", "pr"])
                .args(["--repo-url", common::SAMPLE_REPO_URL])
                .arg("--repo")
                .arg(repo.path())
                .arg("--inventory")
                .arg(common::sample_dir().join("inventory.yaml"))
                .arg("--charts")
                .arg(common::sample_dir().join("charts"));
            command
        } else {
            common::gate_check_sample(cache.path(), repo.path())
        };
        if quiet {
            command.arg("--quiet");
        }
        match progress {
            Some(value) => command.env("GATE_PROGRESS", value),
            None => command.env_remove("GATE_PROGRESS"),
        };
        let output = command.output().expect("gate runs");
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    for render in [false, true] {
        let what = if render { "render" } else { "check" };
        let shown = run(Some("always"), false, render);
        let line =
            regex::Regex::new(&format!(r"gate: {what}: \d+/\d+ renders, \d+ from cache")).unwrap();
        assert!(line.is_match(&shown), "{what}: {shown}");
        // The last state: every planned render done, the slowest named.
        let last = line.find_iter(&shown).last().unwrap().as_str();
        let (done, planned) = last
            .rsplit_once(": ")
            .unwrap()
            .1
            .split_once(" renders")
            .unwrap()
            .0
            .split_once('/')
            .unwrap();
        assert_eq!(done, planned, "{shown}");
        assert!(planned != "0" && shown.contains(", slowest: "), "{shown}");
        for (progress, quiet) in [
            (None, false),
            (Some("always"), true),
            (Some("never"), false),
        ] {
            let stderr = run(progress, quiet, render);
            assert!(
                !stderr.contains(" renders, ") && !stderr.contains("\x1b["),
                "{what} {progress:?} quiet {quiet}: {stderr}"
            );
        }
    }
}

/// docs/gate.md shows the report of a pull request adding an addon: its expansion table is
/// the addon-added case's snapshot, line for line (so the doc and the code cannot drift).
#[test]
fn the_addon_table_in_the_docs_is_the_check_cases() {
    let root = common::project_root();
    let snapshot = std::fs::read_to_string(
        root.join("tests/snapshots/check_cases__check_cases@addon-added__case.yaml.snap"),
    )
    .expect("the addon-added snapshot");
    let doc = std::fs::read_to_string(root.join("docs/gate.md")).expect("docs/gate.md");
    let table: Vec<&str> = snapshot
        .lines()
        .filter(|l| l.trim_start().starts_with('|'))
        .collect();
    assert!(
        table.len() >= 5,
        "the snapshot has the header, the rule and one row per Application: {table:?}"
    );
    for line in
        table.iter().copied().chain(snapshot.lines().filter(|l| {
            l.starts_with("- `addon-added`:") || l.starts_with("`[SHA0]` (merge base)")
        }))
    {
        assert!(
            doc.lines().any(|d| d == line),
            "docs/gate.md lacks the snapshot's line:\n{line}"
        );
    }
}
