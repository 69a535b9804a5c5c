//! Evaluation: the entry points, the environment, and evaluating nodes and operators.

use serde_json::json;
use serde_json::{Map, Value};

use super::functions::call;
use super::parser::{Node, parse};
use crate::kargo::expr::Scope;

/// Evaluates one expression (the text between delimiters).
pub fn evaluate(expression: &str, scope: &Scope) -> Result<Value, String> {
    let node = parse(expression).map_err(|e| format!("{:?}: {e}", expression.trim()))?;
    let env = Env {
        names: &|name| match name {
            "ctx" => Some(scope.ctx.clone()),
            "vars" => Some(Value::Object(scope.vars.clone())),
            "outputs" => Some(Value::Object(scope.outputs.clone())),
            _ => None,
        },
        scope: Some(scope),
    };
    eval(&node, &env).map_err(|e| format!("{:?}: {e}", expression.trim()))
}

/// One expression against a plain document (the `yaml-parse` step's `fromExpression`:
/// [K yaml_parser.go extractValues] runs it with the parsed YAML as the environment, no Kargo
/// functions).
pub fn evaluate_in(expression: &str, data: &Value) -> Result<Value, String> {
    let node =
        parse(expression).map_err(|e| format!("error compiling expression {expression:?}: {e}"))?;
    let env = Env {
        // `$env` is the whole document (expr-lang's name for the environment).
        names: &|name| {
            if name == "$env" {
                Some(data.clone())
            } else {
                data.get(name).cloned()
            }
        },
        scope: None,
    };
    eval(&node, &env).map_err(|e| format!("error evaluating expression {expression:?}: {e}"))
}

struct Env<'a> {
    names: &'a dyn Fn(&str) -> Option<Value>,
    /// Kargo's functions; `None` for a plain document (`yaml-parse`).
    scope: Option<&'a Scope<'a>>,
}

pub(super) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nil",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() => "int",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "map",
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn eval(node: &Node, env: &Env) -> Result<Value, String> {
    Ok(match node {
        Node::Literal(v) => v.clone(),
        Node::Name(name) => (env.names)(name).ok_or_else(|| format!("unknown name {name}"))?,
        Node::List(items) => Value::Array(
            items
                .iter()
                .map(|i| eval(i, env))
                .collect::<Result<_, _>>()?,
        ),
        Node::Map(entries) => {
            let mut map = Map::new();
            for (key, value) in entries {
                map.insert(key.clone(), eval(value, env)?);
            }
            Value::Object(map)
        }
        Node::Member(target, index, optional) => {
            let target = eval(target, env)?;
            let index = eval(index, env)?;
            match (&target, &index) {
                (Value::Null, _) if *optional => Value::Null,
                (Value::Object(map), Value::String(key)) => {
                    map.get(key).cloned().unwrap_or(Value::Null)
                }
                (Value::Array(items), Value::Number(n)) => {
                    let i = n.as_i64().ok_or("an index must be an integer")?;
                    let at = if i < 0 { items.len() as i64 + i } else { i };
                    usize::try_from(at)
                        .ok()
                        .and_then(|at| items.get(at))
                        .cloned()
                        .ok_or_else(|| {
                            format!("index out of range: {i} (array of length {})", items.len())
                        })?
                }
                (Value::Null, _) => return Err(format!("cannot fetch {index} from <nil>")),
                _ => return Err(format!("cannot fetch {index} from {}", kind(&target))),
            }
        }
        Node::Unary(op, operand) => {
            let value = eval(operand, env)?;
            match (*op, &value) {
                ("!", Value::Bool(b)) => Value::Bool(!b),
                ("-", Value::Number(n)) => match n.as_i64() {
                    Some(i) => json!(-i),
                    None => json!(-n.as_f64().unwrap_or(0.0)),
                },
                _ => {
                    return Err(format!(
                        "invalid operation: {op}{} ({})",
                        value,
                        kind(&value)
                    ));
                }
            }
        }
        Node::Ternary(condition, yes, no) => match eval(condition, env)? {
            Value::Bool(true) => eval(yes, env)?,
            Value::Bool(false) => eval(no, env)?,
            other => return Err(format!("non-bool {} used as condition", kind(&other))),
        },
        Node::Binary(op, left, right) => {
            let l = eval(left, env)?;
            // Short circuits: `&&`, `||` and `??` evaluate the right side only when needed.
            match (op.as_str(), &l) {
                ("&&" | "and", Value::Bool(false)) => return Ok(Value::Bool(false)),
                ("||" | "or", Value::Bool(true)) => return Ok(Value::Bool(true)),
                ("??", v) if !v.is_null() => return Ok(l),
                _ => {}
            }
            let r = eval(right, env)?;
            binary(op, &l, &r)?
        }
        Node::Call(name, args) => {
            let args: Vec<Value> = args
                .iter()
                .map(|a| eval(a, env))
                .collect::<Result<_, _>>()?;
            call(name, &args, env.scope)?
        }
    })
}

