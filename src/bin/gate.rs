//! `gate`: render what a GitOps repository deploys, the way Argo CD would.
//!
//! Exit codes: 0 success; 1 the render failed (errors are printed one per line on stderr,
//! nothing on stdout); 2 the command line was wrong.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

use gitops_loop::forge as gate_forge;
use gitops_loop::gate;
use gitops_loop::remote_cache::{self, RemoteCache};
use gitops_loop::render::{
    self, RenderConfig, cache::RenderCache, inventory::Inventory, output, tools,
};

#[derive(Parser)]
#[command(
    name = "gate",
    version,
    about = "Render and judge what a GitOps repository deploys"
)]
struct Cli {
    /// Print nothing on stderr but errors.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Render every Application the repository generates at one revision.
    Render {
        #[command(flatten)]
        render: RenderArgs,
        /// The revision to render: a branch, tag or commit.
        #[arg(long, default_value = "HEAD")]
        revision: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Summary)]
        format: Format,
    },
    /// Chart mirror maintenance.
    Charts {
        #[command(subcommand)]
        command: ChartsCommand,
    },
    /// Render the merge base and the head, diff them and judge the change.
    /// Exit 0 green, 1 blocking findings, 2 could not decide.
    Check {
        #[command(flatten)]
        render: RenderArgs,
        #[command(flatten)]
        check: CheckArgs,
    },
    /// Check a pull request and publish the report comment and the `addons-gate` check on it.
    /// Exit codes as `check`.
    Publish {
        #[command(flatten)]
        render: RenderArgs,
        #[command(flatten)]
        publish: PublishArgs,
    },
    /// Combine the partial results of every shard of a sharded check (`check --shard I/N
    /// --partial FILE`) into the verdict and report one unsharded check gives. Exit codes as
    /// `check`; partials that are not every shard of one check, each once: exit 2.
    Merge {
        /// The partial results, one per shard, in any order.
        #[arg(required = true)]
        parts: Vec<PathBuf>,
        /// The git repository holding both commits (the rules read its manifests).
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// The merge base, as given to the shards' `check --base` (default: computed from
        /// the partials' head and the default branch; partials of another base are refused).
        #[arg(long)]
        base: Option<String>,
        /// The branch the change merges into, as given to the shards' `check
        /// --default-branch` (default: origin's HEAD, else main, else master).
        #[arg(long)]
        default_branch: Option<String>,
        /// A local clone for another repository a source reads: URL=DIR (repeatable), as
        /// given to the shards (the merge reads a parent's sources to tell whether helm or
        /// kustomize renders it).
        #[arg(long = "git-mirror", value_parser = parse_mirror)]
        git_mirrors: Vec<(String, PathBuf)>,
        /// Write the full report (Markdown) here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Write the verdict, findings and diff as JSON here (what `publish --result` reads).
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        html: HtmlArgs,
    },
    /// Show which helm and kubectl the gate would use.
    Tools {
        #[command(flatten)]
        tools: ToolArgs,
    },
    /// The remote render cache's keys (`--cache-url`).
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
    },
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Make a new signing key and print it with its public key, as `NAME=VALUE` lines:
    /// GATE_CACHE_SIGNING_KEY is a secret for the runs that write the remote cache (the
    /// default branch's), GATE_CACHE_PUBLIC_KEY goes to every run.
    Keygen,
}

