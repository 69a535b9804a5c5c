//! Auto-promotion: the ProjectConfig's promotion policies and the hold/resume annotations.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::kargo::freight::auto_promotion_candidate;
use crate::kargo::{
    AUTO_PROMOTION_ANNOTATION, GROUP, HOLD_ANNOTATION, Kargo, RESUME_ANNOTATION, VERSION,
    controller_user, text,
};
use crate::kube::KubeDouble;
use crate::transcript::Transcript;

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
pub(super) fn label_selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
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

impl Kargo {
    pub(super) fn auto_promote(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
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
            let origins: Vec<String> = stage
                .pointer("/spec/requestedFreight")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|r| text(r, "/origin/name").to_string())
                .collect();
            for origin in origins {
                // [K pkg/controller/stages/regular_stages.go autoPromoteFreight]: the candidate
                // is the newest Freight AVAILABLE to the Stage, not the newest overall.
                let Some(freight) = auto_promotion_candidate(&stage, &freights, &origin).cloned()
                else {
                    continue;
                };
                let newest = text(&freight, "/metadata/name").to_string();
                let current = stage
                    .pointer(&format!(
                        "/status/freightHistory/0/items/Warehouse~1{origin}/name"
                    ))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                // [K regular_stages.go unprocessedPromotionExistsForStageFreight,
                // newestTerminalPromotionForStageFreight]: stand down while a Promotion of the
                // candidate is in flight or succeeded unrecorded, and after its newest terminal
                // one did not succeed (no retry loop); a recorded success does not block.
                let last = text(&stage, "/status/lastPromotion/name");
                let ours: Vec<&Value> = promotions
                    .iter()
                    .filter(|p| {
                        text(p, "/spec/stage") == stage_name && text(p, "/spec/freight") == newest
                    })
                    .collect();
                let terminal = |p: &&Value| {
                    matches!(
                        text(p, "/status/phase"),
                        "Succeeded" | "Failed" | "Errored" | "Aborted"
                    )
                };
                let unprocessed = ours.iter().any(|p| {
                    !terminal(p)
                        || (text(p, "/status/phase") == "Succeeded"
                            && (last.is_empty() || text(p, "/metadata/name") > last))
                });
                let last_failed = ours
                    .iter()
                    .filter(|p| terminal(p))
                    .max_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")))
                    .is_some_and(|p| text(p, "/status/phase") != "Succeeded");
                let already = unprocessed || last_failed;
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
}
