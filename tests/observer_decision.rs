//! The observer's decision, branch by branch (the first seed's diagram), and its invariants
//! as properties.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

use gitops_loop::observer::decision::*;
use gitops_loop::observer::projection;
use proptest::prelude::*;
use serde_json::{Value, json};

fn warehouse(name: &str, repos: &[&str]) -> Value {
    json!({"metadata": {"name": name}, "spec": {"subscriptions": repos.iter().map(|r| json!({"image": {"repoURL": r}})).collect::<Vec<_>>()}})
}

fn stage(origins: &[&str], current: &[(&str, &str, &str)]) -> Value {
    let items: serde_json::Map<String, Value> = origins
        .iter()
        .map(|o| {
            let images: Vec<Value> = current
                .iter()
                .map(|(r, t, d)| json!({"repoURL": r, "tag": t, "digest": d}))
                .collect();
            (
                format!("Warehouse/{o}"),
                json!({"name": format!("current-{o}"), "images": images}),
            )
        })
        .collect();
    json!({"metadata": {"name": "prod", "namespace": "kargo-demo"},
           "spec": {"requestedFreight": origins.iter().map(|o| json!({"origin": {"kind": "Warehouse", "name": o}, "sources": {"direct": true}})).collect::<Vec<_>>()},
           "status": {"freightHistory": [{"items": items}]}})
}

fn freight(name: &str, origin: &str, rv: u64, images: &[(&str, &str, &str)]) -> Value {
    json!({"metadata": {"name": name, "resourceVersion": rv.to_string()}, "origin": {"kind": "Warehouse", "name": origin},
           "images": images.iter().map(|(r, t, d)| json!({"repoURL": r, "tag": t, "digest": d})).collect::<Vec<_>>()})
}

fn app(images: &[&str]) -> Value {
    json!({"metadata": {"name": "web", "annotations": {AUTHORIZED_STAGE_ANNOTATION: "kargo-demo:prod"}}, "status": {"summary": {"images": images}}})
}

fn promotion(name: &str, freight: &str, phase: &str, ours: bool) -> Value {
    let mut p = json!({"metadata": {"name": name, "labels": {}}, "spec": {"stage": "prod", "freight": freight}, "status": {"phase": phase}});
    if ours {
        p["metadata"]["labels"][MANAGED_BY_LABEL] = json!(MANAGED_BY);
    }
    p
}

fn decide_with(
    app: &Value,
    stage: &Value,
    warehouses: &[Value],
    freights: &[Value],
    promotions: &[Value],
) -> Decision {
    decide(&Inputs {
        app,
        stage,
        warehouses,
        freights,
        promotions,
    })
}

const REPO: &str = "ghcr.io/example/web";

fn standard() -> (Value, Vec<Value>, Vec<Value>) {
    let stage = stage(&["web"], &[(REPO, "v1.0.0", "sha256:aaa")]);
    let warehouses = vec![warehouse("web", &[REPO])];
    let freights = vec![
        freight("f-v1", "web", 10, &[(REPO, "v1.0.0", "sha256:aaa")]),
        freight("f-v2", "web", 11, &[(REPO, "v2.0.0", "sha256:bbb")]),
    ];
    (stage, warehouses, freights)
}

#[test]
fn equal_tags_are_a_no_op() {
    let (stage, warehouses, freights) = standard();
    assert_eq!(
        decide_with(
            &app(&["ghcr.io/example/web:v1.0.0"]),
            &stage,
            &warehouses,
            &freights,
            &[]
        ),
        Decision::NoDrift
    );
}

