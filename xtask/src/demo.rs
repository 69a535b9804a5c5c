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

/// `cargo xtask ground chaos`: plays each scenario under the fault schedules of seeds
/// `from..from+seeds` (409s, 410 relists, dropped, duplicated and closed watches, 5xx and
/// throttling from the API double) and reports the seeds that failed. Every tick checks the
/// ground's invariants; a failing seed prints the tick, the violation and the transcript tail,
/// and `cargo xtask demo --scenario NAME --chaos-seed SEED` replays it.
pub fn chaos(scenarios: &[String], seeds: u64, from: u64) -> Result<()> {
    let tools = tools::install()?;
    let root = project_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    cmd!(sh, "cargo build --quiet --bins --workspace").run()?;
    let ground = root.join("target/debug/ground");
    let gate = root.join("target/debug/gate");
    let observer = root.join("target/debug/observer");
    let bosun = root.join("target/debug/bosun");
    let crds = root.join("kind/crds");
    let mut failed = Vec::new();
    for scenario in scenarios {
        let scenario_dir = root.join("scenarios").join(scenario);
        for seed in from..from + seeds {
            let seed = seed.to_string();
            let output = cmd!(sh, "{ground} play {scenario_dir} --gate {gate} --observer {observer} --bosun {bosun} --tools {tools} --crds {crds} --chaos-seed {seed}")
                .quiet()
                .ignore_status()
                .output()?;
            if output.status.success() {
                println!("chaos: {scenario} seed {seed}: expectations and invariants hold");
            } else {
                let stderr = String::from_utf8_lossy(&output.stderr);
                println!(
                    "chaos: {scenario} seed {seed}: FAILED\n{}",
                    stderr.trim_end()
                );
                failed.push(format!("{scenario} --chaos-seed {seed}"));
            }
        }
    }
    if failed.is_empty() {
        println!(
            "chaos: {} runs, every one held",
            scenarios.len() as u64 * seeds
        );
        Ok(())
    } else {
        anyhow::bail!(
            "chaos: {} of {} runs failed; replay with `cargo xtask demo --scenario NAME --chaos-seed SEED`:\n  {}",
            failed.len(),
            scenarios.len() as u64 * seeds,
            failed.join("\n  ")
        )
    }
}
