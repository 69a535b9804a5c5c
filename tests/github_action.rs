//! The gate's GitHub Action (action.yml) and the copy-paste workflow in docs/examples, linted
//! with actionlint (installed by `cargo xtask tools`): the workflow is checked against the
//! action's own inputs, and the action never pastes an expression into its script.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

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
    // No release publishes an image: by default the action builds the gate from its own ref.
    assert_eq!(action["inputs"]["image"]["default"], "");
    let build = steps
        .iter()
        .find(|s| s["if"] == "inputs.image == ''")
        .expect("a step that builds the image when none is named");
    let script = build["run"].as_str().unwrap();
    assert!(
        script.contains("GITHUB_ACTION_PATH")
            && script.contains("docker build --file kind/Dockerfile --target gate"),
        "{script}"
    );
    // Every input the script reads arrives as an environment variable.
    let publish = steps.iter().find(|s| s["name"] == "gate publish").unwrap();
    let env = publish["env"].as_object().unwrap();
    for input in action["inputs"].as_object().unwrap().keys() {
        assert!(
            env.values()
                .any(|v| v.as_str().unwrap_or_default() == format!("${{{{ inputs.{input} }}}}")),
            "input {input} is not passed through env"
        );
    }
}

/// The HTML report is uploaded as a workflow artifact from where `gate publish` wrote it,
/// also when the gate is red, and the comment links to the run that holds it.
#[test]
fn the_action_uploads_the_html_report_and_links_the_run() {
    let action: serde_json::Value = serde_saphyr::from_str(&read("action.yml")).unwrap();
    let steps = action["runs"]["steps"].as_array().unwrap();
    let publish = steps
        .iter()
        .position(|s| s["name"] == "gate publish")
        .unwrap();
    let upload = steps
        .iter()
        .position(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("actions/upload-artifact@"))
        })
        .expect("an upload-artifact step");
    assert!(upload > publish, "the upload runs after the gate");
    let upload = &steps[upload];
    assert!(
        upload["if"].as_str().unwrap().starts_with("always()"),
        "uploaded when the gate is red too"
    );
    assert_eq!(
        upload["with"]["path"],
        "${{ runner.temp }}/addons-gate/html/addons-gate.html"
    );
    let script = steps[publish]["run"].as_str().unwrap();
    assert!(
        script.contains(
            r#"publish_html=(--html /trusted/html/addons-gate.html --html-url "$GATE_RUN_URL")"#
        ),
        "{script}"
    );
    assert_eq!(
        steps[publish]["env"]["GATE_RUN_URL"],
        "${{ github.server_url }}/${{ github.repository }}/actions/runs/${{ github.run_id }}"
    );
}

