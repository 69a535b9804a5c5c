//! Sharded checks: `gate check --shard I/N` renders one shard of the fleet at both commits and
//! writes a partial result; `gate merge` combines the partials of every shard into the verdict
//! one unsharded check gives.
//!
//! A shard ([`render::render_shard`]) renders the Applications whose shard key falls in it
//! ([`render::shard_key`]: the Application's sources without `targetRevision`, its destination
//! namespace, its name where it may be helm's release name), so the Applications that share
//! one render share one shard and a chart bump moves none; the head's keys are dealt out over
//! the shards chart by chart ([`render::Stripes`], read by each shard and by the merge from
//! the head's common path, never from a partial). Both sides of an Application's diff
//! are rendered by one shard: an Application the head holds goes where the head's spec puts
//! it at both commits ([`render::render_shard_dealt`], against the head), one only the merge base holds where
//! its base spec puts it. The children a helm or kustomize render of the shard produces stay in
//! it; every shard expands every ApplicationSet and renders every Application of plain
//! manifests (no process: how each shard finds its own).
//!
//! The merge puts both commits' renderings back together and judges them with the check's
//! own code ([`check::judge`]): every rule that looks across Applications (CRD versions
//! served against those declared anywhere in the repository, kinds a cluster does not serve,
//! CRDs added or removed, Applications removed, the repository scan) sees the whole fleet,
//! so the verdict is the unsharded one by construction, not by a second implementation. A
//! partial carries what needs helm or the chart mirror: the renders, each moved chart's
//! own render, its default values. The merge reads the repository (both commits) for the
//! rules' scan of the manifests, as the check does.
//!
//! A partial is another job's file, so the merge binds the partials to the repository and to
//! each other before it judges ([`bind`]), at each commit: the head the partials name is a
//! commit the repository holds and the merge base is the one the merge computes itself; every
//! shard read every Application and ApplicationSet of the repository's files (the merge lists
//! them itself, reading, not rendering) and every shard reached the same ones on the path
//! every shard follows; every Application on that path is held by the shard of its key (the
//! merge computes each key from the file declaring it, else from the spec it is held with),
//! one a shard says a file declares is that file's, with that file's spec; and every
//! Application a shard holds is on that path and its key's, or a render only that shard runs
//! deploys it (a parent whose sources the repository says are helm or kustomize, not the
//! partial's word). Every shard records the digest of each Application on that path as its
//! render keeps it ([`render::RenderStats::shard_common_specs`]: what an ApplicationSet
//! generates, what a parent of plain manifests deploys, what a file declares); every shard
//! must give the same, and the shard holding one holds it with that spec (the merge does not
//! expand ApplicationSets itself: a goTemplate one runs helm's engine). The merge also reads
//! again, from each held Application's spec, the inventory and the repository, what needs no
//! process ([`as_the_repository_renders`]): its identity, destination and stored form, the
//! objects of one of plain manifests, and for one with a helm or kustomize source beside
//! directories of manifests, each object of those directories among its own; and a shard
//! credits a parent only for a render it ran ([`credits_of_its_own_renders`]). A partial
//! that leaves out, adds or shadows another shard's Application, gives one on the common
//! path another spec, or forges what plain manifests render, beside a chart or not, is
//! refused; what a shard's own helm and kustomize renders hold is its word.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest as _;

use super::check::{self, Judged};
use super::diff::{self, AppKey, ChartMove};
use super::verdict::{ChartDefaults, GateResult};
use crate::render::confine::Confinement;
use crate::render::inventory::Inventory;
use crate::render::parsed::Object;
use crate::render::repos::RepoResolver;
use crate::render::{
    self, ClusterRef, Known, Origin, RenderConfig, RenderedApplication, Rendering, Root, Shard,
};

/// The partial result's format, written in every partial and checked by the merge.
pub const FORMAT: &str = "gitops-gate/check-partial/v6";

/// One shard's part of a check.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Partial {
    pub format: String,
    /// Which shard (`index` from 0) of how many.
    pub shard: Shard,
    pub base: String,
    pub head: String,
    /// SHA-256 of the inventory as this shard read it: every shard must judge against one.
    pub inventory_digest: String,
    pub inventory: Inventory,
    /// The repository's URL as its Applications write it (`--repo-url`, else `origin`): the
    /// merge reads the sources naming it from the repository.
    #[serde(default)]
    pub repo_url: Option<String>,
    #[serde(default)]
    pub confinement: Option<Confinement>,
    /// Set when this shard could not decide: why, per commit.
    #[serde(default)]
    pub undecided: Option<Undecided>,
    /// Every object the Applications below render, once (they name them by index).
    #[serde(default, deserialize_with = "shared_objects")]
    pub objects: Vec<Object>,
    #[serde(default)]
    pub base_applications: Vec<WireApp>,
    #[serde(default)]
    pub head_applications: Vec<WireApp>,
    /// Origins this shard saw credited to a parent for Applications of other shards.
    #[serde(default)]
    pub base_credits: BTreeMap<String, Origin>,
    #[serde(default)]
    pub head_credits: BTreeMap<String, Origin>,
    /// Every Application and ApplicationSet this shard reached on a path every shard follows
    /// ([`render::RenderStats::shard_known`]), whoever owns it, at each commit.
    #[serde(default)]
    pub base_known: Shared<Vec<Known>>,
    #[serde(default)]
    pub head_known: Shared<Vec<Known>>,
    /// The digest ([`render::application_digest`]) of every Application on that path as this
    /// shard's render keeps it ([`render::RenderStats::shard_common_specs`]), by identity, at
    /// each commit: every shard gives the same, and the Application's holder holds it so.
    #[serde(default)]
    pub base_common_specs: Shared<BTreeMap<String, String>>,
    #[serde(default)]
    pub head_common_specs: Shared<BTreeMap<String, String>>,
    /// What rendering each of the head's shard keys costs ([`render::key_weight`]: read from
    /// the specs and this shard's chart mirror), as this shard dealt them: every shard gives
    /// the same, and the merge deals the keys by them ([`render::Stripes::weighted`]).
    #[serde(default)]
    pub head_weights: BTreeMap<String, u64>,
    /// This shard's head Applications whose chart moved, rendered at the base's versions.
    #[serde(default)]
    pub old_versions: Vec<WireApp>,
    /// The default values of the chart moves of this shard's Applications.
    #[serde(default)]
    pub chart_defaults: Vec<ChartDefaults>,
}

/// The objects of partials read together ([`Partial::from_slice`]), by their JSON text: an
/// object several partials hold (one chart's CRDs, which many shards render) is parsed once
/// and shared. Eight shards of a fleet with CRD-heavy charts hold about 52 MB of objects,
/// 7 MB of them distinct. So are the parts every shard writes alike ([`Shared`]).
#[derive(Default)]
pub struct SharedObjects {
    objects: Mutex<HashMap<Box<str>, Object, TextHash>>,
    parts: Mutex<HashMap<std::any::TypeId, PartsByText>>,
}

/// Texts of megabytes are hashed with foldhash (seeded per process), not SipHash: a third of
/// the hashing's time in a merge of 8.
type TextHash = foldhash::fast::RandomState;
type SharedPart = Arc<dyn std::any::Any + Send + Sync>;
/// The parts of one type read so far, by their JSON text.
type PartsByText = HashMap<Box<str>, SharedPart, TextHash>;

/// A part of a partial every honest shard writes alike, byte for byte (what the path every
/// shard follows reaches, and the digests of its Applications: 2 MB of a fleet of 5,000):
/// partials read together ([`Partial::from_slice`]) whose text of it is the same share one
/// parse of it (one text, one value). Read and written as its value; changed in place
/// (a test's forgery) on a copy of its own.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Shared<T>(Arc<T>);

impl<T> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> std::ops::DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Shared<T> {
        Shared(Arc::new(value))
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T> Deserialize<'de> for Shared<T>
where
    T: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text: Box<serde_json::value::RawValue> = Deserialize::deserialize(deserializer)?;
        let parse = |text: &str| {
            serde_json::from_str::<T>(text)
                .map(|value| Arc::new(value))
                .map_err(serde::de::Error::custom)
        };
        let Some(shared) = SHARING.with(|s| s.borrow().clone()) else {
            return parse(text.get()).map(Shared);
        };
        let kind = std::any::TypeId::of::<T>();
        let lock = || shared.parts.lock().unwrap_or_else(|p| p.into_inner());
        let known = lock()
            .get(&kind)
            .and_then(|texts| texts.get(text.get()))
            .cloned()
            .and_then(|part| part.downcast::<T>().ok());
        if let Some(value) = known {
            return Ok(Shared(value));
        }
        let value = parse(text.get())?;
        let kept: SharedPart = value.clone();
        lock()
            .entry(kind)
            .or_default()
            .entry(text.into())
            .or_insert(kept);
        Ok(Shared(value))
    }
}

thread_local! {
    /// The [`SharedObjects`] of the partial this thread is reading, if any.
    static SHARING: std::cell::RefCell<Option<Arc<SharedObjects>>> =
        const { std::cell::RefCell::new(None) };
}

/// A partial's objects, each parsed once per [`SharedObjects`] (its text is the key: the
/// same text is the same object).
fn shared_objects<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Object>, D::Error> {
    let texts: Vec<Box<serde_json::value::RawValue>> = Deserialize::deserialize(deserializer)?;
    let sharing = SHARING.with(|s| s.borrow().clone());
    let parse = |text: &str| {
        serde_json::from_str::<Value>(text)
            .map(Arc::new)
            .map_err(serde::de::Error::custom)
    };
    let Some(shared) = sharing else {
        return texts.iter().map(|text| parse(text.get())).collect();
    };
    let lock = || shared.objects.lock().unwrap_or_else(|p| p.into_inner());
    texts
        .into_iter()
        .map(|text| {
            if let Some(object) = lock().get(text.get()) {
                return Ok(object.clone());
            }
            let object = parse(text.get())?;
            Ok(lock().entry(text.into()).or_insert(object).clone())
        })
        .collect()
}

