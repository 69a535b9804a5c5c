//! The observer's kube-rs shell: watches, caches, reconcile, events, and the create path.
//! No generated Argo CD or Kargo types: the caches hold `projection::Cached` objects (the
//! fields the observer reads), the live reads before acting are `DynamicObject`s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::decision::{self, Decision, ObserveMode};
use super::metrics::{ErrorLabels, Metrics, OutcomeLabels, StageLabels};
use super::projection::{
    self, Cached, CachedApplication, CachedFreight, CachedPromotion, CachedStage, CachedWarehouse,
    Kind,
};

#[derive(Debug, Clone)]
pub struct ObserverConfig {
    pub mode: ObserveMode,
    pub resync: Duration,
    /// Watch Applications in this namespace only (None: all).
    pub namespace: Option<String>,
    /// Who is reporting Events (the pod name).
    pub instance: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("could not read an object: {0}")]
    Serialization(#[from] serde_json::Error),
}

impl ReconcileError {
    fn reason(&self) -> &'static str {
        match self {
            // Kargo's Promotion webhook refuses a subject without the promote verb with an
            // internal error wrapping the Forbidden (HTTP 500), and unavailable Freight or a
            // missing Stage as Invalid (422): all are refusals, not a broken API.
            ReconcileError::Kube(kube::Error::Api(status))
                if status.code == 403
                    || status.code == 422
                    || status.code == 404
                    || (status.code == 500 && status.message.contains("denied the request")) =>
            {
                "promotion_refused"
            }
            ReconcileError::Kube(_) => "kube_api",
            ReconcileError::Serialization(_) => "serialization",
        }
    }
}

pub struct Kinds {
    pub application: ApiResource,
    pub stage: ApiResource,
    pub freight: ApiResource,
    pub warehouse: ApiResource,
    pub promotion: ApiResource,
}

impl Default for Kinds {
    fn default() -> Self {
        Kinds {
            application: projection::Application::api_resource(),
            stage: projection::Stage::api_resource(),
            freight: projection::Freight::api_resource(),
            warehouse: projection::Warehouse::api_resource(),
            promotion: projection::Promotion::api_resource(),
        }
    }
}

/// A cache's objects grouped by (namespace, one field), rebuilt from the cache only when its
/// watch has delivered an event since the last build. A reconcile reads the Freight of its
/// Stage's Warehouses and the Promotions of its Stage: scanning every cached object for each of
/// 50,000 Applications made the first pass quadratic.
pub struct Grouped<K> {
    /// Bumped after every event the cache's reflector has applied.
    pub generation: Arc<std::sync::atomic::AtomicU64>,
    field: &'static [&'static str],
    built: std::sync::Mutex<(u64, Arc<Groups<K>>)>,
}

/// Objects by (namespace, field value), each with its position in the cache's listing (so a
/// union of groups keeps the cache's order).
type Groups<K> = std::collections::HashMap<(String, String), Vec<(usize, Arc<Cached<K>>)>>;

impl<K: Kind> Grouped<K> {
    pub fn new(field: &'static [&'static str]) -> Grouped<K> {
        Grouped {
            generation: Default::default(),
            field,
            built: std::sync::Mutex::new((u64::MAX, Default::default())),
        }
    }

    /// The objects of `namespace` whose field is one of `values`, in the cache's order.
    fn select(
        &self,
        store: &Store<Cached<K>>,
        namespace: &str,
        values: &[&str],
    ) -> Vec<Arc<Cached<K>>> {
        let groups = {
            let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
            // Read before the cache: an event landing in between only makes the next build
            // come sooner.
            let generation = self.generation.load(std::sync::atomic::Ordering::Acquire);
            if built.0 != generation {
                let mut groups = Groups::new();
                for (position, object) in store.state().into_iter().enumerate() {
                    let Some(namespace) = object.namespace() else {
                        continue;
                    };
                    let key = (namespace, object.text(self.field).into_owned());
                    groups.entry(key).or_default().push((position, object));
                }
                *built = (generation, Arc::new(groups));
            }
            built.1.clone()
        };
        let mut selected: Vec<&(usize, Arc<Cached<K>>)> = Vec::new();
        for (i, value) in values.iter().enumerate() {
            if values[..i].contains(value) {
                continue;
            }
            if let Some(group) = groups.get(&(namespace.to_string(), value.to_string())) {
                selected.extend(group);
            }
        }
        selected.sort_by_key(|(position, _)| *position);
        selected.into_iter().map(|(_, o)| o.clone()).collect()
    }
}

