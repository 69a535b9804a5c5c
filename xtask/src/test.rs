//! `cargo xtask test`: the README's test command and what CI runs.

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

pub fn run(real_asked: bool, extra: &[String]) -> Result<()> {
    let real_asked = real_asked || std::env::var("GITOPS_LOOP_REAL_REQUIRED").as_deref() == Ok("1");
    let tools = tools::install()?;
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
    cmd!(sh, "cargo fmt --all -- --check").run()?;
    cmd!(
        sh,
        "cargo clippy --workspace --all-targets --quiet -- -D warnings"
    )
    .run()?;
    let mut real = real_tier(real_asked)?;
    if real && let Err(error) = real::build() {
        // Go is here but the programs did not build (offline, a proxy refusing): without
        // --real that is a skip said plainly, with it a failure.
        if real_asked {
            return Err(error);
        }
        println!("test: the real tier's programs did not build ({error:#}); skipping it");
        real = false;
    }
    let result = if real {
        // Ctrl-C or SIGTERM reaches `cargo test` too, which ends; the handler keeps this
        // process alive to stop the cluster (its components run in process groups of their
        // own, so the signal does not reach them).
        let _ = ctrlc::set_handler(|| eprintln!("test: interrupted; stopping the process cluster"));
        real::up_with(&tools)?;
        let _real = sh.push_env("GITOPS_LOOP_REAL", "1");
        let result = cmd!(sh, "cargo test --workspace {extra...}").run();
        // Stop the cluster whatever the tests did; a test failure is the error to report.
        let down = real::down();
        result.map_err(anyhow::Error::from).and(down)
    } else {
        let _real = sh.push_env("GITOPS_LOOP_REAL", "0");
        cmd!(sh, "cargo test --workspace {extra...}")
            .run()
            .map_err(anyhow::Error::from)
    };
    result?;
    if real {
        println!("test: ran {REAL_TESTS}");
    } else {
        println!(
            "test: SKIPPED (no Go toolchain on PATH; install Go, or `cargo xtask test --real` to insist): {REAL_TESTS}"
        );
    }
    Ok(())
}
