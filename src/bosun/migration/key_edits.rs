//! Applying an accepted proposal: key-level edits on each key's own lines, read back and compared.

use serde_json::{Map, Value};

use super::planning::values_of;
use super::{Refused, rule};
use crate::yaml;

/// The key-level edits that turn `text` (whose values are `original`) into `proposal`:
/// renames, then sets, then additions, then removals; then the file is read back and compared
/// with the proposal. Any mismatch is a refusal.
pub fn rewrite(
    path: &str,
    text: &str,
    original: &Value,
    proposal: &Value,
) -> Result<String, Refused> {
    // Where helm's YAML 1.1 reader and ours could disagree on this file, the harness's view
    // of it is not helm's: nothing is rewritten.
    if let Some(hazard) = crate::bosun::reshape::yaml11_hazard(text) {
        return Err(Refused {
            rule: rule::READ_BACK,
            detail: format!("{path}: {hazard}"),
        });
    }
    let mut removed = Vec::new();
    let mut added = Vec::new();
    let mut changed = Vec::new();
    diff(
        original,
        proposal,
        &mut Vec::new(),
        &mut removed,
        &mut added,
        &mut changed,
    );
    // A removed key and an added key under the same parent with the same value: a rename.
    let mut renames = Vec::new();
    removed.retain(|(from, value): &(Vec<String>, Value)| {
        if let Some(i) = added.iter().position(|(to, v): &(Vec<String>, Value)| {
            v == value && to.len() == from.len() && to[..to.len() - 1] == from[..from.len() - 1]
        }) {
            let (to, _) = added.remove(i);
            renames.push((from.clone(), to.last().cloned().unwrap_or_default()));
            false
        } else {
            true
        }
    });
    let fail = |e: yaml::edit::EditError| Refused {
        rule: rule::READ_BACK,
        detail: format!("{path}: cannot edit in place: {e}"),
    };
    let mut out = text.to_string();
    for (from, to) in &renames {
        out = yaml::keys::rename_key(&out, path, 0, from, to).map_err(fail)?;
    }
    for (at, value) in &changed {
        out = yaml::keys::set_value(&out, path, 0, at, value).map_err(fail)?;
    }
    // Additions before removals: a mapping that loses every key it had and gains others
    // keeps a line to add them after.
    for (at, value) in &added {
        out = yaml::keys::set_value(&out, path, 0, at, value).map_err(fail)?;
    }
    for (at, _) in &removed {
        out = yaml::keys::remove_key(&out, path, 0, at).map_err(fail)?;
    }
    let read = values_of(out.as_bytes(), path).map_err(|e| Refused {
        rule: rule::READ_BACK,
        detail: format!("{path}: the edited file does not read back: {e}"),
    })?;
    if let Some(hazard) = crate::bosun::reshape::yaml11_hazard(&out) {
        return Err(Refused {
            rule: rule::READ_BACK,
            detail: format!("{path}: the edited file: {hazard}"),
        });
    }
    if &read != proposal {
        return Err(Refused {
            rule: rule::READ_BACK,
            detail: format!("{path}: the edited file does not read back as the accepted proposal"),
        });
    }
    Ok(out)
}

type Entries = Vec<(Vec<String>, Value)>;

fn diff(
    original: &Value,
    proposal: &Value,
    path: &mut Vec<String>,
    removed: &mut Entries,
    added: &mut Entries,
    changed: &mut Entries,
) {
    let (Some(o), Some(p)) = (original.as_object(), proposal.as_object()) else {
        return;
    };
    for (k, v) in o {
        path.push(k.clone());
        match p.get(k) {
            None => removed.push((path.clone(), v.clone())),
            Some(w)
                if v.is_object()
                    && w.is_object()
                    && !v.as_object().is_some_and(Map::is_empty)
                    && !w.as_object().is_some_and(Map::is_empty) =>
            {
                diff(v, w, path, removed, added, changed)
            }
            Some(w) if w != v => changed.push((path.clone(), w.clone())),
            Some(_) => {}
        }
        path.pop();
    }
    for (k, w) in p {
        if !o.contains_key(k) {
            path.push(k.clone());
            added.push((path.clone(), w.clone()));
            path.pop();
        }
    }
}