/// One async lock per (namespace, Stage).
pub type StageLocks =
    std::sync::Mutex<std::collections::HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>>;

pub struct Context {
    pub client: Client,
    pub config: ObserverConfig,
    pub kinds: Kinds,
    pub stages: Store<CachedStage>,
    pub freights: Store<CachedFreight>,
    pub warehouses: Store<CachedWarehouse>,
    pub promotions: Store<CachedPromotion>,
    /// Freight by (namespace, origin Warehouse).
    pub freights_by_origin: Grouped<projection::Freight>,
    /// Promotions by (namespace, Stage).
    pub promotions_by_stage: Grouped<projection::Promotion>,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// One lock per Stage around "check in flight, then create": reconciles of several
    /// Applications of one Stage run concurrently and must not both create.
    pub stage_locks: StageLocks,
    /// True once every cache has its first list.
    pub caches_ready: tokio::sync::watch::Receiver<bool>,
    /// Whether a reconcile found the caches still loading (and so decided nothing).
    pub skipped_while_loading: std::sync::atomic::AtomicBool,
}

/// An object read from the API server (not a cache) as JSON.
fn value_of(object: &DynamicObject) -> Result<Value, serde_json::Error> {
    serde_json::to_value(object)
}

fn hash_of(value: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(value)
}

/// What the watch on Applications reacts to: the annotations the observer reads, the deployed
/// images and the uid (every kept field). Other status churn (reconciledAt, health) does not
/// wake it.
fn relevant_hash(app: &CachedApplication) -> u64 {
    hash_of(app.kept())
}

/// An Application's key in `relevant_changes`: a hash of its namespace and name.
fn app_key(app: &CachedApplication) -> u64 {
    hash_of((&app.meta().namespace, &app.meta().name))
}

/// Passes an Application on only when `relevant_hash` changed. It remembers one `u64` per
/// Application (kube's `predicate_filter` keys on an `ObjectRef`: its name, namespace and
/// resourceVersion strings), forgets it when the Application is deleted, and after a re-list
/// keeps only the Applications listed.
fn relevant_changes(
    stream: impl futures::Stream<Item = Result<watcher::Event<CachedApplication>, watcher::Error>>,
) -> impl futures::Stream<Item = Result<CachedApplication, watcher::Error>> {
    use std::collections::HashMap;
    let mut last: HashMap<u64, u64> = HashMap::new();
    // What a re-list in progress has seen.
    let mut listed: Option<HashMap<u64, u64>> = None;
    stream.filter_map(move |item| {
        let passed = match item {
            Err(e) => Some(Err(e)),
            Ok(watcher::Event::Apply(app)) => {
                let hash = relevant_hash(&app);
                (last.insert(app_key(&app), hash) != Some(hash)).then_some(Ok(app))
            }
            Ok(watcher::Event::Delete(app)) => {
                last.remove(&app_key(&app));
                None
            }
            Ok(watcher::Event::Init) => {
                listed = Some(HashMap::new());
                None
            }
            Ok(watcher::Event::InitApply(app)) => {
                let (key, hash) = (app_key(&app), relevant_hash(&app));
                listed.get_or_insert_default().insert(key, hash);
                (last.get(&key) != Some(&hash)).then_some(Ok(app))
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(listed) = listed.take() {
                    last = listed;
                }
                None
            }
        };
        futures::future::ready(passed)
    })
}

/// An Event on the Application, related to the object it concerns (the Stage, or the Promotion
/// created): events with the same reason on one Application stay apart.
async fn publish(
    ctx: &Context,
    app: &CachedApplication,
    related: ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let reference = app.object_ref(&());
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Observe".into(),
        secondary: Some(related),
    };
    // Events are best effort, but an API server's passing 5xx or throttling should not lose
    // the one a person reads to learn why a Promotion appeared: three tries, then a warning.
    let mut attempt = 0u32;
    let outcome = loop {
        match ctx.recorder.publish(&event, &reference).await {
            // Only answers that say the Event was not stored are retried (a timeout may have
            // stored it, and a new attempt would make a second one).
            Err(kube::Error::Api(status))
                if attempt < 2 && matches!(status.code, 429 | 500 | 502 | 503) =>
            {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100 << attempt)).await;
            }
            outcome => break outcome,
        }
    };
    if let Err(e) = outcome {
        warn!(error = %e, "could not publish an Event");
    }
}

