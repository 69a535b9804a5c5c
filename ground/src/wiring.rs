//! Wiring: `Ground::start` builds every double and actor from a scenario.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use gitops_loop::render::RenderConfig;
use gitops_loop::render::inventory::Inventory;
use serde_json::{Value, json};

use crate::argocd::ArgoCd;
use crate::charts::ChartRepositoryDouble;
use crate::ci::Ci;
use crate::forge::ForgeDouble;
use crate::kargo::Kargo;
use crate::kube::KubeDouble;
use crate::kube::store::User;
use crate::scenario::{BosunSpec, Scenario};
use crate::transcript::Transcript;
use crate::{
    BOSUN_USER, FORGE_BOSUN_TOKEN, FORGE_GATE_TOKEN, FORGE_KARGO_TOKEN, FORGE_USERS, Ground,
    KUBE_ADMIN_TOKEN, KUBE_BOSUN_TOKEN, KUBE_OBSERVER_TOKEN, OBSERVER_USER, Options,
    PROMETHEUS_URL, bosun, forge, git, kargo, model, oci, prometheus, rollouts,
};

pub(crate) fn admin() -> User {
    User {
        name: "system:admin".into(),
        groups: vec!["system:masters".into()],
    }
}

pub(crate) fn copy_mirror(from: &Path, to: &Path, unpublished: &[(String, String)]) -> Result<()> {
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
        let (kube, kubeconfig, admin_kubeconfig) =
            start_cluster(&scenario, &options, dir.path()).await?;
        let (forge, bare) = start_forge(&scenario, &kube, dir.path()).await?;
        let (chart_repositories, charts_mirror) =
            start_chart_repositories(&scenario, &options, dir.path()).await?;
        let inventory_path = scenario.path(&scenario.inventory);
        let render_config = argocd_render_config(
            &scenario,
            &options,
            dir.path(),
            &inventory_path,
            &bare,
            &charts_mirror,
        )?;
        let argocd = ArgoCd::new(render_config, bare, "main");

        let mut kargo = start_kargo(&scenario, &kube, &forge, &chart_repositories, dir.path());
        create_kargo_objects(&scenario, &options, &kube, dir.path())?;
        if scenario.forge == crate::scenario::Face::Gitlab {
            transcript.say(
                "forge",
                "GitLab's face: Kargo's provider, Bosun and people speak /api/v4 (merge requests, notes, commit statuses)",
            );
        }
        kargo.bootstrap(&kube, &transcript);

        let mut ci = start_ci(
            &scenario,
            &options,
            &forge,
            &chart_repositories,
            inventory_path,
            &charts_mirror,
            dir.path(),
        );
        ci.gitlab = scenario.forge == crate::scenario::Face::Gitlab;

        // Source repositories' releases, on the forge double's GitHub API.
        for release in &scenario.releases {
            forge.add_release(
                &release.repository,
                &release.tag,
                &release.name,
                &release.body,
            );
        }
        let (bosun, model_double, oci_double) = match &scenario.bosun {
            None => (None, None, None),
            Some(spec) => {
                let started = start_bosun(
                    spec,
                    &Wired {
                        scenario: &scenario,
                        options: &options,
                        kube: &kube,
                        forge: &forge,
                        charts_mirror: &charts_mirror,
                        transcript: &transcript,
                        dir: dir.path(),
                    },
                    &mut kargo,
                    &mut ci,
                )
                .await?;
                (Some(started.process), started.model, started.oci)
            }
        };

        // The forge's faults ride in the same plan, from here on: setting up the ground is
        // not part of the story.
        forge.set_faults(self::forge::ForgeFaults {
            seed: options.faults.seed,
            server_error: options.faults.forge_server_error,
            rate_limit: options.faults.forge_rate_limit,
        });
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
            bosun_killed: None,
            exemptions: Default::default(),
            ledger: None,
            observer_args: Vec::new(),
            seed: (!options.faults.is_quiet()).then_some(options.faults.seed),
            dir,
        })
    }
}