impl Partial {
    /// A partial from its file's bytes; its objects are shared through `shared` with the
    /// other partials read with it (each parsed once).
    pub fn from_slice(bytes: &[u8], shared: &Arc<SharedObjects>) -> serde_json::Result<Partial> {
        /// Clears this thread's sharing however the read ends (a panic included).
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                SHARING.with(|s| *s.borrow_mut() = None);
            }
        }
        SHARING.with(|s| *s.borrow_mut() = Some(shared.clone()));
        let _reset = Reset;
        serde_json::from_slice(bytes)
    }
}

/// Why a shard could not decide: the error lines at the head and at the merge base.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Undecided {
    pub head: Vec<String>,
    pub base: Vec<String>,
}

/// A rendered Application as a partial holds it: every field, its objects by index. On the
/// wire its stored form and its sources are left out where they are the manifest's (its
/// stored form is, for an Application generated or declared in stored form; its sources are
/// its spec's whenever it rendered): a third of a partial's Applications' bytes, and of the
/// merge's parsing of them. Absent, each is read as the manifest's.
#[derive(Debug)]
pub struct WireApp {
    pub name: String,
    pub namespace: String,
    pub project: String,
    pub origin: Origin,
    pub cluster: ClusterRef,
    pub destination_namespace: String,
    pub sources: Vec<Value>,
    pub objects: Vec<usize>,
    pub render_keys: Vec<String>,
    pub manifest: Value,
    pub stored: Value,
    pub destination_unknown: Option<String>,
    pub values_files: Vec<String>,
}

/// [`WireApp`] as written: its stored form and sources only where they are not the
/// manifest's.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireOut<'a> {
    name: &'a str,
    namespace: &'a str,
    project: &'a str,
    origin: &'a Origin,
    cluster: &'a ClusterRef,
    destination_namespace: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sources: Option<&'a [Value]>,
    objects: &'a [usize],
    render_keys: &'a [String],
    manifest: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    stored: Option<&'a Value>,
    destination_unknown: &'a Option<String>,
    values_files: &'a [String],
}

/// [`WireApp`] as read: a stored form or sources left out are the manifest's.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireIn {
    name: String,
    namespace: String,
    project: String,
    origin: Origin,
    cluster: ClusterRef,
    destination_namespace: String,
    #[serde(default)]
    sources: Option<Vec<Value>>,
    objects: Vec<usize>,
    render_keys: Vec<String>,
    manifest: Value,
    #[serde(default)]
    stored: Option<Value>,
    #[serde(default)]
    destination_unknown: Option<String>,
    #[serde(default)]
    values_files: Vec<String>,
}

impl Serialize for WireApp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let own_sources = self.sources[..] != *render::source::source_slice(&self.manifest);
        WireOut {
            name: &self.name,
            namespace: &self.namespace,
            project: &self.project,
            origin: &self.origin,
            cluster: &self.cluster,
            destination_namespace: &self.destination_namespace,
            sources: own_sources.then_some(&self.sources[..]),
            objects: &self.objects,
            render_keys: &self.render_keys,
            manifest: &self.manifest,
            stored: (self.stored != self.manifest).then_some(&self.stored),
            destination_unknown: &self.destination_unknown,
            values_files: &self.values_files,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for WireApp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireIn::deserialize(deserializer)?;
        Ok(WireApp {
            sources: wire
                .sources
                .unwrap_or_else(|| render::source::source_slice(&wire.manifest).to_vec()),
            stored: wire.stored.unwrap_or_else(|| wire.manifest.clone()),
            name: wire.name,
            namespace: wire.namespace,
            project: wire.project,
            origin: wire.origin,
            cluster: wire.cluster,
            destination_namespace: wire.destination_namespace,
            objects: wire.objects,
            render_keys: wire.render_keys,
            manifest: wire.manifest,
            destination_unknown: wire.destination_unknown,
            values_files: wire.values_files,
        })
    }
}

/// The object table a partial is written with: each shared object once.
#[derive(Default)]
struct Table {
    index: HashMap<usize, usize>,
    objects: Vec<Object>,
}

impl Table {
    fn wire(&mut self, app: &RenderedApplication) -> WireApp {
        let objects = app
            .objects
            .iter()
            .map(|object| {
                *self
                    .index
                    .entry(Arc::as_ptr(object) as usize)
                    .or_insert_with(|| {
                        self.objects.push(object.clone());
                        self.objects.len() - 1
                    })
            })
            .collect();
        WireApp {
            name: app.name.clone(),
            namespace: app.namespace.clone(),
            project: app.project.clone(),
            origin: app.origin.clone(),
            cluster: app.cluster.clone(),
            destination_namespace: app.destination_namespace.clone(),
            sources: app.sources.clone(),
            objects,
            render_keys: app.render_keys.clone(),
            manifest: app.manifest.clone(),
            stored: app.stored.clone(),
            destination_unknown: app.destination_unknown.clone(),
            values_files: app.values_files.clone(),
        }
    }
}