fn outcome(ctx: &Context, outcome: &'static str) {
    ctx.metrics
        .reconciles
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

pub async fn reconcile(
    app: Arc<CachedApplication>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    if !*ctx.caches_ready.borrow() {
        // The Application cache can be ready before the others, and deciding on a Stage or
        // Freight cache still loading would miss a drift or report a FreightMissing that is
        // not. Nothing is decided (or counted) now: once every cache has its first list, every
        // Application is reconciled (the first resync tick). Waiting here instead would hold
        // the controller's slots, and with them the watches that fill the caches. The skip is
        // recorded before looking again, so the tick cannot miss it.
        ctx.skipped_while_loading
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if !*ctx.caches_ready.borrow() {
            return Ok(Action::await_change());
        }
    }
    let started = Instant::now();
    let result = reconcile_inner(&app, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    result
}

async fn reconcile_inner(app: &CachedApplication, ctx: &Context) -> Result<Action, ReconcileError> {
    let app_value = app.expand();
    let app_name = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
    let stages = match decision::observed_stages(&app_value, ctx.config.mode) {
        Ok(stages) => stages,
        Err(reason) => {
            debug!(application = %app_name, reason, "not observed");
            outcome(ctx, "not_observed");
            return Ok(Action::await_change());
        }
    };
    for (namespace, stage_name) in stages {
        let at = StageAt {
            app,
            app_value: &app_value,
            app_name: &app_name,
            labels: StageLabels {
                namespace: namespace.clone(),
                stage: stage_name.clone(),
            },
            namespace,
            stage_name,
        };
        if let Some(action) = reconcile_stage(ctx, &at).await? {
            return Ok(action);
        }
    }
    // The periodic resync (`reconcile_all_on`) is the backstop: a per-Application requeue
    // would hold 10,000 scheduler entries for the whole resync period.
    Ok(Action::await_change())
}

/// One Stage an Application is observed for.
struct StageAt<'a> {
    app: &'a CachedApplication,
    app_value: &'a Value,
    app_name: &'a str,
    labels: StageLabels,
    namespace: String,
    stage_name: String,
}

/// What the caches hold for one Stage's decision.
struct StageInputs {
    /// The Warehouses its `requestedFreight` names.
    origins: Vec<String>,
    warehouses: Vec<Value>,
    freights: Vec<Value>,
    promotions: Vec<Value>,
}

impl StageInputs {
    /// Reads only what this Stage needs from the caches (serialising every cached object for
    /// every reconcile made a first pass over 10,000 Applications take a minute).
    fn read(ctx: &Context, namespace: &str, stage_name: &str, stage: &Value) -> StageInputs {
        let origins: Vec<String> = stage
            .pointer("/spec/requestedFreight")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| {
                r.pointer("/origin/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect();
        let warehouses: Vec<Value> = origins
            .iter()
            .filter_map(|o| ctx.warehouses.get(&ObjectRef::new(o).within(namespace)))
            .map(|w| w.expand())
            .collect();
        let origin_names: Vec<&str> = origins.iter().map(String::as_str).collect();
        let freights: Vec<Value> = ctx
            .freights_by_origin
            .select(&ctx.freights, namespace, &origin_names)
            .iter()
            .map(|f| f.expand())
            .collect();
        let promotions: Vec<Value> = ctx
            .promotions_by_stage
            .select(&ctx.promotions, namespace, &[stage_name])
            .iter()
            .map(|p| p.expand())
            .collect();
        StageInputs {
            origins,
            warehouses,
            freights,
            promotions,
        }
    }

    fn decide(&self, app: &Value, stage: &Value) -> Decision {
        decision::decide(&decision::Inputs {
            app,
            stage,
            warehouses: &self.warehouses,
            freights: &self.freights,
            promotions: &self.promotions,
        })
    }
}

/// Decides for one Stage and acts: an Event, a metric, or a Promotion. `Some` ends the
/// Application's reconcile with that action.
async fn reconcile_stage(
    ctx: &Context,
    at: &StageAt<'_>,
) -> Result<Option<Action>, ReconcileError> {
    let (app_name, namespace, stage_name) = (at.app_name, &at.namespace, &at.stage_name);
    let key = ObjectRef::new(stage_name).within(namespace);
    let Some(stage) = ctx.stages.get(&key) else {
        debug!(application = %app_name, stage = %format!("{namespace}/{stage_name}"), "Stage not found");
        outcome(ctx, "skipped");
        return Ok(None);
    };
    let stage_ref = stage.object_ref(&());
    let stage = stage.expand();
    let mut inputs = StageInputs::read(ctx, namespace, stage_name, &stage);
    let mut decided = inputs.decide(at.app_value, &stage);
    // A Freight event lost on the way leaves the cache without the Freight that ends a
    // FreightMissing until the watch lists again: ask the API server before saying so.
    if matches!(decided, Decision::FreightMissing { .. }) {
        let live = live_freights(ctx, namespace, &inputs.origins).await?;
        if live.len() != inputs.freights.len() {
            inputs.freights = live;
            decided = inputs.decide(at.app_value, &stage);
        }
    }
    match decided {
        Decision::NoDrift => {
            ctx.metrics.freight_missing.get_or_create(&at.labels).set(0);
            outcome(ctx, "no_drift");
        }
        Decision::Wait(reason) => {
            debug!(application = %app_name, stage = %stage_name, %reason, "not drift yet");
            outcome(ctx, "waiting");
        }
        Decision::Skip(reason) => {
            debug!(application = %app_name, stage = %stage_name, %reason, "skipped");
            outcome(ctx, "skipped");
        }
        Decision::FreightMissing { drifted } => {
            let images: Vec<String> = drifted.iter().map(image_text).collect();
            let first_time = ctx.metrics.freight_missing.get_or_create(&at.labels).set(1) == 0;
            if first_time {
                publish(ctx, at.app, stage_ref, EventType::Warning, "FreightMissing", format!(
                    "no Freight in {namespace} holds {} for Stage {stage_name}; waiting for a Warehouse to discover it",
                    images.join(", ")
                ))
                .await;
            }
            info!(application = %app_name, stage = %stage_name, images = ?images, "FreightMissing");
            outcome(ctx, "freight_missing");
        }
        Decision::AlreadyFailed { freight, promotion } => {
            debug!(application = %app_name, stage = %stage_name, %freight, %promotion, "a Promotion of this Freight failed; delete it to retry");
            outcome(ctx, "already_failed");
        }
        Decision::Promote { freight, drifted } => {
            ctx.metrics.freight_missing.get_or_create(&at.labels).set(0);
            return promote(ctx, at, stage_ref, &inputs, freight, drifted).await;
        }
    }
    Ok(None)
}

/// The Freight of these origins in the namespace, listed from the API server.
async fn live_freights(
    ctx: &Context,
    namespace: &str,
    origins: &[String],
) -> Result<Vec<Value>, ReconcileError> {
    let freights_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &ctx.kinds.freight);
    Ok(freights_api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|f| {
            let origin = f
                .data
                .pointer("/origin/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            origins.iter().any(|x| x == origin)
        })
        .filter_map(|f| value_of(f).ok())
        .collect())
}

/// Creates the Promotion the caches decided on, under the Stage's lock, once the API
/// server's view confirms the decision. `None`: the Application's other Stages are still
/// owed their reconcile.
async fn promote(
    ctx: &Context,
    at: &StageAt<'_>,
    stage_ref: ObjectReference,
    inputs: &StageInputs,
    freight: String,
    drifted: Vec<decision::ImageRef>,
) -> Result<Option<Action>, ReconcileError> {
    let (app, app_name, namespace, stage_name) =
        (at.app, at.app_name, &at.namespace, &at.stage_name);
    let lock = ctx
        .stage_locks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((namespace.clone(), stage_name.clone()))
        .or_default()
        .clone();
    let _guard = lock.lock().await;
    // The caches can lag (a Promotion that just succeeded, a Stage whose history
    // moved): decide again from the API server's view before acting.
    let promotions_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &ctx.kinds.promotion);
    let stages_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &ctx.kinds.stage);
    let live_stage = value_of(&stages_api.get(stage_name).await?)?;
    // The Application too: a watch event lost on the way leaves the cache stale.
    let apps_api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &app.namespace().unwrap_or_default(),
        &ctx.kinds.application,
    );
    let live_app = value_of(&apps_api.get(&app.name_any()).await?)?;
    let live_promotions: Vec<Value> = promotions_api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.data.pointer("/spec/stage").and_then(Value::as_str) == Some(stage_name.as_str())
        })
        .filter_map(|p| value_of(p).ok())
        .collect();
    let confirmed = decision::decide(&decision::Inputs {
        app: &live_app,
        stage: &live_stage,
        warehouses: &inputs.warehouses,
        freights: &inputs.freights,
        promotions: &live_promotions,
    });
    if confirmed
        != (Decision::Promote {
            freight: freight.clone(),
            drifted: drifted.clone(),
        })
    {
        debug!(stage = %stage_name, ?confirmed, "the live view disagrees with the cache; not acting");
        outcome(ctx, "waiting");
        return Ok(Some(Action::requeue(Duration::from_secs(5))));
    }
    let api = promotions_api;
    let body = match decision::promotion_for(namespace, &live_stage, &freight) {
        Ok(body) => body,
        Err(why) => {
            warn!(application = %app_name, stage = %stage_name, %why, "no Promotion: the Stage cannot be promoted");
            publish(ctx, app, stage_ref, EventType::Warning, "StageHasNoSteps", format!(
                "Argo CD runs a tag Kargo never promoted, but no Promotion can be created: {why}"
            ))
            .await;
            outcome(ctx, "refused");
            // The Application's other Stages are still owed their reconcile.
            return Ok(None);
        }
    };
    let body: DynamicObject = serde_json::from_value(body)?;
    let created = api.create(&PostParams::default(), &body).await?;
    let images: Vec<String> = drifted.iter().map(image_text).collect();
    ctx.metrics
        .promotions_created
        .get_or_create(&at.labels)
        .inc();
    info!(application = %app_name, stage = %stage_name, %freight, promotion = %created.name_any(), "created a Promotion");
    publish(ctx, app, created.object_ref(&ctx.kinds.promotion), EventType::Normal, "PromotionCreated", format!(
        "Argo CD runs {} which Kargo never promoted to Stage {stage_name}: created Promotion {} of Freight {freight}",
        images.join(", "),
        created.name_any()
    ))
    .await;
    outcome(ctx, "promoted");
    // One Promotion per reconcile; Kargo's change to the Stage brings the next.
    Ok(Some(Action::await_change()))
}

