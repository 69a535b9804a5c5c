//! Sharded checks: `gate check --shard I/N` renders one shard of the fleet at both commits and
//! writes a partial result; `gate merge` combines the partials of every shard into the verdict
//! one unsharded check gives.
//!
//! A shard ([`render::render_shard`]) renders the Applications whose identity hashes to it
//! (`namespace/name`, [`Shard::of`]: the same at both commits), and the children a helm or
//! kustomize render of its own produces; every shard expands every ApplicationSet and renders
//! every Application of plain manifests (no process: how each shard finds its own).
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
//! each other before it judges ([`bind`]), at each commit: the partials name the commits the
//! merge reads, every shard read every Application and ApplicationSet of the repository's
//! files (the merge lists them itself, reading, not rendering), every Application the
//! repository's files or any shard's common path name is held by its shard, and every
//! Application a shard holds is its own: its key hashes to that shard, or a render only that
//! shard runs deploys it. A partial that leaves out, adds or shadows another shard's
//! Application is refused; what a shard's own helm and kustomize renders hold is its word.

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
use crate::render::{
    self, ClusterRef, Known, Origin, RenderConfig, RenderedApplication, Rendering, Shard,
};

/// The partial result's format, written in every partial and checked by the merge.
pub const FORMAT: &str = "gitops-gate/check-partial/v2";

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
    #[serde(default)]
    pub confinement: Option<Confinement>,
    /// Set when this shard could not decide: why, per commit.
    #[serde(default)]
    pub undecided: Option<Undecided>,
    /// Every object the Applications below render, once (they name them by index).
    #[serde(default)]
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
    pub base_known: Vec<Known>,
    #[serde(default)]
    pub head_known: Vec<Known>,
    /// This shard's head Applications whose chart moved, rendered at the base's versions.
    #[serde(default)]
    pub old_versions: Vec<WireApp>,
    /// The default values of the chart moves of this shard's Applications.
    #[serde(default)]
    pub chart_defaults: Vec<ChartDefaults>,
}

/// Why a shard could not decide: the error lines at the head and at the merge base.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Undecided {
    pub head: Vec<String>,
    pub base: Vec<String>,
}

/// A rendered Application as a partial holds it: every field, its objects by index.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    #[serde(default)]
    pub destination_unknown: Option<String>,
    #[serde(default)]
    pub values_files: Vec<String>,
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
    fn new(shard: Shard, base: &str, head: &str, inventory: &Inventory) -> Partial {
        Partial {
            format: FORMAT.to_string(),
            shard,
            base: base.to_string(),
            head: head.to_string(),
            inventory_digest: inventory_digest(inventory),
            inventory: inventory.clone(),
            confinement: None,
            undecided: None,
            objects: Vec::new(),
            base_applications: Vec::new(),
            head_applications: Vec::new(),
            base_credits: BTreeMap::new(),
            head_credits: BTreeMap::new(),
            base_known: Vec::new(),
            head_known: Vec::new(),
            old_versions: Vec::new(),
            chart_defaults: Vec::new(),
        }
    }

    /// The partial of a shard whose check was undecided before it rendered (the commits could
    /// not be resolved): the verdict's errors, as the head's.
    pub fn undecided(result: &GateResult, shard: Shard, inventory: &Inventory) -> Partial {
        let mut partial =
            Partial::new(shard, &result.verdict.base, &result.verdict.head, inventory);
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
    let mut partial = Partial::new(shard, &base, &head, &config.inventory);
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
    let (head_rendering, base_rendering) = check::render_both(&head, &base, |revision| {
        render::render_shard(config, revision, shard)
    });
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
    partial.base_known = base_rendering.stats.shard_known.iter().cloned().collect();
    partial.head_known = head_rendering.stats.shard_known.iter().cloned().collect();
    partial
}

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
}

/// Whether an Application's render runs a process (helm or kustomize): then only its owner
/// renders it, and what it deploys stays in that shard (`render::engine`'s `keep_shard`).
fn renders_alone(app: &WireApp) -> bool {
    app.render_keys.iter().any(|k| !k.starts_with("objects-"))
}

