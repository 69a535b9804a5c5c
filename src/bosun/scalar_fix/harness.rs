//! The harness: the rules a mechanical-fix reply must pass, each refusing with a reason.

use serde_json::Value;

use super::inventory::version_shaped;
use super::{Editable, Fix, MAX_EDITS, Refused, key_text, rule, value_at};
use crate::yaml::edit::Segment;

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        format!("{}…", text.chars().take(max).collect::<String>())
    } else {
        text.to_string()
    }
}

/// Whether `word` stands in `text` as a whole (not inside a longer version or name).
fn whole_word_in(text: &str, word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    let part = |c: char| c.is_ascii_alphanumeric() || ".-+_:/".contains(c);
    text.match_indices(word).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(part)
            && !text[i + word.len()..].chars().next().is_some_and(part)
    })
}

/// One accepted edit.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    pub file: String,
    pub key: Vec<Segment>,
    pub from: Option<Value>,
    pub to: Value,
}

fn parse_key(value: &Value) -> Option<Vec<Segment>> {
    value
        .as_array()?
        .iter()
        .map(|s| match s {
            Value::String(k) => Some(Segment::Key(k.clone())),
            Value::Number(n) => n.as_u64().map(|i| Segment::Index(i as usize)),
            _ => None,
        })
        .collect()
}

/// Checks a reply against the fix: every rule but `read-back`. Returns the edits (no-ops
/// left out).
pub fn check_reply(fix: &Fix, reply: &Value) -> Result<Vec<Edit>, Refused> {
    check_reply_without(fix, reply, &[])
}

/// The rule `sourced`: the value is one the inventory allows for this key (a default pinned
/// back, the kind turned off, a version line put back or to the chart's move), of the type
/// the file holds there; a version is also one the report's machine blocks name (a whole word
/// of one of them), never one only its prose quotes.
fn sourced(
    fix: &Fix,
    entry: &Editable,
    file: &str,
    key: &[Segment],
    value: &Value,
) -> Result<(), Refused> {
    let same_type = entry
        .current
        .as_ref()
        .is_none_or(|c| std::mem::discriminant(c) == std::mem::discriminant(value));
    if !entry.allowed.contains(value) || !same_type {
        return Err(Refused {
            rule: rule::SOURCED,
            detail: format!(
                "{file}: {} would get a value Bosun does not allow there (allowed: {})",
                key_text(key),
                entry
                    .allowed
                    .iter()
                    .map(|v| clip(&v.to_string(), 40))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    if version_shaped(key, value)
        && let Some(text) = value.as_str()
        && !fix
            .versions
            .iter()
            .any(|named| named == text || whole_word_in(named, text))
    {
        return Err(Refused {
            rule: rule::SOURCED,
            detail: format!(
                "{file}: {} would get a version the gate's report does not name",
                key_text(key)
            ),
        });
    }
    Ok(())
}

/// `check_reply` with some rules switched off: only the evals use it, to show that each rule
/// is needed.
pub fn check_reply_without(
    fix: &Fix,
    reply: &Value,
    disabled: &[&str],
) -> Result<Vec<Edit>, Refused> {
    let on = |r: &str| !disabled.contains(&r);
    let refuse = |rule: &'static str, detail: String| Err(Refused { rule, detail });
    let Some(map) = reply
        .as_object()
        .filter(|m| (m.len() == 2 || !on(rule::SHAPE)) && m.contains_key("classification"))
    else {
        return refuse(
            rule::SHAPE,
            "the reply is not {\"classification\", \"edits\"} alone".into(),
        );
    };
    let Some(items) = map.get("edits").and_then(Value::as_array) else {
        return refuse(rule::SHAPE, "`edits` is not a list".into());
    };
    if items.len() > MAX_EDITS && on(rule::SHAPE) {
        return refuse(rule::SHAPE, format!("more than {MAX_EDITS} edits"));
    }
    let mut edits = Vec::new();
    for item in items {
        let fields = item
            .as_object()
            .filter(|o| o.len() == 3 || !on(rule::SHAPE));
        let (Some(file), Some(key), Some(value)) = (
            fields.and_then(|o| o.get("file")).and_then(Value::as_str),
            fields.and_then(|o| o.get("key")).and_then(parse_key),
            fields.and_then(|o| o.get("value")),
        ) else {
            return refuse(
                rule::SHAPE,
                "an edit is not {\"file\", \"key\", \"value\"} alone".into(),
            );
        };
        let entry = fix
            .inventory
            .iter()
            .find(|e| e.file == file && e.key == key);
        if entry.is_none() && on(rule::INVENTORY) {
            return refuse(
                rule::INVENTORY,
                format!(
                    "{}: {} is not an editable key",
                    clip(file, 120),
                    clip(&key_text(&key), 120)
                ),
            );
        };
        if let Some(entry) = entry
            && on(rule::SOURCED)
        {
            sourced(fix, entry, file, &key, value)?;
        }
        // The file as it is at the head holds what the inventory saw.
        let now = fix
            .files
            .get(file)
            .and_then(|t| crate::yaml::parse_document(t, file).ok())
            .and_then(|v| value_at(&v, &key).cloned());
        if let Some(entry) = entry
            && now != entry.current
            && on(rule::FROM_VALUE)
        {
            return refuse(
                rule::FROM_VALUE,
                format!(
                    "{file}: {} no longer holds the value Bosun saw",
                    key_text(&key)
                ),
            );
        }
        if now.as_ref() == Some(value) {
            continue;
        }
        edits.push(Edit {
            file: file.to_string(),
            key,
            from: now,
            to: value.clone(),
        });
    }
    Ok(edits)
}
