//! ApplicationSet expansion's room for the generators that read parameters from a source:
//! list, clusters and git (with their templated `values` and path parameters).

use serde_json::{Map, Value, json};

use crate::render::appset::Expander;
use crate::render::inventory::Cluster;
use crate::render::matching::{LabelSelector, git_pathspec_match, go_path_match};
use crate::render::params::{deep_merge, flatten_into, go_sprint, normalize_name};
use crate::render::template::Params;
use crate::yaml;

impl Expander<'_> {
    pub(super) fn list(&self, body: &Value) -> Result<Vec<Params>, String> {
        let mut out = Vec::new();
        for (index, element) in body
            .get("elements")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let element = element
                .as_object()
                .ok_or(format!("list.elements[{index}] is not an object"))?;
            if self.mode.is_go() {
                out.push(element.clone());
                continue;
            }
            let mut params = Params::new();
            for (key, value) in element {
                if key == "values" {
                    let values = value.as_object().ok_or("error parsing values map")?;
                    for (k, v) in values {
                        let v = v.as_str().ok_or(format!(
                            "list.elements[{index}].values.{k}: error parsing value as string {}",
                            go_sprint(v)
                        ))?;
                        params.insert(format!("values.{k}"), Value::String(v.to_string()));
                    }
                } else {
                    let v = value.as_str().ok_or(format!(
                        "list.elements[{index}].{key}: error parsing value as string {} (without goTemplate, list elements must be strings)",
                        go_sprint(value)
                    ))?;
                    params.insert(key.clone(), Value::String(v.to_string()));
                }
            }
            out.push(params);
        }
        if let Some(text) = body.get("elementsYaml").and_then(Value::as_str) {
            let parsed =
                yaml::parse_document(text, "list.elementsYaml").map_err(|e| e.to_string())?;
            for element in parsed
                .as_array()
                .ok_or("list.elementsYaml must be a YAML list")?
            {
                out.push(
                    element
                        .as_object()
                        .cloned()
                        .ok_or("list.elementsYaml entries must be objects")?,
                );
            }
        }
        Ok(out)
    }

    pub(super) fn clusters(&self, body: &Value) -> Result<Vec<Params>, String> {
        let selector = LabelSelector::from_value(body.get("selector"))
            .map_err(|e| format!("clusters.selector: {e}"))?;
        let inventory = self.ctx.inventory;
        let mut clusters: Vec<Cluster> = Vec::new();
        // Argo CD adds the local cluster first, only when the selector is empty and no Secret
        // already names its server.
        if selector.is_empty() {
            clusters.extend(inventory.implicit_in_cluster());
        }
        let mut with_secret: Vec<Cluster> = inventory
            .clusters
            .iter()
            .filter(|c| selector.matches(&c.labels))
            .cloned()
            .collect();
        with_secret.sort_by(|a, b| a.name.cmp(&b.name));
        clusters.extend(with_secret);
        let values = body
            .get("values")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let flat_list = body
            .get("flatList")
            .and_then(Value::as_bool)
            .unwrap_or(false);

        let mut out = Vec::new();
        for cluster in &clusters {
            let mut params = Params::new();
            params.insert("name".into(), Value::String(cluster.name.clone()));
            params.insert(
                "nameNormalized".into(),
                Value::String(normalize_name(&cluster.name)),
            );
            params.insert("server".into(), Value::String(cluster.server.clone()));
            params.insert("project".into(), Value::String(cluster.project.clone()));
            if self.mode.is_go() {
                let mut metadata = Map::new();
                if !cluster.labels.is_empty() {
                    metadata.insert("labels".into(), json!(cluster.labels));
                }
                if !cluster.annotations.is_empty() {
                    metadata.insert("annotations".into(), json!(cluster.annotations));
                }
                if !metadata.is_empty() {
                    params.insert("metadata".into(), Value::Object(metadata));
                }
            } else {
                for (k, v) in &cluster.labels {
                    params.insert(format!("metadata.labels.{k}"), Value::String(v.clone()));
                }
                for (k, v) in &cluster.annotations {
                    params.insert(
                        format!("metadata.annotations.{k}"),
                        Value::String(v.clone()),
                    );
                }
            }
            out.push(params);
        }
        let out = self.append_templated_values(out, &values)?;
        if flat_list {
            return Ok(vec![Params::from_iter([(
                "clusters".to_string(),
                Value::Array(out.into_iter().map(Value::Object).collect()),
            )])]);
        }
        Ok(out)
    }

    /// A generator's `values` map, each value itself a template over the generator's params.
    fn append_templated_values(
        &self,
        mut sets: Vec<Params>,
        values: &Map<String, Value>,
    ) -> Result<Vec<Params>, String> {
        if values.is_empty() {
            return Ok(sets);
        }
        let rendered = self.render_value(&Value::Object(values.clone()), &sets)?;
        for (params, rendered) in sets.iter_mut().zip(rendered) {
            let rendered = rendered.as_object().cloned().unwrap_or_default();
            if self.mode.is_go() {
                params.insert("values".into(), Value::Object(rendered));
            } else {
                for (k, v) in rendered {
                    params.insert(format!("values.{k}"), Value::String(go_sprint(&v)));
                }
            }
        }
        Ok(sets)
    }

    pub(super) fn git(&self, body: &Value) -> Result<Vec<Params>, String> {
        let url = body
            .get("repoURL")
            .and_then(Value::as_str)
            .ok_or("git.repoURL is required")?;
        let revision = body.get("revision").and_then(Value::as_str).unwrap_or("");
        let snapshot = self.ctx.repos.resolve(url, revision)?;
        let prefix = body
            .get("pathParamPrefix")
            .and_then(Value::as_str)
            .unwrap_or("");
        let values = body
            .get("values")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let patterns = |key: &str| -> Vec<(String, bool)> {
            body.get(key)
                .and_then(Value::as_array)
                .map(|entries| {
                    entries
                        .iter()
                        .filter_map(|e| {
                            let path = e.get("path").and_then(Value::as_str)?;
                            Some((
                                path.to_string(),
                                e.get("exclude").and_then(Value::as_bool).unwrap_or(false),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let directories = patterns("directories");
        let files = patterns("files");
        let mut out = Vec::new();
        if !directories.is_empty() {
            // Argo CD skips hidden directories (reposerver.include.hidden.directories is off).
            for dir in snapshot
                .directories()
                .into_iter()
                .filter(|d| !d.split('/').any(|s| s.starts_with('.')))
            {
                let included = directories
                    .iter()
                    .any(|(p, ex)| !ex && go_path_match(p, &dir));
                let excluded = directories
                    .iter()
                    .any(|(p, ex)| *ex && go_path_match(p, &dir));
                if included && !excluded {
                    out.push(self.path_params(&dir, None, prefix));
                }
            }
        } else if !files.is_empty() {
            let matched: Vec<&str> = snapshot
                .paths()
                .filter(|path| {
                    // Argo CD lists files with `git ls-files -- <pattern>`: `*` crosses `/`.
                    files
                        .iter()
                        .any(|(p, ex)| !ex && git_pathspec_match(p, path))
                        && !files
                            .iter()
                            .any(|(p, ex)| *ex && git_pathspec_match(p, path))
                })
                .collect();
            for path in matched {
                let file_key = (snapshot.commit.clone(), path.to_string());
                let known = self.git_files.borrow().get(&file_key).cloned();
                let parsed = match known {
                    Some(parsed) => parsed,
                    None => {
                        let text = snapshot.read_string(path).unwrap_or_default();
                        let parsed =
                            yaml::parse_document(&text, path).map_err(|e| e.to_string())?;
                        self.git_files.borrow_mut().insert(file_key, parsed.clone());
                        parsed
                    }
                };
                let entries: Vec<Value> = match parsed {
                    Value::Array(items) => items,
                    Value::Object(_) => vec![parsed],
                    // An empty file still yields its path parameters.
                    Value::Null => vec![Value::Object(Map::new())],
                    _ => {
                        return Err(format!(
                            "{path}: a git files generator file must hold an object or a list of objects"
                        ));
                    }
                };
                let (dir, file) = path.rsplit_once('/').unwrap_or((".", path));
                for entry in entries {
                    let object = entry
                        .as_object()
                        .ok_or(format!("{path}: list entries must be objects"))?;
                    let mut params = Params::new();
                    if self.mode.is_go() {
                        params = object.clone();
                    } else {
                        flatten_into("", &entry, &mut params);
                    }
                    let path_params = self.path_params(dir, Some(file), prefix);
                    if self.mode.is_go() {
                        deep_merge(&mut params, &path_params, true);
                    } else {
                        params.extend(path_params);
                    }
                    out.push(params);
                }
            }
        } else {
            return Err("git generator needs directories or files".to_string());
        }
        self.append_templated_values(out, &values)
    }

    fn path_params(&self, dir: &str, file: Option<&str>, prefix: &str) -> Params {
        let segments: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
        let basename = segments.last().copied().unwrap_or(dir).to_string();
        let mut params = Params::new();
        if self.mode.is_go() {
            let mut path = Map::new();
            path.insert("path".into(), json!(dir));
            path.insert("basename".into(), json!(basename));
            path.insert(
                "basenameNormalized".into(),
                json!(normalize_name(&basename)),
            );
            path.insert("segments".into(), json!(segments));
            if let Some(file) = file {
                path.insert("filename".into(), json!(file));
                path.insert("filenameNormalized".into(), json!(normalize_name(file)));
            }
            if prefix.is_empty() {
                params.insert("path".into(), Value::Object(path));
            } else {
                params.insert(prefix.to_string(), json!({ "path": path }));
            }
        } else {
            let key = |k: &str| {
                if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                }
            };
            params.insert(key("path"), json!(dir));
            params.insert(key("path.basename"), json!(basename));
            params.insert(
                key("path.basenameNormalized"),
                json!(normalize_name(&basename)),
            );
            for (i, segment) in segments.iter().enumerate() {
                params.insert(key(&format!("path[{i}]")), json!(segment));
            }
            if let Some(file) = file {
                params.insert(key("path.filename"), json!(file));
                params.insert(key("path.filenameNormalized"), json!(normalize_name(file)));
            }
        }
        params
    }
}
