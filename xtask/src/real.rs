//! `cargo xtask real build | up | down | status`: the process cluster (real/), upstream etcd,
//! Kubernetes and kwok built from the pinned Go modules under real/go and run on loopback.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Subcommand;
use real_cluster::Layout;

use crate::{project_root, tools};

#[derive(Subcommand)]
pub enum Command {
    /// Compile the pinned upstream programs into target/real/bin (nothing when the go.sum
    /// digests match), download the modules the CRDs are read from, and install Azurite
    /// into target/tools/azurite (nothing when its lock is unchanged).
    Build,
    /// Start etcd, the control plane, kwok with one fake node and the upstream Kargo and Argo
    /// CD CRDs; write target/real/admin.kubeconfig.
    Up,
    /// Stop every process `up` started and check their ports are free.
    Down,
    /// Say which components run and answer ready.
    Status,
}

pub fn layout() -> Layout {
    Layout::new(&project_root())
}

/// Builds what is missing; fails when a program the cluster cannot run without did not build.
pub fn build() -> Result<()> {
    let started = Instant::now();
    let mut report = real_cluster::build(&layout())?;
    // Azurite, for the remote render cache's Azure tests, from npm (node, not Go).
    let azurite = Instant::now();
    match tools::install_azurite() {
        Ok(true) => report.built.push(("azurite".into(), azurite.elapsed())),
        Ok(false) => report.cached.push("azurite".into()),
        Err(error) => report.failed.push(("azurite".into(), format!("{error:#}"))),
    }
    for (module, took) in &report.built {
        println!("real: built {module} in {:.1}s", took.as_secs_f64());
    }
    if !report.cached.is_empty() {
        println!(
            "real: up to date (go.sum digest unchanged): {}",
            report.cached.join(", ")
        );
    }
    for (module, error) in &report.failed {
        eprintln!("real: FAILED {module}: {error}");
    }
    println!(
        "real: build finished in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    if !report.failed.is_empty() {
        bail!(
            "real: {} of the pinned programs did not build (above)",
            report.failed.len()
        );
    }
    Ok(())
}

pub fn up() -> Result<real_cluster::State> {
    up_with(&tools::install()?)
}

/// `up` with the tools already installed (`cargo xtask test` installed them first).
pub fn up_with(tools: &std::path::Path) -> Result<real_cluster::State> {
    let started = Instant::now();
    let layout = layout();
    let state = match real_cluster::up(
        &layout,
        &real_cluster::Tools {
            kubectl: tools.join("kubectl"),
            helm: tools.join("helm"),
        },
    ) {
        Ok(state) => state,
        Err(error) => {
            // Leave nothing running behind a failed start.
            let _ = real_cluster::down(&layout);
            return Err(error);
        }
    };
    println!(
        "real: up in {:.1}s: {} ({} upstream CRDs; kubeconfig {})",
        started.elapsed().as_secs_f64(),
        state.server,
        state.crds.len(),
        state.kubeconfig.display()
    );
    let rss = real_cluster::rss_kib(&state);
    let total: u64 = rss.iter().map(|(_, k)| k).sum();
    println!(
        "real: resident memory {} MiB ({})",
        total / 1024,
        rss.iter()
            .map(|(n, k)| format!("{n} {} MiB", k / 1024))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(state)
}

pub fn down() -> Result<()> {
    real_cluster::down(&layout())?;
    println!("real: down; every process stopped and its ports free");
    Ok(())
}

pub fn main(command: Command) -> Result<()> {
    match command {
        Command::Build => build(),
        Command::Up => up().map(|_| ()),
        Command::Down => down(),
        Command::Status => {
            for line in real_cluster::status(&layout())? {
                println!("{line}");
            }
            Ok(())
        }
    }
}
