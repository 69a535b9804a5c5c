//! Structural schemas as the API server applies them to custom resources: unknown fields are
//! pruned (unless `x-kubernetes-preserve-unknown-fields`), defaults filled, then types,
//! `required`, `enum`, `pattern`, `minimum`/`maximum` (and their exclusive forms),
//! `minLength`/`maxLength`, `minItems`/`maxItems`, `minProperties`/`maxProperties`, the
//! registry's string `format`s ([`format`]) and CEL rules (`x-kubernetes-validations`, through
//! [`cel`]) are validated. A rule or format this code cannot run is listed in
//! `Outcome::unevaluated`, never passed: a caller that must be sure (Bosun's reshape) refuses
//! on it, the ground's API double skips it.
//!
//! The proving ground's API double applies it on every write; Bosun applies it to a document
//! it is about to move to another version, to learn what the move would lose.

pub mod cel;
pub mod format;

use serde_json::{Map, Value};

/// What applying a schema did to an object.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Fields the schema does not know, removed: (field path, the value that was there).
    pub pruned: Vec<(String, Value)>,
    /// Violations, each with its field path, worded as the API server's 422 words them.
    pub errors: Vec<String>,
    /// Paths whose schema holds CEL rules (`x-kubernetes-validations`) this code cannot run.
    pub unevaluated: Vec<String>,
    /// How many more were not run than `unevaluated` lists (it keeps the first 100).
    pub unevaluated_omitted: usize,
    /// How many more violations there were than `errors` lists (it keeps the first 1,000).
    pub errors_omitted: usize,
}

/// Prunes unknown fields from `object` and validates it against `schema` (an
/// `openAPIV3Schema`). `apiVersion`, `kind` and `metadata` are the server's own and are left
/// alone.
pub fn prune_and_validate(object: &mut Value, schema: &Value) -> Outcome {
    let mut out = Outcome::default();
    let Some(map) = object.as_object_mut() else {
        return out;
    };
    let mut rest: Map<String, Value> = map.clone();
    for key in ["apiVersion", "kind", "metadata"] {
        rest.remove(key);
    }
    let mut rest = Value::Object(rest);
    let mut root = schema.clone();
    if let Some(props) = root.get_mut("properties").and_then(Value::as_object_mut) {
        for key in ["apiVersion", "kind", "metadata"] {
            props.remove(key);
        }
    }
    if let Some(required) = root.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| !matches!(r.as_str(), Some("apiVersion" | "kind" | "metadata")));
    }
    // Root rules see apiVersion, kind and metadata.name / generateName too, as the API
    // server shows them.
    let mut identity = Map::new();
    for key in ["apiVersion", "kind"] {
        if let Some(v) = map.get(key) {
            identity.insert(key.to_string(), v.clone());
        }
    }
    let mut metadata = Map::new();
    for key in ["name", "generateName"] {
        if let Some(v) = map.get("metadata").and_then(|m| m.get(key)) {
            metadata.insert(key.to_string(), v.clone());
        }
    }
    identity.insert("metadata".into(), Value::Object(metadata));
    let mut budget = cel::OBJECT_BUDGET;
    // One thread with the evaluator's stack serves the whole object (not one per rule).
    cel::on_big_stack(|| walk(&mut rest, &root, "", &mut out, Some(&identity), &mut budget));
    if out.errors_omitted > 0 {
        let more = out.errors_omitted;
        out.errors.push(format!("and {more} more violations"));
    }
    if out.unevaluated_omitted > 0 {
        let more = out.unevaluated_omitted;
        out.unevaluated
            .push(format!("and {more} more rules or patterns not run here"));
    }
    for key in map.keys().cloned().collect::<Vec<_>>() {
        if !["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
            map.remove(&key);
        }
    }
    if let Value::Object(kept) = rest {
        map.extend(kept);
    }
    out
}

/// At most this many "not run here" entries are kept per object (past it, a count): a rule
/// under a list of millions would otherwise write one per item.
const MAX_UNEVALUATED: usize = 100;

/// Pushes a "not run here" entry unless the object already has [`MAX_UNEVALUATED`] and more
/// (then it only counts, without building the text).
fn unevaluated(out: &mut Outcome, entry: impl FnOnce() -> String) {
    if out.unevaluated.len() < MAX_UNEVALUATED {
        out.unevaluated.push(entry());
    } else {
        out.unevaluated_omitted += 1;
    }
}

