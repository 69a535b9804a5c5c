//! `observer` (kargo-argocd-observer): when Argo CD runs an image tag Kargo never promoted,
//! create the Kargo Promotion that lets Kargo's bookkeeping catch up.

/// mimalloc: no per-allocation header and no per-thread arenas, so a cache of many small
/// objects costs less RSS than with glibc's malloc, and the first pass runs faster (measured with
/// `cargo xtask bench observer`; the chart sets `MIMALLOC_ARENA_EAGER_COMMIT=0` and `MIMALLOC_PURGE_DELAY=0`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use gitops_loop::observer::controller::{self, ObserverConfig};
use gitops_loop::observer::decision::ObserveMode;
use gitops_loop::observer::metrics::Metrics;
use tracing::{info, warn};

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// Parses `10m`, `30s`, `1h30m`, `500ms`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut number = String::new();
    let mut chars = text.trim().chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            "ms".to_string()
        } else {
            c.to_string()
        };
        let n: u64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration like 10m or 30s"))?;
        number.clear();
        total += match unit.as_str() {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            _ => return Err(format!("{text:?}: unknown unit {unit:?} (use ms, s, m, h)")),
        };
        any = true;
    }
    if !number.is_empty() || !any {
        return Err(format!("{text:?} is not a duration like 10m or 30s"));
    }
    Ok(total)
}

#[derive(Parser)]
#[command(
    name = "observer",
    version,
    about = "Create the Kargo Promotion when Argo CD runs a tag Kargo never promoted"
)]
struct Cli {
    /// opt-out: every Application with kargo.akuity.io/authorized-stage unless it opts out;
    /// opt-in: only those also annotated kargo-observer.kutlak.cc/observe: "true".
    #[arg(long, value_enum, default_value_t = ObserveMode::OptOut)]
    observe_mode: ObserveMode,
    /// Re-check every Application this often, events or not.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    resync: Duration,
    /// Serve Prometheus metrics on this address (/metrics).
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Serve /healthz and /readyz on this address.
    #[arg(long, default_value = "0.0.0.0:8081")]
    health_addr: SocketAddr,
    /// Act only while holding the Lease (several replicas, one actor).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    #[arg(long, default_value = "kargo-argocd-observer")]
    lease_name: String,
    /// The Lease's namespace (default: $POD_NAMESPACE, else default).
    #[arg(long)]
    lease_namespace: Option<String>,
    /// Watch Applications in this namespace only.
    #[arg(long)]
    namespace: Option<String>,
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    gitops_loop::forge::github::install_crypto_provider();
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::default());
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);

    // Health and metrics, outside the controller.
    serve_health(cli.health_addr, ready_rx).await?;
    serve_metrics(cli.metrics_addr, metrics.clone()).await?;

    let instance =
        std::env::var("POD_NAME").unwrap_or_else(|_| format!("observer-{}", std::process::id()));
    let config = ObserverConfig {
        mode: cli.observe_mode,
        resync: cli.resync,
        namespace: cli.namespace.clone(),
        instance: instance.clone(),
    };
    info!(mode = ?cli.observe_mode, resync_s = cli.resync.as_secs(), leader_elect = cli.leader_elect, "observer starting");

    if !cli.leader_elect {
        controller::run(
            client,
            config,
            metrics,
            ready_tx,
            gitops_loop::shutdown_signal(),
        )
        .await;
        info!("observer stopped");
        return Ok(());
    }

    // Leader election: only the Lease holder runs the controller; losing the Lease stops it.
    let lease_namespace = cli
        .lease_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into());
    let manager = lease_manager(&client, &cli.lease_name, &lease_namespace, &instance).await?;
    // A replica standing by is ready: it is healthy and can take over. Were it not, a
    // Deployment of two would never be fully available, and a rolling update would wait
    // forever for its new pod while the old one holds the Lease. The leader is ready once its
    // caches have their first list.
    ready_tx.send_replace(true);
    let (mut leading, lease_task) = manager.watch().await;
    let shutdown = gitops_loop::shutdown_signal();
    tokio::pin!(shutdown);
    info!(lease = %cli.lease_name, namespace = %lease_namespace, identity = %instance, "waiting for the Lease");
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                drop(leading);
                let _ = lease_task.await;
                info!("observer stopped before leading");
                return Ok(());
            }
            changed = leading.changed() => {
                if changed.is_err() {
                    anyhow::bail!("leader election stopped");
                }
                if *leading.borrow_and_update() {
                    break;
                }
            }
        }
    }
    info!("acquired the Lease: leading");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(controller::run(
        client,
        config,
        metrics,
        ready_tx,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let lost = loop {
        tokio::select! {
            _ = &mut shutdown => break false,
            changed = leading.changed() => {
                if changed.is_err() || !*leading.borrow_and_update() {
                    break true;
                }
            }
        }
    };
    let _ = stop_tx.send(());
    let _ = controller.await;
    // Closing the channel makes the lease manager release the Lease.
    drop(leading);
    let _ = lease_task.await;
    if lost {
        warn!("lost the Lease: stopping");
        std::process::exit(1);
    }
    info!("observer stopped, Lease released");
    Ok(())
}

/// `/healthz` (always ok) and `/readyz` (what `ready` says), served on `addr` in the
/// background.
async fn serve_health(addr: SocketAddr, ready: tokio::sync::watch::Receiver<bool>) -> Result<()> {
    let health = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = *ready.borrow();
                async move {
                    if ready {
                        (axum::http::StatusCode::OK, "ready")
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "caches not synced",
                        )
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, health).await;
    });
    Ok(())
}

/// `/metrics` in OpenMetrics text, served on `addr` in the background.
async fn serve_metrics(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<()> {
    let router = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.render(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(())
}

/// The Lease's manager. An API server's passing 5xx or throttling at start (found by the
/// ground's chaos seeds) is waited out, up to six tries over about six seconds; anything else
/// stops the start.
async fn lease_manager(
    client: &kube::Client,
    lease_name: &str,
    namespace: &str,
    instance: &str,
) -> Result<kube_lease_manager::LeaseManager> {
    let mut attempt = 0u32;
    loop {
        let built = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), lease_name)
            .with_namespace(namespace)
            .with_identity(instance)
            .with_create_mode(kube_lease_manager::LeaseCreateMode::AutoCreate)
            .build()
            .await;
        match built {
            Err(kube_lease_manager::LeaseManagerError::KubeError(kube::Error::Api(status)))
                if attempt < 5 && matches!(status.code, 429 | 500 | 502 | 503 | 504) =>
            {
                attempt += 1;
                warn!(
                    code = status.code,
                    attempt, "leader election not set up yet; retrying"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
            }
            built => return built.context("cannot set up leader election"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10x").is_err());
    }
}