fn image_text(image: &decision::ImageRef) -> String {
    match (&image.tag, &image.digest) {
        (_, Some(digest)) => format!("{}@{digest}", image.repository),
        (Some(tag), None) => format!("{}:{tag}", image.repository),
        (None, None) => image.repository.clone(),
    }
}

pub fn error_policy(
    app: Arc<CachedApplication>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&ErrorLabels {
            reason: error.reason(),
        })
        .inc();
    warn!(application = %app.name_any(), reason = error.reason(), error = %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Applications that name `namespace:stage` (or any Stage of the namespace) in their
/// authorized-stage annotation.
fn applications_for(
    apps: &Store<CachedApplication>,
    namespace: &str,
    stage: Option<&str>,
) -> Vec<ObjectRef<CachedApplication>> {
    let needle = match stage {
        Some(stage) => format!("{namespace}:{stage}"),
        None => format!("{namespace}:"),
    };
    apps.state()
        .iter()
        .filter(|app| {
            let value = app.text(&[
                "metadata",
                "annotations",
                decision::AUTHORIZED_STAGE_ANNOTATION,
            ]);
            // A cheap substring test first: this runs for every watched object's event.
            value.contains(&needle)
                && decision::authorized_stages(&value)
                    .0
                    .iter()
                    .any(|(ns, s)| ns == namespace && stage.is_none_or(|wanted| s == wanted))
        })
        .map(|app| ObjectRef::from_obj(app.as_ref()))
        .collect()
}

/// The Applications of the Stages of a namespace that request Freight from a Warehouse.
fn applications_for_warehouse(
    apps: &Store<CachedApplication>,
    stages: &Store<CachedStage>,
    namespace: &str,
    warehouse: &str,
) -> Vec<ObjectRef<CachedApplication>> {
    stages
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace))
        .filter(|s| {
            s.field(&["spec", "requestedFreight"])
                .as_ref()
                .and_then(Value::as_array)
                .is_some_and(|r| {
                    r.iter().any(|r| {
                        r.pointer("/origin/name").and_then(Value::as_str) == Some(warehouse)
                    })
                })
        })
        .flat_map(|s| applications_for(apps, namespace, Some(&s.name_any())))
        .collect()
}

