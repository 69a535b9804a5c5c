//! Tests of `mechanical`.

use super::*;

fn fix(prod_us: &str, shared: &[&str]) -> Fix {
    let change = |key: &[&str], old: Option<Value>, new: Value| ChangedDefault {
        chart: "c".into(),
        from: "1.0.0".into(),
        to: "1.1.0".into(),
        key: key.iter().map(|k| k.to_string()).collect(),
        old,
        new: Some(new),
    };
    let app = AppInputs {
        values_files: vec![
            (
                "base.yaml".into(),
                "image:\n  tag: v1.0.0\nauth:\n  token: t0p\n".into(),
            ),
            ("prod-us.yaml".into(), prod_us.into()),
        ],
        defaults: vec![
            change(&["serviceMonitor", "enabled"], None, json!(true)),
            change(&["image", "tag"], Some(json!("v1.0.0")), json!("v1.1.0")),
            change(&["rbac", "create"], Some(json!(false)), json!(true)),
            change(
                &["db", "password"],
                Some(json!("hunter-old")),
                json!("hunter-new"),
            ),
        ],
    };
    let not_served = vec![NotServed {
        api_version: "monitoring.coreos.com/v1".into(),
        kind: "ServiceMonitor".into(),
        namespace: "n".into(),
        name: "c".into(),
        applications: vec!["argocd/c on prod-us".into()],
        more_applications: 0,
    }];
    let shared = shared.iter().map(|s| s.to_string()).collect();
    build(
        &not_served,
        &[app],
        &[],
        &shared,
        "c 1.0.0 → 1.1.0; image v1.0.0 → v1.1.0",
    )
    .unwrap()
}

fn edit(file: &str, key: Value, value: Value) -> Value {
    json!({"classification": "chart-default", "edits": [{"file": file, "key": key, "value": value}]})
}

#[test]
fn the_inventory_holds_changed_defaults_with_the_values_they_may_take_never_credentials() {
    let fix = fix("# prod-us\nreplicas: 1\n", &["base.yaml"]);
    let keys: Vec<String> = fix
        .inventory
        .iter()
        .map(|e| format!("{}:{}={:?}", e.file, key_text(&e.key), e.allowed))
        .collect();
    assert_eq!(
        keys,
        [
            "prod-us.yaml:serviceMonitor.enabled=[Bool(false)]",
            "prod-us.yaml:image.tag=[String(\"v1.0.0\")]",
            "prod-us.yaml:rbac.create=[Bool(false)]",
        ]
    );
    let prompt = fix.request().prompt;
    assert!(
        !prompt.contains("t0p") && !prompt.contains("hunter"),
        "{prompt}"
    );
    assert!(fix.suggestion().unwrap().contains("serviceMonitor.enabled"));
}

#[test]
fn only_the_allowed_value_lands_on_its_own_line_and_a_drifted_file_is_refused() {
    let fix = fix("# prod-us\nreplicas: 1\n", &["base.yaml"]);
    let edits = check_reply(
        &fix,
        &edit(
            "prod-us.yaml",
            json!(["serviceMonitor", "enabled"]),
            json!(false),
        ),
    )
    .unwrap();
    let rewrites = rewrite(&fix, &edits).unwrap();
    assert_eq!(
        rewrites[0].after,
        "# prod-us\nreplicas: 1\nserviceMonitor:\n  enabled: false\n"
    );
    // Pinning a default back is allowed (the report names the version as a whole word);
    // anything else is refused, and so is a key no entry lists.
    assert!(
        check_reply(
            &fix,
            &edit("prod-us.yaml", json!(["image", "tag"]), json!("v1.0.0"))
        )
        .is_ok()
    );
    for (key, value) in [
        (json!(["image", "tag"]), json!("v1.0")),
        (json!(["image", "tag"]), json!(1.0)),
        (json!(["rbac", "create"]), json!(true)),
        (json!(["serviceMonitor", "enabled"]), json!("false")),
    ] {
        assert_eq!(
            check_reply(&fix, &edit("prod-us.yaml", key.clone(), value.clone()))
                .unwrap_err()
                .rule,
            rule::SOURCED,
            "{key} = {value}"
        );
    }
    assert_eq!(
        check_reply(
            &fix,
            &edit(
                "base.yaml",
                json!(["serviceMonitor", "enabled"]),
                json!(false)
            )
        )
        .unwrap_err()
        .rule,
        rule::INVENTORY
    );
    // The file changed after the inventory was made: from-value refuses.
    let mut drifted = fix.clone();
    drifted.files.insert(
        "prod-us.yaml".into(),
        "serviceMonitor:\n  enabled: true\n".into(),
    );
    assert_eq!(
        check_reply(
            &drifted,
            &edit(
                "prod-us.yaml",
                json!(["serviceMonitor", "enabled"]),
                json!(false)
            )
        )
        .unwrap_err()
        .rule,
        rule::FROM_VALUE
    );
}

#[test]
fn version_shapes() {
    let k = |s: &str| vec![Segment::Key(s.into())];
    assert!(version_shaped(&k("tag"), &json!("latest")));
    assert!(version_shaped(&k("x"), &json!("v1.2.3")));
    assert!(version_shaped(&k("x"), &json!("1.2")));
    assert!(version_shaped(&k("x"), &json!("sha256:abc")));
    assert!(!version_shaped(&k("x"), &json!("disabled")));
    assert!(!version_shaped(&k("tag"), &json!(1)));
}
