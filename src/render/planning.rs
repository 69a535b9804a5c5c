//! The render engine's room for planning: an Application's sources become render jobs.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use sha2::Digest as _;

use super::engine::{Engine, Item};
use crate::render::source::{PlanContext, RenderJob};
use crate::render::{ClusterRef, RenderedApplication, UNKNOWN_CLUSTER, cache, charts, source};

/// A planned Application: its place in the output and the keys of its render jobs.
pub(super) struct PendingApp {
    pub(super) id: String,
    pub(super) app: RenderedApplication,
    pub(super) job_keys: Vec<String>,
    pub(super) depth: usize,
    /// The shard its parent's render fixed for it (see `Item::owner`).
    pub(super) owner_hint: Option<usize>,
    /// The shard that owns it (a sharded render sets it; 0 otherwise).
    pub(super) owner: usize,
    /// Whether its render runs a process (helm or kustomize), so that only its owner renders
    /// it (a sharded render sets it).
    pub(super) renders_alone: bool,
}

impl Engine<'_> {
    pub(super) fn plan_application(&mut self, id: &str, item: &Item) -> Result<PendingApp, String> {
        let app = &item.object;
        let cluster = match destination_of(app, &self.config.inventory) {
            Ok(cluster) => cluster,
            Err((cluster, destination)) => {
                // Argo CD generates it and marks it "cluster not found": the rest of the
                // render goes on, and the gate's rules decide what this one means.
                let mut pending =
                    self.pending_app(id, item, cluster, source::sources_of(app), Vec::new());
                pending.app.destination_unknown = Some(destination);
                return Ok(pending);
            }
        };
        let digests = |dir: &Path| -> Result<String, String> {
            let mut cache = self.chart_digests.lock().unwrap_or_else(|p| p.into_inner());
            cache
                .entry(dir.to_path_buf())
                .or_insert_with(|| cache::digest_and_bytes(dir))
                .clone()
                .map(|(digest, _)| digest)
        };
        let pull = |chart: &charts::ChartRef| -> Result<(), String> {
            self.config.chart_pulls.check(&chart.repo_url)?;
            let mirror = self
                .config
                .charts
                .as_deref()
                .ok_or("--charts DIR is required to pull charts")?;
            charts::pull(
                &self.config.helm,
                mirror,
                chart,
                &self.config.chart_repo_mirrors,
            )
            .map(|_| ())
        };
        let ctx = PlanContext {
            repos: &self.repos,
            charts: self.config.charts.as_deref(),
            chart_digests: &digests,
            pull: if self.config.chart_pulls.enabled() {
                Some(&pull)
            } else {
                None
            },
        };
        let planned = source::plan(app, &cluster, &ctx)?;
        let mut job_keys = Vec::new();
        let mut sources = Vec::new();
        let mut values_files: Vec<String> = Vec::new();
        for planned_source in planned {
            sources.push(planned_source.source);
            let Some(job) = planned_source.job else {
                continue;
            };
            if let RenderJob::Helm(h) = &job {
                for file in h.values.iter().filter_map(|v| v.file.as_ref()) {
                    if file.repo_dir == self.config.repo_dir && !values_files.contains(&file.path) {
                        values_files.push(file.path.clone());
                    }
                }
            }
            let key = match &job {
                RenderJob::Helm(h) => h.render_key(),
                RenderJob::Kustomize(k) => k.render_key(),
                RenderJob::Objects(objects) => {
                    let key = objects_key(objects);
                    if !self.memo.contains_key(&key) {
                        let parsed = self.config.parsed.get(&key).unwrap_or_else(|| {
                            Ok(Arc::new(objects.iter().cloned().map(Arc::new).collect()))
                        });
                        self.config.parsed.insert(&key, parsed.clone());
                        self.memo.insert(key.clone(), parsed);
                    }
                    job_keys.push(key);
                    continue;
                }
            };
            if let RenderJob::Helm(h) = &job {
                self.helm_jobs
                    .entry(key.clone())
                    .or_insert_with(|| h.clone());
            }
            if !self.memo.contains_key(&key) {
                self.queued.push((key.clone(), job));
            }
            job_keys.push(key);
        }
        let mut pending = self.pending_app(
            id,
            item,
            ClusterRef {
                name: cluster.name.clone(),
                server: cluster.server.clone(),
            },
            sources,
            job_keys,
        );
        self.values_users
            .push((id.to_string(), cluster.name.clone(), values_files.clone()));
        pending.app.values_files = values_files;
        Ok(pending)
    }

    fn pending_app(
        &self,
        id: &str,
        item: &Item,
        cluster: ClusterRef,
        sources: Vec<Value>,
        job_keys: Vec<String>,
    ) -> PendingApp {
        PendingApp {
            id: id.to_string(),
            depth: item.depth,
            owner_hint: item.owner,
            owner: 0,
            renders_alone: false,
            job_keys,
            app: application_of(&item.object, item.origin.clone(), cluster, sources),
        }
    }
}

