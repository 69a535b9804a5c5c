//! Tests of `migration`.

use proptest::prelude::*;
use serde_json::json;

use super::planning::values_of;
use super::values::{dictated, path_text, value_at};
use super::*;
use crate::render::source::{ChartLocation, ValuesFile as Place, ValuesInput};
use crate::yaml;

const ORIGINAL: &str = "# shared\ncrds:\n  # ship the CRD\n  enabled: true\n  # keep it\n  keep: true\nlogLevel: 2\nauth:\n  apiToken: hunter2\n";

fn schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "crds": {"type": "object", "additionalProperties": false,
                     "properties": {"install": {"type": "boolean"},
                                    "mode": {"enum": ["Always"]}}},
            "logLevel": {"type": "integer", "maximum": 6},
            "resources": {"type": "object"},
            "replicas": {"type": "integer", "default": 1}
        }
    })
}

fn migration(text: &str, schema: Value) -> Migration {
    let value = values_of(text.as_bytes(), "v.yaml").unwrap();
    let job = HelmJob {
        chart_label: "chart c version 2.0.0".into(),
        values: vec![ValuesInput {
            name: "$values/v.yaml".into(),
            content: text.as_bytes().to_vec(),
            file: Some(Place {
                repo_dir: "/repo".into(),
                commit: "c0".into(),
                path: "v.yaml".into(),
            }),
        }],
        ..HelmJob::of_chart(ChartLocation::Mirror("/nowhere/c/2.0.0".into()))
    };
    Migration {
        chart: "chart c version 2.0.0".into(),
        error: "values don't meet the specifications".into(),
        new_schema: schema,
        new_defaults: json!({"logLevel": 2, "resources": {}}),
        old_schema: None,
        files: vec![ValuesFile {
            path: "v.yaml".into(),
            text: text.into(),
            value,
            place: Place {
                repo_dir: "/repo".into(),
                commit: "c0".into(),
                path: "v.yaml".into(),
            },
        }],
        failures: vec![HelmFailure {
            application: "Application argocd/c".into(),
            cluster: "prod".into(),
            job,
            message: "values don't meet the specifications".into(),
        }],
        redaction: Default::default(),
    }
}

fn reply(values: Value) -> Value {
    json!({"files": [{"file": "v.yaml", "values": values}]})
}

fn good() -> Value {
    json!({"crds": {"install": true}, "logLevel": 2})
}

fn rule_of(m: &Migration, values: Value) -> Result<(), &'static str> {
    check_reply(m, &reply(values), &Default::default(), &[])
        .map(|_| ())
        .map_err(|r| r.rule)
}

#[test]
fn the_harness_accepts_a_move_and_a_drop_and_refuses_each_wrong_reply_by_its_rule() {
    let m = migration(ORIGINAL, schema());
    let accepted = check_reply(&m, &reply(good()), &Default::default(), &[]).unwrap();
    assert_eq!(
        accepted[0].moved,
        vec![("crds.enabled".into(), "crds.install".into(), json!(true))]
    );
    assert_eq!(
        accepted[0].dropped,
        vec![
            ("crds.keep".into(), json!(true)),
            ("auth.apiToken".into(), json!("hunter2"))
        ]
    );
    // Schema-dictated values: a default, a one-value enum.
    let mut dictated = good();
    dictated["replicas"] = json!(1);
    dictated["crds"]["mode"] = json!("Always");
    assert_eq!(rule_of(&m, dictated), Ok(()));
    // Invented, used twice, a declared value changed or dropped, a schema violation.
    let mut invented = good();
    invented["replicas"] = json!(3);
    assert_eq!(rule_of(&m, invented), Err(rule::ACCOUNTED));
    let mut twice = good();
    twice["resources"] = json!({"enabled": true});
    twice["crds"]["mode"] = json!("Always");
    let mut doubled = twice.clone();
    doubled["resources"] = json!({"a": true, "b": true});
    assert_eq!(rule_of(&m, doubled), Err(rule::ACCOUNTED));
    let mut changed = good();
    changed["logLevel"] = json!(3);
    assert_eq!(rule_of(&m, changed), Err(rule::KEPT));
    assert_eq!(
        rule_of(&m, json!({"crds": {"install": true}})),
        Err(rule::KEPT)
    );
    let mut kept_old = good();
    kept_old["crds"]["keep"] = json!(true);
    assert_eq!(rule_of(&m, kept_old), Err(rule::SCHEMA));
    // Shape: another file, a file twice, extra fields.
    let other = json!({"files": [{"file": "other.yaml", "values": good()}]});
    assert_eq!(
        check_reply(&m, &other, &Default::default(), &[])
            .map(|_| ())
            .unwrap_err()
            .rule,
        rule::SHAPE
    );
    let twice_file = json!({"files": [{"file": "v.yaml", "values": good()}, {"file": "v.yaml", "values": good()}]});
    assert_eq!(
        check_reply(&m, &twice_file, &Default::default(), &[])
            .map(|_| ())
            .unwrap_err()
            .rule,
        rule::SHAPE
    );
    let extra = json!({"files": [{"file": "v.yaml", "values": good()}], "note": "x"});
    assert_eq!(
        check_reply(&m, &extra, &Default::default(), &[])
            .map(|_| ())
            .unwrap_err()
            .rule,
        rule::SHAPE
    );
}