#[test]
fn drift_with_a_matching_freight_promotes_it() {
    let (stage, warehouses, freights) = standard();
    match decide_with(
        &app(&["ghcr.io/example/web:v2.0.0", "docker.io/istio/proxy:1.2"]),
        &stage,
        &warehouses,
        &freights,
        &[],
    ) {
        Decision::Promote { freight, drifted } => {
            assert_eq!(freight, "f-v2");
            assert_eq!(drifted.len(), 1, "unsubscribed repositories are not drift");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn drift_without_freight_is_freight_missing() {
    let (stage, warehouses, freights) = standard();
    assert!(matches!(
        decide_with(
            &app(&["ghcr.io/example/web:v9.9.9"]),
            &stage,
            &warehouses,
            &freights,
            &[]
        ),
        Decision::FreightMissing { .. }
    ));
}

#[test]
fn two_versions_at_once_or_nothing_running_is_not_drift() {
    let (stage, warehouses, freights) = standard();
    assert!(
        matches!(decide_with(&app(&["ghcr.io/example/web:v1.0.0", "ghcr.io/example/web:v2.0.0"]), &stage, &warehouses, &freights, &[]), Decision::Wait(w) if w.contains("rollout"))
    );
    assert!(
        matches!(decide_with(&app(&[]), &stage, &warehouses, &freights, &[]), Decision::Wait(w) if w.contains("scaled to zero"))
    );
}

#[test]
fn a_promotion_in_flight_blocks_another_even_with_an_empty_phase() {
    let (stage, warehouses, freights) = standard();
    for phase in ["", "Pending", "Running"] {
        let promotions = vec![promotion("p1", "f-v2", phase, false)];
        assert!(
            matches!(
                decide_with(
                    &app(&["ghcr.io/example/web:v2.0.0"]),
                    &stage,
                    &warehouses,
                    &freights,
                    &promotions
                ),
                Decision::Wait(_)
            ),
            "{phase:?}"
        );
    }
}

#[test]
fn a_finished_promotion_the_stage_has_not_recorded_yet_is_waited_for() {
    let (mut stage, warehouses, freights) = standard();
    let finished = vec![promotion("prod.01a.f-v2", "f-v2", "Succeeded", true)];
    assert!(
        matches!(decide_with(&app(&["ghcr.io/example/web:v2.0.0"]), &stage, &warehouses, &freights, &finished), Decision::Wait(w) if w.contains("not recorded"))
    );
    stage["status"]["lastPromotion"] = json!({"name": "prod.01a.f-v2"});
    // Recorded: the Stage's history is authoritative again (here it still says v1: drift).
    assert!(matches!(
        decide_with(
            &app(&["ghcr.io/example/web:v2.0.0"]),
            &stage,
            &warehouses,
            &freights,
            &finished
        ),
        Decision::Promote { .. }
    ));
}

#[test]
fn a_failed_observer_promotion_is_not_retried_until_deleted() {
    let (mut stage, warehouses, freights) = standard();
    stage["status"]["lastPromotion"] = json!({"name": "p1"});
    let failed = vec![promotion("p1", "f-v2", "Failed", true)];
    assert_eq!(
        decide_with(
            &app(&["ghcr.io/example/web:v2.0.0"]),
            &stage,
            &warehouses,
            &freights,
            &failed
        ),
        Decision::AlreadyFailed {
            freight: "f-v2".into(),
            promotion: "p1".into()
        }
    );
    // Someone else's failed Promotion does not stop the observer.
    let theirs = vec![promotion("p1", "f-v2", "Failed", false)];
    // (the Stage recorded p1 as its last Promotion above)
    assert!(matches!(
        decide_with(
            &app(&["ghcr.io/example/web:v2.0.0"]),
            &stage,
            &warehouses,
            &freights,
            &theirs
        ),
        Decision::Promote { .. }
    ));
}

#[test]
fn digests_and_normalised_names_match() {
    let stage = stage(
        &["web"],
        &[("docker.io/library/nginx", "1.25", "sha256:old")],
    );
    let warehouses = vec![warehouse("web", &["nginx"])];
    let freights = vec![freight(
        "f-new",
        "web",
        5,
        &[("docker.io/library/nginx", "1.26", "sha256:new")],
    )];
    assert_eq!(
        decide_with(&app(&["nginx:1.25"]), &stage, &warehouses, &freights, &[]),
        Decision::NoDrift
    );
    assert!(
        matches!(decide_with(&app(&["nginx@sha256:new"]), &stage, &warehouses, &freights, &[]), Decision::Promote { freight, .. } if freight == "f-new")
    );
}

#[test]
fn several_origins_drifting_converge_one_promotion_at_a_time() {
    let stage = stage(
        &["api", "web"],
        &[(REPO, "v1.0.0", ""), ("ghcr.io/example/api", "v1", "")],
    );
    let warehouses = vec![
        warehouse("web", &[REPO]),
        warehouse("api", &["ghcr.io/example/api"]),
    ];
    let freights = vec![
        freight("f-api", "api", 1, &[("ghcr.io/example/api", "v2", "")]),
        freight("f-web", "web", 2, &[(REPO, "v2.0.0", "")]),
    ];
    let decision = decide_with(
        &app(&["ghcr.io/example/api:v2", "ghcr.io/example/web:v2.0.0"]),
        &stage,
        &warehouses,
        &freights,
        &[],
    );
    assert!(
        matches!(decision, Decision::Promote { ref freight, .. } if freight == "f-api"),
        "{decision:?}"
    );
}

#[test]
fn the_promotion_carries_the_seeds_labels_and_generate_name() {
    let stage = json!({"metadata": {"name": "prod"}, "spec": {
        "vars": [{"name": "a", "value": "1"}],
        "promotionTemplate": {"spec": {
            "vars": [{"name": "b", "value": "2"}],
            "steps": [{"uses": "argocd-update", "config": {"apps": [{"name": "web"}]}}]}}}});
    let p = promotion_for("kargo-demo", &stage, "f-v2").unwrap();
    assert_eq!(p["metadata"]["generateName"], "prod-observer-");
    assert_eq!(p["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(p["metadata"]["labels"][STAGE_LABEL], "prod");
    assert_eq!(p["metadata"]["labels"][FREIGHT_LABEL], "f-v2");
    // The steps and vars Kargo's webhook would fill: the CRD requires the steps.
    assert_eq!(
        p["spec"],
        json!({"stage": "prod", "freight": "f-v2",
            "steps": [{"uses": "argocd-update", "config": {"apps": [{"name": "web"}]}}],
            "vars": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]})
    );
}

#[test]
fn a_stage_without_steps_gets_no_promotion() {
    for stage in [
        json!({"metadata": {"name": "prod"}, "spec": {}}),
        json!({"metadata": {"name": "prod"}, "spec": {"promotionTemplate": {"spec": {"steps": []}}}}),
    ] {
        let error = promotion_for("kargo-demo", &stage, "f-v2").unwrap_err();
        assert_eq!(
            error,
            "Stage \"prod\" in namespace \"kargo-demo\" defines no promotion steps"
        );
    }
}

fn tag() -> impl Strategy<Value = String> {
    "v[0-3]\\.[0-3]\\.[0-3]".prop_map(|s| s)
}

proptest! {
    #[test]
    fn equal_tags_never_promote(current in tag(), others in prop::collection::vec(tag(), 0..4)) {
        let stage = stage(&["web"], &[(REPO, &current, "")]);
        let warehouses = vec![warehouse("web", &[REPO])];
        let freights: Vec<Value> = others.iter().enumerate().map(|(i, t)| freight(&format!("f{i}"), "web", i as u64, &[(REPO, t, "")])).collect();
        let decision = decide_with(&app(&[&format!("{REPO}:{current}")]), &stage, &warehouses, &freights, &[]);
        prop_assert_eq!(decision, Decision::NoDrift);
    }

    #[test]
    fn never_a_second_while_one_is_in_flight(deployed in tag(), phase in prop::sample::select(vec!["", "Pending", "Running"]), tags in prop::collection::vec(tag(), 1..4)) {
        let stage = stage(&["web"], &[(REPO, "v9.9.9", "")]);
        let warehouses = vec![warehouse("web", &[REPO])];
        let freights: Vec<Value> = tags.iter().enumerate().map(|(i, t)| freight(&format!("f{i}"), "web", i as u64, &[(REPO, t, "")])).collect();
        let promotions = vec![promotion("p", "f0", phase, true)];
        let decision = decide_with(&app(&[&format!("{REPO}:{deployed}")]), &stage, &warehouses, &freights, &promotions);
        prop_assert!(!matches!(decision, Decision::Promote { .. }), "{:?}", decision);
    }

    #[test]
    fn never_again_for_a_freight_that_failed(deployed in tag(), failed_phase in prop::sample::select(vec!["Failed", "Errored", "Aborted"])) {
        let stage = stage(&["web"], &[(REPO, "v9.9.9", "")]);
        let warehouses = vec![warehouse("web", &[REPO])];
        let freights = vec![freight("f-deployed", "web", 1, &[(REPO, &deployed, "")])];
        let mut stage = stage;
        stage["status"]["lastPromotion"] = json!({"name": "p"});
        let promotions = vec![promotion("p", "f-deployed", failed_phase, true)];
        let decision = decide_with(&app(&[&format!("{REPO}:{deployed}")]), &stage, &warehouses, &freights, &promotions);
        prop_assert!(!matches!(decision, Decision::Promote { .. }), "{:?}", decision);
    }
}

/// An object as the cache holds it, given back in its Kubernetes shape for the decision.
fn through_cache<K: projection::Kind>(full: &Value) -> Value {
    let object: projection::Cached<K> = serde_json::from_value(full.clone()).unwrap();
    object.expand()
}

/// What the API server adds that the decision never reads.
fn with_noise(mut object: Value) -> Value {
    let metadata = object["metadata"].as_object_mut().unwrap();
    metadata.insert("uid".into(), json!("0b7c"));
    metadata.insert("managedFields".into(), json!([{"manager": "kubectl"}]));
    metadata.insert("finalizers".into(), json!(["x"]));
    for (map, key, value) in [
        ("labels", "team", "platform"),
        ("annotations", "note", "hello"),
    ] {
        metadata
            .entry(map)
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap()
            .insert(key.into(), json!(value));
    }
    object["status"]["observedGeneration"] = json!(3);
    object
}

proptest! {
    /// The observer decides on projected caches: whatever the objects hold, the decision (and
    /// whether the Application is observed at all) is the one the full objects give.
    #[test]
    fn the_cache_keeps_everything_the_decision_reads(
        // Few tags, so that several Freight match and the guards meet the Promotions.
        deployed in "v[0-2]",
        current in "v[0-2]",
        freights in prop::collection::vec(("v[0-2]", 0u64..20), 0..4),
        promotions in prop::collection::vec((prop::sample::select(vec!["", "Running", "Succeeded", "Failed", "Errored"]), any::<bool>(), 0usize..3), 0..3),
        last_promoted in any::<bool>(),
        ignored in any::<bool>(),
        opted_in in any::<bool>(),
    ) {
        let mut app = app(&[&format!("{REPO}:{deployed}")]);
        if ignored {
            app["metadata"]["annotations"][IGNORE_ANNOTATION] = json!("true");
        }
        if opted_in {
            app["metadata"]["annotations"][OBSERVE_ANNOTATION] = json!("true");
        }
        let mut stage = stage(&["web"], &[(REPO, &current, "")]);
        if last_promoted && !promotions.is_empty() {
            // The Stage recorded the newest Promotion.
            stage["status"]["lastPromotion"] = json!({"name": format!("p{}", promotions.len() - 1)});
        }
        let warehouses = vec![warehouse("web", &[REPO])];
        let freights: Vec<Value> = freights
            .iter()
            .enumerate()
            .map(|(i, (t, rv))| freight(&format!("f{i}"), "web", *rv, &[(REPO, t, "")]))
            .collect();
        let promotions: Vec<Value> = promotions
            .iter()
            .enumerate()
            .map(|(i, (phase, ours, f))| promotion(&format!("p{i}"), &format!("f{f}"), phase, *ours))
            .collect();
        let noisy = |objects: &[Value]| objects.iter().cloned().map(with_noise).collect::<Vec<_>>();
        let (app, stage) = (with_noise(app), with_noise(stage));
        let (warehouses, freights, promotions) = (noisy(&warehouses), noisy(&freights), noisy(&promotions));
        fn cached<K: projection::Kind>(objects: &[Value]) -> Vec<Value> {
            objects.iter().map(through_cache::<K>).collect()
        }
        let cached_app = through_cache::<projection::Application>(&app);
        for mode in [ObserveMode::OptOut, ObserveMode::OptIn] {
            prop_assert_eq!(observed_stages(&app, mode), observed_stages(&cached_app, mode));
        }
        prop_assert_eq!(
            decide_with(&app, &stage, &warehouses, &freights, &promotions),
            decide_with(
                &cached_app,
                &through_cache::<projection::Stage>(&stage),
                &cached::<projection::Warehouse>(&warehouses),
                &cached::<projection::Freight>(&freights),
                &cached::<projection::Promotion>(&promotions),
            )
        );
    }
}
