//! `cargo xtask kind ...`: the kind path. The promotion loop of the embedded ground, on a real
//! cluster: kind, cert-manager, Argo CD, Argo Rollouts, Kargo, Gitea and our own images.
//!
//! `up` is a plan: the list of every command it runs, computed without side effects by
//! [`plan_up`]. [`run`] either prints it (`--dry-run`, snapshot-tested here, since Docker is not
//! on every machine) or runs it in order from the project root. Paths in a plan are relative to
//! the project root, so the text is the same wherever the project lives.
//!
//! Secrets never appear in a plan. An argument holds the placeholder [`GENERATED`] where one
//! goes, and the step lists the secrets that fill its placeholders, in order of appearance.
//! [`run`] generates them (or takes one from the output of a step that creates it) and puts
//! them only into the argv it executes. See kind/README.md.

use std::path::Path;

use anyhow::Result;
use clap::Subcommand;

use crate::project_root;

/// `argv![a, b, ...]`: a `Vec<String>` from `&str`s and `String`s.
macro_rules! argv {
    ($($arg:expr),* $(,)?) => {
        vec![$(String::from($arg)),*]
    };
}

mod credentials;
mod plan;
mod play;
mod run;
mod scenario;
mod stage;
#[cfg(test)]
mod tests;

use plan::{plan_down, plan_up};
use play::plan_play;
use run::{Credentials, run, run_with};
use scenario::{kargo_source, read_scenario, scenario_stage_charts, workload_clusters};
use stage::stage;

