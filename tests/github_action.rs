//! The gate's GitHub Action (action.yml) and the copy-paste workflow in docs/examples, linted
//! with actionlint (installed by `cargo xtask tools`): the workflow is checked against the
//! action's own inputs, and the action never pastes an expression into its script.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::Path;

fn actionlint() -> std::path::PathBuf {
    let path = common::project_root().join("target/tools/actionlint");
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask tools`",
        path.display()
    );
    path
}

/// A repository holding the action at its root and the example workflow using it as `./`,
/// so actionlint reads the action's inputs; returns actionlint's exit status and output.
fn lint(action: &str, workflow: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    // actionlint finds its project by the git repository around the workflows.
    ground::git::git(dir.path(), &["init", "--quiet"]).unwrap();
    std::fs::write(dir.path().join("action.yml"), action).unwrap();
    let workflows = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(
        workflows.join("addons-gate.yml"),
        workflow.replace("uses: gitops-loop/gitops-loop@v0.1.0", "uses: ./"),
    )
    .unwrap();
    let output = std::process::Command::new(actionlint())
        .args(["-no-color", "-shellcheck=", "-pyflakes="])
        .current_dir(dir.path())
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

fn read(path: &str) -> String {
    std::fs::read_to_string(common::project_root().join(path)).unwrap()
}

#[test]
fn the_example_workflow_and_the_action_lint_clean() {
    let (ok, said) = lint(&read("action.yml"), &read("docs/examples/addons-gate.yml"));
    assert!(ok, "{said}");
    assert!(
        read("docs/examples/addons-gate.yml").contains("uses: gitops-loop/gitops-loop@v0.1.0"),
        "the workflow uses the action as a user would"
    );
}

#[test]
fn actionlint_catches_a_workflow_that_does_not_fit_the_action() {
    let workflow = read("docs/examples/addons-gate.yml").replace("inventory:", "inventroy:");
    let (ok, said) = lint(&read("action.yml"), &workflow);
    assert!(!ok);
    assert!(said.contains("inventroy"), "{said}");
    let broken = read("docs/examples/addons-gate.yml").replace("pull_request:", "pull_requets:");
    let (ok, said) = lint(&read("action.yml"), &broken);
    assert!(!ok, "{said}");
}

#[test]
fn the_action_never_pastes_an_expression_into_its_script() {
    // `${{ inputs.x }}` or `${{ github.event... }}` inside `run:` is script injection: a pull
    // request's title or branch name would be read as shell. Everything goes through `env:`.
    let action: serde_json::Value = serde_saphyr::from_str(&read("action.yml")).unwrap();
    let steps = action["runs"]["steps"].as_array().unwrap();
    assert!(!steps.is_empty());
    for step in steps {
        let run = step["run"].as_str().unwrap_or_default();
        assert!(!run.contains("${{"), "an expression in run: {run}");
    }
    assert_eq!(action["runs"]["using"], "composite");
    // Every input the script reads arrives as an environment variable.
    let env = steps[0]["env"].as_object().unwrap();
    for input in action["inputs"].as_object().unwrap().keys() {
        assert!(
            env.values()
                .any(|v| v.as_str().unwrap_or_default() == format!("${{{{ inputs.{input} }}}}")),
            "input {input} is not passed through env"
        );
    }
}

#[test]
fn the_image_trusts_a_mounted_repository() {
    // `docker run -v "$PWD:/repo"` mounts a repository owned by another user than the image's
    // 65532; without this, git refuses it and the gate could not read it.
    let dockerfile = read("kind/Dockerfile");
    assert!(dockerfile.contains("git config --system --add safe.directory '*'"));
    assert!(Path::new(&common::project_root().join("action.yml")).exists());
}
