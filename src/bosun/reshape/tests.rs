//! Tests of `reshape`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;
use crate::bosun::applier::Rewrite;
use crate::gate::rules::DroppedServedVersion;
use crate::render::Rendering;

#[test]
fn a_swap_whose_destination_schema_cannot_be_found_is_a_loss_not_a_pass() {
    let swap = crate::bosun::swap::test_swap("a.yaml");
    let plan = BTreeMap::from([("a.yaml".to_string(), vec![swap])]);
    let rewrite = Rewrite {
        path: "a.yaml".into(),
        before: String::new(),
        after: "apiVersion: e.io/v1\nkind: E\nmetadata: {name: a}\n".into(),
    };
    let dropped = DroppedServedVersion {
        crd: "es.e.io".into(),
        group: "e.io".into(),
        kind: "E".into(),
        dropped: vec!["v1beta1".into()],
        served: vec!["v1".into()],
        storage: "v1".into(),
        clusters: vec![],
        consumers: vec![],
    };
    // A rendering without the CRD (say, only another cluster's older chart renders it).
    let rendering = Rendering {
        revision: "r".into(),
        applications: vec![],
        diagnostics: vec![],
        stats: Default::default(),
    };
    let losses = reshape_losses(&[rewrite], &plan, &[dropped], &rendering);
    assert!(
        matches!(losses.as_slice(), [(_, Loss::Unverifiable(why))] if why.contains("no CustomResourceDefinition at the head serves e.io/v1")),
        "{losses:?}"
    );
}

fn crd() -> Value {
    json!({"spec": {"versions": [
        {"name": "v1beta1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}},
        {"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "refreshInterval": {"type": "string"},
            "target": {"type": "object", "properties": {"name": {"type": "string"}, "creationPolicy": {"type": "string", "enum": ["Owner", "Orphan"]}}}}}}}}}
    ]}})
}

#[test]
fn a_field_the_new_schema_drops_is_a_loss_with_its_value() {
    let object = json!({"apiVersion": "e.io/v1", "kind": "E", "metadata": {"name": "a"},
            "spec": {"refreshInterval": "1h", "target": {"name": "t", "template": {"type": "Opaque"}}}});
    assert_eq!(
        losses(&object, &crd(), "v1"),
        [Loss::Pruned(
            "spec.target.template".into(),
            "{\"type\":\"Opaque\"}".into()
        )]
    );
}

#[test]
fn a_value_the_new_schema_refuses_is_a_loss_and_a_clean_document_has_none() {
    let refused = json!({"spec": {"target": {"creationPolicy": "Merge"}}});
    assert!(
        matches!(losses(&refused, &crd(), "v1").as_slice(), [Loss::Rejected(m)] if m.contains("creationPolicy"))
    );
    let clean = json!({"spec": {"refreshInterval": "1h", "target": {"name": "t"}}});
    assert!(losses(&clean, &crd(), "v1").is_empty());
    // No schema for the destination: not checkable, so not clean.
    assert!(matches!(
        losses(&clean, &crd(), "v2").as_slice(),
        [Loss::Unverifiable(_)]
    ));
}

fn original() -> Value {
    json!({"apiVersion": "e.io/v1", "kind": "E", "metadata": {"name": "a", "namespace": "n"},
            "spec": {"refreshInterval": "1h", "target": {"name": "t", "template": {"type": "Opaque"}}}})
}

fn reply(spec: Value) -> Value {
    let mut document = original();
    document["spec"] = spec;
    json!({"document": document})
}

#[test]
fn a_proposal_that_drops_only_what_the_schema_prunes_is_accepted_and_lists_it() {
    let accepted = check_proposal(
        &original(),
        &reply(json!({"refreshInterval": "1h", "target": {"name": "t"}})),
        &crd(),
        "v1beta1",
        "v1",
    )
    .unwrap();
    assert_eq!(
        accepted.dropped,
        [("spec.target.template.type".to_string(), json!("Opaque"))]
    );
    assert!(
        accepted.yaml.starts_with("apiVersion: e.io/v1\n"),
        "{}",
        accepted.yaml
    );
}

