//! `cargo xtask test`: the README's test command and what CI runs.

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{project_root, tools};

/// The tests that need Docker, named in the summary when they are skipped.
const DOCKER_TESTS: &str = "tests/docker_k3s.rs (the observer against k3s: one Promotion on drift, leader election, an API server restart, the live inventory from real Secrets)";

pub fn run(docker: bool, extra: &[String]) -> Result<()> {
    tools::install()?;
    let sh = Shell::new()?;
    sh.change_dir(project_root());
    // Snapshots are checked, never rewritten, here: a difference fails the run.
    let _insta = sh.push_env("INSTA_UPDATE", "no");
    let docker = docker || std::env::var("GITOPS_LOOP_DOCKER").as_deref() == Ok("1");
    let _docker = sh.push_env("GITOPS_LOOP_DOCKER", if docker { "1" } else { "0" });
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
    cmd!(sh, "cargo test --workspace {extra...}").run()?;
    if docker {
        println!("test: ran the Docker tests: {DOCKER_TESTS}");
    } else {
        println!(
            "test: SKIPPED (no Docker asked for; `cargo xtask test --docker` or GITOPS_LOOP_DOCKER=1 runs them): {DOCKER_TESTS}"
        );
    }
    Ok(())
}
