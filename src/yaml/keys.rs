//! Key-level YAML edits for a values file: remove a key, rename a key, set a key, each on that
//! key's own lines. Every other byte of the file (comments, blank lines, quoting, the order of
//! the other keys) stays. Only block mappings are edited; anything else is refused, and the
//! caller reads the file back and compares it with what it meant to write, so an edit this
//! module gets wrong is refused, never written.

use granit_parser::{Event, Parser};
use serde_json::Value;

use super::edit::{EditError, Segment, path_text, plain_is_safe, render_scalar};

/// A mapping key in a block mapping: where its text is and where its lines are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySite {
    pub document: usize,
    /// The path to the key's value (the key is the last segment).
    pub path: Vec<String>,
    pub key_start: usize,
    pub key_end: usize,
    /// The key's column (its indentation).
    pub indent: usize,
    /// Whether the key starts its line (after indentation) in a block mapping.
    pub own_line: bool,
    /// The value is a block sequence (its `- ` items may sit at the key's own column).
    pub value_is_sequence: bool,
    /// The value is a scalar: its byte span.
    pub scalar: Option<(usize, usize)>,
}

enum Frame {
    Mapping {
        key: Option<String>,
        expecting_key: bool,
        flow: bool,
    },
    Sequence,
}

/// Every key of every block mapping whose path is made of keys only (keys under a sequence
/// are not edited line-wise).
pub fn key_sites(text: &str, origin: &str) -> Result<Vec<KeySite>, EditError> {
    let mut sites: Vec<KeySite> = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    // The path of each open collection (None once under a sequence or a complex key).
    let mut paths: Vec<Option<Vec<String>>> = Vec::new();
    let mut document = 0usize;
    let mut seen_document = false;
    // The key site waiting for its value.
    let mut pending: Option<usize> = None;
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| EditError::Parse {
            origin: origin.to_string(),
            offset: e.marker().byte_offset().unwrap_or(0),
            message: e.info().to_string(),
        })?;
        let start = span.start.byte_offset().unwrap_or(0);
        let end = span.end.byte_offset().unwrap_or(0);
        match event {
            Event::DocumentStart(..) => {
                if seen_document {
                    document += 1;
                }
                seen_document = true;
                stack.clear();
                paths.clear();
                pending = None;
            }
            Event::Scalar(value, ..) => {
                if let Some(Frame::Mapping {
                    key,
                    expecting_key,
                    flow,
                }) = stack.last_mut()
                    && *expecting_key
                {
                    *key = Some(value.to_string());
                    *expecting_key = false;
                    if let Some(Some(parent)) = paths.last()
                        && !*flow
                    {
                        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
                        let before = &text[line_start..start];
                        let mut path = parent.clone();
                        path.push(value.to_string());
                        sites.push(KeySite {
                            document,
                            path,
                            key_start: start,
                            key_end: end,
                            indent: before.chars().count(),
                            own_line: before.chars().all(|c| c == ' '),
                            value_is_sequence: false,
                            scalar: None,
                        });
                        pending = Some(sites.len() - 1);
                    } else {
                        pending = None;
                    }
                    continue;
                }
                if let Some(index) = pending.take() {
                    sites[index].scalar = Some((start, end));
                }
                advance(&mut stack);
            }
            Event::Alias(_) => {
                pending = None;
                advance(&mut stack);
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let flow = matches!(text.as_bytes().get(start), Some(b'{' | b'['));
                let key_frame = matches!(
                    stack.last(),
                    Some(Frame::Mapping {
                        expecting_key: true,
                        ..
                    })
                );
                let path = if key_frame {
                    // A complex key: nothing under it is edited.
                    if let Some(Frame::Mapping { expecting_key, .. }) = stack.last_mut() {
                        *expecting_key = false;
                    }
                    None
                } else {
                    match (stack.last(), paths.last()) {
                        (None, _) => Some(Vec::new()),
                        (Some(Frame::Mapping { key: Some(k), .. }), Some(Some(parent))) => {
                            let mut p = parent.clone();
                            p.push(k.clone());
                            Some(p)
                        }
                        _ => None,
                    }
                };
                if let Some(index) = pending.take()
                    && matches!(event, Event::SequenceStart(..))
                    && !flow
                {
                    sites[index].value_is_sequence = true;
                }
                stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Mapping {
                        key: None,
                        expecting_key: true,
                        flow,
                    }
                } else {
                    Frame::Sequence
                });
                paths.push(path);
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                paths.pop();
                advance(&mut stack);
            }
            _ => {}
        }
    }
    Ok(sites)
}