#[test]
fn the_action_judges_by_the_merge_bases_inventory_and_mirror() {
    // A pull request must not choose what it is judged by: the inventory and the chart mirror
    // the gate reads come from the merge base (git show / git archive), mounted apart from
    // the checkout, and charts are pulled for the merge base and the pull request's head.
    let action = read("action.yml");
    assert!(action.contains(r#"git show "$merge_base:$GATE_INVENTORY""#));
    assert!(action.contains(r#"GIT_INDEX_FILE="$trusted/index" git read-tree "$merge_base""#));
    assert!(
        !action.contains("git archive \"$merge_base\""),
        "export-ignore must not drop mirrored files"
    );
    assert!(action.contains(r#"--charts "/trusted/mirror/$GATE_CHARTS""#));
    assert!(action.contains(r#"--revision "$merge_base""#));
    assert!(action.contains(r#"--revision "$GATE_HEAD""#));
    assert!(!action.contains("--inventory \"/repo/"));
    assert!(!action.contains("--charts \"/repo/"));
}

/// The action refuses every event but `pull_request`, in its first step, before anything
/// reads the pull request: `pull_request_target` (and `workflow_run`, `issue_comment`...) run
/// with the base repository's write token and secrets, so a pull request's files would be
/// rendered by a privileged job.
#[test]
fn the_action_refuses_pull_request_target_in_its_first_step() {
    let action: serde_json::Value = serde_saphyr::from_str(&read("action.yml")).unwrap();
    let first = &action["runs"]["steps"][0];
    assert_eq!(first["name"], "refuse untrusted events", "{first}");
    assert!(
        first.get("env").is_none(),
        "the refusal holds no token: {first}"
    );
    let script = first["run"].as_str().unwrap();
    let run = |event: Option<&str>| {
        let mut command = std::process::Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .env_remove("GITHUB_EVENT_NAME");
        if let Some(event) = event {
            command.env("GITHUB_EVENT_NAME", event);
        }
        let output = command.output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    for event in [
        Some("pull_request_target"),
        Some("workflow_run"),
        Some("issue_comment"),
        Some("push"),
        None,
    ] {
        let (code, stderr) = run(event);
        assert_eq!(code, Some(2), "{event:?}: {stderr}");
        assert!(
            stderr.contains("addons-gate refuses to run on")
                && stderr.contains("only on pull_request"),
            "{event:?}: {stderr}"
        );
    }
    assert!(
        run(Some("pull_request_target"))
            .1
            .contains("refuses to run on pull_request_target")
    );
    assert_eq!(run(Some("pull_request")), (Some(0), String::new()));
}

/// Runs action.yml's script as GitHub would on pull request #1 of `forge`, with `docker`
/// standing for a shim that runs this build's gate with the container paths mapped to the
/// host's. Returns the script's exit code, its output, and the HTML page it left where the
/// upload step takes it (when it wrote one).
fn run_action_script(
    forge: &ground::forge::ForgeDouble,
    workspace: &std::path::Path,
    base: &str,
    head: &str,
    inputs: &[(&str, &str)],
) -> (Option<i32>, String, Option<String>) {
    let action: serde_json::Value = serde_saphyr::from_str(&read("action.yml")).unwrap();
    let step = action["runs"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "gate publish")
        .unwrap();
    let script = step["run"].as_str().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let shim = bin.path().join("docker");
    std::fs::write(
        &shim,
        r#"#!/bin/bash
# docker run --rm --user U --env X ... --volume HOST:/repo --volume HOST:/trusted IMAGE ARGS...
shift
repo= trusted=
while [ $# -gt 0 ]; do
  case "$1" in
    --rm) shift ;;
    --user|--env|--security-opt) shift 2 ;;
    --volume) case "$2" in *:/repo) repo="${2%:/repo}" ;; *:/trusted) trusted="${2%:/trusted}" ;; esac; shift 2 ;;
    *) break ;;
  esac
done
shift
args=()
for a in "$@"; do a="${a//\/trusted/$trusted}"; a="${a//\/repo/$repo}"; args+=("$a"); done
exec "$GATE_BIN" "${args[@]}"
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runner_temp = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.path().display(),
                std::env::var("PATH").unwrap()
            ),
        )
        .env("GATE_BIN", env!("CARGO_BIN_EXE_gate"))
        .env("GITHUB_WORKSPACE", workspace)
        .env("RUNNER_TEMP", runner_temp.path())
        .env("GITHUB_REPOSITORY", "platform/gitops")
        .env("GITHUB_API_URL", forge.url())
        .env("GATE_IMAGE", "gitops-loop/gate")
        .env("GATE_PR", "1")
        .env("GATE_BASE", base)
        .env("GATE_HEAD", head)
        .env("GATE_PULL_CHARTS", "false")
        .env("GATE_CHECK_MODE", "check-run")
        .env("GATE_CHART_REPO_MIRRORS", "")
        .env("GATE_INVENTORY", "")
        .env("GATE_INVENTORY_ARGOCD", "")
        .env("GITHUB_TOKEN", "gate-token")
        .env("GATE_CACHE_DIR", runner_temp.path().join("cache"))
        .env("GATE_HTML_REPORT", "true")
        .env(
            "GATE_RUN_URL",
            "https://github.com/platform/gitops/actions/runs/7",
        );
    for (key, value) in inputs {
        command.env(key, value);
    }
    let output = command.output().unwrap();
    // The path the upload step's `with: path` names.
    let page =
        std::fs::read_to_string(runner_temp.path().join("addons-gate/html/addons-gate.html")).ok();
    (
        output.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        page,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_that_edits_the_inventory_and_the_mirror_is_judged_by_the_merge_base() {
    // The attack: the pull request bumps external-secrets across a major version (the gate
    // blocks it) and, in the same commit, empties the inventory's fleet and drops the chart
    // from the mirror the repository keeps, hoping for a green check.
    gitops_loop::forge::github::install_crypto_provider();
    let git = |dir: &std::path::Path, args: &[&str]| ground::git::git(dir, args).unwrap();
    let seed = tempfile::tempdir().unwrap();
    common::copy_tree(&common::sample_dir().join("repo"), seed.path());
    std::fs::create_dir_all(seed.path().join("clusters")).unwrap();
    std::fs::copy(
        common::sample_dir().join("inventory.yaml"),
        seed.path().join("clusters/inventory.yaml"),
    )
    .unwrap();
    common::copy_tree(
        &common::sample_dir().join("charts"),
        &seed.path().join(".gate/charts"),
    );
    let forge = ground::forge::ForgeDouble::start(None).await.unwrap();
    forge.add_user("gate-token", "addons-gate[bot]");
    forge.add_user("kargo-token", "kargo");
    let url = forge.create_repo("platform/gitops", seed.path()).unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    git(ws, &["clone", "--quiet", &url, "."]);
    let base = git(ws, &["rev-parse", "HEAD"]);
    git(ws, &["checkout", "--quiet", "-b", "kargo/bump"]);
    let targets = ws.join("targets/addons.yaml");
    let text = std::fs::read_to_string(&targets)
        .unwrap()
        .replace("version: 0.10.3", "version: 2.10.0");
    std::fs::write(&targets, text).unwrap();
    std::fs::write(ws.join("clusters/inventory.yaml"), "clusters: []\n").unwrap();
    std::fs::remove_dir_all(ws.join(".gate/charts")).unwrap();
    git(ws, &["add", "--all"]);
    git(
        ws,
        &[
            "-c",
            "user.name=x",
            "-c",
            "user.email=x@example.test",
            "commit",
            "--quiet",
            "-m",
            "bump",
        ],
    );
    git(ws, &["push", "--quiet", "origin", "kargo/bump"]);
    let head = git(ws, &["rev-parse", "HEAD"]);
    let created = reqwest::Client::new()
        .post(format!("{}/repos/platform/gitops/pulls", forge.url()))
        .bearer_auth("kargo-token")
        .json(&serde_json::json!({"title": "bump", "head": "kargo/bump", "base": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    // Applications write the repository's public URL, as on GitHub.
    git(
        ws,
        &["remote", "set-url", "origin", common::SAMPLE_REPO_URL],
    );

    let inputs = [
        ("GATE_INVENTORY", "clusters/inventory.yaml"),
        ("GATE_CHARTS", ".gate/charts"),
    ];
    let (code, said, page) = run_action_script(&forge, ws, &base, &head, &inputs);
    assert_eq!(code, Some(1), "blocked, not green: {said}");
    // The HTML report is where the upload step takes it from, blocked too.
    let page = page.expect("the action wrote the HTML report");
    assert!(page.contains("addons-gate: blocked</h1>"), "{page}");
    let slug: gitops_loop::forge::RepoSlug = "platform/gitops".parse().unwrap();
    let client = gitops_loop::forge::github::GitHub::new(&forge.url(), "gate-token").unwrap();
    use gitops_loop::forge::Forge as _;
    let runs = client.check_runs(&slug, &head).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].conclusion, gitops_loop::forge::Conclusion::Failure);

    // A re-run for a head the pull request has moved past publishes nothing.
    let (code, said, _) = run_action_script(&forge, ws, &base, &base, &inputs);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("nothing published"), "{said}");
    assert_eq!(client.check_runs(&slug, &base).await.unwrap().len(), 0);

    // Neither inventory input, or both: refused before anything runs.
    let (code, said, _) =
        run_action_script(&forge, ws, &base, &head, &[("GATE_CHARTS", ".gate/charts")]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("exactly one"), "{said}");
}
