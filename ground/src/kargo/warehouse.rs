//! Warehouses discovering chart versions and images, newest first under a constraint.

use serde_json::{Map, Value, json};
use sha1::{Digest, Sha1};

use crate::kargo::freight::{freight_name, newest_requested};
use crate::kargo::promotion::push;
use crate::kargo::{GROUP, Kargo, VERSION, controller_user, hex, text};
use crate::kube::KubeDouble;
use crate::transcript::Transcript;

pub use super::constraint::newest_version;

impl Kargo {
    pub(super) fn discover(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        for warehouse in self.list(kube, "warehouses") {
            let name = text(&warehouse, "/metadata/name").to_string();
            let first_time = !self.seen_warehouses.contains(&name);
            if !first_time && !self.refresh.contains(&name) {
                continue;
            }
            self.seen_warehouses.push(name.clone());
            self.refresh.retain(|r| *r != name);
            let mut freight = json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Freight", "metadata": {"namespace": self.namespace, "generateName": "freight-"}, "origin": {"kind": "Warehouse", "name": name}});
            let mut found = Vec::new();
            // [K pkg/controller/warehouses/warehouses.go]: a subscription that cannot be read
            // (a constraint that does not parse) fails discovery; one that finds nothing
            // fails the Freight's build. Either way no Freight, and the Warehouse says why.
            let mut failure: Option<(&str, String)> = None;
            for subscription in warehouse
                .pointer("/spec/subscriptions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(chart) = subscription.get("chart") {
                    let (repo, chart_name) = (text(chart, "/repoURL"), text(chart, "/name"));
                    let versions = (self.chart_versions)(repo, chart_name);
                    match newest_version(&versions, text(chart, "/semverConstraint")) {
                        Ok(Some(version)) => {
                            found.push(format!("chart {chart_name} {version}"));
                            push(
                                &mut freight,
                                "charts",
                                json!({"repoURL": repo, "name": chart_name, "version": version}),
                            );
                        }
                        // (Kargo's message names the repository where the chart goes.)
                        Ok(None) => failure = failure.or(Some(("FreightBuildFailure", format!(
                            "failed to build Freight from latest artifacts: no versions discovered for chart {repo:?} from repository {chart_name:?}"
                        )))),
                        Err(e) => {
                            failure = Some(("DiscoveryFailed", format!(
                                "error discovering artifacts: error obtaining selector for chart versions from helm chart repo {repo:?}: {e}"
                            )));
                            break;
                        }
                    }
                } else if let Some(image) = subscription.get("image") {
                    let repo = text(image, "/repoURL");
                    let tags: Vec<(String, String)> =
                        self.registry.images.get(repo).cloned().unwrap_or_default();
                    let names: Vec<String> = tags.iter().map(|(t, _)| t.clone()).collect();
                    match newest_version(&names, text(image, "/constraint")) {
                        Ok(Some(tag)) => {
                            let digest = tags
                                .iter()
                                .find(|(t, _)| *t == tag)
                                .map(|(_, d)| d.clone())
                                .unwrap_or_default();
                            found.push(format!("image {repo}:{tag}"));
                            push(
                                &mut freight,
                                "images",
                                json!({"repoURL": repo, "tag": tag, "digest": digest}),
                            );
                        }
                        Ok(None) => failure = failure.or(Some(("FreightBuildFailure", format!(
                            "failed to build Freight from latest artifacts: no images discovered for repository {repo:?}"
                        )))),
                        Err(e) => {
                            failure = Some(("DiscoveryFailed", format!(
                                "error discovering artifacts: error obtaining selector for image {repo:?}: {e}"
                            )));
                            break;
                        }
                    }
                }
            }
            if let Some((reason, message)) = failure {
                self.warehouse_failed(kube, transcript, &name, reason, &message);
                continue;
            }
            if found.is_empty() {
                continue;
            }
            let resource = Self::resource(kube, "freights");
            let expected = freight_name(&freight);
            if kube
                .store()
                .get(&resource, &self.namespace, &expected)
                .is_ok()
            {
                continue;
            }
            match kube
                .store()
                .create(&resource, &self.namespace, freight, &controller_user())
            {
                Ok(created) => {
                    transcript.say(
                        "kargo",
                        format!(
                            "Warehouse {name} discovered {} -> Freight {} ({})",
                            found.join(", "),
                            text(&created, "/alias"),
                            &expected[..7]
                        ),
                    );
                    progress = true;
                }
                Err(e) => transcript.say(
                    "kargo",
                    format!("Warehouse {name}: could not create Freight: {e}"),
                ),
            }
        }
        progress
    }

    /// [K pkg/controller/warehouses/warehouses.go]: discovery or the Freight's build failed:
    /// the Warehouse is neither Healthy nor Ready, and says why.
    fn warehouse_failed(
        &self,
        kube: &KubeDouble,
        transcript: &Transcript,
        name: &str,
        reason: &str,
        message: &str,
    ) {
        let now = kube.clock().rfc3339();
        let (healthy, ready) = if reason == "DiscoveryFailed" {
            (
                (
                    "DiscoveryFailed",
                    format!("Unable to discover artifacts: {message}"),
                ),
                (
                    "DiscoveryFailure",
                    format!("Artifact discovery failed: {message}"),
                ),
            )
        } else {
            (
                ("FreightBuildFailure", message.to_string()),
                ("FreightBuildFailure", message.to_string()),
            )
        };
        let _ = Self::patch_status(
            kube,
            "warehouses",
            &self.namespace,
            name,
            json!({"conditions": [
                {"type": "Healthy", "status": "False", "reason": healthy.0, "message": healthy.1, "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": ready.0, "message": ready.1, "lastTransitionTime": now},
            ]}),
        );
        transcript.say("kargo", format!("Warehouse {name}: no Freight: {message}"));
    }

    /// The state before the run: each Warehouse's first discovery, and every Stage already at
    /// the newest Freight of its origins (as if promoted before the scenario starts).
    pub fn bootstrap(&mut self, kube: &KubeDouble, transcript: &Transcript) {
        self.discover(kube, transcript);
        let freights = self.list(kube, "freights");
        for stage in self.list(kube, "stages") {
            let stage_name = text(&stage, "/metadata/name").to_string();
            let mut items = Map::new();
            let mut names = Vec::new();
            for (origin, newest) in newest_requested(&stage, &freights) {
                items.insert(
                    format!("Warehouse/{origin}"),
                    self.freight_reference(kube, &newest),
                );
                let _ = Self::patch_status(
                    kube,
                    "freights",
                    &self.namespace,
                    &newest,
                    json!({"currentlyIn": {stage_name.clone(): {"since": kube.clock().rfc3339()}}}),
                );
                names.push(newest);
            }
            if items.is_empty() {
                continue;
            }
            names.sort();
            let id = hex(&Sha1::digest(names.join(",").as_bytes()));
            let _ = Self::patch_status(
                kube,
                "stages",
                &self.namespace,
                &stage_name,
                json!({"freightHistory": [{"id": id, "items": items}], "freightSummary": names.join(",")}),
            );
            let aliases: Vec<String> = freights
                .iter()
                .filter(|f| names.iter().any(|n| n == text(f, "/metadata/name")))
                .map(|f| text(f, "/alias").to_string())
                .collect();
            transcript.say(
                "kargo",
                format!(
                    "Stage {stage_name} starts at Freight {}",
                    aliases.join(", ")
                ),
            );
        }
    }
}