fn advance(stack: &mut [Frame]) {
    if let Some(Frame::Mapping { expecting_key, .. }) = stack.last_mut() {
        *expecting_key = true;
    }
}

fn not_found(origin: &str, document: usize, path: &[String]) -> EditError {
    EditError::NotFound {
        origin: origin.to_string(),
        document,
        path: path_text(
            &path
                .iter()
                .map(|k| Segment::Key(k.clone()))
                .collect::<Vec<_>>(),
        ),
    }
}

fn site<'a>(sites: &'a [KeySite], document: usize, path: &[String]) -> Option<&'a KeySite> {
    sites
        .iter()
        .find(|s| s.document == document && s.path == path)
}

/// The byte offset of the start of the line holding `at`.
fn line_start(text: &str, at: usize) -> usize {
    text[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// The byte range of a key's own lines: its line, and every following line indented deeper
/// (or, for a block sequence value, its `- ` items at the key's column), blank lines inside
/// included and trailing blank lines left alone.
fn key_lines(text: &str, site: &KeySite) -> (usize, usize) {
    let start = line_start(text, site.key_start);
    let mut cursor = text[site.key_start..]
        .find('\n')
        .map_or(text.len(), |i| site.key_start + i + 1);
    let mut end = cursor;
    while cursor < text.len() {
        let next = text[cursor..]
            .find('\n')
            .map_or(text.len(), |i| cursor + i + 1);
        let line = text[cursor..next].trim_end_matches(['\n', '\r']);
        let indent = line.len() - line.trim_start_matches(' ').len();
        let rest = &line[indent..];
        if rest.is_empty() {
            cursor = next;
            continue;
        }
        let inside = indent > site.indent
            || (site.value_is_sequence
                && indent == site.indent
                && (rest == "-" || rest.starts_with("- ")));
        if !inside {
            break;
        }
        cursor = next;
        end = next;
    }
    (start, end)
}

/// Removes the key at `path` (and its value's lines).
pub fn remove_key(
    text: &str,
    origin: &str,
    document: usize,
    path: &[String],
) -> Result<String, EditError> {
    let sites = key_sites(text, origin)?;
    let site = site(&sites, document, path)
        .filter(|s| s.own_line)
        .ok_or_else(|| not_found(origin, document, path))?;
    let (start, end) = key_lines(text, site);
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..start]);
    out.push_str(&text[end..]);
    Ok(out)
}

/// Renames the key at `path` to `new_key` in place (its value untouched).
pub fn rename_key(
    text: &str,
    origin: &str,
    document: usize,
    path: &[String],
    new_key: &str,
) -> Result<String, EditError> {
    let sites = key_sites(text, origin)?;
    let site = site(&sites, document, path).ok_or_else(|| not_found(origin, document, path))?;
    Ok(super::edit::splice(
        text,
        &[(site.key_start, site.key_end, key_text(new_key))],
    ))
}

