//! The embedded proving ground: doubles of the systems the product talks to, speaking their
//! real wire protocols on loopback, so the product code under test is the code that talks to
//! a real GitHub, a real cluster, a real chart repository.
//!
//! Every double is named as such: `KubeDouble` (kube-apiserver), `ForgeDouble` (GitHub over
//! real bare git repositories), `ChartRepositoryDouble` (a Helm repository). On top of the
//! API double run the behaviours of Kargo (`kargo`) and Argo CD (`argocd`), and a CI job that
//! runs the real `gate` on pull requests (`ci`). `Ground` wires them from a scenario and
//! drives them in explicit ticks, so a run's transcript is deterministic.

pub mod argocd;
pub mod argocd_api;
pub mod bench;
pub mod bosun;
pub mod charts;
pub mod ci;
pub mod clock;
pub mod draws;
pub mod forge;
pub mod git;
pub mod http;
pub mod invariants;
pub mod kargo;
pub mod kube;
pub mod ledger;
pub mod model;
pub mod oci;
pub mod prometheus;
pub mod rollouts;
pub mod s3;
pub mod scenario;
pub mod transcript;

mod expect;
mod observers;
mod person;
mod script;
mod wiring;

pub(crate) use observers::http_get;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::argocd::ArgoCd;
use self::charts::ChartRepositoryDouble;
use self::ci::Ci;
use self::forge::ForgeDouble;
use self::kargo::Kargo;
use self::kube::{FaultPlan, KubeDouble};
use self::scenario::Scenario;
use self::transcript::Transcript;

/// Tokens the ground issues (printed by `ground up`).
pub const KUBE_ADMIN_TOKEN: &str = "ground-admin-token";
pub const KUBE_OBSERVER_TOKEN: &str = "ground-observer-token";
pub const OBSERVER_USER: &str = "system:serviceaccount:kargo-observer:kargo-argocd-observer";
pub const FORGE_KARGO_TOKEN: &str = "ground-kargo-token";
pub const FORGE_GATE_TOKEN: &str = "ground-gate-token";
pub const FORGE_PERSON_TOKEN: &str = "ground-alice-token";
pub const FORGE_BOSUN_TOKEN: &str = "ground-bosun-token";
/// The forge double's users: (token, login).
pub const FORGE_USERS: [(&str, &str); 4] = [
    (FORGE_KARGO_TOKEN, "kargo"),
    (FORGE_GATE_TOKEN, "addons-gate[bot]"),
    (FORGE_PERSON_TOKEN, "alice"),
    (FORGE_BOSUN_TOKEN, "bosun[bot]"),
];
pub const KUBE_BOSUN_TOKEN: &str = "ground-bosun-kube-token";
/// The Prometheus address scenarios' pipelines name; it reaches the Prometheus double.
pub const PROMETHEUS_URL: &str = "http://prometheus.example.test:9090";
pub const BOSUN_USER: &str = "system:serviceaccount:bosun:bosun";

pub struct Options {
    /// The real `gate` binary the CI job runs.
    pub gate: PathBuf,
    /// The real `observer` binary, for scenarios that start it.
    pub observer: Option<PathBuf>,
    /// The real `bosun` binary, for scenarios that run it.
    pub bosun: Option<PathBuf>,
    /// The folder with the pinned `helm` and `kubectl`.
    pub tools: PathBuf,
    /// The project's CRDs (kind/crds).
    pub crds: PathBuf,
    /// charts/kargo-pipelines (default: beside the CRDs, `kind/crds/../../charts`).
    pub pipelines_chart: Option<PathBuf>,
    pub faults: FaultPlan,
    /// Print transcript lines as they happen.
    pub echo: bool,
    /// A folder of render caches shared by every ground that names it (a test binary playing
    /// many stories): `ci/` for the CI jobs' gates (and Bosun, when
    /// [`Options::bosun_shares_render_cache`]) and `argocd/` for the Argo CD doubles, never one
    /// for both, so the double stays a second reading of what the gate renders.
    /// `None`: each ground keeps its own, as `cargo xtask demo` does. Sharing is sound
    /// because entries are content-addressed (the render key digests every input, the
    /// chart's bytes among them).
    pub render_cache: Option<PathBuf>,
    /// Bosun reads and writes the gates' cache of [`Options::render_cache`] too (it renders
    /// the heads the gate runner rendered). Off, Bosun keeps its own, cold, so its own render
    /// path (confinement, tools, environment) runs on every story (tests/bosun_paths.rs).
    pub bosun_shares_render_cache: bool,
}

pub struct Ground {
    pub scenario: Scenario,
    pub kube: KubeDouble,
    pub forge: ForgeDouble,
    pub chart_repositories: Vec<Arc<ChartRepositoryDouble>>,
    pub kargo: Kargo,
    pub argocd: ArgoCd,
    pub ci: Ci,
    /// The real `bosun serve`, when the scenario runs it (then the gate runner).
    pub bosun: Option<self::bosun::BosunProcess>,
    /// The scripted model, when the scenario gives Bosun one.
    pub model: Option<self::model::ModelDouble>,
    /// The OCI registry double, when the scenario scripts image labels.
    pub oci: Option<self::oci::OciRegistryDouble>,
    /// Argo Rollouts' analysis controller (runs the AnalysisRuns Kargo's verification makes).
    pub rollouts: self::rollouts::Rollouts,
    /// The Prometheus double over Argo CD's metrics (`PROMETHEUS_URL` reaches it).
    pub prometheus: self::prometheus::PrometheusDouble,
    pub transcript: Transcript,
    /// kubeconfig for the observer's identity.
    pub kubeconfig: PathBuf,
    /// kubeconfig for an administrator (kubectl).
    pub admin_kubeconfig: PathBuf,
    pub charts_mirror: PathBuf,
    observer_binary: Option<PathBuf>,
    /// Running observers: (process, metrics address, health address).
    observers: Vec<(std::process::Child, String, String)>,
    observer_starts: usize,
    /// Each running observer's arguments, in `observers`' order (a restart reuses them).
    observer_args: Vec<Vec<String>>,
    /// Ticks played so far (what an invariant violation names).
    ticks: u64,
    /// Bosun was killed in the tick under way by a fault (the kill's outcome); `after_tick`
    /// starts it again.
    bosun_killed: Option<std::result::Result<(), String>>,
    /// The fault seed, when the run is under a chaos schedule.
    seed: Option<u64>,
    /// Invariants a test breaks on purpose.
    pub exemptions: invariants::Exemptions,
    /// What became visible at which tick, when kept (set it before `play`).
    pub ledger: Option<ledger::Ledger>,
    dir: tempfile::TempDir,
}

impl Drop for Ground {
    fn drop(&mut self) {
        for (mut child, _, _) in self.observers.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Ground {
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
