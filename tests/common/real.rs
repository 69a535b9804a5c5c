//! The process cluster (real/, `cargo xtask real up`) for the tests that run against upstream
//! programs. `cargo xtask test` starts it and sets `GITOPS_LOOP_REAL=1` when the Go toolchain
//! is present; without it each such test says on stderr that it was skipped and why, and the
//! run's summary says so too, so a skip is never silent.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use real_cluster::{Layout, State};

pub struct Real {
    pub layout: Layout,
    pub state: State,
}

/// The running process cluster when the real tier is asked for; `None` (after saying so) when
/// it is not. Asked for but not running is a failure, never a skip.
pub fn real(test: &str) -> Option<Real> {
    if std::env::var("GITOPS_LOOP_REAL").as_deref() != Ok("1") {
        eprintln!(
            "skipped {test}: needs the process cluster; run `cargo xtask test --real` (or `cargo xtask real build && cargo xtask real up`, then GITOPS_LOOP_REAL=1)"
        );
        return None;
    }
    let layout = Layout::new(&super::project_root());
    let state = State::read(&layout)
        .expect("the process cluster's state reads")
        .unwrap_or_else(|| {
            panic!(
                "GITOPS_LOOP_REAL=1 but no process cluster is up ({} is missing): cargo xtask real up",
                layout.state_file().display()
            )
        });
    Some(Real { layout, state })
}

impl Real {
    pub fn kubeconfig(&self) -> PathBuf {
        self.state.kubeconfig.clone()
    }

    /// A kube-rs client as the cluster's admin.
    pub async fn client(&self) -> kube::Client {
        gitops_loop::forge::github::install_crypto_provider();
        let config = kube::config::Kubeconfig::read_from(self.kubeconfig())
            .expect("the admin kubeconfig reads");
        let config = kube::Config::from_custom_kubeconfig(
            config,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("the admin kubeconfig is a config");
        kube::Client::try_from(config).expect("a client")
    }

    /// The end of a component's log, for a failing test's message.
    pub fn log_tail(&self, component: &str) -> String {
        self.state
            .component(component)
            .map(|c| real_cluster::log_tail(&c.log, 40))
            .unwrap_or_default()
    }

    /// The audit events of the API server (one JSON object per request) whose user is `user`.
    pub fn audit_events(&self, user: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.state.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["user"]["username"] == user)
            .collect()
    }
}

/// Polls `condition` until it holds, failing the test at `limit` with what it waited for.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_explained(what, limit, condition, String::new).await
}

/// [`wait_for`], with `explain` (logs, say) added to the failure message.
pub async fn wait_for_explained<F, Fut>(
    what: &str,
    limit: Duration,
    mut condition: F,
    explain: impl Fn() -> String,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(
            start.elapsed() < limit,
            "still waiting after {limit:?}: {what}\n{}",
            explain()
        );
        // The poll interval of a deadline-bounded wait, not a wait for time to pass.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