/// Sets the value at `path`: an existing scalar is replaced in place; any other value is
/// written as the key's new lines where the old ones were; a new key is added after its
/// parent's last line (the parent must exist, as a block mapping or the document's root).
pub fn set_value(
    text: &str,
    origin: &str,
    document: usize,
    path: &[String],
    value: &Value,
) -> Result<String, EditError> {
    let sites = key_sites(text, origin)?;
    let Some((key, parent)) = path.split_last() else {
        return Err(not_found(origin, document, path));
    };
    if let Some(existing) = site(&sites, document, path) {
        if let (Some((start, end)), Some(scalar)) = (existing.scalar, scalar_text(value)) {
            let quoted = match text.as_bytes().get(start) {
                Some(b'\'') => Some('\''),
                Some(b'"') => Some('"'),
                _ => None,
            };
            let written = match value {
                Value::String(s) => render_scalar(s, quoted),
                _ => scalar,
            };
            return Ok(super::edit::splice(text, &[(start, end, written)]));
        }
        if !existing.own_line {
            return Err(not_found(origin, document, path));
        }
        let (start, end) = key_lines(text, existing);
        let mut out = String::with_capacity(text.len());
        out.push_str(&text[..start]);
        out.push_str(&entry(key, value, existing.indent));
        out.push_str(&text[end..]);
        return Ok(out);
    }
    // A new key: after the parent's last line, at its children's column.
    let (at, indent) = if parent.is_empty() {
        let roots: Vec<&KeySite> = sites
            .iter()
            .filter(|s| s.document == document && s.path.len() == 1)
            .collect();
        match roots.last() {
            Some(last) => (key_lines(text, last).1, last.indent),
            // An empty document (comments at most): the key goes at the end.
            None if document == 0
                && super::parse_documents(text, origin)
                    .is_ok_and(|d| d.iter().all(|v| v.is_null())) =>
            {
                (text.len(), 0)
            }
            None => return Err(not_found(origin, document, path)),
        }
    } else {
        let Some(parent_site) = site(&sites, document, parent) else {
            // No such parent: the nearest one that exists gets the missing mappings.
            let mut mapping = serde_json::Map::new();
            mapping.insert(key.clone(), value.clone());
            return set_value(text, origin, document, parent, &Value::Object(mapping));
        };
        if !parent_site.own_line || parent_site.value_is_sequence {
            return Err(not_found(origin, document, parent));
        }
        if let Some((start, end)) = parent_site.scalar {
            // An empty parent (`key:`, `key: null`, `key: {}`): it becomes the new mapping.
            if !matches!(text[start..end].trim(), "" | "null" | "~" | "{}") {
                return Err(not_found(origin, document, parent));
            }
            let mut mapping = serde_json::Map::new();
            mapping.insert(key.clone(), value.clone());
            return set_value(text, origin, document, parent, &Value::Object(mapping));
        }
        let children: Vec<&KeySite> = sites
            .iter()
            .filter(|s| {
                s.document == document && s.path.len() == path.len() && s.path.starts_with(parent)
            })
            .collect();
        match children.last() {
            Some(last) => (key_lines(text, last).1, last.indent),
            None => return Err(not_found(origin, document, parent)),
        }
    };
    let mut out = String::with_capacity(text.len() + 64);
    out.push_str(&text[..at]);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&entry(key, value, indent));
    out.push_str(&text[at..]);
    Ok(out)
}

/// A key as YAML: plain when that reads back as the same string, else double-quoted.
fn key_text(key: &str) -> String {
    render_scalar(key, None)
}

/// A scalar value as YAML text, or None for a collection (an empty one is a scalar here).
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(if plain_is_safe(s) {
            s.clone()
        } else {
            render_scalar(s, Some('"'))
        }),
        Value::Object(m) if m.is_empty() => Some("{}".into()),
        Value::Array(a) if a.is_empty() => Some("[]".into()),
        _ => None,
    }
}

/// `key: value` as block YAML lines at `indent`.
fn entry(key: &str, value: &Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    match scalar_text(value) {
        Some(scalar) => format!("{pad}{}: {scalar}\n", key_text(key)),
        None => format!("{pad}{}:\n{}", key_text(key), block(value, indent + 2)),
    }
}

