//! Kargo behaviour, as the reference sheet describes Kargo v1.11: the Freight and Promotion
//! webhooks (content-hash Freight names; Promotion names replaced, steps copied from the
//! Stage, the `promote` verb checked, Freight availability), Warehouses discovering chart
//! versions and images, promotions running their steps for real (git, the forge's REST API,
//! HTTP), Stage status (`freightHistory[0]`, `currentPromotion`, `lastPromotion`), auto-
//! promotion with the v1.11 hold/resume annotations, and verification against Argo CD.
//!
//! The actor advances in explicit ticks driven by the ground, so a run is deterministic.

pub mod expr;
pub mod schemas;
pub mod steps;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use sha1::{Digest, Sha1};

use crate::kube::KubeDouble;
use crate::kube::store::{Admission, ApiError, Operation, Resource, Selector, User};
use crate::transcript::Transcript;

pub const GROUP: &str = "kargo.akuity.io";
pub const VERSION: &str = "v1alpha1";
pub const PROJECT_LABEL: &str = "kargo.akuity.io/project";
pub const STAGE_LABEL: &str = "kargo.akuity.io/stage";
pub const ALIAS_LABEL: &str = "kargo.akuity.io/alias";
pub const CREATE_ACTOR_ANNOTATION: &str = "kargo.akuity.io/create-actor";
pub const HOLD_ANNOTATION: &str = "kargo.akuity.io/auto-promotion-hold";
pub const RESUME_ANNOTATION: &str = "kargo.akuity.io/auto-promotion-resume";
/// Stands in for a ProjectConfig promotion policy with `autoPromotionEnabled` for the Stage.
pub const AUTO_PROMOTION_ANNOTATION: &str = "ground.gitops-loop.dev/auto-promotion";
/// Kargo's controller identity (never subject to the `promote` check).
pub const CONTROLLER: &str = "system:serviceaccount:kargo:kargo-controller";

/// Who may `promote` to which Stages: (user, namespace, stage or `*`).
#[derive(Debug, Clone, Default)]
pub struct Grants {
    entries: Arc<Mutex<Vec<(String, String, String)>>>,
}

impl Grants {
    pub fn allow(&self, user: &str, namespace: &str, stage: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((user.into(), namespace.into(), stage.into()));
    }

    pub fn allows(&self, user: &User, namespace: &str, stage: &str) -> bool {
        user.name == CONTROLLER
            || self
                .entries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|(u, n, s)| {
                    (u == &user.name || user.groups.contains(u))
                        && n == namespace
                        && (s == "*" || s == stage)
                })
    }
}

pub fn controller_user() -> User {
    User {
        name: CONTROLLER.into(),
        groups: vec!["system:serviceaccounts".into()],
    }
}

fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Kargo's Freight name: SHA-1 of `<origin>:<sorted artifact parts joined by |>`.
/// [K pkg/api/freight.go]
pub fn freight_name(freight: &Value) -> String {
    let origin = format!(
        "{}/{}",
        text(freight, "/origin/kind"),
        text(freight, "/origin/name")
    );
    let mut parts = Vec::new();
    for commit in freight
        .get("commits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let url = text(commit, "/repoURL")
            .trim_end_matches('/')
            .to_lowercase();
        let tag = text(commit, "/tag");
        parts.push(if tag.is_empty() {
            format!("{url}:{}", text(commit, "/id"))
        } else {
            format!("{url}:{tag}:{}", text(commit, "/id"))
        });
    }
    for image in freight
        .get("images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(format!(
            "{}:{}@{}",
            text(image, "/repoURL"),
            text(image, "/tag"),
            text(image, "/digest")
        ));
    }
    for chart in freight
        .get("charts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(format!(
            "{}/{}:{}",
            text(chart, "/repoURL").trim_end_matches('/').to_lowercase(),
            text(chart, "/name"),
            text(chart, "/version")
        ));
    }
    parts.sort();
    hex(&Sha1::digest(
        format!("{origin}:{}", parts.join("|")).as_bytes(),
    ))
}

/// A readable alias from a name, as Kargo's moniker generator gives one.
pub fn alias_for(name: &str) -> String {
    const ADJECTIVES: [&str; 16] = [
        "brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "lively", "nimble",
        "proud", "quiet", "rapid", "sunny", "tidy", "witty",
    ];
    const ANIMALS: [&str; 16] = [
        "otter", "heron", "lynx", "badger", "falcon", "marten", "ibex", "puffin", "gecko", "koala",
        "mole", "newt", "owl", "panda", "quail", "robin",
    ];
    let bytes = name.as_bytes();
    let a = bytes.first().copied().unwrap_or(0) as usize % ADJECTIVES.len();
    let b = bytes.get(1).copied().unwrap_or(0) as usize % ANIMALS.len();
    format!("{}-{}", ADJECTIVES[a], ANIMALS[b])
}

/// The label value Kargo uses for a Stage name (hash-shortened past 63 characters).
pub fn stage_label_value(stage: &str) -> String {
    if stage.len() <= 63 {
        return stage.to_string();
    }
    let digest = hex(&Sha1::digest(stage.as_bytes()));
    format!("{}-{}", &stage[..50], &digest[..12])
}

/// Is `freight` available to `stage` (origin requested, and direct, approved, or verified
/// upstream)? [K api/v1alpha1/stage_types.go IsFreightAvailable]
pub fn freight_available(stage: &Value, freight: &Value) -> bool {
    let stage_name = text(stage, "/metadata/name");
    let origin_name = text(freight, "/origin/name");
    stage
        .pointer("/spec/requestedFreight")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|request| {
            if text(request, "/origin/name") != origin_name {
                return false;
            }
            let approved = freight
                .pointer(&format!("/status/approvedFor/{stage_name}"))
                .is_some();
            let direct = request
                .pointer("/sources/direct")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let upstreams: Vec<&str> = request
                .pointer("/sources/stages")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let all = request
                .pointer("/sources/availabilityStrategy")
                .and_then(Value::as_str)
                == Some("All");
            let verified = |s: &&str| {
                freight
                    .pointer(&format!("/status/verifiedIn/{s}"))
                    .is_some()
            };
            let upstream_ok = !upstreams.is_empty()
                && if all {
                    upstreams.iter().all(verified)
                } else {
                    upstreams.iter().any(verified)
                };
            approved || direct || upstream_ok
        })
}

/// Registers Kargo's admission webhooks on the API double.
pub fn install_webhooks(kube: &KubeDouble, grants: Grants) {
    let mut store = kube.store();
    store.add_hook(GROUP, "freights", Arc::new(freight_webhook));
    store.add_hook(GROUP, "warehouses", Arc::new(warehouse_webhook));
    let promotion_grants = grants.clone();
    let ulids = Arc::new(std::sync::atomic::AtomicU64::new(0));
    store.add_hook(
        GROUP,
        "promotions",
        Arc::new(move |admission: &mut Admission| {
            promotion_webhook(admission, &promotion_grants, &ulids)
        }),
    );
}

/// ULIDs from a fixed clock that ticks one second per Promotion: Kargo's name format and
/// ordering, without a run's wall-clock time in the names (transcripts repeat).
fn next_ulid(counter: &std::sync::atomic::AtomicU64) -> String {
    let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    let milliseconds = 1_767_225_600_000 + n * 1000;
    ulid::Ulid::from_parts(milliseconds, u128::from(n))
        .to_string()
        .to_lowercase()
}