/// Counts the caches still waiting for their first complete list; `loaded` (the observer's
/// readiness) turns true when none is. (kube's `Store::wait_until_ready` wakes only the last of several waiters, so a
/// readiness task and the controller waiting on the same store could wait forever: the
/// observer watches each stream's first `InitDone` itself.)
struct Loading {
    pending: std::sync::atomic::AtomicUsize,
    loaded: tokio::sync::watch::Sender<bool>,
}

impl Loading {
    /// Starts not ready (a new leader is not ready until its caches are loaded).
    fn new(caches: usize, ready: tokio::sync::watch::Sender<bool>) -> Arc<Loading> {
        ready.send_replace(false);
        Arc::new(Loading {
            pending: caches.into(),
            loaded: ready,
        })
    }

    /// For `inspect_ok` after `reflect`: counts this cache loaded at its first `InitDone` (the
    /// reflector has swapped the list into the store by then).
    fn tracker<K>(self: &Arc<Self>) -> impl FnMut(&watcher::Event<K>) + Send + use<K> {
        let loading = self.clone();
        let mut counted = false;
        move |event| {
            if !counted && matches!(event, watcher::Event::InitDone) {
                counted = true;
                let before = loading
                    .pending
                    .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                if before == 1 {
                    loading.loaded.send_replace(true);
                }
            }
        }
    }
}

