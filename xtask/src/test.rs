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
