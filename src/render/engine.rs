//! The render engine's room for the Engine: the entry points, the wave-by-wave expansion of
//! Applications and ApplicationSets, admission of repeats, and the finish (cycles, stats).

use crate::render::planning::PendingApp;
use crate::render::{Shard, Stripes, shard_key};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::git::Snapshot;
use crate::render::parsed::Object;
use crate::render::repos::RepoResolver;
use crate::render::source::RenderJob;
use crate::render::util::{object_sort_key, trace};
use crate::render::{
    Diagnostic, HelmFailure, Known, Origin, RenderConfig, RenderFailure, RenderStats,
    RenderedApplication, Rendering, Severity, appset, parsed, source,
};
use crate::yaml;

/// An Application or ApplicationSet waiting to be expanded.
pub(super) struct Item {
    pub(super) object: Value,
    pub(super) origin: Origin,
    /// The identity of the object that produced this one (None for repository files).
    parent: Option<String>,
    pub(super) depth: usize,
    /// The shard that renders it, when only one does: the shard of the Application whose
    /// helm or kustomize render produced it (no other shard sees that render's output).
    pub(super) owner: Option<usize>,
}

fn identity(kind: &str, object: &Value) -> String {
    known(kind, object).to_string()
}

/// An Application's or ApplicationSet's identity (its namespace `argocd` when it names none).
fn known(kind: &str, object: &Value) -> Known {
    let text = |pointer: &str, default: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    };
    Known {
        kind: kind.to_string(),
        namespace: text("/metadata/namespace", "argocd"),
        name: text("/metadata/name", ""),
    }
}

/// Whether `object` is Argo CD's `kind` (any `argoproj.io/` version).
pub fn is_argo_kind(object: &Value, kind: &str) -> bool {
    object.get("kind").and_then(Value::as_str) == Some(kind)
        && object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("argoproj.io/"))
}

/// SHA-256 of an Application object's JSON form: how a sharded render records the spec it
/// keeps for an Application every shard reaches ([`RenderStats::shard_common_specs`]), and how
/// `gate merge` checks the one a partial holds against it.
pub fn application_digest(object: &Value) -> String {
    use sha2::Digest as _;
    crate::git::hex(&sha2::Sha256::digest(
        serde_json::to_vec(object).unwrap_or_default(),
    ))
}

/// Renders everything the repository deploys at `revision` (a branch, tag or commit of
/// `config.repo_dir`).
pub fn render(config: &RenderConfig, revision: &str) -> Result<Rendering, RenderFailure> {
    render_roots(config, revision, None, None)
}

/// [`render`] of one shard of the fleet ([`Shard`]): the Applications the shard owns, with
/// every ApplicationSet expanded and every Application without a helm or kustomize source
/// rendered (cheap, and how the shard finds the Applications it owns); Applications of other
/// shards are neither planned nor rendered, and left out. An Application belongs to the shard
/// of its [`shard_key`] at this revision, or, when a helm or kustomize render of a shard
/// deployed it, to that shard. What a shard learns that belongs to another's Application (its
/// origin credited to a parent) is in [`RenderStats::shard_credits`].
pub fn render_shard(
    config: &RenderConfig,
    revision: &str,
    shard: Shard,
) -> Result<Rendering, RenderFailure> {
    let expansions = Arc::new(Expansions::default());
    let dealing = Arc::new(Dealing::of_head(
        config,
        revision,
        shard.count,
        expansions.clone(),
    ));
    render_shard_dealt(config, revision, shard, dealing, Some(expansions), false)
}

/// [`render_shard`] with the head's [`Dealing`] (computed by whichever render asks first).
///
/// - The head's render (`against_head` false) takes the head's [`Expansions`]: the
///   ApplicationSets the dealing expanded are not expanded again.
/// - The merge base's render (`against_head` true): an Application the head's common path
///   holds goes where the head's spec puts it, so that one shard renders both sides of its
///   diff whatever else its source changed; one the head does not hold goes where its own
///   spec puts it. It plans until it first places an Application before it waits for the
///   dealing: its ApplicationSets expand while the head's keys are read.
pub fn render_shard_dealt<'a>(
    config: &'a RenderConfig,
    revision: &'a str,
    shard: Shard,
    dealing: Arc<Dealing<'a>>,
    expansions: Option<Arc<Expansions>>,
    against_head: bool,
) -> Result<Rendering, RenderFailure> {
    if !against_head && let Err(failure) = dealing.dealt() {
        return Err(failure.clone());
    }
    let sharding = Sharding {
        shard,
        owns_nothing: false,
        against_head,
        dealing: Some(dealing),
        expansions,
    };
    render_roots(config, revision, None, Some(sharding))
}