/// An Application's destination cluster in the inventory; where the inventory has none of
/// that server or name, the cluster as the Application names it and its destination in words
/// (what `destination_unknown` says).
fn destination_of<'i>(
    app: &Value,
    inventory: &'i crate::render::inventory::Inventory,
) -> Result<std::borrow::Cow<'i, crate::render::inventory::Cluster>, (ClusterRef, String)> {
    let server = app
        .pointer("/spec/destination/server")
        .and_then(Value::as_str);
    let name = app
        .pointer("/spec/destination/name")
        .and_then(Value::as_str);
    inventory.destination(server, name).ok_or_else(|| {
        let destination = match (server, name) {
            (Some(s), _) if !s.is_empty() => format!("server {s}"),
            (_, Some(n)) if !n.is_empty() => format!("name {n}"),
            _ => "(none set)".to_string(),
        };
        let cluster = ClusterRef {
            name: UNKNOWN_CLUSTER.to_string(),
            server: server.unwrap_or("").to_string(),
        };
        (cluster, destination)
    })
}

/// The key of a plain job's objects: keyed by content, so equal directories share them.
fn objects_key(objects: &[Value]) -> String {
    format!(
        "objects-{}",
        crate::git::hex(&sha2::Sha256::digest(
            serde_json::to_vec(objects).unwrap_or_default()
        ))
    )
}

/// A planned Application before its jobs ran: what its spec, origin, destination cluster and
/// planned sources say.
fn application_of(
    app: &Value,
    origin: crate::render::Origin,
    cluster: ClusterRef,
    sources: Vec<Value>,
) -> RenderedApplication {
    let text = |pointer: &str, default: &str| {
        app.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    };
    RenderedApplication {
        name: text("/metadata/name", ""),
        namespace: text("/metadata/namespace", "argocd"),
        project: text("/spec/project", "default"),
        origin,
        cluster,
        destination_namespace: text("/spec/destination/namespace", ""),
        sources,
        objects: Vec::new(),
        render_keys: Vec::new(),
        manifest: app.clone(),
        stored: stored_application(app),
        destination_unknown: None,
        values_files: Vec::new(),
    }
}

/// What the engine makes of one Application (the object as planned: `manifest`), read again
/// without the engine's state (`gate merge` checks a partial against it).
pub enum Replanned {
    /// Its render runs helm or kustomize: what its spec and the inventory give (its identity,
    /// project, destination cluster and namespace, the Application as stored; sources,
    /// objects, render keys and values files left empty), and the objects of its plain
    /// sources (directories of manifests beside a chart: [`source::plain_objects`]), which
    /// every render of it holds among the rest.
    Process {
        app: RenderedApplication,
        plain_objects: Vec<Value>,
    },
    /// Its destination is no cluster of the inventory (nothing renders), or its sources are
    /// plain manifests: everything the engine gives it, objects and render keys included,
    /// read from the repositories alone (no process).
    Whole(RenderedApplication),
}

/// [`Replanned`] of one Application, as the engine plans and renders it: an unknown
/// destination first, then, when no source runs a process (`source::runs_a_process`, read
/// from the repositories), its plain sources read and sorted as a render sorts them; when one
/// does, its plain sources alone. An error is what planning it would say (a plugin, a path
/// that does not exist, a repository with no mirror).
pub fn replan(
    manifest: &Value,
    origin: crate::render::Origin,
    inventory: &crate::render::inventory::Inventory,
    repos: &crate::render::repos::RepoResolver,
) -> Result<Replanned, String> {
    let cluster = match destination_of(manifest, inventory) {
        Ok(cluster) => cluster,
        Err((cluster, destination)) => {
            let mut app = application_of(manifest, origin, cluster, source::sources_of(manifest));
            app.destination_unknown = Some(destination);
            return Ok(Replanned::Whole(app));
        }
    };
    let cluster_ref = ClusterRef {
        name: cluster.name.clone(),
        server: cluster.server.clone(),
    };
    let no_charts = |_: &Path| -> Result<String, String> { Err("no chart is read".into()) };
    let ctx = PlanContext {
        repos,
        charts: None,
        chart_digests: &no_charts,
        pull: None,
    };
    if source::runs_a_process(manifest, repos)? {
        return Ok(Replanned::Process {
            app: application_of(manifest, origin, cluster_ref, Vec::new()),
            plain_objects: source::plain_objects(manifest, &cluster, &ctx)?,
        });
    }
    let mut sources = Vec::new();
    let mut render_keys = Vec::new();
    let mut objects: Vec<crate::render::parsed::Object> = Vec::new();
    for planned in source::plan(manifest, &cluster, &ctx)? {
        sources.push(planned.source);
        match planned.job {
            None => {}
            Some(RenderJob::Objects(read)) => {
                render_keys.push(objects_key(&read));
                objects.extend(read.into_iter().map(Arc::new));
            }
            // `runs_a_process` said none does: planning disagreeing is a bug, said as one.
            Some(_) => return Err("planning runs a process its sources do not name".into()),
        }
    }
    objects.sort_by_cached_key(|o| crate::render::object_sort_key(o));
    let mut app = application_of(manifest, origin, cluster_ref, sources);
    app.objects = objects;
    app.render_keys = render_keys;
    Ok(Replanned::Whole(app))
}

