//! `cargo xtask test`: the README's test command and what CI runs.

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{project_root, tools};

pub fn run(extra: &[String]) -> Result<()> {
    tools::install()?;
    let sh = Shell::new()?;
    sh.change_dir(project_root());
    // Snapshots are checked, never rewritten, here: a difference fails the run.
    let _insta = sh.push_env("INSTA_UPDATE", "no");
    cmd!(sh, "cargo fmt --all -- --check").run()?;
    cmd!(
        sh,
        "cargo clippy --workspace --all-targets --quiet -- -D warnings"
    )
    .run()?;
    cmd!(sh, "cargo test --workspace {extra...}").run()?;
    Ok(())
}
