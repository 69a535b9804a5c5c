//! Plain directory sources: every manifest file under the path, Lists expanded (argo-cd v3.5
//! `reposerver/repository/repository.go` `findManifests`).

use serde_json::Value;

use crate::git::Snapshot;
use crate::render::matching::loose_glob_match;
use crate::render::source::non_empty;
use crate::yaml;

/// Reads a plain-directory source (recurse, include, exclude as Argo CD applies them).
pub fn read_directory(
    snapshot: &Snapshot,
    path: &str,
    options: Option<&Value>,
) -> Result<Vec<Value>, String> {
    let recurse = options
        .and_then(|o| o.get("recurse"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let include = options
        .and_then(|o| o.get("include"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let exclude = options
        .and_then(|o| o.get("exclude"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if options
        .and_then(|o| o.get("jsonnet"))
        .is_some_and(|j| non_empty(Some(j)))
    {
        return Err("jsonnet directory sources are not supported by the gate".to_string());
    }
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    };
    let mut objects = Vec::new();
    for (file, content) in snapshot.files_under(path) {
        let relative = &file[prefix.len()..];
        if !recurse && relative.contains('/') {
            continue;
        }
        let is_manifest = [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| relative.ends_with(ext));
        if relative.ends_with(".jsonnet") || relative.ends_with(".libsonnet") {
            return Err(format!("{file}: jsonnet is not supported by the gate"));
        }
        if !is_manifest {
            continue;
        }
        if !include.is_empty() && !loose_glob_match(include, relative) {
            continue;
        }
        if !exclude.is_empty() && loose_glob_match(exclude, relative) {
            continue;
        }
        let text = yaml::utf8(content, file)?;
        // Argo CD leaves out files marked to be skipped, and YAML that does not look like a
        // Kubernetes manifest at all (no apiVersion, kind and metadata).
        if text.contains("+argocd:skip-file-rendering") {
            continue;
        }
        let looks_like_manifest =
            text.contains("apiVersion:") && text.contains("kind:") && text.contains("metadata:");
        if !relative.ends_with(".json") && !looks_like_manifest {
            continue;
        }
        let documents = yaml::parse_documents(text, file).map_err(|e| e.to_string())?;
        for (index, document) in documents.into_iter().enumerate() {
            if document.get("apiVersion").and_then(Value::as_str).is_none()
                || document.get("kind").and_then(Value::as_str).is_none()
            {
                return Err(format!(
                    "{file}: document {index} is not a Kubernetes object (it has no apiVersion or kind)"
                ));
            }
            push_object(document, &mut objects);
        }
    }
    Ok(objects)
}

/// Adds an object, expanding `List` kinds into their items (Argo CD does the same).
pub fn push_object(object: Value, out: &mut Vec<Value>) {
    let is_list = object.get("items").is_some_and(Value::is_array);
    if is_list {
        for item in object["items"].as_array().cloned().unwrap_or_default() {
            push_object(item, out);
        }
    } else if object.is_object() {
        out.push(object);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_are_expanded() {
        let mut out = Vec::new();
        push_object(
            json!({"kind": "List", "items": [{"kind": "A"}, {"kind": "ConfigMapList", "items": [{"kind": "B"}]}]}),
            &mut out,
        );
        assert_eq!(out.len(), 2);
    }
}
