//! ApplicationSet expansion: generators -> parameter sets -> Applications, as Argo CD's
//! applicationset controller does (reference: argo-cd v3.5 `applicationset/generators`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{Value, json};

use super::inventory::Inventory;
use super::matching::LabelSelector;
use super::params::{flatten_params, merge_generator_template};
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

/// What the ApplicationSet CRD (v3.5.1's `openAPIV3Schema`) requires inside every template it
/// validates, the ApplicationSet's own and each generator's: (where, relative to the template,
/// `[]` for every item of a list; the fields required there once that place exists). The API
/// server refuses an ApplicationSet that lacks one (`Required value`), even where the controller
/// would merge the rest from the ApplicationSet's template. Found by the oracle
/// (tests/real_argocd.rs) on the process cluster's API server with the upstream CRD.
const TEMPLATE_REQUIRED: &[(&str, &[&str])] = &[
    ("", &["metadata", "spec"]),
    ("spec", &["destination", "project"]),
    ("spec.ignoreDifferences[]", &["kind"]),
    ("spec.info[]", &["name", "value"]),
    ("spec.source", &["repoURL"]),
    (
        "spec.source.directory.jsonnet.extVars[]",
        &["name", "value"],
    ),
    ("spec.source.directory.jsonnet.tlas[]", &["name", "value"]),
    ("spec.source.kustomize.replicas[]", &["count", "name"]),
    ("spec.source.plugin.env[]", &["name", "value"]),
    ("spec.sources[]", &["repoURL"]),
    (
        "spec.sources[].directory.jsonnet.extVars[]",
        &["name", "value"],
    ),
    (
        "spec.sources[].directory.jsonnet.tlas[]",
        &["name", "value"],
    ),
    ("spec.sources[].kustomize.replicas[]", &["count", "name"]),
    ("spec.sources[].plugin.env[]", &["name", "value"]),
    ("spec.sourceHydrator", &["drySource", "syncSource"]),
    (
        "spec.sourceHydrator.drySource",
        &["path", "repoURL", "targetRevision"],
    ),
    (
        "spec.sourceHydrator.drySource.directory.jsonnet.extVars[]",
        &["name", "value"],
    ),
    (
        "spec.sourceHydrator.drySource.directory.jsonnet.tlas[]",
        &["name", "value"],
    ),
    (
        "spec.sourceHydrator.drySource.kustomize.replicas[]",
        &["count", "name"],
    ),
    (
        "spec.sourceHydrator.drySource.plugin.env[]",
        &["name", "value"],
    ),
    ("spec.sourceHydrator.hydrateTo", &["targetBranch"]),
    ("spec.sourceHydrator.syncSource", &["path", "targetBranch"]),
];