/// The [`shard_key`] of every Application on the path every shard follows at `revision`
/// (the repository's files, what their ApplicationSets generate, what Applications of plain
/// manifests deploy), by identity. Renders nothing that runs a process.
pub fn shard_keys(
    config: &RenderConfig,
    revision: &str,
) -> Result<BTreeMap<String, String>, RenderFailure> {
    keys_expanding(config, revision, None).map(|(keys, _)| keys)
}

/// [`shard_keys`], and what rendering each key costs ([`RenderStats::shard_weights`]): the
/// [`Stripes::weighted`] every shard deals.
pub fn shard_keys_weighed(config: &RenderConfig, revision: &str) -> Result<Weighed, RenderFailure> {
    keys_expanding(config, revision, None)
}

/// Shard keys by identity, and their costs by key.
pub type Weighed = (BTreeMap<String, String>, BTreeMap<String, u64>);

fn keys_expanding(
    config: &RenderConfig,
    revision: &str,
    expansions: Option<Arc<Expansions>>,
) -> Result<Weighed, RenderFailure> {
    let sharding = Sharding {
        shard: Shard { index: 0, count: 1 },
        owns_nothing: true,
        against_head: false,
        dealing: None,
        expansions,
    };
    let stats = render_roots(config, revision, None, Some(sharding))?.stats;
    Ok((stats.shard_keys, stats.shard_weights))
}

/// Renders the given Applications (not the repository's own roots) at `revision`: the gate
/// uses it to render one Application with another chart version pinned.
pub fn render_applications(
    config: &RenderConfig,
    revision: &str,
    applications: Vec<Value>,
) -> Result<Rendering, RenderFailure> {
    render_roots(config, revision, Some(applications), None)
}

/// What an ApplicationSet generated, by the ApplicationSet's JSON text, for the renders of
/// one revision in one process: a sharded check follows its head twice (its keys, then its
/// shard), and the second takes what the first kept (an ApplicationSet of 5,000
/// Applications is a third of a shard's planning). Each answer is taken once.
#[derive(Default)]
pub struct Expansions(Mutex<HashMap<String, Result<Vec<Value>, String>>>);

impl Expansions {
    /// `expand`'s answer for `appset`: taken from what the first pass kept, else computed
    /// (and kept for the second pass when `keep`: only the first pass keeps).
    fn expand(
        &self,
        appset: &Value,
        keep: bool,
        expand: impl FnOnce() -> Result<Vec<Value>, String>,
    ) -> Result<Vec<Value>, String> {
        let Ok(text) = serde_json::to_string(appset) else {
            return expand();
        };
        if let Some(known) = self.0.lock().ok().and_then(|mut m| m.remove(&text)) {
            return known;
        }
        let generated = expand();
        if keep && let Ok(mut known) = self.0.lock() {
            known.insert(text, generated.clone());
        }
        generated
    }
}

type Dealt = Result<(Weighed, Stripes), RenderFailure>;
type ReadKeys<'a> = Box<dyn FnOnce() -> Result<Weighed, RenderFailure> + Send + 'a>;

/// Where a sharded check's Applications go: the head's common path's [`shard_keys`] and the
/// [`Stripes`] dealt from them, computed once by whichever render asks first while the
/// other waits (the merge base's render expands its ApplicationSets meanwhile).
pub struct Dealing<'a> {
    /// The head, as the caller named it (for a failure's revision).
    head: String,
    count: usize,
    keys: Mutex<Option<ReadKeys<'a>>>,
    dealt: std::sync::OnceLock<Dealt>,
}

impl<'a> Dealing<'a> {
    /// The dealing of `head` over `count` shards, its ApplicationSets' expansions kept in
    /// `expansions` for the head's own render.
    pub fn of_head(
        config: &'a RenderConfig,
        head: &'a str,
        count: usize,
        expansions: Arc<Expansions>,
    ) -> Dealing<'a> {
        Dealing::with(head, count, move || {
            keys_expanding(config, head, Some(expansions))
        })
    }

    fn with(
        head: &str,
        count: usize,
        keys: impl FnOnce() -> Result<Weighed, RenderFailure> + Send + 'a,
    ) -> Dealing<'a> {
        Dealing {
            head: head.to_string(),
            count,
            keys: Mutex::new(Some(Box::new(keys))),
            dealt: std::sync::OnceLock::new(),
        }
    }

    /// The head's keys and stripes, computed on the first call (the others wait for it), or
    /// why the head's common path fails.
    pub fn dealt(&self) -> Result<(&BTreeMap<String, String>, &Stripes), &RenderFailure> {
        let dealt = self.dealt.get_or_init(|| {
            let keys = self.keys.lock().ok().and_then(|mut k| k.take());
            let Some(keys) = keys else {
                return Err(RenderFailure {
                    revision: self.head.clone(),
                    diagnostics: vec![Diagnostic {
                        severity: Severity::Error,
                        subject: "render".into(),
                        message: "the shard's dealing stopped unexpectedly".into(),
                    }],
                    helm_failures: Vec::new(),
                    values_users: Vec::new(),
                });
            };
            let (keys, weights) = keys()?;
            let stripes = Stripes::weighted(keys.values(), &weights, self.count);
            Ok(((keys, weights), stripes))
        });
        dealt.as_ref().map(|((keys, _), stripes)| (keys, stripes))
    }

    /// What each of the head's keys costs, as the dealing weighed them (None when the head's
    /// common path fails): a partial carries them for the merge.
    pub fn weights(&self) -> Option<&BTreeMap<String, u64>> {
        match self.dealt.get() {
            Some(Ok(((_, weights), _))) => Some(weights),
            _ => None,
        }
    }
}