/// The cluster: API double, CRDs, namespaces, identities, Kargo's webhooks; returns the
/// double with the observer's and the administrator's kubeconfigs.
async fn start_cluster(
    scenario: &Scenario,
    options: &Options,
    dir: &Path,
) -> Result<(KubeDouble, PathBuf, PathBuf)> {
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
        &dir.join("kubeconfig"),
        OBSERVER_USER,
        KUBE_OBSERVER_TOKEN,
        &scenario.kargo.project,
    )?;
    let admin_kubeconfig = kube.write_kubeconfig(
        &dir.join("admin.kubeconfig"),
        "system:admin",
        KUBE_ADMIN_TOKEN,
        &scenario.kargo.project,
    )?;
    Ok((kube, kubeconfig, admin_kubeconfig))
}

/// The forge: the repository, its protection, the people and bots; returns the double with
/// the repository's bare path.
async fn start_forge(
    scenario: &Scenario,
    kube: &KubeDouble,
    dir: &Path,
) -> Result<(ForgeDouble, PathBuf)> {
    let forge = ForgeDouble::start(Some(&dir.join("forge"))).await?;
    forge.set_clock(kube.clock());
    for (token, login) in FORGE_USERS {
        forge.add_user(token, login);
    }
    let repository = &scenario.repository;
    let content = match &repository.overlay {
        None => scenario.path(&repository.content),
        Some(overlay) => {
            let merged = dir.join("repository-content");
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
    Ok((forge, bare))
}

/// Chart repositories, and the mirror the gate and Argo CD read (unpublished left out).
async fn start_chart_repositories(
    scenario: &Scenario,
    options: &Options,
    dir: &Path,
) -> Result<(Vec<Arc<ChartRepositoryDouble>>, PathBuf)> {
    let helm = options.tools.join("helm");
    let mirror_source = match &scenario.charts.overlay {
        None => scenario.path(&scenario.charts.mirror),
        Some(overlay) => {
            let merged = dir.join("chart-sources");
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
            &helm,
            &spec.unpublished,
        )
        .await?;
        unpublished.extend(spec.unpublished.iter().map(|u| (key.clone(), u.clone())));
        chart_repositories.push(Arc::new(repo));
    }
    let charts_mirror = dir.join("charts");
    copy_mirror(&mirror_source, &charts_mirror, &unpublished)?;
    Ok((chart_repositories, charts_mirror))
}

/// What Argo CD's render reads: the forge's bare repository, the scenario's inventory, the
/// chart mirror, the pinned tools and a cache apart from the gate's.
fn argocd_render_config(
    scenario: &Scenario,
    options: &Options,
    dir: &Path,
    inventory_path: &Path,
    bare: &Path,
    charts_mirror: &Path,
) -> Result<RenderConfig> {
    let inventory = Inventory::parse(
        &std::fs::read_to_string(inventory_path)?,
        &inventory_path.display().to_string(),
    )?;
    Ok(crate::argocd::render_config(
        bare.to_path_buf(),
        scenario.repository.url.clone(),
        inventory,
        charts_mirror.to_path_buf(),
        &options.tools,
        options
            .render_cache
            .as_ref()
            .map_or_else(|| dir.join("argocd-cache"), |shared| shared.join("argocd")),
    ))
}

/// Kargo: webhooks, grants, chart discovery through the chart repository doubles, git over
/// the forge with its own token, the registry's images.
fn start_kargo(
    scenario: &Scenario,
    kube: &KubeDouble,
    forge: &ForgeDouble,
    chart_repositories: &[Arc<ChartRepositoryDouble>],
    dir: &Path,
) -> Kargo {
    let repository = &scenario.repository;
    let mut kargo = Kargo::new(
        &scenario.kargo.project,
        &dir.join("kargo"),
        &forge.url(),
        FORGE_KARGO_TOKEN,
    );
    kargo::install_webhooks(kube, kargo.grants.clone());
    for (user, stages) in &scenario.kargo.grants {
        for stage in stages {
            kargo.grants.allow(user, &scenario.kargo.project, stage);
        }
    }
    let repos = chart_repositories.to_vec();
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
    kargo
}

/// The Kargo objects' text and where it came from: the kargo-pipelines chart rendered with
/// the real helm from the scenario's values, or hand-written YAML.
fn kargo_objects(scenario: &Scenario, options: &Options, dir: &Path) -> Result<(PathBuf, String)> {
    match (&scenario.kargo.pipelines, &scenario.kargo.objects) {
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
                // On GitLab's face the pull request steps use Kargo's GitLab provider.
                .args(match scenario.forge {
                    crate::scenario::Face::Gitlab => &["--set", "gitops.provider=gitlab"][..],
                    crate::scenario::Face::Github => &[],
                })
                .env("HELM_CACHE_HOME", dir.join("helm-cache"))
                .env("HELM_CONFIG_HOME", dir.join("helm-config"))
                .env("HELM_DATA_HOME", dir.join("helm-data"))
                .output()
                .with_context(|| format!("helm template {}", chart.display()))?;
            if !output.status.success() {
                anyhow::bail!(
                    "{}: the kargo-pipelines chart refused these values: {}",
                    values.display(),
                    String::from_utf8_lossy(&output.stderr).trim()
                );
            }
            Ok((values, String::from_utf8_lossy(&output.stdout).into_owned()))
        }
        (None, Some(objects)) => {
            let path = scenario.path(objects);
            let text = std::fs::read_to_string(&path)?;
            Ok((path, text))
        }
        _ => {
            anyhow::bail!("kargo: give exactly one of `pipelines` (chart values) or `objects`")
        }
    }
}

/// Creates the Kargo objects in the project's namespace as the administrator.
fn create_kargo_objects(
    scenario: &Scenario,
    options: &Options,
    kube: &KubeDouble,
    dir: &Path,
) -> Result<()> {
    let (objects_path, text) = kargo_objects(scenario, options, dir)?;
    for object in gitops_loop::yaml::parse_documents(&text, &objects_path.display().to_string())? {
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
    Ok(())
}

/// The CI job that runs the real gate on pull requests, reaching the chart repository doubles.
fn start_ci(
    scenario: &Scenario,
    options: &Options,
    forge: &ForgeDouble,
    chart_repositories: &[Arc<ChartRepositoryDouble>],
    inventory_path: PathBuf,
    charts_mirror: &Path,
    dir: &Path,
) -> Ci {
    let repository = &scenario.repository;
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
        charts_mirror.to_path_buf(),
        dir.join("ci"),
    );
    if let Some(shared) = &options.render_cache {
        ci.cache = shared.join("ci");
    }
    ci.chart_repo_mirrors = chart_repositories
        .iter()
        .map(|r| (r.alias.clone(), r.url()))
        .collect();
    ci
}

/// What Bosun's start reads of the ground wired so far.
struct Wired<'a> {
    scenario: &'a Scenario,
    options: &'a Options,
    kube: &'a KubeDouble,
    forge: &'a ForgeDouble,
    charts_mirror: &'a Path,
    transcript: &'a Transcript,
    dir: &'a Path,
}