/// Which of one partial's Applications at one commit a render only that shard runs may have
/// put there: those a helm or kustomize render of its own deploys, and what those deploy in
/// turn (the render engine gives them its shard), through ApplicationSets too.
struct Inheritance<'a> {
    /// The partial's Applications by namespace and name.
    apps: HashMap<(&'a str, &'a str), &'a WireApp>,
    /// ApplicationSets by namespace and name -> the partial's Applications whose render
    /// holds one.
    sets: HashMap<(String, String), Vec<&'a WireApp>>,
    /// Decided so far (None while deciding: a cycle of origins inherits nothing).
    memo: HashMap<(&'a str, &'a str), Option<bool>>,
}

impl<'a> Inheritance<'a> {
    fn new(part: &'a Partial, apps: &'a [WireApp]) -> Inheritance<'a> {
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
                // The namespace as the engine gives a child: its own, else the parent's
                // destination namespace, else argocd.
                let namespace = match object.pointer("/metadata/namespace") {
                    Some(namespace) => namespace.as_str().unwrap_or("argocd").to_string(),
                    None if app.destination_namespace.is_empty() => "argocd".to_string(),
                    None => app.destination_namespace.clone(),
                };
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                sets.entry((namespace, name)).or_default().push(app);
            }
        }
        Inheritance {
            apps: apps
                .iter()
                .map(|a| ((a.namespace.as_str(), a.name.as_str()), a))
                .collect(),
            sets,
            memo: HashMap::new(),
        }
    }

    /// Whether what `app` deploys stays in this shard.
    fn keeps_children(&mut self, app: &'a WireApp) -> bool {
        renders_alone(app) || self.inherited(app)
    }

    /// Whether `app` may be this shard's by its parent: the parent is this shard's and keeps
    /// what it deploys.
    fn inherited(&mut self, app: &'a WireApp) -> bool {
        let key = (app.namespace.as_str(), app.name.as_str());
        match self.memo.get(&key) {
            Some(Some(decided)) => return *decided,
            Some(None) => return false,
            None => {}
        }
        self.memo.insert(key, None);
        let decided = match &app.origin {
            Origin::File { .. } => false,
            Origin::Application { namespace, name } => {
                match self.apps.get(&(namespace.as_str(), name.as_str())).copied() {
                    Some(parent) => self.keeps_children(parent),
                    None => false,
                }
            }
            Origin::ApplicationSet { namespace, name } => {
                let parents = self
                    .sets
                    .get(&(namespace.clone(), name.clone()))
                    .cloned()
                    .unwrap_or_default();
                parents
                    .into_iter()
                    .any(|parent| self.keeps_children(parent))
            }
        };
        self.memo.insert(key, Some(decided));
        decided
    }
}

