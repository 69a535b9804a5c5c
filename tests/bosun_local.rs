//! `bosun repair`: the gate and the repair decision on a local checkout, no forge. The real
//! binary on the sample repository with the external-secrets major bump.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::Path;
use std::process::Command;

fn bosun_repair(repo: &Path, work: &Path, extra_config: &str) -> std::process::Output {
    bosun_repair_env(repo, work, extra_config, &[])
}

fn bosun_repair_env(
    repo: &Path,
    work: &Path,
    extra_config: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    bosun_repair_with(
        repo,
        work,
        &common::sample_dir().join("charts"),
        extra_config,
        env,
    )
}

fn bosun_repair_with(
    repo: &Path,
    work: &Path,
    charts: &Path,
    extra_config: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    let config = work.join("bosun.yaml");
    std::fs::write(
        &config,
        format!(
            "forge: {{apiUrl: 'http://127.0.0.1:9'}}\nrepositories: [{{slug: platform/gitops, url: '{}'}}]\ninventory: {{file: '{}'}}\ncharts: {{dir: '{}'}}\nworkdir: '{}'\n{extra_config}",
            common::SAMPLE_REPO_URL,
            common::sample_dir().join("inventory.yaml").display(),
            charts.display(),
            work.join("state").display(),
        ),
    )
    .unwrap();
    let tools = common::project_root().join("target/tools");
    Command::new(env!("CARGO_BIN_EXE_bosun"))
        .arg("--config")
        .arg(&config)
        .args(["repair", "--head", "pr", "--base", "main", "--repo"])
        .arg(repo)
        .env("GATE_HELM", tools.join("helm"))
        .env("GATE_KUBECTL", tools.join("kubectl"))
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The external-secrets bump (the structural case), repaired by a swap whose reshape the
/// model double answers well: the worktree, the writes, the commit and the branch all run.
async fn swap_repair(repo: &common::TestRepo) -> std::process::Output {
    // The same model settings as a triage: here the ground's model double, scripted with the
    // structural scenario's good reshape.
    let script: ground::model::ModelScript = serde_json::from_value(serde_json::json!({
        "provider": "openai",
        "replies": [{"file": "reshape-good.yaml"}, {"file": "reshape-good.yaml"}],
    }))
    .unwrap();
    let double = ground::model::ModelDouble::start(
        &script,
        &common::project_root().join("scenarios/structural"),
        Default::default(),
    )
    .await
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let model = format!(
        "model: {{provider: openai, model: ground-model, baseUrl: '{}', apiKeyEnv: LOCAL_MODEL_KEY}}\n",
        double.base_url("openai")
    );
    let (repo_path, work_path) = (repo.path().to_path_buf(), work.path().to_path_buf());
    let run = move || {
        let (repo_path, work_path, model) = (repo_path.clone(), work_path.clone(), model.clone());
        tokio::task::spawn_blocking(move || {
            bosun_repair_env(
                &repo_path,
                &work_path,
                &model,
                &[("LOCAL_MODEL_KEY", ground::model::MODEL_KEY)],
            )
        })
    };
    let output = run().await.unwrap();
    assert!(double.failures().is_empty(), "{:?}", double.failures());
    output
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_repair_is_a_commit_on_a_branch_of_its_own_and_the_gate_goes_green() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let head = repo.commit_overlay(
        &common::project_root().join("tests/check-cases/es-major-bump/head"),
        "pr",
        "bump external-secrets",
    );
    let output = swap_repair(&repo).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("blocked: 4 dropped-served-version"),
        "{stdout}"
    );
    assert!(stdout.contains("repaired: 8 manifest(s)"), "{stdout}");
    // Which phase it is in, one stderr line each, in order.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let phases: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("bosun: phase: "))
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .map(|l| match l.as_str() {
            "reading the" => "reading",
            "judging pr" => "judging the head",
            "classifying the" => "classifying",
            "judging the" => "judging the repair",
            _ => "other",
        })
        .collect();
    assert_eq!(
        phases,
        [
            "reading",
            "judging the head",
            "classifying",
            "judging the repair"
        ],
        "{stderr}"
    );
    assert!(
        stdout.contains("dropped `spec.target.immutable` = true"),
        "{stdout}"
    );
    assert!(
        stdout.lines().last().unwrap().contains(": passed"),
        "{stdout}"
    );
    // The branch holds the repair; the user's checkout is where it was, untouched.
    let branch = format!("bosun/repair-{}", &head[..12]);
    let diff = git(repo.path(), &["diff", "--stat", "pr", &branch]);
    assert!(
        diff.contains("8 files changed") || diff.contains("files changed"),
        "{diff}"
    );
    assert_eq!(repo.head(), head);
    assert_eq!(git(repo.path(), &["status", "--porcelain"]), "");
    assert_eq!(
        git(repo.path(), &["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        1
    );
}

#[test]
fn a_local_repair_that_would_lose_a_value_without_a_model_commits_nothing() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    // The structural case: the sample's database-credentials.yaml sets a field v1 prunes.
    repo.commit_overlay(
        &common::project_root().join("tests/check-cases/es-major-bump/head"),
        "pr",
        "bump external-secrets",
    );
    let work = tempfile::tempdir().unwrap();
    let output = bosun_repair(repo.path(), work.path(), "");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("over to you"), "{stdout}");
    assert!(
        stdout.contains("a reshape needs a model, which is not configured"),
        "{stdout}"
    );
    assert!(git(repo.path(), &["branch", "--list", "bosun/*"]).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_values_migration_is_a_commit_that_edits_only_the_keys_and_the_gate_goes_green() {
    let root = common::project_root();
    let story = root.join("scenarios/values-migration");
    // The story's repository and charts: the commented values on main, the bump on pr.
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(&story.join("repo-overlay"), "main", "comment the values");
    let bump = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(bump.path().join("targets")).unwrap();
    std::fs::write(
        bump.path().join("targets/addons.yaml"),
        std::fs::read_to_string(common::sample_dir().join("repo/targets/addons.yaml"))
            .unwrap()
            .replace("version: 1.19.2", "version: 1.20.0"),
    )
    .unwrap();
    let head = repo.commit_overlay(bump.path(), "pr", "bump cert-manager-lite");
    let charts = tempfile::tempdir().unwrap();
    common::copy_tree(&common::sample_dir().join("charts"), charts.path());
    common::copy_tree(&story.join("charts"), charts.path());
    let script: ground::model::ModelScript = serde_json::from_value(serde_json::json!({
        "provider": "openai",
        "replies": [{"file": "migration-good.yaml"}],
    }))
    .unwrap();
    let double = ground::model::ModelDouble::start(&script, &story, Default::default())
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let model = format!(
        "model: {{provider: openai, model: ground-model, baseUrl: '{}', apiKeyEnv: LOCAL_MODEL_KEY}}\n",
        double.base_url("openai")
    );
    let (repo_path, work_path, charts_path) = (
        repo.path().to_path_buf(),
        work.path().to_path_buf(),
        charts.path().to_path_buf(),
    );
    let output = tokio::task::spawn_blocking(move || {
        bosun_repair_with(
            &repo_path,
            &work_path,
            &charts_path,
            &model,
            &[("LOCAL_MODEL_KEY", ground::model::MODEL_KEY)],
        )
    })
    .await
    .unwrap();
    assert!(double.failures().is_empty(), "{:?}", double.failures());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("could not decide"), "{stdout}");
    assert!(
        stdout.contains("moved `crds.enabled` = true to `crds.install`"),
        "{stdout}"
    );
    assert!(
        stdout.lines().last().unwrap().contains(": passed"),
        "{stdout}"
    );
    let branch = format!("bosun/repair-{}", &head[..12]);
    let diff = git(repo.path(), &["diff", "pr", &branch]);
    let changed: Vec<&str> = diff
        .lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
        })
        .collect();
    assert_eq!(
        changed,
        ["-  enabled: true", "+  install: true", "-  keep: true"],
        "{diff}"
    );
    assert_eq!(repo.head(), head);
}