/// [K pkg/webhook/kubernetes/warehouse/webhook.go, pkg/subscription/chart.go]: a chart
/// subscription from an `oci://` repository names no chart (the URL does), one from an
/// http(s) repository must name it; either mistake is Invalid.
fn warehouse_webhook(admission: &mut Admission) -> Result<(), ApiError> {
    if matches!(admission.operation, Operation::Delete) {
        return Ok(());
    }
    let name = text(admission.object, "/metadata/name").to_string();
    let mut errors = Vec::new();
    for (i, sub) in admission
        .object
        .pointer("/spec/subscriptions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(chart) = sub.get("chart") else {
            continue;
        };
        let (repo, chart_name) = (text(chart, "/repoURL"), text(chart, "/name"));
        let field = format!("spec.subscriptions[{i}].chart.name");
        if repo.starts_with("oci://") && !chart_name.is_empty() {
            errors.push(format!(
                "{field}: Invalid value: \"{chart_name}\": must be empty if repoURL starts with oci://"
            ));
        }
        if (repo.starts_with("http://") || repo.starts_with("https://")) && chart_name.is_empty() {
            errors.push(format!(
                "{field}: Invalid value: \"\": must be non-empty if repoURL starts with http:// or https://"
            ));
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        422,
        "Invalid",
        format!(
            "admission webhook \"warehouse.kargo.akuity.io\" denied the request: Warehouse.kargo.akuity.io \"{name}\" is invalid: [{}]",
            errors.join(", ")
        ),
    ))
}

fn freight_webhook(admission: &mut Admission) -> Result<(), ApiError> {
    match admission.operation {
        Operation::Create => {
            // The name is a content hash, whatever the client asked for. [K pkg/webhook/kubernetes/freight]
            let name = freight_name(admission.object);
            admission.object["metadata"]["name"] = json!(name);
            let mut alias = admission
                .object
                .get("alias")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if alias.is_empty() {
                alias = text(
                    admission.object,
                    &format!("/metadata/labels/{}", ALIAS_LABEL.replace('/', "~1")),
                )
                .to_string();
            }
            if alias.is_empty() {
                alias = alias_for(&name);
            }
            admission.object["alias"] = json!(alias);
            admission.object["metadata"]["labels"][ALIAS_LABEL] = json!(alias);
            Ok(())
        }
        Operation::Update => {
            let old = admission.old.cloned().unwrap_or(Value::Null);
            for field in ["origin", "images", "charts", "commits", "artifacts"] {
                if old.get(field) != admission.object.get(field) {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "Freight \"{}\" is invalid: {field}: Invalid value: Freight artifacts are immutable",
                            text(&old, "/metadata/name")
                        ),
                    ));
                }
            }
            Ok(())
        }
        Operation::Delete => Ok(()),
    }
}

fn promotion_webhook(
    admission: &mut Admission,
    grants: &Grants,
    ulids: &std::sync::atomic::AtomicU64,
) -> Result<(), ApiError> {
    let namespace = text(admission.object, "/metadata/namespace").to_string();
    let stage_name = text(admission.object, "/spec/stage").to_string();
    let denied = |code: u16, reason: &str, message: String| {
        ApiError::new(
            code,
            reason,
            format!(
                "admission webhook \"promotion.kargo.akuity.io\" denied the request: {message}"
            ),
        )
    };
    // [K pkg/webhook/kubernetes/promotion/webhook.go authorize]: the promote verb is checked
    // for create, update and delete; a subject without it gets a Forbidden that the validating
    // webhook wraps in an internal error (HTTP 500, reason InternalError).
    let unauthorized = |name: &str, action: &str| {
        denied(
            500,
            "InternalError",
            format!(
                "Internal error occurred: promotions.kargo.akuity.io \"{name}\" is forbidden: subject \"{}\" is not permitted to {action} Promotions for Stage \"{stage_name}\"",
                admission.user.name
            ),
        )
    };
    let invalid = |name: &str, field: &str, value: &str, why: String| {
        denied(
            422,
            "Invalid",
            format!(
                "Promotion.kargo.akuity.io \"{name}\" is invalid: {field}: Invalid value: \"{value}\": {why}"
            ),
        )
    };
    let current_name = text(admission.object, "/metadata/name").to_string();
    match admission.operation {
        Operation::Delete => {
            if !grants.allows(admission.user, &namespace, &stage_name) {
                return Err(unauthorized(&current_name, "delete"));
            }
            Ok(())
        }
        Operation::Update => {
            if !grants.allows(admission.user, &namespace, &stage_name) {
                return Err(unauthorized(&current_name, "update"));
            }
            let old = admission.old.cloned().unwrap_or(Value::Null);
            if old.get("spec") != admission.object.get("spec") {
                return Err(invalid(
                    &current_name,
                    "spec",
                    "…",
                    "spec is immutable".into(),
                ));
            }
            Ok(())
        }
        Operation::Create => {
            let project = admission
                .store
                .get("", "namespaces", "", &namespace)
                .cloned()
                .unwrap_or(Value::Null);
            if text(
                &project,
                &format!("/metadata/labels/{}", PROJECT_LABEL.replace('/', "~1")),
            ) != "true"
            {
                return Err(invalid(
                    &current_name,
                    "metadata.namespace",
                    &namespace,
                    format!("namespace {namespace:?} is not a Kargo Project namespace"),
                ));
            }
            // [K webhook.go Default]: a missing Stage is Invalid, before anything else.
            let stage = admission
                .store
                .get(GROUP, "stages", &namespace, &stage_name)
                .cloned()
                .ok_or_else(|| {
                    invalid(
                        &current_name,
                        "spec.stage",
                        &stage_name,
                        format!(
                            "could not find Stage \"{stage_name}\" in namespace \"{namespace}\""
                        ),
                    )
                })?;
            let freight_name = text(admission.object, "/spec/freight").to_string();
            // The name is replaced: <stage>.<ulid>.<first 7 of the freight>. [K pkg/api/promotion.go]
            let name = format!(
                "{stage_name}.{}.{}",
                next_ulid(ulids),
                &freight_name[..freight_name.len().min(7)]
            );
            // [K webhook.go ValidateCreate]: authorization, then the Freight's availability.
            if !grants.allows(admission.user, &namespace, &stage_name) {
                return Err(unauthorized(&name, "create"));
            }
            let template_steps = stage
                .pointer("/spec/promotionTemplate/spec/steps")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if template_steps.is_empty() {
                return Err(invalid(
                    &name,
                    "spec.stage",
                    &stage_name,
                    "a control-flow Stage (no promotion steps) cannot be promoted to".into(),
                ));
            }
            // A missing Freight is not available either: Invalid, as Kargo answers it.
            let freight = admission
                .store
                .get(GROUP, "freights", &namespace, &freight_name)
                .cloned()
                .unwrap_or(Value::Null);
            if freight.is_null() || !freight_available(&stage, &freight) {
                return Err(invalid(
                    &name,
                    "spec.freight",
                    &freight_name,
                    "Freight is not available to this Stage".into(),
                ));
            }
            let object = &mut *admission.object;
            object["metadata"]["name"] = json!(name);
            if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("generateName");
            }
            object["metadata"]["labels"][STAGE_LABEL] = json!(stage_label_value(&stage_name));
            object["metadata"]["annotations"][STAGE_LABEL] = json!(stage_name);
            object["spec"]["steps"] = json!(template_steps);
            let mut vars: Vec<Value> = stage
                .pointer("/spec/vars")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            vars.extend(
                stage
                    .pointer("/spec/promotionTemplate/spec/vars")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
            object["spec"]["vars"] = json!(vars);
            if let Some(annotations) = object
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
            {
                annotations.remove(HOLD_ANNOTATION);
                annotations.remove(RESUME_ANNOTATION);
            }
            if admission.user.name != CONTROLLER {
                object["metadata"]["annotations"][CREATE_ACTOR_ANNOTATION] =
                    json!(format!("kubernetes:{}", admission.user.name));
                // v1.11: a user-made Promotion on an auto-promoting Stage holds auto-promotion
                // for the origin unless it promotes the newest Freight, which resumes it.
                let by_policy = admission
                    .store
                    .get(GROUP, "projectconfigs", &namespace, &namespace)
                    .and_then(|c| c.pointer("/spec/promotionPolicies"))
                    .and_then(Value::as_array)
                    .is_some_and(|policies| auto_promotion_by_policy(policies, &stage));
                if by_policy
                    || text(
                        &stage,
                        &format!(
                            "/metadata/annotations/{}",
                            AUTO_PROMOTION_ANNOTATION.replace('/', "~1")
                        ),
                    ) == "true"
                {
                    let origin = format!("Warehouse/{}", text(&freight, "/origin/name"));
                    let newest = newest_freight(
                        admission.store.list(GROUP, "freights", &namespace),
                        text(&freight, "/origin/name"),
                    );
                    let key = if newest.as_deref() == Some(freight_name.as_str()) {
                        RESUME_ANNOTATION
                    } else {
                        HOLD_ANNOTATION
                    };
                    object["metadata"]["annotations"][key] = json!(origin);
                }
            }
            object["metadata"]["ownerReferences"] = json!([{
                "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Stage", "name": stage_name,
                "uid": text(&stage, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true,
            }]);
            Ok(())
        }
    }
}

/// The newest Freight of an origin (by creation order).
fn newest_freight(freights: Vec<&Value>, origin: &str) -> Option<String> {
    freights
        .into_iter()
        .filter(|f| text(f, "/origin/name") == origin)
        .max_by_key(|f| {
            text(f, "/metadata/resourceVersion")
                .parse::<u64>()
                .unwrap_or(0)
        })
        .map(|f| text(f, "/metadata/name").to_string())
}

/// Scripted image tags for Warehouses with image subscriptions.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// repoURL -> [(tag, digest)], in discovery order.
    pub images: BTreeMap<String, Vec<(String, String)>>,
}