/// The real `bosun serve` and the doubles started for it alone.
struct StartedBosun {
    process: bosun::BosunProcess,
    model: Option<model::ModelDouble>,
    oci: Option<oci::OciRegistryDouble>,
}

/// Starts the real `bosun serve` as the gate runner: its live inventory, its model and release
/// notes' doubles, Kargo's alias and secret for its webhook; the CI job stands down.
async fn start_bosun(
    spec: &BosunSpec,
    wired: &Wired<'_>,
    kargo: &mut Kargo,
    ci: &mut Ci,
) -> Result<StartedBosun> {
    let Wired {
        scenario,
        options,
        kube,
        forge,
        charts_mirror,
        transcript,
        dir,
    } = *wired;
    let repository = &scenario.repository;
    let binary = options
        .bosun
        .clone()
        .context("this scenario runs Bosun: pass its binary")?;
    create_cluster_secrets(kube, &ci.inventory)?;
    kube.add_user(KUBE_BOSUN_TOKEN, BOSUN_USER, &["system:serviceaccounts"]);
    let bosun_kubeconfig = kube.write_kubeconfig(
        &dir.join("bosun.kubeconfig"),
        BOSUN_USER,
        KUBE_BOSUN_TOKEN,
        "argocd",
    )?;
    let mut overrides = spec.config.clone();
    let mut env = Vec::new();
    let model_double = match &spec.model {
        Some(script) => Some(
            start_model(
                script,
                scenario,
                options,
                transcript,
                &mut overrides,
                &mut env,
            )
            .await?,
        ),
        None => None,
    };
    let oci_double = release_notes(scenario, forge, &mut overrides).await?;
    let process = bosun::BosunProcess::start(bosun::Launch {
        binary: &binary,
        dir,
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
        charts: charts_mirror,
        overrides: &overrides,
        gitlab: scenario.forge == crate::scenario::Face::Gitlab,
        poll: spec.poll,
        env,
        // Bosun renders the heads the gate runner renders: one cache for both, when asked.
        render_cache: options
            .render_cache
            .as_ref()
            .filter(|_| options.bosun_shares_render_cache)
            .map(|shared| shared.join("ci")),
    })
    .await?;
    kargo
        .http_aliases
        .insert(bosun::BOSUN_ALIAS.to_string(), process.url.clone());
    kargo
        .secrets
        .insert("bosun".into(), json!({"token": bosun::WEBHOOK_SECRET}));
    ci.enabled = false;
    transcript.say(
        "bosun",
        "serving the intake at https://bosun.example.test (the gate runs inside Bosun)",
    );
    Ok(StartedBosun {
        process,
        model: model_double,
        oci: oci_double,
    })
}

