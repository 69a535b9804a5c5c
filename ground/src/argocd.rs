//! Argo CD behaviour: Applications (and the ApplicationSets that generate them) rendered from
//! the forge's repository at the tracked branch with the project's own render engine, written
//! to the API double with `status.sync`, `status.health` and `status.summary.images` following
//! each new commit, as Argo CD takes them from live Pods (sorted raw image strings of the
//! rendered workloads' pod templates). [A controller/cache/info.go populatePodInfo]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::kube::KubeDouble;
use crate::kube::store::{Resource, Selector, User};
use crate::transcript::Transcript;
use gitops_loop::render::{self, RenderConfig, RenderedApplication};

/// A scenario's hold on one Application's rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// The rollout stalls half-way: old and new images both run, health Progressing.
    RolloutStalled,
    /// Every workload is scaled to zero: no Pods, no images.
    ScaledToZero,
    /// The next version passes its first health check, then crash-loops: Healthy at the
    /// sync, Degraded from the next round on.
    DegradesAfterSync,
}

pub struct ArgoCd {
    pub config: RenderConfig,
    /// The forge's bare repository and the branch Applications track.
    pub bare: PathBuf,
    pub branch: String,
    pub holds: BTreeMap<String, Hold>,
    synced: Option<String>,
    /// Applications synced Healthy that turn Degraded at the next round: (namespace, name).
    degrading: Vec<(String, String)>,
    /// Applications without automated sync whose desired state moved: what a sync would
    /// apply (the render at `revision`), kept until someone asks for a sync operation.
    pending: BTreeMap<String, (RenderedApplication, String)>,
    images: BTreeMap<String, Vec<String>>,
    digests: BTreeMap<String, String>,
    /// Each destination's CRDs: the versions objects were stored in (the API server's
    /// `status.storedVersions`: every storage version a sync applied, in that order, never
    /// trimmed here).
    stored: BTreeMap<(String, String), Vec<String>>,
    /// Applications whose last sync the API server refused, with its message.
    refused: BTreeMap<String, String>,
}

/// The API server's refusal of a CRD update whose `spec.versions` leaves out a version in its
/// `status.storedVersions` (worded as kube-apiserver v1.34 words it, the Kubernetes double's
/// [`crate::kube::schema::stored_version_missing`]), for the
/// objects one sync of `app` applies to its destination; `None` when every CRD is accepted.
pub fn stored_version_refusal(
    stored: &BTreeMap<(String, String), Vec<String>>,
    destination: &str,
    objects: &[std::sync::Arc<Value>],
) -> Option<String> {
    for object in objects {
        let Some((name, info)) = gitops_loop::gate::crd::crd_info(object) else {
            continue;
        };
        let Some(versions) = stored.get(&(destination.to_string(), name.clone())) else {
            continue;
        };
        if let Some((index, missing)) = versions
            .iter()
            .enumerate()
            .find(|(_, v)| !info.versions.contains(*v))
        {
            return Some(format!(
                "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: {}",
                crate::kube::schema::stored_version_missing(index, missing)
            ));
        }
    }
    None
}

pub fn identity() -> User {
    User {
        name: "system:serviceaccount:argocd:argocd-application-controller".into(),
        groups: vec!["system:serviceaccounts".into()],
    }
}

/// Raw image strings of the workloads' pod templates, sorted and de-duplicated; nothing for
/// a workload scaled to zero.
pub fn images_of<V: std::borrow::Borrow<Value>>(objects: &[V]) -> Vec<String> {
    let mut images = BTreeSet::new();
    for object in objects {
        let object: &Value = object.borrow();
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let pod_spec = match kind {
            "Deployment" | "StatefulSet" | "ReplicaSet" => {
                if object.pointer("/spec/replicas").and_then(Value::as_u64) == Some(0) {
                    continue;
                }
                object.pointer("/spec/template/spec")
            }
            // Argo CD's summary lists the images of what runs: a Rollout's Pods (unless
            // scaled to zero), never a CronJob's until a Job of it runs (none does here).
            "Rollout" => {
                if object.pointer("/spec/replicas").and_then(Value::as_u64) == Some(0) {
                    continue;
                }
                object.pointer("/spec/template/spec")
            }
            "DaemonSet" | "Job" => object.pointer("/spec/template/spec"),
            "CronJob" => None,
            "Pod" => object.get("spec"),
            _ => None,
        };
        let Some(pod_spec) = pod_spec else { continue };
        for list in ["initContainers", "containers"] {
            for container in pod_spec
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(image) = container.get("image").and_then(Value::as_str) {
                    images.insert(image.to_string());
                }
            }
        }
    }
    images.into_iter().collect()
}