#[test]
fn each_rule_refuses_on_its_own() {
    let refused = |r: Value| {
        check_proposal(&original(), &r, &crd(), "v1beta1", "v1")
            .unwrap_err()
            .rule
    };
    assert_eq!(
        refused(json!({"document": "apiVersion: e.io/v1"})),
        rule::SHAPE
    );
    let mut renamed = reply(json!({"refreshInterval": "1h", "target": {"name": "t"}}));
    renamed["document"]["metadata"]["namespace"] = json!("other");
    assert_eq!(refused(renamed), rule::IDENTITY);
    assert_eq!(
        refused(reply(
            json!({"refreshInterval": "1h", "target": {"name": "t", "extra": 1}})
        )),
        rule::SCHEMA
    );
    assert_eq!(
        refused(reply(
            json!({"refreshInterval": "1h", "target": {"name": "t", "creationPolicy": "Merge"}})
        )),
        rule::SCHEMA
    );
    // A silently dropped key the destination keeps.
    assert_eq!(refused(reply(json!({"target": {"name": "t"}}))), rule::KEPT);
    // A changed value.
    assert_eq!(
        refused(reply(
            json!({"refreshInterval": "2h", "target": {"name": "t"}})
        )),
        rule::KEPT
    );
    // An invented value.
    assert_eq!(
        refused(reply(
            json!({"refreshInterval": "1h", "target": {"name": "t", "creationPolicy": "Owner"}})
        )),
        rule::ACCOUNTED
    );
    // The displaced value, moved where the schema declares a field, is accepted.
    let accepted = check_proposal(
        &original(),
        &reply(
            json!({"refreshInterval": "1h", "target": {"name": "t", "creationPolicy": "Orphan"}}),
        ),
        &json!({"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "refreshInterval": {"type": "string"},
                "target": {"type": "object", "properties": {"name": {"type": "string"}, "creationPolicy": {"type": "string"}}}}}}}}}]}}),
        "v1beta1",
        "v1",
    );
    assert_eq!(
        accepted.unwrap_err().rule,
        rule::ACCOUNTED,
        "Orphan was never in the original"
    );
}

fn open_crd() -> Value {
    json!({"spec": {"versions": [{"name": "v2", "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "chart": {"type": "string"},
            "values": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "ports": {"type": "array", "items": {"type": "object", "properties": {
                "port": {"type": "integer", "default": 80}, "protocol": {"type": "string", "default": "TCP"}}}},
            "exposure": {"type": "object", "properties": {"public": {"type": "boolean", "default": true}}},
            "selector": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}}]}})
}

fn open_original() -> Value {
    json!({"apiVersion": "e.io/v2", "kind": "R", "metadata": {"name": "r"},
            "spec": {"chart": "web", "legacy": "x", "oldOptions": {}, "ports": [{"port": 8443}],
                "values": {"securityContext": {"runAsNonRoot": true}, "ingress.enabled": true}}})
}

fn open_reply(spec: Value) -> Value {
    let mut document = open_original();
    document["spec"] = spec;
    json!({"document": document})
}

