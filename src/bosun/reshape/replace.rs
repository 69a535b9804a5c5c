//! Writing an accepted document back into its file, unless YAML 1.1 could read it otherwise.

use serde_json::Value;

/// Why an accepted document is not written back into its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplaceError {
    #[error("the file has YAML directives; it is not rewritten")]
    Directives,
    /// How many documents of the file match the object (none, or more than one).
    #[error("{0} documents of the file match the object, not one")]
    NotOne(usize),
    #[error(transparent)]
    Hazard(#[from] Yaml11Hazard),
}

/// Where Kubernetes' YAML 1.1 reader and this project's could read a document differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Yaml11Hazard {
    /// A key YAML 1.1 reads as a boolean, null or number when plain.
    #[error(
        "the key {0:?} reads as a boolean, null or number under Kubernetes' YAML 1.1 when written plain; rewriting the document could change it"
    )]
    Key(String),
    /// A plain value only one of the two readers takes as a boolean.
    #[error(
        "the value {0:?} is a string to Kubernetes' YAML 1.1 and a boolean to this project's reader; rewriting the document could change it"
    )]
    Value(String),
}

/// `text` with the document that parses as `object` (same apiVersion, kind, name and
/// namespace) replaced by `yaml`. The document's `---` line and the comment lines before and
/// after it stay; the rest of the file keeps its bytes. Refused (with the reason) when no
/// single document matches, or when Kubernetes would read the original differently from how
/// this project's reader did (a YAML 1.1 hazard): rewriting it would change what it means.
pub fn replace_document(text: &str, object: &Value, yaml: &str) -> Result<String, ReplaceError> {
    let pieces = crate::render::parsed::split_documents(text).ok_or(ReplaceError::Directives)?;
    let same = |doc: &Value| {
        ["apiVersion", "kind"]
            .iter()
            .all(|k| doc.get(k) == object.get(k))
            && doc.pointer("/metadata/name") == object.pointer("/metadata/name")
            && doc.pointer("/metadata/namespace") == object.pointer("/metadata/namespace")
    };
    let matches: Vec<usize> = pieces
        .iter()
        .enumerate()
        .filter(|(_, (_, piece))| {
            crate::yaml::parse_document(piece, "rewrite").is_ok_and(|doc| same(&doc))
        })
        .map(|(i, _)| i)
        .collect();
    let [index] = matches.as_slice() else {
        return Err(ReplaceError::NotOne(matches.len()));
    };
    let (_, piece) = pieces[*index];
    if let Some(hazard) = yaml11_hazard(piece) {
        return Err(hazard.into());
    }
    let lines: Vec<&str> = piece.split_inclusive('\n').collect();
    let loose = |l: &str| l.trim().is_empty() || l.starts_with('#');
    let mut head = String::new();
    let mut first = 0;
    if lines.first().is_some_and(|l| l.starts_with("---")) {
        head.push_str("---\n");
        first = 1;
    }
    while first < lines.len() && loose(lines[first]) {
        head.push_str(lines[first]);
        first += 1;
    }
    let mut last = lines.len();
    while last > first && loose(lines[last - 1]) {
        last -= 1;
    }
    let tail: String = lines[last..].concat();
    let mut out = String::with_capacity(text.len() + yaml.len());
    for (i, (_, other)) in pieces.iter().enumerate() {
        if i != *index {
            out.push_str(other);
            continue;
        }
        if !head.is_empty() && !head.ends_with('\n') {
            head.push('\n');
        }
        out.push_str(&head);
        out.push_str(yaml);
        if !yaml.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&tail);
    }
    Ok(out)
}

/// Where Kubernetes (go-yaml v2, YAML 1.1) and this project's reader could disagree on one
/// document's text: a key YAML 1.1 reads as a boolean, null or number when plain (`y`, `on`,
/// `0755`, `1.0`), or a plain value only one of the two reads as a boolean (`yEs`). Re-writing
/// such a document would change what the cluster sees, so the reshape refuses it.
pub(crate) fn yaml11_hazard(piece: &str) -> Option<Yaml11Hazard> {
    fn ambiguous_key(key: &str) -> bool {
        let lower = key.to_ascii_lowercase();
        if [
            "y", "n", "yes", "no", "true", "false", "on", "off", "null", "~", "",
        ]
        .contains(&lower.as_str())
        {
            return true;
        }
        let mut chars = key.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_digit() || "+-.".contains(c))
            && key
                .chars()
                .all(|c| c.is_ascii_hexdigit() || "+-._xXoObB:".contains(c) || c == 'e' || c == 'E')
    }
    fn keys(value: &Value, out: &mut Option<Yaml11Hazard>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    if out.is_none() && ambiguous_key(key) {
                        *out = Some(Yaml11Hazard::Key(key.clone()));
                    }
                    keys(child, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|i| keys(i, out)),
            _ => {}
        }
    }
    let mut hazard = None;
    if let Ok(document) = crate::yaml::parse_document(piece, "rewrite") {
        keys(&document, &mut hazard);
    }
    if hazard.is_some() {
        return hazard;
    }
    const CANONICAL: [&str; 22] = [
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
        "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
    ];
    let sites = crate::yaml::edit::scalar_sites(piece, "rewrite").ok()?;
    sites.into_iter().find_map(|(site, _)| {
        let lower = site.value.to_ascii_lowercase();
        (site.quoted.is_none()
            && ["y", "n", "yes", "no", "true", "false", "on", "off"].contains(&lower.as_str())
            && !CANONICAL.contains(&site.value.as_str()))
        .then(|| Yaml11Hazard::Value(site.value.clone()))
    })
}
