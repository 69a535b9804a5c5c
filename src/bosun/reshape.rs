//! The reshape check: before anything is pushed, every document the swap rewrote is put
//! through the destination version's structural schema (from the CRD at the head). A field the
//! new schema would prune, or a value it would reject, means the swap alone loses data: the
//! apiserver would accept the document and quietly drop the value, while the render, the gate
//! and the repository all look fine.

use serde_json::Value;

use crate::schema;

/// What moving one document to the destination version would lose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// The field is not in the new schema: the apiserver prunes it. (path, value as JSON)
    Pruned(String, String),
    /// The new schema refuses the document (type, enum, required): the message.
    Rejected(String),
    /// The check could not run (no CRD or schema for the destination, a document not found):
    /// treated as a loss, so an unchecked swap is never pushed.
    Unverifiable(String),
}

/// Markdown a comment can carry as it is: the path and value come from a pull request or a
/// chart, so they are escaped (`report::code`, `report::text`).
impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::gate::report::{code, text};
        match self {
            Loss::Pruned(path, value) => {
                write!(f, "{} = {} would be pruned", code(path), text(value))
            }
            Loss::Rejected(message) => write!(f, "rejected: {}", text(message)),
            Loss::Unverifiable(why) => write!(f, "cannot be checked: {}", text(why)),
        }
    }
}

/// The losses of one object (already carrying the destination apiVersion) under `crd`'s schema
/// for `version`. A version without a schema prunes nothing.
pub fn losses(object: &Value, crd: &Value, version: &str) -> Vec<Loss> {
    let Some(target) = schema::version_schema(crd, version) else {
        return vec![Loss::Unverifiable(format!(
            "the CustomResourceDefinition declares no schema for {version}"
        ))];
    };
    let mut copy = object.clone();
    let outcome = schema::prune_and_validate(&mut copy, target);
    outcome
        .pruned
        .into_iter()
        .map(|(path, value)| Loss::Pruned(path, value.to_string()))
        .chain(outcome.errors.into_iter().map(Loss::Rejected))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