/// How a sharded render picks its Applications.
struct Sharding<'a> {
    shard: Shard,
    /// [`shard_keys`]: this render owns no Application (it follows the common path only).
    owns_nothing: bool,
    /// The merge base's render: an Application the head's keys hold goes where the head's
    /// key puts it.
    against_head: bool,
    /// Which shard each key goes to (none for [`shard_keys`] itself).
    dealing: Option<Arc<Dealing<'a>>>,
    /// ApplicationSets another render of this revision expanded.
    expansions: Option<Arc<Expansions>>,
}

fn render_roots<'a>(
    config: &'a RenderConfig,
    revision: &'a str,
    given: Option<Vec<Value>>,
    shard: Option<Sharding<'a>>,
) -> Result<Rendering, RenderFailure> {
    let failure = |revision: &str, subject: &str, message: String| RenderFailure {
        revision: revision.to_string(),
        diagnostics: vec![Diagnostic {
            severity: Severity::Error,
            subject: subject.to_string(),
            message,
        }],
        helm_failures: Vec::new(),
        values_users: Vec::new(),
    };
    trace(revision, "render starts");
    // Where no network namespace can be made, nothing renders unless the operator opted in.
    if let Err(refusal) = super::confine::confinement(&config.helm.limits) {
        return Err(failure(revision, "confinement", refusal));
    }
    // helm's version is part of every persistent cache entry of a helm render, looked up
    // after the wave is planned: it is asked in the background while the snapshot loads and
    // the jobs are planned (`helm version` alone takes 50-100 ms). kubectl's is asked only
    // when a Kustomize render is looked up (most repositories have none, and a process less
    // is a core more for helm).
    config.helm.prefetch_version();
    let snapshot = config.parsed.snapshot(&config.repo_dir, revision);
    let snapshot = snapshot.map_err(|e| failure(revision, "repository", e.to_string()))?;
    let commit = snapshot.commit.clone();
    let repos = RepoResolver::new(
        snapshot.clone(),
        config.repo_url.clone(),
        config.git_mirrors.clone(),
    );
    let roots = match given {
        Some(applications) => applications
            .into_iter()
            .enumerate()
            .map(|(document, object)| Item {
                object,
                origin: Origin::File {
                    path: "(given)".into(),
                    document,
                },
                parent: None,
                depth: 0,
                owner: None,
            })
            .collect(),
        None => scan_roots(&snapshot).map_err(|d| RenderFailure {
            revision: commit.clone(),
            diagnostics: vec![d],
            helm_failures: Vec::new(),
            values_users: Vec::new(),
        })?,
    };
    let work = crate::scratch::dir("render")
        .map_err(|e| failure(&commit, "scratch directory", e.to_string()))?;
    trace(revision, "snapshot loaded, roots scanned");
    let mut engine = Engine {
        config,
        revision,
        repos,
        work: work.path().to_path_buf(),
        chart_digests: Mutex::new(HashMap::new()),
        memo: HashMap::new(),
        stats: RenderStats::default(),
        diagnostics: Vec::new(),
        seen: HashMap::new(),
        edges: Vec::new(),
        edge_set: std::collections::HashSet::new(),
        applications: BTreeMap::new(),
        queued: Vec::new(),
        helm_jobs: HashMap::new(),
        helm_failures: Vec::new(),
        values_users: Vec::new(),
        shard,
        owned: std::collections::HashSet::new(),
        credits: BTreeMap::new(),
        known: std::collections::BTreeSet::new(),
        keys: BTreeMap::new(),
        weights: BTreeMap::new(),
        chart_bytes: HashMap::new(),
        common_seen: HashMap::new(),
        common_specs: BTreeMap::new(),
    };
    trace(revision, "tools asked");
    engine.run(roots);
    trace(revision, "render done");
    engine.finish(commit)
}

struct Seen {
    spec: String,
    from_file: bool,
}

/// A mirrored chart's digest and bytes, or why it has none.
pub(super) type ChartDigest = Result<(String, u64), String>;

