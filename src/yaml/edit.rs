//! Lossless YAML edits: every scalar value's byte span, found from parser events, and edits
//! that replace exactly those bytes. Comments, quoting, key order, blank lines, anchors and
//! document separators around an edit stay as they were.

use granit_parser::{Event, Parser, ScalarStyle};

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

impl std::fmt::Display for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Segment::Key(k) => write!(f, "{k}"),
            Segment::Index(i) => write!(f, "{i}"),
        }
    }
}

/// Where a scalar value sits: document (0-based, counting every document in the stream,
/// empty ones included), path, and byte range of its source text (quotes included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalarSite {
    pub document: usize,
    pub path: Vec<Segment>,
    pub start: usize,
    pub end: usize,
    pub value: String,
    pub quoted: Option<char>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("{origin}: malformed YAML at byte {offset}: {message}")]
    Parse {
        origin: String,
        offset: usize,
        message: String,
    },
    #[error("{origin}: no scalar at {path} in document {document}")]
    NotFound {
        origin: String,
        document: usize,
        path: String,
    },
    #[error("{origin}: {path} in document {document} is a block scalar; it is not edited in place")]
    BlockScalar {
        origin: String,
        document: usize,
        path: String,
    },
}

enum Frame {
    Mapping {
        key: Option<String>,
        expecting_key: bool,
    },
    Sequence {
        index: usize,
    },
}

/// Joins a path for messages: `spec.items.0.name`.
pub fn path_text(path: &[Segment]) -> String {
    path.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// Every scalar value (not keys) of every document, with its path and byte span.
pub fn scalar_sites(text: &str, origin: &str) -> Result<Vec<(ScalarSite, ScalarStyle)>, EditError> {
    let mut sites = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut path: Vec<Segment> = Vec::new();
    let mut document = 0usize;
    let mut seen_document = false;
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| EditError::Parse {
            origin: origin.to_string(),
            offset: e.marker().byte_offset().unwrap_or(0),
            message: e.info().to_string(),
        })?;
        // The path of the node this event is: the current frame's key or index.
        let node_segment = |stack: &[Frame]| -> Option<Segment> {
            match stack.last() {
                Some(Frame::Mapping {
                    key: Some(k),
                    expecting_key: false,
                }) => Some(Segment::Key(k.clone())),
                Some(Frame::Sequence { index }) => Some(Segment::Index(*index)),
                _ => None,
            }
        };
        match event {
            Event::DocumentStart(..) => {
                if seen_document {
                    document += 1;
                }
                seen_document = true;
                stack.clear();
                path.clear();
            }
            Event::Scalar(value, style, _, _) => {
                if let Some(Frame::Mapping { key, expecting_key }) = stack.last_mut()
                    && *expecting_key
                {
                    *key = Some(value.to_string());
                    *expecting_key = false;
                    continue;
                }
                let mut full = path.clone();
                if let Some(segment) = node_segment(&stack) {
                    full.push(segment);
                }
                let (start, end) = (
                    span.start.byte_offset().unwrap_or(0),
                    span.end.byte_offset().unwrap_or(0),
                );
                let quoted = match style {
                    ScalarStyle::SingleQuoted => Some('\''),
                    ScalarStyle::DoubleQuoted => Some('"'),
                    _ => None,
                };
                sites.push((
                    ScalarSite {
                        document,
                        path: full,
                        start,
                        end,
                        value: value.to_string(),
                        quoted,
                    },
                    style,
                ));
                advance(&mut stack);
            }
            Event::Alias(_) => advance(&mut stack),
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let is_key = matches!(
                    stack.last(),
                    Some(Frame::Mapping {
                        expecting_key: true,
                        ..
                    })
                );
                if let Some(segment) = node_segment(&stack) {
                    path.push(segment);
                } else if is_key {
                    // A complex key: give it a name nothing matches.
                    if let Some(Frame::Mapping { key, expecting_key }) = stack.last_mut() {
                        *key = Some("\u{0}complex".into());
                        *expecting_key = false;
                    }
                    path.push(Segment::Key("\u{0}complex".into()));
                }
                stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Mapping {
                        key: None,
                        expecting_key: true,
                    }
                } else {
                    Frame::Sequence { index: 0 }
                });
                let _ = stack.len();
                // Remember whether this collection had a path segment: pop it at the end.
                if path.len() < stack.len() {
                    path.push(Segment::Key(String::new()));
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                path.pop();
                advance(&mut stack);
            }
            _ => {}
        }
    }
    // Paths were padded with an empty key for the root collection; drop it.
    for (site, _) in &mut sites {
        if site.path.first() == Some(&Segment::Key(String::new())) {
            site.path.remove(0);
        }
    }
    Ok(sites)
}

fn advance(stack: &mut [Frame]) {
    match stack.last_mut() {
        Some(Frame::Mapping { expecting_key, .. }) => *expecting_key = true,
        Some(Frame::Sequence { index }) => *index += 1,
        None => {}
    }
}

/// True when `value` can be written as a plain scalar and still read back as the same string
/// by a YAML 1.1 reader (helm, Kubernetes): no special characters, not a boolean, number or null.
pub fn plain_is_safe(value: &str) -> bool {
    if value.is_empty() || value.trim() != value {
        return false;
    }
    let lower = value.to_ascii_lowercase();
    let reserved = [
        "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~",
    ];
    if reserved.contains(&lower.as_str()) {
        return false;
    }
    if value.parse::<f64>().is_ok()
        || value.starts_with("0x")
        || value.starts_with("0o")
        || value.contains(['_']) && value.replace('_', "").parse::<f64>().is_ok()
    {
        return false;
    }
    let first = value.chars().next().unwrap_or(' ');
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) {
        return false;
    }
    !(value.contains(": ")
        || value
            .chars()
            .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
        || value.contains(" #")
        || value.ends_with(':')
        || value.contains('\n')
        || value.contains('\t'))
}

