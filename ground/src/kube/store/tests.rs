//! Tests of `store`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::kube::store::admission::User;
use crate::kube::store::patch::PatchBody;
use crate::kube::store::selectors::Selector;
use crate::kube::store::{Following, Store, rfc3339};

#[test]
fn an_applied_field_another_manager_owns_conflicts_until_released() {
    // kube-lease-manager's mutual exclusion: two replicas apply holderIdentity.
    let mut store = Store::new();
    let leases = store
        .resource("coordination.k8s.io", "v1", "leases")
        .cloned()
        .unwrap();
    let admin = User {
        name: "admin".into(),
        groups: vec!["system:masters".into()],
    };
    let apply = |holder: &str, force: bool| PatchBody::Apply {
        object: json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "l"}, "spec": {"holderIdentity": holder}}),
        manager: format!("m-{holder}"),
        force,
    };
    let namespaces = store.resource("", "v1", "namespaces").cloned().unwrap();
    store
        .create(&namespaces, "", json!({"metadata": {"name": "ns"}}), &admin)
        .unwrap();
    let patch = |store: &mut Store, body| store.patch(&leases, "ns", "l", body, &admin, false);
    patch(&mut store, apply("a", false)).unwrap();
    // The same manager may change its own field; another may not, unless forced.
    patch(&mut store, apply("a", false)).unwrap();
    let refused = patch(&mut store, apply("b", false)).unwrap_err();
    assert_eq!((refused.code, refused.reason.as_str()), (409, "Conflict"));
    assert!(
        refused
            .message
            .contains("conflict with \"m-a\": .spec.holderIdentity"),
        "{}",
        refused.message
    );
    // A release (a merge patch removing the field) frees it for the next applier.
    patch(
        &mut store,
        PatchBody::Merge(json!({"spec": {"holderIdentity": null}})),
    )
    .unwrap();
    patch(&mut store, apply("b", false)).unwrap();
    assert!(patch(&mut store, apply("a", false)).is_err());
    let forced = patch(&mut store, apply("a", true)).unwrap();
    assert_eq!(forced["spec"]["holderIdentity"], "a");
}

#[test]
fn selectors_parse_and_match() {
    let s = Selector::parse("app=web,tier in (a, b),!legacy,env!=dev,team").unwrap();
    let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "b"), ("team", "x")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert!(s.matches(&labels));
    let mut other = labels.clone();
    other.insert("legacy".into(), "1".into());
    assert!(!s.matches(&other));
    assert!(
        Selector::parse("a notin (x)")
            .unwrap()
            .matches(&BTreeMap::new())
    );
}

#[test]
fn timestamps() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_767_225_600), "2026-01-01T00:00:00Z");
}

#[test]
fn list_pages_walk_one_resource_from_the_token_and_count_what_follows() {
    let mut store = Store::new();
    let admin = User {
        name: "admin".into(),
        groups: vec!["system:masters".into()],
    };
    let resource = |store: &Store, group: &str, plural: &str| {
        store.resource(group, "v1", plural).cloned().unwrap()
    };
    let (namespaces, configmaps, secrets) = (
        resource(&store, "", "namespaces"),
        resource(&store, "", "configmaps"),
        resource(&store, "", "secrets"),
    );
    for ns in ["a", "b"] {
        store
            .create(&namespaces, "", json!({"metadata": {"name": ns}}), &admin)
            .unwrap();
        for i in 0..7 {
            let labels = json!({"odd": (i % 2).to_string()});
            for r in [&configmaps, &secrets] {
                store
                    .create(
                        r,
                        ns,
                        json!({"metadata": {"name": format!("o{i}"), "labels": labels}}),
                        &admin,
                    )
                    .unwrap();
            }
        }
    }
    let none = Selector::default();
    let odd = Selector::parse("odd=1").unwrap();
    let name = |o: &Value| {
        format!(
            "{}/{}",
            o["metadata"]["namespace"].as_str().unwrap(),
            o["metadata"]["name"].as_str().unwrap()
        )
    };
    for (namespace, labels) in [("", &none), ("b", &none), ("", &odd), ("a", &odd)] {
        let whole: Vec<String> = store
            .list(&configmaps, namespace, labels, &none)
            .iter()
            .map(name)
            .collect();
        let mut walked = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let after = token.as_deref().map(|t| t.split_once('/').unwrap());
            let (page, following) = store
                .list_page(&configmaps, namespace, labels, &none, after, 3)
                .unwrap();
            assert!(page.len() <= 3);
            assert!(page.iter().all(|o| o["kind"] != "Secret"));
            walked.extend(page.iter().map(name));
            let remaining = whole.len() - walked.len();
            // Counted without a selector only, as the real API server does.
            let count = labels.is_empty().then_some(remaining);
            assert_eq!(
                following,
                Following {
                    more: remaining > 0,
                    count
                },
                "{namespace} {walked:?}"
            );
            if remaining == 0 {
                break;
            }
            token = walked.last().cloned();
        }
        assert_eq!(walked, whole);
    }
    // A token naming no object the list holds has expired.
    for (namespace, labels, token) in [
        ("", &none, ("a", "gone")),
        ("b", &none, ("a", "o1")),
        ("", &odd, ("a", "o2")),
    ] {
        assert!(
            store
                .list_page(&configmaps, namespace, labels, &none, Some(token), 3)
                .is_none()
        );
    }
}