/// What one round did to one Application.
enum AppSync {
    /// Its desired state moved, and it does not sync by itself.
    OutOfSync,
    /// Synced, but the API server refused one of its CRDs.
    Failed,
    /// Synced to a new render: the images it now runs and its health.
    Moved(Vec<String>, &'static str),
    /// Synced to what it ran already (or the first round).
    Unchanged,
}

impl ArgoCd {
    pub fn new(config: RenderConfig, bare: PathBuf, branch: &str) -> ArgoCd {
        ArgoCd {
            config,
            bare,
            branch: branch.to_string(),
            holds: BTreeMap::new(),
            degrading: Vec::new(),
            pending: BTreeMap::new(),
            synced: None,
            images: BTreeMap::new(),
            digests: BTreeMap::new(),
            stored: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    fn resource(kube: &KubeDouble) -> Option<Resource> {
        kube.store()
            .resource("argoproj.io", "v1alpha1", "applications")
            .cloned()
    }

    /// Re-renders when the branch moved and writes every Application with its status.
    pub async fn tick(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let Some(revision) =
            crate::git::rev_parse(&self.bare, &format!("refs/heads/{}", self.branch))
        else {
            return false;
        };
        if !self.degrading.is_empty()
            && let Some(resource) = Self::resource(kube)
        {
            self.degrade(kube, transcript, &resource);
            return true;
        }
        if self.synced.as_deref() == Some(revision.as_str()) {
            return self.run_operations(kube, transcript);
        }
        let first = self.synced.is_none();
        self.synced = Some(revision.clone());
        let Some(rendering) = self.render_at(&revision, transcript).await else {
            return true;
        };
        let Some(resource) = Self::resource(kube) else {
            return true;
        };
        let mut changed = Vec::new();
        let mut failed = 0usize;
        let mut live = BTreeSet::new();
        for app in &rendering.applications {
            live.insert((app.namespace.clone(), app.name.clone()));
            match self.sync_application(kube, transcript, &resource, app, &revision, first) {
                AppSync::OutOfSync | AppSync::Unchanged => {}
                AppSync::Failed => failed += 1,
                AppSync::Moved(images, health) => changed.push((app.name.clone(), images, health)),
            }
        }
        Self::prune(kube, transcript, &resource, &live);
        if first {
            transcript.say(
                "argocd",
                format!(
                    "{}@{}: {} Applications Synced and Healthy",
                    self.branch,
                    &revision[..7],
                    rendering.applications.len()
                ),
            );
        } else if changed.is_empty() && failed == 0 {
            transcript.say(
                "argocd",
                format!("{}@{}: nothing to sync", self.branch, &revision[..7]),
            );
        }
        for (name, images, health) in changed {
            transcript.say(
                "argocd",
                format!(
                    "{name}: OutOfSync -> Synced at {}, {health}, images {}",
                    &revision[..7],
                    images.join(" ")
                ),
            );
        }
        self.run_operations(kube, transcript);
        true
    }

    /// The Applications synced Healthy last round that crash-loop now: Degraded.
    fn degrade(&mut self, kube: &KubeDouble, transcript: &Transcript, resource: &Resource) {
        for (namespace, name) in std::mem::take(&mut self.degrading) {
            let patched = kube.store().patch(
                resource,
                &namespace,
                &name,
                crate::kube::store::PatchBody::Merge(
                    json!({"status": {"health": {"status": "Degraded", "message": "back-off restarting failed container"}}}),
                ),
                &identity(),
                false,
            );
            if patched.is_ok() {
                transcript.say(
                    "argocd",
                    format!("{name}: Healthy -> Degraded (CrashLoopBackOff)"),
                );
            }
        }
    }

    /// The render of the tracked branch at `revision` (off the async runtime); `None`, said on
    /// the transcript, when it fails.
    async fn render_at(
        &self,
        revision: &str,
        transcript: &Transcript,
    ) -> Option<render::Rendering> {
        let mut config = self.config.clone();
        // A fresh parsed-output store per sync: nothing accumulates over a scenario.
        config.parsed = Default::default();
        let at = revision.to_string();
        let job = move || render::render(&config, &at);
        match tokio::task::spawn_blocking(job).await {
            Ok(Ok(rendering)) => Some(rendering),
            Ok(Err(failure)) => {
                transcript.say(
                    "argocd",
                    format!(
                        "{}@{}: ComparisonError: {}",
                        self.branch,
                        &revision[..7],
                        failure.to_string().lines().next().unwrap_or("")
                    ),
                );
                None
            }
            Err(e) => {
                transcript.say("argocd", format!("render task failed: {e}"));
                None
            }
        }
    }

    /// One Application of a new render: left OutOfSync when it does not sync by itself and
    /// its desired state moved, else synced (its CRDs applied, its images and health as its
    /// hold says) and written.
    fn sync_application(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        resource: &Resource,
        app: &RenderedApplication,
        revision: &str,
        first: bool,
    ) -> AppSync {
        let digest = serde_json::to_string(&app.objects).unwrap_or_default();
        // [A controller/appcontroller.go autoSync]: only an Application with
        // syncPolicy.automated (not `enabled: false`) syncs by itself; any other goes
        // OutOfSync and keeps running what it ran until a sync operation is requested.
        let automated = app
            .manifest
            .pointer("/spec/syncPolicy/automated")
            .is_some_and(|a| a.is_object() && a.get("enabled") != Some(&Value::Bool(false)));
        let requested = kube
            .store()
            .get(resource, &app.namespace, &app.name)
            .ok()
            .is_some_and(|o| o.get("operation").is_some_and(|op| !op.is_null()));
        if !first
            && !automated
            && !requested
            && self.digests.get(&app.name).map(String::as_str) != Some(digest.as_str())
        {
            self.pending
                .insert(app.name.clone(), (app.clone(), revision.to_string()));
            self.mark_out_of_sync(kube, transcript, resource, app);
            return AppSync::OutOfSync;
        }
        self.pending.remove(&app.name);
        // A refused CRD fails its task; the wave's other tasks are still applied
        // [gitops-engine pkg/sync/sync_context.go: a wave's tasks run together], so the
        // workloads move on while the CRD stays old.
        let refusal = self.apply_crds(app).err();
        let new_images = images_of(&app.objects);
        let before = self.digests.insert(app.name.clone(), digest.clone());
        let old_images = self
            .images
            .insert(app.name.clone(), new_images.clone())
            .unwrap_or_default();
        let (images, health) = match self.holds.get(&app.name) {
            Some(Hold::RolloutStalled) => {
                let mut both: BTreeSet<String> = old_images.iter().cloned().collect();
                both.extend(new_images.iter().cloned());
                (both.into_iter().collect::<Vec<_>>(), "Progressing")
            }
            Some(Hold::ScaledToZero) => (Vec::new(), "Healthy"),
            Some(Hold::DegradesAfterSync) | None => (new_images.clone(), "Healthy"),
        };
        if self.holds.get(&app.name) == Some(&Hold::DegradesAfterSync)
            && !first
            && before.as_deref() != Some(digest.as_str())
        {
            self.degrading
                .push((app.namespace.clone(), app.name.clone()));
        }
        if let Some(Hold::RolloutStalled) = self.holds.get(&app.name) {
            // Keep the old images for the next comparison: the rollout has not finished.
            self.images.insert(app.name.clone(), old_images.clone());
        }
        self.write(kube, transcript, resource, app, revision, &images, health);
        if let Some(message) = refusal {
            self.mark_sync_failed(kube, transcript, resource, app, &message);
            return AppSync::Failed;
        }
        if !first && before.as_deref() != Some(digest.as_str()) {
            return AppSync::Moved(images, health);
        }
        AppSync::Unchanged
    }

    /// Applications no longer generated are deleted (pruned).
    fn prune(
        kube: &KubeDouble,
        transcript: &Transcript,
        resource: &Resource,
        live: &BTreeSet<(String, String)>,
    ) {
        let existing = kube
            .store()
            .list(resource, "", &Selector::default(), &Selector::default());
        for object in existing {
            let namespace = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !live.contains(&(namespace.clone(), name.clone())) {
                let _ = kube
                    .store()
                    .delete(resource, &namespace, &name, &identity());
                transcript.say("argocd", format!("{name}: deleted (no longer generated)"));
            }
        }
    }

    /// An Application whose desired state moved but that does not sync by itself: OutOfSync,
    /// still at the revision and images it runs.
    fn mark_out_of_sync(
        &self,
        kube: &KubeDouble,
        transcript: &Transcript,
        resource: &Resource,
        app: &RenderedApplication,
    ) {
        let patched = kube.store().patch(
            resource,
            &app.namespace,
            &app.name,
            crate::kube::store::PatchBody::Merge(
                json!({"status": {"sync": {"status": "OutOfSync"}}}),
            ),
            &identity(),
            false,
        );
        if patched.is_ok() {
            transcript.say(
                "argocd",
                format!(
                    "{}: OutOfSync (no automated sync: it keeps running what it ran until synced)",
                    app.name
                ),
            );
        }
    }

    /// Runs the sync operations requested on Applications (`operation`, as Kargo's
    /// argocd-update sets it): the Application is synced to the branch head, and
    /// `status.operationState` records the operation, its phase and the revision synced; the
    /// request is then cleared, as Argo CD's application controller does.
    fn run_operations(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let Some(resource) = Self::resource(kube) else {
            return false;
        };
        let Some(revision) = self.synced.clone() else {
            return false;
        };
        let requested: Vec<Value> = kube
            .store()
            .list(&resource, "", &Selector::default(), &Selector::default())
            .into_iter()
            .filter(|a| a.get("operation").is_some_and(|o| !o.is_null()))
            .collect();
        let mut progress = false;
        for mut app in requested {
            let text = |p: &str| {
                app.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let (name, namespace) = (text("/metadata/name"), text("/metadata/namespace"));
            if let Some((rendered, at)) = self.pending.remove(&name) {
                // The sync applies what the branch asks for now; a refused CRD fails the
                // operation (below) while the rest of the wave is applied.
                let refused = self.apply_crds(&rendered).is_err();
                let digest = serde_json::to_string(&rendered.objects).unwrap_or_default();
                let images = images_of(&rendered.objects);
                self.digests.insert(name.clone(), digest);
                self.images.insert(name.clone(), images.clone());
                self.write(
                    kube, transcript, &resource, &rendered, &at, &images, "Healthy",
                );
                if !refused {
                    transcript.say(
                        "argocd",
                        format!(
                            "{name}: OutOfSync -> Synced at {} (sync requested), Healthy, images {}",
                            &at[..7.min(at.len())],
                            images.join(" ")
                        ),
                    );
                }
                match kube.store().get(&resource, &namespace, &name) {
                    Ok(fresh) => app = fresh,
                    Err(_) => continue,
                }
            }
            let operation = app["operation"].take();
            let now = kube.clock().rfc3339();
            let failure = self.refused.get(&name).cloned();
            if failure.is_some() {
                app["status"]["sync"]["status"] = json!("OutOfSync");
            }
            let mut result = json!({});
            for key in ["revision", "revisions"] {
                if let Some(v) = app.pointer(&format!("/status/sync/{key}")) {
                    result[key] = v.clone();
                }
            }
            // Argo CD reconciles the Application when an operation ends (Kargo trusts its
            // health only from a reconcile at or after `finishedAt`).
            app["status"]["reconciledAt"] = json!(now);
            app["status"]["operationState"] = match &failure {
                None => json!({
                    "operation": operation, "phase": "Succeeded",
                    "message": "successfully synced (all tasks run)",
                    "syncResult": result, "startedAt": now, "finishedAt": now}),
                Some(message) => json!({
                    "operation": operation, "phase": "Failed",
                    "message": format!("one or more objects failed to apply, reason: {message}"),
                    "startedAt": now, "finishedAt": now}),
            };
            if let Some(m) = app.as_object_mut() {
                m.remove("operation");
            }
            if kube
                .store()
                .update(
                    &resource,
                    &namespace,
                    &name,
                    app.clone(),
                    &identity(),
                    false,
                )
                .is_ok()
            {
                let by = operation
                    .pointer("/initiatedBy/username")
                    .and_then(Value::as_str)
                    .unwrap_or("someone");
                transcript.say(
                    "argocd",
                    match &failure {
                        None => format!(
                            "{name}: sync operation by {by}: Succeeded at {}",
                            &revision[..7]
                        ),
                        Some(message) => {
                            format!("{name}: sync operation by {by}: Failed: {message}")
                        }
                    },
                );
                progress = true;
            }
        }
        progress
    }

    /// Applies `app`'s CRDs to its destination as the API server would: refused when one
    /// leaves out a stored version, else each CRD's storage version joins its stored ones.
    fn apply_crds(&mut self, app: &RenderedApplication) -> Result<(), String> {
        // The resolved cluster, whether the Application names it by server or by name.
        let destination = app.cluster.server.clone();
        if let Some(message) = stored_version_refusal(&self.stored, &destination, &app.objects) {
            self.refused.insert(app.name.clone(), message.clone());
            return Err(message);
        }
        self.refused.remove(&app.name);
        for object in &app.objects {
            if let Some((name, info)) = gitops_loop::gate::crd::crd_info(object)
                && !info.storage.is_empty()
            {
                // In the order they became the storage version, as `status.storedVersions`.
                let stored = self.stored.entry((destination.clone(), name)).or_default();
                if !stored.contains(&info.storage) {
                    stored.push(info.storage);
                }
            }
        }
        Ok(())
    }

    /// A sync the API server refused: the Application stays OutOfSync, running what it ran,
    /// and its operation state says why.
    fn mark_sync_failed(
        &self,
        kube: &KubeDouble,
        transcript: &Transcript,
        resource: &Resource,
        app: &RenderedApplication,
        message: &str,
    ) {
        let now = kube.clock().rfc3339();
        let patched = kube.store().patch(
            resource,
            &app.namespace,
            &app.name,
            crate::kube::store::PatchBody::Merge(json!({"status": {
                "sync": {"status": "OutOfSync"},
                "reconciledAt": now,
                "operationState": {
                    "operation": {"sync": {}, "initiatedBy": {"automated": true}},
                    "phase": "Failed",
                    "message": format!("one or more objects failed to apply, reason: {message}"),
                    "startedAt": now, "finishedAt": now,
                },
            }})),
            &identity(),
            false,
        );
        if patched.is_ok() {
            transcript.say("argocd", format!("{}: sync failed: {message}", app.name));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        kube: &KubeDouble,
        transcript: &Transcript,
        resource: &Resource,
        app: &RenderedApplication,
        revision: &str,
        images: &[String],
        health: &str,
    ) {
        let manifest = &app.manifest;
        // [A pkg/apis/application/v1alpha1 SyncStatus]: the revision synced per source: a
        // Helm chart source's is its chart version, a git source's the commit.
        let per_source = |source: &Value| -> Value {
            if source.get("chart").is_some() {
                source.get("targetRevision").cloned().unwrap_or(json!(""))
            } else {
                json!(revision)
            }
        };
        let sync = match manifest.pointer("/spec/sources").and_then(Value::as_array) {
            Some(sources) => json!({"status": "Synced",
                "revisions": sources.iter().map(per_source).collect::<Vec<_>>()}),
            None => json!({"status": "Synced",
                "revision": manifest.pointer("/spec/source").map(per_source).unwrap_or(json!(revision))}),
        };
        let mut object = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {
                "name": app.name,
                "namespace": app.namespace,
                "labels": manifest.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
                "annotations": manifest.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
            },
            "spec": manifest.get("spec").cloned().unwrap_or(json!({})),
            "status": {
                "sync": sync,
                "health": {"status": health},
                "summary": {"images": images},
                "reconciledAt": kube.clock().rfc3339(),
                "sourceType": if app.sources.iter().any(|s| s.get("chart").is_some()) { "Helm" } else { "Directory" },
            },
        });
        let mut store = kube.store();
        match store.get(resource, &app.namespace, &app.name) {
            Ok(existing) => {
                object["metadata"]["resourceVersion"] = existing
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                // A requested operation and the last one's state outlive a re-render.
                if let Some(operation) = existing.get("operation").filter(|o| !o.is_null()) {
                    object["operation"] = operation.clone();
                }
                if let Some(state) = existing.pointer("/status/operationState") {
                    object["status"]["operationState"] = state.clone();
                }
                if let Err(e) = store.update(
                    resource,
                    &app.namespace,
                    &app.name,
                    object,
                    &identity(),
                    false,
                ) {
                    transcript.say(
                        "argocd",
                        format!("{}: cannot write the Application: {e}", app.name),
                    );
                }
            }
            Err(_) => {
                if let Err(e) = store.create(resource, &app.namespace, object, &identity()) {
                    transcript.say(
                        "argocd",
                        format!("{}: cannot write the Application: {e}", app.name),
                    );
                }
            }
        }
    }

    /// Forces a re-sync at the next tick (after a hold changes).
    pub fn resync(&mut self) {
        self.synced = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_come_from_pod_templates_sorted_and_unique() {
        // [A controller/cache/info.go populatePodInfo]: raw strings from containers and
        // initContainers of live Pods, sorted; nothing runs for a workload scaled to zero, a
        // CronJob runs Pods only while a Job of it runs (none here), a Rollout's Pods count.
        let objects = vec![
            json!({"kind": "Deployment", "spec": {"replicas": 2, "template": {"spec": {"initContainers": [{"image": "busybox"}], "containers": [{"image": "nginx:1.2"}, {"image": "app@sha256:abc"}]}}}}),
            json!({"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [{"image": "nginx:1.2"}]}}}}),
            json!({"kind": "Deployment", "spec": {"replicas": 0, "template": {"spec": {"containers": [{"image": "idle:1"}]}}}}),
            json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"image": "cron:2"}]}}}}}}),
            json!({"kind": "ConfigMap", "data": {"image": "not-a-pod"}}),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "spec": {"replicas": 3, "template": {"spec": {"containers": [{"image": "canary:3"}]}}}}),
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "spec": {"replicas": 0, "template": {"spec": {"containers": [{"image": "parked:1"}]}}}}),
        ];
        assert_eq!(
            images_of(&objects),
            vec!["app@sha256:abc", "busybox", "canary:3", "nginx:1.2"]
        );
    }
}

