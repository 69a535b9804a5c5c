//! The harness: the rules a reshape proposal must pass, each refusing with a reason.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::paths::{DocPath, Seg, leaf_paths, path_text};
use super::{Refused, rule};
use crate::schema;

/// A proposal the harness accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// The validated structure, keys in the original's order.
    pub document: Value,
    /// Its YAML, written by our own serialiser and read back.
    pub yaml: String,
    /// Values of the original the proposal does not carry (all of them at paths the
    /// destination prunes): listed in the comment even when dropping them was right.
    pub dropped: Vec<(String, Value)>,
    /// Values the proposal carries at another path than the original's: (from, to, value).
    pub moved: Vec<(String, String, Value)>,
}

/// Checks a model's reply (its placeholders already restored from the original) against the
/// original document (already carrying the destination apiVersion), the destination
/// version's schema and the source version's (`source`: the version the document leaves,
/// from the same CRD; a displaced value may move only to a path it does not declare).
/// Everything is refused whole unless every rule holds; what is accepted is re-serialised by
/// our own code.
pub fn check_proposal(
    original: &Value,
    reply: &Value,
    crd: &Value,
    source: &str,
    version: &str,
) -> Result<Accepted, Refused> {
    check_proposal_without(original, reply, crd, source, version, &[])
}

/// `check_proposal` with some rules switched off: only the evals use it, to show that each
/// rule is needed (a reply only that rule refuses would otherwise be accepted).
pub fn check_proposal_without(
    original: &Value,
    reply: &Value,
    crd: &Value,
    source: &str,
    version: &str,
    disabled: &[&str],
) -> Result<Accepted, Refused> {
    let on = |rule: &str| !disabled.contains(&rule);
    let proposal = shaped(reply, on(rule::SHAPE))?;
    if on(rule::IDENTITY) {
        same_identity(original, proposal)?;
    }
    let Some(schema) = schema::version_schema(crd, version) else {
        return refuse(
            rule::SCHEMA,
            format!("the CRD declares no schema for {version}"),
        );
    };
    if on(rule::SCHEMA) {
        fits_schema(proposal, schema, version)?;
    }
    let original_leaves = leaf_paths(original);
    let kept = kept_paths(original, &original_leaves, schema);
    let proposal_leaves = leaf_paths(proposal);
    if on(rule::KEPT) {
        keeps(&original_leaves, &kept, &proposal_leaves, version)?;
    }
    let accounting = Accounting {
        original,
        schema,
        source_schema: schema::version_schema(crd, source),
        enforce: on(rule::ACCOUNTED),
    };
    let (moved, dropped) = accounting.account(&original_leaves, &kept, &proposal_leaves)?;
    let (document, yaml) = reads_back(original, proposal)?;
    Ok(Accepted {
        document,
        yaml,
        dropped,
        moved,
    })
}

fn refuse<T>(rule: &'static str, detail: String) -> Result<T, Refused> {
    Err(Refused { rule, detail })
}

/// The rule `reply-shape`: the proposed document (`alone` off, other keys beside it pass).
fn shaped(reply: &Value, alone: bool) -> Result<&Value, Refused> {
    let shaped = reply
        .as_object()
        .filter(|o| o.len() == 1 || !alone)
        .and_then(|o| o.get("document"))
        .filter(|d| d.is_object());
    let Some(proposal) = shaped else {
        return refuse(
            rule::SHAPE,
            "the reply is not {\"document\": {...}} alone".into(),
        );
    };
    Ok(proposal)
}

/// The rule `identity`: apiVersion, kind and metadata as the original has them.
fn same_identity(original: &Value, proposal: &Value) -> Result<(), Refused> {
    for key in ["apiVersion", "kind", "metadata"] {
        if proposal.get(key) != original.get(key) {
            return refuse(
                rule::IDENTITY,
                format!(
                    "{key} is {} where the original has {}",
                    short(proposal.get(key)),
                    short(original.get(key))
                ),
            );
        }
    }
    Ok(())
}

/// The rule `schema`: the destination schema prunes nothing of the proposal, and it
/// validates, every rule evaluated.
fn fits_schema(proposal: &Value, schema: &Value, version: &str) -> Result<(), Refused> {
    let mut copy = proposal.clone();
    let outcome = schema::prune_and_validate(&mut copy, schema);
    if let Some((path, value)) = outcome.pruned.first() {
        return refuse(
            rule::SCHEMA,
            format!(
                "{path} = {} is not in the {version} schema",
                short(Some(value))
            ),
        );
    }
    if let Some(error) = outcome.errors.first() {
        return refuse(rule::SCHEMA, error.clone());
    }
    if let Some(path) = outcome.unevaluated.first() {
        return refuse(
            rule::SCHEMA,
            format!("{path}: a validation rule of the schema cannot be evaluated here"),
        );
    }
    Ok(())
}

