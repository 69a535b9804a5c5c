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
        let server = app
            .pointer("/spec/destination/server")
            .and_then(Value::as_str);
        let cluster_name = app
            .pointer("/spec/destination/name")
            .and_then(Value::as_str);
        let Some(cluster) = self.config.inventory.destination(server, cluster_name) else {
            // Argo CD generates it and marks it "cluster not found": the rest of the render
            // goes on, and the gate's rules decide what this one means.
            let destination = match (server, cluster_name) {
                (Some(s), _) if !s.is_empty() => format!("server {s}"),
                (_, Some(n)) if !n.is_empty() => format!("name {n}"),
                _ => "(none set)".to_string(),
            };
            let mut pending = self.pending_app(
                id,
                item,
                ClusterRef {
                    name: UNKNOWN_CLUSTER.to_string(),
                    server: server.unwrap_or("").to_string(),
                },
                source::sources_of(app),
                Vec::new(),
            );
            pending.app.destination_unknown = Some(destination);
            return Ok(pending);
        };
        let digests = |dir: &Path| -> Result<String, String> {
            let mut cache = self.chart_digests.lock().unwrap_or_else(|p| p.into_inner());
            cache
                .entry(dir.to_path_buf())
                .or_insert_with(|| cache::digest_dir(dir))
                .clone()
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
                    // Keyed by content, so equal directories share their objects.
                    let key = format!(
                        "objects-{}",
                        crate::git::hex(&sha2::Sha256::digest(
                            serde_json::to_vec(&objects).unwrap_or_default()
                        ))
                    );
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
        let app = &item.object;
        let text = |pointer: &str, default: &str| {
            app.pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_string()
        };
        PendingApp {
            id: id.to_string(),
            depth: item.depth,
            owner_hint: item.owner,
            owner: 0,
            renders_alone: false,
            job_keys,
            app: RenderedApplication {
                name: text("/metadata/name", ""),
                namespace: text("/metadata/namespace", "argocd"),
                project: text("/spec/project", "default"),
                origin: item.origin.clone(),
                cluster,
                destination_namespace: text("/spec/destination/namespace", ""),
                sources,
                objects: Vec::new(),
                render_keys: Vec::new(),
                manifest: app.clone(),
                stored: stored_application(app),
                destination_unknown: None,
                values_files: Vec::new(),
            },
        }
    }
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
