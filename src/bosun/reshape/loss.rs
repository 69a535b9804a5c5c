//! What the swap alone would lose: each rewritten document under the destination's schema.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::bosun::applier::Rewrite;
use crate::bosun::swap::Swap;
use crate::gate::rules::DroppedServedVersion;
use crate::render::Rendering;
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

impl Loss {
    /// The loss with every value `held` holds back replaced by its placeholder (for comments:
    /// a credential is named by its path, never shown).
    pub fn scrubbed(&self, held: &crate::model::Held) -> Loss {
        match self {
            Loss::Pruned(path, value) => Loss::Pruned(path.clone(), held.scrub(value)),
            Loss::Rejected(message) => Loss::Rejected(held.scrub(message)),
            Loss::Unverifiable(why) => Loss::Unverifiable(held.scrub(why)),
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
        // A rule or format that cannot be checked here is not proof of a clean move.
        .chain(outcome.unevaluated.into_iter().map(Loss::Unverifiable))
        .collect()
}

/// A document a swap rewrote, for messages.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DocumentRef {
    pub file: String,
    pub kind: String,
    pub name: String,
}

impl std::fmt::Display for DocumentRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} {})", self.file, self.kind, self.name)
    }
}

/// The CustomResourceDefinition at the head that serves `group/version` for `kind` (there may
/// be several: one per cluster, at different chart versions).
pub fn crd_for<'r>(
    rendering: &'r Rendering,
    group: &str,
    kind: &str,
    version: &str,
) -> Option<&'r Value> {
    rendering
        .applications
        .iter()
        .flat_map(|a| a.objects.iter().map(|o| &**o))
        .find(|o| {
            crate::gate::crd::crd_info(o).is_some_and(|(_, crd)| {
                crd.group == group && crd.kind == kind && crd.served.contains(version)
            })
        })
}

/// Every value the swap would lose, per document: plain manifests are read back from their
/// rewritten text; a chart template's objects are taken from the head's rendering.
pub fn reshape_losses(
    rewrites: &[Rewrite],
    plan: &BTreeMap<String, Vec<Swap>>,
    dropped: &[DroppedServedVersion],
    rendering: &Rendering,
) -> Vec<(DocumentRef, Loss)> {
    lossy_documents(rewrites, plan, dropped, rendering)
        .into_iter()
        .flat_map(|l| {
            let document = l.document;
            l.losses
                .into_iter()
                .map(move |loss| (document.clone(), loss))
        })
        .collect()
}

/// A rewritten document the swap alone would lose values of, with what a reshape needs.
#[derive(Debug, Clone)]
pub struct Lossy {
    pub document: DocumentRef,
    /// The object as the swap left it (destination apiVersion); `Null` when unverifiable.
    pub object: Value,
    /// The CRD at the head serving the destination.
    pub crd: Value,
    pub version: String,
    /// The version the document leaves (its schema, when the CRD still lists it, says which
    /// fields are new).
    pub source: String,
    /// A chart template's object (never reshaped: the text is a template).
    pub template: bool,
    pub losses: Vec<Loss>,
}

/// The objects the head renders from a chart template the swap rewrites (the Applications
/// whose source is that chart's folder), at the destination apiVersion.
fn template_objects(rendering: &Rendering, path: &str, swap: &Swap) -> Vec<Value> {
    let chart_dir = path
        .rsplit_once("/templates/")
        .map(|(dir, _)| dir.to_string())
        .unwrap_or_default();
    rendering
        .applications
        .iter()
        .filter(|a| {
            a.sources.iter().any(|s| {
                s.get("path")
                    .and_then(Value::as_str)
                    .map(crate::paths::normalize)
                    == Some(chart_dir.clone())
            })
        })
        .flat_map(|a| a.objects.iter())
        .filter(|o| {
            o.get("kind").and_then(Value::as_str) == Some(swap.kind.as_str())
                && o.get("apiVersion").and_then(Value::as_str) == Some(swap.from.as_str())
        })
        .map(|o| {
            let mut o = Value::clone(o);
            o["apiVersion"] = swap.to.clone().into();
            o
        })
        .collect()
}

/// The documents of a rewritten file the swap moved: its kind and name, at the destination.
fn swapped_documents(documents: &[Value], swap: &Swap) -> Vec<Value> {
    documents
        .iter()
        .filter(|d| {
            d.get("apiVersion").and_then(Value::as_str) == Some(swap.to.as_str())
                && d.get("kind").and_then(Value::as_str) == Some(swap.kind.as_str())
                && d.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    == swap.name
        })
        .cloned()
        .collect()
}

/// Every document the swap would lose values of, with its object, CRD and losses.
pub fn lossy_documents(
    rewrites: &[Rewrite],
    plan: &BTreeMap<String, Vec<Swap>>,
    dropped: &[DroppedServedVersion],
    rendering: &Rendering,
) -> Vec<Lossy> {
    let mut out: Vec<Lossy> = Vec::new();
    let destination = |swap: &Swap| {
        dropped
            .iter()
            .find(|d| d.kind == swap.kind && format!("{}/{}", d.group, d.storage) == swap.to)
    };
    for rewrite in rewrites {
        let documents = crate::yaml::parse_documents(&rewrite.after, &rewrite.path);
        for swap in plan.get(&rewrite.path).into_iter().flatten() {
            let here = DocumentRef {
                file: rewrite.path.clone(),
                kind: swap.kind.clone(),
                name: swap.name.clone(),
            };
            // Anything that cannot be checked is a loss: an unchecked swap is never pushed.
            let mut unverifiable = |why: String| {
                out.push(Lossy {
                    document: here.clone(),
                    object: Value::Null,
                    crd: Value::Null,
                    version: String::new(),
                    source: String::new(),
                    template: swap.template,
                    losses: vec![Loss::Unverifiable(why)],
                })
            };
            let Some(target) = destination(swap) else {
                unverifiable(format!(
                    "the gate's evidence names no destination for {}",
                    swap.to
                ));
                continue;
            };
            let Some(crd) = crd_for(rendering, &target.group, &target.kind, &target.storage) else {
                unverifiable(format!(
                    "no CustomResourceDefinition at the head serves {}",
                    swap.to
                ));
                continue;
            };
            let objects: Vec<Value> = if swap.template {
                template_objects(rendering, &rewrite.path, swap)
            } else {
                match &documents {
                    Ok(documents) => swapped_documents(documents, swap),
                    Err(e) => {
                        unverifiable(format!("the rewritten file does not parse: {e}"));
                        continue;
                    }
                }
            };
            if objects.is_empty() {
                unverifiable(if swap.template {
                    "no Application at the head renders this template's object".to_string()
                } else {
                    "the rewritten document was not found".to_string()
                });
                continue;
            }
            for object in objects {
                let document = DocumentRef {
                    file: rewrite.path.clone(),
                    kind: swap.kind.clone(),
                    name: object
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or(&swap.name)
                        .to_string(),
                };
                let losses = losses(&object, crd, &target.storage);
                if !losses.is_empty() {
                    out.push(Lossy {
                        document,
                        object,
                        crd: crd.clone(),
                        version: target.storage.clone(),
                        source: swap
                            .from
                            .rsplit_once('/')
                            .map(|(_, v)| v)
                            .unwrap_or(&swap.from)
                            .to_string(),
                        template: swap.template,
                        losses,
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| a.document.cmp(&b.document));
    out.dedup_by(|a, b| a.document == b.document && a.losses == b.losses);
    out
}