/// Refuses an ApplicationSet the API server would refuse for a missing required field: its
/// `spec.template`, and [`TEMPLATE_REQUIRED`] in every template the CRD validates. A matrix or
/// merge nested inside a matrix or merge child is `x-kubernetes-preserve-unknown-fields` in the
/// CRD: the API server validates nothing in it, so neither does this.
fn check_required_template_fields(spec: &Value) -> Result<(), String> {
    /// The places `pattern` names under `value`, each with its path.
    fn places<'a>(
        path: String,
        value: &'a Value,
        pattern: &[&str],
        out: &mut Vec<(String, &'a Value)>,
    ) {
        let Some((first, rest)) = pattern.split_first() else {
            out.push((path, value));
            return;
        };
        let (key, each) = match first.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (*first, false),
        };
        let Some(child) = value.get(key).filter(|v| !v.is_null()) else {
            return;
        };
        let at = format!("{path}.{key}");
        if each {
            for (index, item) in child.as_array().into_iter().flatten().enumerate() {
                places(format!("{at}[{index}]"), item, rest, out);
            }
        } else {
            places(at, child, rest, out);
        }
    }
    fn template(path: &str, value: &Value) -> Result<(), String> {
        if !value.is_object() {
            return Err(format!(
                "{path} is not an object: the API server refuses the ApplicationSet"
            ));
        }
        for (pattern, fields) in TEMPLATE_REQUIRED {
            let segments: Vec<&str> = pattern.split('.').filter(|s| !s.is_empty()).collect();
            let mut found = Vec::new();
            places(path.to_string(), value, &segments, &mut found);
            for (at, object) in found {
                if !object.is_object() {
                    continue;
                }
                for field in *fields {
                    if object.get(*field).is_none_or(Value::is_null) {
                        return Err(format!(
                            "{at}.{field} is missing: the ApplicationSet CRD requires it, so the API server refuses the ApplicationSet (`spec.{at}.{field}: Required value`)"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
    fn generators(path: &str, list: &Value, nested: bool) -> Result<(), String> {
        let Some(list) = list.as_array() else {
            return Ok(());
        };
        for (index, generator) in list.iter().enumerate() {
            let Some(kinds) = generator.as_object() else {
                continue;
            };
            for (kind, body) in kinds {
                let combining = kind == "matrix" || kind == "merge";
                if nested && combining {
                    // Unvalidated by the CRD (preserve-unknown-fields).
                    continue;
                }
                let at = format!("{path}[{index}].{kind}");
                if let Some(t) = body.get("template") {
                    template(&format!("{at}.template"), t)?;
                }
                if combining {
                    generators(&format!("{at}.generators"), &body["generators"], true)?;
                }
            }
        }
        Ok(())
    }
    match spec.get("template") {
        Some(t) if !t.is_null() => template("template", t)?,
        _ => {
            return Err(
                "spec.template is missing: the ApplicationSet CRD requires it, so the API server refuses the ApplicationSet (`spec.template: Required value`)"
                    .to_string(),
            );
        }
    }
    generators("generators", &spec["generators"], false)
}

/// Expands one ApplicationSet into the Applications it generates, in generator order.
pub fn expand(appset: &Value, ctx: &ExpandContext) -> Result<Vec<Value>, String> {
    let spec = appset.get("spec").ok_or("has no spec")?;
    check_required_template_fields(spec)?;
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
    let preserve_resources = spec
        .pointer("/syncPolicy/preserveResourcesOnDeletion")
        .and_then(Value::as_bool)
        .unwrap_or(false);
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
        // Group parameter sets by their template so each template is rendered in one batch
        // (groups in the order of their template's JSON text, as a set with an override that
        // changes nothing joins the ApplicationSet's own template). A set without an override
        // takes the ApplicationSet's own template: neither copied nor written out per set (an
        // ApplicationSet of thousands of Applications has thousands of sets).
        let own_key = template.to_string();
        let mut by_template: BTreeMap<String, (Value, Vec<Params>)> = BTreeMap::new();
        let mut order = Vec::new();
        for set in sets {
            let key = match &set.template_override {
                Some(Value::Object(override_map)) if template.is_object() => {
                    let mut effective = template.clone();
                    if let Value::Object(base) = &mut effective {
                        merge_generator_template(base, override_map);
                    }
                    let key = effective.to_string();
                    by_template
                        .entry(key.clone())
                        .or_insert_with(|| (effective, Vec::new()));
                    key
                }
                _ => {
                    by_template
                        .entry(own_key.clone())
                        .or_insert_with(|| (template.clone(), Vec::new()));
                    own_key.clone()
                }
            };
            let sets_of = &mut by_template.get_mut(&key).expect("just inserted").1;
            order.push((key, sets_of.len()));
            sets_of.push(set.params);
        }
        // Each rendered template taken once, by its position.
        let mut rendered_by_template: HashMap<String, Vec<Option<Value>>> = HashMap::new();
        for (key, (effective, param_sets)) in &by_template {
            let mut with_patch = effective.clone();
            if let Some(patch) = template_patch {
                with_patch["__templatePatch"] = Value::String(patch.to_string());
            }
            let rendered = expander.render_value(&with_patch, param_sets)?;
            rendered_by_template.insert(key.clone(), rendered.into_iter().map(Some).collect());
        }
        for (key, position) in order {
            let mut rendered = rendered_by_template
                .get_mut(&key)
                .and_then(|r| r.get_mut(position))
                .and_then(Option::take)
                .unwrap_or(Value::Null);
            let patch = rendered
                .as_object_mut()
                .and_then(|m| m.remove("__templatePatch"));
            // Argo CD's `RenderTemplateParams` returns the template untouched for an empty
            // parameter set (a list element `{}`): nothing replaced, no finalizer added. The
            // templatePatch is still rendered.
            let (effective, param_sets) = &by_template[&key];
            let unparameterised = param_sets[position].is_empty();
            if unparameterised {
                rendered = effective.clone();
            }
            let mut part = |name: &str| {
                rendered
                    .as_object_mut()
                    .and_then(|m| m.remove(name))
                    .unwrap_or(json!({}))
            };
            let (metadata, spec) = (part("metadata"), part("spec"));
            let mut application = json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application",
                "metadata": metadata,
                "spec": spec,
            });
            if !unparameterised {
                add_resources_finalizer(&mut application, preserve_resources);
            }
            if let Some(Value::String(patch)) = patch {
                let patch_value = yaml::parse_document(&patch, "templatePatch")
                    .map_err(|e| format!("templatePatch renders invalid YAML: {}", e.message))?;
                let project = application.pointer("/spec/project").cloned();
                let finalizers = application.pointer("/metadata/finalizers").cloned();
                json_patch::merge(&mut application, &patch_value);
                unite_finalizers(&mut application, finalizers, &patch_value);
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

/// Argo CD applies a templatePatch as a strategic merge patch against its Application type
/// (`controllers/template/patch.go`), where `metadata.finalizers` is a list with the `merge`
/// strategy: a patch's finalizers join the Application's (before them, once each), an empty
/// list removes none, and only `null` removes them all. The gate's merge patch replaced the
/// list; this puts back what the strategic merge keeps. Other lists of an Application have no
/// strategy and are replaced in both.
fn unite_finalizers(application: &mut Value, before: Option<Value>, patch: &Value) {
    let Some(patched) = patch.pointer("/metadata/finalizers") else {
        return;
    };
    if patched.is_null() {
        return;
    }
    // The patch's first, in its order, then the Application's own that the patch did not name
    // (apimachinery's strategic merge orders a merged list of scalars so; the oracle saw it).
    let mut united: Vec<Value> = Vec::new();
    let ours = before
        .as_ref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for finalizer in patched.as_array().into_iter().flatten().chain(ours) {
        if !united.contains(finalizer) {
            united.push(finalizer.clone());
        }
    }
    if let Some(metadata) = application
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        if united.is_empty() {
            metadata.remove("finalizers");
        } else {
            metadata.insert("finalizers".into(), Value::Array(united));
        }
    }
}

/// Argo CD's `RenderTemplateParams` gives a generated Application the finalizer that deletes
/// its resources with it (`resources-finalizer.argocd.argoproj.io`) when the template names no
/// finalizer of its own and the ApplicationSet does not set
/// `syncPolicy.preserveResourcesOnDeletion`; a templatePatch applies after it. Found by the
/// oracle (tests/real_argocd.rs): every generated Application carries it on real Argo CD.
fn add_resources_finalizer(application: &mut Value, preserve_resources: bool) {
    let has_finalizers = application
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    if preserve_resources || has_finalizers {
        return;
    }
    if let Some(metadata) = application
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
    {
        metadata.insert(
            "finalizers".into(),
            json!(["resources-finalizer.argocd.argoproj.io"]),
        );
    }
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

#[cfg(test)]
mod finalizer_and_schema_tests {
    use super::*;

    #[test]
    fn a_generated_application_gets_the_resources_finalizer_unless_told_otherwise() {
        let mut plain = json!({"metadata": {"name": "a"}});
        add_resources_finalizer(&mut plain, false);
        assert_eq!(
            plain["metadata"]["finalizers"],
            json!(["resources-finalizer.argocd.argoproj.io"])
        );
        // preserveResourcesOnDeletion: none.
        let mut preserved = json!({"metadata": {"name": "a"}});
        add_resources_finalizer(&mut preserved, true);
        assert!(preserved["metadata"].get("finalizers").is_none());
        // The template's own finalizers are kept as they are.
        let mut own = json!({"metadata": {"name": "a", "finalizers": ["example.test/keep"]}});
        add_resources_finalizer(&mut own, false);
        assert_eq!(own["metadata"]["finalizers"], json!(["example.test/keep"]));
        // An empty list counts as none (Argo CD checks the length).
        let mut empty = json!({"metadata": {"name": "a", "finalizers": []}});
        add_resources_finalizer(&mut empty, false);
        assert_eq!(
            empty["metadata"]["finalizers"],
            json!(["resources-finalizer.argocd.argoproj.io"])
        );
    }

    #[test]
    fn every_template_needs_what_the_crd_requires() {
        let full = json!({"metadata": {}, "spec": {"project": "p", "destination": {}}});
        let ok = json!({"template": full, "generators": [
            {"list": {"elements": [], "template": full}},
            {"matrix": {"generators": [{"list": {"elements": [], "template": full}}]}},
        ]});
        assert_eq!(check_required_template_fields(&ok), Ok(()));
        let child_without_spec = json!({"template": full, "generators": [
            {"merge": {"mergeKeys": [], "generators": [{"clusters": {"template": {"metadata": {}}}}]}},
        ]});
        let error = check_required_template_fields(&child_without_spec).unwrap_err();
        assert!(
            error
                .starts_with("generators[0].merge.generators[0].clusters.template.spec is missing"),
            "{error}"
        );
        let no_project =
            json!({"template": {"metadata": {}, "spec": {"destination": {}}}, "generators": []});
        assert!(
            check_required_template_fields(&no_project)
                .unwrap_err()
                .starts_with("template.spec.project is missing")
        );
    }
}