/// An Application as Argo CD stores it: what the generator or file wrote of its identity,
/// labels, annotations and finalizers, and its whole spec; nothing the cluster adds.
pub fn stored_application(app: &Value) -> Value {
    let mut metadata = serde_json::Map::new();
    for key in ["name", "namespace", "labels", "annotations", "finalizers"] {
        if let Some(value) = app.pointer(&format!("/metadata/{key}"))
            && !value.is_null()
            && value.as_object().is_none_or(|o| !o.is_empty())
            && value.as_array().is_none_or(|a| !a.is_empty())
        {
            metadata.insert(key.to_string(), value.clone());
        }
    }
    metadata
        .entry("namespace")
        .or_insert_with(|| Value::String("argocd".into()));
    serde_json::json!({
        "apiVersion": app.get("apiVersion").cloned().unwrap_or_else(|| "argoproj.io/v1alpha1".into()),
        "kind": "Application",
        "metadata": metadata,
        "spec": app.get("spec").cloned().unwrap_or(Value::Null),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::git::Snapshot;
    use crate::render::inventory::Inventory;
    use crate::render::repos::RepoResolver;

    const URL: &str = "https://git.example.test/platform/gitops.git";

    fn app(sources: Vec<Value>) -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "mixed", "namespace": "argocd"},
            "spec": {
                "project": "default",
                "sources": sources,
                "destination": {"server": "https://kubernetes.default.svc", "namespace": "x"},
            },
        })
    }

    fn path(path: &str) -> Value {
        json!({"repoURL": URL, "targetRevision": "HEAD", "path": path})
    }

    fn names(objects: impl IntoIterator<Item = Value>) -> Vec<String> {
        objects
            .into_iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// An Application with a helm or kustomize source beside directories of manifests: the
    /// merge reads those directories alone (no process), each source's type told as planning
    /// tells it; one of plain manifests only is read whole.
    #[test]
    fn the_plain_sources_beside_a_process_are_read_alone() {
        let files: BTreeMap<String, Vec<u8>> = [
            ("chart/Chart.yaml", "apiVersion: v2\nname: c\nversion: 0.1.0\n"),
            ("chart/templates/cm.yaml", "kind: ConfigMap\n"),
            ("base/kustomization.yaml", "resources: []\n"),
            (
                "crds/crd.yaml",
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.test\n",
            ),
            (
                "more/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: more\n",
            ),
        ]
        .into_iter()
        .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
        .collect();
        let repos = RepoResolver::new(
            Arc::new(Snapshot::from_files("c0", files)),
            Some(URL.into()),
            Vec::new(),
        );
        let origin = crate::render::Origin::File {
            path: "app.yaml".into(),
            document: 0,
        };
        let inventory = Inventory::default();
        let chart = json!({"repoURL": "https://charts.example.test", "chart": "c", "targetRevision": "1.0.0"});
        let values = json!({"repoURL": URL, "targetRevision": "HEAD", "ref": "values"});
        for (process, expected) in [
            (chart, vec!["widgets.example.test", "more"]),
            (path("chart"), vec!["widgets.example.test", "more"]),
            (path("base"), vec!["widgets.example.test", "more"]),
        ] {
            let mixed = app(vec![
                process.clone(),
                values.clone(),
                path("crds"),
                path("more"),
            ]);
            match replan(&mixed, origin.clone(), &inventory, &repos).unwrap() {
                Replanned::Process { app, plain_objects } => {
                    assert_eq!(app.name, "mixed");
                    assert!(app.objects.is_empty());
                    assert_eq!(names(plain_objects), expected, "{process}");
                }
                Replanned::Whole(_) => panic!("{process} runs a process"),
            }
        }
        match replan(
            &app(vec![path("crds"), path("more")]),
            origin,
            &inventory,
            &repos,
        )
        .unwrap()
        {
            Replanned::Whole(app) => assert_eq!(
                names(app.objects.iter().map(|o| Value::clone(o))),
                ["more", "widgets.example.test"]
            ),
            Replanned::Process { .. } => panic!("plain manifests run no process"),
        }
    }
}
