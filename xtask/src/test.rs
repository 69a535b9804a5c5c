//! `cargo xtask test`: the README's test command and what CI runs.

use std::time::{Duration, Instant};

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{project_root, real, tools};

/// The tests that need the process cluster (real/), named in the summary when skipped.
const REAL_TESTS: &str = "the real tier (tests/real_observer.rs, tests/real_pipelines.rs, tests/kube_agreement.rs and tests/real_argocd.rs: the observer, the observer chart's RBAC, the pipelines chart against the real Kargo CRDs, the Kubernetes double and the gate against real Argo CD, on upstream etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and Argo CD built from real/go)";

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
const REAL_TARGETS: [&str; 4] = [
    "real_observer",
    "real_pipelines",
    "kube_agreement",
    "real_argocd",
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
    phases.time("clippy", || {
        Ok(cmd!(
            sh,
            "cargo clippy --workspace --all-targets --quiet -- -D warnings"
        )
        .run()?)
    })?;
    // Building apart from running makes each figure honest: the test phase is only tests.
    phases.time("build", || {
        Ok(cmd!(sh, "cargo test --workspace --no-run --quiet").run()?)
    })?;
    // Everything but the real tier, whose tests skip here (they say so) without the cluster.
    phases.time("tests", || {
        let _real = sh.push_env("GITOPS_LOOP_REAL", "0");
        Ok(cmd!(sh, "cargo test --workspace {extra...}").run()?)
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

#[cfg(test)]
mod tests {
    use super::*;

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