pub(super) struct Engine<'a> {
    pub(super) config: &'a RenderConfig,
    /// The revision being rendered, as the caller named it (for traces).
    revision: &'a str,
    pub(super) repos: RepoResolver,
    pub(super) work: PathBuf,
    /// Each mirrored chart's digest and bytes ([`cache::digest_and_bytes`]), by directory.
    pub(super) chart_digests: Mutex<HashMap<PathBuf, ChartDigest>>,
    pub(super) memo: HashMap<String, parsed::Parsed>,
    pub(super) stats: RenderStats,
    diagnostics: Vec<Diagnostic>,
    seen: HashMap<String, Seen>,
    edges: Vec<(String, String)>,
    /// [`Engine::edges`] as a set: an ApplicationSet generating thousands of Applications
    /// would make a scan of the list quadratic.
    edge_set: std::collections::HashSet<(String, String)>,
    applications: BTreeMap<String, RenderedApplication>,
    pub(super) queued: Vec<(String, RenderJob)>,
    /// Each helm job by key, kept to say what failed.
    pub(super) helm_jobs: HashMap<String, source::HelmJob>,
    helm_failures: Vec<HelmFailure>,
    pub(super) values_users: Vec<(String, String, Vec<String>)>,
    /// Set for a sharded render: only this shard's Applications are rendered and kept.
    shard: Option<Sharding<'a>>,
    /// The Applications (by identity) this shard owns.
    owned: std::collections::HashSet<String>,
    /// Origins credited to a parent for Applications this shard did not render.
    credits: BTreeMap<String, Origin>,
    /// A sharded render: what it reached on a path every shard follows
    /// ([`RenderStats::shard_known`]).
    known: std::collections::BTreeSet<Known>,
    /// [`shard_keys`]: the shard key of each Application on that path
    /// ([`RenderStats::shard_keys`]).
    keys: BTreeMap<String, String>,
    /// [`shard_keys`]: what rendering each key costs ([`RenderStats::shard_weights`]), and
    /// the bytes of each mirrored chart it read for them.
    weights: BTreeMap<String, u64>,
    chart_bytes: HashMap<super::charts::ChartRef, u64>,
    /// A sharded render: the digest of each Application on that path as the render keeps it
    /// ([`RenderStats::shard_common_specs`]), and what [`Engine::admit`] saw of it there.
    common_specs: BTreeMap<String, String>,
    common_seen: HashMap<String, Seen>,
}

