//! Warehouses discovering chart versions and images, newest first under a constraint.

use super::*;

pub(super) fn normalize_constraint(constraint: &str) -> String {
    // Masterminds constraints separate comparators with spaces; the semver crate wants commas.
    let parts: Vec<&str> = constraint
        .split([' ', ','])
        .filter(|p| !p.is_empty())
        .collect();
    let mut joined = Vec::new();
    let mut pending_operator = String::new();
    for part in parts {
        if matches!(part, ">" | ">=" | "<" | "<=" | "=" | "!=" | "~" | "^") {
            pending_operator = part.to_string();
        } else {
            joined.push(format!("{pending_operator}{part}"));
            pending_operator.clear();
        }
    }
    joined.join(", ")
}

/// The newest version satisfying a constraint (all versions when it is empty).
pub fn newest_version(versions: &[String], constraint: &str) -> Option<String> {
    let requirement = if constraint.trim().is_empty() {
        None
    } else {
        semver::VersionReq::parse(&normalize_constraint(constraint)).ok()
    };
    versions
        .iter()
        .filter_map(|v| {
            semver::Version::parse(v.trim_start_matches('v'))
                .ok()
                .map(|parsed| (parsed, v.clone()))
        })
        .filter(|(parsed, _)| requirement.as_ref().is_none_or(|r| r.matches(parsed)))
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, original)| original)
}

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
            for subscription in warehouse
                .pointer("/spec/subscriptions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(chart) = subscription.get("chart") {
                    let (repo, chart_name) = (text(chart, "/repoURL"), text(chart, "/name"));
                    let versions = (self.chart_versions)(repo, chart_name);
                    if let Some(version) =
                        newest_version(&versions, text(chart, "/semverConstraint"))
                    {
                        found.push(format!("chart {chart_name} {version}"));
                        push(
                            &mut freight,
                            "charts",
                            json!({"repoURL": repo, "name": chart_name, "version": version}),
                        );
                    }
                } else if let Some(image) = subscription.get("image") {
                    let repo = text(image, "/repoURL");
                    let tags: Vec<(String, String)> =
                        self.registry.images.get(repo).cloned().unwrap_or_default();
                    let names: Vec<String> = tags.iter().map(|(t, _)| t.clone()).collect();
                    if let Some(tag) = newest_version(&names, text(image, "/constraint")) {
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
                }
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