#[derive(Subcommand)]
enum ChartsCommand {
    /// Pull every chart the repository's Applications use at a revision into the mirror
    /// (`--charts DIR`), with helm's own pull (http(s) and OCI repositories).
    Pull {
        #[command(flatten)]
        render: RenderArgs,
        /// The revision whose charts to pull.
        #[arg(long, default_value = "HEAD")]
        revision: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Summary,
    Yaml,
    Json,
}

#[derive(Args, Clone)]
struct ToolArgs {
    /// The helm binary (else $GATE_HELM, the project's target/tools, PATH).
    #[arg(long)]
    helm: Option<PathBuf>,
    /// The kubectl binary used for Kustomize (else $GATE_KUBECTL, target/tools, PATH).
    #[arg(long)]
    kubectl: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct RenderArgs {
    /// The git repository to read (its objects; the work tree is not used).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// The repository's URL as Applications write it (default: the `origin` remote).
    #[arg(long)]
    repo_url: Option<String>,
    /// Cluster inventory: the project's YAML, or Argo CD cluster Secrets.
    #[arg(long, conflicts_with = "inventory_argocd")]
    inventory: Option<PathBuf>,
    /// Read the cluster inventory from Argo CD's API at this URL (`GET /api/v1/clusters`):
    /// names, servers, labels and the versions Argo CD discovered.
    #[arg(long, value_name = "URL")]
    inventory_argocd: Option<String>,
    /// The environment variable holding the Argo CD token for --inventory-argocd.
    #[arg(long, default_value = "ARGOCD_AUTH_TOKEN")]
    argocd_token_env: String,
    /// The chart mirror (`<repo-key>/<chart>/<version>/`).
    #[arg(long)]
    charts: Option<PathBuf>,
    /// Pull the charts of repository FROM from TO instead (a pull-through mirror): FROM=TO
    /// (repeatable; only `charts pull` fetches).
    #[arg(long = "chart-repo-mirror", value_parser = parse_pair)]
    chart_repo_mirrors: Vec<(String, String)>,
    /// A local clone for another repository a source reads: URL=DIR (repeatable).
    #[arg(long = "git-mirror", value_parser = parse_mirror)]
    git_mirrors: Vec<(String, PathBuf)>,
    #[command(flatten)]
    tools: ToolArgs,
    /// Render cache folder (default: $GATE_CACHE_DIR, $XDG_CACHE_HOME/gitops-gate, ~/.cache/gitops-gate).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Do not read or write the render cache (neither the local nor the remote one).
    #[arg(long)]
    no_cache: bool,
    /// A render cache in object storage that every runner shares, behind the local one:
    /// s3://BUCKET/PREFIX (S3, or an S3-compatible store through AWS_ENDPOINT_URL; region and
    /// credentials from AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY...),
    /// gs://BUCKET/PREFIX (Google Cloud Storage; GOOGLE_SERVICE_ACCOUNT,
    /// GOOGLE_APPLICATION_CREDENTIALS...) or az://CONTAINER/PREFIX (Azure Blob Storage;
    /// AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY...). Entries are
    /// believed only when signed: GATE_CACHE_SIGNING_KEY (default-branch runs) reads and
    /// writes, --cache-public-key alone reads.
    #[arg(long, env = "GATE_CACHE_URL", value_name = "URL", value_parser = parse_cache_url)]
    cache_url: Option<String>,
    /// The public key remote cache entries must be signed with (base64, `gate cache keygen`).
    #[arg(long, env = "GATE_CACHE_PUBLIC_KEY", value_name = "KEY")]
    cache_public_key: Option<String>,
    /// Parallel helm/kustomize processes (default: the number of cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// How deep app-of-apps may nest.
    #[arg(long, default_value_t = render::DEFAULT_MAX_DEPTH)]
    max_depth: usize,
    /// Seconds one helm or kustomize call may run before it is killed (a render error).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    render_timeout: u64,
    /// Inflate a kustomization's `helmCharts` (from the chart mirror), as Argo CD does when its
    /// `kustomize.buildOptions` include `--enable-helm`.
    #[arg(long)]
    kustomize_enable_helm: bool,
    /// Address space one helm or kustomize call may take, in MiB.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(64..))]
    render_memory_mib: u64,
    /// What one helm or kustomize call may print, in MiB; past it the call is stopped (a
    /// render error).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536))]
    render_output_mib: u64,
    /// Where no network namespace can be made (no user namespaces), render anyway with a
    /// scrubbed environment only; without it such a render is refused (exit 1 for render,
    /// 2 for check and publish). Also GATE_ALLOW_UNCONFINED=1.
    #[arg(long)]
    allow_unconfined: bool,
}

#[derive(Args, Clone)]
struct CheckArgs {
    /// The merge base (default: computed from the head and the default branch).
    #[arg(long)]
    base: Option<String>,
    /// The pull request's head commit.
    #[arg(long, default_value = "HEAD")]
    head: String,
    /// The branch the change merges into (default: origin's HEAD, else main, else master).
    #[arg(long)]
    default_branch: Option<String>,
    /// Write the full report (Markdown) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the verdict, findings and diff as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Check only shard I of N of the fleet (1 <= I <= N; an Application's shard is its
    /// sources without targetRevision, its destination namespace and, where it may be helm's
    /// release, its name, hashed) and write a partial result to --partial; `gate merge` makes
    /// the verdict from every shard's partial. Exit 0 once the partial is written.
    #[arg(long, value_name = "I/N", value_parser = gate::shard::parse_shard, requires = "partial", conflicts_with_all = ["report", "json", "html"])]
    shard: Option<gitops_loop::render::Shard>,
    /// Where a sharded check writes its partial result.
    #[arg(long, requires = "shard")]
    partial: Option<PathBuf>,
    #[command(flatten)]
    html: HtmlArgs,
}

/// The HTML report beside the comment.
#[derive(Args, Clone)]
struct HtmlArgs {
    /// Write the full report as one self-contained HTML page here (findings, every diff,
    /// a filter; nothing loaded from elsewhere).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Where readers find the full report (the CI run's artifact page): a comment clipped
    /// to fit links to it. https:// or http:// only.
    #[arg(long, env = "GATE_HTML_URL", value_name = "URL", value_parser = parse_report_url)]
    html_url: Option<String>,
}

fn parse_report_url(text: &str) -> Result<String, String> {
    gate::report::full_report_url(text)
}

fn parse_cache_url(text: &str) -> Result<String, String> {
    remote_cache::Location::parse(text).map(|_| text.to_string())
}

/// A command line the gate cannot run with: one line on stderr, exit 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// How long the gate waits, once its verdict or render is out, for the remote cache's writes.
const REMOTE_WRITES_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The remote cache `--cache-url` names, with the trust its keys give (`None` without the
/// flag, or under `--no-cache`). Its warnings go to stderr unless `quiet`.
fn open_remote_cache(args: &RenderArgs, quiet: bool) -> Result<Option<Arc<RemoteCache>>> {
    let Some(url) = args.cache_url.as_deref().filter(|_| !args.no_cache) else {
        return Ok(None);
    };
    let signing = std::env::var("GATE_CACHE_SIGNING_KEY").ok();
    let trust =
        remote_cache::Trust::from_keys(args.cache_public_key.as_deref(), signing.as_deref())
            .map_err(|e| Usage(format!("--cache-url: {e}")))?;
    let log: remote_cache::Log = if quiet {
        Arc::new(|_: &str| {})
    } else {
        Arc::new(|line: &str| eprintln!("gate: {line}"))
    };
    let remote = RemoteCache::open(url, trust, args.render_output_mib << 20, log)
        .map_err(|e| Usage(format!("--cache-url: {e}")))?;
    Ok(Some(Arc::new(remote)))
}

/// Waits (bounded) for the remote cache's writes and prints what it did.
fn finish_remote(remote: Option<&Arc<RemoteCache>>, quiet: bool) {
    if let Some(remote) = remote {
        let summary = remote.finish(REMOTE_WRITES_WAIT);
        if !quiet {
            eprintln!("gate: {summary}");
        }
    }
}

/// Writes the HTML report when `--html` asks for it.
fn write_html(
    args: &HtmlArgs,
    result: &gate::verdict::GateResult,
    links: &gate::html::Links,
) -> Result<()> {
    if let Some(path) = &args.html {
        write_atomically(path, &gate::html::render(result, links))?;
    }
    Ok(())
}

/// The pull request's head and base come from the forge; the merge base is computed locally,
/// so `--repo` must hold both commits (they are fetched from `origin` when missing).
#[derive(Args, Clone)]
struct PublishArgs {
    /// The repository on the forge: OWNER/NAME; on GitLab the project's full path,
    /// GROUP/PROJECT or GROUP/SUBGROUP/.../PROJECT (checked for `--forge`).
    #[arg(long, value_name = "OWNER/NAME")]
    repo_slug: String,
    /// The pull request number.
    #[arg(long)]
    pr: u64,
    /// Which API the forge speaks: github, gitea (Gitea and Forgejo) or gitlab (REST v4; the
    /// token as `PRIVATE-TOKEN`, or an OAuth token written `oauth2:<token>`).
    #[arg(long, value_enum, default_value_t = gate_forge::ForgeKind::Github)]
    forge: gate_forge::ForgeKind,
    /// The forge's API root (Gitea: `https://HOST/api/v1`, GitLab: `https://HOST/api/v4`).
    #[arg(long, env = "GITHUB_API_URL", default_value = "https://api.github.com")]
    forge_url: String,
    /// The environment variable holding the token.
    #[arg(long, default_value = "GITHUB_TOKEN")]
    token_env: String,
    /// The login the token acts as (default: asked from the forge; set it for a GitHub App,
    /// whose comments are authored by `<app>[bot]`).
    #[arg(long)]
    author: Option<String>,
    /// Publish the verdict as a check run or as a commit status (default: a check run on
    /// GitHub, a status on Gitea and GitLab, which have no check runs).
    #[arg(long, value_enum)]
    check_mode: Option<gate::publish::CheckMode>,
    /// Also write the full report (Markdown) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Publish this verdict (`gate merge --json`'s file, or `check --json`'s) instead of
    /// checking again; its head must be the pull request's head (else exit 2, nothing
    /// published).
    #[arg(long, value_name = "FILE")]
    result: Option<PathBuf>,
    /// Publish only if the pull request's head is still this commit (what a CI job prepared
    /// for); otherwise exit 2 and publish nothing.
    #[arg(long, value_name = "SHA", value_parser = parse_commit_id)]
    expect_head: Option<String>,
    #[command(flatten)]
    html: HtmlArgs,
}

/// A full commit id (40 or 64 lowercase hex digits), as `--expect-head` must be.
fn parse_commit_id(text: &str) -> Result<String, String> {
    if gitops_loop::git::is_commit_id(text) {
        Ok(text.to_string())
    } else {
        Err("not a commit id (40 or 64 lowercase hex digits)".to_string())
    }
}

/// Writes a file whole or not at all (temporary file in the same folder, then rename).
fn write_atomically(path: &std::path::Path, content: &str) -> Result<()> {
    write_with(path, |out| {
        Ok(std::io::Write::write_all(out, content.as_bytes())?)
    })
}

/// Streams a value as pretty JSON into a file, atomically (no whole-document string).
fn write_json_atomically(path: &std::path::Path, value: &impl serde::Serialize) -> Result<()> {
    write_with(path, |out| Ok(serde_json::to_writer_pretty(out, value)?))
}

/// Streams a value as compact JSON into a file, atomically (a partial can be large).
fn write_json_compact(path: &std::path::Path, value: &impl serde::Serialize) -> Result<()> {
    write_with(path, |out| Ok(serde_json::to_writer(out, value)?))
}

/// Writes a file through `write` into a temporary file beside it, then renames it into
/// place: a reader never sees half of it, and a failure leaves the old file.
fn write_with(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<&mut std::fs::File>) -> Result<()>,
) -> Result<()> {
    use std::io::Write as _;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    {
        let mut writer = std::io::BufWriter::new(file.as_file_mut());
        write(&mut writer)?;
        writer.flush()?;
    }
    file.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Writes a verdict where asked and prints it as `check` does; the exit code is the outcome's.
fn finish_check(
    result: &gate::verdict::GateResult,
    report: &Option<PathBuf>,
    json: &Option<PathBuf>,
    (html, links): (&HtmlArgs, &gate::html::Links),
    quiet: bool,
    started: std::time::Instant,
) -> Result<ExitCode> {
    let (comment, full) = gate::report::render_linked(result, html.html_url.as_deref());
    write_html(html, result, links)?;
    gitops_loop::render::trace("check", "report written");
    gitops_loop::render::trace("check", &cpu_used());
    let full = full.unwrap_or(comment);
    if let Some(path) = report {
        write_atomically(path, &full)?;
    }
    if let Some(path) = json {
        write_json_atomically(path, result)?;
    }
    if quiet {
        // The outcome line only (the report is in --report, the details in --json).
        // Plain text for a terminal or a CI log: no Markdown escapes, no control
        // characters (a render error can quote a chart).
        let title: String = gate::publish::title(result)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        println!("addons-gate: {title}");
    } else {
        print!("{full}");
        eprintln!(
            "gate: checked in {} ms ({} Applications differ, {} distinct changes; peak RSS {})",
            started.elapsed().as_millis(),
            result.diff.applications.len(),
            result.diff.distinct_changes(),
            peak_rss()
        );
    }
    Ok(ExitCode::from(result.verdict.outcome.exit_code()))
}

/// The progress line on stderr while renders run: renders done out of planned, cache hits,
/// the slowest render so far. Shown when stderr is a terminal, or always with
/// `GATE_PROGRESS=always` (tests, CI logs); never with `-q` or `GATE_PROGRESS=never`.
struct ProgressLine {
    bar: indicatif::ProgressBar,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
    forced: bool,
}

impl ProgressLine {
    fn start(quiet: bool, what: &str) -> Option<ProgressLine> {
        let mode = std::env::var("GATE_PROGRESS").unwrap_or_default();
        let forced = mode == "always";
        if quiet || mode == "never" {
            return None;
        }
        let target = if forced {
            indicatif::ProgressDrawTarget::term_like_with_hz(Box::new(PlainStderr), 10)
        } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            indicatif::ProgressDrawTarget::stderr_with_hz(10)
        } else {
            return None;
        };
        let bar = indicatif::ProgressBar::with_draw_target(None, target);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} gate: {prefix}: {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.set_prefix(what.to_string());
        bar.set_message(render::progress::snapshot().line());
        bar.tick();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let (bar, stop) = (bar.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::park_timeout(std::time::Duration::from_millis(100));
                    bar.set_message(render::progress::snapshot().line());
                    bar.tick();
                }
            })
        };
        Some(ProgressLine {
            bar,
            stop,
            ticker: Some(ticker),
            forced,
        })
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            ticker.thread().unpark();
            let _ = ticker.join();
        }
        self.bar.set_message(render::progress::snapshot().line());
        if self.forced {
            // A log keeps the last state; a terminal gets its line back.
            self.bar.finish();
        } else {
            self.bar.finish_and_clear();
        }
    }
}

