//! An upper bound on what evaluating one CEL expression against one value can allocate and do,
//! computed before it runs, in the manner of the API server's CEL cost estimator
//! (`k8s.io/apiserver/pkg/apis/cel`, cel-go's `checker.Cost`): every expression node gets a
//! bound on the size of the value it yields and on the work it takes, and a comprehension (the
//! list macros `all`, `exists`, `exists_one`, `map`, `filter`) multiplies its step's work by the
//! size of its range. Unlike a count of macros and their nesting, the sizes flow: a step that
//! copies a list (`self.l + self.l`) is charged the copy at every iteration, and a `map` whose
//! items are such copies yields a list as large as all of them.
//!
//! The unit is one value node (a scalar, a list, a map, or 16 bytes of a string), which is what
//! a copy allocates (a node is at most 64 bytes; strings are counted four times over, as the API
//! server charges string work per byte): [`nodes`] measures a JSON value in it. The bound is sound for what the
//! `cel` crate evaluates: every function the crate offers yields a value no larger than the sum
//! of its operands plus one, except the comprehensions, which are counted by their ranges, and
//! `matches`, which compiles its pattern at every call and is charged for that.
//!
//! Where a selection (`self.spec.items`) reaches a concrete part of the value, its size is that
//! part's size, not the whole value's: a rule over a small field of a large object costs what
//! the field costs.

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};
use serde_json::Value;

/// What evaluating an expression may yield and cost, at most.
#[derive(Debug, Clone, Copy)]
pub(super) struct Estimate {
    /// The size of the value it yields, in nodes.
    pub size: u64,
    /// The work it takes, in nodes touched or copied.
    pub cost: u64,
}

/// Why an expression has no bound here.
pub(super) type Unbounded = String;

/// A variable in scope: its name, the bound on its size, and the concrete value it stands for
/// when that is known (`self`).
struct Var<'v> {
    name: String,
    size: u64,
    value: Option<&'v Value>,
}

/// The estimator for one rule against one value.
pub(super) struct Estimator<'v> {
    scope: Vec<Var<'v>>,
}

/// What an expression yields, with the concrete value it reaches when a selection path from
/// `self` is known.
struct Node<'v> {
    estimate: Estimate,
    value: Option<&'v Value>,
}

impl<'v> Node<'v> {
    fn of(size: u64, cost: u64) -> Self {
        Node {
            estimate: Estimate { size, cost },
            value: None,
        }
    }
}

/// The size of a JSON value in nodes: every scalar, list and map counts one; a string one more
/// per 16 bytes; a map's key as a string does.
pub(super) fn nodes(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items.iter().map(nodes).fold(1, u64::saturating_add),
        // A key is read, hashed and compared like a string value.
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| nodes(v).saturating_add(1 + k.len() as u64 / 16))
            .fold(1, u64::saturating_add),
        Value::String(s) => 1 + (s.len() as u64) / 16,
        _ => 1,
    }
}

/// The work charged for compiling a regular expression once (the `cel` crate compiles the
/// pattern of `matches` at every call), from the smallest compiled-size limit it fits: one unit
/// per 8 bytes of compiled program. None when it does not fit [`MAX_REGEX_BYTES`].
pub(super) fn regex_weight(pattern: &str) -> Option<u64> {
    let mut limit = 4 << 10;
    while limit <= super::MAX_REGEX_BYTES {
        if regex::RegexBuilder::new(pattern)
            .size_limit(limit)
            .dfa_size_limit(limit)
            .build()
            .is_ok()
        {
            return Some((limit / 8) as u64);
        }
        limit *= 8;
    }
    None
}

impl<'v> Estimator<'v> {
    /// An estimator with `self` bound to `value`.
    pub(super) fn new(value: &'v Value) -> Self {
        Estimator {
            scope: vec![Var {
                name: "self".into(),
                size: nodes(value),
                value: Some(value),
            }],
        }
    }

    /// The bound for one expression, or why there is none.
    pub(super) fn estimate(&mut self, expression: &IdedExpr) -> Result<Estimate, Unbounded> {
        Ok(self.node(expression)?.estimate)
    }