/// At most this many violations are kept per object (past it, a count): an object of a
/// million items that each break a pattern is rejected all the same.
const MAX_ERRORS: usize = 1000;

fn push_error(out: &mut Outcome, error: String) {
    if out.errors.len() < MAX_ERRORS {
        out.errors.push(error);
    } else {
        out.errors_omitted += 1;
    }
}

/// The `openAPIV3Schema` a CustomResourceDefinition declares for one version.
pub fn version_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .pointer("/schema/openAPIV3Schema")
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn walk(
    value: &mut Value,
    schema: &Value,
    path: &str,
    out: &mut Outcome,
    identity: Option<&Map<String, Value>>,
    budget: &mut u64,
) {
    if value.is_null()
        && schema
            .get("nullable")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    {
        return;
    }
    if !type_matches(value, schema, path, out) {
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        push_error(
            out,
            format!(
                "{path}: Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        );
    }
    bounds(value, schema, path, out, budget);
    match value {
        Value::Object(map) => walk_object(map, schema, path, out, budget),
        Value::Array(items) => walk_array(items, schema, path, out, budget),
        _ => {}
    }
    // CEL rules run last, on the pruned and defaulted value, as the API server runs them.
    run_rules(value, schema, path, out, identity, budget);
}

/// Whether the value has the schema's `type` (an integer is a number; an int-or-string
/// field takes either); a mismatch is reported.
fn type_matches(value: &Value, schema: &Value, path: &str, out: &mut Outcome) -> bool {
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(value);
        let ok = actual == expected
            || (expected == "number" && actual == "integer")
            || (int_or_string && (actual == "integer" || actual == "string"));
        if !ok {
            let shown = if path.is_empty() { "<root>" } else { path };
            push_error(
                out,
                format!(
                    "{shown}: Invalid value: \"{actual}\": {shown} in body must be of type {expected}"
                ),
            );
            return false;
        }
    }
    true
}

/// An object's fields: defaults first (the API server defaults before it validates), then
/// the required fields, then each field walked under its schema, or pruned when the schema
/// has none for it and keeps no unknown fields.
fn walk_object(
    map: &mut Map<String, Value>,
    schema: &Value,
    path: &str,
    out: &mut Outcome,
    budget: &mut u64,
) {
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (key, property) in properties {
            if let (false, Some(default)) = (map.contains_key(key), property.get("default")) {
                map.insert(key.clone(), default.clone());
            }
        }
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for field in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(field) {
                out.errors
                    .push(format!("{}: Required value", child(path, field)));
            }
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let sub_schema = properties.and_then(|p| p.get(&key)).or(additional);
        match sub_schema {
            Some(sub) => {
                if let Some(v) = map.get_mut(&key) {
                    walk(v, sub, &child(path, &key), out, None, budget);
                }
            }
            None if preserve
                || (properties.is_none()
                    && additional.is_none()
                    && schema.get("type").is_none()) => {}
            None => {
                if let Some(removed) = map.remove(&key) {
                    out.pruned.push((child(path, &key), removed));
                }
            }
        }
    }
}

/// An array's items, each walked under `items`, and its `minItems`.
fn walk_array(
    items: &mut [Value],
    schema: &Value,
    path: &str,
    out: &mut Outcome,
    budget: &mut u64,
) {
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter_mut().enumerate() {
            walk(
                item,
                item_schema,
                &format!("{path}[{i}]"),
                out,
                None,
                budget,
            );
        }
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        push_error(
            out,
            format!(
                "{path}: Invalid value: {}: {path} in body should have at least {min} items",
                items.len()
            ),
        );
    }
}