fn unwire(app: WireApp, objects: &[Object], shard: Shard) -> Result<RenderedApplication, String> {
    let resolved = app
        .objects
        .iter()
        .map(|&at| {
            objects.get(at).cloned().ok_or_else(|| {
                format!(
                    "the partial of shard {} names object {at}, which it does not hold",
                    label(shard)
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RenderedApplication {
        name: app.name,
        namespace: app.namespace,
        project: app.project,
        origin: app.origin,
        cluster: app.cluster,
        destination_namespace: app.destination_namespace,
        sources: app.sources,
        objects: resolved,
        render_keys: app.render_keys,
        manifest: app.manifest,
        stored: app.stored,
        destination_unknown: app.destination_unknown,
        values_files: app.values_files,
    })
}

/// `I/N` as a person writes it (I from 1).
pub fn label(shard: Shard) -> String {
    format!("{}/{}", shard.index + 1, shard.count)
}

/// Reads `I/N` (1 <= I <= N, N at most 1024) into a [`Shard`].
pub fn parse_shard(text: &str) -> Result<Shard, String> {
    let (index, count) = text
        .split_once('/')
        .ok_or("expected I/N, e.g. 2/8 (shard 2 of 8)")?;
    let index: usize = index.trim().parse().map_err(|_| "I is not a number")?;
    let count: usize = count.trim().parse().map_err(|_| "N is not a number")?;
    if count == 0 || count > 1024 {
        return Err("N must be between 1 and 1024".into());
    }
    if index == 0 || index > count {
        return Err(format!("I must be between 1 and {count}"));
    }
    Ok(Shard {
        index: index - 1,
        count,
    })
}

/// SHA-256 of the inventory's JSON form.
pub fn inventory_digest(inventory: &Inventory) -> String {
    let bytes = serde_json::to_vec(inventory).unwrap_or_default();
    crate::git::hex(&sha2::Sha256::digest(&bytes))
}

impl Partial {
    fn new(
        shard: Shard,
        base: &str,
        head: &str,
        inventory: &Inventory,
        repo_url: Option<&str>,
    ) -> Partial {
        Partial {
            format: FORMAT.to_string(),
            shard,
            base: base.to_string(),
            head: head.to_string(),
            inventory_digest: inventory_digest(inventory),
            inventory: inventory.clone(),
            repo_url: repo_url.map(str::to_string),
            confinement: None,
            undecided: None,
            objects: Vec::new(),
            base_applications: Vec::new(),
            head_applications: Vec::new(),
            base_credits: BTreeMap::new(),
            head_credits: BTreeMap::new(),
            base_known: Shared::default(),
            head_known: Shared::default(),
            base_common_specs: Shared::default(),
            head_common_specs: Shared::default(),
            head_weights: BTreeMap::new(),
            old_versions: Vec::new(),
            chart_defaults: Vec::new(),
        }
    }

    /// The partial of a shard whose check was undecided before it rendered (the commits could
    /// not be resolved): the verdict's errors, as the head's.
    pub fn undecided(
        result: &GateResult,
        shard: Shard,
        inventory: &Inventory,
        repo_url: Option<&str>,
    ) -> Partial {
        let mut partial = Partial::new(
            shard,
            &result.verdict.base,
            &result.verdict.head,
            inventory,
            repo_url,
        );
        partial.confinement = result.confinement;
        partial.undecided = Some(Undecided {
            head: result.verdict.errors.clone(),
            base: Vec::new(),
        });
        partial
    }
}

/// One shard of [`check::check_commits`]: this shard's Applications rendered at both commits,
/// the chart-only renders and chart defaults of their moves. Never fails: what stops it is
/// in [`Partial::undecided`].
pub fn check_shard(config: &RenderConfig, base: String, head: String, shard: Shard) -> Partial {
    let mut owned = config.clone();
    owned.parsed = Default::default();
    let config = &owned;
    let mut partial = Partial::new(
        shard,
        &base,
        &head,
        &config.inventory,
        config.repo_url.as_deref(),
    );
    let confinement = match render::confine::confinement(&config.helm.limits) {
        Ok(confinement) => confinement,
        Err(refusal) => {
            partial.undecided = Some(Undecided {
                head: vec![refusal],
                base: Vec::new(),
            });
            return partial;
        }
    };
    partial.confinement = Some(confinement);
    // Where each Application goes is read from the head's common path (no process): the
    // stripes deal its keys out over the shards, at both commits, and the merge base's render
    // puts an Application the head holds where the head's spec puts it. The head's render
    // reads them first (its ApplicationSets expanded once for both), the merge base's plans
    // meanwhile and waits for them where it first places an Application. Where the head's
    // path fails, the partial is undecided with its errors (the head's render would fail on
    // them too), never dealt by hash: every shard deals the same stripes or none.
    let expansions = Arc::new(render::Expansions::default());
    let dealing = Arc::new(render::Dealing::of_head(
        config,
        &head,
        shard.count,
        expansions.clone(),
    ));
    let (head_rendering, base_rendering) = check::render_pair(
        &head,
        &base,
        || {
            render::render_shard_dealt(
                config,
                &head,
                shard,
                dealing.clone(),
                Some(expansions),
                false,
            )
        },
        || render::render_shard_dealt(config, &base, shard, dealing.clone(), None, true),
    );
    if let Err(failure) = dealing.dealt() {
        partial.undecided = Some(Undecided {
            head: check::error_lines(Some(failure), None),
            base: Vec::new(),
        });
        return partial;
    }
    partial.head_weights = dealing.weights().cloned().unwrap_or_default();
    let (base_rendering, head_rendering) = match (base_rendering, head_rendering) {
        (Ok(b), Ok(h)) => (b, h),
        (b, h) => {
            partial.undecided = Some(Undecided {
                head: check::error_lines(h.as_ref().err(), None),
                base: check::error_lines(None, b.as_ref().err()),
            });
            return partial;
        }
    };
    let old_versions = check::render_old_versions(config, &head, &base_rendering, &head_rendering);
    let base_apps: BTreeMap<AppKey, &RenderedApplication> = base_rendering
        .applications
        .iter()
        .map(|a| (diff::key_of(a), a))
        .collect();
    let mut moves: Vec<ChartMove> = head_rendering
        .applications
        .iter()
        .filter_map(|after| {
            Some(diff::chart_moves(
                base_apps.get(&diff::key_of(after))?,
                after,
            ))
        })
        .flatten()
        .collect();
    moves.sort_by(|a, b| {
        (&a.repo_url, &a.chart, &a.from, &a.to).cmp(&(&b.repo_url, &b.chart, &b.from, &b.to))
    });
    moves.dedup();
    partial.chart_defaults = check::chart_defaults_of(config, moves.iter().collect());
    let mut table = Table::default();
    partial.base_applications = base_rendering
        .applications
        .iter()
        .map(|a| table.wire(a))
        .collect();
    partial.head_applications = head_rendering
        .applications
        .iter()
        .map(|a| table.wire(a))
        .collect();
    partial.old_versions = old_versions.values().map(|a| table.wire(a)).collect();
    partial.objects = table.objects;
    partial.base_credits = base_rendering.stats.shard_credits.clone();
    partial.head_credits = head_rendering.stats.shard_credits.clone();
    partial.base_known = Shared::from(
        base_rendering
            .stats
            .shard_known
            .iter()
            .cloned()
            .collect::<Vec<_>>(),
    );
    partial.head_known = Shared::from(
        head_rendering
            .stats
            .shard_known
            .iter()
            .cloned()
            .collect::<Vec<_>>(),
    );
    partial.base_common_specs = base_rendering.stats.shard_common_specs.clone().into();
    partial.head_common_specs = head_rendering.stats.shard_common_specs.clone().into();
    partial
}

/// The largest partial `gate merge` reads: 2 GiB (one shard of a 5,000-Application fleet
/// with CRD-heavy charts writes 11-30 MB).
pub const MAX_PARTIAL_BYTES: u64 = 2 << 30;

/// The most shards a check is split into (a CI matrix is far smaller).
pub const MAX_SHARDS: usize = 1024;

/// Why partials cannot be merged: one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MergeError(pub String);

/// Checks that the partials are every shard of one check, each once.
fn validate(parts: &[Partial]) -> Result<(), MergeError> {
    let first = parts
        .first()
        .ok_or_else(|| MergeError("no partial results given".into()))?;
    for part in parts {
        if part.format != FORMAT {
            return Err(MergeError(format!(
                "a partial is in format {:?}, not {FORMAT}",
                part.format
            )));
        }
        if part.shard.count != first.shard.count {
            return Err(MergeError(format!(
                "shard {} and shard {} split the fleet differently: one run's partials only",
                label(first.shard),
                label(part.shard)
            )));
        }
        if part.shard.index >= part.shard.count {
            return Err(MergeError(format!(
                "a partial names shard {}, which does not exist",
                label(part.shard)
            )));
        }
        if (&part.base, &part.head) != (&first.base, &first.head) {
            return Err(MergeError(format!(
                "shard {} checked {}..{} but shard {} checked {}..{}: one pull request's partials only",
                label(first.shard),
                first.base,
                first.head,
                label(part.shard),
                part.base,
                part.head
            )));
        }
        if part.repo_url != first.repo_url {
            return Err(MergeError(format!(
                "shard {} and shard {} read the repository under different URLs: one run's partials only",
                label(first.shard),
                label(part.shard)
            )));
        }
        if part.inventory_digest != first.inventory_digest
            || inventory_digest(&part.inventory) != part.inventory_digest
        {
            return Err(MergeError(format!(
                "shard {} and shard {} read different inventories: every shard must judge against one",
                label(first.shard),
                label(part.shard)
            )));
        }
    }
    // A partial is another job's file: a shard count no check writes is refused before it
    // sizes anything.
    if !(1..=MAX_SHARDS).contains(&first.shard.count) {
        return Err(MergeError(format!(
            "shard {} names {} shards; at most {MAX_SHARDS} are checked",
            label(first.shard),
            first.shard.count
        )));
    }
    let mut seen = vec![false; first.shard.count];
    for part in parts {
        if std::mem::replace(&mut seen[part.shard.index], true) {
            return Err(MergeError(format!(
                "shard {} is given twice",
                label(part.shard)
            )));
        }
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(MergeError(format!(
            "shard {} is missing: every shard's partial is needed",
            label(Shard {
                index: missing,
                count: first.shard.count
            })
        )));
    }
    Ok(())
}

/// The head's keys dealt as every shard dealt them: by the costs the partials give
/// ([`render::Stripes::weighted`]). A cost is read from a shard's chart mirror, so shards
/// given mirrors whose charts differ in size may deal the fleet differently (an Application
/// held by two shards, or by none): partials whose costs put any of the head's Applications
/// in another shard are refused, naming the first; costs that differ but deal alike are not.
fn dealt_alike(
    parts: &[Partial],
    head_keys: &Keys,
    count: usize,
) -> Result<render::Stripes, MergeError> {
    let stripes = render::Stripes::weighted(head_keys.values(), &parts[0].head_weights, count);
    for part in parts.iter().skip(1) {
        if part.head_weights == parts[0].head_weights {
            continue;
        }
        let other = render::Stripes::weighted(head_keys.values(), &part.head_weights, count);
        let moved = head_keys
            .iter()
            .filter(|(_, key)| stripes.of(key) != other.of(key))
            .min_by(|a, b| a.0.cmp(b.0));
        if let Some(((namespace, name), key)) = moved {
            return Err(MergeError(format!(
                "shard {} deals Application {namespace}/{name} to shard {} and shard {} deals it to shard {}: their chart or git mirrors give the head's renders other costs (give every shard the same --charts and --git-mirror)",
                label(parts[0].shard),
                label(Shard {
                    index: stripes.of(key),
                    count
                }),
                label(part.shard),
                label(Shard {
                    index: other.of(key),
                    count
                }),
            )));
        }
    }
    Ok(stripes)
}

/// One of the two commits a partial holds Applications of.
#[derive(Clone, Copy)]
enum Side {
    Base,
    Head,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Base => "the merge base",
            Side::Head => "the head",
        }
    }

    fn applications(self, part: &Partial) -> &[WireApp] {
        match self {
            Side::Base => &part.base_applications,
            Side::Head => &part.head_applications,
        }
    }

    fn known(self, part: &Partial) -> &[Known] {
        match self {
            Side::Base => &part.base_known,
            Side::Head => &part.head_known,
        }
    }

    fn common_specs(self, part: &Partial) -> &BTreeMap<String, String> {
        match self {
            Side::Base => &part.base_common_specs,
            Side::Head => &part.head_common_specs,
        }
    }
}

/// One line of any text (a git or file error may hold several).
/// `text` on one line of printable characters: whitespace runs (newlines included) one space,
/// any other control character (a terminal escape) a `?`. A refusal quotes names a partial
/// gives; the CI log that shows it gets no line and no escape of the partial's making.
pub fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The shard key of each Application on one commit's common path (the repository's files and
/// the Applications every shard lists as reached), by namespace and name: from the file that
/// declares it, unless no shard holds it as that file's and one holds it from a parent (the
/// spec one render keeps: a parent's of plain manifests over a file's); then from the spec it
/// is held with. Computed by the merge, never read from a partial.
type Keys = HashMap<(String, String), String>;

/// The Applications (namespace, name) the repository's files declare at a commit and every
/// shard reached on the path all shards follow.
fn common_applications<'a>(
    parts: &'a [Partial],
    side: Side,
    roots: &'a [Root],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    roots
        .iter()
        .map(|root| &root.known)
        .chain(parts.iter().flat_map(move |part| side.known(part)))
        .filter(|known| known.kind == "Application")
        .map(|known| (known.namespace.as_str(), known.name.as_str()))
}

fn common_keys(parts: &[Partial], side: Side, roots: &[Root]) -> Keys {
    let mut keys = Keys::new();
    for root in roots.iter().filter(|r| r.known.kind == "Application") {
        keys.insert(
            (root.known.namespace.clone(), root.known.name.clone()),
            render::shard_key(&root.object),
        );
    }
    let common: HashSet<(&str, &str)> = common_applications(parts, side, roots).collect();
    let held = || parts.iter().flat_map(|part| side.applications(part));
    let as_declared: HashSet<(&str, &str)> = held()
        .filter(|app| matches!(app.origin, Origin::File { .. }))
        .map(|app| (app.namespace.as_str(), app.name.as_str()))
        .collect();
    for app in held() {
        let id = (app.namespace.as_str(), app.name.as_str());
        if common.contains(&id) && !as_declared.contains(&id) {
            keys.insert(
                (app.namespace.clone(), app.name.clone()),
                render::shard_key(&app.manifest),
            );
        }
    }
    keys
}

/// The shard an Application belongs to at one commit by its key, as the shards computed it:
/// at the merge base, the head's key for an Application the head's common path holds; else
/// this commit's key of an Application on its common path; else the key of the spec it is
/// held with.
struct Owners<'a> {
    side: Side,
    head: &'a Keys,
    own: &'a Keys,
    /// The head's keys dealt out over the shards, as every shard deals them.
    stripes: &'a render::Stripes,
}

