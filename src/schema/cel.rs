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
/// The work a rule may do on a value, in value nodes visited: a rule with `k` list macros over
/// a value of `n` nodes may cost about `n^(k+1)`, so it is run only when that stays within this
/// budget (the API server bounds a rule's estimated cost too, and refuses the CRD past it).
const MAX_COST: u64 = 1_000_000;
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

/// The parser and the interpreter recurse once per level of nesting; a rule is run on a
/// thread with this much stack, so that no rule within `MAX_RULE_BYTES` can overflow it (the
/// tests play the deepest shapes that fit).
const STACK_BYTES: usize = 256 << 20;

/// Evaluates one entry of `x-kubernetes-validations` against `value`.
pub fn evaluate(rule: &Value, value: &Value) -> Verdict {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("cel".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, || evaluate_here(rule, value))
            .map_err(|e| e.to_string())
            .and_then(|handle| handle.join().map_err(|_| "it panicked".to_string()))
            .unwrap_or_else(|why| Verdict::Unevaluated(format!("the evaluator failed: {why}")))
    })
}

fn evaluate_here(rule: &Value, value: &Value) -> Verdict {
    let Some(text) = rule.get("rule").and_then(Value::as_str) else {
        return Verdict::Unevaluated("a validation without a rule".into());
    };
    if text.len() > MAX_RULE_BYTES {
        return Verdict::Unevaluated(format!("a rule longer than {MAX_RULE_BYTES} bytes"));
    }
    let message_expression = rule
        .get("messageExpression")
        .and_then(Value::as_str)
        .unwrap_or("");
    if message_expression.len() > MAX_RULE_BYTES {
        return Verdict::Unevaluated(format!(
            "a messageExpression longer than {MAX_RULE_BYTES} bytes"
        ));
    }
    let program = match cel::Program::compile(text) {
        Ok(program) => program,
        Err(_) => return Verdict::Unevaluated(format!("rule {text:?} does not parse here")),
    };
    let message_program = (!message_expression.trim().is_empty())
        .then(|| cel::Program::compile(message_expression).ok())
        .flatten();
    let comprehensions = macros(program.expression()).max(
        message_program
            .as_ref()
            .map_or(0, |p| macros(p.expression())),
    );
    if comprehensions > MAX_COMPREHENSIONS {
        return Verdict::Unevaluated(format!(
            "a rule with more than {MAX_COMPREHENSIONS} list macros"
        ));
    }
    let nodes = nodes(value);
    let exponent = u32::try_from(comprehensions + 1).unwrap_or(u32::MAX);
    if nodes
        .checked_pow(exponent)
        .is_none_or(|cost| cost > MAX_COST)
    {
        return Verdict::Unevaluated(format!(
            "a rule with {comprehensions} list macros over {nodes} values costs more than this \
             evaluator's budget"
        ));
    }
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
        Ok(cel::Value::Bool(false)) => Verdict::Fails(
            field,
            message(rule, text, message_program.as_ref(), &context),
        ),
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

/// How many comprehensions (what the list macros `all`, `exists`, `exists_one`, `map` and
/// `filter` expand to) the parsed expression holds, however it was spelled.
fn macros(expression: &cel::IdedExpr) -> usize {
    use cel::common::ast::{EntryExpr, Expr};
    match &expression.expr {
        Expr::Comprehension(c) => {
            1 + [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]
            .into_iter()
            .map(macros)
            .sum::<usize>()
        }
        Expr::Call(call) => {
            call.target.as_deref().map_or(0, macros) + call.args.iter().map(macros).sum::<usize>()
        }
        Expr::Select(select) => macros(&select.operand),
        Expr::List(list) => list.elements.iter().map(macros).sum(),
        Expr::Map(map) => map
            .entries
            .iter()
            .map(|e| match &e.expr {
                EntryExpr::MapEntry(m) => macros(&m.key) + macros(&m.value),
                EntryExpr::StructField(f) => macros(&f.value),
            })
            .sum(),
        Expr::Struct(st) => st
            .entries
            .iter()
            .map(|e| match &e.expr {
                EntryExpr::MapEntry(m) => macros(&m.key) + macros(&m.value),
                EntryExpr::StructField(f) => macros(&f.value),
            })
            .sum(),
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => 0,
    }
}

/// The value's size in nodes (every scalar, list and map counts one).
fn nodes(value: &Value) -> u64 {
    match value {
        Value::Array(items) => 1 + items.iter().map(nodes).sum::<u64>(),
        Value::Object(map) => 1 + map.values().map(nodes).sum::<u64>(),
        _ => 1,
    }
}

/// `messageExpression` when it evaluates to a non-empty string, else `message`, else the
/// API server's default wording.
fn message(
    rule: &Value,
    text: &str,
    program: Option<&cel::Program>,
    context: &cel::Context,
) -> String {
    if let Some(program) = program
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
    fn a_rule_whose_cost_grows_past_the_budget_is_not_run() {
        // Two macros over a list of 2,000 values would build 4 million values.
        let big = json!({"l": vec![0; 2000]});
        let rule = json!({"rule": "self.l.map(x, self.l.map(y, y)).size() > 0"});
        assert!(matches!(run(rule.clone(), big), Verdict::Unevaluated(_)));
        let small = json!({"l": vec![0; 20]});
        assert_eq!(run(rule, small), Verdict::Holds);
        let one = json!({"rule": "self.l.all(x, x == 0)"});
        assert_eq!(run(one, json!({"l": vec![0; 900]})), Verdict::Holds);
    }

    #[test]
    fn the_deepest_rules_that_fit_are_answered_without_overflowing() {
        // A hostile chart's CRD: the parser and the interpreter recurse per level of nesting.
        for text in [
            format!("{}true{}", "(".repeat(2040), ")".repeat(2040)),
            format!("{}true{}", "[".repeat(2040), "]".repeat(2040)),
            format!("{}true", "!".repeat(4090)),
            format!("{}1 == 1", "-".repeat(4080)),
            format!("self{}", ".a".repeat(2040)),
            format!("{}1 == 1", "1+".repeat(2040)),
            format!("{}true", "true ? true : ".repeat(290)),
            format!("{}1{} == 1", "{1:".repeat(1020), "}".repeat(1020)),
            format!("{}1{} == 1", "size(".repeat(680), ")".repeat(680)),
            format!("{}true", "true && ".repeat(510)),
        ] {
            assert!(text.len() <= MAX_RULE_BYTES, "{}", text.len());
            let _ = run(json!({"rule": text}), json!({"a": 1}));
        }
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
            json!({"rule": "true", "messageExpression": "self.a.map(x, self.a.map(y, self.a.map(z, 1)))"}),
            json!({"rule": "self.a . all (x, self.a .all(y, self.a. all(z, true)))"}),
        ] {
            assert!(
                matches!(run(rule.clone(), spec.clone()), Verdict::Unevaluated(_)),
                "{rule}"
            );
        }
    }
}
