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
pub mod forge;
pub mod git;
pub mod invariants;
pub mod kargo;
pub mod kube;
pub mod model;
pub mod oci;
pub mod prometheus;
pub mod rollouts;
pub mod scenario;
pub mod transcript;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use self::argocd::{ArgoCd, Hold};
use self::charts::ChartRepositoryDouble;
use self::ci::Ci;
use self::forge::ForgeDouble;
use self::kargo::Kargo;
use self::kube::store::{Selector, User};
use self::kube::{FaultPlan, KubeDouble};
use self::scenario::{Action, Scenario};
use self::transcript::Transcript;
use gitops_loop::render::{
    RenderConfig, cache::RenderCache, inventory::Inventory, tools::Tool, tools::ToolSource,
};

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
    /// Ticks played so far (what an invariant violation names).
    ticks: u64,
    /// The fault seed, when the run is under a chaos schedule.
    seed: Option<u64>,
    /// Invariants a test breaks on purpose.
    pub exemptions: invariants::Exemptions,
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

fn admin() -> User {
    User {
        name: "system:admin".into(),
        groups: vec!["system:masters".into()],
    }
}

fn copy_mirror(from: &Path, to: &Path, unpublished: &[(String, String)]) -> Result<()> {
    // Layout: <repo-key...>/<chart>/<version>/Chart.yaml; skip unpublished (key, chart@version).
    fn walk(from: &Path, to: &Path, root: &Path, unpublished: &[(String, String)]) -> Result<()> {
        if from.join("Chart.yaml").is_file() {
            let relative = from
                .strip_prefix(root)
                .unwrap_or(from)
                .to_string_lossy()
                .to_string();
            let parts: Vec<&str> = relative.rsplitn(3, '/').collect();
            if let [version, chart, key] = parts.as_slice()
                && unpublished
                    .iter()
                    .any(|(k, cv)| k == key && *cv == format!("{chart}@{version}"))
            {
                return Ok(());
            }
            return git::copy_tree(from, to);
        }
        for entry in std::fs::read_dir(from)?.flatten() {
            if entry.file_type()?.is_dir() {
                walk(
                    &entry.path(),
                    &to.join(entry.file_name()),
                    root,
                    unpublished,
                )?;
            }
        }
        Ok(())
    }
    walk(from, to, from, unpublished)
}

