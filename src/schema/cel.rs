//! CEL validation rules (`x-kubernetes-validations`) evaluated as the API server evaluates
//! them, through the `cel` crate: `self` is the node's value after pruning and defaulting, a
//! rule that yields `false` is a violation worded with its `message` (or `failed rule: ...`),
//! and `fieldPath` moves the error to the named child.
//!
//! What this evaluator cannot run is reported, never passed: a transition rule (it reads
//! `oldSelf`, which only an update has), a rule the crate cannot parse, a function it does not
//! know (Kubernetes' own libraries: `quantity`, `url`, `ip`, ...), or a rule past the bounds
//! below. The caller decides: the ground's API double skips them, Bosun's reshape refuses.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// A rule longer than this is not evaluated here (the API server bounds cost, not length;
/// this is this code's own bound against a hostile chart's CRD).
const MAX_RULE_BYTES: usize = 4096;
/// Comprehension macros a rule may hold; each one multiplies the cost by a list's length.
const MAX_COMPREHENSIONS: usize = 2;
/// Nesting this deep is not converted (the object's own nesting is bounded before it gets here;
/// this keeps the conversion's recursion bounded on its own).
const MAX_DEPTH: usize = 64;

/// What one rule made of one value.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The rule held.
    Holds,
    /// The rule failed: (the field path suffix from `fieldPath`, the message).
    Fails(String, String),
    /// The rule cannot be run here, and why.
    Unevaluated(String),
}

/// Evaluates one entry of `x-kubernetes-validations` against `value`.
pub fn evaluate(rule: &Value, value: &Value) -> Verdict {
    let Some(text) = rule.get("rule").and_then(Value::as_str) else {
        return Verdict::Unevaluated("a validation without a rule".into());
    };
    if text.len() > MAX_RULE_BYTES {
        return Verdict::Unevaluated(format!("a rule longer than {MAX_RULE_BYTES} bytes"));
    }
    let comprehensions = [".all(", ".exists(", ".exists_one(", ".map(", ".filter("]
        .iter()
        .map(|m| text.matches(m).count())
        .sum::<usize>();
    if comprehensions > MAX_COMPREHENSIONS {
        return Verdict::Unevaluated(format!(
            "a rule with more than {MAX_COMPREHENSIONS} list macros"
        ));
    }
    let program = match cel::Program::compile(text) {
        Ok(program) => program,
        Err(_) => return Verdict::Unevaluated(format!("rule {text:?} does not parse here")),
    };
    if program.references().has_variable("oldSelf") {
        return Verdict::Unevaluated(format!(
            "transition rule {text:?} (it needs the stored object)"
        ));
    }
    let Some(converted) = to_cel(value, 0) else {
        return Verdict::Unevaluated("a value nested too deep".into());
    };
    let mut context = cel::Context::default();
    context.add_variable_from_value("self", converted);
    let field = rule
        .get("fieldPath")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match program.execute(&context) {
        Ok(cel::Value::Bool(true)) => Verdict::Holds,
        Ok(cel::Value::Bool(false)) => Verdict::Fails(field, message(rule, text, &context)),
        Ok(other) => Verdict::Unevaluated(format!(
            "rule {text:?} yields {}, not a bool",
            other.type_of()
        )),
        // A missing field is an evaluation error the API server reports too (and rejects).
        Err(cel::ExecutionError::NoSuchKey(key)) => {
            Verdict::Fails(field, format!("rule evaluation error: no such key: {key}"))
        }
        Err(error) => Verdict::Unevaluated(format!("rule {text:?}: {error}")),
    }
}

/// `messageExpression` when it evaluates to a non-empty string, else `message`, else the
/// API server's default wording.
fn message(rule: &Value, text: &str, context: &cel::Context) -> String {
    if let Some(expression) = rule.get("messageExpression").and_then(Value::as_str)
        && expression.len() <= MAX_RULE_BYTES
        && let Ok(program) = cel::Program::compile(expression)
        && let Ok(cel::Value::String(s)) = program.execute(context)
        && !s.trim().is_empty()
    {
        return s.to_string();
    }
    match rule.get("message").and_then(Value::as_str) {
        Some(m) if !m.trim().is_empty() => m.to_string(),
        _ => format!("failed rule: {}", text.trim()),
    }
}

/// JSON to CEL as the API server types it: integers are `int`, other numbers `double`.
fn to_cel(value: &Value, depth: usize) -> Option<cel::Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    Some(match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cel::Value::Int(i),
            None => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(
            items
                .iter()
                .map(|item| to_cel(item, depth + 1))
                .collect::<Option<Vec<_>>>()?,
        )),
        Value::Object(map) => {
            let mut out: HashMap<String, cel::Value> = HashMap::with_capacity(map.len());
            for (key, item) in map {
                out.insert(key.clone(), to_cel(item, depth + 1)?);
            }
            cel::Value::from(out)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(rule: Value, value: Value) -> Verdict {
        evaluate(&rule, &value)
    }

    #[test]
    fn rules_hold_fail_and_are_worded_as_the_api_server_words_them() {
        let spec = json!({"min": 2, "max": 1, "items": ["a", "b"]});
        assert_eq!(
            run(json!({"rule": "self.min <= self.max + 1"}), spec.clone()),
            Verdict::Holds
        );
        assert_eq!(
            run(json!({"rule": "self.min <= self.max"}), spec.clone()),
            Verdict::Fails(String::new(), "failed rule: self.min <= self.max".into())
        );
        assert_eq!(
            run(
                json!({"rule": "self.items.all(i, i != 'b')", "message": "no b", "fieldPath": ".items"}),
                spec.clone()
            ),
            Verdict::Fails(".items".into(), "no b".into())
        );
        assert_eq!(
            run(
                json!({"rule": "size(self.items) < 2", "messageExpression": "'too many: ' + string(size(self.items))"}),
                spec.clone()
            ),
            Verdict::Fails(String::new(), "too many: 2".into())
        );
        assert_eq!(
            run(
                json!({"rule": "has(self.min) && !has(self.other)"}),
                spec.clone()
            ),
            Verdict::Holds
        );
        assert_eq!(
            run(json!({"rule": "self.other == 1"}), spec.clone()),
            Verdict::Fails(
                String::new(),
                "rule evaluation error: no such key: other".into()
            )
        );
        assert_eq!(
            run(json!({"rule": "self.matches('^v[0-9]+$')"}), json!("v1")),
            Verdict::Holds
        );
    }

    #[test]
    fn what_cannot_run_here_is_reported_never_passed() {
        let spec = json!({"a": [1, 2]});
        for rule in [
            json!({"rule": "self.a == oldSelf.a"}),
            json!({"rule": "quantity(self.q).isGreaterThan(quantity('1'))"}),
            json!({"rule": "self.a.all(x, self.a.all(y, self.a.all(z, x + y + z > 0)))"}),
            json!({"rule": "self.a +"}),
            json!({"rule": "self.a"}),
            json!({"rule": format!("self.a == self.a {}", "&& true ".repeat(600))}),
        ] {
            assert!(
                matches!(run(rule.clone(), spec.clone()), Verdict::Unevaluated(_)),
                "{rule}"
            );
        }
    }
}