impl Owners<'_> {
    fn of(&self, namespace: &str, name: &str, held: Option<&Value>) -> Option<usize> {
        let id = (namespace.to_string(), name.to_string());
        let key = match self.side {
            Side::Base => self.head.get(&id).or_else(|| self.own.get(&id)),
            Side::Head => self.own.get(&id),
        };
        match key {
            Some(key) => Some(self.stripes.of(key)),
            None => held.map(|spec| self.stripes.of(&render::shard_key(spec))),
        }
    }
}

/// Which of one partial's Applications at one commit a render only that shard runs may have
/// put there: those a helm or kustomize render of its own deploys, and what those deploy in
/// turn (the render engine gives them its shard), through ApplicationSets too. Whether a
/// parent's render runs helm or kustomize is read from its sources and the repository (as
/// planning reads it), never from the partial's render keys.
struct Inheritance<'a> {
    /// The partial's Applications by namespace and name.
    apps: HashMap<(&'a str, &'a str), &'a WireApp>,
    /// ApplicationSets by namespace and name -> the partial's Applications whose render
    /// holds one.
    sets: HashMap<(String, String), Vec<&'a WireApp>>,
    /// Decided so far (None while deciding: a cycle of origins inherits nothing).
    memo: HashMap<(&'a str, &'a str), Option<bool>>,
    /// The repositories as this commit reads them.
    repos: &'a RepoResolver,
    inventory: &'a Inventory,
    at: &'a str,
}

impl<'a> Inheritance<'a> {
    fn new(
        part: &'a Partial,
        apps: &'a [WireApp],
        repos: &'a RepoResolver,
        at: &'a str,
    ) -> Inheritance<'a> {
        let mut sets: HashMap<(String, String), Vec<&'a WireApp>> = HashMap::new();
        for app in apps {
            for object in app.objects.iter().filter_map(|&at| part.objects.get(at)) {
                let is_set = object.get("kind").and_then(Value::as_str) == Some("ApplicationSet")
                    && object
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .is_some_and(|v| v.starts_with("argoproj.io/"));
                if !is_set {
                    continue;
                }
                sets.entry(child_identity(object, app))
                    .or_default()
                    .push(app);
            }
        }
        Inheritance {
            apps: apps
                .iter()
                .map(|a| ((a.namespace.as_str(), a.name.as_str()), a))
                .collect(),
            sets,
            memo: HashMap::new(),
            repos,
            inventory: &part.inventory,
            at,
        }
    }

    /// Whether `app`'s render runs helm or kustomize, so that only its shard renders it: its
    /// sources' types as the repository gives them; an Application whose destination the
    /// inventory lacks renders nothing.
    fn renders_alone(&self, app: &WireApp) -> Result<bool, MergeError> {
        let text = |pointer: &str| app.manifest.pointer(pointer).and_then(Value::as_str);
        if self
            .inventory
            .destination(
                text("/spec/destination/server"),
                text("/spec/destination/name"),
            )
            .is_none()
        {
            return Ok(false);
        }
        render::source::runs_a_process(&app.manifest, self.repos).map_err(|e| {
            MergeError(format!(
                "cannot tell from the repository whether Application {}/{}'s render at {} runs helm or kustomize: {}",
                app.namespace,
                app.name,
                self.at,
                one_line(&e)
            ))
        })
    }

    /// Whether what `app` deploys stays in this shard.
    fn keeps_children(&mut self, app: &'a WireApp) -> Result<bool, MergeError> {
        Ok(self.renders_alone(app)? || self.inherited(app)?)
    }

    /// Whether `app` may be this shard's by its parent: the parent is this shard's and keeps
    /// what it deploys.
    fn inherited(&mut self, app: &'a WireApp) -> Result<bool, MergeError> {
        let key = (app.namespace.as_str(), app.name.as_str());
        match self.memo.get(&key) {
            Some(Some(decided)) => return Ok(*decided),
            Some(None) => return Ok(false),
            None => {}
        }
        self.memo.insert(key, None);
        let decided = match &app.origin {
            Origin::File { .. } => false,
            Origin::Application { namespace, name } => {
                match self.apps.get(&(namespace.as_str(), name.as_str())).copied() {
                    Some(parent) => self.keeps_children(parent)?,
                    None => false,
                }
            }
            Origin::ApplicationSet { namespace, name } => {
                let parents = self
                    .sets
                    .get(&(namespace.clone(), name.clone()))
                    .cloned()
                    .unwrap_or_default();
                let mut any = false;
                for parent in parents {
                    if self.keeps_children(parent)? {
                        any = true;
                        break;
                    }
                }
                any
            }
        };
        self.memo.insert(key, Some(decided));
        Ok(decided)
    }
}