impl Ground {
    pub async fn start(scenario: Scenario, options: Options) -> Result<Ground> {
        gitops_loop::forge::github::install_crypto_provider();
        let transcript = if options.echo {
            Transcript::echoing()
        } else {
            Transcript::default()
        };
        let dir = tempfile::Builder::new().prefix("ground-").tempdir()?;
        let helm = Tool {
            name: "helm",
            path: options.tools.join("helm"),
            source: ToolSource::Flag,
            limits: Default::default(),
        };
        let kubectl = Tool {
            name: "kubectl",
            path: options.tools.join("kubectl"),
            source: ToolSource::Flag,
            limits: Default::default(),
        };

        // The cluster: API double, CRDs, namespaces, identities, Kargo's webhooks.
        let kube = KubeDouble::start(options.faults).await?;
        kube.add_user(KUBE_ADMIN_TOKEN, "system:admin", &["system:masters"]);
        kube.add_user(
            KUBE_OBSERVER_TOKEN,
            OBSERVER_USER,
            &["system:serviceaccounts"],
        );
        kube.load_crds(&options.crds)?;
        for namespace in ["default", "argocd", "kargo-observer"] {
            kube.create_namespace(namespace, &[])?;
        }
        kube.create_namespace(&scenario.kargo.project, &[(kargo::PROJECT_LABEL, "true")])?;
        let kubeconfig = kube.write_kubeconfig(
            &dir.path().join("kubeconfig"),
            OBSERVER_USER,
            KUBE_OBSERVER_TOKEN,
            &scenario.kargo.project,
        )?;
        let admin_kubeconfig = kube.write_kubeconfig(
            &dir.path().join("admin.kubeconfig"),
            "system:admin",
            KUBE_ADMIN_TOKEN,
            &scenario.kargo.project,
        )?;

        // The forge: the repository, its protection, the people and bots.
        let forge = ForgeDouble::start(Some(&dir.path().join("forge"))).await?;
        for (token, login) in FORGE_USERS {
            forge.add_user(token, login);
        }
        let repository = &scenario.repository;
        let content = match &repository.overlay {
            None => scenario.path(&repository.content),
            Some(overlay) => {
                let merged = dir.path().join("repository-content");
                git::copy_tree(&scenario.path(&repository.content), &merged)?;
                git::copy_tree(&scenario.path(overlay), &merged)?;
                merged
            }
        };
        forge.create_repo(&repository.slug, &content)?;
        for (branch, checks) in &repository.protect {
            let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
            forge.protect(&repository.slug, branch, &checks);
        }
        let bare = forge
            .bare_path(&repository.slug)
            .context("bare repository")?;

        // Chart repositories, and the mirror the gate and Argo CD read (unpublished left out).
        let mirror_source = match &scenario.charts.overlay {
            None => scenario.path(&scenario.charts.mirror),
            Some(overlay) => {
                let merged = dir.path().join("chart-sources");
                git::copy_tree(&scenario.path(&scenario.charts.mirror), &merged)?;
                git::copy_tree(&scenario.path(overlay), &merged)?;
                merged
            }
        };
        let mut chart_repositories = Vec::new();
        let mut unpublished = Vec::new();
        for spec in &scenario.charts.repositories {
            let key = gitops_loop::render::charts::repo_key(&spec.url);
            let repo = ChartRepositoryDouble::start(
                &spec.url,
                &mirror_source.join(&key),
                &helm.path,
                &spec.unpublished,
            )
            .await?;
            unpublished.extend(spec.unpublished.iter().map(|u| (key.clone(), u.clone())));
            chart_repositories.push(Arc::new(repo));
        }
        let charts_mirror = dir.path().join("charts");
        copy_mirror(&mirror_source, &charts_mirror, &unpublished)?;

        let inventory_path = scenario.path(&scenario.inventory);
        let inventory = Inventory::parse(
            &std::fs::read_to_string(&inventory_path)?,
            &inventory_path.display().to_string(),
        )?;
        let render_config = RenderConfig {
            repo_dir: bare.clone(),
            revision: "main".into(),
            repo_url: Some(repository.url.clone()),
            inventory,
            charts: Some(charts_mirror.clone()),
            git_mirrors: Vec::new(),
            helm,
            kubectl: Some(kubectl),
            cache: RenderCache::at(dir.path().join("argocd-cache")),
            max_depth: gitops_loop::render::DEFAULT_MAX_DEPTH,
            jobs: 2,
            chart_pulls: Default::default(),
            chart_repo_mirrors: Vec::new(),
            kustomize_enable_helm: false,
            parsed: Default::default(),
        };
        let argocd = ArgoCd::new(render_config, bare, "main");

        // Kargo: webhooks, grants, chart discovery through the chart repository doubles.
        let mut kargo = Kargo::new(
            &scenario.kargo.project,
            &dir.path().join("kargo"),
            &forge.url(),
            FORGE_KARGO_TOKEN,
        );
        kargo::install_webhooks(&kube, kargo.grants.clone());
        for (user, stages) in &scenario.kargo.grants {
            for stage in stages {
                kargo.grants.allow(user, &scenario.kargo.project, stage);
            }
        }
        let repos = chart_repositories.clone();
        kargo.chart_versions = Box::new(move |url, chart| {
            repos
                .iter()
                .find(|r| r.alias == url.trim_end_matches('/'))
                .map(|r| r.versions(chart))
                .unwrap_or_default()
        });
        // Every actor reaches git over smart HTTP with its own token, as on GitHub.
        kargo.git_repos.insert(
            repository.url.clone(),
            (
                repository.slug.clone(),
                forge.http_git_url_as(&repository.slug, FORGE_KARGO_TOKEN),
            ),
        );
        kargo.failing_stages = scenario.kargo.failing_stages.clone();
        for image in &scenario.registry {
            kargo.registry.images.insert(
                image.repo_url.clone(),
                image
                    .tags
                    .iter()
                    .map(|t| (t.tag.clone(), t.digest.clone()))
                    .collect(),
            );
        }
        // The Kargo objects: the kargo-pipelines chart rendered with the real helm from the
        // scenario's values, or hand-written YAML.
        let (objects_path, text) = match (&scenario.kargo.pipelines, &scenario.kargo.objects) {
            (Some(values), None) => {
                let values = scenario.path(values);
                let chart = options
                    .pipelines_chart
                    .clone()
                    .unwrap_or_else(|| options.crds.join("../../charts/kargo-pipelines"));
                let output = std::process::Command::new(options.tools.join("helm"))
                    .args(["template", "pipelines"])
                    .arg(&chart)
                    .args(["--namespace", &scenario.kargo.project, "--values"])
                    .arg(&values)
                    .env("HELM_CACHE_HOME", dir.path().join("helm-cache"))
                    .env("HELM_CONFIG_HOME", dir.path().join("helm-config"))
                    .env("HELM_DATA_HOME", dir.path().join("helm-data"))
                    .output()
                    .with_context(|| format!("helm template {}", chart.display()))?;
                if !output.status.success() {
                    anyhow::bail!(
                        "{}: the kargo-pipelines chart refused these values: {}",
                        values.display(),
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                }
                (values, String::from_utf8_lossy(&output.stdout).into_owned())
            }
            (None, Some(objects)) => {
                let path = scenario.path(objects);
                let text = std::fs::read_to_string(&path)?;
                (path, text)
            }
            _ => {
                anyhow::bail!("kargo: give exactly one of `pipelines` (chart values) or `objects`")
            }
        };
        for object in
            gitops_loop::yaml::parse_documents(&text, &objects_path.display().to_string())?
        {
            let api_version = object
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let kind = object
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let mut store = kube.store();
            let resource = store
                .resource_for_kind(&api_version, &kind)
                .cloned()
                .with_context(|| {
                    format!(
                        "{}: unknown kind {api_version} {kind}",
                        objects_path.display()
                    )
                })?;
            store
                .create(&resource, &scenario.kargo.project, object, &admin())
                .map_err(|e| anyhow::anyhow!("{}: {e}", objects_path.display()))?;
        }

        kargo.bootstrap(&kube, &transcript);

        let mut ci = Ci::new(
            options.gate.clone(),
            &repository.slug,
            &repository.url,
            // A CI checkout keeps its token in the remote URL (the gate must not carry it
            // into a render or a report).
            &forge.http_git_url_as(&repository.slug, FORGE_GATE_TOKEN),
            &forge.url(),
            FORGE_GATE_TOKEN,
            inventory_path,
            charts_mirror.clone(),
            dir.path().join("ci"),
        );
        ci.chart_repo_mirrors = chart_repositories
            .iter()
            .map(|r| (r.alias.clone(), r.url()))
            .collect();

        let mut model_double = None;
        let mut oci_double = None;
        // Source repositories' releases, on the forge double's GitHub API.
        for release in &scenario.releases {
            forge.add_release(
                &release.repository,
                &release.tag,
                &release.name,
                &release.body,
            );
        }
        let bosun = match &scenario.bosun {
            None => None,
            Some(spec) => {
                let binary = options
                    .bosun
                    .clone()
                    .context("this scenario runs Bosun: pass its binary")?;
                // Argo CD's cluster Secrets, annotated as the project reads them: Bosun's
                // inventory is live, read through the API double.
                let inventory = Inventory::parse(
                    &std::fs::read_to_string(&ci.inventory)?,
                    &ci.inventory.display().to_string(),
                )?;
                {
                    let mut store = kube.store();
                    let resource = store
                        .resource("", "v1", "secrets")
                        .cloned()
                        .context("the API double serves Secrets")?;
                    for secret in inventory.cluster_secrets("argocd") {
                        store
                            .create(&resource, "argocd", secret, &admin())
                            .map_err(|e| anyhow::anyhow!("cluster Secret: {e}"))?;
                    }
                }
                kube.add_user(KUBE_BOSUN_TOKEN, BOSUN_USER, &["system:serviceaccounts"]);
                let bosun_kubeconfig = kube.write_kubeconfig(
                    &dir.path().join("bosun.kubeconfig"),
                    BOSUN_USER,
                    KUBE_BOSUN_TOKEN,
                    "argocd",
                )?;
                let mut overrides = spec.config.clone();
                let mut env = Vec::new();
                if let Some(script) = &spec.model {
                    let double =
                        self::model::ModelDouble::start(script, &scenario.dir, transcript.clone())
                            .await?;
                    let mut model = json!({
                        "provider": script.provider,
                        "baseUrl": double.base_url(&script.provider),
                        "model": "ground-model",
                        "apiKeyEnv": "BOSUN_MODEL_KEY",
                        "timeoutSeconds": 30,
                    });
                    self::bosun::merge(&mut model, &script.config);
                    self::bosun::merge(&mut overrides, &json!({ "model": model }));
                    env.push((
                        "BOSUN_MODEL_KEY".to_string(),
                        self::model::MODEL_KEY.to_string(),
                    ));
                    transcript.say(
                        "model",
                        format!(
                            "a scripted {} model with {} replies",
                            script.provider,
                            script.replies.len()
                        ),
                    );
                    model_double = Some(double);
                }
                // Release notes: the registries the scenario scripts map to the OCI double and
                // GitHub's API to the forge double; with nothing scripted, Bosun reads none
                // (no network here).
                if scenario.images.is_empty() {
                    self::bosun::merge(
                        &mut overrides,
                        &json!({"releaseNotes": {"enabled": false}}),
                    );
                } else {
                    let double = self::oci::OciRegistryDouble::start(&scenario.images).await?;
                    let mut hosts: Vec<String> = scenario
                        .images
                        .iter()
                        .filter_map(|i| i.repository.split_once('/').map(|(h, _)| h.to_string()))
                        .collect();
                    hosts.sort();
                    hosts.dedup();
                    let registries: Vec<serde_json::Value> = hosts
                        .iter()
                        .map(|h| json!({"host": h, "url": double.url()}))
                        .collect();
                    let mut notes = json!({"releaseNotes": {
                        "registries": registries,
                        "githubApiUrl": forge.url(),
                        "sourceHosts": ["github.com"],
                    }});
                    // The scenario's own settings win (an allowlist that leaves a host out).
                    self::bosun::merge(&mut notes, &overrides);
                    overrides = notes;
                    oci_double = Some(double);
                }
                let process = self::bosun::BosunProcess::start(self::bosun::Launch {
                    binary: &binary,
                    dir: dir.path(),
                    forge_url: &forge.url(),
                    forge_token: FORGE_BOSUN_TOKEN,
                    slug: &repository.slug,
                    repo_url: &repository.url,
                    bare: &forge
                        .bare_path(&repository.slug)
                        .context("bare repository")?,
                    kubeconfig: &bosun_kubeconfig,
                    tools: &options.tools,
                    chart_mirrors: ci.chart_repo_mirrors.clone(),
                    charts: &charts_mirror,
                    overrides: &overrides,
                    poll: spec.poll,
                    env,
                })
                .await?;
                kargo
                    .http_aliases
                    .insert(self::bosun::BOSUN_ALIAS.to_string(), process.url.clone());
                kargo.secrets.insert(
                    "bosun".into(),
                    json!({"token": self::bosun::WEBHOOK_SECRET}),
                );
                ci.enabled = false;
                transcript.say(
                    "bosun",
                    "serving the intake at https://bosun.example.test (the gate runs inside Bosun)",
                );
                Some(process)
            }
        };

        let prometheus = self::prometheus::PrometheusDouble::start(kube.clone()).await?;
        let mut rollouts = self::rollouts::Rollouts::default();
        rollouts
            .http_aliases
            .insert(PROMETHEUS_URL.to_string(), prometheus.url());
        Ok(Ground {
            scenario,
            kube,
            forge,
            chart_repositories,
            kargo,
            argocd,
            ci,
            bosun,
            model: model_double,
            oci: oci_double,
            rollouts,
            prometheus,
            transcript,
            kubeconfig,
            admin_kubeconfig,
            charts_mirror,
            observer_binary: options.observer.clone(),
            observers: Vec::new(),
            observer_starts: 0,
            ticks: 0,
            exemptions: Default::default(),
            seed: (!options.faults.is_quiet()).then_some(options.faults.seed),
            dir,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every invariant the ground's state breaks now (see `invariants`).
    pub fn violations(&self) -> Vec<String> {
        invariants::violations_with(
            &self.kube,
            &self.forge,
            &self.scenario.kargo.project,
            &self.scenario.repository.slug,
            &self.exemptions,
        )
    }

    /// Stops the run when an invariant is broken, naming the seed, the tick and the
    /// transcript's tail.
    fn check_invariants(&self) -> Result<()> {
        let violations = self.violations();
        if violations.is_empty() {
            return Ok(());
        }
        let lines = self.transcript.lines();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        bail!(
            "invariant violated at tick {} (fault seed {}):\n  {}\ntranscript tail:\n{tail}",
            self.ticks,
            self.seed
                .map_or_else(|| "none".to_string(), |s| s.to_string()),
            violations.join("\n  ")
        )
    }

    /// One round of every actor, in a fixed order. True when anything changed.
    pub async fn tick(&mut self) -> bool {
        let kargo = self.kargo.tick(&self.kube, &self.transcript).await;
        let ci = self.ci.tick(&self.forge, &self.transcript).await;
        let argocd = self.argocd.tick(&self.kube, &self.transcript).await;
        let rollouts = self.rollouts.tick(&self.kube, &self.transcript).await;
        let bosun = match &mut self.bosun {
            Some(bosun) => bosun.tick(&self.transcript).await,
            None => false,
        };
        kargo || ci || argocd || rollouts || bosun
    }

    pub async fn bosun_busy(&self) -> bool {
        match &self.bosun {
            Some(bosun) => bosun.busy().await,
            None => false,
        }
    }

    /// Runs the actors until nothing changes. A promotion or verification that keeps waiting
    /// gets a short grace (work outside the ground, such as the observer, may still land)
    /// before the ground counts as settled; the scenario's expectations judge the outcome.
    pub async fn settle(&mut self) -> Result<()> {
        let mut quiet = 0;
        let mut waiting = 0;
        loop {
            let changed = self.tick().await;
            self.ticks += 1;
            self.check_invariants()?;
            if changed {
                quiet = 0;
                waiting = 0;
                continue;
            }
            // Bosun renders twice per round: give it the time it takes (bounded).
            if self.bosun_busy().await && waiting < 4800 {
                waiting += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
                continue;
            }
            if self.kargo.busy() && waiting < 40 {
                waiting += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
                continue;
            }
            quiet += 1;
            if quiet >= 2 {
                return Ok(());
            }
        }
    }

    pub async fn act(&mut self, action: &Action) -> Result<()> {
        match action {
            Action::Say(text) => self.transcript.say("scenario", text),
            Action::Publish(entry) => {
                let (chart, version) = entry
                    .split_once('@')
                    .with_context(|| format!("publish takes chart@version, got {entry}"))?;
                let repository = self
                    .chart_repositories
                    .iter()
                    .find(|r| {
                        r.available()
                            .map(|a| a.contains(&(chart.to_string(), version.to_string())))
                            .unwrap_or(false)
                    })
                    .with_context(|| format!("no chart repository holds {entry}"))?;
                repository.publish(chart, version)?;
                self.transcript.say(
                    "charts",
                    format!("{chart} {version} published to {}", repository.alias),
                );
            }
            Action::Refresh(warehouse) => self.kargo.refresh(warehouse),
            Action::Push(push) => self.push(push)?,
            Action::StallRollout(app) => {
                self.argocd.holds.insert(app.clone(), Hold::RolloutStalled);
                self.transcript.say(
                    "scenario",
                    format!("the rollout of {app} will stall half-way"),
                );
            }
            Action::ScaleToZero(app) => {
                self.argocd.holds.insert(app.clone(), Hold::ScaledToZero);
                self.argocd.resync();
                self.transcript
                    .say("scenario", format!("{app} is scaled to zero"));
            }
            Action::DegradeAfterSync(app) => {
                self.argocd
                    .holds
                    .insert(app.clone(), self::argocd::Hold::DegradesAfterSync);
                self.transcript.say(
                    "scenario",
                    format!(
                        "{app}'s next version will pass its first health check, then crash-loop"
                    ),
                );
            }
            Action::Sync(app) => {
                let resource = self
                    .kube
                    .store()
                    .resource("argoproj.io", "v1alpha1", "applications")
                    .cloned()
                    .context("Argo CD's Applications are not served")?;
                self.kube
                    .store()
                    .patch(
                        &resource,
                        "argocd",
                        app,
                        self::kube::store::PatchBody::Merge(json!({"operation": {
                            "initiatedBy": {"username": "alice"}, "sync": {}}})),
                        &admin(),
                        false,
                    )
                    .map_err(|e| anyhow::anyhow!("sync {app}: {e}"))?;
                self.transcript
                    .say("scenario", format!("a person syncs {app} in Argo CD"));
            }
            Action::Settle => self.settle().await?,
            Action::Merge(merge) => self.merge(merge).await?,
            Action::Comment(comment) => self.comment(comment).await?,
            Action::PushImage(reference) => {
                let (name, digest) = reference
                    .split_once('@')
                    .map(|(n, d)| (n, d.to_string()))
                    .unwrap_or((reference.as_str(), String::new()));
                let (repo, tag) = name
                    .rsplit_once(':')
                    .with_context(|| format!("pushImage takes repo:tag, got {reference}"))?;
                self.kargo
                    .registry
                    .images
                    .entry(repo.to_string())
                    .or_default()
                    .push((tag.to_string(), digest));
                self.transcript
                    .say("registry", format!("{repo}:{tag} pushed"));
            }
            Action::StartObserver(args) => self.start_observer(args)?,
            Action::StopObserver => self.stop_observer()?,
            Action::AwaitObserversReady => {
                // Readiness needs no tick (the API double answers on its own), and the line is
                // said the moment it holds: before the actors run what a ready observer set
                // off, so the transcript's order does not depend on timing.
                let count = self.observers.len();
                let deadline = std::time::Instant::now() + Duration::from_secs(90);
                loop {
                    let ready = self.observers.iter().all(|(_, _, health)| {
                        http_get(health, "/readyz")
                            .lines()
                            .next()
                            .is_some_and(|status| status.contains(" 200 "))
                    });
                    if ready {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        bail!(
                            "timed out waiting for every observer's /readyz to answer 200; observer log:\n{}",
                            self.observer_log()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                self.transcript
                    .say("observer", format!("{count} of {count} ready (/readyz)"));
            }
            Action::AwaitPromotion(wanted) => {
                self.await_condition(
                    &format!(
                        "Stage {} to reach a {} Promotion",
                        wanted.stage, wanted.phase
                    ),
                    |ground| match wanted.count {
                        Some(count) => {
                            ground
                                .kargo_objects("promotions")
                                .iter()
                                .filter(|p| {
                                    p.pointer("/spec/stage").and_then(Value::as_str)
                                        == Some(wanted.stage.as_str())
                                })
                                .filter(|p| {
                                    p.pointer("/status/phase").and_then(Value::as_str)
                                        == Some(wanted.phase.as_str())
                                })
                                .count()
                                >= count
                        }
                        None => {
                            ground
                                .kargo_objects("stages")
                                .iter()
                                .find(|s| {
                                    s.pointer("/metadata/name").and_then(Value::as_str)
                                        == Some(wanted.stage.as_str())
                                })
                                .and_then(|s| {
                                    s.pointer("/status/lastPromotion/status/phase")
                                        .and_then(Value::as_str)
                                        .map(str::to_string)
                                })
                                .as_deref()
                                == Some(wanted.phase.as_str())
                        }
                    },
                )
                .await?;
            }
            Action::AwaitObserverMetric(wanted) => {
                let target = match (wanted.at_least, wanted.increase) {
                    (Some(at_least), _) => at_least,
                    (None, Some(increase)) => self.observer_metric(&wanted.name) + increase,
                    (None, None) => bail!("awaitObserverMetric needs atLeast or increase"),
                };
                let what = format!("observer metric {} >= {target}", wanted.name);
                self.await_condition(&what, |ground| {
                    ground.observer_metric(&wanted.name) >= target
                })
                .await?;
            }
            Action::ExpectPromotions(wanted) => {
                let count = self
                    .kargo_objects("promotions")
                    .iter()
                    .filter(|p| {
                        p.pointer("/spec/stage").and_then(Value::as_str)
                            == Some(wanted.stage.as_str())
                    })
                    .count();
                if count != wanted.count {
                    bail!(
                        "Stage {} has {count} Promotions at this point, expected {}",
                        wanted.stage,
                        wanted.count
                    );
                }
                self.transcript.say(
                    "scenario",
                    format!("Stage {} has {count} Promotions, as expected", wanted.stage),
                );
            }
            Action::AwaitEvents(wanted) => {
                self.await_condition(
                    &format!("{} {} Events", wanted.count, wanted.reason),
                    |ground| {
                        ground
                            .events(&wanted.reason)
                            .iter()
                            .map(|(_, count)| count)
                            .sum::<usize>()
                            >= wanted.count
                    },
                )
                .await?;
                // Which Application an Event lands on, and whether the recorder folds a repeat
                // into one Event, depend on reconcile order: the transcript says how many.
                let kinds: std::collections::BTreeSet<String> = self
                    .events(&wanted.reason)
                    .iter()
                    .filter_map(|(line, _)| {
                        line.split(" on ")
                            .nth(1)
                            .and_then(|rest| rest.split(' ').next())
                            .map(str::to_string)
                    })
                    .collect();
                self.transcript.say(
                    "events",
                    format!(
                        "{} {} recorded on {}",
                        wanted.count,
                        wanted.reason,
                        kinds.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                );
            }
        }
        Ok(())
    }

    /// Events (events.k8s.io) with a reason, as (`Type Reason on Kind ns/name: note`, how many
    /// times it was recorded: a repeated Event is one object with a series count).
    pub fn events(&self, reason: &str) -> Vec<(String, usize)> {
        let store = self.kube.store();
        let Some(resource) = store.resource("events.k8s.io", "v1", "events").cloned() else {
            return Vec::new();
        };
        store
            .list(&resource, "", &Selector::default(), &Selector::default())
            .into_iter()
            .filter(|e| e.get("reason").and_then(Value::as_str) == Some(reason))
            .map(|e| {
                let text = |p: &str| {
                    e.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                let count = e
                    .pointer("/series/count")
                    .and_then(Value::as_u64)
                    .unwrap_or(1)
                    .max(1) as usize;
                (
                    format!(
                        "{} {} on {} {}/{}: {}",
                        text("/type"),
                        text("/reason"),
                        text("/regarding/kind"),
                        text("/regarding/namespace"),
                        text("/regarding/name"),
                        text("/note")
                    ),
                    count,
                )
            })
            .collect()
    }

    /// Ticks the actors until `done` holds (bounded; the observer runs on its own meanwhile),
    /// checking the invariants after each tick, then lets them settle.
    pub async fn await_condition(
        &mut self,
        what: &str,
        done: impl Fn(&Ground) -> bool,
    ) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let progress = self.tick().await;
            self.ticks += 1;
            self.check_invariants()?;
            if done(self) {
                // Let the actors finish what the condition set off, unless something waits on
                // purpose (a promotion the scenario keeps running).
                return if self.kargo.busy() {
                    Ok(())
                } else {
                    self.settle().await
                };
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "timed out waiting for {what}; observer log:\n{}",
                    self.observer_log()
                );
            }
            if !progress {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    }

    /// The sum of a metric's samples (lines starting with `name`) over running observers.
    pub fn observer_metric(&self, name: &str) -> f64 {
        let mut total = 0.0;
        for (_, address, _) in &self.observers {
            let text = http_get(address, "/metrics");
            for line in text.lines().filter(|l| l.starts_with(name)) {
                total += line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
            }
        }
        total
    }

    fn observer_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("observer.log")).unwrap_or_default()
    }

    fn start_observer(&mut self, args: &[String]) -> Result<()> {
        let binary = self
            .observer_binary
            .clone()
            .context("this scenario starts the observer: pass its binary (--observer)")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("observer.log"))?;
        // Free loopback ports for its metrics and health servers.
        let port = || -> Result<String> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .to_string())
        };
        let (metrics_addr, health_addr) = (port()?, port()?);
        let child = std::process::Command::new(binary)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAME", format!("observer-{}", self.observer_starts))
            .env("POD_NAMESPACE", "kargo-observer")
            .env(
                "RUST_LOG",
                std::env::var("GROUND_OBSERVER_LOG")
                    .unwrap_or_else(|_| "info,kube=warn".to_string()),
            )
            .args([
                "--metrics-addr",
                &metrics_addr,
                "--health-addr",
                &health_addr,
                "--log-format",
                "text",
            ])
            // The ground's resync unless the scenario names one.
            .args(
                (!args.iter().any(|a| a.starts_with("--resync")))
                    .then_some(["--resync", "30s"])
                    .into_iter()
                    .flatten(),
            )
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start the observer")?;
        self.observer_starts += 1;
        self.observers.push((child, metrics_addr, health_addr));
        self.transcript.say(
            "observer",
            format!(
                "started{}",
                if args.is_empty() {
                    String::new()
                } else {
                    format!(" with {}", args.join(" "))
                }
            ),
        );
        Ok(())
    }

    /// Stops the first running observer (SIGTERM, as Kubernetes does).
    fn stop_observer(&mut self) -> Result<()> {
        if !self.observers.is_empty() {
            let (mut child, _, _) = self.observers.remove(0);
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let status = child.wait()?;
            if !status.success() {
                eprintln!(
                    "observer exited with {status}; its log:\n{}",
                    self.observer_log()
                );
            }
            self.transcript.say(
                "observer",
                format!(
                    "stopped ({})",
                    if status.success() {
                        "clean exit"
                    } else {
                        "killed"
                    }
                ),
            );
        }
        Ok(())
    }

    pub fn forge_token(login: &str) -> Result<&'static str> {
        FORGE_USERS
            .iter()
            .find(|(_, l)| *l == login)
            .map(|(token, _)| *token)
            .with_context(|| format!("the forge double has no user {login}"))
    }

    /// A person merges through the forge's API; branch protection decides.
    async fn merge(&mut self, merge: &scenario::Merge) -> Result<()> {
        let token = Self::forge_token(&merge.by)?;
        let response = reqwest::Client::new()
            .put(format!(
                "{}/repos/{}/pulls/{}/merge",
                self.forge.url(),
                self.scenario.repository.slug,
                merge.pr
            ))
            .bearer_auth(token)
            .json(&json!({"merge_method": "merge"}))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let said = if status.is_success() {
            format!("{} merged #{}", merge.by, merge.pr)
        } else {
            format!(
                "{} could not merge #{}: {} ({})",
                merge.by,
                merge.pr,
                body["message"].as_str().unwrap_or(""),
                status.as_u16()
            )
        };
        self.transcript.say("forge", said);
        Ok(())
    }

    /// A person comments (a scenario uses it to spoof a report).
    async fn comment(&mut self, comment: &scenario::CommentSpec) -> Result<()> {
        let token = Self::forge_token(&comment.by)?;
        let body = std::fs::read_to_string(self.scenario.path(&comment.body_file))
            .with_context(|| format!("comment body {}", comment.body_file))?;
        let forge = gitops_loop::forge::github::GitHub::new(&self.forge.url(), token)?;
        let slug: gitops_loop::forge::RepoSlug = self
            .scenario
            .repository
            .slug
            .parse()
            .map_err(|e: String| anyhow::anyhow!(e))?;
        gitops_loop::forge::Forge::create_comment(&forge, &slug, comment.pr, &body).await?;
        self.transcript.say(
            "forge",
            format!(
                "{} commented on #{} ({})",
                comment.by, comment.pr, comment.body_file
            ),
        );
        Ok(())
    }

    /// A person commits a folder of files over `branch` (created from `from` when missing)
    /// and pushes it. Returns the commit.
    pub fn commit_overlay(
        &self,
        branch: &str,
        from: &str,
        overlay: &Path,
        message: &str,
    ) -> Result<String> {
        let work = self.person_clone(from, "person-overlay")?;
        if branch != from {
            git::git(&work, &["checkout", "--quiet", "-B", branch])?;
        }
        git::copy_tree(overlay, &work)?;
        git::git(&work, &["add", "--all"])?;
        git::git(&work, &["commit", "--quiet", "-m", message])?;
        git::git(&work, &["push", "--quiet", "origin", branch])?;
        git::git(&work, &["rev-parse", "HEAD"])
    }

    /// A person opens a pull request through the forge's API. Returns its number.
    pub async fn open_pull(&self, head: &str, title: &str, by: &str) -> Result<u64> {
        let response = reqwest::Client::new()
            .post(format!(
                "{}/repos/{}/pulls",
                self.forge.url(),
                self.scenario.repository.slug
            ))
            .bearer_auth(Self::forge_token(by)?)
            .json(&json!({"head": head, "base": "main", "title": title}))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if !status.is_success() {
            bail!("cannot open a pull request from {head}: {status} {body}");
        }
        body["number"].as_u64().context("pull request number")
    }

    /// A fresh clone of the scenario's repository at `branch`, as a person makes it, in the
    /// ground's folder `folder`.
    fn person_clone(&self, branch: &str, folder: &str) -> Result<PathBuf> {
        let url = self
            .forge
            .http_git_url_as(&self.scenario.repository.slug, FORGE_PERSON_TOKEN);
        let work = self.dir.path().join(folder);
        let _ = std::fs::remove_dir_all(&work);
        git::git(
            self.dir.path(),
            &["clone", "--quiet", "--branch", branch, &url, folder],
        )?;
        Ok(work)
    }

    fn push(&mut self, push: &scenario::Push) -> Result<()> {
        let work = self.person_clone(&push.branch, "person")?;
        let mut changes = Vec::new();
        for (file, keys) in &push.set {
            let path = work.join(file);
            let mut text = std::fs::read_to_string(&path).with_context(|| file.to_string())?;
            for (key, value) in keys {
                let segments = gitops_loop::yaml::edit::parse_key_path(key);
                let sites = gitops_loop::yaml::edit::scalar_sites(&text, file)?;
                let site = gitops_loop::yaml::edit::find_site(&sites, 0, &segments)
                    .with_context(|| format!("{file}: no value at {key}"))?
                    .clone();
                changes.push(format!("{file} {key}: {} -> {value}", site.value));
                text = gitops_loop::yaml::edit::splice(
                    &text,
                    &[(
                        site.start,
                        site.end,
                        gitops_loop::yaml::edit::render_scalar(value, site.quoted),
                    )],
                );
            }
            std::fs::write(&path, text)?;
        }
        git::git(
            &work,
            &[
                "-c",
                "user.name=Alice",
                "-c",
                "user.email=alice@example.test",
                "commit",
                "--quiet",
                "-am",
                &push.message,
            ],
        )?;
        git::git(&work, &["push", "--quiet", "origin", &push.branch])?;
        let commit = git::git(&work, &["rev-parse", "HEAD"])?;
        self.transcript.say(
            "person",
            format!(
                "alice pushed {} to {}: {} ({})",
                &commit[..7],
                push.branch,
                push.message,
                changes.join(", ")
            ),
        );
        Ok(())
    }

    /// Plays the whole timeline, then checks the scenario's expectations.
    pub async fn play(&mut self) -> Result<()> {
        let timeline = self.scenario.timeline.clone();
        for action in &timeline {
            self.act(action).await?;
        }
        let failures = self.unmet_expectations();
        if !failures.is_empty() {
            bail!(
                "the scenario's expectations do not hold:\n  {}\nobserver log:\n{}",
                failures.join("\n  "),
                self.observer_log()
            );
        }
        Ok(())
    }

    fn kargo_objects(&self, plural: &str) -> Vec<Value> {
        let store = self.kube.store();
        let Some(resource) = store
            .resource(kargo::GROUP, kargo::VERSION, plural)
            .cloned()
        else {
            return Vec::new();
        };
        store.list(
            &resource,
            &self.scenario.kargo.project,
            &Selector::default(),
            &Selector::default(),
        )
    }

    pub fn unmet_expectations(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let expect = &self.scenario.expect;
        let stages = self.kargo_objects("stages");
        for (stage, phase) in &expect.promotions {
            let last = stages
                .iter()
                .find(|s| s.pointer("/metadata/name").and_then(Value::as_str) == Some(stage))
                .and_then(|s| {
                    s.pointer("/status/lastPromotion/status/phase")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
            if last.as_deref() != Some(phase.as_str()) {
                failures.push(format!(
                    "Stage {stage}: last promotion {last:?}, expected {phase}"
                ));
            }
        }
        for stage in &expect.verified {
            let verified = stages
                .iter()
                .find(|s| s.pointer("/metadata/name").and_then(Value::as_str) == Some(stage))
                .and_then(|s| {
                    s.pointer("/status/freightHistory/0/verificationHistory/0/phase")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
            if verified.as_deref() != Some("Successful") {
                failures.push(format!("Stage {stage}: not verified"));
            }
        }
        let promotions = self.kargo_objects("promotions");
        for (stage, count) in &expect.promotion_count {
            let actual = promotions
                .iter()
                .filter(|p| p.pointer("/spec/stage").and_then(Value::as_str) == Some(stage))
                .count();
            if actual != *count {
                failures.push(format!(
                    "Stage {stage}: {actual} Promotions, expected {count}"
                ));
            }
        }
        if let Some(model) = &self.model {
            failures.extend(
                model
                    .failures()
                    .into_iter()
                    .map(|f| format!("model double: {f}")),
            );
            if model.unused() > 0 {
                failures.push(format!(
                    "model double: {} scripted repl{} never asked for",
                    model.unused(),
                    if model.unused() == 1 {
                        "y was"
                    } else {
                        "ies were"
                    }
                ));
            }
        }
        let pulls = self.forge.open_pulls(&self.scenario.repository.slug);
        for number in &expect.merged {
            if pulls.iter().any(|(n, _, _)| n == number) {
                failures.push(format!("pull request #{number} is still open"));
            }
        }
        for number in &expect.open {
            if !pulls.iter().any(|(n, _, _)| n == number) {
                failures.push(format!("pull request #{number} is not open"));
            }
        }
        for (number, labels) in &expect.labels {
            let have = self.forge.labels(&self.scenario.repository.slug, *number);
            for label in labels {
                if !have.contains(label) {
                    failures.push(format!(
                        "pull request #{number} has no label {label} (has {})",
                        have.join(", ")
                    ));
                }
            }
        }
        failures
    }

    /// A JSON summary of the end state (Stages and Promotions), for snapshots.
    pub fn kargo_state(&self) -> Value {
        let pick = |objects: Vec<Value>, fields: &[&str]| -> Vec<Value> {
            objects
                .into_iter()
                .map(|o| {
                    let mut out = serde_json::Map::new();
                    for field in fields {
                        if let Some(v) = o.pointer(field) {
                            out.insert(field.to_string(), v.clone());
                        }
                    }
                    Value::Object(out)
                })
                .collect()
        };
        json!({
            "stages": pick(self.kargo_objects("stages"), &["/metadata/name", "/status/freightHistory", "/status/lastPromotion/name", "/status/lastPromotion/status/phase"]),
            "promotions": pick(self.kargo_objects("promotions"), &["/metadata/name", "/metadata/labels", "/metadata/annotations", "/spec/stage", "/spec/freight", "/status/phase"]),
        })
    }
}

/// The raw response to a plain HTTP/1.0 GET on loopback ("" when nothing answers).
pub(crate) fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(address) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}