fn binary(op: &str, l: &Value, r: &Value) -> Result<Value, String> {
    let mismatch = || {
        format!(
            "invalid operation: {} {op} {} (mismatched types {} and {})",
            l,
            r,
            kind(l),
            kind(r)
        )
    };
    let numbers = || Some((l.as_f64()?, r.as_f64()?));
    let both_int = l.is_i64() && r.is_i64();
    Ok(match op {
        "??" => r.clone(),
        "&&" | "and" | "||" | "or" => match (l, r) {
            (Value::Bool(_), Value::Bool(b)) => Value::Bool(*b),
            _ => return Err(mismatch()),
        },
        "==" => Value::Bool(equal(l, r)),
        "!=" => Value::Bool(!equal(l, r)),
        "<" | "<=" | ">" | ">=" => {
            let ordering = match (l, r) {
                (Value::String(a), Value::String(b)) => a.cmp(b),
                _ => {
                    let (a, b) = numbers().ok_or_else(mismatch)?;
                    a.partial_cmp(&b).ok_or_else(mismatch)?
                }
            };
            Value::Bool(match op {
                "<" => ordering.is_lt(),
                "<=" => ordering.is_le(),
                ">" => ordering.is_gt(),
                _ => ordering.is_ge(),
            })
        }
        "in" | "not in" => {
            let found = match r {
                Value::Array(items) => items.iter().any(|i| equal(i, l)),
                Value::Object(map) => l.as_str().is_some_and(|k| map.contains_key(k)),
                _ => return Err(mismatch()),
            };
            Value::Bool(found == (op == "in"))
        }
        "contains" | "startsWith" | "endsWith" => match (l, r) {
            (Value::String(a), Value::String(b)) => Value::Bool(match op {
                "contains" => a.contains(b.as_str()),
                "startsWith" => a.starts_with(b.as_str()),
                _ => a.ends_with(b.as_str()),
            }),
            _ => return Err(mismatch()),
        },
        "matches" => match (l, r) {
            (Value::String(a), Value::String(pattern)) => Value::Bool(
                regex::Regex::new(pattern)
                    .map_err(|e| e.to_string())?
                    .is_match(a),
            ),
            _ => return Err(mismatch()),
        },
        "+" => match (l, r) {
            (Value::String(a), Value::String(b)) => Value::String(format!("{a}{b}")),
            (Value::Array(a), Value::Array(b)) => {
                Value::Array(a.iter().chain(b).cloned().collect())
            }
            _ if both_int => json!(
                l.as_i64()
                    .unwrap_or(0)
                    .checked_add(r.as_i64().unwrap_or(0))
                    .ok_or("integer overflow")?
            ),
            _ => {
                let (a, b) = numbers().ok_or_else(mismatch)?;
                json!(a + b)
            }
        },
        "-" | "*" | "%" if both_int => {
            let (a, b) = (l.as_i64().unwrap_or(0), r.as_i64().unwrap_or(0));
            json!(
                match op {
                    "-" => a.checked_sub(b),
                    "*" => a.checked_mul(b),
                    _ => a.checked_rem(b),
                }
                .ok_or("integer overflow or division by zero")?
            )
        }
        "-" | "*" | "/" => {
            let (a, b) = numbers().ok_or_else(mismatch)?;
            json!(match op {
                "-" => a - b,
                "*" => a * b,
                _ => a / b,
            })
        }
        _ => return Err(mismatch()),
    })
}
