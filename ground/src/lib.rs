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
pub mod charts;
pub mod ci;
pub mod forge;
pub mod git;
pub mod kargo;
pub mod kube;
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

pub struct Options {
    /// The real `gate` binary the CI job runs.
    pub gate: PathBuf,
    /// The folder with the pinned `helm` and `kubectl`.
    pub tools: PathBuf,
    /// The project's CRDs (kind/crds).
    pub crds: PathBuf,
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
    pub transcript: Transcript,
    /// kubeconfig for the observer's identity.
    pub kubeconfig: PathBuf,
    /// kubeconfig for an administrator (kubectl).
    pub admin_kubeconfig: PathBuf,
    pub charts_mirror: PathBuf,
    dir: tempfile::TempDir,
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
        };
        let kubectl = Tool {
            name: "kubectl",
            path: options.tools.join("kubectl"),
            source: ToolSource::Flag,
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
        forge.add_user(FORGE_KARGO_TOKEN, "kargo");
        forge.add_user(FORGE_GATE_TOKEN, "addons-gate[bot]");
        forge.add_user(FORGE_PERSON_TOKEN, "alice");
        forge.add_user(FORGE_BOSUN_TOKEN, "bosun[bot]");
        let repository = &scenario.repository;
        let git_url = forge.create_repo(&repository.slug, &scenario.path(&repository.content))?;
        for (branch, checks) in &repository.protect {
            let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
            forge.protect(&repository.slug, branch, &checks);
        }
        let bare = forge
            .bare_path(&repository.slug)
            .context("bare repository")?;

        // Chart repositories, and the mirror the gate and Argo CD read (unpublished left out).
        let mirror_source = scenario.path(&scenario.charts.mirror);
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
            pull_missing_charts: false,
            chart_repo_mirrors: Vec::new(),
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
        kargo.git_repos.insert(
            repository.url.clone(),
            (repository.slug.clone(), git_url.clone()),
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
        let objects_path = scenario.path(&scenario.kargo.objects);
        let text = std::fs::read_to_string(&objects_path)?;
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
            &git_url,
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

        Ok(Ground {
            scenario,
            kube,
            forge,
            chart_repositories,
            kargo,
            argocd,
            ci,
            transcript,
            kubeconfig,
            admin_kubeconfig,
            charts_mirror,
            dir,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// One round of every actor, in a fixed order. True when anything changed.
    pub async fn tick(&mut self) -> bool {
        let kargo = self.kargo.tick(&self.kube, &self.transcript).await;
        let ci = self.ci.tick(&self.forge, &self.transcript).await;
        let argocd = self.argocd.tick(&self.kube, &self.transcript).await;
        kargo || ci || argocd
    }

    /// Runs the actors until nothing changes and nothing is in flight.
    pub async fn settle(&mut self) -> Result<()> {
        let mut quiet = 0;
        let mut waiting = 0;
        loop {
            if self.tick().await {
                quiet = 0;
                waiting = 0;
                continue;
            }
            if self.kargo.busy() {
                waiting += 1;
                if waiting > 300 {
                    bail!(
                        "the ground did not settle: a promotion or verification is still waiting after {waiting} rounds"
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
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
            Action::Settle => self.settle().await?,
        }
        Ok(())
    }

    fn push(&mut self, push: &scenario::Push) -> Result<()> {
        let url = self
            .forge
            .git_url(&self.scenario.repository.slug)
            .context("repository")?;
        let work = self.dir.path().join("person");
        let _ = std::fs::remove_dir_all(&work);
        git::git(
            self.dir.path(),
            &["clone", "--quiet", "--branch", &push.branch, &url, "person"],
        )?;
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
                "the scenario's expectations do not hold:\n  {}",
                failures.join("\n  ")
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
        let pulls = self.forge.open_pulls(&self.scenario.repository.slug);
        for number in &expect.merged {
            if pulls.iter().any(|(n, _, _)| n == number) {
                failures.push(format!("pull request #{number} is still open"));
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