#[cfg(test)]
mod stored_versions {
    use super::*;

    fn crd(versions: &[(&str, bool, bool)]) -> std::sync::Arc<Value> {
        let versions: Vec<Value> = versions
            .iter()
            .map(|(name, served, storage)| {
                json!({"name": name, "served": served, "storage": storage,
                    "schema": {"openAPIV3Schema": {"type": "object"}}})
            })
            .collect();
        std::sync::Arc::new(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.test"},
            "spec": {"group": "example.test", "scope": "Namespaced",
                "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
                "versions": versions}
        }))
    }

    #[test]
    fn a_crd_that_leaves_out_a_stored_version_is_refused_on_its_destination_only() {
        let mut stored = BTreeMap::new();
        stored.insert(
            ("https://a".to_string(), "widgets.example.test".to_string()),
            vec!["v1beta1".to_string()],
        );
        let dropped = [crd(&[("v1", true, true)])];
        assert_eq!(
            stored_version_refusal(&stored, "https://a", &dropped).as_deref(),
            Some(
                "CustomResourceDefinition.apiextensions.k8s.io \"widgets.example.test\" is invalid: status.storedVersions[0]: Invalid value: \"v1beta1\": missing from spec.versions; v1beta1 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1beta1 and removes v1beta1 from status.storedVersions"
            )
        );
        assert_eq!(stored_version_refusal(&stored, "https://b", &dropped), None);
        let kept = [crd(&[("v1beta1", false, false), ("v1", true, true)])];
        assert_eq!(stored_version_refusal(&stored, "https://a", &kept), None);
    }
}