/// stderr as a terminal for `GATE_PROGRESS=always`, whatever it is.
#[derive(Debug)]
struct PlainStderr;

impl indicatif::TermLike for PlainStderr {
    fn width(&self) -> u16 {
        120
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.write_str(&format!("\x1b[{n}A"))
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.write_str(&format!("\x1b[{n}B"))
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.write_str(&format!("\x1b[{n}C"))
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.write_str(&format!("\x1b[{n}D"))
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        std::io::Write::write_all(&mut std::io::stderr(), s.as_bytes())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.write_str("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

fn parse_pair(text: &str) -> Result<(String, String), String> {
    let (from, to) = text.split_once('=').ok_or("expected FROM=TO")?;
    Ok((from.to_string(), to.to_string()))
}

fn parse_mirror(text: &str) -> Result<(String, PathBuf), String> {
    let (url, dir) = text.split_once('=').ok_or("expected URL=DIR")?;
    Ok((url.to_string(), PathBuf::from(dir)))
}

fn find_tools(args: &ToolArgs, quiet: bool) -> Result<(tools::Tool, Option<tools::Tool>)> {
    let helm = tools::find_tool("helm", args.helm.as_deref(), "GATE_HELM")?;
    let kubectl = tools::find_tool("kubectl", args.kubectl.as_deref(), "GATE_KUBECTL").ok();
    if !quiet {
        eprintln!("gate: helm {} ({})", helm.path.display(), helm.source);
    }
    Ok((helm, kubectl))
}

/// The render configuration, and the remote cache it reads through (`--cache-url`; never
/// under `charts pull`, which renders to find charts).
fn config(
    args: &RenderArgs,
    quiet: bool,
    pull: bool,
) -> Result<(RenderConfig, Option<Arc<RemoteCache>>)> {
    let remote = if pull {
        None
    } else {
        open_remote_cache(args, quiet)?
    };
    let (mut helm, mut kubectl) = find_tools(&args.tools, quiet)?;
    let limits = render::confine::Limits {
        timeout: std::time::Duration::from_secs(args.render_timeout),
        memory_bytes: args.render_memory_mib << 20,
        output_bytes: usize::try_from(args.render_output_mib << 20).unwrap_or(usize::MAX),
        allow_unconfined: args.allow_unconfined,
    };
    helm.limits = limits;
    // helm's version is part of every helm render's disk cache entry: asked now, it overlaps
    // reading the inventory and resolving the commits instead of delaying the first lookup.
    helm.prefetch_version();
    if let Some(kubectl) = kubectl.as_mut() {
        kubectl.limits = limits;
    }
    let inventory = match (&args.inventory, &args.inventory_argocd) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read inventory {}", path.display()))?;
            Inventory::parse(&text, &path.display().to_string())?
        }
        (None, Some(server)) => {
            let token = std::env::var(&args.argocd_token_env).unwrap_or_default();
            if token.is_empty() {
                anyhow::bail!(
                    "--inventory-argocd: no token: set ${} (or pass --argocd-token-env NAME)",
                    args.argocd_token_env
                );
            }
            Inventory::fetch_argocd_blocking(server, &token)?
        }
        (None, None) => Inventory::default(),
    };
    if !args.repo.join(".git").exists() && !args.repo.join("HEAD").exists() {
        anyhow::bail!("{} is not a git repository", args.repo.display());
    }
    let repo_url = args
        .repo_url
        .clone()
        .or_else(|| gitops_loop::git::origin_url(&args.repo));
    let mut cache = if args.no_cache {
        RenderCache::disabled()
    } else {
        args.cache_dir
            .clone()
            .or_else(RenderCache::default_dir)
            .map(RenderCache::at)
            .unwrap_or_default()
    };
    if let Some(remote) = &remote {
        cache = cache.with_second_level(remote.clone());
    }
    let config = RenderConfig {
        repo_dir: args.repo.clone(),
        repo_url,
        inventory,
        charts: args.charts.clone(),
        git_mirrors: args.git_mirrors.clone(),
        helm,
        kubectl,
        cache,
        max_depth: args.max_depth,
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        }),
        chart_pulls: if pull {
            gitops_loop::render::charts::ChartPulls::Any
        } else {
            gitops_loop::render::charts::ChartPulls::Never
        },
        chart_repo_mirrors: args.chart_repo_mirrors.clone(),
        kustomize_enable_helm: args.kustomize_enable_helm,
        parsed: Default::default(),
    };
    Ok((config, remote))
}