/// A repository received as it is: its `.git/config`, hooks and the head's `.gitattributes`
/// name programs that write a canary when run. Returns the canaries' folder.
fn make_hostile(repo: &Path, canaries: &Path) {
    let bin = canaries.parent().unwrap().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(canaries).unwrap();
    let program = |role: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = bin.join(role);
        // Filters pass their input through; every program leaves its mark first.
        std::fs::write(
            &path,
            format!("#!/bin/sh\ntouch '{}/{role}'\ncase '{role}' in filter-clean|filter-smudge|worktree-*) exec cat;; esac\nexit 0\n", canaries.display()),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    };
    // The head selects the drivers: `.md` the long-running filter process, `.yaml` a filter
    // only a worktree's configuration defines, everything else clean/smudge, diff and merge.
    std::fs::write(
        repo.join(".gitattributes"),
        "* filter=canary diff=canary merge=canary\n*.md filter=canaryprocess\n*.yaml filter=worktree\n",
    )
    .unwrap();
    git(repo, &["add", ".gitattributes"]);
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
        .args(["commit", "-q", "-m", "attributes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let worktree_config = canaries.parent().unwrap().join("worktree.gitconfig");
    std::fs::write(
        &worktree_config,
        format!(
            "[filter \"worktree\"]\n\tclean = {}\n\tsmudge = {}\n\trequired = true\n",
            program("worktree-clean"),
            program("worktree-smudge")
        ),
    )
    .unwrap();
    let config = format!(
        r#"[core]
	fsmonitor = {fsmonitor}
	pager = {pager}
	editor = {editor}
	sshCommand = {ssh}
	alternateRefsCommand = {alternates}
[filter "canary"]
	clean = {clean}
	smudge = {smudge}
	required = true
[filter "canaryprocess"]
	process = {process}
	required = true
[diff]
	external = {external}
[diff "canary"]
	command = {diff_command}
	textconv = {textconv}
[merge "canary"]
	driver = {merge}
[credential]
	helper = {credential}
[commit]
	gpgSign = true
[gpg]
	program = {gpg}
[gc]
	auto = 1
[protocol]
	allow = always
[includeIf "gitdir:**/worktrees/**"]
	path = {worktree_config}
"#,
        fsmonitor = program("fsmonitor"),
        pager = program("pager"),
        editor = program("editor"),
        ssh = program("ssh"),
        alternates = program("alternate-refs"),
        clean = program("filter-clean"),
        smudge = program("filter-smudge"),
        process = program("filter-process"),
        external = program("diff-external"),
        diff_command = program("diff-command"),
        textconv = program("diff-textconv"),
        merge = program("merge-driver"),
        credential = program("credential-helper"),
        gpg = program("gpg"),
        worktree_config = worktree_config.display(),
    );
    let mut existing = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    existing.push_str(&config);
    std::fs::write(repo.join(".git/config"), existing).unwrap();
    for hook in [
        "reference-transaction",
        "post-checkout",
        "pre-commit",
        "prepare-commit-msg",
        "commit-msg",
        "post-commit",
        "post-index-change",
        "pre-auto-gc",
    ] {
        let path = program(&format!("hook-{hook}"));
        std::fs::copy(&path, repo.join(".git/hooks").join(hook)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_repair_runs_nothing_a_received_repository_names() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(
        &common::project_root().join("tests/check-cases/es-major-bump/head"),
        "pr",
        "bump external-secrets",
    );
    let marks = tempfile::tempdir().unwrap();
    let canaries = marks.path().join("canaries");
    make_hostile(repo.path(), &canaries);
    let output = swap_repair(&repo).await;
    // Read before anything else runs git in the repository (the test's own git would run
    // them).
    let ran: Vec<String> = std::fs::read_dir(&canaries)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        ran.is_empty(),
        "bosun repair ran {ran:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // And the repair happened: the worktree, the writes, the commit and the branch ran.
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("repaired: 8 manifest(s)"), "{stdout}");
    // Which phase it is in, one stderr line each, in order.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let phases: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("bosun: phase: "))
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .map(|l| match l.as_str() {
            "reading the" => "reading",
            "judging pr" => "judging the head",
            "classifying the" => "classifying",
            "judging the" => "judging the repair",
            _ => "other",
        })
        .collect();
    assert_eq!(
        phases,
        [
            "reading",
            "judging the head",
            "classifying",
            "judging the repair"
        ],
        "{stderr}"
    );
}