/// What the double renders with: the repository at `repo_dir`, the inventory, the chart
/// mirror, the pinned tools, a cache of its own, and nothing else (no chart pulls, no git
/// mirrors, no kustomize helm inflation). The ground wires it from a scenario; the oracle
/// (tests/real_argocd.rs) builds the same from each sample case and checks the double's
/// render against the one real Argo CD agreed with.
pub fn render_config(
    repo_dir: PathBuf,
    repo_url: String,
    inventory: gitops_loop::render::inventory::Inventory,
    charts_mirror: PathBuf,
    tools: &std::path::Path,
    cache: PathBuf,
) -> RenderConfig {
    let tool = |name: &'static str| gitops_loop::render::tools::Tool {
        name,
        path: tools.join(name),
        source: gitops_loop::render::tools::ToolSource::Flag,
        limits: Default::default(),
    };
    RenderConfig {
        repo_dir,
        repo_url: Some(repo_url),
        inventory,
        charts: Some(charts_mirror),
        git_mirrors: Vec::new(),
        helm: tool("helm"),
        kubectl: Some(tool("kubectl")),
        cache: gitops_loop::render::cache::RenderCache::at(cache),
        max_depth: gitops_loop::render::DEFAULT_MAX_DEPTH,
        jobs: 2,
        chart_pulls: Default::default(),
        chart_repo_mirrors: Vec::new(),
        kustomize_enable_helm: false,
        parsed: Default::default(),
    }
}