/// The versions a chart repository lists: (repoURL, chart) -> versions.
pub type ChartVersions = Box<dyn Fn(&str, &str) -> Vec<String> + Send + Sync>;

/// What a promotion being executed remembers between ticks.
#[derive(Debug, Default)]
struct Run {
    step: usize,
    outputs: Map<String, Value>,
    workdir: Option<PathBuf>,
    waiting_said: bool,
    /// Argo CD Applications an `argocd-update` step named: verified after success.
    apps: Vec<(String, String)>,
    /// What argocd-update's `sources[].desiredRevision` asks each Application to run:
    /// (namespace, application, repoURL, chart, revision).
    desired: Vec<(String, String, String, String, String)>,
    /// Each step run so far: (alias, Succeeded / Skipped / Failed / Errored), for `status()`.
    statuses: Vec<(String, String)>,
    /// Consecutive errors of the current step (against its `retry.errorThreshold`).
    errors: u32,
    /// When the current step first waited or errored: (step index, instant), for
    /// `retry.timeout`.
    started: Option<(usize, std::time::Instant)>,
    /// The worst step failure so far: (phase, message). Kargo runs on (steps with an `if:`
    /// may still run), and the Promotion ends with this phase.
    failure: Option<(String, String)>,
}

/// A Stage waiting for its Applications after a successful promotion.
#[derive(Debug, Clone)]
struct Verification {
    stage: String,
    freight: String,
    apps: Vec<(String, String)>,
    desired: Vec<(String, String, String, String, String)>,
    /// The AnalysisRun started for the Stage's `verification`, once the Applications are
    /// healthy.
    analysis_run: Option<String>,
}

/// The Kargo actor.
pub struct Kargo {
    pub namespace: String,
    pub grants: Grants,
    pub registry: Registry,
    /// The chart repositories Warehouses read (by the URL the subscription writes).
    pub chart_versions: ChartVersions,
    /// repoURL as written -> (forge slug, git URL).
    pub git_repos: BTreeMap<String, (String, String)>,
    pub forge_url: String,
    pub forge_token: String,
    pub workdir: PathBuf,
    refresh: Vec<String>,
    seen_warehouses: Vec<String>,
    runs: BTreeMap<String, Run>,
    verifications: Vec<Verification>,
    /// Pending Promotions already said to wait for a verification (said once each).
    held_for_verification: std::collections::BTreeSet<String>,
    /// ULIDs for AnalysisRun names (the same fixed clock as Promotions').
    ulids: std::sync::atomic::AtomicU64,
    /// Stages whose promotions fail at the first step (a scenario's fault).
    pub failing_stages: Vec<String>,
    /// URL prefixes the `http` step rewrites to loopback servers (written -> actual).
    pub http_aliases: BTreeMap<String, String>,
    /// Secrets of the Project namespace the `secret()` expression function reads: name ->
    /// decoded data.
    pub secrets: serde_json::Map<String, Value>,
}

