//! Tests of `controller`.

use super::*;

#[test]
fn kargos_webhook_refusals_count_as_refusals_not_api_failures() {
    let status = |code: u16, reason: &str, message: &str| {
        ReconcileError::Kube(kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "code": code, "reason": reason, "message": message
            }))
            .unwrap(),
        )))
    };
    // [K pkg/webhook/kubernetes/promotion/webhook.go]: no promote verb is an internal
    // error wrapping the Forbidden; unavailable Freight and a missing Stage are Invalid.
    assert_eq!(
            status(500, "InternalError", "admission webhook \"promotion.kargo.akuity.io\" denied the request: Internal error occurred: promotions.kargo.akuity.io \"p\" is forbidden: subject \"o\" is not permitted to create Promotions for Stage \"s\"").reason(),
            "promotion_refused"
        );
    assert_eq!(
        status(422, "Invalid", "Freight is not available to this Stage").reason(),
        "promotion_refused"
    );
    assert_eq!(
        status(500, "InternalError", "etcdserver: request timed out").reason(),
        "kube_api"
    );
}

fn app(name: &str, image: &str, health: &str) -> CachedApplication {
    CachedApplication::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "argocd", "uid": format!("uid-{name}")},
        "status": {"summary": {"images": [image]}, "health": {"status": health}}
    }))
    .unwrap()
}

fn apply(
    name: &str,
    image: &str,
    health: &str,
) -> Result<watcher::Event<CachedApplication>, watcher::Error> {
    Ok(watcher::Event::Apply(app(name, image, health)))
}

/// What `relevant_changes` passes on, as "name image".
async fn passed(
    events: Vec<Result<watcher::Event<CachedApplication>, watcher::Error>>,
) -> Vec<String> {
    relevant_changes(futures::stream::iter(events))
        .map(|r| {
            let o = r.unwrap();
            format!(
                "{} {}",
                o.name_any(),
                o.text(&["status", "summary", "images", "0"])
            )
        })
        .collect()
        .await
}

#[test]
fn a_stage_event_maps_to_applications_the_store_can_find() {
    let mut writer = reflector::store::Writer::default();
    let reader = writer.as_reader();
    let app = CachedApplication::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "argocd", "uid": "u1", "resourceVersion": "3",
            "annotations": {decision::AUTHORIZED_STAGE_ANNOTATION: "kargo-demo:prod"}}
    }))
    .unwrap();
    writer.apply_watcher_event(&watcher::Event::Apply(app));
    let refs = applications_for(&reader, "kargo-demo", Some("prod"));
    assert_eq!(refs.len(), 1);
    assert!(
        reader.get(&refs[0]).is_some(),
        "the controller would not find {:?}",
        refs[0]
    );
    // Store keys and queue entries carry no uid: it is kept once, in the cached object.
    assert_eq!(refs[0].extra.uid, None);
}

#[tokio::test]
async fn only_image_or_annotation_changes_wake_the_observer() {
    let events = vec![
        apply("a", "x:1", "Healthy"),
        apply("b", "y:1", "Healthy"),
        apply("a", "x:1", "Progressing"), // health churn: filtered
        apply("a", "x:2", "Progressing"), // a new image: passes
        apply("b", "y:1", "Healthy"),     // a resync of the same: filtered
    ];
    assert_eq!(passed(events).await, ["a x:1", "b y:1", "a x:2"]);
}

#[tokio::test]
async fn deleted_and_unlisted_applications_are_forgotten() {
    use watcher::Event::{Delete, Init, InitApply, InitDone};
    let events = vec![
        apply("a", "x:1", "Healthy"),
        apply("b", "y:1", "Healthy"),
        Ok(Delete(app("a", "x:1", "Healthy"))),
        apply("a", "x:1", "Healthy"), // forgotten when deleted: passes again
        // A re-list that no longer holds `a`, and `b` unchanged.
        Ok(Init),
        Ok(InitApply(app("b", "y:1", "Healthy"))), // unchanged: filtered
        Ok(InitApply(app("c", "z:1", "Healthy"))), // new: passes
        Ok(InitDone),
        apply("a", "x:1", "Healthy"), // not listed, so forgotten: passes again
        apply("b", "y:1", "Healthy"), // listed and unchanged: filtered
    ];
    assert_eq!(
        passed(events).await,
        ["a x:1", "b y:1", "a x:1", "c z:1", "a x:1"]
    );
}

#[test]
fn grouped_freight_follows_the_cache_and_keeps_its_order() {
    let mut writer = reflector::store::Writer::default();
    let reader = writer.as_reader();
    let grouped = Grouped::new(&["origin", "name"]);
    let freight = |namespace: &str, name: &str, origin: &str| {
        CachedFreight::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "origin": {"kind": "Warehouse", "name": origin}
        }))
        .unwrap()
    };
    let mut apply = |object: CachedFreight| {
        writer.apply_watcher_event(&watcher::Event::Apply(object));
        grouped
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    };
    for (ns, name, origin) in [
        ("demo", "f1", "w1"),
        ("demo", "f2", "w2"),
        ("other", "f3", "w1"),
        ("demo", "f4", "w1"),
    ] {
        apply(freight(ns, name, origin));
    }
    let names = |values: &[&str]| -> Vec<String> {
        let mut names: Vec<String> = grouped
            .select(&reader, "demo", values)
            .iter()
            .map(|f| f.name_any())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&["w1"]), ["f1", "f4"]);
    assert_eq!(names(&["w1", "w2", "w1"]), ["f1", "f2", "f4"]);
    assert!(names(&["w3"]).is_empty());
    // The union of groups is in the cache's order, as a scan of the cache would give it.
    let scanned: Vec<String> = reader
        .state()
        .iter()
        .filter(|f| f.namespace().as_deref() == Some("demo"))
        .map(|f| f.name_any())
        .collect();
    let selected: Vec<String> = grouped
        .select(&reader, "demo", &["w2", "w1"])
        .iter()
        .map(|f| f.name_any())
        .collect();
    assert_eq!(selected, scanned);
    // An event after a build is seen by the next select.
    apply(freight("demo", "f5", "w3"));
    assert_eq!(names(&["w3"]), ["f5"]);
}
