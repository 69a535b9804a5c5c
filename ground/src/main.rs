//! `ground`: play a scenario on the embedded proving ground, or keep one up to explore.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Parser, Subcommand};
use ground::{Ground, Options, scenario::Scenario};

#[derive(Parser)]
#[command(
    name = "ground",
    about = "The embedded proving ground: Kubernetes API, Argo CD, Kargo and a forge, on loopback"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct Common {
    /// The scenario folder (scenarios/<name>).
    scenario: PathBuf,
    /// The gate binary the CI job runs.
    #[arg(long)]
    gate: PathBuf,
    /// The observer binary, for scenarios that start it.
    #[arg(long)]
    observer: Option<PathBuf>,
    /// The bosun binary, for scenarios that run it.
    #[arg(long)]
    bosun: Option<PathBuf>,
    /// Folder with the pinned helm and kubectl.
    #[arg(long)]
    tools: PathBuf,
    /// The project's CRDs.
    #[arg(long)]
    crds: PathBuf,
    /// charts/kargo-pipelines (default: `<crds>/../../charts/kargo-pipelines`).
    #[arg(long)]
    pipelines_chart: Option<PathBuf>,
    /// Inject faults from this seed (409s, 410s, 429s, 500s, dropped and duplicated watch events).
    #[arg(long)]
    chaos_seed: Option<u64>,
    /// Play the scenario on this face of the forge double (default: the scenario's `forge`).
    #[arg(long, value_enum)]
    forge: Option<ground::scenario::Face>,
}

/// The scenario of `common`, on the face `--forge` names.
fn load(common: &Common) -> Result<Scenario> {
    let mut scenario = Scenario::load(&common.scenario)?;
    if let Some(face) = common.forge {
        scenario.forge = face;
    }
    Ok(scenario)
}

#[derive(Subcommand)]
enum Command {
    /// Play the scenario's timeline, print the transcript, check its expectations.
    Play(Common),
    /// Start the ground, settle, print how to reach it, and keep the actors running.
    Up(Common),
    /// Benchmark Bosun: the triage scenario with N consumer manifests; verdict to pushed repair.
    BenchBosun {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 300)]
        consumers: usize,
    },
    /// Benchmark the reshape harness: N documents needing a reshape, scripted proposals.
    BenchReshape {
        /// The sample chart mirror (scenarios/sample/charts).
        #[arg(long)]
        charts: PathBuf,
        #[arg(long, default_value_t = 300)]
        documents: usize,
    },
    /// Benchmark the observer: N Applications and M Stages on the API double.
    BenchObserver {
        #[arg(long)]
        observer: PathBuf,
        #[arg(long)]
        crds: PathBuf,
        #[arg(long, default_value_t = 10_000)]
        applications: usize,
        #[arg(long, default_value_t = 1_000)]
        stages: usize,
    },
    /// Serve an S3-protocol server (s3s-fs) on loopback over a folder until Ctrl-C, for the
    /// gate's `--cache-url` by hand or in a benchmark; prints the variables a client needs.
    S3 {
        /// The folder holding the buckets (each a subfolder).
        #[arg(long)]
        root: PathBuf,
        /// Make this bucket first (repeatable).
        #[arg(long = "bucket")]
        buckets: Vec<String>,
    },
}

fn options(common: &Common) -> Options {
    let faults = common
        .chaos_seed
        .map(ground::kube::FaultPlan::chaos)
        .unwrap_or_default();
    Options {
        gate: common.gate.clone(),
        observer: common.observer.clone(),
        bosun: common.bosun.clone(),
        tools: common.tools.clone(),
        crds: common.crds.clone(),
        pipelines_chart: common.pipelines_chart.clone(),
        faults,
        echo: true,
        render_cache: None,
        bosun_shares_render_cache: false,
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Play(common) => play(&common).await,
        Command::BenchReshape { charts, documents } => bench_reshape(&charts, documents),
        Command::BenchBosun { common, consumers } => bench_bosun(&common, consumers).await,
        Command::BenchObserver {
            observer,
            crds,
            applications,
            stages,
        } => bench_observer(&observer, &crds, applications, stages).await,
        Command::S3 { root, buckets } => s3(&root, &buckets).await,
        Command::Up(common) => up(&common).await,
    }
}

