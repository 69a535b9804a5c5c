//! `cargo xtask demo` and `cargo xtask ground up`: the ground binary with the real product
//! binaries, on a recorded scenario.

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{project_root, tools};

/// The tools installed and the binaries built: a shell at the project root, and the argv that
/// runs `ground <verb> scenarios/<name>` with them (the caller adds its own arguments).
fn prepared() -> Result<(Shell, impl Fn(&str, &str) -> Vec<String>)> {
    let tools = tools::install()?;
    let root = project_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    cmd!(sh, "cargo build --quiet --bins --workspace").run()?;
    let path = move |p: &str| root.join(p).display().to_string();
    let tools = tools.display().to_string();
    let argv = move |verb: &str, scenario: &str| {
        vec![
            path("target/debug/ground"),
            verb.to_string(),
            path(&format!("scenarios/{scenario}")),
            "--gate".into(),
            path("target/debug/gate"),
            "--observer".into(),
            path("target/debug/observer"),
            "--bosun".into(),
            path("target/debug/bosun"),
            "--tools".into(),
            tools.clone(),
            "--crds".into(),
            path("kind/crds"),
        ]
    };
    Ok((sh, argv))
}

/// Builds the binaries, then runs `ground <verb> scenarios/<name>` with them.
fn ground(verb: &str, scenario: &str, extra: &[String]) -> Result<()> {
    let (sh, argv) = prepared()?;
    let argv = argv(verb, scenario);
    let (program, args) = argv.split_first().expect("a program");
    cmd!(sh, "{program} {args...} {extra...}").quiet().run()?;
    Ok(())
}

/// Plays `scenarios/<name>` on the ground and checks its expectations.
pub fn play(scenario: &str, chaos_seed: Option<u64>) -> Result<()> {
    let seed: Vec<String> = chaos_seed
        .map(|s| vec!["--chaos-seed".to_string(), s.to_string()])
        .unwrap_or_default();
    ground("play", scenario, &seed)
}

/// Plays `scenarios/<name>` on one face of the forge double (`github`, `gitlab`).
pub fn play_on(scenario: &str, forge: &str) -> Result<()> {
    ground(
        "play",
        scenario,
        &["--forge".to_string(), forge.to_string()],
    )
}

/// Starts the ground with a scenario loaded and keeps it up.
pub fn up(scenario: &str) -> Result<()> {
    ground("up", scenario, &[])
}

/// The first seed of today's window of `seeds` seeds: windows follow one another day by day
/// from seed 1000 (past the ranges tuned by hand), wrapping after a million seeds. Printed
/// with the command that replays it.
pub fn daily_window(seeds: u64, scenarios: &[String]) -> u64 {
    let day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0);
    let seeds = seeds.max(1);
    let from = 1000 + (day * seeds) % 1_000_000;
    let names: Vec<String> = scenarios
        .iter()
        .map(|s| format!("--scenario {s}"))
        .collect();
    println!(
        "chaos: today's window (UTC day {day}): seeds {from}..={}; replay with `cargo xtask ground chaos --seeds {seeds} --from {from} {}`",
        from + seeds - 1,
        names.join(" ")
    );
    from
}

/// `cargo xtask ground chaos`: plays each scenario under the fault schedules of seeds
/// `from..from+seeds` (409s, 410 relists, dropped, duplicated and closed watches, 5xx and
/// throttling from the API double; the forge's 5xx and rate limits; model calls held past
/// Bosun's timeout; the observer and Bosun killed and started again) and reports the seeds
/// that failed. Every tick checks the
/// ground's invariants; a failing seed prints the tick, the violation and the transcript tail,
/// and `cargo xtask demo --scenario NAME --chaos-seed SEED` replays it.
pub fn chaos(scenarios: &[String], seeds: u64, from: u64) -> Result<()> {
    let (sh, argv) = prepared()?;
    let mut failed = Vec::new();
    for scenario in scenarios {
        let play = argv("play", scenario);
        let (program, args) = play.split_first().expect("a program");
        for seed in from..from + seeds {
            let seed = seed.to_string();
            let output = cmd!(sh, "{program} {args...} --chaos-seed {seed}")
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