impl Engine<'_> {
    fn error(&mut self, subject: &str, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic {
            severity: Severity::Error,
            subject: subject.to_string(),
            message: message.into(),
        });
    }

    /// Renders the Applications wave by wave: a wave's ApplicationSets expanded, its
    /// Applications planned, their jobs run, and the Applications and ApplicationSets they
    /// render make the next wave.
    fn run(&mut self, roots: Vec<Item>) {
        let mut wave = roots;
        while !wave.is_empty() {
            let applications = self.expand_wave(wave);
            let pending = self.plan_wave(applications);
            trace(self.revision, "wave planned");
            let pending = self.keep_shard(pending);
            self.execute_pending_jobs();
            trace(self.revision, "wave rendered and parsed");
            wave = self.collect_wave(pending);
        }
    }

    /// A wave's Applications, with each ApplicationSet replaced by the Applications it
    /// generates; an item nested too deep or seen before is left out.
    fn expand_wave(&mut self, wave: Vec<Item>) -> Vec<Item> {
        let mut applications = Vec::new();
        for item in wave {
            let kind = if is_argo_kind(&item.object, "ApplicationSet") {
                "ApplicationSet"
            } else {
                "Application"
            };
            let id = identity(kind, &item.object);
            // Reached with no owner: every shard reaches it (a file, or what an
            // Application every shard renders deploys).
            if self.shard.is_some() && item.owner.is_none() && kind == "ApplicationSet" {
                self.known.insert(known(kind, &item.object));
            }
            if item.depth > self.config.max_depth {
                self.error(
                    &id,
                    format!(
                        "app-of-apps nesting is deeper than {} levels",
                        self.config.max_depth
                    ),
                );
                continue;
            }
            if !self.admit(&id, &item) {
                continue;
            }
            if kind == "ApplicationSet" {
                let ctx = appset::ExpandContext {
                    repos: &self.repos,
                    inventory: &self.config.inventory,
                    helm: &self.config.helm,
                    work: &self.work.join(format!("appset-{}", self.seen.len())),
                };
                let memo = self
                    .shard
                    .as_ref()
                    .and_then(|s| Some((s.expansions.as_ref()?, s)));
                let expanded = match memo {
                    Some((known, sharding)) => {
                        known.expand(&item.object, sharding.owns_nothing, || {
                            appset::expand(&item.object, &ctx)
                        })
                    }
                    None => appset::expand(&item.object, &ctx),
                };
                match expanded {
                    Ok(generated) => {
                        let namespace = item
                            .object
                            .pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .unwrap_or("argocd")
                            .to_string();
                        let name = item
                            .object
                            .pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string();
                        for object in generated {
                            applications.push(Item {
                                object,
                                origin: Origin::ApplicationSet {
                                    namespace: namespace.clone(),
                                    name: name.clone(),
                                },
                                parent: Some(id.clone()),
                                depth: item.depth,
                                owner: item.owner,
                            });
                        }
                    }
                    Err(message) => self.error(&id, message),
                }
            } else {
                applications.push(item);
            }
        }
        applications
    }

    /// Each Application of a wave planned (its render jobs known). Generated Applications are
    /// admitted like the rest (duplicates, cycles), once Argo CD would create them at all.
    fn plan_wave(&mut self, applications: Vec<Item>) -> Vec<PendingApp> {
        let mut pending = Vec::new();
        for item in applications {
            let id = identity("Application", &item.object);
            let common = self.shard.is_some() && item.owner.is_none();
            if common {
                self.known.insert(known("Application", &item.object));
            }
            if let Origin::ApplicationSet { namespace, name } = &item.origin
                && let Some(why) = refused_application(&item.object)
            {
                self.error(
                    &id,
                    format!(
                        "ApplicationSet {namespace}/{name} generates an Application that {why}; the ApplicationSet controller reports it and creates the others, so it would silently not exist"
                    ),
                );
                continue;
            }
            if matches!(item.origin, Origin::ApplicationSet { .. }) && !self.admit(&id, &item) {
                continue;
            }
            let owner = self.owner_of(&id, &item);
            // Another shard's Application whose render runs a process: that shard plans and
            // renders it, this one leaves it out (when its type cannot be told, planning it
            // says why, or renders it as every shard does).
            if let Some(sharding) = &self.shard
                && (sharding.owns_nothing || owner != sharding.shard.index)
                && source::runs_a_process(&item.object, &self.repos) == Ok(true)
            {
                self.owned.remove(&id);
                continue;
            }
            match self.plan_application(&id, &item) {
                Ok(mut p) => {
                    p.owner = owner;
                    pending.push(p)
                }
                Err(message) => self.error(&id, message),
            }
        }
        pending
    }

    /// The shard an Application of a sharded render belongs to (0 otherwise): the one its
    /// parent's render fixed, else that of its key (kept in [`RenderStats::shard_keys`] by
    /// [`shard_keys`]): the head's, when this is the merge base's render and the head holds
    /// it, else its own.
    fn owner_of(&mut self, id: &str, item: &Item) -> usize {
        let Some(sharding) = &self.shard else {
            return 0;
        };
        if let Some(owner) = item.owner {
            return owner;
        }
        let Some(dealing) = &sharding.dealing else {
            // [`shard_keys`]: every Application's key and what it costs, owned by none. Two
            // specs of one key (its charts at two versions) cost the dearer.
            let key = shard_key(&item.object);
            let (mirror, repos) = (self.config.charts.as_deref(), &self.repos);
            let chart_bytes = &mut self.chart_bytes;
            let name = super::source::str_at(&item.object, "/metadata/name");
            let weight = super::key_weight(
                &item.object,
                |chart| {
                    *chart_bytes
                        .entry(chart.clone())
                        .or_insert_with(|| super::charts::mirrored_bytes(mirror, chart))
                },
                // A source planning cannot type (it will say why) is weighed as a process.
                |source| super::source::source_runs_a_process(name, source, repos).unwrap_or(true),
            );
            let known = self.weights.entry(key.clone()).or_insert(weight);
            *known = (*known).max(weight);
            self.keys.insert(id.to_string(), key);
            return 0;
        };
        match dealing.dealt() {
            Ok((head_keys, stripes)) => {
                if sharding.against_head
                    && let Some(head) = head_keys.get(id)
                {
                    return stripes.of(head);
                }
                stripes.of(&shard_key(&item.object))
            }
            // The head's path fails: the check is undecided, this render is not used; it
            // owns nothing.
            Err(_) => usize::MAX,
        }
    }

    /// Each planned Application with the objects its jobs rendered (sorted), kept among the
    /// rendered Applications; a failed job is the Application's error. Returns the next wave:
    /// the Applications and ApplicationSets they render.
    fn collect_wave(&mut self, pending: Vec<PendingApp>) -> Vec<Item> {
        let mut next = Vec::new();
        let mut sorted: HashMap<Vec<String>, Vec<Object>> = HashMap::new();
        for p in pending {
            let Some(mut objects) = self.rendered_objects(&p) else {
                continue;
            };
            // Applications with the same renders (one chart on many clusters) share one sort.
            let objects = sorted
                .entry(p.job_keys.clone())
                .or_insert_with(|| {
                    objects.sort_by_cached_key(|o| object_sort_key(o));
                    objects
                })
                .clone();
            for object in &objects {
                if is_argo_kind(object, "Application") || is_argo_kind(object, "ApplicationSet") {
                    let mut child = Value::clone(object);
                    if child.pointer("/metadata/namespace").is_none() {
                        child["metadata"]["namespace"] =
                            Value::String(p.app.destination_namespace.clone()).clone();
                        if p.app.destination_namespace.is_empty() {
                            child["metadata"]["namespace"] = Value::String("argocd".into());
                        }
                    }
                    next.push(Item {
                        object: child,
                        origin: Origin::Application {
                            namespace: p.app.namespace.clone(),
                            name: p.app.name.clone(),
                        },
                        parent: Some(p.id.clone()),
                        depth: p.depth + 1,
                        // What a render only its owner runs deploys stays in that
                        // shard, and so does what an Application only that shard
                        // reached deploys (an app-of-apps of plain manifests under a
                        // helm parent): no other shard sees it.
                        owner: (p.renders_alone || p.owner_hint.is_some()).then_some(p.owner),
                    });
                }
            }
            let mut app = p.app;
            app.objects = objects;
            app.render_keys = p.job_keys;
            self.applications.insert(p.id, app);
        }
        next
    }

    /// The objects of every job of a planned Application, in job order; `None` when a job
    /// failed (the failure recorded, a helm one with its inputs) or did not run.
    fn rendered_objects(&mut self, p: &PendingApp) -> Option<Vec<Object>> {
        let mut objects: Vec<Object> = Vec::new();
        let mut failed = false;
        for key in &p.job_keys {
            match self.memo.get(key) {
                Some(Ok(rendered)) => objects.extend(rendered.iter().cloned()),
                Some(Err(message)) => {
                    let message = message.clone();
                    if let Some(job) = self.helm_jobs.get(key) {
                        self.helm_failures.push(HelmFailure {
                            application: p.id.clone(),
                            cluster: p.app.cluster.name.clone(),
                            job: job.clone(),
                            message: message.clone(),
                        });
                    }
                    self.error(&p.id, message);
                    failed = true;
                }
                None => failed = true,
            }
        }
        (!failed).then_some(objects)
    }

    /// Decides whether an object is new (true) or a repeat of one already expanded, and
    /// records where it came from. Two different definitions of one name are an error.
    fn admit(&mut self, id: &str, item: &Item) -> bool {
        let spec = item
            .object
            .get("spec")
            .map(Value::to_string)
            .unwrap_or_default();
        if self.shard.is_some()
            && item.owner.is_none()
            && !is_argo_kind(&item.object, "ApplicationSet")
        {
            self.keep_common(id, item, &spec);
        }
        self.admit_once(id, item, spec)
    }

    /// A sharded render: an Application reached on the path every shard follows, kept as
    /// [`Engine::admit`] keeps it among that path's objects alone (a parent's over a file's;
    /// of two with one spec, the first), so that a render only this shard runs, reaching the
    /// same name first, changes nothing every shard records.
    fn keep_common(&mut self, id: &str, item: &Item, spec: &str) {
        let from_file = item.parent.is_none();
        let replaces = match self.common_seen.get(id) {
            None => true,
            Some(previous) => previous.spec != spec && previous.from_file && !from_file,
        };
        if replaces {
            self.common_seen.insert(
                id.to_string(),
                Seen {
                    spec: spec.to_string(),
                    from_file,
                },
            );
            self.common_specs
                .insert(id.to_string(), application_digest(&item.object));
        }
    }

    fn admit_once(&mut self, id: &str, item: &Item, spec: String) -> bool {
        let from_file = item.parent.is_none();
        if let Some(parent) = &item.parent
            && self.edge_set.insert((parent.clone(), id.to_string()))
        {
            self.edges.push((parent.clone(), id.to_string()));
        }
        match self.seen.get(id) {
            None => {
                self.seen.insert(id.to_string(), Seen { spec, from_file });
                true
            }
            Some(previous) if previous.spec == spec => {
                // The same object reached twice (a file that a parent also renders): keep one,
                // and credit the parent.
                if previous.from_file && !from_file {
                    if let Some(app) = self.applications.get_mut(id) {
                        app.origin = item.origin.clone();
                    } else if self.shard.is_some() {
                        self.credits.insert(id.to_string(), item.origin.clone());
                    }
                    self.seen.insert(id.to_string(), Seen { spec, from_file });
                }
                false
            }
            Some(previous) if previous.from_file && !from_file => {
                // What a parent deploys wins over the file it was read from.
                self.applications.remove(id);
                self.seen.insert(id.to_string(), Seen { spec, from_file });
                true
            }
            Some(previous) if !previous.from_file && from_file => false,
            Some(_) => {
                self.error(id, format!("is defined twice with different specs (one from {}); Argo CD keeps one Application per name and namespace", item.origin));
                false
            }
        }
    }

    fn finish(mut self, commit: String) -> Result<Rendering, RenderFailure> {
        if let Some(cycle) = find_cycle(&self.edges) {
            self.error(
                &cycle[0].clone(),
                format!("app-of-apps cycle: {}", cycle.join(" -> ")),
            );
        }
        let has_errors = self
            .diagnostics
            .iter()
            .any(|d| d.severity == Severity::Error);
        if has_errors {
            return Err(RenderFailure {
                revision: commit,
                diagnostics: self.diagnostics,
                helm_failures: self.helm_failures,
                values_users: self.values_users,
            });
        }
        let owned = &self.owned;
        let sharded = self.shard.is_some();
        let mut applications: Vec<RenderedApplication> = self
            .applications
            .into_iter()
            .filter(|(id, _)| !sharded || owned.contains(id))
            .map(|(_, app)| app)
            .collect();
        applications.sort_by(|a, b| {
            (&a.cluster.name, &a.name, &a.namespace).cmp(&(&b.cluster.name, &b.name, &b.namespace))
        });
        Ok(Rendering {
            revision: commit,
            applications,
            diagnostics: self.diagnostics,
            stats: RenderStats {
                shard_credits: self.credits,
                shard_known: self.known,
                shard_keys: self.keys,
                shard_weights: self.weights,
                shard_common_specs: self.common_specs,
                ..self.stats
            },
        })
    }

    /// For a sharded render, the wave's planned Applications this shard renders: those it
    /// owns, and those whose render runs no process (plain manifests, or nothing: every shard
    /// renders them, to find the Applications they hold). The queued jobs of the others are
    /// dropped. Without a shard, all of them.
    fn keep_shard(&mut self, pending: Vec<PendingApp>) -> Vec<PendingApp> {
        let Some(sharding) = &self.shard else {
            return pending;
        };
        let mine = |owner: usize| !sharding.owns_nothing && owner == sharding.shard.index;
        let mut kept = Vec::new();
        for mut p in pending {
            p.renders_alone = p.job_keys.iter().any(|k| !k.starts_with("objects-"));
            if mine(p.owner) {
                self.owned.insert(p.id.clone());
            } else {
                self.owned.remove(&p.id);
            }
            if mine(p.owner) || !p.renders_alone {
                kept.push(p);
            }
        }
        let needed: std::collections::HashSet<&String> =
            kept.iter().flat_map(|p| p.job_keys.iter()).collect();
        self.queued.retain(|(key, _)| needed.contains(key));
        kept
    }
}

