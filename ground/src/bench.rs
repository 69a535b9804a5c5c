//! `ground bench-observer`: the observer against N Applications and M Stages on the API double.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::kargo;
use crate::kube::store::{PatchBody, Resource, Selector, User};
use crate::kube::{FaultPlan, KubeDouble};

pub struct Figures {
    pub applications: usize,
    pub stages: usize,
    pub setup: Duration,
    pub first_pass: Duration,
    pub change_to_promotion: Duration,
    pub peak_rss_kib: u64,
}

fn admin() -> User {
    User {
        name: "system:admin".into(),
        groups: vec!["system:masters".into()],
    }
}

fn metric(address: &str, name: &str) -> f64 {
    crate::http_get(address, "/metrics")
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn peak_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| {
                l["VmHWM:".len()..]
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0)
}

pub async fn observer(
    observer: &std::path::Path,
    crds: &std::path::Path,
    applications: usize,
    stages: usize,
) -> Result<Figures> {
    let started = Instant::now();
    let kube = KubeDouble::start(FaultPlan::none()).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = prepare_api(&kube, crds, dir.path())?;
    let resource = |group: &str, version: &str, plural: &str| {
        kube.store()
            .resource(group, version, plural)
            .cloned()
            .context("resource")
    };
    let (warehouses, freights, stage_resource, apps) = (
        resource(kargo::GROUP, kargo::VERSION, "warehouses")?,
        resource(kargo::GROUP, kargo::VERSION, "freights")?,
        resource(kargo::GROUP, kargo::VERSION, "stages")?,
        resource("argoproj.io", "v1alpha1", "applications")?,
    );
    let v2_freight = seed_stages(&kube, stages, &warehouses, &freights, &stage_resource)?;
    seed_applications(&kube, &apps, applications, stages)?;
    let setup = started.elapsed();

    let (mut child, metrics_addr) = launch_observer(observer, &kubeconfig)?;
    let pid = child.id();
    let launched = Instant::now();
    let deadline = launched + Duration::from_secs(300);
    while metric(&metrics_addr, "kargo_observer_reconciles_total") < applications as f64 {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the observer did not reconcile {applications} Applications in 300 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_pass = launched.elapsed();

    // One Application now runs v2, a tag its Stage never promoted.
    let promotions = resource(kargo::GROUP, kargo::VERSION, "promotions")?;
    let changed = Instant::now();
    kube.store()
        .patch(
            &apps,
            "argocd",
            "app-00000",
            PatchBody::Merge(
                json!({"status": {"summary": {"images": ["ghcr.io/bench/app-0000:v2"]}}}),
            ),
            &admin(),
            false,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let selector = Selector::parse("kargo-observer.kutlak.cc/stage=stage-0000")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    loop {
        if !kube
            .store()
            .list(&promotions, "kargo-demo", &selector, &Selector::default())
            .is_empty()
        {
            break;
        }
        if changed.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            bail!("no Promotion 60 s after the change");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let change_to_promotion = changed.elapsed();
    let peak_rss_kib = peak_rss(pid);
    let _ = child.kill();
    let _ = child.wait();
    let _ = v2_freight;
    Ok(Figures {
        applications,
        stages,
        setup,
        first_pass,
        change_to_promotion,
        peak_rss_kib,
    })
}

/// The API double as the observer meets it: the CRDs, the namespaces, Kargo's webhooks, the
/// observer's user with its grant; returns the observer's kubeconfig, written in `dir`.
fn prepare_api(
    kube: &KubeDouble,
    crds: &std::path::Path,
    dir: &std::path::Path,
) -> Result<std::path::PathBuf> {
    kube.load_crds(crds)?;
    kube.create_namespace("argocd", &[])?;
    kube.create_namespace("kargo-demo", &[(kargo::PROJECT_LABEL, "true")])?;
    kube.create_namespace("kargo-observer", &[])?;
    let grants = kargo::Grants::default();
    grants.allow(crate::OBSERVER_USER, "kargo-demo", "*");
    kargo::install_webhooks(kube, grants);
    kube.add_user(
        crate::KUBE_OBSERVER_TOKEN,
        crate::OBSERVER_USER,
        &["system:serviceaccounts"],
    );
    kube.write_kubeconfig(
        &dir.join("kubeconfig"),
        crate::OBSERVER_USER,
        crate::KUBE_OBSERVER_TOKEN,
        "kargo-demo",
    )
}

/// `stages` Stages, each with its Warehouse, two Freight (v1 and v2) and v1 in its history;
/// returns the v2 Freight's names.
fn seed_stages(
    kube: &KubeDouble,
    stages: usize,
    warehouses: &Resource,
    freights: &Resource,
    stage_resource: &Resource,
) -> Result<Vec<String>> {
    let mut v2_freight = Vec::new();
    for s in 0..stages {
        let name = format!("stage-{s:04}");
        let repo = format!("ghcr.io/bench/app-{s:04}");
        let mut store = kube.store();
        store
            .create(warehouses, "kargo-demo", json!({"metadata": {"name": name}, "spec": {"subscriptions": [{"image": {"repoURL": repo}}]}}), &admin())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut names = Vec::new();
        for tag in ["v1", "v2"] {
            let freight = json!({"metadata": {"name": "x"}, "origin": {"kind": "Warehouse", "name": name}, "images": [{"repoURL": repo, "tag": tag, "digest": format!("sha256:{s}{tag}")}]});
            let created = store
                .create(freights, "kargo-demo", freight, &admin())
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            names.push(
                created["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            );
        }
        let stage = json!({"metadata": {"name": name}, "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": name}, "sources": {"direct": true}}], "promotionTemplate": {"spec": {"steps": [{"uses": "argocd-update"}]}}}});
        store
            .create(stage_resource, "kargo-demo", stage, &admin())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let history = json!({"status": {"freightHistory": [{"id": "bench", "items": {format!("Warehouse/{name}"): {"name": names[0], "origin": {"kind": "Warehouse", "name": name}, "images": [{"repoURL": repo, "tag": "v1"}]}}}]}});
        store
            .patch(
                stage_resource,
                "kargo-demo",
                &name,
                PatchBody::Merge(history),
                &admin(),
                true,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        v2_freight.push(names[1].clone());
    }
    Ok(v2_freight)
}

/// `applications` Applications, spread over the Stages, each Synced, Healthy and running its
/// Stage's v1.
fn seed_applications(
    kube: &KubeDouble,
    apps: &Resource,
    applications: usize,
    stages: usize,
) -> Result<()> {
    for a in 0..applications {
        let stage = a % stages.max(1);
        let app = json!({"metadata": {"name": format!("app-{a:05}"), "annotations": {"kargo.akuity.io/authorized-stage": format!("kargo-demo:stage-{stage:04}")}},
            "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc", "namespace": "default"}},
            "status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}, "summary": {"images": [format!("ghcr.io/bench/app-{stage:04}:v1")]}}});
        kube.store()
            .create(apps, "argocd", app, &admin())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// The observer binary started as the chart deploys it, against the double; returns the
/// process and its metrics address.
fn launch_observer(
    observer: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> Result<(std::process::Child, String)> {
    let port = || -> Result<String> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string())
    };
    let (metrics_addr, health_addr) = (port()?, port()?);
    let child = std::process::Command::new(observer)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        // As the chart deploys it.
        .env("MIMALLOC_PURGE_DELAY", "0")
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "0")
        .args([
            "--metrics-addr",
            &metrics_addr,
            "--health-addr",
            &health_addr,
            "--resync",
            "10m",
            "--log-format",
            "text",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("cannot start the observer")?;
    Ok((child, metrics_addr))
}

/// What `ground bench-bosun` measured.
pub struct BosunFigures {
    pub consumers: usize,
    pub files: usize,
    /// From reading the gate's verdict to the repair pushed (Bosun's own clock).
    pub verdict_to_push: f64,
    /// The whole triage: gate (cold head render), repair, gate again.
    pub triage: Duration,
}

/// Bosun on a repository with `consumers` manifests declaring a version the external-secrets
/// bump stops serving: the time from the verdict to the pushed repair.
pub async fn bosun(
    scenario_dir: &std::path::Path,
    options: crate::Options,
    consumers: usize,
) -> Result<BosunFigures> {
    let mut scenario = crate::scenario::Scenario::load(scenario_dir)?;
    scenario.timeline.clear();
    scenario.bosun.get_or_insert_with(Default::default);
    let mut ground = crate::Ground::start(scenario, options).await?;
    ground
        .act(&crate::scenario::Action::Publish(
            "external-secrets@2.10.0".into(),
        ))
        .await?;
    // Consumers in files of 1-3 documents, with comments and quoting, under a deployed path.
    let overlay = tempfile::tempdir()?;
    let folder = overlay.path().join("platform/secret-stores/generated");
    std::fs::create_dir_all(&folder)?;
    let mut files = 0;
    let mut written = 0;
    while written < consumers {
        let mut text = String::from("# generated for the benchmark\n");
        for document in 0..(1 + files % 3).min(consumers - written) {
            if document > 0 {
                text.push_str("---\n");
            }
            let quote = if written % 2 == 0 { "" } else { "\"" };
            text.push_str(&format!(
                "apiVersion: {quote}external-secrets.io/v1beta1{quote} # bench\nkind: ExternalSecret\nmetadata:\n  name: bench-{written}\nspec:\n  refreshInterval: 1h\n  secretStoreRef: {{name: vault-platform, kind: ClusterSecretStore}}\n  target: {{name: bench-{written}}}\n  data:\n    - secretKey: value\n      remoteRef: {{key: bench/{written}}}\n"
            ));
            written += 1;
        }
        std::fs::write(folder.join(format!("bench-{files:03}.yaml")), text)?;
        files += 1;
    }
    // The team removed `immutable` already (as scenarios/triage does), so the swap is enough.
    ground.commit_overlay("main", "main", overlay.path(), "300 consumers")?;
    let bump = tempfile::tempdir()?;
    let bare = ground
        .forge
        .bare_path(&ground.scenario.repository.slug)
        .context("bare")?;
    let targets = crate::git::git(&bare, &["show", "main:targets/addons.yaml"])?;
    std::fs::create_dir_all(bump.path().join("targets"))?;
    std::fs::write(
        bump.path().join("targets/addons.yaml"),
        targets.replacen("version: 0.10.3", "version: 2.10.0", 1) + "\n",
    )?;
    ground.commit_overlay(
        "bump",
        "main",
        bump.path(),
        "Promote external-secrets 2.10.0",
    )?;
    let number = ground
        .open_pull("bump", "Promote external-secrets 2.10.0", "kargo")
        .await?;
    let url = ground.bosun.as_ref().context("bosun")?.url.clone();
    let started = Instant::now();
    let response = crate::http::client()
        .post(format!("{url}/intake"))
        .bearer_auth(crate::bosun::WEBHOOK_SECRET)
        .body(
            json!({"repository": ground.scenario.repository.slug, "pullRequest": number})
                .to_string(),
        )
        .send()
        .await?;
    if response.status().as_u16() != 202 {
        bail!("intake answered {}", response.status());
    }
    while ground.bosun_busy().await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let triage = started.elapsed();
    let jobs: serde_json::Value = crate::http::client()
        .get(format!("{url}/jobs"))
        .send()
        .await?
        .json()
        .await?;
    let run = jobs["done"]
        .as_array()
        .and_then(|d| d.last())
        .cloned()
        .context("no triage ran")?;
    let verdict_to_push = run["repairSeconds"]
        .as_f64()
        .with_context(|| format!("Bosun pushed no repair: {}", run["lines"]))?;
    Ok(BosunFigures {
        consumers,
        files,
        verdict_to_push,
        triage,
    })
}

/// A rendering of one Application on one cluster (`prod`) holding `objects`: what the repair
/// decision reads CRD schemas from, for benches and evals that bring their own documents.
pub fn one_cluster_rendering(
    objects: impl IntoIterator<Item = serde_json::Value>,
) -> gitops_loop::render::Rendering {
    use gitops_loop::render::{ClusterRef, Origin, RenderedApplication, Rendering};
    Rendering {
        revision: "fixture".into(),
        applications: vec![RenderedApplication {
            name: "fixture".into(),
            namespace: "argocd".into(),
            project: "default".into(),
            origin: Origin::File {
                path: "fixture.yaml".into(),
                document: 0,
            },
            cluster: ClusterRef {
                name: "prod".into(),
                server: "https://prod".into(),
            },
            destination_namespace: "fixture".into(),
            sources: vec![],
            objects: objects.into_iter().map(std::sync::Arc::new).collect(),
            render_keys: vec![],
            manifest: serde_json::Value::Null,
            stored: serde_json::Value::Null,
            destination_unknown: None,
            values_files: Vec::new(),
        }],
        diagnostics: vec![],
        stats: Default::default(),
    }
}

/// Figures of the reshape harness on many documents.
pub struct ReshapeFigures {
    pub documents: usize,
    pub files: usize,
    /// Finding the lossy documents, checking every scripted proposal, writing each document's
    /// YAML into its file and checking the files again: everything Bosun does around the model
    /// calls, none of the calls.
    pub harness: Duration,
}

/// The structural scenario's reshape at scale: `documents` ExternalSecrets carrying the field
/// v1 prunes, in files of 10, each with a scripted good proposal (the calls themselves are
/// the model's time, not the harness's).
pub fn reshape(sample_charts: &std::path::Path, documents: usize) -> Result<ReshapeFigures> {
    use gitops_loop::bosun::{applier::Rewrite, reshape, swap};
    use gitops_loop::gate::rules::{Consumer, DroppedServedVersion};
    use std::collections::BTreeMap;

    let crd_path = sample_charts
        .join("charts.example.test/stable/external-secrets/2.10.0/crds/externalsecrets.yaml");
    let crd: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(&crd_path)?)
        .with_context(|| crd_path.display().to_string())?;
    let document = |i: usize, api: &str, immutable: bool| {
        format!(
            "apiVersion: {api}\nkind: ExternalSecret\nmetadata:\n  name: secret-{i:04}\nspec:\n  refreshInterval: 1h\n  secretStoreRef:\n    name: vault-platform\n    kind: ClusterSecretStore\n  target:\n    name: secret-{i:04}\n    creationPolicy: Owner\n{}  data:\n    - secretKey: password\n      remoteRef:\n        key: platform/{i:04}\n        property: password\n",
            if immutable {
                "    immutable: true\n"
            } else {
                ""
            }
        )
    };
    let per_file = 10;
    let mut rewrites = Vec::new();
    let mut consumers = Vec::new();
    for file in 0..documents.div_ceil(per_file) {
        let path = format!("secrets/file-{file:03}.yaml");
        let range = file * per_file..((file + 1) * per_file).min(documents);
        let text = |api: &str| {
            range
                .clone()
                .map(|i| document(i, api, true))
                .collect::<Vec<_>>()
                .join("---\n")
        };
        for (index, i) in range.clone().enumerate() {
            consumers.push(Consumer {
                path: path.clone(),
                document: index,
                api_version: "external-secrets.io/v1beta1".into(),
                kind: "ExternalSecret".into(),
                namespace: String::new(),
                name: format!("secret-{i:04}"),
                template: false,
            });
        }
        rewrites.push(Rewrite {
            path,
            before: text("external-secrets.io/v1beta1"),
            after: text("external-secrets.io/v1"),
        });
    }
    let dropped = DroppedServedVersion {
        crd: "externalsecrets.external-secrets.io".into(),
        group: "external-secrets.io".into(),
        kind: "ExternalSecret".into(),
        dropped: vec!["v1beta1".into()],
        served: vec!["v1".into()],
        storage: "v1".into(),
        clusters: vec!["prod".into()],
        consumers,
    };
    let plan = swap::plan(std::slice::from_ref(&dropped));
    let rendering = one_cluster_rendering([crd.clone()]);
    // The scripted replies: each document as the good reshape would return it.
    let replies: BTreeMap<String, serde_json::Value> = (0..documents)
        .map(|i| {
            let value: serde_json::Value =
                serde_saphyr::from_str(&document(i, "external-secrets.io/v1", false))
                    .unwrap_or_default();
            (format!("secret-{i:04}"), json!({"document": value}))
        })
        .collect();
    let started = Instant::now();
    let lossy =
        reshape::lossy_documents(&rewrites, &plan, std::slice::from_ref(&dropped), &rendering);
    if lossy.len() != documents {
        bail!("{} lossy documents, expected {documents}", lossy.len());
    }
    for item in &lossy {
        let schema =
            gitops_loop::schema::version_schema(&item.crd, &item.version).context("schema")?;
        let source = gitops_loop::schema::version_schema(&item.crd, &item.source);
        let (_prompt, held) = reshape::prompt(
            &item.object,
            schema,
            source,
            &item.losses,
            &Default::default(),
        );
        let reply = held.restore(replies.get(&item.document.name).context("reply")?);
        let accepted =
            reshape::check_proposal(&item.object, &reply, &item.crd, &item.source, &item.version)
                .map_err(|r| anyhow::anyhow!("{}: {r}", item.document))?;
        let rewrite = rewrites
            .iter_mut()
            .find(|r| r.path == item.document.file)
            .context("rewrite")?;
        rewrite.after = reshape::replace_document(&rewrite.after, &item.object, &accepted.yaml)
            .map_err(|why| anyhow::anyhow!("{}: {why}", item.document))?;
    }
    let left = reshape::reshape_losses(&rewrites, &plan, &[dropped], &rendering);
    let harness = started.elapsed();
    if !left.is_empty() {
        bail!("{} losses left after the reshape", left.len());
    }
    Ok(ReshapeFigures {
        documents,
        files: rewrites.len(),
        harness,
    })
}

/// What Bosun's release-notes reader costs a triage: one image move read through the OCI
/// registry double's token flow (index, linux/amd64 manifest, config labels) and the forge
/// double's releases list (30 releases with realistic bodies), cold and then from the caches.
pub struct NotesFigures {
    pub cold: Duration,
    pub cached: Duration,
    pub releases: usize,
}

pub async fn notes() -> Result<NotesFigures> {
    use gitops_loop::bosun::{config::NotesConfig, notes::Notes};
    let image = crate::oci::OciImage {
        repository: "quay.io/jetstack/cert-manager-controller".into(),
        tag: "v1.19.30".into(),
        labels: [(
            "org.opencontainers.image.source".to_string(),
            "https://github.com/cert-manager/cert-manager".to_string(),
        )]
        .into(),
        multi_arch: true,
        status: None,
    };
    let registry = crate::oci::OciRegistryDouble::start(&[image]).await?;
    let forge = crate::forge::ForgeDouble::start(None).await?;
    let body = "## Changes\n\n- Fixed a bug in the webhook's CA injection.\n".repeat(40);
    for patch in 1..=30 {
        forge.add_release(
            "cert-manager/cert-manager",
            &format!("v1.19.{patch}"),
            &format!("v1.19.{patch}"),
            &body,
        );
    }
    let config: NotesConfig = serde_json::from_value(json!({
        "registries": [{"host": "quay.io", "url": registry.url()}],
        "githubApiUrl": forge.url(),
        "sourceHosts": ["github.com"],
    }))?;
    let notes = Notes::new(config).map_err(anyhow::Error::msg)?;
    let read = || {
        notes.for_image(
            "quay.io/jetstack/cert-manager-controller",
            "v1.19.1",
            "v1.19.30",
        )
    };
    let start = Instant::now();
    let first = read().await;
    let cold = start.elapsed();
    if let Some(why) = first.unread {
        bail!("the bench's notes were not read: {why}");
    }
    let start = Instant::now();
    let again = read().await;
    let cached = start.elapsed();
    Ok(NotesFigures {
        cold,
        cached,
        releases: again.releases.len(),
    })
}