#[test]
fn sensitive_values_go_out_as_placeholders_and_come_back_only_where_they_were_moved() {
    let m = migration(ORIGINAL, schema());
    let (request, held) = m.request();
    assert!(!request.prompt.contains("hunter2"), "{}", request.prompt);
    assert!(request.prompt.contains("(redacted-1)"));
    assert_eq!(
        held.values().cloned().collect::<Vec<_>>(),
        vec![json!("hunter2")]
    );
    let mut quoted = migration(ORIGINAL, schema());
    quoted.error = "at '/auth/apiToken': 'hunter2' is not valid".into();
    let (request, _) = quoted.request();
    assert!(!request.prompt.contains("hunter2"), "{}", request.prompt);
    // A placeholder is the value itself once back: moved to a key that is no credential,
    // or to one the new schema does not name, it is refused; so is the refusal's text
    // free of the value.
    let mut misplaced = good();
    misplaced["resources"] = json!({"token": "(redacted-1)"});
    let refused = check_reply(&m, &reply(misplaced), &held, &[]).unwrap_err();
    assert_eq!(refused.rule, rule::ACCOUNTED);
    assert!(!refused.detail.contains("hunter2"), "{}", refused.detail);
    let mut as_tag = good();
    as_tag["crds"]["install"] = json!("(redacted-1)");
    let refused = check_reply(&m, &reply(as_tag), &held, &[]).unwrap_err();
    assert!(!refused.detail.contains("hunter2"), "{}", refused.detail);
    // An env list's `{name: DB_PASSWORD, value: ...}` and a numeric credential are held
    // back too.
    let listed = migration(
        "env:\n  - name: DB_PASSWORD\n    value: s3cr3t\nauth:\n  pin: 8374\n  password: 8374928\n",
        schema(),
    );
    let (request, held) = listed.request();
    assert!(!request.prompt.contains("s3cr3t") && !request.prompt.contains("8374928"));
    assert_eq!(
        held.values().cloned().collect::<Vec<_>>(),
        vec![json!("s3cr3t"), json!(8374), json!(8374928)]
    );
}

#[test]
fn a_required_key_nothing_supplies_is_found_before_any_call() {
    let mut s = schema();
    s["properties"]["crds"]["required"] = json!(["issuer", "install"]);
    s["properties"]["crds"]["properties"]["issuer"] = json!({"type": "string"});
    s["properties"]["crds"]["properties"]["install"]["default"] = json!(false);
    let m = migration(ORIGINAL, s.clone());
    assert_eq!(unsuppliable(&m), vec!["crds.issuer".to_string()]);
    let Step::Done(Err((handoff, _))) = decide(&[m], true, &[], &|_| Ok(())) else {
        panic!("expected the precheck's handoff");
    };
    assert!(
        handoff.fact.contains("no model was asked"),
        "{}",
        handoff.fact
    );
    // A key of that name in the old values can supply it (the model may move it).
    let m = migration("crds:\n  issuer: letsencrypt\n  enabled: true\n", s);
    assert!(unsuppliable(&m).is_empty());
}

