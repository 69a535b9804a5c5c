//! The scenario folder format (documented in scenarios/README.md): the repository at start,
//! charts, inventory, cluster objects, a timeline of events, and what must hold at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    pub description: String,
    pub repository: Repository,
    /// The forge face Bosun, Kargo's pull request steps and people's merges speak: `github`
    /// (default) or `gitlab` (the same repository and pull requests as merge requests through
    /// `/api/v4`; the pipelines chart rendered with `gitops.provider: gitlab`).
    #[serde(default)]
    pub forge: Face,
    pub inventory: String,
    pub charts: Charts,
    pub kargo: KargoSpec,
    #[serde(default)]
    pub registry: Vec<Image>,
    /// Image tags the OCI registry double serves, with their config labels (release notes).
    #[serde(default)]
    pub images: Vec<crate::oci::OciImage>,
    /// Releases of source repositories, served by the forge double's GitHub API.
    #[serde(default)]
    pub releases: Vec<ReleaseSpec>,
    /// Run the real `bosun serve`; it is then the gate runner (the CI job stays off).
    #[serde(default)]
    pub bosun: Option<BosunSpec>,
    pub timeline: Vec<Action>,
    #[serde(default)]
    pub expect: Expect,
    #[serde(skip)]
    pub dir: PathBuf,
}

