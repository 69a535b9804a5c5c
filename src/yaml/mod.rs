//! YAML reading for everything the project parses: repository manifests, helm output, values.
//!
//! The crate is `serde-saphyr` (maintained, fuzzed, no unsafe, already in kube's tree), configured
//! to read YAML the way Kubernetes and Helm do (YAML 1.1 booleans, `0755` as octal, duplicate keys
//! rejected). Lossless edits (Bosun's apiVersion swap) live beside this in later modules.

pub mod edit;
pub mod keys;

use serde_json::Value;

/// A YAML document that could not be read, with where it came from.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{origin}:{line}: malformed YAML: {message}")]
pub struct YamlError {
    /// Where the text came from: a repository path, `helm template <chart>`, a values file.
    pub origin: String,
    /// 1-based line of the first error, 0 when the parser could not tell.
    pub line: u64,
    /// The parser's message, on one line.
    pub message: String,
}

fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    // Kubernetes (sigs.k8s.io/yaml over go-yaml v2) and Helm read `0755` as octal.
    options.legacy_octal_numbers = true;
    options.with_snippet = false;
    let mut budget = serde_saphyr::Budget::default();
    // A chart can render thousands of objects into one stream.
    budget.max_documents = 1_000_000;
    options.budget = Some(budget);
    options
}

fn error(origin: &str, err: serde_saphyr::Error) -> YamlError {
    let line = err.location().map(|l| l.line()).unwrap_or(0);
    let message = err.to_string();
    // Keep the first line only: the message is shown as one line next to its origin.
    let message = message.lines().next().unwrap_or("").trim().to_string();
    YamlError {
        origin: origin.to_string(),
        line,
        message,
    }
}

/// The bytes of a file as text, or an error naming the file and the first byte that is not
/// UTF-8 (YAML is UTF-8; a silent U+FFFD would change what the gate compares).
pub fn utf8<'a>(bytes: &'a [u8], origin: &str) -> Result<&'a str, String> {
    std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "{origin}: not UTF-8 text (invalid byte at offset {})",
            e.valid_up_to()
        )
    })
}

/// Reads every non-empty document of a YAML stream as JSON values.
pub fn parse_documents(text: &str, origin: &str) -> Result<Vec<Value>, YamlError> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| error(origin, e))?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// The largest repository file the gate reads: the YAML parser's input budget (serde-saphyr's
/// `max_reader_input_bytes` default). A larger file is refused by the size git reports, before
/// a byte of it is read.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The most documents one render (a helm or kustomize stream) may hold. Real charts render
/// hundreds; a generated fleet chart tens of thousands.
pub const MAX_RENDERED_DOCUMENTS: usize = 200_000;

/// Reads a rendered stream (helm's or kustomize's output) document by document: the parser's
/// budgets (nodes, depth, aliases) apply to each document, so a chart rendering 50,000 objects
/// reads, and the stream as a whole may hold at most `max_documents`.
pub fn parse_stream(
    text: &str,
    origin: &str,
    max_documents: usize,
) -> Result<Vec<Value>, YamlError> {
    let mut options = options();
    if let Some(budget) = options.budget.as_mut() {
        // The caller already capped what the tool may print.
        budget.max_reader_input_bytes = None;
    }
    // One document (the usual piece, split at its `---` line): the parser reads the text in
    // place, about 1.6x faster than through a reader, under the same per-document budgets.
    if !has_second_document(text) {
        let documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
            .map_err(|e| error(origin, e))?;
        if documents.len() > max_documents {
            return Err(YamlError {
                origin: origin.to_string(),
                line: 0,
                message: format!("the render exceeds the limit of {max_documents} documents"),
            });
        }
        return Ok(documents.into_iter().filter(|d| !d.is_null()).collect());
    }
    let mut reader = text.as_bytes();
    let mut out = Vec::new();
    let mut documents = 0usize;
    for document in serde_saphyr::read_with_options::<_, Value>(&mut reader, options) {
        let document = document.map_err(|e| error(origin, e))?;
        documents += 1;
        if documents > max_documents {
            return Err(YamlError {
                origin: origin.to_string(),
                line: 0,
                message: format!("the render exceeds the limit of {max_documents} documents"),
            });
        }
        if !document.is_null() {
            out.push(document);
        }
    }
    Ok(out)
}