#[test]
fn the_decision_asks_once_then_renders_then_writes_key_by_key() {
    let m = migration(ORIGINAL, schema());
    let migrations = [m];
    let Step::Ask(requests) = decide(&migrations, true, &[], &|_| Ok(())) else {
        panic!("expected a request");
    };
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].purpose, "values-migration");
    let replies = [Ok(Reply {
        value: reply(good()),
        usage: Default::default(),
    })];
    let Step::Done(Ok(prepared)) = decide(&migrations, true, &replies, &|_| Ok(())) else {
        panic!("expected a migration");
    };
    assert_eq!(
        prepared.rewrites[0].after,
        "# shared\ncrds:\n  # ship the CRD\n  install: true\n  # keep it\nlogLevel: 2\n"
    );
    assert!(prepared.lines[0].contains("removed `auth.apiToken` = (a sensitive value, not shown)"));
    // helm refusing the proposal: refused by `renders`, nothing written.
    let Step::Done(Err((handoff, _))) = decide(&migrations, true, &replies, &|_| {
        Err(HelmRunError::Render("template failed".into()))
    }) else {
        panic!("expected a handoff");
    };
    assert!(handoff.fact.contains("rule renders"), "{}", handoff.fact);
    // No model: a handoff naming the keys the new chart does not declare.
    let Step::Done(Err((handoff, _))) = decide(&migrations, false, &[], &|_| Ok(())) else {
        panic!("expected a handoff");
    };
    assert_eq!(
        handoff.open,
        "v.yaml (keys crds.enabled, crds.keep, auth.apiToken)"
    );
}

#[test]
fn an_edit_that_cannot_be_made_on_the_keys_own_lines_is_refused_by_read_back() {
    let text = "crds: {enabled: true, keep: true}\nlogLevel: 2\n";
    let original = values_of(text.as_bytes(), "v").unwrap();
    let refused = rewrite("v.yaml", text, &original, &good()).unwrap_err();
    assert_eq!(refused.rule, rule::READ_BACK);
    // A file helm's YAML 1.1 reader reads differently (a plain `on` key), or a key the
    // proposal adds that would read differently: nothing is rewritten.
    let text = "on: 1\nlogLevel: 2\n";
    let original = values_of(text.as_bytes(), "v").unwrap();
    let refused = rewrite("v.yaml", text, &original, &json!({"logLevel": 3})).unwrap_err();
    assert_eq!(refused.rule, rule::READ_BACK);
    let text = "logLevel: 2\n";
    let original = values_of(text.as_bytes(), "v").unwrap();
    let refused = rewrite("v.yaml", text, &original, &json!({"logLevel": 2, "y": 1})).unwrap_err();
    assert_eq!(refused.rule, rule::READ_BACK);
}

#[test]
fn a_move_keeps_a_name_lands_on_a_key_the_new_schema_names_and_the_old_did_not() {
    let mut s = schema();
    s["properties"]["hostNetwork"] = json!({"type": "boolean"});
    s["properties"]["log"] =
        json!({"type": "object", "properties": {"level": {"type": "integer"}}});
    let mut m = migration(
        "crds:\n  enabled: true\nlogLevel2: 4\nlogLevel: 2\n",
        s.clone(),
    );
    // An unrelated key the value happens to fit: refused.
    let unrelated = json!({"hostNetwork": true, "logLevel": 2, "log": {"level": 4}});
    assert_eq!(rule_of(&m, unrelated), Err(rule::ACCOUNTED));
    // Related names: accepted.
    assert_eq!(
        rule_of(
            &m,
            json!({"crds": {"install": true}, "logLevel": 2, "log": {"level": 4}})
        ),
        Ok(())
    );
    // A key the old schema already named is not where a displaced value goes.
    m.old_schema = Some(
        json!({"type": "object", "properties": {"log": {"type": "object", "properties": {"level": {}}}}}),
    );
    assert_eq!(
        rule_of(
            &m,
            json!({"crds": {"install": true}, "logLevel": 2, "log": {"level": 4}})
        ),
        Err(rule::ACCOUNTED)
    );
}