/// Which API of the forge double a scenario's actors speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Face {
    #[default]
    Github,
    Gitlab,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Repository {
    /// `owner/name` on the forge.
    pub slug: String,
    /// The URL Applications and Kargo steps write for it.
    pub url: String,
    /// The folder holding the repository's first commit, relative to the scenario.
    pub content: String,
    /// Files laid over `content` in that first commit (a scenario's variation of a shared
    /// repository), relative to the scenario.
    #[serde(default)]
    pub overlay: Option<String>,
    /// Branch protection: branch -> required checks.
    #[serde(default)]
    pub protect: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Charts {
    /// Every chart the scenario knows, in the chart mirror layout.
    pub mirror: String,
    /// Charts laid over `mirror` (a scenario's own chart versions), same layout.
    #[serde(default)]
    pub overlay: Option<String>,
    pub repositories: Vec<ChartRepository>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartRepository {
    pub url: String,
    /// `chart@version` entries not published when the run starts.
    #[serde(default)]
    pub unpublished: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KargoSpec {
    /// The Project namespace.
    pub project: String,
    /// YAML with Warehouses and Stages, relative to the scenario.
    #[serde(default)]
    pub objects: Option<String>,
    /// Values for charts/kargo-pipelines, relative to the scenario: the ground renders the
    /// chart with the real helm and loads what it renders (instead of `objects`).
    #[serde(default)]
    pub pipelines: Option<String>,
    /// Who holds Kargo's `promote` verb: user -> Stages (`*` for all).
    #[serde(default)]
    pub grants: BTreeMap<String, Vec<String>>,
    /// Stages whose promotions fail (a fault the scenario plays).
    #[serde(default)]
    pub failing_stages: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    pub tags: Vec<Tag>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tag {
    pub tag: String,
    #[serde(default)]
    pub digest: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BosunSpec {
    /// Keys merged over the bosun.yaml the ground writes (deny, allow, attemptCap, ...).
    #[serde(default)]
    pub config: serde_json::Value,
    /// `bosun serve --poll` in seconds (default 0: only deliveries start a triage).
    #[serde(default)]
    pub poll: u64,
    /// A scripted model (the model double); without it Bosun runs with `provider: none`.
    #[serde(default)]
    pub model: Option<crate::model::ModelScript>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseSpec {
    /// `owner/name` on github.com.
    pub repository: String,
    pub tag: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub body: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Merge {
    pub pr: u64,
    /// The forge user who presses the button.
    pub by: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommentSpec {
    pub pr: u64,
    pub by: String,
    /// A file (relative to the scenario) holding the body.
    pub body_file: String,
}

/// One event of the timeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Action {
    /// A line for the transcript.
    Say(String),
    /// A chart version appears in its repository (`chart@version`).
    Publish(String),
    /// A Warehouse looks for new artifacts now.
    Refresh(String),
    /// A person pushes a commit straight to a branch.
    Push(Push),
    /// A rollout stalls half-way for an Application (old and new images both run).
    StallRollout(String),
    /// Every workload of an Application is scaled to zero.
    ScaleToZero(String),
    /// The Application's next version passes its first health check, then crash-loops.
    DegradeAfterSync(String),
    /// A person asks Argo CD to sync an Application (a sync operation, as the UI's Sync).
    Sync(String),
    /// Run every actor until nothing changes.
    Settle,
    /// An image tag appears in the scripted registry (`repo:tag` or `repo:tag@digest`).
    PushImage(String),
    /// Start the real `observer` binary against the API double (extra arguments optional).
    StartObserver(Vec<String>),
    /// Stop it (SIGTERM, as Kubernetes does).
    StopObserver,
    /// Tick until every running observer's `/readyz` answers 200 (leader and standbys).
    AwaitObserversReady,
    /// Tick until the Stage's last Promotion reaches this phase.
    AwaitPromotion(AwaitPromotion),
    /// Tick until this many Events with this reason exist, then print them.
    AwaitEvents(AwaitEvents),
    /// Tick until the running observers' metric (summed over label sets) reaches a value.
    AwaitObserverMetric(AwaitMetric),
    /// Fail the run unless the Stage has exactly this many Promotions now.
    ExpectPromotions(ExpectPromotions),
    /// A person merges a pull request through the forge's API (branch protection applies).
    Merge(Merge),
    /// A person comments on a pull request.
    Comment(CommentSpec),
    /// One client's next requests to a double fail, as an outage of the path between them
    /// would: the forge's REST API answers 502 (git over HTTP is left alone), the API server
    /// 500 (watches are left alone).
    Outage(Outage),
}

/// Which double an outage hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Service {
    Forge,
    Api,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Outage {
    pub service: Service,
    /// The client: its login on the forge (`bosun[bot]`, `kargo`, ...) or its user name on the
    /// API server (`system:serviceaccount:bosun:bosun`, ...).
    pub user: String,
    /// Only requests of this method (`POST`, ...); every method when absent.
    #[serde(default)]
    pub method: Option<String>,
    /// Only requests to a path ending in this (`/labels`, ...); the forge only.
    #[serde(default)]
    pub path: Option<String>,
    /// How many matching requests pass before the outage starts (the forge only).
    #[serde(default)]
    pub after: u32,
    /// How many of its requests fail.
    pub requests: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwaitMetric {
    pub name: String,
    /// Wait until the metric reaches this value...
    #[serde(default)]
    pub at_least: Option<f64>,
    /// ...or grows by this much from its value when the wait starts.
    #[serde(default)]
    pub increase: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectPromotions {
    pub stage: String,
    pub count: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwaitPromotion {
    pub stage: String,
    pub phase: String,
    /// Wait until this many of the Stage's Promotions have the phase (instead of the last one).
    #[serde(default)]
    pub count: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwaitEvents {
    pub reason: String,
    pub count: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Push {
    #[serde(default = "main")]
    pub branch: String,
    pub message: String,
    /// Lossless edits: file -> YAML key (Kargo's syntax) -> new value.
    pub set: BTreeMap<String, BTreeMap<String, String>>,
}

fn main() -> String {
    "main".to_string()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expect {
    /// Promotions that must exist at the end: Stage -> phase.
    #[serde(default)]
    pub promotions: BTreeMap<String, String>,
    /// Stages that must be verified at the end.
    #[serde(default)]
    pub verified: Vec<String>,
    /// Pull requests that must be merged at the end (numbers).
    #[serde(default)]
    pub merged: Vec<u64>,
    /// How many Promotions each Stage must have at the end (exactly).
    #[serde(default)]
    pub promotion_count: BTreeMap<String, usize>,
    /// Pull requests that must still be open at the end.
    #[serde(default)]
    pub open: Vec<u64>,
    /// Labels each pull request must carry at the end (others may be there too).
    #[serde(default)]
    pub labels: BTreeMap<u64, Vec<String>>,
    /// The gate's reports on each pull request: one entry per head commit the gate reported
    /// on, in order (the report comment as it read for that head).
    #[serde(default)]
    pub reports: BTreeMap<u64, Vec<ReportExpect>>,
    /// Files of the repository that must end on the default branch byte for byte as the
    /// repository's first commit had them (no repair may touch them).
    #[serde(default)]
    pub untouched: Vec<String>,
}

/// What one gate report must say (a scenario's `expect.reports`, a check case's `expect`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReportExpect {
    /// The verdict's outcome: green, blocked or undecided.
    #[serde(default)]
    pub outcome: Option<String>,
    /// The blocking findings per rule, exactly.
    #[serde(default)]
    pub blocking: Option<BTreeMap<String, usize>>,
    /// Per API version: how many CustomResourceDefinitions the report's `dropped` blocks say
    /// stop serving it, exactly (versions not listed: none).
    #[serde(default)]
    pub dropped: Option<BTreeMap<String, usize>>,
    /// Kinds no `dropped` block may name (their manifests must be left alone).
    #[serde(default)]
    pub kept: Vec<String>,
}

impl ReportExpect {
    /// What of this expectation the report does not meet, one line each.
    pub fn unmet(&self, report: &gitops_loop::gate::report::ParsedReport) -> Vec<String> {
        let mut failures = Vec::new();
        let outcome = serde_json::to_value(report.verdict.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        if let Some(want) = &self.outcome
            && *want != outcome
        {
            failures.push(format!("outcome {outcome}, expected {want}"));
        }
        if let Some(want) = &self.blocking
            && *want != report.verdict.blocking
        {
            failures.push(format!(
                "blocking {:?}, expected {want:?}",
                report.verdict.blocking
            ));
        }
        if let Some(want) = &self.dropped {
            let mut have: BTreeMap<String, usize> = BTreeMap::new();
            for block in &report.dropped {
                for version in &block.dropped {
                    *have.entry(version.clone()).or_default() += 1;
                }
            }
            if have != *want {
                failures.push(format!(
                    "CustomResourceDefinitions per dropped version {have:?}, expected {want:?}"
                ));
            }
        }
        for kind in &self.kept {
            if let Some(block) = report.dropped.iter().find(|b| b.kind == *kind) {
                failures.push(format!(
                    "{kind} must be left alone, yet {} stops serving {}",
                    block.crd,
                    block.dropped.join(", ")
                ));
            }
        }
        failures
    }
}

impl Scenario {
    pub fn load(dir: &Path) -> Result<Scenario> {
        let path = dir.join("scenario.yaml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut scenario: Scenario = serde_saphyr::from_str(&text)
            .with_context(|| format!("{} is not a scenario", path.display()))?;
        scenario.dir = dir.to_path_buf();
        Ok(scenario)
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }
}
