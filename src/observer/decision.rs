//! The observer's decision, as a pure function of what the caches hold: is this Application
//! running a tag its Kargo Stage never promoted, which Freight matches, and may a Promotion be
//! created now? (The first seed, "How it works" 1-5, with Kargo's real behaviour where the
//! seed is silent.)

use std::collections::BTreeSet;

use serde_json::Value;

pub const AUTHORIZED_STAGE_ANNOTATION: &str = "kargo.akuity.io/authorized-stage";
pub const IGNORE_ANNOTATION: &str = "kargo-observer.kutlak.cc/ignore";
pub const OBSERVE_ANNOTATION: &str = "kargo-observer.kutlak.cc/observe";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "kargo-argocd-observer";
pub const STAGE_LABEL: &str = "kargo-observer.kutlak.cc/stage";
pub const FREIGHT_LABEL: &str = "kargo-observer.kutlak.cc/freight";
pub const KARGO_STAGE_LABEL: &str = "kargo.akuity.io/stage";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ObserveMode {
    /// Every Application with the authorized-stage annotation, unless it opts out.
    OptOut,
    /// Only Applications that also carry `kargo-observer.kutlak.cc/observe: "true"`.
    OptIn,
}

/// A container image as written: repository (normalised), tag and digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ImageRef {
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

/// Normalises a repository the way the container runtime resolves it: no registry means
/// docker.io, and a single-component path on docker.io means `library/`.
pub fn normalize_repository(repository: &str) -> String {
    let repository = repository.trim().trim_end_matches('/');
    let (registry, path) = match repository.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_lowercase(), rest.to_string())
        }
        _ => ("docker.io".to_string(), repository.to_string()),
    };
    let registry = if registry == "index.docker.io" || registry == "registry-1.docker.io" {
        "docker.io".to_string()
    } else {
        registry
    };
    let path = if registry == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    format!("{registry}/{path}")
}

/// Parses `repo:tag`, `repo@sha256:...`, `repo:tag@sha256:...` or a bare `repo`.
pub fn parse_image(image: &str) -> ImageRef {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest.to_string())),
        None => (image, None),
    };
    // A ':' after the last '/' separates the tag (a ':' before it is a registry port).
    let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (repository, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (
            &rest[..last_slash + i],
            Some(rest[last_slash + i + 1..].to_string()),
        ),
        None => (rest, None),
    };
    let tag = if tag.is_none() && digest.is_none() {
        Some("latest".to_string())
    } else {
        tag
    };
    ImageRef {
        repository: normalize_repository(repository),
        tag,
        digest,
    }
}

/// `<namespace>:<stage>` entries of the authorized-stage annotation (a comma-separated list
/// since Kargo v1.11). Entries with a glob are refused, as Kargo refuses them.
pub fn authorized_stages(value: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut stages = Vec::new();
    let mut refused = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once(':') {
            Some((ns, stage)) if !entry.contains('*') && !ns.is_empty() && !stage.is_empty() => {
                stages.push((ns.trim().to_string(), stage.trim().to_string()))
            }
            _ => refused.push(entry.to_string()),
        }
    }
    (stages, refused)
}

fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn annotation<'v>(object: &'v Value, key: &str) -> Option<&'v str> {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn label<'v>(object: &'v Value, key: &str) -> Option<&'v str> {
    object
        .pointer("/metadata/labels")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// Whether the observer looks at this Application at all, and the Stages it names.
pub fn observed_stages(
    app: &Value,
    mode: ObserveMode,
) -> Result<Vec<(String, String)>, &'static str> {
    let Some(value) = annotation(app, AUTHORIZED_STAGE_ANNOTATION) else {
        return Err("no authorized-stage annotation");
    };
    if annotation(app, IGNORE_ANNOTATION) == Some("true") {
        return Err("opted out with the ignore annotation");
    }
    if mode == ObserveMode::OptIn && annotation(app, OBSERVE_ANNOTATION) != Some("true") {
        return Err("not opted in (opt-in mode)");
    }
    let (stages, _) = authorized_stages(value);
    if stages.is_empty() {
        return Err("the authorized-stage annotation names no valid Stage");
    }
    Ok(stages)
}

/// Terminal Promotion phases; an empty phase (new Promotion) is not terminal.
pub fn is_terminal(phase: &str) -> bool {
    matches!(phase, "Succeeded" | "Failed" | "Errored" | "Aborted")
}

/// What the observer does for one (Application, Stage).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Deployed tags equal the Stage's current Freight: converged.
    NoDrift,
    /// Not drift yet: a rollout in progress, nothing running, or a Promotion in flight.
    Wait(String),
    /// Drift, and a Freight matches every drifted image: create a Promotion.
    Promote {
        freight: String,
        drifted: Vec<ImageRef>,
    },
    /// Drift, but no Freight holds the deployed images.
    FreightMissing { drifted: Vec<ImageRef> },
    /// Drift, but a Promotion of the matching Freight failed: not again until it is deleted.
    AlreadyFailed { freight: String, promotion: String },
    /// The Stage, or what it subscribes to, cannot be read.
    Skip(String),
}

/// Everything one decision reads.
pub struct Inputs<'a> {
    pub app: &'a Value,
    pub stage: &'a Value,
    /// Warehouses in the Stage's namespace.
    pub warehouses: &'a [Value],
    /// Freight in the Stage's namespace.
    pub freights: &'a [Value],
    /// Promotions of the Stage (any creator).
    pub promotions: &'a [Value],
}

/// Image repositories each of the Stage's origin Warehouses subscribes to (normalised), by
/// origin name, in name order.
fn subscribed_repositories(stage: &Value, warehouses: &[Value]) -> Vec<(String, BTreeSet<String>)> {
    let origins: BTreeSet<&str> = stage
        .pointer("/spec/requestedFreight")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| text(r, "/origin/kind") == "Warehouse")
        .map(|r| text(r, "/origin/name"))
        .collect();
    origins
        .into_iter()
        .map(|origin| {
            let repositories = warehouses
                .iter()
                .filter(|w| text(w, "/metadata/name") == origin)
                .flat_map(|w| {
                    w.pointer("/spec/subscriptions")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|s| {
                    s.pointer("/image/repoURL")
                        .and_then(Value::as_str)
                        .map(normalize_repository)
                })
                .collect();
            (origin.to_string(), repositories)
        })
        .filter(|(_, repositories): &(String, BTreeSet<String>)| !repositories.is_empty())
        .collect()
}

