//! `cargo xtask test`: the README's test command and what CI runs.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

use crate::{project_root, real, tools};

/// The tests that need the process cluster (real/), named in the summary when skipped.
const REAL_TESTS: &str = "the real tier (tests/real_observer.rs, tests/real_pipelines.rs, tests/kube_agreement.rs, tests/real_argocd.rs and tests/remote_cache_cloud.rs: the observer, the observer chart's RBAC, the pipelines chart against the real Kargo CRDs, the Kubernetes double and the gate against real Argo CD, on upstream etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and Argo CD built from real/go; the remote render cache on fake-gcs-server built from real/go and on Azurite from npm)";

/// Whether the run includes the real tier: asked for (`--real`, or GITOPS_LOOP_REAL_REQUIRED=1
/// as CI sets it), or the Go toolchain is present.
fn real_tier(asked: bool) -> Result<bool> {
    let go = real_cluster::go_present();
    if asked && !go {
        anyhow::bail!("--real needs the Go toolchain on PATH (`go version` fails)");
    }
    Ok(asked || go)
}

/// The real tier's test binaries: run once more, on the process cluster, as a phase of their
/// own after the rest (without the cluster they skip, saying so).
const REAL_TARGETS: [&str; 5] = [
    "real_observer",
    "real_pipelines",
    "kube_agreement",
    "real_argocd",
    "remote_cache_cloud",
];

/// How long each phase took, printed as it ends and summed at the end: the test command's
/// figure in README counts every phase but the real tier's.
struct Phases {
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn time<T>(&mut self, name: &'static str, phase: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let result = phase();
        let took = started.elapsed();
        println!("test: {name} took {}", seconds(took));
        self.done.push((name, took));
        result
    }

