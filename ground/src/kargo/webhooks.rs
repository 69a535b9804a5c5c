//! The admission webhooks: Warehouse, Freight and Promotion, as Kargo's do.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::kargo::freight::{
    alias_for, auto_promotion_candidate, freight_available, freight_name, stage_label_value,
};
use crate::kargo::policy::auto_promotion_by_policy;
use crate::kargo::{
    ALIAS_LABEL, AUTO_PROMOTION_ANNOTATION, CONTROLLER, CREATE_ACTOR_ANNOTATION, GROUP, Grants,
    HOLD_ANNOTATION, PROJECT_LABEL, RESUME_ANNOTATION, STAGE_LABEL, VERSION, constraint, text,
};
use crate::kube::KubeDouble;
use crate::kube::store::{Admission, ApiError, Operation};

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
pub(super) fn next_ulid(counter: &std::sync::atomic::AtomicU64) -> String {
    let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    let milliseconds = 1_767_225_600_000 + n * 1000;
    ulid::Ulid::from_parts(milliseconds, u128::from(n))
        .to_string()
        .to_lowercase()
}

/// [K pkg/webhook/kubernetes/warehouse/webhook.go, pkg/subscription/chart.go]: a chart
/// subscription from an `oci://` repository names no chart (the URL does), one from an
/// http(s) repository must name it; either mistake is Invalid, and so is a semver constraint
/// that does not parse.
pub(super) fn warehouse_webhook(admission: &mut Admission) -> Result<(), ApiError> {
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
        // [K pkg/subscription/image.go, pkg/validation/validation.go SemverConstraint]: an
        // image constraint read as semver (the SemVer strategy, the default) must parse.
        if let Some(image) = sub.get("image") {
            let constraint = text(image, "/constraint");
            if matches!(text(image, "/imageSelectionStrategy"), "" | "SemVer")
                && !constraint.is_empty()
                && constraint::Constraint::parse(constraint).is_err()
            {
                errors.push(format!(
                    "spec.subscriptions[{i}].image.constraint: Invalid value: {constraint:?}"
                ));
            }
        }
        let Some(chart) = sub.get("chart") else {
            continue;
        };
        let semver_constraint = text(chart, "/semverConstraint");
        if !semver_constraint.is_empty()
            && constraint::Constraint::parse(semver_constraint).is_err()
        {
            errors.push(format!(
                "spec.subscriptions[{i}].chart.semverConstraint: Invalid value: {semver_constraint:?}"
            ));
        }
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

pub(super) fn freight_webhook(admission: &mut Admission) -> Result<(), ApiError> {
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

/// A refusal as Kargo's promotion webhook words it.
fn promotion_denied(code: u16, reason: &str, message: String) -> ApiError {
    ApiError::new(
        code,
        reason,
        format!("admission webhook \"promotion.kargo.akuity.io\" denied the request: {message}"),
    )
}

/// [K pkg/webhook/kubernetes/promotion/webhook.go authorize]: the promote verb is checked for
/// create, update and delete; a subject without it gets a Forbidden that the validating
/// webhook wraps in an internal error (HTTP 500, reason InternalError).
fn promotion_unauthorized(user: &str, stage_name: &str, name: &str, action: &str) -> ApiError {
    promotion_denied(
        500,
        "InternalError",
        format!(
            "Internal error occurred: promotions.kargo.akuity.io \"{name}\" is forbidden: subject \"{user}\" is not permitted to {action} Promotions for Stage \"{stage_name}\""
        ),
    )
}

fn promotion_invalid(name: &str, field: &str, value: &str, why: String) -> ApiError {
    promotion_denied(
        422,
        "Invalid",
        format!(
            "Promotion.kargo.akuity.io \"{name}\" is invalid: {field}: Invalid value: \"{value}\": {why}"
        ),
    )
}

pub(super) fn promotion_webhook(
    admission: &mut Admission,
    grants: &Grants,
    ulids: &std::sync::atomic::AtomicU64,
) -> Result<(), ApiError> {
    let namespace = text(admission.object, "/metadata/namespace").to_string();
    let stage_name = text(admission.object, "/spec/stage").to_string();
    let current_name = text(admission.object, "/metadata/name").to_string();
    let unauthorized = |action: &str| {
        promotion_unauthorized(&admission.user.name, &stage_name, &current_name, action)
    };
    match admission.operation {
        Operation::Delete => {
            if !grants.allows(admission.user, &namespace, &stage_name) {
                return Err(unauthorized("delete"));
            }
            Ok(())
        }
        Operation::Update => {
            if !grants.allows(admission.user, &namespace, &stage_name) {
                return Err(unauthorized("update"));
            }
            let old = admission.old.cloned().unwrap_or(Value::Null);
            if old.get("spec") != admission.object.get("spec") {
                return Err(promotion_invalid(
                    &current_name,
                    "spec",
                    "…",
                    "spec is immutable".into(),
                ));
            }
            Ok(())
        }
        Operation::Create => create_promotion(admission, grants, ulids, &namespace, &stage_name),
    }
}

/// A new Promotion: admitted in Kargo's order (a Project namespace, an existing Stage,
/// authorization, promotion steps, an available Freight), then named, filled from its Stage,
/// its hold annotations synced and owned by the Stage.
fn create_promotion(
    admission: &mut Admission,
    grants: &Grants,
    ulids: &std::sync::atomic::AtomicU64,
    namespace: &str,
    stage_name: &str,
) -> Result<(), ApiError> {
    let current_name = text(admission.object, "/metadata/name").to_string();
    let project = admission
        .store
        .get("", "namespaces", "", namespace)
        .cloned()
        .unwrap_or(Value::Null);
    if text(
        &project,
        &format!("/metadata/labels/{}", PROJECT_LABEL.replace('/', "~1")),
    ) != "true"
    {
        return Err(promotion_invalid(
            &current_name,
            "metadata.namespace",
            namespace,
            format!("namespace {namespace:?} is not a Kargo Project namespace"),
        ));
    }
    // [K webhook.go Default]: a missing Stage is Invalid, before anything else.
    let stage = admission
        .store
        .get(GROUP, "stages", namespace, stage_name)
        .cloned()
        .ok_or_else(|| {
            promotion_invalid(
                &current_name,
                "spec.stage",
                stage_name,
                format!("could not find Stage \"{stage_name}\" in namespace \"{namespace}\""),
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
    if !grants.allows(admission.user, namespace, stage_name) {
        return Err(promotion_unauthorized(
            &admission.user.name,
            stage_name,
            &name,
            "create",
        ));
    }
    let template_steps = stage
        .pointer("/spec/promotionTemplate/spec/steps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if template_steps.is_empty() {
        return Err(promotion_invalid(
            &name,
            "spec.stage",
            stage_name,
            "a control-flow Stage (no promotion steps) cannot be promoted to".into(),
        ));
    }
    // A missing Freight is not available either: Invalid, as Kargo answers it.
    let freight = admission
        .store
        .get(GROUP, "freights", namespace, &freight_name)
        .cloned()
        .unwrap_or(Value::Null);
    if freight.is_null() || !freight_available(&stage, &freight) {
        return Err(promotion_invalid(
            &name,
            "spec.freight",
            &freight_name,
            "Freight is not available to this Stage".into(),
        ));
    }
    fill_from_stage(admission.object, &name, stage_name, &stage, template_steps);
    if admission.user.name != CONTROLLER {
        mark_user_promotion(admission, namespace, &stage, &freight, &freight_name);
    }
    admission.object["metadata"]["ownerReferences"] = json!([{
        "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "Stage", "name": stage_name,
        "uid": text(&stage, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true,
    }]);
    Ok(())
}

/// The Promotion named, labelled and annotated with its Stage, carrying the Stage's promotion
/// steps and vars (the Stage's, then its template's), with no hold annotation of its own.
fn fill_from_stage(
    object: &mut Value,
    name: &str,
    stage_name: &str,
    stage: &Value,
    template_steps: Vec<Value>,
) {
    object["metadata"]["name"] = json!(name);
    if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("generateName");
    }
    object["metadata"]["labels"][STAGE_LABEL] = json!(stage_label_value(stage_name));
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
}

/// A Promotion a user (not Kargo's controller) made: its actor annotated, and, on an
/// auto-promoting Stage, auto-promotion for the Freight's origin held or resumed.
fn mark_user_promotion(
    admission: &mut Admission,
    namespace: &str,
    stage: &Value,
    freight: &Value,
    freight_name: &str,
) {
    admission.object["metadata"]["annotations"][CREATE_ACTOR_ANNOTATION] =
        json!(format!("kubernetes:{}", admission.user.name));
    // v1.11: a user-made Promotion on an auto-promoting Stage holds auto-promotion for the
    // origin unless it promotes the newest Freight, which resumes it.
    let by_policy = admission
        .store
        .get(GROUP, "projectconfigs", namespace, namespace)
        .and_then(|c| c.pointer("/spec/promotionPolicies"))
        .and_then(Value::as_array)
        .is_some_and(|policies| auto_promotion_by_policy(policies, stage));
    if by_policy
        || text(
            stage,
            &format!(
                "/metadata/annotations/{}",
                AUTO_PROMOTION_ANNOTATION.replace('/', "~1")
            ),
        ) == "true"
    {
        let origin = format!("Warehouse/{}", text(freight, "/origin/name"));
        // [K pkg/webhook/kubernetes/promotion/webhook.go syncHoldAnnotations]: resume only
        // when the Freight is the auto-promotion candidate.
        let candidate = auto_promotion_candidate(
            stage,
            admission.store.list(GROUP, "freights", namespace),
            text(freight, "/origin/name"),
        )
        .map(|f| text(f, "/metadata/name").to_string());
        let key = if candidate.as_deref() == Some(freight_name) {
            RESUME_ANNOTATION
        } else {
            HOLD_ANNOTATION
        };
        admission.object["metadata"]["annotations"][key] = json!(origin);
    }
}
