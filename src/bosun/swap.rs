//! The deterministic repair: rewrite the `apiVersion` value of each consumer the gate named,
//! and nothing else. Plain manifests are edited through parser byte spans (`yaml::edit`):
//! every other byte (comments, quoting, key order, blank lines, separators) stays. A template of
//! a chart in this repository is not YAML; its literal `apiVersion:` line is rewritten in place.

use std::collections::BTreeMap;

use crate::gate::rules::{Consumer, DroppedServedVersion};
use crate::yaml::edit::{self, Segment};

/// One apiVersion to move, in one document of one file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Swap {
    pub path: String,
    /// The document among the file's non-empty documents (as the gate counts), or among a
    /// template's `---` sections.
    pub document: usize,
    pub kind: String,
    pub name: String,
    /// The value the plan was made from: the file must still hold it.
    pub from: String,
    pub to: String,
    pub template: bool,
}

/// Every swap the gate's evidence asks for, by file.
pub fn plan(dropped: &[DroppedServedVersion]) -> BTreeMap<String, Vec<Swap>> {
    let mut by_file: BTreeMap<String, Vec<Swap>> = BTreeMap::new();
    for crd in dropped {
        for Consumer {
            path,
            document,
            api_version,
            kind,
            name,
            template,
            ..
        } in &crd.consumers
        {
            by_file.entry(path.clone()).or_default().push(Swap {
                path: path.clone(),
                document: *document,
                kind: kind.clone(),
                name: name.clone(),
                from: api_version.clone(),
                to: format!("{}/{}", crd.group, crd.storage),
                template: *template,
            });
        }
    }
    for swaps in by_file.values_mut() {
        swaps.sort();
        swaps.dedup();
    }
    by_file
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SwapError {
    #[error(transparent)]
    Yaml(#[from] edit::EditError),
    #[error(
        "{path}: no {kind} {name} declaring {from} in document {document}: the file changed since the gate read it"
    )]
    Moved {
        path: String,
        document: usize,
        kind: String,
        name: String,
        from: String,
    },
    #[error(
        "{path}: the destination apiVersion {to:?} is not a group/version Kubernetes accepts; nothing is written"
    )]
    InvalidDestination { path: String, to: String },
}

/// The destination is chart-controlled (a CRD's group and storage version): it must be a name
/// Kubernetes accepts before a byte of it is written, whatever the gate checked before.
fn check_destination(swap: &Swap) -> Result<(), SwapError> {
    if crate::names::is_api_version(&swap.to) {
        Ok(())
    } else {
        Err(SwapError::InvalidDestination {
            path: swap.path.clone(),
            to: swap.to.chars().take(120).collect(),
        })
    }
}

fn moved(swap: &Swap) -> SwapError {
    SwapError::Moved {
        path: swap.path.clone(),
        document: swap.document,
        kind: swap.kind.clone(),
        name: swap.name.clone(),
        from: swap.from.clone(),
    }
}

struct DocumentFacts<'a> {
    stream_index: usize,
    api_version: Option<&'a edit::ScalarSite>,
    kind: Option<&'a str>,
    name: Option<&'a str>,
}

/// Applies every swap of one file to its text.
pub fn apply(text: &str, swaps: &[Swap]) -> Result<String, SwapError> {
    let (templates, manifests): (Vec<&Swap>, Vec<&Swap>) = swaps.iter().partition(|s| s.template);
    let mut out = text.to_string();
    if !manifests.is_empty() {
        out = apply_manifest(&out, &manifests)?;
    }
    for swap in templates {
        out = apply_template(&out, swap)?;
    }
    Ok(out)
}

fn apply_manifest(text: &str, swaps: &[&Swap]) -> Result<String, SwapError> {
    let origin = swaps.first().map(|s| s.path.as_str()).unwrap_or("");
    let sites = edit::scalar_sites(text, origin)?;
    // The documents that hold anything, in stream order: the gate's document index counts
    // these (it skips empty documents).
    let mut documents: Vec<DocumentFacts> = Vec::new();
    for (site, _) in &sites {
        if documents.last().map(|d| d.stream_index) != Some(site.document) {
            documents.push(DocumentFacts {
                stream_index: site.document,
                api_version: None,
                kind: None,
                name: None,
            });
        }
        let Some(facts) = documents.last_mut() else {
            continue;
        };
        match site.path.as_slice() {
            [Segment::Key(k)] if k == "apiVersion" => facts.api_version = Some(site),
            [Segment::Key(k)] if k == "kind" => facts.kind = Some(&site.value),
            [Segment::Key(m), Segment::Key(n)] if m == "metadata" && n == "name" => {
                facts.name = Some(&site.value)
            }
            _ => {}
        }
    }
    let mut edits = Vec::new();
    for swap in swaps {
        check_destination(swap)?;
        let matches = |d: &&DocumentFacts| {
            d.api_version.is_some_and(|s| s.value == swap.from)
                && d.kind == Some(swap.kind.as_str())
                && d.name.unwrap_or("") == swap.name
        };
        // The document the gate counted, if it still is the one; else the only match.
        let found = documents.get(swap.document).filter(matches).or_else(|| {
            let candidates: Vec<&DocumentFacts> = documents.iter().filter(matches).collect();
            (candidates.len() == 1).then(|| candidates[0])
        });
        let Some(site) = found.and_then(|d| d.api_version) else {
            return Err(moved(swap));
        };
        edits.push((
            site.start,
            site.end,
            edit::render_scalar(&swap.to, site.quoted),
        ));
    }
    edits.sort();
    edits.dedup();
    Ok(edit::splice(text, &edits))
}

