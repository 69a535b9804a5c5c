//! Property tests of the reshape harness: whatever the document and whatever a model
//! proposes, an accepted proposal keeps the object's identity and carries no value that is
//! neither the original's nor dictated by the destination schema.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

use gitops_loop::bosun::reshape;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];
const VALUES: [&str; 4] = ["x", "y", "7d", "z"];

fn spec_strategy() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(
        prop::sample::select(KEYS.to_vec()),
        prop::sample::select(VALUES.to_vec()),
        0..5,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect()
    })
}

fn crd(declared: &[&str], default_of_c: bool) -> Value {
    let mut properties = Map::new();
    for key in declared {
        let mut field = json!({"type": "string"});
        if *key == "c" && default_of_c {
            field["default"] = json!("7d");
        }
        properties.insert(key.to_string(), field);
    }
    json!({"spec": {"versions": [{"name": "v2", "schema": {"openAPIV3Schema": {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": properties}}}}}]}})
}

proptest! {
    #[test]
    fn an_accepted_proposal_keeps_identity_and_invents_nothing(
        original_spec in spec_strategy(),
        proposal_spec in spec_strategy(),
        declared in prop::sample::subsequence(KEYS.to_vec(), 0..=5),
        default_of_c in any::<bool>(),
        rename in any::<bool>(),
    ) {
        let original = json!({"apiVersion": "e.io/v2", "kind": "K",
            "metadata": {"name": "n", "namespace": "ns"}, "spec": original_spec});
        let mut document = json!({"apiVersion": "e.io/v2", "kind": "K",
            "metadata": {"name": "n", "namespace": "ns"}, "spec": proposal_spec});
        if rename {
            document["metadata"]["name"] = json!("other");
        }
        let crd = crd(&declared, default_of_c);
        let result = reshape::check_proposal(&original, &json!({"document": document}), &crd, "v1", "v2");
        if let Ok(accepted) = result {
            prop_assert!(!rename);
            for key in ["apiVersion", "kind", "metadata"] {
                prop_assert_eq!(accepted.document.get(key), original.get(key));
            }
            let original_values: Vec<Value> =
                reshape::leaves(&original).into_iter().map(|(_, v)| v).collect();
            for (path, value) in reshape::leaves(&accepted.document) {
                let dictated = path == "spec.c" && default_of_c && value == json!("7d");
                prop_assert!(
                    original_values.contains(&value) || dictated,
                    "{path} = {value} came from nowhere"
                );
            }
            // Every value of the original at a path the schema keeps is still there.
            for (path, value) in reshape::leaves(&original) {
                let key = path.trim_start_matches("spec.");
                if declared.contains(&key) {
                    prop_assert_eq!(accepted.document.pointer(&format!("/spec/{key}")), Some(&value));
                }
            }
        }
    }
}

/// The reshape bench's harness path runs (its figure is in the README).
#[test]
fn the_reshape_bench_runs_every_document_through_the_harness() {
    let charts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/sample/charts");
    let figures = ground::bench::reshape(&charts, 25).unwrap();
    assert_eq!((figures.documents, figures.files), (25, 3));
}