/// The schema's CEL rules (`x-kubernetes-validations`) on the value, within the object's
/// budget; at the root (`identity`), the rules also see `apiVersion`, `kind` and the name.
fn run_rules(
    value: &Value,
    schema: &Value,
    path: &str,
    out: &mut Outcome,
    identity: Option<&Map<String, Value>>,
    budget: &mut u64,
) {
    let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    else {
        return;
    };
    let shown = if path.is_empty() { "<root>" } else { path };
    // The object's budget is spent: nothing more is read or copied for these rules.
    if *budget < cel::RULE_BASE_COST {
        for _ in rules {
            unevaluated(out, || {
                format!(
                    "{shown} (the object's rules together cost more than this evaluator's bound of {})",
                    cel::OBJECT_BUDGET
                )
            });
        }
        return;
    }
    let seen = match (identity, value) {
        (Some(identity), Value::Object(map)) => {
            let mut whole = map.clone();
            for (k, v) in identity {
                whole.insert(k.clone(), v.clone());
            }
            Value::Object(whole)
        }
        _ => value.clone(),
    };
    let mut seen_schema = schema.clone();
    if identity.is_some()
        && let Some(props) = seen_schema
            .get_mut("properties")
            .and_then(Value::as_object_mut)
    {
        for key in ["apiVersion", "kind"] {
            props.insert(key.into(), serde_json::json!({"type": "string"}));
        }
        props.insert(
            "metadata".into(),
            serde_json::json!({"type": "object", "properties": {
                "name": {"type": "string"}, "generateName": {"type": "string"}}}),
        );
    }
    for rule in rules {
        match cel::evaluate_within(rule, &seen, &seen_schema, budget) {
            cel::Verdict::Holds => {}
            cel::Verdict::Fails(field, message) => {
                let at = format!("{shown}{field}");
                push_error(
                    out,
                    format!("{at}: Invalid value: \"{}\": {message}", type_name(value)),
                );
            }
            cel::Verdict::Unevaluated(why) => unevaluated(out, || format!("{shown} ({why})")),
        }
    }
}

/// A schema's `pattern`, compiled once per distinct text for the whole process (a CRD's pattern
/// is met once per string it governs: compiled per string, a hostile chart's pattern costs
/// minutes), within the regex crate's size limits ([`cel::MAX_REGEX_BYTES`] of compiled
/// program and of lazy DFA; the crate matches in time linear in the text). None when it does
/// not compile within them: the pattern is reported as unevaluated, never passed.
fn compiled(pattern: &str) -> Option<(std::sync::Arc<regex::Regex>, u64)> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    /// Distinct patterns kept; past it the cache starts again (a hostile chart with more
    /// patterns than this pays one compilation each, as it would anyway).
    const KEPT: usize = 4096;
    type Cache = Mutex<HashMap<String, Option<(Arc<regex::Regex>, u64)>>>;
    static CACHE: LazyLock<Cache> = LazyLock::new(Cache::default);
    /// A longer pattern is not compiled (nor kept): what real CRDs declare is far shorter.
    const LONGEST: usize = 64 << 10;
    if pattern.len() > LONGEST {
        return None;
    }
    if let Some(hit) = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(pattern)
    {
        return hit.clone();
    }
    let built = cel::regex_weight(pattern).and_then(|weight| {
        regex::RegexBuilder::new(pattern)
            .size_limit(cel::MAX_REGEX_BYTES)
            .dfa_size_limit(cel::MAX_REGEX_BYTES)
            .build()
            .ok()
            .map(|re| (Arc::new(re), weight))
    });
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if cache.len() >= KEPT {
        cache.clear();
    }
    cache.insert(pattern.to_string(), built.clone());
    built
}