/// An Application's or ApplicationSet's identity as the engine gives a parent's child: its
/// own namespace, else the parent's destination namespace, else argocd; and its name.
fn child_identity(object: &Value, parent: &WireApp) -> (String, String) {
    let namespace = match object.pointer("/metadata/namespace") {
        Some(namespace) => namespace.as_str().unwrap_or("argocd").to_string(),
        None if parent.destination_namespace.is_empty() => "argocd".to_string(),
        None => parent.destination_namespace.clone(),
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    (namespace, name)
}

/// What the merge reads itself of every Application a shard holds at one commit, from the
/// Application's spec, the inventory and the repositories (no process): its name, project,
/// destination and the Application as stored, for every one; when its destination is no
/// cluster of the inventory or its sources are plain manifests (no chart, no kustomization:
/// what every shard renders alike, [`render::replan`]), its sources, objects and render keys
/// too; and when it has a helm or kustomize source beside directories of manifests, each
/// object of those directories is among its objects. So a
/// partial cannot leave out, change or add an object of plain manifests (the CRD that stops
/// serving a version, a resource still using it), beside a chart or not: what a helm or
/// kustomize render holds stays its shard's word.
fn as_the_repository_renders(
    parts: &[Partial],
    side: Side,
    repos: &RepoResolver,
    at: &str,
) -> Result<(), MergeError> {
    let held: Vec<(usize, (&Partial, &WireApp))> = parts
        .iter()
        .flat_map(|part| side.applications(part).iter().map(move |app| (part, app)))
        .enumerate()
        .collect();
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut found = render::parallel_map(held, jobs, |(index, (part, app))| {
        (index, as_replanned(part, app, repos, at))
    });
    // The first refusal in the partials' order, whichever thread found it.
    found.sort_by_key(|(index, _)| *index);
    found.into_iter().try_for_each(|(_, result)| result)
}

/// [`as_the_repository_renders`] of one Application.
fn as_replanned(
    part: &Partial,
    app: &WireApp,
    repos: &RepoResolver,
    at: &str,
) -> Result<(), MergeError> {
    let who = || {
        format!(
            "shard {} holds Application {}/{} at {}",
            label(part.shard),
            app.namespace,
            app.name,
            at
        )
    };
    let replanned = render::replan(&app.manifest, app.origin.clone(), &part.inventory, repos)
        .map_err(|e| {
            MergeError(format!(
                "{}, whose sources the merge cannot read as the shards did (give it their --git-mirror): {}",
                who(),
                one_line(&e)
            ))
        })?;
    let (expected, plain) = match replanned {
        render::Replanned::Process { app, plain_objects } => (app, Some(plain_objects)),
        render::Replanned::Whole(expected) => (expected, None),
    };
    let identity = (
        (&expected.name, &expected.namespace, &expected.project),
        (&expected.cluster, &expected.destination_namespace),
        (&expected.stored, &expected.destination_unknown),
    );
    let held = (
        (&app.name, &app.namespace, &app.project),
        (&app.cluster, &app.destination_namespace),
        (&app.stored, &app.destination_unknown),
    );
    if identity != held {
        return Err(MergeError(format!(
            "{} with a name, project, destination or stored Application its own spec does not give: a partial holds only what the repository holds",
            who()
        )));
    }
    if let Some(plain) = plain {
        // A helm or kustomize render is its shard's word; the plain sources beside it are
        // not: each of their objects is among the Application's, as it is.
        if !holds_each(part, app, &plain) {
            return Err(MergeError(format!(
                "{} without each object of the plain manifests its directory sources name in the repository, as they are there (the merge reads them itself): a partial holds only what the repository holds",
                who()
            )));
        }
        return Ok(());
    }
    let same_objects = expected.objects.len() == app.objects.len()
        && expected
            .objects
            .iter()
            .zip(&app.objects)
            .all(|(object, &index)| part.objects.get(index).is_some_and(|held| held == object));
    if !same_objects
        || expected.sources != app.sources
        || expected.render_keys != app.render_keys
        || expected.values_files != app.values_files
    {
        return Err(MergeError(format!(
            "{} with other objects than the plain manifests its sources name in the repository (the merge reads them itself): a partial holds only what the repository holds",
            who()
        )));
    }
    Ok(())
}

/// Whether `app`'s objects hold each of `plain`, as many times as `plain` does (a multiset:
/// objects compared within their kind and name).
fn holds_each(part: &Partial, app: &WireApp, plain: &[Value]) -> bool {
    if plain.is_empty() {
        return true;
    }
    fn key(object: &Value) -> (&str, &str) {
        (
            object.get("kind").and_then(Value::as_str).unwrap_or(""),
            object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
        )
    }
    let mut held: HashMap<(&str, &str), Vec<&Value>> = HashMap::new();
    for object in app.objects.iter().filter_map(|&at| part.objects.get(at)) {
        held.entry(key(object)).or_default().push(object);
    }
    plain.iter().all(|object| {
        let Some(candidates) = held.get_mut(&key(object)) else {
            return false;
        };
        match candidates.iter().position(|held| *held == object) {
            Some(at) => {
                candidates.swap_remove(at);
                true
            }
            None => false,
        }
    })
}

/// A shard credits a parent with an Application of another shard (the same Application a
/// file declares, reached from a parent: [`render::RenderStats::shard_credits`]) only for a
/// render it ran: an Application it holds, or one of plain manifests on the path every shard
/// follows (every shard renders it), whose objects deploy that Application with the spec it
/// is held with; or an ApplicationSet on that path or one its own renders deploy. Otherwise a
/// partial could change the origin (what the notes say) of any other shard's Application.
fn credits_of_its_own_renders(
    part: &Partial,
    side: Side,
    inheritance: &Inheritance<'_>,
    held: &HashMap<(&str, &str), (&Partial, &WireApp)>,
    at: &str,
) -> Result<(), MergeError> {
    let credits = match side {
        Side::Base => &part.base_credits,
        Side::Head => &part.head_credits,
    };
    let known: HashSet<&Known> = side.known(part).iter().collect();
    let is_known = |kind: &str, namespace: &str, name: &str| {
        known.contains(&Known {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    };
    for (credited, origin) in credits {
        let refused = |why: &str| {
            MergeError(format!(
                "shard {} credits {} at {at} to {origin}, {why}: a partial credits only its own renders",
                label(part.shard),
                credited.chars().take(200).collect::<String>(),
            ))
        };
        let Some((namespace, name)) = credited
            .strip_prefix("Application ")
            .and_then(|id| id.split_once('/'))
        else {
            return Err(refused("which is no Application"));
        };
        match origin {
            Origin::File { .. } => return Err(refused("a file, not a parent")),
            Origin::ApplicationSet {
                namespace: set_namespace,
                name: set_name,
            } => {
                let expanded = is_known("ApplicationSet", set_namespace, set_name)
                    || inheritance
                        .sets
                        .contains_key(&(set_namespace.clone(), set_name.clone()));
                if !expanded {
                    return Err(refused(&format!(
                        "which shard {} did not expand",
                        label(part.shard)
                    )));
                }
            }
            Origin::Application {
                namespace: parent_namespace,
                name: parent_name,
            } => {
                let id = (parent_namespace.as_str(), parent_name.as_str());
                let parent = match inheritance.apps.get(&id) {
                    Some(own) => Some((part, *own)),
                    None => held.get(&id).copied().filter(|(_, parent)| {
                        is_known("Application", parent_namespace, parent_name)
                            && render::source::runs_a_process(&parent.manifest, inheritance.repos)
                                == Ok(false)
                    }),
                };
                let Some((holder, parent)) = parent else {
                    return Err(refused(&format!(
                        "which shard {} did not render",
                        label(part.shard)
                    )));
                };
                if let Some((_, app)) = held.get(&(namespace, name)) {
                    let deploys = parent
                        .objects
                        .iter()
                        .filter_map(|&index| holder.objects.get(index))
                        .any(|object| {
                            render::is_argo_kind(object, "Application")
                                && child_identity(object, parent)
                                    == (namespace.to_string(), name.to_string())
                                && object.get("spec") == app.manifest.get("spec")
                        });
                    if !deploys {
                        return Err(refused("whose render does not deploy it with that spec"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// One commit as the merge reads it: the commit, its snapshot, its roots.
struct Commit<'a> {
    side: Side,
    commit: &'a str,
    snapshot: &'a Arc<crate::git::Snapshot>,
    roots: &'a [Root],
}

/// Every Application on the path every shard follows that no file declares (what an
/// ApplicationSet generates, what a parent of plain manifests deploys), and every one held as
/// its file's, is held with the spec every shard's render keeps for it (the digests every
/// partial gives alike: [`same_common_path`]), before its shard key is read from that spec:
/// the merge does not expand ApplicationSets itself (a goTemplate one runs helm's engine).
/// A file's Application held under a parent's origin is bound by
/// [`file_spec_whatever_the_origin`], one held as its file's also by
/// [`declared_as_the_files_say`].
fn as_every_shard_keeps(
    parts: &[Partial],
    side: Side,
    roots: &[Root],
    at: &str,
) -> Result<(), MergeError> {
    let declared: HashSet<(&str, &str)> = roots
        .iter()
        .filter(|root| root.known.kind == "Application")
        .map(|root| (root.known.namespace.as_str(), root.known.name.as_str()))
        .collect();
    let specs = side.common_specs(&parts[0]);
    let held: Vec<(usize, (&Partial, &WireApp))> = parts
        .iter()
        .flat_map(|part| side.applications(part).iter().map(move |app| (part, app)))
        // A copy held as its file's too: a parent every shard renders may replace the file's
        // spec (the parent's wins), and then the file's spec under the file's origin is not
        // what the repository deploys. A file's Application held under a parent's origin is
        // left to `file_spec_whatever_the_origin` (a helm parent of the holder's own may hold
        // the copy that counts).
        .filter(|(_, app)| {
            matches!(app.origin, Origin::File { .. })
                || !declared.contains(&(app.namespace.as_str(), app.name.as_str()))
        })
        .enumerate()
        .collect();
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut found = render::parallel_map(held, jobs, |(index, (part, app))| {
        let kept = specs.get(&format!("Application {}/{}", app.namespace, app.name));
        let refused = kept.is_some_and(|kept| *kept != render::application_digest(&app.manifest));
        (index, refused.then_some((part, app)))
    });
    found.sort_by_key(|(index, _)| *index);
    match found.into_iter().find_map(|(_, refused)| refused) {
        Some((part, app)) => Err(MergeError(format!(
            "shard {} holds Application {}/{} at {at} with another spec than every shard's render keeps for it on the path every shard follows: a partial holds only what the repository holds (if no partial was tampered with, a render of the holder's own deploys it first with other metadata: check this pull request unsharded)",
            label(part.shard),
            app.namespace,
            app.name
        ))),
        None => Ok(()),
    }
}

/// Every honest shard follows the same path: one that says it reached more or less than
/// another, or kept another spec for an Application on it, is not of this run (or not
/// honest).
fn same_common_path(parts: &[Partial], side: Side, at: &str) -> Result<(), MergeError> {
    let first: BTreeSet<&Known> = side.known(&parts[0]).iter().collect();
    let specs = side.common_specs(&parts[0]);
    for part in &parts[1..] {
        if side.known(part).iter().collect::<BTreeSet<_>>() != first {
            return Err(MergeError(format!(
                "shard {} and shard {} reached different Applications or ApplicationSets at {} on the path every shard follows: one run's partials only",
                label(parts[0].shard),
                label(part.shard),
                at
            )));
        }
        if side.common_specs(part) != specs {
            return Err(MergeError(format!(
                "shard {} and shard {} kept different specs for the Applications at {} on the path every shard follows: one run's partials only (a generator reading another repository's moving branch can differ between runners: check this pull request unsharded)",
                label(parts[0].shard),
                label(part.shard),
                at
            )));
        }
    }
    Ok(())
}

/// What the repository's files declare, where: a held Application that says it was declared
/// in a file must be that file's (a made-up parent cannot pass for a root), with the file's
/// spec.
fn declared_as_the_files_say(
    parts: &[Partial],
    side: Side,
    roots: &[Root],
    at: &str,
) -> Result<(), MergeError> {
    let declared: HashMap<(&str, usize), &Root> = roots
        .iter()
        .filter(|root| root.known.kind == "Application")
        .map(|root| ((root.path.as_str(), root.document), root))
        .collect();
    for part in parts {
        for app in side.applications(part) {
            if let render::Origin::File { path, document } = &app.origin {
                let root = declared.get(&(path.as_str(), *document)).filter(|root| {
                    (root.known.namespace.as_str(), root.known.name.as_str())
                        == (app.namespace.as_str(), app.name.as_str())
                });
                let Some(root) = root else {
                    return Err(MergeError(format!(
                        "shard {} holds Application {}/{} at {} as declared in file {}, which does not declare it there: a partial holds only what the repository holds",
                        label(part.shard),
                        app.namespace,
                        app.name,
                        at,
                        path.chars().take(200).collect::<String>()
                    )));
                };
                if root.object != app.manifest
                    || render::stored_application(&root.object) != app.stored
                {
                    return Err(MergeError(format!(
                        "shard {} holds Application {}/{} at {} as declared in file {}, with another spec than the file's: a partial holds only what the repository holds",
                        label(part.shard),
                        app.namespace,
                        app.name,
                        at,
                        path.chars().take(200).collect::<String>()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Binds the partials to the repository and to each other at one commit, before anything is
/// judged:
///
/// - every shard read every Application and ApplicationSet of the repository's files (the
///   merge lists them itself: read, not rendered), so no partial is of another commit or
///   another repository; and every shard reached the same Applications and ApplicationSets
///   on the path every shard follows, and kept the same specs for its Applications (honest
///   shards all follow it);
/// - every Application those files declare, or the shards reached on that path, is held by
///   the shard of its key ([`Owners`]): a partial that left one out is refused, whichever
///   shard noticed;
/// - one that a shard says a file declares is declared in that file, with that file's spec
///   (so its key is the file's);
/// - every Application a shard holds is its own: on that path and its key's shard, or a
///   helm or kustomize render of that shard deploys it (directly, through Applications it
///   deploys, or through an ApplicationSet it deploys; helm or kustomize as the repository
///   says the parent's sources are); each once. A partial cannot add an Application of
///   another shard, make one up, nor shadow one with a made-up parent or a parent of plain
///   manifests; a real helm or kustomize parent of its own whose chart it says deploys
///   another Application is its word on its own render (trusted, see the docs);
/// - a shard's credits name only renders it ran ([`credits_of_its_own_renders`]);
/// - a file's Application held under another origin has the spec every shard's render keeps
///   for it: its file's, or what a parent of plain manifests on that path deploys under its
///   name, as in one render ([`file_spec_whatever_the_origin`]; one no file declares is bound
///   to that spec before its key is read, [`as_every_shard_keeps`]);
/// - every held Application is what its spec, the inventory and the repository say, objects
///   included for plain manifests, and the plain manifests beside a helm or kustomize source
///   among its objects ([`as_the_repository_renders`]).
fn bind(
    parts: &[Partial],
    at_commit: &Commit<'_>,
    owners: &Owners<'_>,
    repo_url: Option<&str>,
    git_mirrors: &[(String, std::path::PathBuf)],
) -> Result<(), MergeError> {
    let Commit {
        side,
        commit,
        snapshot,
        roots,
    } = *at_commit;
    let count = parts[0].shard.count;
    let at = format!("{} {commit}", side.name());
    let at = || at.clone();
    for part in parts {
        let known: HashSet<&Known> = side.known(part).iter().collect();
        if let Some(root) = roots.iter().find(|root| !known.contains(&root.known)) {
            return Err(MergeError(format!(
                "shard {} did not read {} (file {}), which {} holds: that partial is not of this repository at these commits",
                label(part.shard),
                root.known,
                root.path,
                at()
            )));
        }
    }
    let mut held: Vec<HashSet<(&str, &str)>> = vec![HashSet::new(); count];
    for part in parts {
        for app in side.applications(part) {
            if !held[part.shard.index].insert((&app.namespace, &app.name)) {
                return Err(MergeError(format!(
                    "shard {} holds Application {}/{} twice at {}",
                    label(part.shard),
                    app.namespace,
                    app.name,
                    at()
                )));
            }
        }
    }
    let required: BTreeSet<(&str, &str)> = common_applications(parts, side, roots).collect();
    for &(namespace, name) in &required {
        let Some(owner) = owners.of(namespace, name, None) else {
            return Err(MergeError(format!(
                "Application {namespace}/{name} is at {}, but no shard holds it: a partial left it out",
                at()
            )));
        };
        if !held[owner].contains(&(namespace, name)) {
            return Err(MergeError(format!(
                "Application {namespace}/{name} is at {}, but shard {}, whose Application it is, does not hold it: a partial left it out",
                at(),
                label(Shard {
                    index: owner,
                    count
                })
            )));
        }
    }
    declared_as_the_files_say(parts, side, roots, &at())?;
    let repos = RepoResolver::new(
        snapshot.clone(),
        repo_url.map(str::to_string),
        git_mirrors.to_vec(),
    );
    let at_text = at();
    let mut held: HashMap<(&str, &str), (&Partial, &WireApp)> = HashMap::new();
    for part in parts {
        for app in side.applications(part) {
            held.entry((app.namespace.as_str(), app.name.as_str()))
                .or_insert((part, app));
        }
    }
    let by_name: HashMap<(&str, &str), Vec<&Root>> = roots
        .iter()
        .filter(|root| root.known.kind == "Application")
        .fold(HashMap::new(), |mut by_name, root| {
            by_name
                .entry((root.known.namespace.as_str(), root.known.name.as_str()))
                .or_default()
                .push(root);
            by_name
        });
    // The Applications some shard holds as declared in a file (checked against that file).
    let from_files: HashSet<(&str, &str)> = parts
        .iter()
        .flat_map(|part| side.applications(part))
        .filter(|app| matches!(app.origin, render::Origin::File { .. }))
        .map(|app| (app.namespace.as_str(), app.name.as_str()))
        .collect();
    // The digest of each Application on the common path as every shard's render keeps it
    // (the same in every partial: `same_common_path`).
    let specs = side.common_specs(&parts[0]);
    for part in parts {
        let apps = side.applications(part);
        let mut inheritance = Inheritance::new(part, apps, &repos, &at_text);
        for app in apps {
            file_spec_whatever_the_origin(
                part,
                app,
                &by_name,
                specs,
                &from_files,
                &inheritance,
                &at_text,
            )?;
            let id = (app.namespace.as_str(), app.name.as_str());
            let owner = owners
                .of(&app.namespace, &app.name, Some(&app.manifest))
                .unwrap_or(part.shard.index);
            if owner != part.shard.index && !inheritance.inherited(app)? {
                return Err(MergeError(format!(
                    "shard {} holds Application {}/{} at {}, which is shard {}'s and no render of shard {} deploys: a partial holds its own shard's Applications only",
                    label(part.shard),
                    app.namespace,
                    app.name,
                    at(),
                    label(Shard {
                        index: owner,
                        count
                    }),
                    label(part.shard)
                )));
            }
            if owner == part.shard.index
                && !required.contains(&id)
                && !inheritance.inherited(app)?
            {
                return Err(MergeError(format!(
                    "shard {} holds Application {}/{} at {}, which no file declares, no shard reached on the path every shard follows and no render of shard {} deploys: a partial holds only what the repository holds",
                    label(part.shard),
                    app.namespace,
                    app.name,
                    at(),
                    label(part.shard)
                )));
            }
        }
        credits_of_its_own_renders(part, side, &inheritance, &held, &at_text)?;
    }
    render::trace("merge", "held Applications bound to their shards");
    as_the_repository_renders(parts, side, &repos, &at_text)
}

/// Whether `app` is a copy of a file's Application that a parent of the same shard deploys,
/// whose sources the repository says helm or kustomize renders, while a shard holds the
/// file's own copy (checked against the file): which copy counts then rests on that render,
/// and the reassembly refuses two specs ("check this pull request unsharded").
fn parents_own_copy(
    app: &WireApp,
    from_files: &HashSet<(&str, &str)>,
    inheritance: &Inheritance<'_>,
) -> Result<bool, MergeError> {
    if let render::Origin::Application { namespace, name } = &app.origin
        && from_files.contains(&(app.namespace.as_str(), app.name.as_str()))
        && let Some(parent) = inheritance.apps.get(&(namespace.as_str(), name.as_str()))
    {
        return inheritance.renders_alone(parent);
    }
    Ok(false)
}

/// An Application a file declares, held under another origin (a parent, an ApplicationSet),
/// is held with the spec every shard's render keeps for it on the path every shard follows
/// (its file's, or what a parent of plain manifests on that path deploys under that name,
/// which wins over the file as in one render; without that digest, a file's spec): a claimed
/// origin must not free a file's Application from its file (its spec, and with it its shard
/// key and objects). The one exception is a copy a helm or kustomize parent of the same shard
/// deploys while a shard holds the file's own copy ([`parents_own_copy`]).
fn file_spec_whatever_the_origin(
    part: &Partial,
    app: &WireApp,
    by_name: &HashMap<(&str, &str), Vec<&Root>>,
    kept: &BTreeMap<String, String>,
    from_files: &HashSet<(&str, &str)>,
    inheritance: &Inheritance<'_>,
    at: &str,
) -> Result<(), MergeError> {
    if matches!(app.origin, render::Origin::File { .. }) {
        return Ok(()); // `declared_as_the_files_say`
    }
    let Some(files) = by_name.get(&(app.namespace.as_str(), app.name.as_str())) else {
        return Ok(());
    };
    let as_a_file = files.iter().any(|root| {
        root.object == app.manifest && render::stored_application(&root.object) == app.stored
    });
    let kept = kept.get(&format!("Application {}/{}", app.namespace, app.name));
    let held = match kept {
        Some(kept) => *kept == render::application_digest(&app.manifest),
        None => as_a_file,
    };
    if held || parents_own_copy(app, from_files, inheritance)? {
        return Ok(());
    }
    let file = files[0].path.chars().take(200).collect::<String>();
    let why = if as_a_file {
        format!(
            "with its file's spec ({file}), which a parent of plain manifests every shard renders replaces"
        )
    } else {
        format!("with another spec than the file that declares it ({file})")
    };
    Err(MergeError(format!(
        "shard {} holds Application {}/{} at {} as deployed by {}, {why}: a file's Application is held with the spec every shard's render keeps for it (a partial holds only what the repository holds; if the repository declares it twice, check this pull request unsharded)",
        label(part.shard),
        app.namespace,
        app.name,
        at,
        app.origin,
    )))
}

/// Each commit the partials name, read from the repository: a full commit id it holds.
fn snapshot_of(
    store: &render::parsed::ParsedStore,
    repo: &Path,
    side: Side,
    commit: &str,
) -> Result<Arc<crate::git::Snapshot>, MergeError> {
    if !crate::git::is_commit_id(commit) {
        return Err(MergeError(format!(
            "the partials name {} {:?}, which is not a commit id (40 or 64 lowercase hex digits)",
            side.name(),
            commit.chars().take(80).collect::<String>()
        )));
    }
    let snapshot = store.snapshot(repo, commit).map_err(|e| {
        MergeError(format!(
            "cannot read {} {commit} in {}: {e}",
            side.name(),
            repo.display()
        ))
    })?;
    if snapshot.commit != commit {
        return Err(MergeError(format!(
            "{} {commit} is commit {} in {}: the partials must name commits",
            side.name(),
            snapshot.commit,
            repo.display()
        )));
    }
    Ok(snapshot)
}

/// The weakest confinement any shard rendered under (none when one rendered nothing).
fn confinement_of(parts: &[Partial]) -> Option<Confinement> {
    let mut out = Some(Confinement::NetworkNamespace);
    for part in parts {
        match part.confinement {
            None => return None,
            Some(Confinement::ScrubbedEnvironmentOnly) => {
                out = Some(Confinement::ScrubbedEnvironmentOnly)
            }
            Some(Confinement::NetworkNamespace) => {}
        }
    }
    out
}

/// One shard's Applications at one commit: the shard, its object table, the Applications,
/// the origins it credited to parents.
type ShardSide<'a> = (
    Shard,
    &'a [Object],
    Vec<WireApp>,
    &'a BTreeMap<String, Origin>,
);

/// One commit's rendering put back together, with the shard each Application came from.
fn reassemble(
    revision: &str,
    parts: Vec<ShardSide<'_>>,
    commit: &str,
) -> Result<(Rendering, BTreeMap<AppKey, usize>), MergeError> {
    let identity = |a: &RenderedApplication| format!("Application {}/{}", a.namespace, a.name);
    let mut by_identity: BTreeMap<String, (RenderedApplication, Shard)> = BTreeMap::new();
    let mut credits: BTreeMap<&String, &Origin> = BTreeMap::new();
    for (shard, objects, apps, shard_credits) in parts {
        credits.extend(shard_credits.iter());
        for app in apps {
            let app = unwire(app, objects, shard).map_err(MergeError)?;
            let id = identity(&app);
            match by_identity.remove(&id) {
                None => {
                    by_identity.insert(id, (app, shard));
                }
                // The same Application declared in a file (held by the shard of its key) and
                // deployed by a parent another shard renders. One render keeps the file's
                // and credits the parent when both say the same (an honest shard credits it
                // and holds none); with another spec the parent's would win on the word of
                // the one shard that ran the parent's render: refused.
                Some((other, other_shard)) => {
                    let from_file =
                        |a: &RenderedApplication| matches!(a.origin, Origin::File { .. });
                    let ((mut file, file_shard), (parent, parent_shard)) = match (
                        from_file(&other),
                        from_file(&app),
                    ) {
                        (true, false) => ((other, other_shard), (app, shard)),
                        (false, true) => ((app, shard), (other, other_shard)),
                        _ => {
                            return Err(MergeError(format!(
                                "{id} at {commit} is rendered by shard {} and shard {}: the partials are not one run's",
                                label(other_shard),
                                label(shard)
                            )));
                        }
                    };
                    let spec = |a: &RenderedApplication| {
                        a.manifest
                            .get("spec")
                            .map(Value::to_string)
                            .unwrap_or_default()
                    };
                    if spec(&file) != spec(&parent) {
                        return Err(MergeError(format!(
                            "{id} at {commit} is declared in {} (held by shard {}) and deployed by {} (held by shard {}) with another spec: which one counts rests on a render only shard {} ran; check this pull request unsharded",
                            file.origin,
                            label(file_shard),
                            parent.origin,
                            label(parent_shard),
                            label(parent_shard)
                        )));
                    }
                    file.origin = parent.origin;
                    by_identity.insert(id, (file, file_shard));
                }
            }
        }
    }
    let mut applications = Vec::with_capacity(by_identity.len());
    let mut shards = BTreeMap::new();
    for (id, (mut app, shard)) in by_identity {
        if let Some(origin) = credits.get(&id) {
            app.origin = (*origin).clone();
        }
        shards.insert(diff::key_of(&app), shard.index);
        applications.push(app);
    }
    applications.sort_by(|a, b| {
        (&a.cluster.name, &a.name, &a.namespace).cmp(&(&b.cluster.name, &b.name, &b.namespace))
    });
    Ok((
        Rendering {
            revision: revision.to_string(),
            applications,
            diagnostics: Vec::new(),
            stats: Default::default(),
        },
        shards,
    ))
}

/// What `gate merge` is told besides the partials: what the merge base is computed from
/// (`--base`, else `--default-branch`, else the repository's default branch, as `check`), and
/// the mirrors of other repositories the shards read (`--git-mirror`).
#[derive(Debug, Clone, Default)]
pub struct MergeOptions {
    pub base: Option<String>,
    pub default_branch: Option<String>,
    pub git_mirrors: Vec<(String, std::path::PathBuf)>,
}

/// [`merge_with`] the default options: the merge base computed from the repository's default
/// branch.
pub fn merge(parts: Vec<Partial>, repo: &Path) -> Result<GateResult, MergeError> {
    merge_with(parts, repo, &MergeOptions::default())
}

/// The merge base as the merge computes it from the repository for the head the partials
/// name: it must be the one they name.
fn bind_merge_base(
    repo: &Path,
    base: &str,
    head: &str,
    options: &MergeOptions,
) -> Result<(), MergeError> {
    let revisions = check::Revisions {
        base: options.base.clone(),
        head: head.to_string(),
        target: options.default_branch.clone(),
    };
    let computed = match check::resolve(repo, &revisions) {
        Ok((computed, _)) => computed,
        Err(undecided) => {
            return Err(MergeError(format!(
                "cannot compute the merge base of the head {head}: {}",
                one_line(&undecided.verdict.errors.join("; "))
            )));
        }
    };
    if computed != base {
        return Err(MergeError(format!(
            "the partials name {} as the merge base, but the merge base of the head {head} is {computed}: partials judging another base are not this pull request's",
            base.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

/// Every shard's partial -> the verdict one unsharded check of the same commits gives.
/// `repo` holds both commits (the rules read the repository's manifests, and the merge
/// binds the partials to its files: [`bind`]); the merge base is computed from it
/// ([`MergeOptions`]). Refuses (one line) partials of different runs, commits or
/// inventories, a shard missing or given twice, partials of another merge base, a partial
/// that leaves out, adds or shadows an Application of another shard.
/// The merged answer when a shard could not decide: every shard's reasons, once each.
fn undecided(
    parts: &[Partial],
    base: String,
    head: String,
    confinement: Option<Confinement>,
) -> GateResult {
    let lines = |pick: fn(&Undecided) -> &Vec<String>| {
        let mut lines: Vec<String> = parts
            .iter()
            .filter_map(|p| p.undecided.as_ref())
            .flat_map(|u| pick(u).iter().cloned())
            .collect();
        lines.sort();
        lines.dedup();
        lines
    };
    let mut errors = lines(|u| &u.head);
    errors.extend(lines(|u| &u.base));
    let result = GateResult {
        confinement,
        ..check::undecided(base, head, errors)
    };
    result.assert_consistent();
    result
}

/// A moved chart's own change is isolated only when one shard held its Application at both
/// commits: refused when its parent moved it from one shard to another.
fn refuse_split_moves(
    base_rendering: &Rendering,
    head_rendering: &Rendering,
    base_shards: &BTreeMap<AppKey, usize>,
    head_shards: &BTreeMap<AppKey, usize>,
) -> Result<(), MergeError> {
    // A moved chart's own change is rendered by the shard holding the Application at both
    // commits; one whose shard changed between them (its parent moved) has none.
    let base_by_key: BTreeMap<AppKey, &RenderedApplication> = base_rendering
        .applications
        .iter()
        .map(|a| (diff::key_of(a), a))
        .collect();
    for after in &head_rendering.applications {
        let key = diff::key_of(after);
        if let Some(before) = base_by_key.get(&key)
            && base_shards.get(&key) != head_shards.get(&key)
            && !diff::chart_moves(before, after).is_empty()
        {
            return Err(MergeError(format!(
                "Application {key}'s chart moved and a different shard rendered it at each commit (its parent changed): its chart's own change cannot be isolated; check this pull request unsharded"
            )));
        }
    }
    Ok(())
}

/// The renders of moved charts' old versions (each shard's for the Applications it holds at
/// the head) and the charts' changed defaults, which every shard must give alike.
#[allow(clippy::type_complexity)]
fn old_versions_and_defaults(
    parts: &mut [Partial],
    own_old_versions: &[HashSet<(String, String)>],
) -> Result<
    (
        BTreeMap<AppKey, RenderedApplication>,
        HashMap<(String, String, String, String), ChartDefaults>,
    ),
    MergeError,
> {
    let mut old_versions = BTreeMap::new();
    let mut defaults: HashMap<(String, String, String, String), ChartDefaults> = HashMap::new();
    for (part, own) in parts.iter_mut().zip(own_old_versions) {
        for app in std::mem::take(&mut part.old_versions) {
            if !own.contains(&(app.namespace.clone(), app.name.clone())) {
                continue;
            }
            let app = unwire(app, &part.objects, part.shard).map_err(MergeError)?;
            old_versions.insert(diff::key_of(&app), app);
        }
        for d in std::mem::take(&mut part.chart_defaults) {
            let key = (
                d.repo_url.clone(),
                d.chart.clone(),
                d.from.clone(),
                d.to.clone(),
            );
            // One chart's move is read from one mirror: two shards saying otherwise are not
            // one run's (or one of them is not honest). Why a chart could not be read may
            // name a runner's own folder.
            let same = |a: &ChartDefaults, b: &ChartDefaults| {
                (&a.changes, a.more, a.unreadable.is_some())
                    == (&b.changes, b.more, b.unreadable.is_some())
            };
            if defaults.get(&key).is_some_and(|other| !same(other, &d)) {
                return Err(MergeError(format!(
                    "two shards give different default values for the chart move {} {} -> {}",
                    d.chart, d.from, d.to
                )));
            }
            defaults.insert(key, d);
        }
    }
    Ok((old_versions, defaults))
}

/// `a` and `b` at once: `b` on a thread of its own, `a` on this one.
fn both<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    std::thread::scope(|scope| {
        let b = scope.spawn(b);
        let a = a();
        (
            a,
            b.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        )
    })
}

/// Binds every partial to the repository at the merge base and at the head: the
/// Applications the repository's own files list, each held by the shard its key names.
fn bind_at_both_commits(
    parts: &[Partial],
    [(base, base_snapshot), (head, head_snapshot)]: [(&String, &Arc<crate::git::Snapshot>); 2],
    git_mirrors: &[(String, std::path::PathBuf)],
) -> Result<(), MergeError> {
    let roots_at = |side: Side, commit: &str, snapshot: &crate::git::Snapshot| {
        render::roots(snapshot).map_err(|d| {
            MergeError(format!(
                "cannot list the Applications of {} {commit}: {}: {}",
                side.name(),
                d.subject,
                d.message
            ))
        })
    };
    // Each step at both commits at once (two cores), the merge base's error first, as one
    // after the other would say.
    let (base_roots, head_roots) = both(
        || roots_at(Side::Base, base, base_snapshot),
        || roots_at(Side::Head, head, head_snapshot),
    );
    let (base_roots, head_roots) = (base_roots?, head_roots?);
    // Every shard followed one path at each commit (the head's keys, and with them where
    // every Application goes, are read from it).
    let base_at = format!("{} {base}", Side::Base.name());
    let head_at = format!("{} {head}", Side::Head.name());
    let (at_base, at_head) = both(
        || same_common_path(parts, Side::Base, &base_at),
        || same_common_path(parts, Side::Head, &head_at),
    );
    at_base?;
    at_head?;
    let (at_base, at_head) = both(
        || as_every_shard_keeps(parts, Side::Base, &base_roots, &base_at),
        || as_every_shard_keeps(parts, Side::Head, &head_roots, &head_at),
    );
    at_base?;
    at_head?;
    let (head_keys, base_keys) = both(
        || common_keys(parts, Side::Head, &head_roots),
        || common_keys(parts, Side::Base, &base_roots),
    );
    let count = parts[0].shard.count;
    let stripes = dealt_alike(parts, &head_keys, count)?;
    let repo_url = parts[0].repo_url.clone();
    let bind_at = |side: Side| {
        let (commit, snapshot, roots, own) = match side {
            Side::Base => (base, base_snapshot, &base_roots, &base_keys),
            Side::Head => (head, head_snapshot, &head_roots, &head_keys),
        };
        let at = Commit {
            side,
            commit,
            snapshot,
            roots,
        };
        let owners = Owners {
            side,
            head: &head_keys,
            stripes: &stripes,
            own,
        };
        bind(parts, &at, &owners, repo_url.as_deref(), git_mirrors)
    };
    let (at_base, at_head) = both(|| bind_at(Side::Base), || bind_at(Side::Head));
    at_base?;
    at_head?;
    Ok(())
}

pub fn merge_with(
    parts: Vec<Partial>,
    repo: &Path,
    options: &MergeOptions,
) -> Result<GateResult, MergeError> {
    render::trace("merge", "partials read");
    validate(&parts)?;
    let base = parts[0].base.clone();
    let head = parts[0].head.clone();
    let confinement = confinement_of(&parts);
    if parts.iter().any(|p| p.undecided.is_some()) {
        return Ok(undecided(&parts, base, head, confinement));
    }
    let confinement = confinement
        .ok_or_else(|| MergeError("a shard rendered nothing and said not why".into()))?;
    let store = render::parsed::ParsedStore::default();
    let head_snapshot = snapshot_of(&store, repo, Side::Head, &head)?;
    let base_snapshot = snapshot_of(&store, repo, Side::Base, &base)?;
    bind_merge_base(repo, &base, &head, options)?;
    render::trace("merge", "snapshots read, merge base bound");
    bind_at_both_commits(
        &parts,
        [(&base, &base_snapshot), (&head, &head_snapshot)],
        &options.git_mirrors,
    )?;
    render::trace("merge", "partials bound to the repository");
    // A shard's renders at a moved chart's old version count for the Applications it holds
    // at the head, never for another shard's (they would stand in for that shard's own).
    let own_old_versions: Vec<HashSet<(String, String)>> = parts
        .iter()
        .map(|part| {
            part.head_applications
                .iter()
                .map(|a| (a.namespace.clone(), a.name.clone()))
                .collect()
        })
        .collect();
    let mut parts = parts;
    let side = |parts: &mut [Partial], head_side: bool| {
        parts
            .iter_mut()
            .map(|p| {
                let apps = std::mem::take(if head_side {
                    &mut p.head_applications
                } else {
                    &mut p.base_applications
                });
                (p.shard, apps)
            })
            .collect::<Vec<_>>()
    };
    let base_apps = side(&mut parts, false);
    let head_apps = side(&mut parts, true);
    let with_tables = |apps: Vec<(Shard, Vec<WireApp>)>, head_side: bool| {
        apps.into_iter()
            .zip(parts.iter())
            .map(|((shard, apps), p)| {
                (
                    shard,
                    p.objects.as_slice(),
                    apps,
                    if head_side {
                        &p.head_credits
                    } else {
                        &p.base_credits
                    },
                )
            })
            .collect::<Vec<_>>()
    };
    let (base_rendering, base_shards) =
        reassemble(&base, with_tables(base_apps, false), "the merge base")?;
    let (head_rendering, head_shards) =
        reassemble(&head, with_tables(head_apps, true), "the head")?;
    refuse_split_moves(&base_rendering, &head_rendering, &base_shards, &head_shards)?;
    render::trace("merge", "renderings reassembled");
    let (old_versions, defaults) = old_versions_and_defaults(&mut parts, &own_old_versions)?;
    let missing: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let result = check::judge(
        Judged {
            base,
            head,
            base_rendering: &base_rendering,
            head_rendering: &head_rendering,
            head_snapshot: &head_snapshot,
            base_snapshot: Some(&base_snapshot),
            inventory: &parts[0].inventory,
            confinement,
        },
        |_, _| old_versions,
        |render_diff| {
            check::moves_of(render_diff)
                .into_iter()
                .filter_map(|m| {
                    let found = defaults
                        .get(&(
                            m.repo_url.clone(),
                            m.chart.clone(),
                            m.from.clone(),
                            m.to.clone(),
                        ))
                        .cloned();
                    if found.is_none() {
                        missing
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("{} {} -> {}", m.chart, m.from, m.to));
                    }
                    found
                })
                .collect()
        },
    );
    if let Some(first) = missing
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .first()
    {
        return Err(MergeError(format!(
            "no shard holds the default values of the chart move {first}: the partials are not one run's"
        )));
    }
    render::trace("merge", "judged");
    result.assert_consistent();
    // As a check does: the renderings and the partials (5,000 Applications' objects: about
    // 50 ms to free, a tenth of a merge of 8) are freed on a thread of their own, off the
    // verdict's path; the snapshots (temporary folders) are freed here.
    let held = (base_rendering, head_rendering, parts);
    let _ = std::thread::Builder::new().spawn(move || drop(held));
    drop((head_snapshot, base_snapshot, store));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_partial() -> Partial {
        Partial::new(
            Shard { index: 0, count: 2 },
            "base",
            "head",
            &Inventory::default(),
            None,
        )
    }

    fn partial_with(objects: &[Value]) -> Vec<u8> {
        let mut partial = empty_partial();
        partial.objects = objects.iter().cloned().map(Arc::new).collect();
        serde_json::to_vec(&partial).unwrap()
    }

    /// An object two partials hold is parsed once when they are read together, and only
    /// then: the values are the ones written either way.
    #[test]
    fn partials_read_together_share_their_objects() {
        let crd = serde_json::json!({"kind": "CustomResourceDefinition", "metadata": {"name": "a"}, "n": 1.5});
        let one = partial_with(&[crd.clone(), serde_json::json!({"kind": "ConfigMap"})]);
        let two = partial_with(&[serde_json::json!({"kind": "Service"}), crd.clone()]);
        let shared = Arc::new(SharedObjects::default());
        let first = Partial::from_slice(&one, &shared).unwrap();
        let second = Partial::from_slice(&two, &shared).unwrap();
        assert!(Arc::ptr_eq(&first.objects[0], &second.objects[1]));
        assert_eq!(*first.objects[0], crd);
        assert_eq!(second.objects[0]["kind"], "Service");
        // Read alone (or after a shared read on this thread), nothing is shared.
        let alone: Partial = serde_json::from_slice(&two).unwrap();
        assert!(!Arc::ptr_eq(&first.objects[0], &alone.objects[1]));
        assert_eq!(alone.objects[1], first.objects[0]);
        assert!(Partial::from_slice(b"{\"format\": 1}", &shared).is_err());
    }

    /// What every shard writes alike (the common path's lists and digests) is parsed once
    /// for partials read together, where its text is the same; another text is its own.
    #[test]
    fn partials_read_together_share_what_every_shard_writes_alike() {
        let with_specs = |specs: &[(&str, &str)]| {
            let mut partial = empty_partial();
            partial.head_common_specs = specs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
                .into();
            serde_json::to_vec(&partial).unwrap()
        };
        let shared = Arc::new(SharedObjects::default());
        let one = Partial::from_slice(&with_specs(&[("a", "1")]), &shared).unwrap();
        let two = Partial::from_slice(&with_specs(&[("a", "1")]), &shared).unwrap();
        let other = Partial::from_slice(&with_specs(&[("a", "2")]), &shared).unwrap();
        assert!(Arc::ptr_eq(
            &one.head_common_specs.0,
            &two.head_common_specs.0
        ));
        assert!(!Arc::ptr_eq(
            &one.head_common_specs.0,
            &other.head_common_specs.0
        ));
        assert_eq!(other.head_common_specs["a"], "2");
        assert_ne!(one.head_common_specs, other.head_common_specs);
        // A part changed in place (a forgery in a test) changes that partial's alone.
        let mut changed = Partial::from_slice(&with_specs(&[("a", "1")]), &shared).unwrap();
        changed.head_common_specs.insert("b".into(), "3".into());
        assert_eq!(one.head_common_specs.len(), 1);
        assert_eq!(changed.head_common_specs.len(), 2);
    }

    /// An Application's stored form and sources are left out of the wire where they are its
    /// manifest's, and read back as the manifest's; where they differ they are written.
    #[test]
    fn a_wire_app_leaves_out_what_its_manifest_gives() {
        let manifest = serde_json::json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "argocd"},
            "spec": {"sources": [{"repoURL": "https://charts.example.test", "chart": "c", "targetRevision": "1.0.0"}]}});
        let app = |stored: Value, sources: Vec<Value>| WireApp {
            name: "a".into(),
            namespace: "argocd".into(),
            project: "default".into(),
            origin: Origin::File {
                path: "apps.yaml".into(),
                document: 0,
            },
            cluster: ClusterRef {
                name: "in-cluster".into(),
                server: "https://kubernetes.default.svc".into(),
            },
            destination_namespace: "x".into(),
            sources,
            objects: vec![0],
            render_keys: vec!["k".into()],
            manifest: manifest.clone(),
            stored,
            destination_unknown: None,
            values_files: Vec::new(),
        };
        let own_sources = manifest["spec"]["sources"].as_array().unwrap().clone();
        let same = serde_json::to_value(app(manifest.clone(), own_sources.clone())).unwrap();
        assert!(
            same.get("stored").is_none() && same.get("sources").is_none(),
            "{same}"
        );
        let read: WireApp = serde_json::from_value(same).unwrap();
        assert_eq!((read.stored, read.sources), (manifest.clone(), own_sources));
        let stored = serde_json::json!({"kind": "Application", "spec": {}});
        let differs = serde_json::to_value(app(stored.clone(), Vec::new())).unwrap();
        assert_eq!(differs["stored"], stored);
        assert_eq!(differs["sources"], serde_json::json!([]));
        let read: WireApp = serde_json::from_value(differs).unwrap();
        assert_eq!((read.stored, read.sources), (stored, Vec::new()));
    }
}
