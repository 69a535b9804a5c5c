//! The harness: the rules a values migration reply must pass, each refusing with a reason.

use serde_json::{Map, Value, json};

use super::values::{
    Node, declared, dictated, layered, layered_over, leaves, path_text, schema_at, short, value_at,
};
use super::{Migration, Refused, ValuesFile, rule};

/// Whether the value at `path` of a values document is a credential (its key, or the
/// `value` of a `{name, value}` pair named like one, on the way).
fn sensitive_path(document: &Value, path: &[String], rules: &crate::model::Rules) -> bool {
    let mut node = document;
    for key in path {
        let Some(map) = node.as_object() else {
            return false;
        };
        if rules.entry(map, key) {
            return true;
        }
        match map.get(key) {
            Some(next) => node = next,
            None => return rules.key(key),
        }
    }
    false
}

/// One file's accepted proposal and what changed.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedFile {
    pub path: String,
    pub values: Value,
    /// Values the proposal leaves out: listed in the comment even when dropping them was right.
    pub dropped: Vec<(String, Value)>,
    /// (from, to, value).
    pub moved: Vec<(String, String, Value)>,
    /// Values set from the new chart (its values.yaml or schema).
    pub set: Vec<(String, Value)>,
}

/// Checks a reply against a migration: every rule but `renders` and `read-back` (they need
/// helm and the file's text). `disabled` switches rules off for the evals only.
pub fn check_reply(
    migration: &Migration,
    reply: &Value,
    held: &crate::model::Held,
    disabled: &[&str],
) -> Result<Vec<AcceptedFile>, Refused> {
    let on = |r: &str| !disabled.contains(&r);
    let proposals = proposals(migration, reply, held, &on)?;
    let mut accepted = Vec::new();
    for file in &migration.files {
        let Some((_, proposal)) = proposals.iter().find(|(p, _)| *p == file.path) else {
            continue;
        };
        accepted.push(check_file(migration, file, proposal, &on)?);
    }
    // The rules on what helm sees, the accepted files layered as each failing run layers them.
    let layered_rules: [(&str, LayeredRule); 2] =
        [(rule::SCHEMA, schema_fits), (rule::KEPT, layered_kept)];
    for (name, check) in layered_rules {
        if on(name) {
            check(migration, &accepted)?;
        }
    }
    Ok(accepted)
}

fn refuse<T>(rule: &'static str, detail: String) -> Result<T, Refused> {
    Err(Refused { rule, detail })
}

/// The rule `reply-shape`: the proposed files, each one asked about, once (its placeholders
/// restored).
fn proposals(
    migration: &Migration,
    reply: &Value,
    held: &crate::model::Held,
    on: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, Value)>, Refused> {
    let Some(items) = reply
        .as_object()
        .filter(|o| o.len() == 1 || !on(rule::SHAPE))
        .and_then(|o| o.get("files"))
        .and_then(Value::as_array)
    else {
        return refuse(
            rule::SHAPE,
            "the reply is not {\"files\": [...]} alone".into(),
        );
    };
    let mut proposals: Vec<(String, Value)> = Vec::new();
    for item in items {
        let (Some(file), Some(values)) = (
            item.get("file").and_then(Value::as_str),
            item.get("values").filter(|v| v.is_object()),
        ) else {
            return refuse(
                rule::SHAPE,
                "a file entry is not {\"file\", \"values\"}".into(),
            );
        };
        if !migration.files.iter().any(|f| f.path == file)
            || proposals.iter().any(|(p, _)| p == file)
        {
            return refuse(
                rule::SHAPE,
                format!(
                    "{} is not one of the files asked about, or comes twice",
                    short(&json!(file))
                ),
            );
        }
        proposals.push((file.to_string(), held.restore(values)));
    }
    if on(rule::SHAPE) && proposals.len() != migration.files.len() {
        return refuse(
            rule::SHAPE,
            format!(
                "the reply has {} of the {} files",
                proposals.len(),
                migration.files.len()
            ),
        );
    }
    Ok(proposals)
}

/// One file's proposal: (a) `kept-values` then (c) `accounted-values`, and what changed.
fn check_file(
    migration: &Migration,
    file: &ValuesFile,
    proposal: &Value,
    on: &dyn Fn(&str) -> bool,
) -> Result<AcceptedFile, Refused> {
    let original = leaves(&file.value);
    if on(rule::KEPT) {
        kept(migration, file, proposal, &original)?;
    }
    let (moved, set) = accounted(migration, file, proposal, &original, on(rule::ACCOUNTED))?;
    let dropped = original
        .iter()
        .filter(|(p, _)| value_at(proposal, p).is_none())
        .filter(|(p, _)| !moved.iter().any(|(from, _, _)| *from == path_text(p)))
        .map(|(p, v)| (path_text(p), v.clone()))
        .collect();
    Ok(AcceptedFile {
        path: file.path.clone(),
        values: proposal.clone(),
        dropped,
        moved,
        set,
    })
}

/// (a) Every declared value of the file is kept, unchanged.
fn kept(
    migration: &Migration,
    file: &ValuesFile,
    proposal: &Value,
    original: &[(Vec<String>, Value)],
) -> Result<(), Refused> {
    for (path, value) in original {
        if declared(migration, path) && value_at(proposal, path) != Some(value) {
            // Paths only: a refusal is shown to people, and a value may be a secret.
            return refuse(
                rule::KEPT,
                format!(
                    "{}: {} is declared by the new chart, and the proposal {} it",
                    file.path,
                    path_text(path),
                    if value_at(proposal, path).is_some() {
                        "changes"
                    } else {
                        "drops"
                    }
                ),
            );
        }
    }
    Ok(())
}

/// Values moved (from, to, value) and values set from the new chart.
type Changes = (Vec<(String, String, Value)>, Vec<(String, Value)>);

