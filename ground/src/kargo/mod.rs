//! Kargo behaviour, as the reference sheet describes Kargo v1.11: the Freight and Promotion
//! webhooks (content-hash Freight names; Promotion names replaced, steps copied from the
//! Stage, the `promote` verb checked, Freight availability), Warehouses discovering chart
//! versions and images, promotions running their steps for real (git, the forge's REST API,
//! HTTP), Stage status (`freightHistory[0]`, `currentPromotion`, `lastPromotion`), auto-
//! promotion with the v1.11 hold/resume annotations, and verification against Argo CD.
//!
//! The actor advances in explicit ticks driven by the ground, so a run is deterministic.

pub mod constraint;
pub mod expr;
pub mod schemas;
pub mod steps;

mod freight;
mod policy;
mod promotion;
mod verification;
mod warehouse;
mod webhooks;

pub use freight::{
    alias_for, auto_promotion_candidate, freight_available, freight_name, stage_label_value,
};
pub use policy::auto_promotion_by_policy;
pub use warehouse::newest_version;
pub use webhooks::install_webhooks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use crate::kube::KubeDouble;
use crate::kube::store::{ApiError, Resource, Selector, User};
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
    started: Option<(usize, u64)>,
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

    /// True while a promotion runs or a verification waits.
    pub fn busy(&self) -> bool {
        !self.runs.is_empty() || !self.verifications.is_empty()
    }
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
        let newest = |c: &str| newest_version(&versions, c).expect("parses");
        assert_eq!(newest("^1.19.0").as_deref(), Some("1.19.3"));
        assert_eq!(newest("").as_deref(), Some("2.0.0"));
        assert_eq!(newest(">=1.0.0 <2.0.0").as_deref(), Some("1.19.3"));
        // Masterminds' `||` and hyphen ranges, which the semver crate does not read.
        assert_eq!(newest("~1.19.2 || >=3").as_deref(), Some("1.19.3"));
        assert_eq!(newest("1.0.0 - 1.19.2").as_deref(), Some("1.19.2"));
        // A prerelease matches only an alternative that names one.
        assert_eq!(newest(">=1.20.0-rc.0").as_deref(), Some("2.0.0"));
        assert_eq!(newest(">=1.20.0-rc.0 <2").as_deref(), Some("v1.20.0-rc.1"));
        assert!(newest_version(&versions, "^1.19 ||").is_err());
        assert!(newest_version(&versions, "not a constraint").is_err());
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