/// In a template, the line `apiVersion: <from>` (optionally quoted, optionally followed by a
/// comment) at the start of a line of the given `---` section.
fn apply_template(text: &str, swap: &Swap) -> Result<String, SwapError> {
    check_destination(swap)?;
    let mut out = String::with_capacity(text.len());
    let mut section = 0usize;
    let mut replaced = false;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            section += 1;
        }
        // Every literal declaration in the section moves (a template may declare the same
        // apiVersion on two branches of an `if`).
        if section == swap.document
            && let Some(rest) = line.strip_prefix("apiVersion:")
        {
            let value_start = rest.len() - rest.trim_start().len();
            let value_part = rest.trim_start();
            let mut moved = false;
            for (quote, style) in [("\"", Some('"')), ("'", Some('\'')), ("", None)] {
                let literal = format!("{quote}{}{quote}", swap.from);
                // The value ends at the line's end or at a comment, which YAML only starts
                // after whitespace (`v1beta1#x` is one plain scalar).
                if let Some(after) = value_part.strip_prefix(&literal)
                    && (after.trim().is_empty()
                        || (after.starts_with([' ', '\t']) && after.trim_start().starts_with('#')))
                {
                    out.push_str("apiVersion:");
                    out.push_str(&rest[..value_start]);
                    out.push_str(&edit::render_scalar(&swap.to, style));
                    out.push_str(after);
                    replaced = true;
                    moved = true;
                    break;
                }
            }
            if moved {
                continue;
            }
        }
        out.push_str(line);
    }
    if !replaced {
        return Err(moved(swap));
    }
    Ok(out)
}

/// For tests: the swap of document 0 of `path`, an `E` named `a`, from `e.io/v1beta1` to
/// `e.io/v1`.
#[cfg(test)]
pub(crate) fn test_swap(path: &str) -> Swap {
    Swap {
        path: path.into(),
        document: 0,
        kind: "E".into(),
        name: "a".into(),
        from: "e.io/v1beta1".into(),
        to: "e.io/v1".into(),
        template: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swap(document: usize, name: &str) -> Swap {
        Swap {
            path: "f.yaml".into(),
            document,
            kind: "ExternalSecret".into(),
            name: name.into(),
            from: "external-secrets.io/v1beta1".into(),
            to: "external-secrets.io/v1".into(),
            template: false,
        }
    }

    #[test]
    fn only_the_api_version_value_changes() {
        let text = "# header\n---\n---\napiVersion: \"external-secrets.io/v1beta1\" # keep\nkind: ExternalSecret\nmetadata:\n  name: a\nspec:\n  note: |\n    apiVersion: external-secrets.io/v1beta1\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n---\nkind: ExternalSecret\nmetadata:\n  name: c\napiVersion: external-secrets.io/v1beta1\n";
        let out = apply(text, &[swap(0, "a"), swap(2, "c")]).unwrap();
        assert_eq!(
            out,
            text.replacen(
                "\"external-secrets.io/v1beta1\" # keep",
                "\"external-secrets.io/v1\" # keep",
                1
            )
            .replacen(
                "  name: c\napiVersion: external-secrets.io/v1beta1",
                "  name: c\napiVersion: external-secrets.io/v1",
                1
            )
        );
    }

    #[test]
    fn a_file_that_no_longer_holds_the_value_is_refused() {
        let text =
            "apiVersion: external-secrets.io/v1\nkind: ExternalSecret\nmetadata: {name: a}\n";
        assert!(matches!(
            apply(text, &[swap(0, "a")]),
            Err(SwapError::Moved { .. })
        ));
    }

    #[test]
    fn a_destination_kubernetes_would_reject_is_never_written() {
        let text =
            "apiVersion: external-secrets.io/v1beta1\nkind: ExternalSecret\nmetadata: {name: a}\n";
        for to in [
            "external-secrets.io/v1\n---\napiVersion: rbac.authorization.k8s.io/v1",
            "external-secrets.io/v1 # x",
            "Ext.io/v1",
            "",
        ] {
            for template in [false, true] {
                let mut s = swap(0, "a");
                s.to = to.into();
                s.template = template;
                assert!(
                    matches!(apply(text, &[s]), Err(SwapError::InvalidDestination { .. })),
                    "{to:?} template={template}"
                );
            }
        }
    }

    #[test]
    fn a_template_line_is_rewritten_in_place() {
        let text = "{{- if .Values.tls }}\napiVersion: 'external-secrets.io/v1beta1'  # pinned\nkind: ExternalSecret\n{{- end }}\n";
        let mut s = swap(0, "{{ x }}");
        s.template = true;
        assert_eq!(
            apply(text, &[s.clone()]).unwrap(),
            text.replace("'external-secrets.io/v1beta1'", "'external-secrets.io/v1'")
        );
        s.document = 1;
        assert!(apply(text, &[s.clone()]).is_err());
        // Both branches of an `if` move; `v1beta1#x` is not the value v1beta1.
        s.document = 0;
        let branches = "{{- if .Values.a }}\napiVersion: external-secrets.io/v1beta1\n{{- else }}\napiVersion: external-secrets.io/v1beta1\n{{- end }}\napiVersion: external-secrets.io/v1beta1#x\n";
        assert_eq!(
            apply(branches, &[s]).unwrap(),
            branches.replacen("v1beta1\n", "v1\n", 2)
        );
    }
}