/// Finds a cycle in the parent -> child graph, as the list of identities around it.
fn find_cycle(edges: &[(String, String)]) -> Option<Vec<String>> {
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        children.entry(a.as_str()).or_default().push(b.as_str());
    }
    fn visit<'a>(
        node: &'a str,
        children: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::HashSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(position) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = path[position..].iter().map(|s| s.to_string()).collect();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node);
        for child in children.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(child, children, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node);
        None
    }
    let mut done = std::collections::HashSet::new();
    for node in children.keys() {
        if let Some(cycle) = visit(node, &children, &mut Vec::new(), &mut done) {
            return Some(cycle);
        }
    }
    None
}

/// An Application or ApplicationSet of the repository's own files: what it is, the file and
/// document it is in, and the object as every render starts from it.
#[derive(Debug, Clone)]
pub struct Root {
    pub known: Known,
    pub path: String,
    pub document: usize,
    pub object: Value,
}

/// The Applications and ApplicationSets of the repository's own files at one commit (what
/// every render starts from), with the file each is in: read, not rendered. `gate merge`
/// binds the shards' partials to the repository with it.
pub fn roots(snapshot: &Snapshot) -> Result<Vec<Root>, Diagnostic> {
    Ok(scan_roots(snapshot)?
        .into_iter()
        .map(|item| {
            let kind = if is_argo_kind(&item.object, "ApplicationSet") {
                "ApplicationSet"
            } else {
                "Application"
            };
            let (path, document) = match item.origin {
                Origin::File { path, document } => (path, document),
                other => (other.to_string(), 0),
            };
            Root {
                known: known(kind, &item.object),
                path,
                document,
                object: item.object,
            }
        })
        .collect())
}