    fn summary(&self) -> String {
        type Phase<'a> = &'a (&'static str, Duration);
        let (real, rest): (Vec<Phase>, Vec<Phase>) =
            self.done.iter().partition(|(n, _)| n.starts_with("real "));
        let list = |phases: &[Phase]| {
            phases
                .iter()
                .map(|(n, d)| format!("{n} {}", seconds(*d)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let total: Duration = rest.iter().map(|(_, d)| *d).sum();
        let mut line = format!(
            "test: {} = {} without the real tier",
            list(&rest),
            seconds(total)
        );
        if !real.is_empty() {
            line.push_str(&format!("; then {}", list(&real)));
        }
        line
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

pub fn run(real_asked: bool, extra: &[String]) -> Result<()> {
    let mut phases = Phases { done: Vec::new() };
    let result = run_phases(&mut phases, real_asked, extra);
    println!("{}", phases.summary());
    result
}

fn run_phases(phases: &mut Phases, real_asked: bool, extra: &[String]) -> Result<()> {
    let real_asked = real_asked || std::env::var("GITOPS_LOOP_REAL_REQUIRED").as_deref() == Ok("1");
    // Asked for without Go fails now, not after the rest has run.
    let mut real = real_tier(real_asked)?;
    let tools = phases.time("tools", || {
        let dir = tools::install()?;
        tools::install_browser()?;
        Ok(dir)
    })?;
    let sh = Shell::new()?;
    sh.change_dir(project_root());
    // Snapshots are checked, never rewritten, here: a difference fails the run.
    let _insta = sh.push_env("INSTA_UPDATE", "no");
    // Renders refuse to run where no network namespace can be made unless opted in. On a
    // machine without user namespaces the suite opts in, and says so: every render test then
    // runs with the scrubbed environment only (the reports' footers say it too), and the
    // tests of the refusal clear the variable themselves.
    let namespaces = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    let _unconfined = (!namespaces).then(|| {
        println!(
            "test: NO NETWORK NAMESPACE here (unshare --user --net fails): the suite renders with GATE_ALLOW_UNCONFINED=1, a scrubbed environment only"
        );
        sh.push_env("GATE_ALLOW_UNCONFINED", "1")
    });
    phases.time("fmt", || Ok(cmd!(sh, "cargo fmt --all -- --check").run()?))?;
    // Clippy lints while the build compiles: the workspace's crates go through clippy-driver
    // (as `cargo clippy` runs them, with `-D warnings`), so the dependencies are compiled
    // once, not checked once for clippy and compiled again for the tests. Every cargo after
    // this one (the tests, the real tier) sees the same wrapper, so none rebuilds.
    match lint_while_building() {
        Some(lint) => {
            for (key, value) in &lint {
                sh.set_var(key, value);
            }
            // Building apart from running makes each figure honest: the test phase is only
            // tests. `--no-run` builds every target `cargo clippy --all-targets` lints (the
            // workspace has no benches or examples).
            phases.time("build and clippy", || {
                cmd!(sh, "cargo test --workspace --no-run --quiet").run()?;
                // Binaries a package without integration tests has (xtask) are built above
                // only as test harnesses: lint them as themselves too, as `--all-targets`
                // does (the others are already built, so this compiles xtask alone).
                Ok(cmd!(sh, "cargo build --workspace --bins --quiet").run()?)
            })?;
        }
        None => {
            println!(
                "test: no clippy-driver beside cargo ({}): clippy runs as a phase of its own",
                std::env::var("CARGO").unwrap_or_default()
            );
            phases.time("clippy", || {
                Ok(cmd!(
                    sh,
                    "cargo clippy --workspace --all-targets --quiet -- -D warnings"
                )
                .run()?)
            })?;
            phases.time("build", || {
                Ok(cmd!(sh, "cargo test --workspace --no-run --quiet").run()?)
            })?;
        }
    }
    // Everything but the real tier, whose tests skip here (they say so) without the cluster.
    phases.time("tests", || {
        let _real = sh.push_env("GITOPS_LOOP_REAL", "0");
        if extra.is_empty() {
            lanes(&sh)
        } else {
            // Arguments of the caller's own (a filter, a target) go to one plain run.
            Ok(cmd!(sh, "cargo test --workspace {extra...}").run()?)
        }
    })?;
    // Why the tier is skipped, said as it is: no Go, or Go but a program that did not build.
    let mut skipped = (!real).then(|| "no Go toolchain on PATH; install Go".to_string());
    if real && let Err(error) = phases.time("real build", real::build) {
        // Go is here but the programs did not build (offline, a proxy refusing, no Debian
        // archive for Redis): without --real that is a skip said plainly, with it a failure.
        if real_asked {
            return Err(error);
        }
        skipped = Some(format!(
            "Go is here, but the real tier's programs did not build: {error:#}"
        ));
        real = false;
    }
    if !real {
        println!(
            "test: SKIPPED ({}; or `cargo xtask test --real` to insist): {REAL_TESTS}",
            skipped.unwrap_or_default()
        );
        return Ok(());
    }
    phases.time("real tier", || {
        // Ctrl-C or SIGTERM reaches `cargo test` too, which ends; the handler keeps this
        // process alive to stop the cluster (its components run in process groups of their
        // own, so the signal does not reach them).
        let _ = ctrlc::set_handler(|| eprintln!("test: interrupted; stopping the process cluster"));
        real::up_with(&tools)?;
        let _real = sh.push_env("GITOPS_LOOP_REAL", "1");
        let targets = REAL_TARGETS.iter().flat_map(|t| ["--test", *t]);
        let result = cmd!(sh, "cargo test {targets...} {extra...}").run();
        // Stop the cluster whatever the tests did; a test failure is the error to report.
        let down = real::down();
        result.map_err(anyhow::Error::from).and(down)
    })?;
    println!("test: ran {REAL_TESTS}");
    Ok(())
}

/// The environment that makes a build lint as `cargo clippy --workspace --all-targets -- -D
/// warnings` does, when the toolchain's clippy-driver sits beside the cargo running this
/// (`$CARGO`): cargo runs the workspace's own crates through `RUSTC_WORKSPACE_WRAPPER`
/// (dependencies stay plain rustc), and clippy-driver reads its arguments from `CLIPPY_ARGS`,
/// separated by `__CLIPPY_HACKERY__` — which is how `cargo clippy` itself drives it.
fn lint_while_building() -> Option<[(&'static str, String); 2]> {
    let cargo = std::path::PathBuf::from(std::env::var_os("CARGO")?);
    let driver = cargo.with_file_name(format!("clippy-driver{}", std::env::consts::EXE_SUFFIX));
    driver.is_file().then(|| {
        [
            (
                "RUSTC_WORKSPACE_WRAPPER",
                driver.to_string_lossy().into_owned(),
            ),
            ("CLIPPY_ARGS", clippy_args(&["-D", "warnings"])),
        ]
    })
}

/// `CLIPPY_ARGS` as cargo-clippy writes it: each argument followed by the separator.
fn clippy_args(args: &[&str]) -> String {
    args.iter()
        .map(|a| format!("{a}__CLIPPY_HACKERY__"))
        .collect()
}

/// The test binaries that run in a lane of their own, one after the other: the recorded
/// stories (each on a ground of its own, about half the suite's wall time), then one more so
/// the two lanes end near together.
const OWN_LANE: [&str; 2] = ["demo", "forge_contract"];

/// Every test target but [`OWN_LANE`]'s, from cargo's own metadata (so a new test file joins
/// the other lane without being listed here).
fn other_test_targets(sh: &Shell) -> Result<Vec<String>> {
    let metadata = cmd!(sh, "cargo metadata --no-deps --format-version 1 --quiet").read()?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)?;
    let targets = test_targets(&metadata);
    for own in OWN_LANE {
        anyhow::ensure!(
            targets.iter().any(|t| t == own),
            "cargo metadata lists no test target `{own}`: the lanes would skip it"
        );
    }
    Ok(targets
        .into_iter()
        .filter(|t| !OWN_LANE.contains(&t.as_str()))
        .collect())
}

/// The built executable of test target `name` (the build phase built it: this only asks).
fn test_executable(sh: &Shell, name: &str) -> Result<std::path::PathBuf> {
    let lines = cmd!(
        sh,
        "cargo test --workspace --test {name} --no-run --quiet --message-format=json"
    )
    .read()?;
    executable_of(&lines, name)
        .with_context(|| format!("cargo named no executable for test target `{name}`"))
}

/// The `executable` of the compiler artifact for test target `name` in cargo's JSON lines.
fn executable_of(lines: &str, name: &str) -> Option<std::path::PathBuf> {
    lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .find_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
}

/// The names of the workspace's integration-test targets, sorted.
fn test_targets(metadata: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Runs the suite in two lanes at once: [`OWN_LANE`]'s binaries (tests/demo.rs first) in one,
/// every other target after the other (one binary at a time, as `cargo test` does). On two
/// cores one binary keeps the machine about three-quarters busy (it waits on helm, git and
/// its doubles); two lanes fill it. The first lane's output is kept in a file and printed
/// whole when both lanes end, so the log reads one binary at a time. Both lanes use the workspace's feature set (`--workspace`),
/// so neither rebuilds what the build phase built.
fn lanes(sh: &Shell) -> Result<()> {
    let others = other_test_targets(sh)?;
    let log_path = project_root().join("target/tmp/test-lane-demo.log");
    std::fs::create_dir_all(log_path.parent().expect("a parent"))?;
    let log = std::fs::File::create(&log_path)?;
    // The binaries themselves, as `cargo test` would run them (from the package's folder), so
    // the lane needs no second cargo beside the first.
    let mut own = Vec::new();
    for name in OWN_LANE {
        let mut command = std::process::Command::new(test_executable(sh, name)?);
        command
            .current_dir(project_root())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?);
        // The Shell's pushed variables (INSTA_UPDATE, GITOPS_LOOP_REAL, GATE_ALLOW_UNCONFINED)
        // are the shell's own: give the child the same.
        for key in ["INSTA_UPDATE", "GITOPS_LOOP_REAL", "GATE_ALLOW_UNCONFINED"] {
            if let Some(value) = sh.var_os(key) {
                command.env(key, value);
            }
        }
        own.push((name, command));
    }
    // The lane runs its binaries one after the other, every one even after a failure (as
    // `cargo test --no-fail-fast` would), and answers each one's status.
    let lane = std::thread::spawn(move || {
        own.into_iter()
            .map(|(name, mut command)| (name, command.status()))
            .collect::<Vec<_>>()
    });
    let targets = others.iter().flat_map(|t| ["--test", t.as_str()]);
    let rest = cmd!(sh, "cargo test --workspace --lib --bins {targets...}")
        .run()
        .and_then(|()| cmd!(sh, "cargo test --workspace --doc").run());
    let statuses = lane
        .join()
        .map_err(|_| anyhow::anyhow!("the lane's thread panicked"))?;
    println!(
        "test: the lane of {}, run beside the others (also kept in {}):",
        OWN_LANE.join(", "),
        log_path.display()
    );
    // Lossy: a test's output may hold any byte, and a failure must still show its log.
    print!("{}", String::from_utf8_lossy(&std::fs::read(&log_path)?));
    rest?;
    for (name, status) in statuses {
        let status = status.with_context(|| format!("cannot run the tests of {name}"))?;
        anyhow::ensure!(
            status.success(),
            "cargo test --test {name} failed ({status}); its output is above"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lanes_take_every_integration_test_target_from_the_metadata() {
        let metadata = serde_json::json!({"packages": [
            {"targets": [
                {"name": "gitops-loop", "kind": ["lib"]},
                {"name": "gate", "kind": ["bin"]},
                {"name": "demo", "kind": ["test"]},
                {"name": "check_cases", "kind": ["test"]},
            ]},
            {"targets": [{"name": "invariants", "kind": ["test"]}, {"name": "bench", "kind": ["bench"]}]},
        ]});
        assert_eq!(
            test_targets(&metadata),
            ["check_cases", "demo", "invariants"]
        );
    }

    #[test]
    fn the_demo_lane_runs_the_executable_cargo_names_for_the_test_target() {
        let lines = [
            r#"{"reason":"compiler-artifact","target":{"name":"demo","kind":["test"]},"executable":"/t/debug/deps/demo-1"}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"gitops-loop","kind":["lib"]},"executable":null}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            executable_of(&lines, "demo"),
            Some(std::path::PathBuf::from("/t/debug/deps/demo-1"))
        );
        assert_eq!(executable_of(&lines, "check_cases"), None);
    }

    #[test]
    fn the_build_lints_with_the_arguments_cargo_clippy_would_pass() {
        assert_eq!(
            clippy_args(&["-D", "warnings"]),
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
        );
    }

    /// The wrapper's environment makes a warning a build failure, as `cargo clippy -- -D
    /// warnings` does (clippy-driver run as cargo runs a workspace wrapper: rustc's path first).
    #[test]
    fn a_build_through_the_wrapper_fails_on_a_clippy_warning() {
        let Some(lint) = lint_while_building() else {
            // The test command lints in a phase of its own there (and says so).
            eprintln!("skipped: no clippy-driver beside $CARGO on this toolchain");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("lib.rs");
        // `needless_return`: a style lint, a warning unless -D warnings.
        std::fs::write(&source, "pub fn one() -> u8 {\n    return 1;\n}\n").unwrap();
        let build = |args: Option<&str>| {
            let mut command = std::process::Command::new(&lint[0].1);
            command
                .args([
                    "rustc",
                    "--edition",
                    "2024",
                    "--crate-type",
                    "lib",
                    "--emit=metadata",
                ])
                .arg("--out-dir")
                .arg(dir.path())
                .arg(&source)
                .env_remove("CLIPPY_ARGS");
            if let Some(args) = args {
                command.env("CLIPPY_ARGS", args);
            }
            command.output().unwrap()
        };
        let warned = build(None);
        assert!(warned.status.success());
        assert!(String::from_utf8_lossy(&warned.stderr).contains("needless_return"));
        let denied = build(Some(&lint[1].1));
        assert!(
            !denied.status.success(),
            "-D warnings through CLIPPY_ARGS fails the build"
        );
        assert!(String::from_utf8_lossy(&denied.stderr).contains("implied by `-D warnings`"));
    }

    #[test]
    fn the_summary_sums_every_phase_but_the_real_tier_and_names_that_apart() {
        let secs = Duration::from_secs;
        let phases = Phases {
            done: vec![
                ("tools", secs(1)),
                ("clippy", secs(60)),
                ("tests", secs(300)),
                ("real build", secs(5)),
                ("real tier", secs(100)),
            ],
        };
        assert_eq!(
            phases.summary(),
            "test: tools 1.0 s, clippy 60.0 s, tests 300.0 s = 361.0 s without the real tier; then real build 5.0 s, real tier 100.0 s"
        );
    }
}