/// The images of the Stage's current Freight collection (`freightHistory[0]`).
fn current_images(stage: &Value) -> Vec<ImageRef> {
    stage
        .pointer("/status/freightHistory/0/items")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|items| items.values())
        .flat_map(|f| {
            f.get("images")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .map(|i| ImageRef {
            repository: normalize_repository(text(&i, "/repoURL")),
            tag: Some(text(&i, "/tag").to_string()).filter(|t| !t.is_empty()),
            digest: Some(text(&i, "/digest").to_string()).filter(|d| !d.is_empty()),
        })
        .collect()
}

/// Does a Freight image satisfy a deployed image? By digest when deployed by digest.
fn satisfies(freight_image: &Value, deployed: &ImageRef) -> bool {
    if normalize_repository(text(freight_image, "/repoURL")) != deployed.repository {
        return false;
    }
    match (&deployed.digest, &deployed.tag) {
        (Some(digest), _) => text(freight_image, "/digest") == digest,
        (None, Some(tag)) => text(freight_image, "/tag") == tag,
        (None, None) => false,
    }
}

fn same_version(current: &ImageRef, deployed: &ImageRef) -> bool {
    match &deployed.digest {
        Some(digest) => current.digest.as_ref() == Some(digest),
        None => current.tag == deployed.tag,
    }
}

pub fn decide(inputs: &Inputs) -> Decision {
    let stage_name = text(inputs.stage, "/metadata/name");
    let origins = subscribed_repositories(inputs.stage, inputs.warehouses);
    if origins.is_empty() {
        return Decision::Skip(format!(
            "Stage {stage_name} subscribes to no image repositories"
        ));
    }
    let deployed: Vec<ImageRef> = inputs
        .app
        .pointer("/status/summary/images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(parse_image)
        .collect();
    if deployed.is_empty() {
        return Decision::Wait("no images are running (scaled to zero?)".to_string());
    }
    let current = current_images(inputs.stage);
    // Drift per origin: the subscribed repositories whose single running version differs.
    let mut drift_by_origin: Vec<(String, Vec<ImageRef>)> = Vec::new();
    for (origin, repositories) in &origins {
        let mut drifted = Vec::new();
        for repository in repositories {
            let running: BTreeSet<&ImageRef> = deployed
                .iter()
                .filter(|i| &i.repository == repository)
                .collect();
            if running.len() > 1 {
                return Decision::Wait(format!(
                    "{repository} runs {} versions at once (a rollout in progress)",
                    running.len()
                ));
            }
            let Some(running) = running.into_iter().next() else {
                continue;
            };
            if !current
                .iter()
                .any(|c| c.repository == *repository && same_version(c, running))
            {
                drifted.push(running.clone());
            }
        }
        if !drifted.is_empty() {
            drift_by_origin.push((origin.clone(), drifted));
        }
    }
    if drift_by_origin.is_empty() {
        return Decision::NoDrift;
    }
    // In flight: any non-terminal Promotion of the Stage (an empty phase counts).
    if let Some(in_flight) = inputs
        .promotions
        .iter()
        .find(|p| !is_terminal(text(p, "/status/phase")))
    {
        return Decision::Wait(format!(
            "Promotion {} is in flight",
            text(in_flight, "/metadata/name")
        ));
    }
    // Kargo records a finished Promotion on the Promotion first and on the Stage after: until
    // the Stage's lastPromotion names the newest finished one, its history may be stale.
    let newest_finished = inputs
        .promotions
        .iter()
        .filter(|p| is_terminal(text(p, "/status/phase")))
        .max_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")));
    if let Some(finished) = newest_finished {
        let recorded = text(inputs.stage, "/status/lastPromotion/name");
        if recorded != text(finished, "/metadata/name") {
            return Decision::Wait(format!(
                "Kargo has not recorded Promotion {} on the Stage yet",
                text(finished, "/metadata/name")
            ));
        }
    }
    // One Promotion per reconcile: the first origin (by name) with a matching Freight.
    for (origin, drifted) in &drift_by_origin {
        let mut candidates: Vec<&Value> = inputs
            .freights
            .iter()
            .filter(|f| text(f, "/origin/name") == origin)
            .filter(|f| {
                let images = f
                    .get("images")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                drifted
                    .iter()
                    .all(|d| images.iter().any(|i| satisfies(i, d)))
            })
            .collect();
        // The newest match wins.
        candidates.sort_by_key(|f| {
            text(f, "/metadata/resourceVersion")
                .parse::<u64>()
                .unwrap_or(0)
        });
        let Some(freight) = candidates.last() else {
            continue;
        };
        let freight_name = text(freight, "/metadata/name").to_string();
        if let Some(failed) = inputs.promotions.iter().find(|p| {
            text(p, "/spec/freight") == freight_name
                && label(p, MANAGED_BY_LABEL) == Some(MANAGED_BY)
                && is_terminal(text(p, "/status/phase"))
                && text(p, "/status/phase") != "Succeeded"
        }) {
            return Decision::AlreadyFailed {
                freight: freight_name,
                promotion: text(failed, "/metadata/name").to_string(),
            };
        }
        return Decision::Promote {
            freight: freight_name,
            drifted: drifted.clone(),
        };
    }
    Decision::FreightMissing {
        drifted: drift_by_origin.into_iter().flat_map(|(_, d)| d).collect(),
    }
}

/// The Promotion the observer creates for `stage` (the Stage object as the API server returned
/// it). Kargo's mutating webhook replaces the name and (re)fills the steps and vars from the
/// Stage (`pkg/webhook/kubernetes/promotion/webhook.go` at v1.11.2); the observer fills them the
/// same way, because the Promotion CRD requires `spec.steps` and an API server without Kargo's
/// webhook refuses a Promotion without them (with the webhook, its copy replaces ours). Steps
/// that name a PromotionTask (`task:`) are copied as written: Kargo's webhook inflates them, and
/// an API server without it refuses them (the CRD allows `task` only where `uses` is absent, so
/// the refusal names the step). A Stage whose
/// promotion template has no steps gets no Promotion: Kargo's webhook refuses it too, saying the
/// Stage "defines no promotion steps"; the error says the same.
pub fn promotion_for(namespace: &str, stage: &Value, freight: &str) -> Result<Value, String> {
    let name = stage
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let steps = stage
        .pointer("/spec/promotionTemplate/spec/steps")
        .and_then(Value::as_array)
        .filter(|steps| !steps.is_empty())
        .ok_or_else(|| {
            format!("Stage {name:?} in namespace {namespace:?} defines no promotion steps")
        })?;
    // Stage-level vars first, then the template's, as the webhook appends them.
    let vars: Vec<Value> = [
        stage.pointer("/spec/vars"),
        stage.pointer("/spec/promotionTemplate/spec/vars"),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_array)
    .flatten()
    .cloned()
    .collect();
    let mut spec = serde_json::json!({"stage": name, "freight": freight, "steps": steps});
    if !vars.is_empty() {
        spec["vars"] = Value::Array(vars);
    }
    Ok(serde_json::json!({
        "apiVersion": "kargo.akuity.io/v1alpha1",
        "kind": "Promotion",
        "metadata": {
            "generateName": format!("{name}-observer-"),
            "namespace": namespace,
            "labels": {
                MANAGED_BY_LABEL: MANAGED_BY,
                STAGE_LABEL: name,
                FREIGHT_LABEL: freight,
            },
        },
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn images_normalise_like_the_runtime() {
        assert_eq!(
            parse_image("nginx"),
            ImageRef {
                repository: "docker.io/library/nginx".into(),
                tag: Some("latest".into()),
                digest: None
            }
        );
        assert_eq!(
            parse_image("docker.io/library/nginx:1.2").repository,
            parse_image("nginx:1.2").repository
        );
        assert_eq!(
            parse_image("localhost:5000/app:v1"),
            ImageRef {
                repository: "localhost:5000/app".into(),
                tag: Some("v1".into()),
                digest: None
            }
        );
        assert_eq!(
            parse_image("ghcr.io/x/app@sha256:abc").digest.as_deref(),
            Some("sha256:abc")
        );
        assert_eq!(parse_image("ghcr.io/x/app@sha256:abc").tag, None);
    }

    #[test]
    fn authorized_stage_lists_and_globs() {
        let (stages, refused) = authorized_stages("kargo-demo:prod, team:web ,bad,*:x");
        assert_eq!(
            stages,
            vec![
                ("kargo-demo".into(), "prod".into()),
                ("team".into(), "web".into())
            ]
        );
        assert_eq!(refused, vec!["bad".to_string(), "*:x".to_string()]);
    }

    #[test]
    fn annotations_and_modes_decide_what_is_observed() {
        let app = |annotations: Value| json!({"metadata": {"annotations": annotations}});
        assert!(observed_stages(&app(json!({})), ObserveMode::OptOut).is_err());
        assert!(
            observed_stages(
                &app(json!({AUTHORIZED_STAGE_ANNOTATION: "p:s"})),
                ObserveMode::OptOut
            )
            .is_ok()
        );
        assert!(
            observed_stages(
                &app(json!({AUTHORIZED_STAGE_ANNOTATION: "p:s", IGNORE_ANNOTATION: "true"})),
                ObserveMode::OptOut
            )
            .is_err()
        );
        assert!(
            observed_stages(
                &app(json!({AUTHORIZED_STAGE_ANNOTATION: "p:s"})),
                ObserveMode::OptIn
            )
            .is_err()
        );
        assert!(
            observed_stages(
                &app(json!({AUTHORIZED_STAGE_ANNOTATION: "p:s", OBSERVE_ANNOTATION: "true"})),
                ObserveMode::OptIn
            )
            .is_ok()
        );
    }
}