/// (c) Every value of the proposal is accounted for: the original's at that path, a
/// displaced value moved, or the new chart's. `enforce` off (the evals), an unaccounted value
/// passes.
fn accounted(
    migration: &Migration,
    file: &ValuesFile,
    proposal: &Value,
    original: &[(Vec<String>, Value)],
    enforce: bool,
) -> Result<Changes, Refused> {
    // A null or an empty mapping carries nothing, and never moves (a null moved under
    // a chart default would delete it).
    let mut displaced: Vec<&(Vec<String>, Value)> = original
        .iter()
        .filter(|(p, v)| {
            !declared(migration, p) && !v.is_null() && !v.as_object().is_some_and(Map::is_empty)
        })
        .collect();
    let mut moved = Vec::new();
    let mut set = Vec::new();
    for (path, value) in &leaves(proposal) {
        if value_at(&file.value, path) == Some(value) {
            continue;
        }
        // An empty mapping left where keys were removed sets nothing (helm merges it
        // into the chart's mapping), unless it would replace a default that is not one.
        if value.as_object().is_some_and(Map::is_empty)
            && value_at(&migration.new_defaults, path).is_none_or(Value::is_object)
        {
            continue;
        }
        // A displaced value moves once (used twice, the second copy is invented), to a
        // key the new schema names and the old did not, keeping a name of its old path
        // (`crds.enabled` -> `crds.install`, `logLevel` -> `log.level`), and a
        // credential only to a key that is one too.
        if let Some(index) = displaced.iter().position(|(p, v)| {
            v == value
                && value_at(proposal, p).is_none()
                && moves_to(migration, p, path)
                && (!sensitive_path(&file.value, p, &migration.redaction)
                    || sensitive_path(proposal, path, &migration.redaction))
        }) {
            let (from, _) = displaced.remove(index);
            moved.push((path_text(from), path_text(path), value.clone()));
            continue;
        }
        if value_at(&migration.new_defaults, path) == Some(value)
            || dictated(&migration.new_schema, path, value)
        {
            set.push((path_text(path), value.clone()));
            continue;
        }
        if enforce {
            return refuse(
                rule::ACCOUNTED,
                format!(
                    "{}: the value at {} is in neither the original file (at that path, or displaced from a related one) nor the new chart",
                    file.path,
                    path_text(path)
                ),
            );
        }
    }
    Ok((moved, set))
}

/// A rule on the accepted files as each failing run layers them.
type LayeredRule = fn(&Migration, &[AcceptedFile]) -> Result<(), Refused>;

/// The accepted files as (path, values), the way `layered` takes them.
fn accepted_values(accepted: &[AcceptedFile]) -> Vec<(String, Value)> {
    accepted
        .iter()
        .map(|a| (a.path.clone(), a.values.clone()))
        .collect()
}

/// (b) `schema-fit`: each failing run's layered values fit the new schema.
fn schema_fits(migration: &Migration, accepted: &[AcceptedFile]) -> Result<(), Refused> {
    let validator = jsonschema::validator_for(&migration.new_schema).map_err(|e| Refused {
        rule: rule::SCHEMA,
        detail: format!("the new values.schema.json cannot be used: {e}"),
    })?;
    let files = accepted_values(accepted);
    for failure in &migration.failures {
        let values = layered(migration, failure, &files);
        if let Some(error) = validator.iter_errors(&values).next() {
            // The schema's rule, not the value it refused (which may be a secret).
            return refuse(
                rule::SCHEMA,
                format!(
                    "{}: at {} the new schema refuses the values ({})",
                    failure.application,
                    error.instance_path(),
                    error.schema_path()
                ),
            );
        }
    }
    Ok(())
}

/// (a) again, on what helm sees: for each failing run, every declared value the layered
/// files set is what the layered proposal sets (a later file cannot override it, a `{}` or
/// a `null` cannot replace or delete it).
fn layered_kept(migration: &Migration, accepted: &[AcceptedFile]) -> Result<(), Refused> {
    let originals: Vec<(String, Value)> = migration
        .files
        .iter()
        .map(|f| (f.path.clone(), f.value.clone()))
        .collect();
    let proposed = accepted_values(accepted);
    for failure in &migration.failures {
        // The layers alone: what the repository sets, not the chart's defaults (a moved
        // value may replace a default).
        let before = layered_over(json!({}), migration, failure, &originals);
        let after = layered_over(json!({}), migration, failure, &proposed);
        for (path, value) in leaves(&before) {
            if declared(migration, &path) && value_at(&after, &path) != Some(&value) {
                return refuse(
                    rule::KEPT,
                    format!(
                        "{}: {} is declared by the new chart, and with the proposal helm would see another value there",
                        failure.application,
                        path_text(&path)
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Whether a displaced value may move from `from` to `to`: the new schema names `to` (not
/// merely allows it) and the old schema, when known, did not; and a name is kept: a key of
/// one path is part of a key of the other (`crds.enabled` -> `crds.install` keep `crds`,
/// `logLevel` -> `log.level` keep `log`).
fn moves_to(migration: &Migration, from: &[String], to: &[String]) -> bool {
    if !matches!(schema_at(&migration.new_schema, to), Node::At(_)) {
        return false;
    }
    if let Some(old) = &migration.old_schema
        && !matches!(schema_at(old, to), Node::Undeclared)
    {
        return false;
    }
    let names = |path: &[String]| -> Vec<String> {
        path.iter()
            .map(|k| k.to_ascii_lowercase())
            .filter(|k| k.len() >= 3)
            .collect()
    };
    let (a, b) = (names(from), names(to));
    a.iter().any(|x| {
        b.iter()
            .any(|y| x.contains(y.as_str()) || y.contains(x.as_str()))
    })
}
