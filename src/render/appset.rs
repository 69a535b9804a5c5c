//! ApplicationSet expansion: generators -> parameter sets -> Applications, as Argo CD's
//! applicationset controller does (reference: argo-cd v3.5 `applicationset/generators`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::inventory::{Cluster, Inventory};
use super::matching::{LabelSelector, git_pathspec_match, go_path_match};
use super::params::{
    deep_merge, flatten_into, flatten_params, go_sprint, merge_generator_template, normalize_name,
};
use super::repos::RepoResolver;
use super::template::{
    Params, TemplateMode, collect_templates, fasttemplate, field_of, go_render_batch, map_strings,
};
use super::tools::Tool;
use crate::yaml;

mod composite;
mod generators;

/// Generators that need a live system (an SCM API, a plugin server, a CRD in the cluster).
const UNSUPPORTED_GENERATORS: &[&str] = &[
    "scmProvider",
    "pullRequest",
    "plugin",
    "clusterDecisionResource",
];

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
    /// Files a git files generator read, by commit and path: a matrix runs its second
    /// generator once per parameter set of the first (600 clusters: 600 reads of one file).
    git_files: std::cell::RefCell<std::collections::HashMap<(String, String), Value>>,
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
        git_files: Default::default(),
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
                merge_generator_template(base, override_map);
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
}

fn filter(sets: Vec<ParamSet>, selector: &LabelSelector) -> Vec<ParamSet> {
    if selector.is_empty() {
        return sets;
    }
    sets.into_iter()
        .filter(|s| selector.matches(&flatten_params(&s.params)))
        .collect()
}
