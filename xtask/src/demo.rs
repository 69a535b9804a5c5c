//! `cargo xtask demo` and `cargo xtask ground up`: the ground binary with the real product
//! binaries, on a recorded scenario.

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{project_root, tools};

/// Builds the binaries, then runs `ground <verb> scenarios/<name>` with them.
fn ground(verb: &str, scenario: &str, extra: &[String]) -> Result<()> {
    let tools = tools::install()?;
    let root = project_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    cmd!(sh, "cargo build --quiet --bins --workspace").run()?;
    let ground = root.join("target/debug/ground");
    let gate = root.join("target/debug/gate");
    let observer = root.join("target/debug/observer");
    let bosun = root.join("target/debug/bosun");
    let scenario_dir = root.join("scenarios").join(scenario);
    let crds = root.join("kind/crds");
    cmd!(sh, "{ground} {verb} {scenario_dir} --gate {gate} --observer {observer} --bosun {bosun} --tools {tools} --crds {crds} {extra...}")
        .quiet()
        .run()?;
    Ok(())
}

/// Plays `scenarios/<name>` on the ground and checks its expectations.
pub fn play(scenario: &str, chaos_seed: Option<u64>) -> Result<()> {
    let seed: Vec<String> = chaos_seed
        .map(|s| vec!["--chaos-seed".to_string(), s.to_string()])
        .unwrap_or_default();
    ground("play", scenario, &seed)
}

/// Starts the ground with a scenario loaded and keeps it up.
pub fn up(scenario: &str) -> Result<()> {
    ground("up", scenario, &[])
}
