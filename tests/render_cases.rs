//! Data-driven render tests: every folder in tests/render-cases/ is one case.
//!
//! A case folder holds `repo/` (the repository's files, committed to `main`), an optional
//! `inventory.yaml`, and `case.yaml`:
//!
//! ```yaml
//! description: what the case pins
//! args: [--format, json]        # extra arguments for `gate render`
//! revision: main                # optional
//! ```
//! Charts come from tests/render-cases/_charts (a mirror). The snapshot records the exit
//! code, stdout and stderr (with temporary paths and commit ids redacted).

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::Path;

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    revision: Option<String>,
}

fn redact(text: &str, repo: &Path, commit: &str) -> String {
    let charts = common::project_root().join("tests/render-cases/_charts");
    let mut out = text
        .replace(&repo.display().to_string(), "[REPO]")
        .replace(&charts.display().to_string(), "[CHARTS]");
    if !commit.is_empty() {
        out = out
            .replace(commit, "[COMMIT]")
            .replace(&commit[..12], "[COMMIT12]");
    }
    // Temporary directories of helm scratch space.
    let tmp = std::env::temp_dir().display().to_string();
    let mut redacted = String::new();
    for line in out.lines() {
        let mut line = line.to_string();
        while let Some(start) = line.find(&format!("{tmp}/gate-")) {
            let end = line[start..]
                .find([' ', ':', '"', '\''])
                .map(|e| start + e)
                .unwrap_or(line.len());
            line.replace_range(start..end, "[TMP]");
        }
        redacted.push_str(&line);
        redacted.push('\n');
    }
    redacted
}

#[test]
fn render_cases() {
    let root = common::project_root().join("tests/render-cases");
    insta::glob!(root.as_path(), "*/case.yaml", |case_path| {
        let case_dir = case_path.parent().expect("case dir");
        let case: Case =
            serde_saphyr::from_str(&std::fs::read_to_string(case_path).expect("read case"))
                .expect("case.yaml parses");
        let repo = common::TestRepo::from_fixture(&case_dir.join("repo"));
        let commit = repo.head();
        let cache = tempfile::tempdir().expect("cache dir");
        let mut command = common::gate(cache.path());
        command
            .arg("--quiet")
            .arg("render")
            .arg("--repo")
            .arg(repo.path())
            .arg("--repo-url")
            .arg("https://git.example.test/cases/repo.git")
            .arg("--charts")
            .arg(root.join("_charts"));
        if case_dir.join("inventory.yaml").exists() {
            command
                .arg("--inventory")
                .arg(case_dir.join("inventory.yaml"));
        }
        if let Some(revision) = &case.revision {
            command.arg("--revision").arg(revision);
        }
        command.args(&case.args);
        let output = command.output().expect("gate runs");
        let report = format!(
            "# {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
            case.description.trim(),
            output.status.code().unwrap_or(-1),
            redact(
                &String::from_utf8_lossy(&output.stdout),
                repo.path(),
                &commit
            ),
            redact(
                &String::from_utf8_lossy(&output.stderr),
                repo.path(),
                &commit
            ),
        );
        insta::assert_snapshot!(report);
    });
    assert_eq!(
        common::NetworkWatch::get().connections(),
        0,
        "a render reached the network (the proxy variables point at the watch)"
    );
}