/// Finds every Application and ApplicationSet declared in the repository's YAML files.
/// Chart directories (a `Chart.yaml` above the file) hold templates, not manifests, and
/// hidden directories (`.github`) are not deployed: both are skipped.
fn scan_roots(snapshot: &Snapshot) -> Result<Vec<Item>, Diagnostic> {
    let mut roots = Vec::new();
    for path in snapshot.manifest_files() {
        let text =
            yaml::utf8(snapshot.read(path).unwrap_or_default(), path).map_err(|e| Diagnostic {
                severity: Severity::Error,
                subject: format!("file {path}"),
                message: e,
            })?;
        if !text.contains("argoproj.io") {
            continue;
        }
        let documents = yaml::parse_documents(text, path).map_err(|e| Diagnostic {
            severity: Severity::Error,
            subject: format!("file {path}"),
            message: format!("line {}: malformed YAML: {}", e.line, e.message),
        })?;
        for (index, document) in documents.into_iter().enumerate() {
            if is_argo_kind(&document, "Application") || is_argo_kind(&document, "ApplicationSet") {
                let mut object = document;
                if object.pointer("/metadata/namespace").is_none()
                    && object.get("metadata").is_some_and(Value::is_object)
                {
                    object["metadata"]["namespace"] = Value::String("argocd".into());
                }
                roots.push(Item {
                    object,
                    origin: Origin::File {
                        path: path.to_string(),
                        document: index,
                    },
                    parent: None,
                    depth: 0,
                    owner: None,
                });
            }
        }
    }
    Ok(roots)
}

