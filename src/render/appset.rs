//! ApplicationSet expansion: generators -> parameter sets -> Applications, as Argo CD's
//! applicationset controller does (reference: argo-cd v3.5 `applicationset/generators`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::inventory::{Cluster, Inventory};
use super::matching::{LabelSelector, git_pathspec_match, go_path_match};
use super::params::{deep_merge, flatten_into, flatten_params, go_sprint, normalize_name};
use super::repos::RepoResolver;
use super::template::{
    Params, TemplateMode, collect_templates, fasttemplate, field_of, go_render_batch, map_strings,
};
use super::tools::Tool;
use crate::yaml;

/// Generators that need a live system (an SCM API, a plugin server, a CRD in the cluster).
const UNSUPPORTED_GENERATORS: &[&str] = &[
    "scmProvider",
    "pullRequest",
    "plugin",
    "clusterDecisionResource",
];
/// Argo CD lets matrix and merge nest one level.
const MAX_GENERATOR_NESTING: usize = 2;

/// What an expansion needs from the world.
pub struct ExpandContext<'a> {
    pub repos: &'a RepoResolver,
    pub inventory: &'a Inventory,
    pub helm: &'a Tool,
    /// A scratch directory for helm's template engine (goTemplate).
    pub work: &'a Path,
}

/// One parameter set and the per-generator template override it carries, if any.
#[derive(Debug, Clone)]
struct ParamSet {
    params: Params,
    template_override: Option<Value>,
}

struct Expander<'a> {
    ctx: &'a ExpandContext<'a>,
    mode: TemplateMode,
    calls: std::cell::Cell<usize>,
}

/// Expands one ApplicationSet into the Applications it generates, in generator order.
pub fn expand(appset: &Value, ctx: &ExpandContext) -> Result<Vec<Value>, String> {
    let spec = appset.get("spec").ok_or("has no spec")?;
    let go = spec
        .get("goTemplate")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let options: Vec<String> = spec
        .get("goTemplateOptions")
        .and_then(Value::as_array)
        .map(|o| {
            o.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mode = if go {
        TemplateMode::Go {
            missing_key_error: options
                .iter()
                .any(|o| o.replace(' ', "") == "missingkey=error"),
        }
    } else {
        TemplateMode::Fast
    };
    let expander = Expander {
        ctx,
        mode,
        calls: std::cell::Cell::new(0),
    };
    let namespace = appset
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("argocd");
    let template = spec.get("template").cloned().unwrap_or(json!({}));
    let template_patch = spec.get("templatePatch").and_then(Value::as_str);
    let generators = spec
        .get("generators")
        .and_then(Value::as_array)
        .ok_or("has no spec.generators")?;

    let mut applications = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, generator) in generators.iter().enumerate() {
        let sets = expander
            .generate(generator, &Params::new(), 0)
            .map_err(|e| format!("generators[{index}]: {e}"))?;
        // Group parameter sets by their template so each template is rendered in one batch.
        let mut by_template: BTreeMap<String, (Value, Vec<Params>)> = BTreeMap::new();
        let mut order = Vec::new();
        for set in sets {
            let mut effective = template.clone();
            if let Some(Value::Object(override_map)) = &set.template_override
                && let Value::Object(base) = &mut effective
            {
                deep_merge(base, override_map, true);
            }
            let key = effective.to_string();
            order.push((
                key.clone(),
                by_template.get(&key).map(|(_, p)| p.len()).unwrap_or(0),
            ));
            by_template
                .entry(key)
                .or_insert_with(|| (effective, Vec::new()))
                .1
                .push(set.params);
        }
        let mut rendered_by_template: HashMap<String, Vec<Value>> = HashMap::new();
        for (key, (effective, param_sets)) in &by_template {
            let mut with_patch = effective.clone();
            if let Some(patch) = template_patch {
                with_patch["__templatePatch"] = Value::String(patch.to_string());
            }
            let rendered = expander.render_value(&with_patch, param_sets)?;
            rendered_by_template.insert(key.clone(), rendered);
        }
        for (key, position) in order {
            let mut rendered = rendered_by_template[&key][position].clone();
            let patch = rendered
                .as_object_mut()
                .and_then(|m| m.remove("__templatePatch"));
            let mut application = json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application",
                "metadata": rendered.get("metadata").cloned().unwrap_or(json!({})),
                "spec": rendered.get("spec").cloned().unwrap_or(json!({})),
            });
            if let Some(Value::String(patch)) = patch {
                let patch_value = yaml::parse_document(&patch, "templatePatch")
                    .map_err(|e| format!("templatePatch renders invalid YAML: {}", e.message))?;
                let project = application.pointer("/spec/project").cloned();
                json_patch::merge(&mut application, &patch_value);
                // Argo CD discards templatePatch changes to spec.project.
                if let Some(project) = project {
                    application["spec"]["project"] = project;
                }
            }
            application["metadata"]["namespace"] = Value::String(namespace.to_string());
            let name = application
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if name.is_empty() {
                return Err("generates an Application without metadata.name".to_string());
            }
            if let Some(first) = seen.insert(name.clone(), applications.len()) {
                let _ = first;
                return Err(format!(
                    "generates two Applications named {name:?} (Argo CD refuses duplicate names); make the template's metadata.name unique per parameter set"
                ));
            }
            applications.push(application);
        }
    }
    Ok(applications)
}