/// Binds the partials to the repository and to each other at one commit (`commit`, read
/// from the repository as `snapshot`), before anything is judged:
///
/// - every shard read every Application and ApplicationSet of the repository's files (the
///   merge lists them itself: read, not rendered), so no partial is of another commit or
///   another repository;
/// - every Application those files declare, or any shard reached on a path every shard
///   follows, is held by the shard its key hashes to ([`Shard::of`]): a partial that left
///   one out is refused, whichever shard noticed;
/// - every Application a shard holds is its own: its key hashes to that shard, or a helm or
///   kustomize render of that shard deploys it (directly, through Applications it deploys, or
///   through an ApplicationSet it deploys); each once; one that says a file declares it is
///   one the files declare there. A partial cannot add an Application of another shard, nor
///   shadow one with a made-up parent; a real parent of its own whose chart it says deploys
///   another shard's Application is its word on its own render (trusted, see the docs).
fn bind(
    parts: &[Partial],
    side: Side,
    commit: &str,
    snapshot: &crate::git::Snapshot,
) -> Result<(), MergeError> {
    let count = parts[0].shard.count;
    let at = || format!("{} {commit}", side.name());
    let roots = render::roots(snapshot).map_err(|d| {
        MergeError(format!(
            "cannot list the Applications of {}: {}: {}",
            at(),
            d.subject,
            d.message
        ))
    })?;
    for part in parts {
        let known: HashSet<&Known> = side.known(part).iter().collect();
        if let Some((root, path)) = roots.iter().find(|(root, _)| !known.contains(root)) {
            return Err(MergeError(format!(
                "shard {} did not read {root} (file {path}), which {} holds: that partial is not of this repository at these commits",
                label(part.shard),
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
    let required: BTreeSet<(&str, &str)> = roots
        .iter()
        .map(|(known, _)| known)
        .chain(parts.iter().flat_map(|part| side.known(part)))
        .filter(|known| known.kind == "Application")
        .map(|known| (known.namespace.as_str(), known.name.as_str()))
        .collect();
    for (namespace, name) in required {
        let owner = Shard::of(namespace, name, count);
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
    // What the repository's files declare, where: a held Application that says it was
    // declared in a file must be one of them (a made-up parent cannot pass for a root).
    let declared: HashSet<(&str, &str, &str)> = roots
        .iter()
        .filter(|(known, _)| known.kind == "Application")
        .map(|(known, path)| (known.namespace.as_str(), known.name.as_str(), path.as_str()))
        .collect();
    for part in parts {
        let apps = side.applications(part);
        for app in apps {
            if let render::Origin::File { path, .. } = &app.origin
                && !declared.contains(&(app.namespace.as_str(), app.name.as_str(), path.as_str()))
            {
                return Err(MergeError(format!(
                    "shard {} holds Application {}/{} at {} as declared in file {}, which does not declare it there: a partial holds only what the repository holds",
                    label(part.shard),
                    app.namespace,
                    app.name,
                    at(),
                    path.chars().take(200).collect::<String>()
                )));
            }
        }
        let mut inheritance = Inheritance::new(part, apps);
        for app in apps {
            let owner = Shard::of(&app.namespace, &app.name, count);
            if owner != part.shard.index && !inheritance.inherited(app) {
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
        }
    }
    Ok(())
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
                // The same Application reached from a file (by its own shard) and from a
                // parent's render (by the parent's): the parent's wins, as in one render.
                Some((other, other_shard)) => {
                    let from_file =
                        |a: &RenderedApplication| matches!(a.origin, Origin::File { .. });
                    let kept = match (from_file(&other), from_file(&app)) {
                        (true, false) => (app, shard),
                        (false, true) => (other, other_shard),
                        _ => {
                            return Err(MergeError(format!(
                                "{id} at {commit} is rendered by shard {} and shard {}: the partials are not one run's",
                                label(other_shard),
                                label(shard)
                            )));
                        }
                    };
                    by_identity.insert(id, kept);
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

/// Every shard's partial -> the verdict one unsharded check of the same commits gives.
/// `repo` holds both commits (the rules read the repository's manifests, and the merge
/// binds the partials to its files: [`bind`]). Refuses (one line) partials of different
/// runs, commits or inventories, a shard missing or given twice, a partial that leaves out,
/// adds or shadows an Application of another shard.
pub fn merge(parts: Vec<Partial>, repo: &Path) -> Result<GateResult, MergeError> {
    validate(&parts)?;
    let base = parts[0].base.clone();
    let head = parts[0].head.clone();
    let confinement = confinement_of(&parts);
    if parts.iter().any(|p| p.undecided.is_some()) {
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
        return Ok(result);
    }
    let confinement = confinement
        .ok_or_else(|| MergeError("a shard rendered nothing and said not why".into()))?;
    let store = render::parsed::ParsedStore::default();
    let head_snapshot = snapshot_of(&store, repo, Side::Head, &head)?;
    let base_snapshot = snapshot_of(&store, repo, Side::Base, &base)?;
    bind(&parts, Side::Base, &base, &base_snapshot)?;
    bind(&parts, Side::Head, &head, &head_snapshot)?;
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
    let mut old_versions = BTreeMap::new();
    let mut defaults: HashMap<(String, String, String, String), ChartDefaults> = HashMap::new();
    for (part, own) in parts.iter_mut().zip(&own_old_versions) {
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
    result.assert_consistent();
    Ok(result)
}