/// Whether a text may hold more than one document: a `---` or `...` line after content
/// (conservative: such a line inside a block scalar counts too, and so does content on a
/// `---` line itself). A lone carriage return is a line break to YAML and not to `lines()`:
/// such a text is always read through the reader.
fn has_second_document(text: &str) -> bool {
    if text
        .as_bytes()
        .windows(2)
        .any(|w| w[0] == b'\r' && w[1] != b'\n')
        || text.ends_with('\r')
    {
        return true;
    }
    let mut seen_content = false;
    for line in text.lines() {
        let rest = ["---", "..."].iter().find_map(|m| {
            line.strip_prefix(m)
                .filter(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r']))
        });
        match rest {
            Some(rest) => {
                if seen_content {
                    return true;
                }
                let rest = rest.trim();
                if !rest.is_empty() && !rest.starts_with('#') {
                    seen_content = true;
                }
            }
            None => {
                let trimmed = line.trim();
                if !trimmed.is_empty() && !trimmed.starts_with('#') {
                    seen_content = true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod second_document_tests {
    use super::has_second_document;

    #[test]
    fn only_a_text_that_cannot_hold_two_documents_takes_the_single_document_path() {
        for one in [
            "---\n# Source: x\napiVersion: v1\nkind: ConfigMap\n",
            "a: 1\n",
            "---\r\na: 1\r\n",
            "--- # c\na: 1\n",
            "",
        ] {
            assert!(!has_second_document(one), "{one:?}");
        }
        for two in [
            "a: 1\n---\nb: 2\n",
            "a: 1\n...\nb: 2\n",
            "--- [1, 2]\n...\n[3, 4]\n",
            "---\ra: 1\r---\rb: 2\r",
            "a: |\n  x\n---\n",
            "%YAML 1.2\n---\na: 1\n",
        ] {
            assert!(has_second_document(two), "{two:?}");
        }
    }
}

/// Reads one YAML document (an empty text is `null`).
pub fn parse_document(text: &str, origin: &str) -> Result<Value, YamlError> {
    let mut documents = parse_documents(text, origin)?;
    match documents.len() {
        0 => Ok(Value::Null),
        1 => Ok(documents.remove(0)),
        n => Err(YamlError {
            origin: origin.to_string(),
            line: 0,
            message: format!("expected one YAML document, found {n}"),
        }),
    }
}

/// Writes a value as YAML (used for human-readable output, never for files a person edits).
pub fn to_string(value: &Value) -> String {
    serde_saphyr::to_string(value).unwrap_or_else(|e| format!("# unserialisable value: {e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_maps(n: usize) -> String {
        let mut text = String::new();
        for i in 0..n {
            text.push_str(&format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\n  labels: {{app: x, tier: y}}\ndata:\n  a: \"1\"\n  b: \"2\"\n"
            ));
        }
        text
    }

    #[test]
    fn a_stream_of_fifty_thousand_objects_reads_and_the_total_is_capped() {
        // 50,000 objects are ~750,000 nodes: over the parser's per-stream default, within
        // its per-document one.
        let text = config_maps(50_000);
        let documents = parse_stream(&text, "helm template big", MAX_RENDERED_DOCUMENTS).unwrap();
        assert_eq!(documents.len(), 50_000);
        assert_eq!(documents[49_999]["metadata"]["name"], "cm-49999");
        let err = parse_stream(&config_maps(11), "helm template big", 10).unwrap_err();
        assert_eq!(err.message, "the render exceeds the limit of 10 documents");
        // A single document still has the parser's budgets.
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        assert!(parse_stream(&deep, "deep", 10).is_err());
    }

    #[test]
    fn reads_kubernetes_flavoured_yaml() {
        let docs = parse_documents("a: yes\nb: 0755\n---\n---\nc: [1]\n", "x.yaml").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["a"], Value::Bool(true));
        assert_eq!(docs[0]["b"], serde_json::json!(493));
    }

    #[test]
    fn malformed_yaml_names_file_and_line() {
        let err = parse_documents("a: 1\nb: [\n  c: d\n", "apps/x.yaml").unwrap_err();
        assert_eq!(err.origin, "apps/x.yaml");
        assert!(err.line >= 2, "{err}");
        assert!(err.to_string().starts_with("apps/x.yaml:"));
    }

    #[test]
    fn duplicate_keys_are_refused() {
        assert!(parse_documents("a: 1\na: 2\n", "d.yaml").is_err());
    }
}