/// The original's leaves the destination keeps (what it prunes may move or go). Paths are
/// compared as lists of keys and indexes, never as joined text (a key may hold a `.`).
fn kept_paths<'a>(
    original: &Value,
    original_leaves: &'a [(DocPath, Value)],
    schema: &Value,
) -> HashSet<&'a DocPath> {
    let mut pruned_original = original.clone();
    let _ = schema::prune_and_validate(&mut pruned_original, schema);
    let survivors: HashSet<DocPath> = leaf_paths(&pruned_original)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    original_leaves
        .iter()
        .filter(|(p, _)| survivors.contains(p))
        .map(|(p, _)| p)
        .collect()
}

/// The rule `kept`: every value the destination keeps is in the proposal, unchanged.
fn keeps(
    original_leaves: &[(DocPath, Value)],
    kept: &HashSet<&DocPath>,
    proposal_leaves: &[(DocPath, Value)],
    version: &str,
) -> Result<(), Refused> {
    let proposal_at: HashMap<&DocPath, &Value> =
        proposal_leaves.iter().map(|(p, v)| (p, v)).collect();
    for (path, value) in original_leaves {
        if !kept.contains(path) {
            continue;
        }
        match proposal_at.get(path) {
            Some(v) if *v == value => {}
            Some(v) => {
                return refuse(
                    rule::KEPT,
                    format!(
                        "{} is {} where the original has {}",
                        path_text(path),
                        short(Some(v)),
                        short(Some(value))
                    ),
                );
            }
            None => {
                return refuse(
                    rule::KEPT,
                    format!(
                        "{} = {} is missing, and the {version} schema keeps it",
                        path_text(path),
                        short(Some(value))
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Values moved (from, to, value) and values dropped (path, value).
type Changes = (Vec<(String, String, Value)>, Vec<(String, Value)>);

/// The rule `accounted`: where each value of the proposal comes from.
struct Accounting<'a> {
    original: &'a Value,
    /// The destination version's schema.
    schema: &'a Value,
    /// The source version's schema: without it nothing is new.
    source_schema: Option<&'a Value>,
    /// Off (the evals), an unaccounted value passes.
    enforce: bool,
}

impl Accounting<'_> {
    /// Every value of the proposal is the original's at that path, a displaced value moved to
    /// a new field, or dictated by the schema under a parent the original has; what was
    /// displaced and not moved is dropped.
    fn account(
        &self,
        original_leaves: &[(DocPath, Value)],
        kept: &HashSet<&DocPath>,
        proposal_leaves: &[(DocPath, Value)],
    ) -> Result<Changes, Refused> {
        let original_at: HashMap<&DocPath, &Value> =
            original_leaves.iter().map(|(p, v)| (p, v)).collect();
        // Values the schema change displaced, each usable once. An empty object or list, or a
        // null, carries nothing to move (an empty selector placed elsewhere means "everything").
        let mut displaced: Vec<(&DocPath, &Value)> = original_leaves
            .iter()
            .filter(|(p, _)| !kept.contains(p))
            .map(|(p, v)| (p, v))
            .collect();
        let movable = |v: &Value| match v {
            Value::Null => false,
            Value::Object(o) => !o.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        };
        let mut moved = Vec::new();
        for (path, value) in proposal_leaves {
            if original_at.get(path) == Some(&value) {
                continue;
            }
            if let Some(at) = displaced
                .iter()
                .position(|(_, v)| *v == value && movable(v) && self.new_field(path, value))
            {
                let (from, _) = displaced.remove(at);
                moved.push((path_text(from), path_text(path), value.clone()));
                continue;
            }
            // A schema default (or one-value enum, const) may be written where the apiserver
            // would write it anyway: under a parent the original has. A new parent (a new list
            // item, a new optional object) would be an invention.
            let parent_exists =
                path.len() <= 1 || node_at(self.original, &path[..path.len() - 1]).is_some();
            if (parent_exists && dictated(self.schema, path, value)) || !self.enforce {
                continue;
            }
            return refuse(
                rule::ACCOUNTED,
                format!(
                    "{} = {} is neither in the original, displaced by the schema change to a field only the destination has, nor dictated by the schema under a parent the original has",
                    path_text(path),
                    short(Some(value))
                ),
            );
        }
        let dropped: Vec<(String, Value)> = displaced
            .into_iter()
            .map(|(p, v)| (path_text(p), v.clone()))
            .collect();
        Ok((moved, dropped))
    }

    /// A displaced value moves only to a field the destination schema names and the source
    /// schema does not have (a new field, not another existing setting such as another
    /// Secret's name), of a type that takes it.
    fn new_field(&self, path: &DocPath, value: &Value) -> bool {
        self.source_schema
            .is_some_and(|old| matches!(schema_node(old, path), Node::Undeclared))
            && matches!(schema_node(self.schema, path), Node::At(node) if takes(node, value))
    }
}

/// The rule `read-back`: the accepted structure, keys in the original's order, serialised by
/// our own writer, reads back as itself.
fn reads_back(original: &Value, proposal: &Value) -> Result<(Value, String), Refused> {
    let document = order_like(original, proposal);
    let yaml = crate::yaml::to_string(&document);
    match crate::yaml::parse_document(&yaml, "reshaped document") {
        Ok(back) if back == document => Ok((document, yaml)),
        _ => refuse(
            rule::READ_BACK,
            "the serialised document does not read back as the accepted structure".into(),
        ),
    }
}

fn short(value: Option<&Value>) -> String {
    let text = match value {
        None => "(absent)".to_string(),
        Some(v) => v.to_string(),
    };
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}

/// The node of a document at a path, if there is one.
fn node_at<'a>(document: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut node = document;
    for seg in path {
        node = match seg {
            Seg::Key(key) => node.as_object()?.get(key)?,
            Seg::Index(i) => node.as_array()?.get(*i)?,
        };
    }
    Some(node)
}

/// Where a path lands in a structural schema.
enum Node<'a> {
    /// A field the schema names (through `properties` and `items`).
    At(&'a Value),
    /// Allowed without being named: under `additionalProperties` or a node that preserves
    /// unknown fields.
    Open,
    /// Neither: the apiserver would prune it.
    Undeclared,
}

fn schema_node<'a>(schema: &'a Value, path: &[Seg]) -> Node<'a> {
    let mut node = schema;
    let mut named = true;
    for seg in path {
        if node
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true)
            && match seg {
                Seg::Key(key) => node.get("properties").and_then(|p| p.get(key)).is_none(),
                Seg::Index(_) => node.get("items").is_none(),
            }
        {
            return Node::Open;
        }
        let next = match seg {
            Seg::Key(key) => match node.get("properties").and_then(|p| p.get(key)) {
                Some(n) => Some(n),
                None => match node.get("additionalProperties") {
                    Some(Value::Bool(true)) => return Node::Open,
                    Some(a) if a.is_object() => {
                        named = false;
                        Some(a)
                    }
                    _ => None,
                },
            },
            Seg::Index(_) => node.get("items"),
        };
        match next {
            Some(n) => node = n,
            None => return Node::Undeclared,
        }
    }
    if named { Node::At(node) } else { Node::Open }
}

