//! Applying the accepted edits on each key's own line, read back; and each edit's comment line.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::harness::Edit;
use super::{Fix, Refused, key_text, rule};
use crate::bosun::applier::Rewrite;
use crate::yaml::edit::{self, Segment};

fn set_in(value: &mut Value, key: &[Segment], to: Value) -> bool {
    let Some((last, parents)) = key.split_last() else {
        *value = to;
        return true;
    };
    let mut node = value;
    for seg in parents {
        node = match seg {
            Segment::Key(k) => {
                if node.is_null() {
                    *node = Value::Object(Map::new());
                }
                let Some(map) = node.as_object_mut() else {
                    return false;
                };
                map.entry(k.clone()).or_insert(Value::Null)
            }
            Segment::Index(i) => match node.as_array_mut().and_then(|a| a.get_mut(*i)) {
                Some(n) => n,
                None => return false,
            },
        };
    }
    match (last, node) {
        (Segment::Key(k), node) => {
            if node.is_null() {
                *node = Value::Object(Map::new());
            }
            match node.as_object_mut() {
                Some(map) => {
                    map.insert(k.clone(), to);
                    true
                }
                None => false,
            }
        }
        (Segment::Index(i), Value::Array(items)) if *i < items.len() => {
            items[*i] = to;
            true
        }
        _ => false,
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Applies the edits to their files on each key's own line, then reads each file back: it
/// must equal the original with exactly those keys set.
pub fn rewrite(fix: &Fix, edits: &[Edit]) -> Result<Vec<Rewrite>, Refused> {
    let mut by_file: BTreeMap<&str, Vec<&Edit>> = BTreeMap::new();
    for e in edits {
        by_file.entry(e.file.as_str()).or_default().push(e);
    }
    let mut rewrites = Vec::new();
    for (file, edits) in by_file {
        let fail = |detail: String| Refused {
            rule: rule::READ_BACK,
            detail: format!("{file}: {detail}"),
        };
        let edit_failed = |e: edit::EditError| Refused {
            rule: rule::READ_BACK,
            detail: e.to_string(),
        };
        let before = fix
            .files
            .get(file)
            .cloned()
            .ok_or_else(|| fail("not read".into()))?;
        let mut expected =
            crate::yaml::parse_document(&before, file).map_err(|e| fail(e.to_string()))?;
        let mut text = before.clone();
        for e in &edits {
            if !set_in(&mut expected, &e.key, e.to.clone()) {
                return Err(fail(format!("{} cannot be set", key_text(&e.key))));
            }
            text = if e.from.is_some() && e.to.is_string() {
                edit::set_scalar(&text, file, 0, &e.key, &scalar_text(&e.to))
                    .map_err(&edit_failed)?
            } else {
                let keys: Option<Vec<String>> = e
                    .key
                    .iter()
                    .map(|s| match s {
                        Segment::Key(k) => Some(k.clone()),
                        Segment::Index(_) => None,
                    })
                    .collect();
                match keys {
                    Some(keys) => crate::yaml::keys::set_value(&text, file, 0, &keys, &e.to)
                        .map_err(&edit_failed)?,
                    None => edit::set_scalar(&text, file, 0, &e.key, &scalar_text(&e.to))
                        .map_err(&edit_failed)?,
                }
            };
        }
        let read = crate::yaml::parse_document(&text, file).map_err(|e| fail(e.to_string()))?;
        if read != expected {
            return Err(fail(
                "the edited file does not read back as the intended change".into(),
            ));
        }
        rewrites.push(Rewrite {
            path: file.to_string(),
            before,
            after: text,
        });
    }
    Ok(rewrites)
}

impl Edit {
    /// The comment line for this edit.
    pub fn line(&self) -> String {
        use crate::gate::report::{code, text};
        let shown = |v: &Value| text(&scalar_text(v));
        match &self.from {
            Some(from) => format!(
                "{}: {} {} → {}",
                code(&self.file),
                code(&key_text(&self.key)),
                shown(from),
                shown(&self.to)
            ),
            None => format!(
                "{}: set {} = {}",
                code(&self.file),
                code(&key_text(&self.key)),
                shown(&self.to)
            ),
        }
    }
}