#[test]
fn the_crds_cel_rules_are_evaluated_and_a_rule_that_cannot_run_refuses() {
    let crd = |rule: &str| {
        json!({"spec": {"versions": [{"name": "v2", "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object",
                    "x-kubernetes-validations": [{"rule": rule, "message": "min above max"}],
                    "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}}}}}}]}})
    };
    let doc = |min: i64, max: i64| {
        json!({"apiVersion": "e.io/v2", "kind": "K", "metadata": {"name": "n"},
                "spec": {"min": min, "max": max}})
    };
    let reply = |d: Value| json!({"document": d});
    let rule = "self.min <= self.max";
    assert!(check_proposal(&doc(1, 2), &reply(doc(1, 2)), &crd(rule), "v1", "v2").is_ok());
    let refused =
        check_proposal(&doc(3, 2), &reply(doc(3, 2)), &crd(rule), "v1", "v2").unwrap_err();
    assert_eq!(refused.rule, rule::SCHEMA);
    assert!(
        refused.detail.contains("min above max"),
        "{}",
        refused.detail
    );
    let transition = "self.min == oldSelf.min";
    let refused =
        check_proposal(&doc(1, 2), &reply(doc(1, 2)), &crd(transition), "v1", "v2").unwrap_err();
    assert_eq!(refused.rule, rule::SCHEMA);
    assert!(
        refused.detail.contains("cannot be evaluated"),
        "{}",
        refused.detail
    );
}

#[test]
fn keys_holding_dots_are_paths_of_their_own() {
    let refused = |spec: Value| {
        check_proposal(&open_original(), &open_reply(spec), &open_crd(), "v1", "v2")
            .unwrap_err()
            .rule
    };
    let good = json!({"chart": "web", "ports": [{"port": 8443}],
            "values": {"securityContext": {"runAsNonRoot": true}, "ingress.enabled": true}});
    assert!(check_proposal(&open_original(), &open_reply(good), &open_crd(), "v1", "v2").is_ok());
    // A kept setting flattened into an inert key.
    assert_eq!(
        refused(json!({"chart": "web", "ports": [{"port": 8443}],
                "values": {"securityContext.runAsNonRoot": true, "ingress.enabled": true}})),
        rule::KEPT
    );
    // An inert key turned into a live setting.
    assert_eq!(
        refused(json!({"chart": "web", "ports": [{"port": 8443}],
                "values": {"securityContext": {"runAsNonRoot": true}, "ingress": {"enabled": true}}})),
        rule::KEPT
    );
    // A kept value copied under a second key.
    assert_eq!(
        refused(json!({"chart": "web", "ports": [{"port": 8443}],
                "values": {"securityContext": {"runAsNonRoot": true}, "ingress.enabled": true, "admin": {"enabled": true}}})),
        rule::ACCOUNTED
    );
}

#[test]
fn defaults_never_invent_a_parent_and_empty_values_never_move() {
    let refused = |spec: Value| {
        check_proposal(&open_original(), &open_reply(spec), &open_crd(), "v1", "v2")
            .unwrap_err()
            .rule
    };
    let values = json!({"securityContext": {"runAsNonRoot": true}, "ingress.enabled": true});
    // A new list item made of defaults: a new open port.
    assert_eq!(
        refused(json!({"chart": "web", "ports": [{"port": 8443}, {"port": 80}], "values": values})),
        rule::ACCOUNTED
    );
    // A new optional object made of its default.
    assert_eq!(
        refused(
            json!({"chart": "web", "ports": [{"port": 8443}], "values": values, "exposure": {"public": true}})
        ),
        rule::ACCOUNTED
    );
    // A default under a parent the original has is what the apiserver writes anyway.
    assert!(check_proposal(
            &open_original(),
            &open_reply(json!({"chart": "web", "ports": [{"port": 8443, "protocol": "TCP"}], "values": values})),
            &open_crd(),
            "v1",
            "v2"
        )
        .is_ok());
    // A pruned empty object placed as a selector (which would select everything).
    assert_eq!(
        refused(
            json!({"chart": "web", "ports": [{"port": 8443}], "values": values, "selector": {}})
        ),
        rule::ACCOUNTED
    );
}

#[test]
fn a_secret_inside_a_lost_value_is_redacted_in_the_prompt() {
    let losses = vec![Loss::Pruned(
        "spec.manifest".into(),
        json!({"apiVersion": "v1", "kind": "Secret", "stringData": {"password": "canary-123"}})
            .to_string(),
    )];
    let (text, _) = prompt(
        &original(),
        &json!({"type": "object"}),
        None,
        &losses,
        &Default::default(),
    );
    assert!(!text.contains("canary-123"), "{text}");
}

#[test]
fn a_document_is_replaced_with_its_comments_around_it_and_hazards_are_refused() {
    let object = json!({"apiVersion": "e.io/v1", "kind": "E", "metadata": {"name": "a"}});
    let text = "# header\napiVersion: e.io/v1\nkind: E\nmetadata: {name: a}\nspec: {x: 1}\n# about b\n--- {apiVersion: e.io/v1, kind: E, metadata: {name: b}}\n";
    let out = replace_document(
        text,
        &object,
        "apiVersion: e.io/v1\nkind: E\nmetadata:\n  name: a\n",
    )
    .unwrap();
    assert_eq!(
        out,
        "# header\napiVersion: e.io/v1\nkind: E\nmetadata:\n  name: a\n# about b\n--- {apiVersion: e.io/v1, kind: E, metadata: {name: b}}\n"
    );
    // A flow document on its marker line: the marker is kept alone.
    let object_b = json!({"apiVersion": "e.io/v1", "kind": "E", "metadata": {"name": "b"}});
    let out = replace_document(
        text,
        &object_b,
        "apiVersion: e.io/v1\nkind: E\nmetadata:\n  name: b\n",
    )
    .unwrap();
    assert!(
        out.ends_with("# about b\n---\napiVersion: e.io/v1\nkind: E\nmetadata:\n  name: b\n"),
        "{out}"
    );
    assert!(crate::yaml::parse_documents(&out, "t").is_ok());
    // Keys and values Kubernetes reads differently.
    for hazard in [
        "spec: {y: 1}",
        "spec: {on: 1}",
        "spec: {0755: a}",
        "spec: {x: yEs}",
    ] {
        let text = format!("apiVersion: e.io/v1\nkind: E\nmetadata: {{name: a}}\n{hazard}\n");
        assert!(
            replace_document(&text, &object, "x: 1\n").is_err(),
            "{hazard}"
        );
    }
    let fine = "apiVersion: e.io/v1\nkind: E\nmetadata: {name: a}\nspec: {x: yes, 'y': 1}\n";
    // A quoted `y` is refused too (the reader cannot tell it was quoted): conservative.
    assert!(replace_document(fine, &object, "x: 1\n").is_err());
}