fn normalize_constraint(constraint: &str) -> String {
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
    pub fn new(namespace: &str, workdir: &Path, forge_url: &str, forge_token: &str) -> Kargo {
        Kargo {
            namespace: namespace.to_string(),
            grants: Grants::default(),
            registry: Registry::default(),
            chart_versions: Box::new(|_, _| Vec::new()),
            git_repos: BTreeMap::new(),
            forge_url: forge_url.to_string(),
            forge_token: forge_token.to_string(),
            workdir: workdir.to_path_buf(),
            refresh: Vec::new(),
            seen_warehouses: Vec::new(),
            runs: BTreeMap::new(),
            verifications: Vec::new(),
            held_for_verification: Default::default(),
            ulids: std::sync::atomic::AtomicU64::new(1000),
            failing_stages: Vec::new(),
            http_aliases: BTreeMap::new(),
            secrets: serde_json::Map::new(),
        }
    }

    /// Asks a Warehouse to discover now (the `kargo.akuity.io/refresh` annotation).
    pub fn refresh(&mut self, warehouse: &str) {
        self.refresh.push(warehouse.to_string());
    }

    fn resource(kube: &KubeDouble, plural: &str) -> Resource {
        kube.store()
            .resource(GROUP, VERSION, plural)
            .cloned()
            .unwrap_or_else(|| Resource::builtin(GROUP, VERSION, plural, plural, true))
    }

    /// Reads one object (the resource is resolved before the store is locked: the lock is
    /// not reentrant).
    fn get(
        kube: &KubeDouble,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let resource = Self::resource(kube, plural);
        kube.store().get(&resource, namespace, name)
    }

    fn list(&self, kube: &KubeDouble, plural: &str) -> Vec<Value> {
        let resource = Self::resource(kube, plural);
        kube.store().list(
            &resource,
            &self.namespace,
            &Selector::default(),
            &Selector::default(),
        )
    }

    /// One step of the actor. Returns true when anything changed.
    pub async fn tick(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        progress |= self.discover(kube, transcript);
        progress |= self.auto_promote(kube, transcript);
        progress |= self.promote(kube, transcript).await;
        progress |= self.verify(kube, transcript);
        progress
    }

    fn discover(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
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

    fn auto_promote(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        let freights = self.list(kube, "freights");
        let promotions = self.list(kube, "promotions");
        // [K api/v1alpha1/projectconfig_types.go]: the ProjectConfig named as the Project
        // lists the Stages that promote by themselves.
        let policies: Vec<Value> = self
            .list(kube, "projectconfigs")
            .into_iter()
            .filter(|c| text(c, "/metadata/name") == self.namespace)
            .flat_map(|c| {
                c.pointer("/spec/promotionPolicies")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        for stage in self.list(kube, "stages") {
            let stage_name = text(&stage, "/metadata/name").to_string();
            let by_policy = auto_promotion_by_policy(&policies, &stage);
            if !by_policy
                && text(
                    &stage,
                    &format!(
                        "/metadata/annotations/{}",
                        AUTO_PROMOTION_ANNOTATION.replace('/', "~1")
                    ),
                ) != "true"
            {
                continue;
            }
            // [K pkg/controller/stages]: the next Promotion waits for the current Freight's
            // verification.
            if self.verifications.iter().any(|v| v.stage == stage_name) {
                continue;
            }
            for request in stage
                .pointer("/spec/requestedFreight")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                let origin = text(&request, "/origin/name").to_string();
                let Some(newest) = newest_freight(freights.iter().collect(), &origin) else {
                    continue;
                };
                let current = stage
                    .pointer(&format!(
                        "/status/freightHistory/0/items/Warehouse~1{origin}/name"
                    ))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let already = promotions.iter().any(|p| {
                    text(p, "/spec/stage") == stage_name && text(p, "/spec/freight") == newest
                });
                // [K pkg/controller/stages/regular_stages.go]: the newest non-Aborted
                // Promotion carrying a hold or resume intent for the origin decides (names
                // sort by creation): a later resume lifts an earlier hold and vice versa.
                let origin_key = format!("Warehouse/{origin}");
                let intent = |p: &Value, key: &str| {
                    text(
                        p,
                        &format!("/metadata/annotations/{}", key.replace('/', "~1")),
                    ) == origin_key
                };
                let held = promotions
                    .iter()
                    .filter(|p| {
                        text(p, "/spec/stage") == stage_name
                            && text(p, "/status/phase") != "Aborted"
                            && (intent(p, HOLD_ANNOTATION) || intent(p, RESUME_ANNOTATION))
                    })
                    .max_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")))
                    .is_some_and(|p| intent(p, HOLD_ANNOTATION));
                if current == newest || already || held {
                    continue;
                }
                let freight = freights
                    .iter()
                    .find(|f| text(f, "/metadata/name") == newest)
                    .cloned()
                    .unwrap_or(Value::Null);
                if !freight_available(&stage, &freight) {
                    continue;
                }
                let promotion = json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Promotion", "metadata": {"namespace": self.namespace, "generateName": format!("{stage_name}-")}, "spec": {"stage": stage_name, "freight": newest}});
                let resource = Self::resource(kube, "promotions");
                match kube
                    .store()
                    .create(&resource, &self.namespace, promotion, &controller_user())
                {
                    Ok(created) => {
                        transcript.say(
                            "kargo",
                            format!(
                                "Stage {stage_name}: auto-promotion of Freight {} -> Promotion {}",
                                text(&freight, "/alias"),
                                text(&created, "/metadata/name")
                            ),
                        );
                        progress = true;
                    }
                    Err(e) => transcript.say(
                        "kargo",
                        format!("Stage {stage_name}: auto-promotion refused: {e}"),
                    ),
                }
            }
        }
        progress
    }

    fn patch_status(
        kube: &KubeDouble,
        plural: &str,
        namespace: &str,
        name: &str,
        status: Value,
    ) -> Result<Value, ApiError> {
        let resource = Self::resource(kube, plural);
        kube.store().patch(
            &resource,
            namespace,
            name,
            crate::kube::store::PatchBody::Merge(json!({"status": status})),
            &controller_user(),
            true,
        )
    }

    async fn promote(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        let mut promotions = self.list(kube, "promotions");
        promotions.sort_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")));
        // A new Promotion has an empty phase until the controller marks it Pending.
        for promotion in &promotions {
            if text(promotion, "/status/phase").is_empty() {
                let name = text(promotion, "/metadata/name");
                let _ = Self::patch_status(
                    kube,
                    "promotions",
                    &self.namespace,
                    name,
                    json!({"phase": "Pending"}),
                );
                progress = true;
            }
        }
        let promotions = self.list(kube, "promotions");
        let mut by_stage: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for promotion in promotions {
            by_stage
                .entry(text(&promotion, "/spec/stage").to_string())
                .or_default()
                .push(promotion);
        }
        for (stage, mut list) in by_stage {
            list.sort_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")));
            let running = list
                .iter()
                .find(|p| text(p, "/status/phase") == "Running")
                .cloned();
            let promotion = match running {
                Some(p) => p,
                None => {
                    let Some(next) = list
                        .iter()
                        .find(|p| text(p, "/status/phase") == "Pending")
                        .cloned()
                    else {
                        continue;
                    };
                    let name = text(&next, "/metadata/name").to_string();
                    // [K pkg/controller/stages/regular_stages.go syncPromotions]: a current
                    // Freight with a non-terminal verification holds the next Promotion; so
                    // does a healthy Stage whose current Freight is not verified yet, while an
                    // unhealthy one lets it run (it may be the fix). The ground starts the
                    // AnalysisRun in the tick its Applications turn healthy, so "healthy and
                    // not verified yet" is "an AnalysisRun runs"; a verification still waiting
                    // for health is an unhealthy Stage. (Upstream also holds a Stage whose
                    // health is unknown; the ground has no such state.)
                    if let Some(v) = self
                        .verifications
                        .iter()
                        .find(|v| v.stage == stage && v.analysis_run.is_some())
                    {
                        if self.held_for_verification.insert(name.clone()) {
                            let alias = Self::get(kube, "freights", &self.namespace, &v.freight)
                                .map(|f| text(&f, "/alias").to_string())
                                .unwrap_or_else(|_| v.freight.clone());
                            transcript.say(
                                "kargo",
                                format!(
                                    "Promotion {name} to Stage {stage} waits: Freight {alias} is still being verified there"
                                ),
                            );
                        }
                        continue;
                    }
                    // The superseded Freight's wait for health ends with the new Promotion.
                    self.verifications
                        .retain(|v| v.stage != stage || v.analysis_run.is_some());
                    let _ = Self::patch_status(
                        kube,
                        "promotions",
                        &self.namespace,
                        &name,
                        json!({"phase": "Running", "startedAt": crate::kube::store::rfc3339(now())}),
                    );
                    let freight = self.freight_reference(kube, text(&next, "/spec/freight"));
                    let _ = Self::patch_status(
                        kube,
                        "stages",
                        &self.namespace,
                        &stage,
                        json!({
                            "currentPromotion": {"name": name, "freight": freight},
                            "conditions": [{"type": "Promoting", "status": "True", "reason": "ActivePromotion", "message": format!("Promotion \"{name}\" is currently Running"), "lastTransitionTime": crate::kube::store::rfc3339(now())}],
                        }),
                    );
                    transcript.say(
                        "kargo",
                        format!("Promotion {name} to Stage {stage}: Running"),
                    );
                    progress = true;
                    let Ok(p) = Self::get(kube, "promotions", &self.namespace, &name) else {
                        continue;
                    };
                    p
                }
            };
            progress |= self.advance(kube, transcript, &stage, &promotion).await;
        }
        progress
    }

    fn freight_reference(&self, kube: &KubeDouble, name: &str) -> Value {
        let freight = Self::get(kube, "freights", &self.namespace, name).unwrap_or(Value::Null);
        json!({
            "name": name,
            "origin": freight.get("origin").cloned().unwrap_or(Value::Null),
            "images": freight.get("images").cloned().unwrap_or(json!([])),
            "charts": freight.get("charts").cloned().unwrap_or(json!([])),
            "commits": freight.get("commits").cloned().unwrap_or(json!([])),
        })
    }

    /// Runs the promotion's steps from where it stopped until one waits or all are done.
    async fn advance(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        stage: &str,
        promotion: &Value,
    ) -> bool {
        let name = text(promotion, "/metadata/name").to_string();
        let steps = promotion
            .pointer("/spec/steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let freight = Self::get(
            kube,
            "freights",
            &self.namespace,
            text(promotion, "/spec/freight"),
        )
        .unwrap_or(Value::Null);
        let vars: Map<String, Value> = named_values(promotion.pointer("/spec/vars"))
            .into_iter()
            .collect();
        let mut progress = false;
        loop {
            let run = self.runs.entry(name.clone()).or_default();
            if run.workdir.is_none() {
                let dir = self.workdir.join(name.replace('.', "-"));
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::create_dir_all(&dir);
                run.workdir = Some(dir);
            }
            let index = run.step;
            if index >= steps.len() {
                let (phase, message) = run
                    .failure
                    .clone()
                    .unwrap_or_else(|| ("Succeeded".into(), "All steps completed".into()));
                self.finish(kube, transcript, stage, &name, &phase, &message);
                return true;
            }
            if self.failing_stages.iter().any(|s| s == stage) {
                self.finish(
                    kube,
                    transcript,
                    stage,
                    &name,
                    "Failed",
                    "step 1 failed: the scenario makes this Stage's promotions fail",
                );
                return true;
            }
            let step = &steps[index];
            let uses = text(step, "/uses").to_string();
            // [K api/v1alpha1/promotion_types.go GetAlias]: `step-<i+1>` when `as` is unset.
            let alias = step
                .get("as")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| format!("step-{}", index + 1));
            let run = self
                .runs
                .get(&name)
                .map(|r| {
                    (
                        r.outputs.clone(),
                        r.workdir.clone().unwrap_or_default(),
                        r.statuses.clone(),
                    )
                })
                .unwrap_or_default();
            let prepared = self.prepare_step(step, &vars, &run.0, &run.2, &freight, stage, &name);
            let config = match prepared {
                Ok(Some(c)) => c,
                Ok(None) => {
                    let why = if step
                        .get("if")
                        .and_then(Value::as_str)
                        .is_some_and(|c| !c.is_empty())
                    {
                        "its if: condition is false"
                    } else {
                        "a step before it failed"
                    };
                    transcript.say(
                        "kargo",
                        format!(
                            "{name} step {}/{} {uses}: skipped ({why})",
                            index + 1,
                            steps.len()
                        ),
                    );
                    let run = self.runs.entry(name.clone()).or_default();
                    run.statuses.push((alias, "Skipped".into()));
                    run.step += 1;
                    progress = true;
                    continue;
                }
                Err(e) => {
                    let message = format!("step {} ({uses}): {e}", index + 1);
                    self.step_failed(transcript, &name, alias, "Errored", message, steps.len());
                    progress = true;
                    continue;
                }
            };
            // [K http_requester.go and every builtin: a config that fails its schema is a
            // terminal failure].
            if let Err(e) = schemas::validate(&uses, &config) {
                let message = format!("step {} ({uses}): {e}", index + 1);
                self.step_failed(transcript, &name, alias, "Failed", message, steps.len());
                progress = true;
                continue;
            }
            let context = steps::StepContext {
                kargo: self,
                kube,
                workdir: &run.1,
                promotion: &name,
                stage,
            };
            let outcome = steps::run(&context, &uses, &config).await;
            let errored = matches!(outcome, steps::Outcome::Errored { .. });
            let run = self.runs.entry(name.clone()).or_default();
            match outcome {
                steps::Outcome::Done { output, said } => {
                    transcript.say(
                        "kargo",
                        format!("{name} step {}/{} {uses}: {said}", index + 1, steps.len()),
                    );
                    if uses == "argocd-update" {
                        run.desired = config
                            .get("apps")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .flat_map(|a| {
                                let namespace = a
                                    .get("namespace")
                                    .and_then(Value::as_str)
                                    .unwrap_or("argocd")
                                    .to_string();
                                let app = text(a, "/name").to_string();
                                a.get("sources")
                                    .and_then(Value::as_array)
                                    .cloned()
                                    .unwrap_or_default()
                                    .into_iter()
                                    .filter(|s| !text(s, "/desiredRevision").is_empty())
                                    .map(move |s| {
                                        (
                                            namespace.clone(),
                                            app.clone(),
                                            text(&s, "/repoURL").to_string(),
                                            text(&s, "/chart").to_string(),
                                            text(&s, "/desiredRevision").to_string(),
                                        )
                                    })
                            })
                            .collect();
                        run.apps = config
                            .get("apps")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .map(|a| {
                                (
                                    a.get("namespace")
                                        .and_then(Value::as_str)
                                        .unwrap_or("argocd")
                                        .to_string(),
                                    text(a, "/name").to_string(),
                                )
                            })
                            .collect();
                    }
                    run.outputs.insert(alias.clone(), output);
                    run.statuses.push((alias, "Succeeded".into()));
                    run.errors = 0;
                    run.step += 1;
                    run.waiting_said = false;
                    let _ = Self::patch_status(
                        kube,
                        "promotions",
                        &self.namespace,
                        &name,
                        json!({"currentStep": run.step}),
                    );
                    progress = true;
                }
                steps::Outcome::Skipped { output, said } => {
                    transcript.say(
                        "kargo",
                        format!(
                            "{name} step {}/{} {uses}: skipped ({said})",
                            index + 1,
                            steps.len()
                        ),
                    );
                    run.outputs.insert(alias.clone(), output);
                    run.statuses.push((alias, "Skipped".into()));
                    run.step += 1;
                    progress = true;
                }
                // [K pkg/promotion/local_orchestrator.go determineStepCompletion]: a step still
                // running, or erroring below `retry.errorThreshold` (default 1: the first error
                // ends the Promotion as Errored), is retried until `retry.timeout`.
                steps::Outcome::Waiting { said } | steps::Outcome::Errored { said } => {
                    let threshold = step
                        .pointer("/retry/errorThreshold")
                        .and_then(Value::as_u64)
                        .filter(|t| *t > 0)
                        .unwrap_or(1);
                    if errored {
                        run.errors += 1;
                        if u64::from(run.errors) >= threshold {
                            let message = format!(
                                "step {} ({uses}): step {alias:?} met error threshold of {threshold}: {said}",
                                index + 1
                            );
                            self.step_failed(
                                transcript,
                                &name,
                                alias,
                                "Errored",
                                message,
                                steps.len(),
                            );
                            progress = true;
                            continue;
                        }
                    }
                    if let Some(timeout) = timed_out(run, index, step, &uses) {
                        let message = format!(
                            "step {} ({uses}): step {alias:?} timed out after {timeout}: {said}",
                            index + 1
                        );
                        self.step_failed(transcript, &name, alias, "Errored", message, steps.len());
                        progress = true;
                        continue;
                    }
                    if !run.waiting_said {
                        let line = if errored {
                            format!("{said}; step will be retried (error threshold {threshold})")
                        } else {
                            format!("waiting: {said}")
                        };
                        transcript.say(
                            "kargo",
                            format!("{name} step {}/{} {uses}: {line}", index + 1, steps.len()),
                        );
                        run.waiting_said = true;
                        progress = true;
                    }
                    return progress;
                }
                steps::Outcome::Failed { said } => {
                    let message = format!("step {} ({uses}) failed: {said}", index + 1);
                    self.step_failed(transcript, &name, alias, "Failed", message, steps.len());
                    progress = true;
                    continue;
                }
            }
        }
    }

    /// A step Errored or Failed: it is recorded, the first failure decides the Promotion's
    /// phase, and the run goes on ([K pkg/promotion/local_orchestrator.go]: later steps run
    /// only if their `if:` says so).
    fn step_failed(
        &mut self,
        transcript: &Transcript,
        name: &str,
        alias: String,
        phase: &str,
        message: String,
        total: usize,
    ) {
        let run = self.runs.entry(name.to_string()).or_default();
        transcript.say(
            "kargo",
            format!("{name} step {}/{total}: {phase}: {message}", run.step + 1),
        );
        run.statuses.push((alias, phase.to_string()));
        // [K pkg/promotion/orchestrator.go]: the Promotion takes the worst step status,
        // Errored over Failed; the first of the worst keeps its message.
        let worse = match &run.failure {
            None => true,
            Some((held, _)) => held == "Failed" && phase == "Errored",
        };
        if worse {
            run.failure = Some((phase.to_string(), message));
        }
        run.errors = 0;
        run.waiting_said = false;
        run.step += 1;
    }

    /// A step's vars, `if:` and config, as Kargo's step evaluator prepares them
    /// ([K pkg/promotion/evaluator.go Vars, ShouldSkip, Config]): the Promotion's vars then the
    /// step's own (only those see earlier outputs), each a template seeing the vars before it;
    /// a step whose `if:` is false is
    /// skipped (`None`), one whose `if:` is not a bool errors; without `if:`, a step after a
    /// failure is skipped.
    #[allow(clippy::too_many_arguments)]
    fn prepare_step(
        &self,
        step: &Value,
        promotion_vars: &Map<String, Value>,
        outputs: &Map<String, Value>,
        statuses: &[(String, String)],
        freight: &Value,
        stage: &str,
        name: &str,
    ) -> Result<Option<Value>, String> {
        let ctx = json!({"project": self.namespace, "stage": stage, "promotion": name, "targetFreight": {"name": text(freight, "/metadata/name"), "alias": text(freight, "/alias"), "origin": {"name": text(freight, "/origin/name")}}});
        let mut vars = Map::new();
        let step_vars = named_values(step.get("vars"));
        // [K evaluator.go Vars]: the Promotion's vars do not see outputs; a step's own do.
        let no_outputs = Map::new();
        let promotion_count = promotion_vars.len();
        for (i, (key, raw)) in promotion_vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(step_vars)
            .enumerate()
        {
            let (seen, seen_statuses) = if i < promotion_count {
                (&no_outputs, &[][..])
            } else {
                (outputs, statuses)
            };
            let scope = expr::Scope {
                ctx: ctx.clone(),
                vars: &vars,
                outputs: seen,
                freight,
                secrets: &self.secrets,
                statuses: seen_statuses,
            };
            let value =
                expr::evaluate_value(&raw, &scope).map_err(|e| format!("var {key}: {e}"))?;
            vars.insert(key, value);
        }
        let scope = expr::Scope {
            ctx,
            vars: &vars,
            outputs,
            freight,
            secrets: &self.secrets,
            statuses,
        };
        let condition = step
            .get("if")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty());
        if condition.is_none()
            && statuses
                .iter()
                .any(|(_, s)| s == "Errored" || s == "Failed")
        {
            return Ok(None);
        }
        if let Some(condition) = condition {
            match expr::evaluate_template(condition, &scope)? {
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(None),
                other => {
                    return Err(format!(
                        "if: expression must evaluate to a boolean, got {}",
                        match other {
                            Value::String(_) => "string",
                            Value::Number(_) => "float64",
                            Value::Null => "<nil>",
                            Value::Array(_) => "[]interface {}",
                            _ => "map[string]interface {}",
                        }
                    ));
                }
            }
        }
        expr::evaluate_value(step.get("config").unwrap_or(&Value::Null), &scope).map(Some)
    }

    fn finish(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        stage: &str,
        name: &str,
        phase: &str,
        message: &str,
    ) {
        let run = self.runs.remove(name).unwrap_or_default();
        let promotion = Self::get(kube, "promotions", &self.namespace, name).unwrap_or(Value::Null);
        let freight_name = text(&promotion, "/spec/freight").to_string();
        let freight_ref = self.freight_reference(kube, &freight_name);
        let finished = crate::kube::store::rfc3339(now());
        let _ = Self::patch_status(
            kube,
            "promotions",
            &self.namespace,
            name,
            json!({"phase": phase, "message": message, "finishedAt": finished, "freight": freight_ref}),
        );
        let stage_object = Self::get(kube, "stages", &self.namespace, stage).unwrap_or(Value::Null);
        let mut history: Vec<Value> = stage_object
            .pointer("/status/freightHistory")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut status = json!({
            "currentPromotion": null,
            "lastPromotion": {"name": name, "freight": freight_ref, "status": {"phase": phase, "message": message}, "finishedAt": finished},
            "conditions": [{"type": "Promoting", "status": "False", "reason": format!("LastPromotion{phase}"), "message": message, "lastTransitionTime": finished}],
        });
        if phase == "Succeeded" {
            // A new collection: this origin's Freight, the other origins carried forward.
            let origin_key = format!("Warehouse/{}", text(&freight_ref, "/origin/name"));
            let mut items = history
                .first()
                .and_then(|c| c.get("items"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let previous = items
                .get(&origin_key)
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string);
            items.insert(origin_key, freight_ref.clone());
            let mut names: Vec<&str> = items
                .values()
                .filter_map(|f| f.get("name").and_then(Value::as_str))
                .collect();
            names.sort();
            let id = hex(&Sha1::digest(names.join(",").as_bytes()));
            history.insert(0, json!({"id": id, "items": items}));
            history.truncate(10);
            status["freightHistory"] = json!(history);
            status["freightSummary"] = json!(freight_name);
            let freights = Self::resource(kube, "freights");
            if let Some(previous) = previous.filter(|p| *p != freight_name) {
                let _ = kube.store().patch(
                    &freights,
                    &self.namespace,
                    &previous,
                    crate::kube::store::PatchBody::Merge(
                        json!({"status": {"currentlyIn": {stage: null}}}),
                    ),
                    &controller_user(),
                    true,
                );
            }
            let _ = Self::patch_status(
                kube,
                "freights",
                &self.namespace,
                &freight_name,
                json!({"currentlyIn": {stage: {"since": finished}}}),
            );
            self.verifications.push(Verification {
                stage: stage.to_string(),
                freight: freight_name.clone(),
                apps: run.apps.clone(),
                // [K pkg/health/checker/builtin/argocd.go]: Kargo checks the revision an
                // Application runs only when argocd-update names a desiredRevision; it never
                // compares with the merge commit.
                desired: run.desired.clone(),
                analysis_run: None,
            });
        }
        let _ = Self::patch_status(kube, "stages", &self.namespace, stage, status);
        transcript.say(
            "kargo",
            format!(
                "Promotion {name}: {phase}{}",
                if phase == "Succeeded" {
                    String::new()
                } else {
                    format!(" ({message})")
                }
            ),
        );
    }

    /// After a successful promotion: wait until the Applications an `argocd-update` step named
    /// are Synced (at the merged revision, when known) and Healthy ([K docs 60-verification]:
    /// Kargo waits for them before verification, and without verification success is health).
    /// With `spec.verification.analysisTemplates`, an AnalysisRun is then created from them and
    /// the Stage's args, and its verdict decides: Successful verifies the Freight in the Stage
    /// (so a Stage that requests it from this one may take it); Failed, Error or Inconclusive
    /// records the failure and the Freight stays unverified.
    fn verify(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        let mut remaining = Vec::new();
        for mut verification in std::mem::take(&mut self.verifications) {
            let resource = kube
                .store()
                .resource("argoproj.io", "v1alpha1", "applications")
                .cloned();
            let ready = verification.apps.iter().all(|(namespace, app)| {
                let Some(resource) = &resource else {
                    return false;
                };
                let Ok(object) = kube.store().get(resource, namespace, app) else {
                    return false;
                };
                // [K pkg/health/checker/builtin/argocd.go]: the revision each named source
                // runs (status.sync.revision or revisions[i]) must be the desired one.
                let runs_desired = verification
                    .desired
                    .iter()
                    .filter(|(ns, name, ..)| ns == namespace && name == app)
                    .all(|(_, _, repo, chart, revision)| {
                        let wanted = json!({"repoURL": repo, "chart": chart});
                        steps::synced_revision(&object, &wanted).as_deref()
                            == Some(revision.as_str())
                    });
                text(&object, "/status/sync/status") == "Synced"
                    && text(&object, "/status/health/status") == "Healthy"
                    && runs_desired
            });
            if !ready && verification.analysis_run.is_none() {
                remaining.push(verification);
                continue;
            }
            let stage_object = Self::get(kube, "stages", &self.namespace, &verification.stage)
                .unwrap_or(Value::Null);
            let templates: Vec<Value> = stage_object
                .pointer("/spec/verification/analysisTemplates")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let names: Vec<&str> = verification.apps.iter().map(|(_, n)| n.as_str()).collect();
            let healthy = format!(
                "{} Synced and Healthy{}",
                if names.is_empty() {
                    "no Applications named".to_string()
                } else {
                    names.join(", ")
                },
                verification
                    .desired
                    .first()
                    .map(|(.., r)| format!(" running {r}"))
                    .unwrap_or_default()
            );
            let outcome: Result<String, (String, String)> = if templates.is_empty() {
                Ok(format!("verification passed: {healthy}"))
            } else {
                match &verification.analysis_run {
                    None => {
                        match self.start_analysis(kube, &stage_object, &templates, &verification) {
                            Ok(run) => {
                                transcript.say(
                                    "kargo",
                                    format!(
                                        "Stage {}: {healthy}; verification started: AnalysisRun {run}",
                                        verification.stage
                                    ),
                                );
                                verification.analysis_run = Some(run);
                                remaining.push(verification);
                                progress = true;
                                continue;
                            }
                            Err(e) => Err(("Error".to_string(), e)),
                        }
                    }
                    Some(run) => {
                        let runs = kube
                            .store()
                            .resource("argoproj.io", "v1alpha1", "analysisruns")
                            .cloned();
                        let object = runs
                            .and_then(|r| kube.store().get(&r, &self.namespace, run).ok())
                            .unwrap_or(Value::Null);
                        match text(&object, "/status/phase") {
                            "Successful" => {
                                Ok(format!("verification passed: AnalysisRun {run} Successful"))
                            }
                            phase @ ("Failed" | "Error" | "Inconclusive") => Err((
                                phase.to_string(),
                                format!("AnalysisRun {run}: {}", text(&object, "/status/message")),
                            )),
                            _ => {
                                remaining.push(verification);
                                continue;
                            }
                        }
                    }
                }
            };
            let now = crate::kube::store::rfc3339(now());
            let mut history: Vec<Value> = stage_object
                .pointer("/status/freightHistory")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let id = format!("verification-{}", &verification.freight[..7]);
            let run_ref = verification
                .analysis_run
                .as_ref()
                .map(|r| json!({"namespace": self.namespace, "name": r}));
            let alias = Self::get(kube, "freights", &self.namespace, &verification.freight)
                .map(|f| text(&f, "/alias").to_string())
                .unwrap_or_default();
            match &outcome {
                Ok(said) => {
                    let _ = Self::patch_status(
                        kube,
                        "freights",
                        &self.namespace,
                        &verification.freight,
                        json!({"verifiedIn": {verification.stage.clone(): {"verifiedAt": now}}}),
                    );
                    if let Some(first) = history.first_mut() {
                        first["verificationHistory"] = json!([{"id": id, "actor": "kargo", "phase": "Successful", "startTime": now, "finishTime": now, "message": said, "analysisRun": run_ref}]);
                    }
                    let _ = Self::patch_status(
                        kube,
                        "stages",
                        &self.namespace,
                        &verification.stage,
                        json!({"freightHistory": history, "health": {"status": "Healthy"}}),
                    );
                    let said = if templates.is_empty() {
                        said.clone()
                    } else {
                        format!("{said}; Freight {alias} is verified")
                    };
                    transcript.say("kargo", format!("Stage {}: {said}", verification.stage));
                }
                Err((phase, why)) => {
                    if let Some(first) = history.first_mut() {
                        first["verificationHistory"] = json!([{"id": id, "actor": "kargo", "phase": phase, "startTime": now, "finishTime": now, "message": why, "analysisRun": run_ref}]);
                    }
                    let _ = Self::patch_status(
                        kube,
                        "stages",
                        &self.namespace,
                        &verification.stage,
                        json!({"freightHistory": history, "health": {"status": "Unhealthy"}}),
                    );
                    transcript.say(
                        "kargo",
                        format!(
                            "Stage {}: verification {phase}: {why}; Freight {alias} is not verified here, so no Stage that requests it from {} receives it",
                            verification.stage, verification.stage
                        ),
                    );
                }
            }
            progress = true;
        }
        self.verifications = remaining;
        progress
    }

    /// Creates the AnalysisRun for a Stage's verification.
    fn start_analysis(
        &self,
        kube: &KubeDouble,
        stage: &Value,
        references: &[Value],
        verification: &Verification,
    ) -> Result<String, String> {
        let resource = |plural: &str| {
            kube.store()
                .resource("argoproj.io", "v1alpha1", plural)
                .cloned()
                .ok_or_else(|| format!("Argo Rollouts' {plural} are not served"))
        };
        let templates_resource = resource("analysistemplates")?;
        let runs_resource = resource("analysisruns")?;
        let mut templates = Vec::new();
        for reference in references {
            if !matches!(text(reference, "/kind"), "" | "AnalysisTemplate") {
                return Err(format!(
                    "{} {} is not modelled by the ground",
                    text(reference, "/kind"),
                    text(reference, "/name")
                ));
            }
            let name = text(reference, "/name");
            let template = kube
                .store()
                .get(&templates_resource, &self.namespace, name)
                .map_err(|_| format!("AnalysisTemplate {name} not found in {}", self.namespace))?;
            templates.push(template);
        }
        let args: Vec<Value> = stage
            .pointer("/spec/verification/args")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let stage_name = &verification.stage;
        let name = format!(
            "{}.{}.{}",
            stage_name,
            next_ulid(&self.ulids),
            &verification.freight[..7]
        );
        let run = crate::rollouts::run_for(
            &templates,
            &args,
            &name,
            &self.namespace,
            json!({"kargo.akuity.io/stage": stage_label_value(stage_name), "kargo.akuity.io/freight-collection": verification.freight}),
            json!({}),
        )?;
        kube.store()
            .create(&runs_resource, &self.namespace, run, &controller_user())
            .map_err(|e| format!("AnalysisRun not created: {e}"))?;
        Ok(name)
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
            for request in stage
                .pointer("/spec/requestedFreight")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                let origin = text(&request, "/origin/name").to_string();
                let Some(newest) = newest_freight(freights.iter().collect(), &origin) else {
                    continue;
                };
                items.insert(
                    format!("Warehouse/{origin}"),
                    self.freight_reference(kube, &newest),
                );
                let _ = Self::patch_status(
                    kube,
                    "freights",
                    &self.namespace,
                    &newest,
                    json!({"currentlyIn": {stage_name.clone(): {"since": crate::kube::store::rfc3339(now())}}}),
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

    /// True while a promotion runs or a verification waits.
    pub fn busy(&self) -> bool {
        !self.runs.is_empty() || !self.verifications.is_empty()
    }
}

/// Whether a ProjectConfig's `promotionPolicies` turn auto-promotion on for `stage`
/// ([K pkg/api/auto_promotion.go findMatchingPromotionPolicy]): the first policy whose
/// `stageSelector` matches decides (the deprecated `stage` is an exact-name selector); a name
/// is exact, `glob:` or `regex:`/`regexp:` (unanchored, as Go's `MatchString`), ANDed with the
/// inlined label selector. A pattern that does not parse ends the search with `false` (Kargo
/// errors the reconcile, which promotes nothing).
pub fn auto_promotion_by_policy(policies: &[Value], stage: &Value) -> bool {
    let name = text(stage, "/metadata/name");
    let labels: BTreeMap<String, String> = stage
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    for policy in policies {
        let selector = match policy.get("stageSelector") {
            Some(selector) => selector.clone(),
            None => json!({"name": text(policy, "/stage")}),
        };
        let pattern = text(&selector, "/name");
        // A pattern that does not parse errors Kargo's reconcile: nothing auto-promotes, and
        // no later policy is consulted.
        let name_matches = if pattern.is_empty() {
            true
        } else if let Some(glob) = pattern.strip_prefix("glob:") {
            match globset::GlobBuilder::new(glob)
                .literal_separator(true)
                .build()
            {
                Ok(g) => g.compile_matcher().is_match(name),
                Err(_) => return false,
            }
        } else if let Some(re) = pattern
            .strip_prefix("regex:")
            .or_else(|| pattern.strip_prefix("regexp:"))
        {
            match regex::Regex::new(re) {
                Ok(r) => r.is_match(name),
                Err(_) => return false,
            }
        } else {
            pattern == name
        };
        if !name_matches {
            continue;
        }
        // The LabelSelector is inlined in the selector (`matchLabels`, `matchExpressions`).
        if !label_selector_matches(&selector, &labels) {
            continue;
        }
        return policy.get("autoPromotionEnabled").and_then(Value::as_bool) == Some(true);
    }
    false
}

/// A `metav1.LabelSelector` (`matchLabels` ANDed with `matchExpressions`) against labels.
fn label_selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let exact = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    exact
        && selector
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .all(|e| {
                let value = labels.get(text(e, "/key"));
                let values: Vec<&str> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                match text(e, "/operator") {
                    "In" => value.is_some_and(|v| values.contains(&v.as_str())),
                    "NotIn" => value.is_none_or(|v| !values.contains(&v.as_str())),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
}

/// `vars` entries (`[{name, value}]`) as (name, value) pairs, in order.
fn named_values(list: Option<&Value>) -> Vec<(String, Value)> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            Some((
                v.get("name")?.as_str()?.to_string(),
                v.get("value").cloned().unwrap_or(Value::Null),
            ))
        })
        .collect()
}

/// Go's `time.ParseDuration` for the units a step timeout uses (`30m`, `5m0s`, `1h30m`, `1ms`).
fn go_duration(text: &str) -> Option<std::time::Duration> {
    static WHOLE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+$").expect("a fixed pattern")
    });
    static PART: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)").expect("a fixed pattern")
    });
    if !WHOLE.is_match(text) {
        return None;
    }
    let part = &*PART;
    let mut seconds = 0.0;
    for c in part.captures_iter(text) {
        let n: f64 = c[1].parse().ok()?;
        seconds += n * match &c[2] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            _ => 3600.0,
        };
    }
    Some(std::time::Duration::from_secs_f64(seconds))
}

