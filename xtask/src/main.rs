//! `cargo xtask`: the project's automation (tools, tests, benchmarks, demos).

mod bench;
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
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        args: Vec<String>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
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
        Command::Tools => tools::install().map(|_| ()),
        Command::Test { args } => test::run(&args),
        Command::Bench { which } => bench::run(which),
    }
}