/// `ground play`: the timeline, the faults injected, the expectations.
async fn play(common: &Common) -> Result<()> {
    let scenario = load(common)?;
    if let Some(seed) = common.chaos_seed {
        println!("[ground] fault seed {seed}");
    }
    println!("[ground] {}", scenario.description.trim());
    let started = std::time::Instant::now();
    let mut ground = Ground::start(scenario, options(common)).await?;
    ground.play().await?;
    if common.chaos_seed.is_some() {
        let i = ground.kube.faults().injected();
        println!(
            "[ground] faults injected: API server {} 500s, {} 429s, {} 409s, {} dropped, {} duplicated and {} closed watch events, {} 410s; forge {}; model timeouts {}; restarts {}",
            i.server_errors,
            i.throttles,
            i.conflicts,
            i.dropped_events,
            i.duplicated_events,
            i.closed_watches,
            i.gone,
            ground.forge.injected_faults(),
            ground.model.as_ref().map_or(0, |m| m.injected_timeouts()),
            i.restarts
        );
    }
    println!(
        "[ground] the scenario's expectations hold ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `ground bench-reshape`.
fn bench_reshape(charts: &Path, documents: usize) -> Result<()> {
    let f = ground::bench::reshape(charts, documents)?;
    println!(
        "bench reshape: {} documents needing a reshape in {} files, scripted proposals",
        f.documents, f.files
    );
    println!(
        "  harness (find, check every proposal, write, check again): {:.3} s",
        f.harness.as_secs_f64()
    );
    Ok(())
}

/// `ground bench-bosun`.
async fn bench_bosun(common: &Common, consumers: usize) -> Result<()> {
    let mut options = options(common);
    options.echo = false;
    let f = ground::bench::bosun(&common.scenario, options, consumers).await?;
    println!(
        "bench bosun: {} consumer manifests in {} files (+ the scenario's own)",
        f.consumers, f.files
    );
    println!(
        "  gate verdict to repair pushed: {:.2} s",
        f.verdict_to_push
    );
    println!(
        "  whole triage (gate, repair, gate again): {:.1} s",
        f.triage.as_secs_f64()
    );
    let n = ground::bench::notes().await?;
    println!(
        "  release notes of one image move ({} releases): cold {:.1} ms, cached {:.1} ms",
        n.releases,
        n.cold.as_secs_f64() * 1000.0,
        n.cached.as_secs_f64() * 1000.0
    );
    Ok(())
}

/// `ground bench-observer`.
async fn bench_observer(
    observer: &Path,
    crds: &Path,
    applications: usize,
    stages: usize,
) -> Result<()> {
    let f = ground::bench::observer(observer, crds, applications, stages).await?;
    println!(
        "bench observer: {} Applications, {} Stages on the API double (setup {:.1} s)",
        f.applications,
        f.stages,
        f.setup.as_secs_f64()
    );
    println!(
        "  first full pass (start to every Application reconciled once): {:.2} s",
        f.first_pass.as_secs_f64()
    );
    println!(
        "  tag change to Promotion created: {} ms",
        f.change_to_promotion.as_millis()
    );
    println!(
        "  observer peak RSS: {:.1} MiB",
        f.peak_rss_kib as f64 / 1024.0
    );
    Ok(())
}

/// `ground s3`: the server until Ctrl-C.
async fn s3(root: &Path, buckets: &[String]) -> Result<()> {
    let server = ground::s3::S3Server::start(root)?;
    for bucket in buckets {
        server.create_bucket(bucket)?;
    }
    for (name, value) in server.env() {
        println!("{name}={value}");
    }
    tokio::signal::ctrl_c().await?;
    drop(server);
    Ok(())
}

/// `ground up`: settled, how to reach it printed, the actors ticking until Ctrl-C.
async fn up(common: &Common) -> Result<()> {
    let scenario = load(common)?;
    let mut ground = Ground::start(scenario, options(common)).await?;
    ground.settle().await?;
    println!("\nThe ground is up.");
    println!("  Kubernetes API double: {}", ground.kube.url());
    println!("    observer kubeconfig: {}", ground.kubeconfig.display());
    println!(
        "    admin kubeconfig:    {}  (kubectl --kubeconfig ...)",
        ground.admin_kubeconfig.display()
    );
    println!("  forge double (GitHub REST): {}", ground.forge.url());
    println!(
        "    repository {} at {}",
        ground.scenario.repository.slug,
        ground
            .forge
            .git_url(&ground.scenario.repository.slug)
            .unwrap_or_default()
    );
    println!(
        "    tokens: kargo={} gate={} alice={} bosun={}",
        ground::FORGE_KARGO_TOKEN,
        ground::FORGE_GATE_TOKEN,
        ground::FORGE_PERSON_TOKEN,
        ground::FORGE_BOSUN_TOKEN
    );
    for repository in &ground.chart_repositories {
        println!(
            "  chart repository double: {} (stands in for {})",
            repository.url(),
            repository.alias
        );
    }
    println!("Press Ctrl-C to stop.");
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => { ground.tick().await; }
        }
    }
}
