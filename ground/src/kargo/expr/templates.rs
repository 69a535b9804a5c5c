//! Templates: `${{ }}` / `${% %}` interpolation in config values and the typing of results.

use serde_json::json;
use serde_json::{Map, Value};

use crate::kargo::expr::Scope;
use crate::kargo::expr::eval::evaluate;

const DELIMITERS: [(&str, &str); 2] = [("${{", "}}"), ("${%", "%}")];

/// Evaluates every template string in a config value ([K evaluateExpressions]); keys are never
/// evaluated.
pub fn evaluate_value(value: &Value, scope: &Scope) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => evaluate_template(s, scope)?,
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| evaluate_value(v, scope))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                out.insert(k.clone(), evaluate_value(v, scope)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// One template string ([K EvaluateTemplate]): without a delimiter it is returned as it is (a
/// plain `"42"` stays a string); with one, the expressions are interpolated and the result is
/// typed.
pub fn evaluate_template(template: &str, scope: &Scope) -> Result<Value, String> {
    if !DELIMITERS.iter().any(|(start, _)| template.contains(start)) {
        return Ok(Value::String(template.to_string()));
    }
    let mut result = String::new();
    let mut rest = template;
    loop {
        let next = DELIMITERS
            .iter()
            .filter_map(|(start, end)| rest.find(start).map(|at| (at, *start, *end)))
            .min_by_key(|(at, _, _)| *at);
        let Some((at, start, end)) = next else {
            result.push_str(rest);
            break;
        };
        result.push_str(&rest[..at]);
        let after = &rest[at + start.len()..];
        let close = after.find(end).ok_or_else(|| {
            format!("unclosed expression: expected {end:?} but reached end of template")
        })?;
        result.push_str(&to_text(&evaluate(&after[..close], scope)?)?);
        rest = &after[close + end.len()..];
    }
    Ok(typed(result))
}

/// The typing Kargo applies to an evaluated template.
fn typed(mut result: String) -> Value {
    let removed_newline = result.ends_with('\n');
    if removed_newline {
        result.pop();
    }
    if result.len() > 1 && result.starts_with('"') && result.ends_with('"') {
        let mut inner = result[1..result.len() - 1].to_string();
        if removed_newline {
            inner.push('\n');
        }
        return Value::String(inner);
    }
    if let Some(number) = go_parse_float(&result) {
        return number;
    }
    match result.as_str() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => return Value::Bool(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => return Value::Bool(false),
        _ => {}
    }
    if let Ok(parsed) = serde_json::from_str::<Value>(&result) {
        return parsed;
    }
    if removed_newline {
        result.push('\n');
    }
    Value::String(result)
}

/// Go's `strconv.ParseFloat(s, 64)` for the forms a template yields (decimal, exponent,
/// `Inf`/`NaN` spelled any case), as a JSON number: an integral value is written as an integer,
/// as Go's JSON encoder writes a float64 with no fraction. Go's encoder refuses NaN and Inf;
/// they are left as strings here (the step then fails on its schema, as it would in Kargo).
fn go_parse_float(text: &str) -> Option<Value> {
    let plain = text
        .strip_prefix(['+', '-'])
        .unwrap_or(text)
        .replace('_', "");
    let looks_decimal = !plain.is_empty()
        && plain
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        && plain
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '.');
    if !looks_decimal || text.contains('_') {
        return None;
    }
    let x: f64 = text.parse().ok()?;
    if !x.is_finite() {
        return None;
    }
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        Some(json!(x as i64))
    } else {
        Some(json!(x))
    }
}

/// An expression's result as the template's text: strings as they are, anything else as JSON
/// ([K evaluateExpression]).
pub(super) fn to_text(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => go_json(other),
    }
}

/// JSON as Go's encoder writes it: map keys sorted, integral floats without a fraction.
pub(super) fn go_json(value: &Value) -> Result<String, String> {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sorted(value)).map_err(|e| e.to_string())
}