/// Why Argo CD would not create a generated Application, if it would not: what the API server
/// refuses of any object (a name that is not a DNS-1123 subdomain, a namespace that is not a
/// DNS-1123 label), with an unresolved fasttemplate parameter named as the likely cause, and
/// what the ApplicationSet controller's `validateGeneratedApplications` refuses before it
/// creates one (no project; a destination with both `server` and `name`, or neither).
fn refused_application(app: &Value) -> Option<String> {
    let text = |p: &str| app.pointer(p).and_then(Value::as_str).unwrap_or("");
    let shown = |v: &str| -> String { v.chars().take(80).collect() };
    let name = text("/metadata/name");
    if name.contains("{{") {
        return Some(format!(
            "is named {:?}, with a template parameter no generator supplied (fasttemplate leaves it as written): the API server refuses that name",
            shown(name)
        ));
    }
    if !crate::names::is_dns1123_subdomain(name) {
        return Some(format!(
            "is named {:?}, which the API server refuses (a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.')",
            shown(name)
        ));
    }
    let namespace = text("/metadata/namespace");
    if !namespace.is_empty() && !crate::names::is_dns1123_label(namespace) {
        return Some(format!(
            "is in namespace {:?}, which the API server refuses (a DNS-1123 label)",
            shown(namespace)
        ));
    }
    if text("/spec/project").is_empty() {
        return Some(
            "names no project (Argo CD: the application references a project that does not exist)"
                .into(),
        );
    }
    let (server, cluster) = (
        text("/spec/destination/server"),
        text("/spec/destination/name"),
    );
    if !server.is_empty() && !cluster.is_empty() {
        return Some(format!(
            "has a destination with both server {:?} and name {:?} (Argo CD: application destination can't have both name and server defined)",
            shown(server),
            shown(cluster)
        ));
    }
    if server.is_empty() && cluster.is_empty() {
        return Some("has a destination with neither server nor name (Argo CD: the destination server or name is required)".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The head's keys are read once for both renders of a sharded check, whichever asks
    /// first, and the other waits for them (a shard read them twice, and the merge base's
    /// render could not start before they were read).
    #[test]
    fn a_dealing_reads_the_heads_keys_once_for_both_renders() {
        let reads = AtomicUsize::new(0);
        let dealing = Dealing::with("head", 3, || {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok((
                ["k1", "k2", "k3", "k4"]
                    .iter()
                    .map(|k| (format!("Application argocd/{k}"), format!("{k:0>80}")))
                    .collect(),
                BTreeMap::new(),
            ))
        });
        let dealt: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let askers: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let (keys, stripes) = dealing.dealt().expect("dealt");
                        keys.values().map(|k| stripes.of(k)).collect()
                    })
                })
                .collect();
            askers.into_iter().map(|a| a.join().unwrap()).collect()
        });
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        assert!(dealt.iter().all(|d| *d == vec![0, 1, 2, 0]), "{dealt:?}");
        // A head whose common path fails fails every asker alike.
        let failing = Dealing::with("head", 2, || {
            Err(RenderFailure {
                revision: "head".into(),
                diagnostics: Vec::new(),
                helm_failures: Vec::new(),
                values_users: Vec::new(),
            })
        });
        assert!(failing.dealt().is_err() && failing.dealt().is_err());
    }

    /// What the keys' pass expanded, the head's render takes once; the next asker (an
    /// ApplicationSet twice in one render) expands again; the head's render keeps nothing.
    #[test]
    fn an_expansion_is_taken_once() {
        let expansions = Expansions::default();
        let appset = serde_json::json!({"kind": "ApplicationSet", "metadata": {"name": "a"}});
        let other = serde_json::json!({"kind": "ApplicationSet", "metadata": {"name": "b"}});
        let runs = AtomicUsize::new(0);
        let expand = || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(vec![serde_json::json!({"kind": "Application"})])
        };
        let first = expansions.expand(&appset, true, expand);
        assert_eq!(expansions.expand(&appset, false, expand), first);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        expansions.expand(&other, false, expand).unwrap();
        expansions.expand(&appset, false, expand).unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert!(
            expansions.0.lock().unwrap().is_empty(),
            "kept by the second pass"
        );
    }
}