/// A cache of one kind (each object read as its `Cached` form) and the stream of the objects
/// its events touch; its first list counts it loaded, and each event bumps `generation` when
/// one is given.
fn kind_cache<K: Kind>(
    client: &Client,
    generation: Option<&Arc<std::sync::atomic::AtomicU64>>,
    loading: &Arc<Loading>,
) -> (
    Store<Cached<K>>,
    impl futures::Stream<Item = Result<Cached<K>, watcher::Error>> + Send + use<K>,
) {
    let generation = generation.cloned();
    let writer = reflector::store::Writer::default();
    let reader = writer.as_reader();
    let api: Api<Cached<K>> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .inspect_ok(loading.tracker())
        .inspect_ok(move |_| {
            if let Some(generation) = &generation {
                generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        })
        .touched_objects();
    (reader, stream)
}

/// When every Application is reconciled: once every cache has its first list (when a
/// reconcile skipped while they loaded: otherwise each has had its reconcile already), then
/// each `resync`.
fn resync_ticks(ctx: Arc<Context>, resync: Duration) -> impl futures::Stream<Item = ()> {
    let mut loaded = ctx.caches_ready.clone();
    futures::stream::once(async move {
        let _ = loaded.wait_for(|ready| *ready).await;
        ctx.skipped_while_loading
            .load(std::sync::atomic::Ordering::SeqCst)
    })
    .filter_map(|skipped| futures::future::ready(skipped.then_some(())))
    .chain(futures::stream::unfold((), move |_| async move {
        tokio::time::sleep(resync).await;
        Some(((), ()))
    }))
}

/// Runs the controller until `shutdown` resolves. Returns when the controller has stopped.
/// `ready` turns true once every cache has its first list.
pub async fn run(
    client: Client,
    config: ObserverConfig,
    metrics: Arc<Metrics>,
    ready: tokio::sync::watch::Sender<bool>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let kinds = Kinds::default();
    let apps_api: Api<CachedApplication> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let loading = Loading::new(5, ready);
    let freights_by_origin = Grouped::new(&["origin", "name"]);
    let promotions_by_stage = Grouped::new(&["spec", "stage"]);
    let (stages, stage_events) = kind_cache::<projection::Stage>(&client, None, &loading);
    let (freights, freight_events) =
        kind_cache::<projection::Freight>(&client, Some(&freights_by_origin.generation), &loading);
    let (warehouses, warehouse_events) =
        kind_cache::<projection::Warehouse>(&client, None, &loading);
    let (promotions, promotion_events) = kind_cache::<projection::Promotion>(
        &client,
        Some(&promotions_by_stage.generation),
        &loading,
    );

    let app_writer = reflector::store::Writer::default();
    let app_reader = app_writer.as_reader();
    let app_stream = relevant_changes(
        watcher(apps_api, watcher::Config::default())
            .default_backoff()
            .reflect(app_writer)
            .inspect_ok(loading.tracker()),
    );

    let caches_ready = loading.loaded.subscribe();
    let reporter = Reporter {
        controller: "kargo-argocd-observer".into(),
        instance: Some(config.instance.clone()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let ctx = Arc::new(Context {
        client: client.clone(),
        config: config.clone(),
        kinds,
        stages: stages.clone(),
        freights: freights.clone(),
        warehouses: warehouses.clone(),
        promotions: promotions.clone(),
        freights_by_origin,
        promotions_by_stage,
        metrics,
        recorder,
        stage_locks: Default::default(),
        caches_ready,
        skipped_while_loading: false.into(),
    });

    let resync_ticks = resync_ticks(ctx.clone(), config.resync);
    let (for_stages, for_freights, for_warehouses, for_promotions) = (
        app_reader.clone(),
        app_reader.clone(),
        app_reader.clone(),
        app_reader.clone(),
    );
    let (stages_for_freights, stages_for_warehouses) = (stages.clone(), stages.clone());
    // While the caches load, a watched object's event maps to no Application: every
    // Application is reconciled once they have loaded (its own first event, or the first tick
    // when that came too early), and mapping each of 10,000 Freight to the Applications of its
    // Stages would scan every Stage and Application 10,000 times.
    let loaded = |ctx: &Context| {
        let ready = ctx.caches_ready.clone();
        move || *ready.borrow()
    };
    let (stages_loaded, freights_loaded, warehouses_loaded, promotions_loaded) =
        (loaded(&ctx), loaded(&ctx), loaded(&ctx), loaded(&ctx));
    Controller::for_stream(app_stream, app_reader)
        // A Stage change re-enqueues the Applications that point at it.
        .watches_stream(stage_events, move |stage: CachedStage| {
            if !stages_loaded() {
                return Vec::new();
            }
            applications_for(
                &for_stages,
                &stage.namespace().unwrap_or_default(),
                Some(&stage.name_any()),
            )
        })
        // New Freight can end a FreightMissing; a finished Promotion can unblock the next.
        .watches_stream(freight_events, move |f: CachedFreight| {
            if !freights_loaded() {
                return Vec::new();
            }
            applications_for_warehouse(
                &for_freights,
                &stages_for_freights,
                &f.namespace().unwrap_or_default(),
                &f.text(&["origin", "name"]),
            )
        })
        .watches_stream(warehouse_events, move |w: CachedWarehouse| {
            if !warehouses_loaded() {
                return Vec::new();
            }
            applications_for_warehouse(
                &for_warehouses,
                &stages_for_warehouses,
                &w.namespace().unwrap_or_default(),
                &w.name_any(),
            )
        })
        .watches_stream(promotion_events, move |p: CachedPromotion| {
            if !promotions_loaded() {
                return Vec::new();
            }
            let stage = p.field(&["spec", "stage"]);
            applications_for(
                &for_promotions,
                &p.namespace().unwrap_or_default(),
                stage.as_ref().and_then(Value::as_str),
            )
        })
        // Bounded concurrency: at start every Application is due at once, and 10,000
        // concurrent reconciles cost memory without going faster on a few cores.
        .with_config(kube::runtime::controller::Config::default().concurrency(16))
        .reconcile_all_on(resync_ticks)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "controller event");
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