fn run(cli: Cli) -> Result<ExitCode> {
    // The temporary folders of runs that were killed (they hold a pull request's files).
    if !matches!(cli.command, Command::Tools { .. } | Command::Cache { .. }) {
        gitops_loop::scratch::sweep_temp_dir();
    }
    let quiet = cli.quiet;
    match cli.command {
        Command::Render {
            render: args,
            revision,
            format,
        } => render_command(&args, &revision, format, quiet),
        Command::Check {
            render: args,
            check,
        } => check_command(&args, &check, quiet),
        Command::Merge {
            parts,
            repo,
            base,
            default_branch,
            git_mirrors,
            report,
            json,
            html,
        } => {
            let options = gate::shard::MergeOptions {
                base,
                default_branch,
                git_mirrors,
            };
            merge_command(&parts, &repo, &options, &report, &json, &html, quiet)
        }
        Command::Publish {
            render: args,
            publish,
        } => {
            // The repository as the forge names it, before anything else: a wrong one is one
            // line and exit 2, nothing asked of the forge.
            let slug = gate_forge::RepoSlug::for_forge(publish.forge, &publish.repo_slug)
                .map_err(|e| Usage(format!("--repo-slug: {e}")))?;
            let token = std::env::var(&publish.token_env).unwrap_or_default();
            if token.is_empty() {
                anyhow::bail!(
                    "no token: set ${} (or pass --token-env NAME)",
                    publish.token_env
                );
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let mut remote = None;
            let code = runtime.block_on(publish_command(
                &args,
                &publish,
                &slug,
                &token,
                quiet,
                &mut remote,
            ));
            finish_remote(remote.as_ref(), quiet);
            code
        }
        Command::Charts {
            command:
                ChartsCommand::Pull {
                    render: args,
                    revision,
                },
        } => charts_pull(&args, &revision, quiet),
        Command::Tools { tools: args } => tools_command(&args),
        Command::Cache {
            command: CacheCommand::Keygen,
        } => {
            let (signing, public) = remote_cache::generate_keys().map_err(anyhow::Error::msg)?;
            println!("GATE_CACHE_SIGNING_KEY={signing}");
            println!("GATE_CACHE_PUBLIC_KEY={public}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `gate render`: one commit's rendering, as a summary, YAML or JSON on stdout.
fn render_command(
    args: &RenderArgs,
    revision: &str,
    format: Format,
    quiet: bool,
) -> Result<ExitCode> {
    let (config, remote) = config(args, quiet, false)?;
    let started = std::time::Instant::now();
    let progress = ProgressLine::start(quiet, "render");
    let rendered = render::render(&config, revision);
    drop(progress);
    let code = match rendered {
        Ok(rendering) => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            match format {
                Format::Summary => {
                    let text = output::summary(&rendering);
                    std::io::Write::write_all(&mut out, text.as_bytes())?;
                    if !text.ends_with('\n') {
                        std::io::Write::write_all(&mut out, b"\n")?;
                    }
                }
                Format::Yaml => output::write_yaml_stream(&rendering, &mut out)?,
                Format::Json => output::write_json(&rendering, &mut out)?,
            }
            std::io::Write::flush(&mut out)?;
            if !quiet {
                let s = &rendering.stats;
                let remote_hits = match remote {
                    Some(_) => format!(" ({} remote)", s.remote_hits),
                    None => String::new(),
                };
                eprintln!(
                    "gate: rendered {} applications in {} ms ({} unique renders: {} helm, {} kustomize, {} from cache{remote_hits}; peak RSS {})",
                    rendering.applications.len(),
                    started.elapsed().as_millis(),
                    s.unique_renders,
                    s.helm_runs,
                    s.kustomize_runs,
                    s.cache_hits,
                    peak_rss()
                );
            }
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("{failure}");
            ExitCode::from(1)
        }
    };
    finish_remote(remote.as_ref(), quiet);
    Ok(code)
}

/// `gate check`: the verdict on a change (or, with `--shard I/N --partial FILE`, one shard's
/// partial).
fn check_command(args: &RenderArgs, check: &CheckArgs, quiet: bool) -> Result<ExitCode> {
    let revisions = gate::check::Revisions {
        base: check.base.clone(),
        head: check.head.clone(),
        target: check.default_branch.clone(),
    };
    let started = std::time::Instant::now();
    // The commits are resolved (git processes) while the inventory is read.
    let (config, commits) = std::thread::scope(|scope| {
        let commits = scope.spawn(|| gate::check::resolve(&args.repo, &revisions));
        let config = config(args, quiet, false);
        let commits = commits
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (config, commits)
    });
    let (config, remote) = config?;
    gitops_loop::render::trace("check", "inventory read, commits resolved");
    let progress = ProgressLine::start(quiet, "check");
    if let (Some(shard), Some(path)) = (check.shard, &check.partial) {
        let partial = match commits {
            Ok((base, head)) => gate::shard::check_shard(&config, base, head, shard),
            Err(undecided) => gate::shard::Partial::undecided(
                &undecided,
                shard,
                &config.inventory,
                config.repo_url.as_deref(),
            ),
        };
        drop(progress);
        write_json_compact(path, &partial)?;
        if !quiet {
            eprintln!(
                "gate: shard {} checked in {} ms ({} Applications at the head{}; peak RSS {})",
                gate::shard::label(shard),
                started.elapsed().as_millis(),
                partial.head_applications.len(),
                if partial.undecided.is_some() {
                    ", could not decide"
                } else {
                    ""
                },
                peak_rss()
            );
        }
        finish_remote(remote.as_ref(), quiet);
        return Ok(ExitCode::SUCCESS);
    }
    let result = match commits {
        Ok((base, head)) => gate::check::check_commits(&config, base, head),
        Err(undecided) => *undecided,
    };
    drop(progress);
    gitops_loop::render::trace("check", "check returned");
    let links = gate::html::Links {
        repo_url: config.repo_url.clone(),
        forge: None,
    };
    let code = finish_check(
        &result,
        &check.report,
        &check.json,
        (&check.html, &links),
        quiet,
        started,
    );
    finish_remote(remote.as_ref(), quiet);
    code
}

/// One shard's partial, from its file.
fn read_partial(
    path: &std::path::Path,
    shared: &Arc<gate::shard::SharedObjects>,
) -> Result<gate::shard::Partial> {
    use std::io::Read as _;
    let cannot = || format!("cannot read partial {}", path.display());
    let over = || {
        anyhow::anyhow!(
            "partial {} is over the {} MiB a partial may be: not a partial of this gate",
            path.display(),
            gate::shard::MAX_PARTIAL_BYTES >> 20
        )
    };
    // A regular file within the cap, read no further than the cap (a file that grows while
    // it is read included): another job's file never exhausts the merge's memory.
    let mut file = std::fs::File::open(path).with_context(cannot)?;
    let metadata = file.metadata().with_context(cannot)?;
    if !metadata.is_file() {
        anyhow::bail!("partial {} is not a regular file", path.display());
    }
    if metadata.len() > gate::shard::MAX_PARTIAL_BYTES {
        return Err(over());
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    (&mut file)
        .take(gate::shard::MAX_PARTIAL_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(cannot)?;
    if bytes.len() as u64 > gate::shard::MAX_PARTIAL_BYTES {
        return Err(over());
    }
    gate::shard::Partial::from_slice(&bytes, shared)
        .with_context(|| format!("{} is not a partial check result", path.display()))
}

/// `gate merge`: every shard's partial -> the verdict of the whole check.
fn merge_command(
    parts: &[PathBuf],
    repo: &std::path::Path,
    options: &gate::shard::MergeOptions,
    report: &Option<PathBuf>,
    json: &Option<PathBuf>,
    html: &HtmlArgs,
    quiet: bool,
) -> Result<ExitCode> {
    let started = std::time::Instant::now();
    gitops_loop::render::trace("merge", "starts");
    // Each partial read whole and parsed from its bytes (serde_json parses a slice several
    // times faster than a reader), the partials on every core: the merge is on the critical
    // path of a sharded check.
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shared = Arc::new(gate::shard::SharedObjects::default());
    let mut read = gitops_loop::render::parallel_map(
        parts.iter().enumerate().collect(),
        jobs,
        |(index, path)| (index, read_partial(path, &shared)),
    );
    read.sort_by_key(|(index, _)| *index);
    let partials = read
        .into_iter()
        .map(|(_, partial)| partial)
        .collect::<Result<Vec<_>>>()?;
    match gate::shard::merge_with(partials, repo, options) {
        Ok(result) => {
            let links = gate::html::Links {
                repo_url: None,
                forge: None,
            };
            finish_check(&result, report, json, (html, &links), quiet, started)
        }
        Err(refusal) => {
            eprintln!(
                "gate: cannot merge: {}",
                gate::shard::one_line(&refusal.to_string())
            );
            Ok(ExitCode::from(2))
        }
    }
}

/// `gate publish`: the report comment and the `addons-gate` check on a pull request, from a
/// check run here or from a verdict file (`--result`).
async fn publish_command(
    args: &RenderArgs,
    publish: &PublishArgs,
    slug: &gate_forge::RepoSlug,
    token: &str,
    quiet: bool,
    remote: &mut Option<Arc<RemoteCache>>,
) -> Result<ExitCode> {
    let check_mode = match publish.check_mode {
        Some(gate::publish::CheckMode::CheckRun) if !publish.forge.has_check_runs() => {
            // A wrong command line: exit 2, nothing published.
            eprintln!(
                "gate: --check-mode check-run: a {:?} forge has no check runs (use --check-mode status)",
                publish.forge
            );
            return Ok(ExitCode::from(2));
        }
        Some(mode) => mode,
        None if publish.forge.has_check_runs() => gate::publish::CheckMode::CheckRun,
        None => gate::publish::CheckMode::Status,
    };
    let forge = publish.forge.connect(&publish.forge_url, token)?;
    let author = match &publish.author {
        Some(author) => author.clone(),
        None => forge.current_user().await?,
    };
    if let Some(expected) = &publish.expect_head {
        let pr = forge.pull_request(slug, publish.pr).await?;
        if &pr.head_sha != expected {
            eprintln!(
                "gate: {}#{}'s head is {}, not {expected}: a newer run judges it; nothing published",
                slug, publish.pr, pr.head_sha
            );
            return Ok(ExitCode::from(2));
        }
    }
    let mut repo_url = None;
    let (pr, result, published) = if let Some(path) = &publish.result {
        match publish_verdict_file(forge.as_ref(), publish, slug, &author, check_mode, path).await?
        {
            Some(published) => published,
            None => return Ok(ExitCode::from(2)),
        }
    } else {
        let (config, used) = config(args, quiet, false)?;
        *remote = used;
        repo_url = config.repo_url.clone();
        gate::publish::check_and_publish(
            forge.as_ref(),
            slug,
            publish.pr,
            &author,
            &config,
            check_mode,
            publish.html.html_url.as_deref(),
        )
        .await
        .with_context(|| format!("cannot check and publish {}#{}", slug, publish.pr))?
    };
    if let Some(path) = &publish.report {
        let (comment, full) = gate::report::render(&result);
        write_atomically(path, &full.unwrap_or(comment))?;
    }
    write_html(
        &publish.html,
        &result,
        &gate::html::Links {
            repo_url,
            forge: Some(publish.forge),
        },
    )?;
    if !quiet {
        eprintln!(
            "gate: {} on {}#{} ({}), comment {}",
            gate::publish::title(&result),
            slug,
            publish.pr,
            &pr.head_sha[..pr.head_sha.len().min(7)],
            published.comment_id
        );
    }
    Ok(ExitCode::from(result.verdict.outcome.exit_code()))
}

/// A verdict made elsewhere (a sharded check's merge), published as it is, for the head it
/// judged only. `None`: refused, said on stderr (exit 2, nothing published).
async fn publish_verdict_file(
    forge: &dyn gate_forge::Forge,
    publish: &PublishArgs,
    slug: &gate_forge::RepoSlug,
    author: &str,
    check_mode: gate::publish::CheckMode,
    path: &std::path::Path,
) -> Result<
    Option<(
        gate_forge::PullRequest,
        gate::verdict::GateResult,
        gate::publish::Published,
    )>,
> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let result: gate::verdict::GateResult = serde_json::from_reader(std::io::BufReader::new(file))
        .with_context(|| format!("{} is not a verdict (`gate merge --json`)", path.display()))?;
    // A file is another job's word: its outcome must agree with its own findings (a forged
    // "green" over a blocking finding is refused).
    if let Err(disagreement) = result.consistency() {
        eprintln!(
            "gate: {} is not a consistent verdict ({disagreement}); nothing published",
            path.display()
        );
        return Ok(None);
    }
    let pr = forge.pull_request(slug, publish.pr).await?;
    if pr.head_sha != result.verdict.head {
        eprintln!(
            "gate: {} judges {}, but {}#{}'s head is {}; nothing published",
            path.display(),
            result.verdict.head,
            slug,
            publish.pr,
            pr.head_sha
        );
        return Ok(None);
    }
    let published = gate::publish::publish_linked(
        forge,
        slug,
        publish.pr,
        author,
        &result,
        check_mode,
        publish.html.html_url.as_deref(),
    )
    .await
    .with_context(|| format!("cannot publish {}#{}", slug, publish.pr))?;
    Ok(Some((pr, result, published)))
}

/// `gate charts pull`: every chart a commit names, fetched into the mirror.
fn charts_pull(args: &RenderArgs, revision: &str, quiet: bool) -> Result<ExitCode> {
    if args.charts.is_none() {
        anyhow::bail!("gate charts pull needs --charts DIR (the mirror to fill)");
    }
    let (config, _) = config(args, quiet, true)?;
    match render::render(&config, revision) {
        Ok(rendering) => {
            if !quiet {
                eprintln!(
                    "gate: every chart of {} applications is in the mirror",
                    rendering.applications.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            eprintln!("{failure}");
            Ok(ExitCode::from(1))
        }
    }
}

/// `gate tools`: the helm and kubectl the gate would run, and where they come from.
fn tools_command(args: &ToolArgs) -> Result<ExitCode> {
    let (helm, kubectl) = find_tools(args, true)?;
    println!(
        "helm {} at {} ({})",
        helm.version(),
        helm.path.display(),
        helm.source
    );
    match kubectl {
        Some(k) => println!(
            "kubectl {} at {} ({})",
            k.version(),
            k.path.display(),
            k.source
        ),
        None => println!(
            "kubectl: not found (Kustomize sources cannot render); run `cargo xtask tools`"
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The process's peak resident set (VmHWM), for the stats line and benchmarks.
/// CPU time of this process (all its threads) and of its finished children (helm, kubectl,
/// git), for `GATE_TRACE`: how much of a run is the gate's own work.
fn cpu_used() -> String {
    // /proc/self/stat: after the command in parentheses, fields 14-17 are utime, stime,
    // cutime, cstime in clock ticks (100 per second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let ticks: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0) * 10)
        .collect();
    match ticks.as_slice() {
        [u, s, cu, cs] => {
            format!("CPU: own {u} ms user + {s} ms system; children {cu} ms user + {cs} ms system")
        }
        _ => "CPU: unknown".to_string(),
    }
}

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l["VmHWM:".len()..].trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn main() -> ExitCode {
    gitops_loop::render::trace("gate", "started");
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("gate: {error:#}");
            if error.downcast_ref::<Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