/// Argo CD's cluster Secrets, annotated as the project reads them: Bosun's inventory is live,
/// read through the API double.
fn create_cluster_secrets(kube: &KubeDouble, inventory_path: &Path) -> Result<()> {
    let inventory = Inventory::parse(
        &std::fs::read_to_string(inventory_path)?,
        &inventory_path.display().to_string(),
    )?;
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
    Ok(())
}

/// The scripted model double, merged into Bosun's settings with the key it expects.
async fn start_model(
    script: &model::ModelScript,
    scenario: &Scenario,
    options: &Options,
    transcript: &Transcript,
    overrides: &mut Value,
    env: &mut Vec<(String, String)>,
) -> Result<model::ModelDouble> {
    let double = model::ModelDouble::start(script, &scenario.dir, transcript.clone()).await?;
    // Under seeded model timeouts Bosun gives up on a held call after 3 s.
    double.set_timeouts(options.faults.seed, options.faults.model_timeout);
    let mut model = json!({
        "provider": script.provider,
        "baseUrl": double.base_url(&script.provider),
        "model": "ground-model",
        "apiKeyEnv": "BOSUN_MODEL_KEY",
        "timeoutSeconds": if options.faults.model_timeout > 0 { 3 } else { 30 },
    });
    bosun::merge(&mut model, &script.config);
    bosun::merge(overrides, &json!({ "model": model }));
    env.push(("BOSUN_MODEL_KEY".to_string(), model::MODEL_KEY.to_string()));
    transcript.say(
        "model",
        format!(
            "a scripted {} model with {} replies",
            script.provider,
            script.replies.len()
        ),
    );
    Ok(double)
}

/// Release notes: the registries the scenario scripts map to the OCI double and GitHub's API
/// to the forge double; with nothing scripted, Bosun reads none (no network here).
async fn release_notes(
    scenario: &Scenario,
    forge: &ForgeDouble,
    overrides: &mut Value,
) -> Result<Option<oci::OciRegistryDouble>> {
    if scenario.images.is_empty() {
        bosun::merge(overrides, &json!({"releaseNotes": {"enabled": false}}));
        return Ok(None);
    }
    let double = oci::OciRegistryDouble::start(&scenario.images).await?;
    let mut hosts: Vec<String> = scenario
        .images
        .iter()
        .filter_map(|i| i.repository.split_once('/').map(|(h, _)| h.to_string()))
        .collect();
    hosts.sort();
    hosts.dedup();
    let registries: Vec<Value> = hosts
        .iter()
        .map(|h| json!({"host": h, "url": double.url()}))
        .collect();
    let mut notes = json!({"releaseNotes": {
        "registries": registries,
        "githubApiUrl": forge.url(),
        "sourceHosts": ["github.com"],
    }});
    // The scenario's own settings win (an allowlist that leaves a host out).
    bosun::merge(&mut notes, overrides);
    *overrides = notes;
    Ok(Some(double))
}
