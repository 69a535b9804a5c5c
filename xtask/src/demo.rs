//! `cargo xtask demo`: play a recorded scenario on the embedded ground with the real binaries.

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{project_root, tools};

/// Builds the binaries, then plays `scenarios/<name>` with the `ground` player.
pub fn play(scenario: &str, chaos_seed: Option<u64>) -> Result<()> {
    let tools = tools::install()?;
    let root = project_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    cmd!(sh, "cargo build --quiet --bins --workspace").run()?;
    let ground = root.join("target/debug/ground");
    let gate = root.join("target/debug/gate");
    let observer = root.join("target/debug/observer");
    let scenario_dir = root.join("scenarios").join(scenario);
    let crds = root.join("kind/crds");
    let seed: Vec<String> = chaos_seed
        .map(|s| vec!["--chaos-seed".to_string(), s.to_string()])
        .unwrap_or_default();
    cmd!(
        sh,
        "{ground} play {scenario_dir} --gate {gate} --observer {observer} --tools {tools} --crds {crds} {seed...}"
    )
    .quiet()
    .run()?;
    Ok(())
}

/// Starts the ground with a scenario loaded and keeps it up.
pub fn up(scenario: &str) -> Result<()> {
    let tools = tools::install()?;
    let root = project_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    cmd!(sh, "cargo build --quiet --bins --workspace").run()?;
    let ground = root.join("target/debug/ground");
    let gate = root.join("target/debug/gate");
    let observer = root.join("target/debug/observer");
    let scenario_dir = root.join("scenarios").join(scenario);
    let crds = root.join("kind/crds");
    cmd!(
        sh,
        "{ground} up {scenario_dir} --gate {gate} --observer {observer} --tools {tools} --crds {crds}"
    )
    .quiet()
    .run()?;
    Ok(())
}