    fn lookup(&self, name: &str) -> Option<&Var<'v>> {
        self.scope.iter().rev().find(|v| v.name == name)
    }

    fn node(&mut self, expression: &IdedExpr) -> Result<Node<'v>, Unbounded> {
        Ok(match &expression.expr {
            Expr::Unspecified => Node::of(1, 1),
            Expr::Literal(literal) => match literal {
                LiteralValue::String(s) => Node::of(1 + s.inner().len() as u64 / 16, 1),
                LiteralValue::Bytes(b) => Node::of(1 + b.inner().len() as u64 / 16, 1),
                _ => Node::of(1, 1),
            },
            Expr::Ident(name) => match self.lookup(name) {
                Some(var) => Node {
                    estimate: Estimate {
                        size: var.size,
                        cost: 1,
                    },
                    value: var.value,
                },
                // An unknown name is an evaluation error: nothing is built.
                None => Node::of(1, 1),
            },
            Expr::Select(select) => {
                let operand = self.node(&select.operand)?;
                let cost = operand.estimate.cost.saturating_add(1);
                if select.test {
                    return Ok(Node::of(1, cost));
                }
                match operand.value.map(|v| field(v, &select.field)) {
                    Some(Some(found)) => Node {
                        estimate: Estimate {
                            size: nodes(found),
                            cost,
                        },
                        value: Some(found),
                    },
                    // Absent: an evaluation error, or null where nullable.
                    Some(None) => Node::of(1, cost),
                    None => Node::of(operand.estimate.size, cost),
                }
            }
            Expr::List(list) => {
                let mut size: u64 = 1;
                let mut cost: u64 = 0;
                for element in &list.elements {
                    let e = self.estimate(element)?;
                    size = size.saturating_add(e.size);
                    cost = cost.saturating_add(e.cost);
                }
                Node::of(size, cost.saturating_add(size))
            }
            Expr::Map(cel::common::ast::MapExpr { entries })
            | Expr::Struct(cel::common::ast::StructExpr { entries, .. }) => {
                let mut size: u64 = 1;
                let mut cost: u64 = 0;
                for entry in entries {
                    let parts: Vec<&IdedExpr> = match &entry.expr {
                        EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
                        EntryExpr::StructField(f) => vec![&f.value],
                    };
                    for part in parts {
                        let e = self.estimate(part)?;
                        size = size.saturating_add(e.size);
                        cost = cost.saturating_add(e.cost);
                    }
                }
                Node::of(size, cost.saturating_add(size))
            }
            Expr::Call(call) => {
                let mut operands = Vec::with_capacity(call.args.len() + 1);
                if let Some(target) = &call.target {
                    operands.push(self.node(target)?);
                }
                for arg in &call.args {
                    operands.push(self.node(arg)?);
                }
                let pattern = call.args.last().and_then(|a| match &a.expr {
                    Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_string()),
                    _ => None,
                });
                self.call(&call.func_name, &operands, pattern.as_deref())?
            }
            Expr::Comprehension(c) => self.comprehension(c)?,
        })
    }

    fn call(
        &self,
        name: &str,
        operands: &[Node<'v>],
        pattern: Option<&str>,
    ) -> Result<Node<'v>, Unbounded> {
        let cost: u64 = operands
            .iter()
            .map(|o| o.estimate.cost)
            .fold(0, u64::saturating_add);
        let sizes: u64 = operands
            .iter()
            .map(|o| o.estimate.size)
            .fold(0, u64::saturating_add);
        let largest = |skip: usize| {
            operands
                .iter()
                .skip(skip)
                .map(|o| o.estimate.size)
                .max()
                .unwrap_or(1)
        };
        Ok(match name {
            // Joins copy both sides.
            operators::ADD => Node::of(sizes, cost.saturating_add(sizes)),
            // Either branch; all three are charged.
            operators::CONDITIONAL => Node::of(largest(1), cost),
            // An element is no larger than its container.
            operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT => {
                Node::of(largest(0), cost.saturating_add(1))
            }
            // The pattern is compiled at every call and the text scanned.
            "matches" => {
                let text = operands.first().map_or(1, |o| o.estimate.size);
                let weight = match pattern {
                    Some(p) => regex_weight(p).ok_or_else(|| {
                        format!(
                            "its regular expression compiles past {} bytes",
                            super::MAX_REGEX_BYTES
                        )
                    })?,
                    None => return Err("its regular expression is not a literal".into()),
                };
                // Compiled at every call; matched in time up to program x text (the lazy DFA
                // may give up and the slower engine walks every state per byte).
                Node::of(
                    1,
                    cost.saturating_add(weight)
                        .saturating_add(super::match_cost(weight, text)),
                )
            }
            // Comparisons and tests walk their operands and yield a scalar.
            operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | operators::IN
            | operators::LOGICAL_AND
            | operators::LOGICAL_OR
            | operators::LOGICAL_NOT
            | operators::NOT_STRICTLY_FALSE
            | "size"
            | "contains"
            | "startsWith"
            | "endsWith"
            | "has" => Node::of(1, cost.saturating_add(sizes).saturating_add(1)),
            // Anything else (arithmetic, conversions, optional values): no larger than its
            // operands together, plus one.
            _ => {
                let size = sizes.saturating_add(1);
                Node::of(size, cost.saturating_add(size))
            }
        })
    }

    fn comprehension(
        &mut self,
        c: &cel::common::ast::ComprehensionExpr,
    ) -> Result<Node<'v>, Unbounded> {
        let range = self.node(&c.iter_range)?;
        let init = self.estimate(&c.accu_init)?;
        if occurrences(&c.loop_step, &c.accu_var) > 1 || occurrences(&c.loop_cond, &c.accu_var) > 1
        {
            return Err("a comprehension whose step reads its accumulator twice".into());
        }
        // Iterations: at most the range's size; an element no larger than the largest one (known
        // when the range is a concrete list or map of the value), else than the range.
        let iterations = range.estimate.size;
        let element = match range.value {
            Some(Value::Array(items)) => items.iter().map(nodes).max().unwrap_or(1),
            Some(Value::Object(map)) => map
                .keys()
                .map(|k| 1 + k.len() as u64 / 16)
                .max()
                .unwrap_or(1),
            _ => range.estimate.size,
        };
        let mut vars = vec![c.iter_var.clone()];
        vars.extend(c.iter_var2.clone());
        for name in &vars {
            self.scope.push(Var {
                name: name.clone(),
                size: element,
                value: None,
            });
        }
        // How much one step adds to the accumulator: the step's size with an empty accumulator;
        // whether the accumulator flows into the step's value at all: a probe with a large one.
        let growth = self.with_accumulator(&c.accu_var, 0, |e| e.estimate(&c.loop_step))?;
        const PROBE: u64 = 1 << 40;
        let probed = self.with_accumulator(&c.accu_var, PROBE, |e| e.estimate(&c.loop_step))?;
        let accumulator = if probed.size >= PROBE {
            init.size
                .saturating_add(iterations.saturating_mul(growth.size))
        } else {
            init.size.max(growth.size)
        };
        // A step that only appends to the list it builds (`map`, `filter`) appends in place (the
        // crate's `AppendStep`, as cel-go does); any other step is charged with the whole
        // accumulator, which it may copy.
        let step_accumulator = if appends_in_place(c) { 0 } else { accumulator };
        let step =
            self.with_accumulator(&c.accu_var, step_accumulator, |e| e.estimate(&c.loop_step))?;
        let condition =
            self.with_accumulator(&c.accu_var, accumulator, |e| e.estimate(&c.loop_cond))?;
        let result = self.with_accumulator(&c.accu_var, accumulator, |e| e.estimate(&c.result))?;
        for _ in &vars {
            self.scope.pop();
        }
        let per_iteration = step
            .cost
            .saturating_add(condition.cost)
            .saturating_add(element);
        let cost = range
            .estimate
            .cost
            .saturating_add(init.cost)
            .saturating_add(iterations.saturating_mul(per_iteration))
            .saturating_add(accumulator)
            .saturating_add(result.cost);
        Ok(Node::of(result.size, cost))
    }

    fn with_accumulator<T>(
        &mut self,
        name: &str,
        size: u64,
        f: impl FnOnce(&mut Self) -> Result<T, Unbounded>,
    ) -> Result<T, Unbounded> {
        self.scope.push(Var {
            name: name.to_string(),
            size,
            value: None,
        });
        let out = f(self);
        self.scope.pop();
        out
    }
}