#[test]
fn what_helm_sees_is_checked_across_layers() {
    // Two files: base sets replicas 5; the proposal adds the chart default 1 to the
    // later layer, which would override it.
    let mut m = migration("replicas: 5\ncrds:\n  enabled: true\n", schema());
    let mut later = m.files[0].clone();
    later.path = "later.yaml".into();
    later.place.path = "later.yaml".into();
    later.text = "logLevel: 2\n".into();
    later.value = json!({"logLevel": 2});
    m.files.push(later.clone());
    m.failures[0].job.values.push(ValuesInput {
        name: "later.yaml".into(),
        content: later.text.clone().into_bytes(),
        file: Some(later.place.clone()),
    });
    m.new_defaults = json!({"replicas": 1});
    let proposal = json!({"files": [
        {"file": "v.yaml", "values": {"replicas": 5, "crds": {"install": true}}},
        {"file": "later.yaml", "values": {"logLevel": 2, "replicas": 1}}
    ]});
    let refused = check_reply(&m, &proposal, &Default::default(), &[]).unwrap_err();
    assert_eq!(refused.rule, rule::KEPT, "{}", refused.detail);
}

/// Values over a small alphabet of keys, so originals and proposals share paths.
fn values(depth: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        (0i64..5).prop_map(|n| json!(n)),
        prop::sample::select(vec!["a", "yes", "1.0", "x: y", "#c", ""]).prop_map(|s| json!(s)),
        Just(json!([1, "two"])),
    ];
    leaf.prop_recursive(depth, 16, 4, |inner| {
        prop::collection::btree_map(
            prop::sample::select(vec!["a", "b", "c", "d-e"]),
            inner,
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
    })
}

fn map(depth: u32) -> impl Strategy<Value = Value> {
    values(depth).prop_map(|v| if v.is_object() { v } else { json!({"a": v}) })
}

proptest! {
    /// An accepted proposal holds no value outside the original, the new chart's
    /// values.yaml and what the schema dictates.
    #[test]
    fn an_accepted_proposal_holds_only_supplied_values(original in map(3), proposal in map(3)) {
        let text = crate::yaml::to_string(&original);
        let mut m = migration(&text, json!({"type": "object", "properties": {"a": {"type": "object"}, "b": {"default": 1}}}));
        m.new_defaults = json!({"c": "a"});
        if let Ok(accepted) = check_reply(&m, &reply(proposal), &Default::default(), &[]) {
            let supplied: Vec<Value> = leaves(&original).into_iter().map(|(_, v)| v).collect();
            for (path, value) in leaves(&accepted[0].values) {
                // An empty mapping sets nothing (helm merges it into the chart's).
                if value == json!({}) && value_at(&m.new_defaults, &path).is_none_or(Value::is_object) {
                    continue;
                }
                prop_assert!(
                    supplied.contains(&value)
                        || value_at(&m.new_defaults, &path) == Some(&value)
                        || dictated(&m.new_schema, &path, &value),
                    "{} = {value} came from nowhere", path_text(&path)
                );
            }
        }
    }

    /// Key-level edits of block YAML reach any proposal, and what is written reads back
    /// as the proposal (or nothing is written).
    #[test]
    fn key_edits_reach_the_proposal_or_refuse(original in map(3), proposal in map(3)) {
        let text = format!("# top\n{}", block_yaml(&original));
        let parsed = values_of(text.as_bytes(), "t").unwrap();
        prop_assert_eq!(&parsed, &original);
        match rewrite("t.yaml", &text, &original, &proposal) {
            Ok(out) => {
                prop_assert_eq!(values_of(out.as_bytes(), "t").unwrap(), proposal);
                prop_assert!(out.starts_with("# top\n"));
            }
            Err(refused) => prop_assert!(false, "refused: {refused}"),
        }
    }
}

/// Block YAML as a person writes it (the same emitter the edits use for new keys).
fn block_yaml(value: &Value) -> String {
    let mut out = String::new();
    for (k, v) in value.as_object().unwrap() {
        let one = yaml::keys::set_value(&out, "t", 0, std::slice::from_ref(k), v).unwrap();
        out = one;
    }
    out
}
