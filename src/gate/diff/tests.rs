//! Tests of `diff`.

use super::*;
use serde_json::json;

#[test]
fn field_paths() {
    let mut out = Vec::new();
    diff_values(
        "",
        &json!({"spec": {"containers": [{"image": "a:1"}], "x": 1}, "metadata": {"labels": {"app.kubernetes.io/name": "a"}}}),
        &json!({"spec": {"containers": [{"image": "a:2"}]}, "metadata": {"labels": {"app.kubernetes.io/name": "b"}}}),
        &mut out,
    );
    let paths: Vec<&str> = out.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "spec.containers[0].image",
            "spec.x",
            "metadata.labels[\"app.kubernetes.io/name\"]"
        ]
    );
}

#[test]
fn a_limited_diff_copies_only_the_first_changes_and_counts_the_rest() {
    let old = json!({"a": (0..500).map(|i| (format!("k{i}"), json!(i))).collect::<serde_json::Map<_, _>>()});
    let new = json!({"a": (0..500).map(|i| (format!("k{i}"), json!(i + 1))).collect::<serde_json::Map<_, _>>()});
    let (changes, more) = diff_values_limited(&old, &new, 200);
    assert_eq!((changes.len(), more), (200, 300));
    assert_eq!(changes[0].path, "a.k0");
}

#[test]
fn named_lists_compare_by_name() {
    let mut out = Vec::new();
    diff_values(
        "spec",
        &json!({"versions": [{"name": "v1beta1", "served": true}, {"name": "v1", "served": true}]}),
        &json!({"versions": [{"name": "v1", "served": true}]}),
        &mut out,
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].path, "spec.versions[name=v1beta1]");
    assert_eq!(out[0].new, None);
}

#[test]
fn secret_values_are_hidden() {
    let old = vec![Arc::new(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "YQ=="}}),
    )];
    let new = vec![Arc::new(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "Yg=="}}),
    )];
    let changed = diff_objects(&old, &new).changed;
    assert_eq!(changed[0].fields[0].path, "data.password");
    assert_eq!(changed[0].fields[0].new, Some(json!(REDACTED)));
    assert!(!serde_json::to_string(&changed).unwrap().contains("Yg=="));
}

#[test]
#[should_panic(expected = "the diff's counts disagree with its Applications")]
fn diff_counts_other_than_its_applications_stop() {
    let diff = RenderDiff {
        counts: DiffCounts {
            applications_added: 1,
            ..Default::default()
        },
        applications: Vec::new(),
    };
    diff.assert_consistent();
}

#[test]
#[should_panic(expected = "not sorted or one is listed twice")]
fn an_application_listed_twice_stops() {
    let app = AppDiff {
        app: AppKey {
            cluster: "c".into(),
            namespace: "argocd".into(),
            name: "a".into(),
        },
        status: AppStatus::Added,
        chart_moves: Vec::new(),
        objects: Default::default(),
        spec_changed: false,
        application_fields: Vec::new(),
        chart_only: None,
    };
    let diff = RenderDiff {
        counts: DiffCounts {
            applications_added: 2,
            ..Default::default()
        },
        applications: vec![app.clone(), app],
    };
    diff.assert_consistent();
}