/// The child a CEL selection reaches: a property by its escaped name, or a map key as it is.
fn field<'v>(value: &'v Value, name: &str) -> Option<&'v Value> {
    let map = value.as_object()?;
    map.get(name).or_else(|| {
        map.iter()
            .find(|(k, _)| super::escape(k).as_deref() == Some(name))
            .map(|(_, v)| v)
    })
}

/// How many times an identifier is read in an expression, where it is not shadowed (a nested
/// comprehension binding the same name, as every macro binds `@result`, hides it in its body).
fn occurrences(expression: &IdedExpr, name: &str) -> usize {
    match &expression.expr {
        Expr::Ident(n) => usize::from(n == name),
        Expr::Comprehension(c) => {
            let outer = occurrences(&c.iter_range, name) + occurrences(&c.accu_init, name);
            let binds =
                c.accu_var == name || c.iter_var == name || c.iter_var2.as_deref() == Some(name);
            if binds {
                outer
            } else {
                outer
                    + occurrences(&c.loop_cond, name)
                    + occurrences(&c.loop_step, name)
                    + occurrences(&c.result, name)
            }
        }
        _ => {
            let mut children = Vec::new();
            super::collect_children(expression, &mut children);
            children.into_iter().map(|c| occurrences(c, name)).sum()
        }
    }
}

/// Whether the comprehension is the shape the crate evaluates by appending in place: an empty
/// list to start, a literal condition, the accumulator as the result, and a step
/// `@result + [item]` (guarded or not).
fn appends_in_place(c: &cel::common::ast::ComprehensionExpr) -> bool {
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if *n == c.accu_var);
    let appends = |e: &IdedExpr| match &e.expr {
        Expr::Call(call) if call.func_name == operators::ADD && call.target.is_none() => {
            matches!(call.args.as_slice(), [lhs, rhs] if is_accu(lhs) && matches!(rhs.expr, Expr::List(_)))
        }
        _ => false,
    };
    let empty_list = matches!(&c.accu_init.expr, Expr::List(l) if l.elements.is_empty());
    if !empty_list || !is_accu(&c.result) || !matches!(c.loop_cond.expr, Expr::Literal(_)) {
        return false;
    }
    match &c.loop_step.expr {
        Expr::Call(call) if call.func_name == operators::CONDITIONAL && call.target.is_none() => {
            matches!(call.args.as_slice(), [_, step, otherwise] if appends(step) && is_accu(otherwise))
        }
        _ => appends(&c.loop_step),
    }
}