#[derive(Subcommand)]
pub enum Command {
    /// Create the kind cluster, install everything and load a scenario (needs Docker).
    Up {
        /// The scenario folder under scenarios/.
        #[arg(long, default_value = "happy-path")]
        scenario: String,
        /// Print every command, in order, and run none.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete the kind cluster and the workload clusters of every scenario's inventory.
    Down {
        /// Print the command and run nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Play the scenario's timeline against the cluster `up` made, and check its expectations
    /// there (waiting on conditions with timeouts; ground-only actions are skipped, said so).
    Play {
        /// The scenario folder under scenarios/ (the one `up` loaded).
        #[arg(long, default_value = "happy-path")]
        scenario: String,
        /// Print every command and request, in order, and run none.
        #[arg(long)]
        dry_run: bool,
    },
    /// A step of `up`: write target/kind/<scenario>/ (repositories for Gitea, Kargo objects).
    Stage {
        /// The scenario folder under scenarios/.
        #[arg(long, default_value = "happy-path")]
        scenario: String,
    },
}

pub fn main(command: Command) -> Result<()> {
    let root = project_root();
    match command {
        Command::Up { scenario, dry_run } => {
            let yaml = read_scenario(&root, &scenario)?;
            let source = kargo_source(&yaml, &scenario)?;
            let clusters = workload_clusters(&root, &yaml, &scenario)?;
            run(&plan_up(&root, &scenario, &source, &clusters), dry_run)
        }
        Command::Play { scenario, dry_run } => {
            let yaml = read_scenario(&root, &scenario)?;
            let charts = scenario_stage_charts(&root, &scenario, &kargo_source(&yaml, &scenario)?)?;
            let plan = plan_play(&root, &scenario, &yaml, &charts)?;
            run_with(&plan, dry_run, Credentials::Existing)
        }
        Command::Down { dry_run } => run(&plan_down(&every_workload_cluster(&root)?), dry_run),
        Command::Stage { scenario } => stage(&root, &scenario),
    }
}

/// The workload clusters of every scenario (what `down` deletes, whichever scenario `up`
/// loaded; deleting a kind cluster that does not exist succeeds), by name, each once.
fn every_workload_cluster(root: &Path) -> Result<Vec<scenario::WorkloadCluster>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root.join("scenarios"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().join("scenario.yaml").is_file() {
            names.push(name);
        }
    }
    names.sort();
    let mut clusters: Vec<scenario::WorkloadCluster> = Vec::new();
    for name in names {
        // A scenario that does not read leaves its own clusters out, not everyone's.
        let found =
            read_scenario(root, &name).and_then(|yaml| workload_clusters(root, &yaml, &name));
        match found {
            Ok(found) => {
                for cluster in found {
                    if !clusters.iter().any(|c| c.name == cluster.name) {
                        clusters.push(cluster);
                    }
                }
            }
            Err(e) => eprintln!("kind down: skipping scenarios/{name}: {e:#}"),
        }
    }
    Ok(clusters)
}

/// The kind cluster's name; kubectl and helm address it through its context.
const CLUSTER: &str = "gitops-loop";
const CONTEXT: &str = "kind-gitops-loop";
/// Gitea from the host (kind/cluster.yaml publishes the NodePort on loopback).
const GITEA_LOCAL: &str = "http://127.0.0.1:31082";
/// Gitea from inside the cluster: what Argo CD, Kargo and the staged repository use.
const GITEA_IN_CLUSTER: &str = "http://gitea-http.gitea.svc.cluster.local:3000";
const GITEA_ADMIN: &str = "gitops-admin";
/// The Kargo Project (and namespace) of the scenarios, declared in kind/project.yaml.
const PROJECT: &str = "kargo-demo";
/// Our binaries, one image each, tagged `gitops-loop/<binary>:kind`.
const BINARIES: [&str; 3] = ["gate", "observer", "bosun"];
const IMAGE_TAG: &str = "kind";
/// Where `stage` writes, under the project root.
const STAGED: &str = "target/kind";
/// The scenarios' GitOps repository and chart mirror.
const SAMPLE_REPO: &str = "scenarios/sample/repo";
const SAMPLE_CHARTS: &str = "scenarios/sample/charts";
/// The one chart repository of the mirror that is served on kind (the Gitea repository
/// platform/charts); the OCI registry `registry.example.test/charts` is not.
const SERVED_CHART_REPOSITORY: &str = "charts.example.test/stable";

/// The hosts the scenarios name, and what stands for them on kind. `stage` rewrites every
/// staged file with these, so Argo CD and Kargo reach Gitea, and Kargo's git-open-pr step infers
/// the `gitea` provider from the host.
const URL_MAP: [(&str, &str); 4] = [
    (
        "https://git.example.test/",
        "http://gitea-http.gitea.svc.cluster.local:3000/",
    ),
    (
        "https://charts.example.test/stable",
        "http://gitea-http.gitea.svc.cluster.local:3000/platform/charts/raw/branch/main",
    ),
    // Kargo's `http` step hands held pull requests to Bosun's intake.
    ("https://bosun.example.test", BOSUN_IN_CLUSTER),
    // Verification's AnalysisTemplates ask Prometheus (kind/values/prometheus.yaml).
    ("http://prometheus.example.test:9090", PROMETHEUS_IN_CLUSTER),
];
/// The Prometheus server from inside the cluster (chart prometheus-community/prometheus).
const PROMETHEUS_IN_CLUSTER: &str = "http://prometheus-server.monitoring.svc.cluster.local";
/// How long a `play` wait lasts before the play fails, naming what it waited for.
const WAIT_SECONDS: u64 = 20 * 60;
/// The Kubernetes version of every node (kind/cluster.yaml and kind/workload-cluster.yaml pin
/// one image), written on each cluster Secret for the gate's live inventory.
const NODE_KUBE_VERSION: &str = "1.33.7";
/// Bosun's intake from inside the cluster (charts/bosun's Service in namespace bosun).
const BOSUN_IN_CLUSTER: &str = "http://bosun.bosun.svc.cluster.local:8080";

/// The placeholder a plan holds where a secret goes.
pub const GENERATED: &str = "<generated>";

/// A value `run` makes at run time and never prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Secret {
    /// bcrypt hash of the generated Kargo admin password (`api.adminAccount.passwordHash`).
    KargoPasswordHash,
    /// Kargo's `api.adminAccount.tokenSigningKey`: 32 random bytes, hex.
    KargoTokenSigningKey,
    /// The Gitea admin's password.
    GiteaPassword,
    /// A Gitea access token for Kargo, printed by the step that creates it.
    GiteaToken,
    /// The shared secret of Bosun's intake (Kargo's `http` step sends it): 32 random bytes, hex.
    BosunWebhook,
    /// Argo CD's generated admin password, read from `argocd-initial-admin-secret`.
    ArgocdAdminPassword,
    /// A token of the Argo CD account `bosun`, which may only `get` clusters (Bosun's inventory).
    ArgocdBosunToken,
    /// The n-th workload cluster's token for Argo CD (its `argocd-manager` ServiceAccount).
    ClusterToken(usize),
    /// The n-th workload cluster's CA certificate, base64 (from kind's kubeconfig).
    ClusterCa(usize),
}

/// One command of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the command does, for the reader of the plan.
    pub what: String,
    /// The command; relative paths are relative to the project root.
    pub argv: Vec<String>,
    /// The secrets that replace the [`GENERATED`] placeholders of `argv`, in order.
    pub secrets: Vec<Secret>,
    /// When set, the command's standard output (trimmed) becomes this secret, unprinted.
    pub captures: Option<Secret>,
    /// When set, the command is a condition: run again every 10 s until it succeeds, failing
    /// the plan after this many seconds. A plan waits on conditions, never on sleeps.
    pub until: Option<u64>,
}

impl Step {
    fn new(what: impl Into<String>, argv: Vec<String>) -> Step {
        Step {
            what: what.into(),
            argv,
            secrets: Vec::new(),
            captures: None,
            until: None,
        }
    }

    /// A line for the reader that runs nothing (what `play` does not play, and why).
    fn note(what: impl Into<String>) -> Step {
        Step::new(what, Vec::new())
    }

    fn until(mut self, seconds: u64) -> Step {
        self.until = Some(seconds);
        self
    }

    fn with_secrets(mut self, secrets: &[Secret]) -> Step {
        self.secrets = secrets.to_vec();
        self
    }

    fn capturing(mut self, secret: Secret) -> Step {
        self.captures = Some(secret);
        self
    }
}

/// `path` (a path under `root`) as written in a plan: relative to the project root.
fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}