/// `pattern`, numeric bounds, lengths and sizes, worded as the API server words them.
fn bounds(value: &Value, schema: &Value, path: &str, out: &mut Outcome, budget: &mut u64) {
    let number = |key: &str| schema.get(key).and_then(Value::as_f64);
    let count = |key: &str| schema.get(key).and_then(Value::as_u64);
    let exclusive = |key: &str| schema.get(key).and_then(Value::as_bool) == Some(true);
    match value {
        Value::String(text) => {
            let length = text.chars().count() as u64;
            if let Some(max) = count("maxLength").filter(|m| length > *m) {
                push_error(
                    out,
                    format!("{path}: Too long: may not be more than {max} bytes"),
                );
            }
            if let Some(min) = count("minLength").filter(|m| length < *m) {
                push_error(
                    out,
                    format!(
                        "{path}: Invalid value: \"{text}\": {path} in body should be at least {min} chars long"
                    ),
                );
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                // Matching is charged to the object's budget like a rule: up to the program's
                // size times the text's.
                let matched = compiled(pattern).and_then(|(re, weight)| {
                    let cost = cel::match_cost(weight, 1 + text.len() as u64 / 16);
                    (cost <= *budget).then(|| {
                        *budget -= cost;
                        re.is_match(text)
                    })
                });
                match matched {
                    Some(true) => {}
                    Some(false) => push_error(
                        out,
                        format!(
                            "{path}: Invalid value: \"{text}\": {path} in body should match '{pattern}'"
                        ),
                    ),
                    None => unevaluated(out, || {
                        let shown: String = pattern.chars().take(200).collect();
                        format!(
                            "{path} (pattern {shown:?}: past the regex size limits or the object's budget)"
                        )
                    }),
                }
            }
            if let Some(name) = schema.get("format").and_then(Value::as_str) {
                match format::check(name, text) {
                    format::Check::Passes => {}
                    format::Check::Violates => push_error(
                        out,
                        format!(
                            "{path}: Invalid value: \"{text}\": {path} in body must be of type {name}: \"{text}\""
                        ),
                    ),
                    format::Check::Unchecked => unevaluated(out, || {
                        format!("{path} (format {name:?} is not checked here)")
                    }),
                }
            }
        }
        Value::Number(n) => {
            let Some(x) = n.as_f64() else { return };
            if let Some(max) = number("maximum")
                && (x > max || (exclusive("exclusiveMaximum") && x >= max))
            {
                push_error(
                    out,
                    format!(
                        "{path}: Invalid value: {n}: {path} in body should be less than or equal to {max}"
                    ),
                );
            }
            if let Some(min) = number("minimum")
                && (x < min || (exclusive("exclusiveMinimum") && x <= min))
            {
                push_error(
                    out,
                    format!(
                        "{path}: Invalid value: {n}: {path} in body should be greater than or equal to {min}"
                    ),
                );
            }
        }
        Value::Array(items) => {
            if let Some(max) = count("maxItems").filter(|m| items.len() as u64 > *m) {
                push_error(
                    out,
                    format!(
                        "{path}: Too many: {}: must have at most {max} items",
                        items.len()
                    ),
                );
            }
        }
        Value::Object(map) => {
            if let Some(max) = count("maxProperties").filter(|m| map.len() as u64 > *m) {
                push_error(
                    out,
                    format!(
                        "{path}: Too many: {}: must have at most {max} items",
                        map.len()
                    ),
                );
            }
            if let Some(min) = count("minProperties").filter(|m| (map.len() as u64) < *m) {
                push_error(
                    out,
                    format!(
                        "{path}: Invalid value: {}: {path} in body should have at least {min} properties",
                        map.len()
                    ),
                );
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_unknown_fields_and_reports_every_violation() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["stage"], "properties": {
                "stage": {"type": "string"}, "mode": {"type": "string", "enum": ["A", "B"]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}});
        let mut object = json!({"apiVersion": "x/v1", "kind": "P", "metadata": {"name": "p"},
            "spec": {"mode": "C", "unknown": 1, "free": {"anything": true}}, "extra": 1});
        let outcome = prune_and_validate(&mut object, &schema);
        assert_eq!(
            outcome.errors,
            [
                "spec.stage: Required value",
                "spec.mode: Unsupported value: \"C\": supported values: \"A\", \"B\""
            ]
        );
        assert_eq!(
            outcome.pruned,
            [
                ("extra".to_string(), json!(1)),
                ("spec.unknown".to_string(), json!(1))
            ]
        );
        assert!(object["spec"].get("unknown").is_none());
        assert!(object.get("extra").is_none());
        assert_eq!(object["spec"]["free"]["anything"], json!(true));
        assert_eq!(object["metadata"]["name"], json!("p"));
    }

    #[test]
    fn root_rules_see_the_objects_name_kind_and_api_version() {
        let schema = json!({"type": "object",
            "x-kubernetes-validations": [{"rule": "self.metadata.name.size() <= 5 && self.kind == 'K'", "message": "short names"}],
            "properties": {"spec": {"type": "object"}}});
        let mut ok =
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "abc"}, "spec": {}});
        assert!(prune_and_validate(&mut ok, &schema).errors.is_empty());
        let mut long = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "abcdefgh"}, "spec": {}});
        assert_eq!(
            prune_and_validate(&mut long, &schema).errors,
            ["<root>: Invalid value: \"object\": short names"]
        );
    }

    #[test]
    fn patterns_bounds_and_cel_rules() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 3},
            "tags": {"type": "array", "maxItems": 1, "items": {"type": "string"}},
            "rule": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'x'"}]},
            "since": {"type": "string", "format": "date"},
            "limit": {"type": "string", "x-kubernetes-validations": [{"rule": "quantity(self).isLessThan(quantity('1'))"}]}}}}});
        let mut object = json!({"spec": {"name": "ABCDEFG", "replicas": 4, "tags": ["a", "b"],
            "rule": "x", "since": "yesterday", "limit": "2"}});
        let outcome = prune_and_validate(&mut object, &schema);
        assert_eq!(outcome.errors.len(), 6, "{:?}", outcome.errors);
        assert!(outcome.errors.contains(
            &"spec.rule: Invalid value: \"string\": failed rule: self != 'x'".to_string()
        ));
        assert!(outcome.errors.contains(&"spec.since: Invalid value: \"yesterday\": spec.since in body must be of type date: \"yesterday\"".to_string()));
        assert_eq!(outcome.unevaluated.len(), 1, "{:?}", outcome.unevaluated);
        assert!(outcome.unevaluated[0].starts_with("spec.limit ("));
        let mut fine = json!({"spec": {"name": "abc", "replicas": 2, "tags": ["a"], "rule": "y",
            "since": "2026-12-01"}});
        let outcome = prune_and_validate(&mut fine, &schema);
        assert!(
            outcome.errors.is_empty() && outcome.unevaluated.is_empty(),
            "{outcome:?}"
        );
    }

    /// The reviewer's attacks on the budget, scaled down: a rule that is not run is still
    /// charged (so a rule under a list of a million items cannot write a million notes or
    /// spawn a million evaluations), what is not run is listed at most 100 times, and a large
    /// pattern met by long strings is charged program x text.
    #[test]
    fn rules_not_run_and_patterns_are_charged_and_their_notes_are_bounded() {
        let padding = "x".repeat(3900);
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"l": {"type": "array", "items": {"type": "integer",
                "x-kubernetes-validations": [{"rule": format!("oldSelf == self || '{padding}' == ''")}]}}}}}});
        let mut object = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"l": vec![0; 200_000]}});
        let outcome = prune_and_validate(&mut object, &schema);
        assert!(
            outcome.unevaluated.len() <= MAX_UNEVALUATED + 1,
            "{}",
            outcome.unevaluated.len()
        );
        assert!(
            outcome.unevaluated_omitted > 100_000,
            "{}",
            outcome.unevaluated_omitted
        );
        assert!(
            outcome
                .unevaluated
                .last()
                .is_some_and(|l| l.contains("more rules")),
            "{:?}",
            outcome.unevaluated.last()
        );
        // Many trivial rules at the root of a large object: each is charged the value it sees.
        let rules: Vec<Value> = (0..2000).map(|_| json!({"rule": "true"})).collect();
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"l": {"type": "array", "items": {"type": "integer"}}},
            "x-kubernetes-validations": rules}}});
        let mut object = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"l": vec![0; 100_000]}});
        let outcome = prune_and_validate(&mut object, &schema);
        assert!(
            outcome.unevaluated.iter().any(|u| u.contains("together")),
            "{:?}",
            outcome.unevaluated.first()
        );
        // A pattern whose program is large, met by long strings: charged, then not run.
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"s": {"type": "array", "items": {"type": "string", "pattern": "[ab]{3000}c"}}}}}});
        let mut object = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"s": vec!["a".repeat(20_000); 200]}});
        let outcome = prune_and_validate(&mut object, &schema);
        assert!(
            outcome.unevaluated.iter().any(|u| u.contains("budget")),
            "{:?}",
            outcome.unevaluated.first()
        );
        // A map's keys are counted: the same map compared at every step of a macro.
        let key = "k".repeat(1 << 16);
        let rule = json!({"rule": "self.l.all(x, self.m == self.m)"});
        let verdict = cel::evaluate(
            &rule,
            &json!({"l": vec![0; 2000], "m": {key: 1}}),
            &Value::Null,
        );
        assert!(
            matches!(verdict, cel::Verdict::Unevaluated(_)),
            "{verdict:?}"
        );
    }
}