/// A non-empty collection as block YAML at `indent`.
fn block(value: &Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut out = String::new();
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                out.push_str(&entry(k, v, indent));
            }
        }
        Value::Array(items) => {
            for item in items {
                match scalar_text(item) {
                    Some(scalar) => out.push_str(&format!("{pad}- {scalar}\n")),
                    None => {
                        // The item's block at indent + 2, its first line after `- `.
                        let inner = block(item, indent + 2);
                        out.push_str(&pad);
                        out.push_str("- ");
                        out.push_str(&inner[indent + 2..]);
                    }
                }
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(path: &str) -> Vec<String> {
        path.split('.').map(str::to_string).collect()
    }

    const TEXT: &str = "# top\ncrds:\n  # render the CRDs\n  enabled: true\n  # keep them\n  keep: true\n\nlogLevel: 2 # verbosity\nlist:\n- a\n- b\ntail: x\n";

    #[test]
    fn remove_takes_only_the_keys_own_lines() {
        let out = remove_key(TEXT, "t", 0, &p("crds.keep")).unwrap();
        assert_eq!(
            out,
            "# top\ncrds:\n  # render the CRDs\n  enabled: true\n  # keep them\n\nlogLevel: 2 # verbosity\nlist:\n- a\n- b\ntail: x\n"
        );
        let out = remove_key(TEXT, "t", 0, &p("list")).unwrap();
        assert!(out.ends_with("logLevel: 2 # verbosity\ntail: x\n"), "{out}");
        let out = remove_key(TEXT, "t", 0, &p("crds")).unwrap();
        assert!(out.starts_with("# top\n\nlogLevel"), "{out}");
        assert!(remove_key(TEXT, "t", 0, &p("nope")).is_err());
    }

    #[test]
    fn rename_changes_the_key_bytes_only() {
        let out = rename_key(TEXT, "t", 0, &p("crds.enabled"), "install").unwrap();
        assert_eq!(out, TEXT.replace("enabled: true", "install: true"));
        let out = rename_key(TEXT, "t", 0, &p("logLevel"), "yes").unwrap();
        assert!(out.contains("\"yes\": 2 # verbosity"), "{out}");
    }

    #[test]
    fn set_replaces_a_scalar_in_place_or_adds_a_key_after_its_siblings() {
        let out = set_value(TEXT, "t", 0, &p("logLevel"), &json!(4)).unwrap();
        assert_eq!(out, TEXT.replace("logLevel: 2", "logLevel: 4"));
        let out = set_value(TEXT, "t", 0, &p("crds.install"), &json!(true)).unwrap();
        assert!(
            out.contains("  keep: true\n  install: true\n\nlogLevel"),
            "{out}"
        );
        let out = set_value(
            TEXT,
            "t",
            0,
            &p("log"),
            &json!({"level": 2, "format": "on", "extra": [{"a": 1, "b": [1]}, "x"]}),
        )
        .unwrap();
        let parsed = crate::yaml::parse_document(&out, "t").unwrap();
        assert_eq!(
            parsed["log"],
            json!({"level": 2, "format": "on", "extra": [{"a": 1, "b": [1]}, "x"]})
        );
        assert!(out.starts_with(TEXT), "{out}");
        let out = set_value(TEXT, "t", 0, &p("list"), &json!(["c"])).unwrap();
        assert!(out.contains("list:\n  - c\ntail: x\n"), "{out}");
        let out = set_value(TEXT, "t", 0, &p("missing.key"), &json!(1)).unwrap();
        assert!(out.ends_with("tail: x\nmissing:\n  key: 1\n"), "{out}");
        assert!(set_value(TEXT, "t", 0, &p("logLevel.key"), &json!(1)).is_err());
        let out = set_value("", "t", 0, &p("a"), &json!("b")).unwrap();
        assert_eq!(out, "a: b\n");
    }
}