/// Whether a schema node's type takes a value (no type, or int-or-string, takes any scalar).
fn takes(node: &Value, value: &Value) -> bool {
    if node
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return value.is_string() || value.is_i64() || value.is_u64();
    }
    match node.get("type").and_then(Value::as_str) {
        None => true,
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some(_) => false,
    }
}

/// Whether the schema at `path` dictates `value`: its default, its only enum value, its const.
fn dictated(schema: &Value, path: &[Seg], value: &Value) -> bool {
    let mut node = schema;
    for seg in path {
        let next = match seg {
            Seg::Key(key) => node
                .get("properties")
                .and_then(|p| p.get(key))
                .or_else(|| node.get("additionalProperties").filter(|a| a.is_object())),
            Seg::Index(_) => node.get("items"),
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    node.get("default") == Some(value)
        || node.get("const") == Some(value)
        || node
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|e| e.len() == 1 && &e[0] == value)
}

/// `proposal` with every object's keys in `original`'s order (keys the original lacks last,
/// in the proposal's order).
pub fn order_like(original: &Value, proposal: &Value) -> Value {
    match (original, proposal) {
        (Value::Object(o), Value::Object(p)) => {
            let mut out = Map::new();
            for (key, value) in o {
                if let Some(v) = p.get(key) {
                    out.insert(key.clone(), order_like(value, v));
                }
            }
            for (key, value) in p {
                if !out.contains_key(key) {
                    out.insert(key.clone(), order_like(&Value::Null, value));
                }
            }
            Value::Object(out)
        }
        (Value::Array(o), Value::Array(p)) => Value::Array(
            p.iter()
                .enumerate()
                .map(|(i, v)| order_like(o.get(i).unwrap_or(&Value::Null), v))
                .collect(),
        ),
        (_, other) => other.clone(),
    }
}