/// [K pkg/promotion/local_orchestrator.go]: a step still running or erroring past its
/// `retry.timeout` (argocd-update's default: 5 minutes; none for the others here) Errors.
/// Returns the timeout as written when it has passed.
fn timed_out(run: &mut Run, index: usize, step: &Value, uses: &str) -> Option<String> {
    let written = step
        .pointer("/retry/timeout")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| (uses == "argocd-update").then(|| "5m0s".to_string()))?;
    let timeout = go_duration(&written).filter(|t| !t.is_zero())?;
    let started = match run.started {
        Some((i, at)) if i == index => at,
        _ => {
            let now = std::time::Instant::now();
            run.started = Some((index, now));
            now
        }
    };
    (started.elapsed() > timeout).then_some(written)
}

fn push(object: &mut Value, field: &str, item: Value) {
    match object.get_mut(field).and_then(Value::as_array_mut) {
        Some(list) => list.push(item),
        None => object[field] = json!([item]),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freight_names_are_content_hashes() {
        let a = json!({"origin": {"kind": "Warehouse", "name": "w"}, "charts": [{"repoURL": "https://c/", "name": "x", "version": "1.0.0"}]});
        let b = json!({"origin": {"kind": "Warehouse", "name": "w"}, "charts": [{"repoURL": "https://c", "name": "x", "version": "1.0.0"}]});
        assert_eq!(freight_name(&a), freight_name(&b));
        assert_eq!(freight_name(&a).len(), 40);
        let c = json!({"origin": {"kind": "Warehouse", "name": "w"}, "charts": [{"repoURL": "https://c", "name": "x", "version": "1.0.1"}]});
        assert_ne!(freight_name(&a), freight_name(&c));
    }

    #[test]
    fn newest_versions_honour_constraints() {
        let versions: Vec<String> = ["1.19.2", "1.19.3", "2.0.0", "v1.20.0-rc.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            newest_version(&versions, "^1.19.0").as_deref(),
            Some("1.19.3")
        );
        assert_eq!(newest_version(&versions, "").as_deref(), Some("2.0.0"));
        assert_eq!(
            newest_version(&versions, ">=1.0.0 <2.0.0").as_deref(),
            Some("1.19.3")
        );
    }

    #[test]
    fn the_first_matching_promotion_policy_decides() {
        // [K pkg/api/auto_promotion.go findMatchingPromotionPolicy]
        let stage = json!({"metadata": {"name": "addons-prod", "labels": {"tier": "prod"}}});
        let on = |policies: Value| auto_promotion_by_policy(policies.as_array().unwrap(), &stage);
        assert!(on(
            json!([{"stage": "addons-prod", "autoPromotionEnabled": true}])
        ));
        assert!(on(
            json!([{"stageSelector": {"name": "addons-prod"}, "autoPromotionEnabled": true}])
        ));
        assert!(on(
            json!([{"stageSelector": {"name": "glob:addons-*"}, "autoPromotionEnabled": true}])
        ));
        assert!(on(
            json!([{"stageSelector": {"name": "regex:prod$"}, "autoPromotionEnabled": true}])
        ));
        assert!(on(
            json!([{"stageSelector": {"matchLabels": {"tier": "prod"}}, "autoPromotionEnabled": true}])
        ));
        assert!(!on(
            json!([{"stageSelector": {"name": "addons-prod", "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["prod"]}]}, "autoPromotionEnabled": true}])
        ));
        assert!(!on(
            json!([{"stageSelector": {"name": "addons-staging"}, "autoPromotionEnabled": true}])
        ));
        // The first match decides, even when a later one would enable it.
        assert!(!on(
            json!([{"stageSelector": {"name": "glob:*"}}, {"stage": "addons-prod", "autoPromotionEnabled": true}])
        ));
        assert!(!on(
            json!([{"stageSelector": {"name": "regex:("}, "autoPromotionEnabled": true}])
        ));
        // A broken pattern stops the search: a later policy is not consulted.
        assert!(!on(json!([
            {"stageSelector": {"name": "regex:("}, "autoPromotionEnabled": false},
            {"stage": "addons-prod", "autoPromotionEnabled": true}
        ])));
    }

    #[test]
    fn long_stage_names_are_shortened_for_labels() {
        assert_eq!(stage_label_value("prod"), "prod");
        let long = "a".repeat(80);
        assert_eq!(stage_label_value(&long).len(), 63);
    }
}