impl Expander<'_> {
    /// Renders every string of `value` once per parameter set.
    fn render_value(&self, value: &Value, param_sets: &[Params]) -> Result<Vec<Value>, String> {
        match &self.mode {
            TemplateMode::Fast => param_sets
                .iter()
                .map(|p| map_strings(value, &mut |s| fasttemplate(s, p)))
                .collect(),
            TemplateMode::Go { missing_key_error } => {
                let mut templates = Vec::new();
                collect_templates(value, &mut templates);
                if templates.is_empty() {
                    return Ok(vec![value.clone(); param_sets.len()]);
                }
                let call = self.calls.get();
                self.calls.set(call + 1);
                let work = self.ctx.work.join(format!("go-{call}"));
                let rows = go_render_batch(
                    self.ctx.helm,
                    &work,
                    &templates,
                    param_sets,
                    *missing_key_error,
                )
                .map_err(|e| {
                    // Name the field of the template the error quotes.
                    let field = templates
                        .iter()
                        .find(|t| e.contains(&format!("{t:?}")))
                        .and_then(|t| field_of(value, t));
                    match field {
                        Some(field) if !field.is_empty() => format!("field {field}: {e}"),
                        _ => e,
                    }
                })?;
                rows.into_iter()
                    .map(|row| {
                        let lookup: HashMap<&str, &str> = templates
                            .iter()
                            .map(String::as_str)
                            .zip(row.iter().map(String::as_str))
                            .collect();
                        map_strings(value, &mut |s| {
                            Ok(lookup
                                .get(s)
                                .map(|r| r.to_string())
                                .unwrap_or_else(|| s.to_string()))
                        })
                    })
                    .collect()
            }
        }
    }

    fn generate(
        &self,
        generator: &Value,
        inherited: &Params,
        nesting: usize,
    ) -> Result<Vec<ParamSet>, String> {
        let object = generator
            .as_object()
            .ok_or("a generator must be an object")?;
        let selector = LabelSelector::from_value(object.get("selector"))
            .map_err(|e| format!("selector: {e}"))?;
        // `generators[i].template` is not a field of a generator (the API server prunes it);
        // Argo CD reads the generator's own `generators[i].<kind>.template`, and only at the top
        // level: the templates of a matrix's or merge's children are ignored.
        let kinds: Vec<&String> = object
            .keys()
            .filter(|k| *k != "selector" && *k != "template")
            .collect();
        let [kind] = kinds.as_slice() else {
            return Err(format!(
                "a generator must have exactly one kind, found {:?}",
                kinds
            ));
        };
        let body = &object[kind.as_str()];
        let template_override = body
            .get("template")
            .filter(|t| nesting == 0 && t.as_object().is_some_and(|o| !o.is_empty()))
            .cloned();
        let with_override = |sets: Vec<ParamSet>| -> Vec<ParamSet> {
            sets.into_iter()
                .map(|set| ParamSet {
                    params: set.params,
                    template_override: template_override.clone(),
                })
                .collect()
        };
        let params = match kind.as_str() {
            "list" => self.list(body)?,
            "clusters" => self.clusters(body)?,
            "git" => self.git(body)?,
            "matrix" => {
                return self
                    .matrix(body, nesting)
                    .map(|sets| filter(with_override(sets), &selector));
            }
            "merge" => {
                return self
                    .merge(body, nesting)
                    .map(|sets| filter(with_override(sets), &selector));
            }
            unsupported if UNSUPPORTED_GENERATORS.contains(&unsupported) => {
                return Err(format!(
                    "generator `{unsupported}` is not supported by the gate: it needs a live service to enumerate parameters, so this ApplicationSet cannot be previewed"
                ));
            }
            other => return Err(format!("unknown generator `{other}`")),
        };
        let _ = inherited;
        let sets = params
            .into_iter()
            .map(|params| ParamSet {
                params,
                template_override: template_override.clone(),
            })
            .collect();
        Ok(filter(sets, &selector))
    }

    fn list(&self, body: &Value) -> Result<Vec<Params>, String> {
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

    fn clusters(&self, body: &Value) -> Result<Vec<Params>, String> {
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

    fn git(&self, body: &Value) -> Result<Vec<Params>, String> {
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
                let text = snapshot.read_string(path).unwrap_or_default();
                let parsed = yaml::parse_document(&text, path).map_err(|e| e.to_string())?;
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

    fn children<'v>(
        &self,
        body: &'v Value,
        kind: &str,
        nesting: usize,
    ) -> Result<&'v Vec<Value>, String> {
        if nesting >= MAX_GENERATOR_NESTING {
            return Err(format!(
                "{kind} generators nest at most {MAX_GENERATOR_NESTING} levels deep"
            ));
        }
        body.get("generators")
            .and_then(Value::as_array)
            .ok_or(format!("{kind}.generators is required"))
    }

    fn matrix(&self, body: &Value, nesting: usize) -> Result<Vec<ParamSet>, String> {
        let children = self.children(body, "matrix", nesting)?;
        if children.len() != 2 {
            return Err(format!(
                "matrix needs exactly 2 child generators, found {}",
                children.len()
            ));
        }
        let first = self
            .generate(&children[0], &Params::new(), nesting + 1)
            .map_err(|e| format!("matrix child 0: {e}"))?;
        let mut out = Vec::new();
        for left in first {
            // The second child may use the first child's parameters.
            let second_spec = self
                .render_value(&children[1], std::slice::from_ref(&left.params))?
                .remove(0);
            let second = self
                .generate(&second_spec, &left.params, nesting + 1)
                .map_err(|e| format!("matrix child 1: {e}"))?;
            for right in second {
                let params = self.combine(&left.params, &right.params)?;
                // Child template overrides are ignored inside a matrix.
                out.push(ParamSet {
                    params,
                    template_override: None,
                });
            }
        }
        Ok(out)
    }

    fn combine(&self, left: &Params, right: &Params) -> Result<Params, String> {
        let mut combined = left.clone();
        if self.mode.is_go() {
            deep_merge(&mut combined, right, false);
            return Ok(combined);
        }
        for (k, v) in right {
            match left.get(k) {
                Some(existing) if existing != v => {
                    return Err(format!(
                        "found duplicate key {k} with different value, a: {} ,b: {}",
                        go_sprint(existing),
                        go_sprint(v)
                    ));
                }
                _ => {
                    combined.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(combined)
    }

    fn merge(&self, body: &Value, nesting: usize) -> Result<Vec<ParamSet>, String> {
        let children = self.children(body, "merge", nesting)?;
        let keys: Vec<String> = body
            .get("mergeKeys")
            .and_then(Value::as_array)
            .map(|k| {
                k.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if keys.is_empty() {
            return Err("merge.mergeKeys is required".to_string());
        }
        if children.len() < 2 {
            return Err("merge needs at least 2 child generators".to_string());
        }
        // Argo CD looks merge keys up among the top-level parameters.
        let key_of = |params: &Params| -> String {
            keys.iter()
                .map(|k| params.get(k).map(go_sprint).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\u{0}")
        };
        let mut base = self
            .generate(&children[0], &Params::new(), nesting + 1)
            .map_err(|e| format!("merge child 0: {e}"))?;
        let mut base_keys = std::collections::HashSet::new();
        for set in &base {
            let key = key_of(&set.params);
            if !base_keys.insert(key.clone()) {
                return Err(format!(
                    "merge child 0: the parameters from a generator were not unique by the given mergeKeys ({} = {:?} twice)",
                    keys.join(", "),
                    key.replace('\u{0}', ",")
                ));
            }
        }
        for (index, child) in children.iter().enumerate().skip(1) {
            let sets = self
                .generate(child, &Params::new(), nesting + 1)
                .map_err(|e| format!("merge child {index}: {e}"))?;
            let mut by_key: HashMap<String, Params> = HashMap::new();
            for set in sets {
                let key = key_of(&set.params);
                if by_key.insert(key.clone(), set.params).is_some() {
                    return Err(format!(
                        "merge child {index}: two parameter sets share the merge key {:?}",
                        key.replace('\u{0}', ",")
                    ));
                }
            }
            for set in &mut base {
                if let Some(overlay) = by_key.get(&key_of(&set.params)) {
                    if self.mode.is_go() {
                        deep_merge(&mut set.params, overlay, true);
                    } else {
                        set.params.extend(overlay.clone());
                    }
                }
            }
        }
        Ok(base)
    }
}

fn filter(sets: Vec<ParamSet>, selector: &LabelSelector) -> Vec<ParamSet> {
    if selector.is_empty() {
        return sets;
    }
    sets.into_iter()
        .filter(|s| selector.matches(&flatten_params(&s.params)))
        .collect()
}
