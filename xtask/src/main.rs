//! `cargo xtask`: the project's automation (tools, tests, benchmarks, demos).

mod bench;
mod demo;
mod kind;
mod real;
mod test;
mod tools;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the pinned helm and kubectl into target/tools (a no-op when present).
    Tools,
    /// Install tools if missing, then fmt check, clippy and every test of the workspace.
    Test {
        /// Insist on the real tier (the process cluster of real/, built from the pinned Go
        /// modules): fail when Go is missing. Without it the tier runs whenever Go is present.
        #[arg(long)]
        real: bool,
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        args: Vec<String>,
    },
    /// Play the loop end to end on the embedded ground: a chart bump's happy path, the observer
    /// catching Kargo up after a hand bump, and Bosun repairing a blocked major bump.
    Demo {
        /// The scenario folder under scenarios/ (default: happy-path, observer-drift, triage).
        #[arg(long)]
        scenario: Option<String>,
        /// Inject seeded faults into the Kubernetes API double.
        #[arg(long)]
        chaos_seed: Option<u64>,
    },
    /// A pull request the gate refuses and Bosun repairs: the external-secrets major bump,
    /// held by policy, blocked on dropped served versions, swapped, green, merged, synced.
    DemoTriage {
        /// The forge double's face Kargo, Bosun and people speak (`gitlab`: merge requests
        /// through `/api/v4`, Kargo's GitLab provider, Bosun on `forge.kind: gitlab`).
        #[arg(long, value_parser = ["github", "gitlab"])]
        forge: Option<String>,
    },
    /// A pull request the swap alone cannot fix: the destination schema would prune a field;
    /// Bosun asks the (scripted) model for that document, its harness checks the proposal,
    /// and the reshape lands with the swaps, listing the value dropped.
    DemoStructural,
    /// The values migration: a chart whose new values schema refuses this repository's values,
    /// migrated key by key through Bosun's harness (scenarios/values-migration).
    DemoMigration,
    /// The mechanical fix: a chart default turns on a kind a cluster does not serve; the
    /// (scripted) model selects one key from Bosun's inventory (scenarios/mechanical-fix).
    DemoFix,
    /// A held minor bump with a green gate: Bosun explains what it does from the gate's
    /// report, in one comment (scenarios/green-explained).
    DemoGreen,
    /// A chain from charts/kargo-pipelines: staging, verification asking Prometheus, then
    /// prod (scenarios/chain), and the variant where staging degrades and prod never receives
    /// the Freight (scenarios/chain-degraded).
    DemoChain,
    /// The evals (evals/): scored by `cargo test --test evals`. With `--live`, the reshape
    /// cases go to a real model instead of the recorded replies (never in CI): set
    /// BOSUN_LIVE_PROVIDER (anthropic or openai), BOSUN_LIVE_MODEL, optionally
    /// BOSUN_LIVE_BASE_URL, and the key (ANTHROPIC_API_KEY / OPENAI_API_KEY, or the variable
    /// BOSUN_LIVE_KEY_ENV names).
    Evals {
        #[arg(long)]
        live: bool,
    },
    /// The embedded ground.
    Ground {
        #[command(subcommand)]
        command: GroundCommand,
    },
    /// The process cluster: upstream etcd, Kubernetes and kwok built from pinned Go modules and
    /// run on loopback, no Docker (see real/README.md).
    Real {
        #[command(subcommand)]
        command: real::Command,
    },
    /// The kind path: a real cluster with Argo CD, Kargo and Gitea (needs Docker; see kind/README.md).
    Kind {
        #[command(subcommand)]
        command: kind::Command,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
}

#[derive(Subcommand)]
enum GroundCommand {
    /// Start the ground with a scenario loaded, print the kubeconfig, forge URL and tokens.
    Up {
        #[arg(long, default_value = "happy-path")]
        scenario: String,
    },
    /// Play the observer and Bosun scenarios under seeded fault schedules, checking the
    /// ground's invariants every tick; report the seeds that failed.
    Chaos {
        /// How many seeds to play per scenario.
        #[arg(long, default_value_t = 5)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Play today's window instead of `--from`: the first seed derives from the UTC date
        /// (a different window each day, printed so a failure can be replayed with `--from`).
        #[arg(long, conflicts_with = "from")]
        daily: bool,
        /// The scenarios (default: the observer's and Bosun's).
        #[arg(long = "scenario", default_values_t = ["observer-drift".to_string(), "observer-restart".to_string(), "triage".to_string(), "structural".to_string()])]
        scenarios: Vec<String>,
    },
}

/// The workspace root (the folder above xtask/).
pub fn project_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Tools => tools::install().and_then(|_| tools::install_browser()),
        Command::Test { real, args } => test::run(real, &args),
        Command::Bench { which } => bench::run(which),
        Command::Kind { command } => kind::main(command),
        Command::Real { command } => real::main(command),
        Command::Demo {
            scenario,
            chaos_seed,
        } => match scenario {
            Some(scenario) => demo::play(&scenario, chaos_seed),
            None => demo::play("happy-path", chaos_seed)
                .and_then(|_| demo::play("observer-drift", chaos_seed))
                .and_then(|_| demo::play("triage", chaos_seed)),
        },
        Command::DemoTriage { forge } => match forge {
            Some(forge) => demo::play_on("triage", &forge),
            None => demo::play("triage", None),
        },
        Command::DemoStructural => demo::play("structural", None),
        Command::DemoMigration => demo::play("values-migration", None),
        Command::DemoFix => demo::play("mechanical-fix", None),
        Command::DemoGreen => demo::play("green-explained", None),
        Command::DemoChain => {
            demo::play("chain", None)?;
            demo::play("chain-degraded", None)
        }
        Command::Evals { live } => {
            let sh = xshell::Shell::new()?;
            sh.change_dir(project_root());
            if live {
                xshell::cmd!(
                    sh,
                    "cargo test --test evals reshape_evals_live -- --ignored --nocapture"
                )
                .run()?;
            } else {
                xshell::cmd!(sh, "cargo test --test evals -- --nocapture").run()?;
            }
            Ok(())
        }
        Command::Ground {
            command: GroundCommand::Up { scenario },
        } => demo::up(&scenario),
        Command::Ground {
            command:
                GroundCommand::Chaos {
                    seeds,
                    from,
                    daily,
                    scenarios,
                },
        } => {
            let from = if daily {
                demo::daily_window(seeds, &scenarios)
            } else {
                from
            };
            demo::chaos(&scenarios, seeds, from)
        }
    }
}