fn double_quote(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            // Line and paragraph separators: a YAML 1.1 reader folds them like line breaks.
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes `value` in the style the replaced scalar had, falling back to double quotes when a
/// plain scalar would change meaning.
pub fn render_scalar(value: &str, quoted: Option<char>) -> String {
    match quoted {
        Some('\'') if !value.contains('\n') => format!("'{}'", value.replace('\'', "''")),
        Some(_) => double_quote(value),
        None if plain_is_safe(value) => value.to_string(),
        None => double_quote(value),
    }
}

/// Replaces the scalar at `path` in `document` with `value`; every other byte stays.
pub fn set_scalar(
    text: &str,
    origin: &str,
    document: usize,
    path: &[Segment],
    value: &str,
) -> Result<String, EditError> {
    let sites = scalar_sites(text, origin)?;
    let Some((site, style)) = sites
        .iter()
        .find(|(s, _)| s.document == document && s.path == path)
    else {
        return Err(EditError::NotFound {
            origin: origin.to_string(),
            document,
            path: path_text(path),
        });
    };
    if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded) {
        return Err(EditError::BlockScalar {
            origin: origin.to_string(),
            document,
            path: path_text(path),
        });
    }
    Ok(splice(
        text,
        &[(site.start, site.end, render_scalar(value, site.quoted))],
    ))
}

/// Applies non-overlapping byte-range replacements.
pub fn splice(text: &str, edits: &[(usize, usize, String)]) -> String {
    let mut sorted: Vec<&(usize, usize, String)> = edits.iter().collect();
    sorted.sort_by_key(|(start, _, _)| *start);
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    for (start, end, replacement) in sorted {
        out.push_str(&text[cursor..*start]);
        out.push_str(replacement);
        cursor = *end;
    }
    out.push_str(&text[cursor..]);
    out
}

/// Parses Kargo's yaml-update key syntax: `a.b.0.c`, with `\.` for a literal dot.
pub fn parse_key_path(key: &str) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut chars = key.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'.') => {
                current.push('.');
                chars.next();
            }
            '.' => segments.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    segments.push(current);
    segments
        .into_iter()
        .map(|s| match s.parse::<usize>() {
            Ok(i) => Segment::Index(i),
            Err(_) => Segment::Key(s),
        })
        .collect()
}

/// Matches a path that may use `Index` where the document has a sequence, or `Key("0")` where
/// it has a mapping with numeric-looking keys.
pub fn find_site<'a>(
    sites: &'a [(ScalarSite, ScalarStyle)],
    document: usize,
    wanted: &[Segment],
) -> Option<&'a ScalarSite> {
    sites.iter().map(|(s, _)| s).find(|s| {
        s.document == document
            && s.path.len() == wanted.len()
            && s.path
                .iter()
                .zip(wanted)
                .all(|(have, want)| match (have, want) {
                    (a, b) if a == b => true,
                    (Segment::Key(k), Segment::Index(i)) => *k == i.to_string(),
                    _ => false,
                })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_have_paths_and_exact_spans() {
        let text = "# c\na: 1 # one\nb:\n  - x: \"q\"\n    y: 'z'\n  - plain\n---\nkind: K\napiVersion: g/v1 # trailing\n";
        let sites = scalar_sites(text, "t.yaml").unwrap();
        let found: Vec<(usize, String, &str)> = sites
            .iter()
            .map(|(s, _)| (s.document, path_text(&s.path), &text[s.start..s.end]))
            .collect();
        assert_eq!(
            found,
            vec![
                (0, "a".into(), "1"),
                (0, "b.0.x".into(), "\"q\""),
                (0, "b.0.y".into(), "'z'"),
                (0, "b.1".into(), "plain"),
                (1, "kind".into(), "K"),
                (1, "apiVersion".into(), "g/v1"),
            ]
        );
    }

    #[test]
    fn set_scalar_changes_only_that_value() {
        let text = "- addon: a\n  version: 0.10.3 # pinned\n\n- addon: b\n  version: \"1.19.2\"\n";
        let out = set_scalar(text, "t", 0, &parse_key_path("1.version"), "1.19.3").unwrap();
        assert_eq!(
            out,
            "- addon: a\n  version: 0.10.3 # pinned\n\n- addon: b\n  version: \"1.19.3\"\n"
        );
        let out = set_scalar(text, "t", 0, &parse_key_path("0.version"), "2.10.0").unwrap();
        assert_eq!(
            out,
            "- addon: a\n  version: 2.10.0 # pinned\n\n- addon: b\n  version: \"1.19.2\"\n"
        );
        assert!(set_scalar(text, "t", 0, &parse_key_path("5.version"), "x").is_err());
    }

    #[test]
    fn plain_scalars_that_would_change_meaning_are_quoted() {
        assert_eq!(render_scalar("yes", None), "\"yes\"");
        assert_eq!(render_scalar("1.20", None), "\"1.20\"");
        assert_eq!(
            render_scalar("external-secrets.io/v1", None),
            "external-secrets.io/v1"
        );
        assert_eq!(render_scalar("it's", Some('\'')), "'it''s'");
        // Separators a YAML 1.1 reader folds are escaped, never written raw.
        assert_eq!(render_scalar("a\u{2028}b", None), "\"a\\u2028b\"");
        assert_eq!(render_scalar("a\u{85}b", None), "\"a\\u0085b\"");
    }

    #[test]
    fn key_paths() {
        assert_eq!(
            parse_key_path("a.0.b\\.c"),
            vec![
                Segment::Key("a".into()),
                Segment::Index(0),
                Segment::Key("b.c".into())
            ]
        );
    }
}
