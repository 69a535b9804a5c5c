//! Kargo's `${{ }}` expressions as Kargo v1.11 evaluates a step's config
//! ([K pkg/expressions/json_templates.go]): every string value holding a delimiter (`${{ }}` or
//! `${% %}`) is evaluated, each expression by the expr-lang subset below (literals, map and
//! list literals, members, operators, ternaries, calls), non-string results written as JSON,
//! and then **the
//! whole string is typed**: a result wrapped in double quotes loses them and stays a string;
//! otherwise one that parses as a number becomes a number, then a bool, then any JSON value.
//! So `"${{ outputs.pr.id }}"` is a number and a JSON-looking string becomes an object unless
//! it is `quote()`d, exactly the trap real Kargo sets.
//!
//! Functions ([K pkg/expressions/function/functions.go]): `quote`, `unsafeQuote`,
//! `chartFrom(repoURL[, name])`, `imageFrom(repoURL)`, `warehouse(name)`, `secret(name)`,
//! `semverDiff(a, b)`, and for `if:` conditions `always()`, `success()`, `failure()`,
//! `status(alias)`. Anything else is an error naming the expression, never a silent empty
//! string.

use serde_json::{Map, Value, json};

/// What expressions can see.
pub struct Scope<'a> {
    pub ctx: Value,
    pub vars: &'a Map<String, Value>,
    pub outputs: &'a Map<String, Value>,
    /// The target Freight (top-level `images`, `charts`, `commits`).
    pub freight: &'a Value,
    /// `secret(name)`: the Project's Secrets, name -> decoded data.
    pub secrets: &'a Map<String, Value>,
    /// The steps run so far: (alias, status: Succeeded, Skipped, Failed, Errored).
    pub statuses: &'a [(String, String)],
}

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
fn to_text(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        other => go_json(other),
    }
}

/// JSON as Go's encoder writes it: map keys sorted, integral floats without a fraction.
fn go_json(value: &Value) -> Result<String, String> {
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

fn failed(status: &str) -> bool {
    matches!(status, "Failed" | "Errored")
}

/// `quote(x)`: a string as a Go-quoted literal; anything else as `unsafeQuote` does.
pub fn quote(value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => serde_json::to_string(s).map_err(|e| e.to_string()),
        other => unsafe_quote(other),
    }
}

/// `unsafeQuote(x)`: the value's JSON between double quotes, escapes kept.
pub fn unsafe_quote(value: &Value) -> Result<String, String> {
    Ok(format!("\"{}\"", go_json(value)?))
}

/// A version as Masterminds' `semver.NewVersion` reads one (what Kargo's `semverDiff` uses):
/// a leading `v`, and a missing minor or patch (`1`, `1.2`) taken as 0.
fn lenient_version(text: &str) -> Option<semver::Version> {
    let text = text.trim().strip_prefix('v').unwrap_or(text.trim());
    let split = text.find(['-', '+']).unwrap_or(text.len());
    let (core, rest) = text.split_at(split);
    let parts: Vec<&str> = core.split('.').collect();
    if parts.is_empty()
        || parts.len() > 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let mut full: Vec<&str> = parts.clone();
    while full.len() < 3 {
        full.push("0");
    }
    semver::Version::parse(&format!("{}{rest}", full.join("."))).ok()
}

/// Kargo's `semverDiff`: Major, Minor, Patch, Metadata, None, or Incomparable.
pub fn semver_diff(a: &str, b: &str) -> &'static str {
    let parse = lenient_version;
    let (Some(a), Some(b)) = (parse(a), parse(b)) else {
        return "Incomparable";
    };
    if a.major != b.major {
        "Major"
    } else if a.minor != b.minor {
        "Minor"
    } else if a.patch != b.patch {
        "Patch"
    } else if a.build != b.build {
        "Metadata"
    } else {
        "None"
    }
}

// ---- The expression language: the part of expr-lang ([expr-lang/expr docs: Language
// Definition]) Kargo's promotion templates use. Written here because the Rust port on
// crates.io (expr-lang 2.1) panics on a map literal whose values are not constants, which
// is exactly the `quote({...})` body Kargo's docs prescribe.

/// Nesting deeper than this is refused (a scenario's expression cannot exhaust the stack).
const MAX_NESTING: usize = 64;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Num(Value),
    Str(String),
    Ident(String),
    Punct(&'static str),
}

fn tokens(expression: &str) -> Result<Vec<Token>, String> {
    const PUNCTS: [&str; 27] = [
        "??", "?.", "==", "!=", "<=", ">=", "&&", "||", "(", ")", "[", "]", "{", "}", ",", ":",
        ".", "?", "!", "<", ">", "+", "-", "*", "/", "%", "|",
    ];
    let chars: Vec<char> = expression.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' || c == '"' || c == '`' {
            let mut text = String::new();
            i += 1;
            loop {
                let Some(&d) = chars.get(i) else {
                    return Err("unterminated string".into());
                };
                i += 1;
                if d == c {
                    break;
                }
                if d == '\\' && c != '`' {
                    let e = chars.get(i).copied().ok_or("unterminated string")?;
                    i += 1;
                    text.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        other => other,
                    });
                } else {
                    text.push(d);
                }
            }
            out.push(Token::Str(text));
        } else if c.is_ascii_digit() {
            let begin = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                // `1..2` is a range, not a number.
                if chars[i] == '.' && chars.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
            let text: String = chars[begin..i].iter().filter(|c| **c != '_').collect();
            let number = if let Ok(n) = text.parse::<i64>() {
                json!(n)
            } else {
                json!(
                    text.parse::<f64>()
                        .map_err(|_| format!("bad number {text:?}"))?
                )
            };
            out.push(Token::Num(number));
        } else if c.is_alphabetic() || c == '_' || c == '$' {
            let begin = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                i += 1;
            }
            out.push(Token::Ident(chars[begin..i].iter().collect()));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let punct = PUNCTS
                .iter()
                .find(|p| rest.starts_with(**p))
                .ok_or_else(|| format!("unexpected {c:?}"))?;
            i += punct.chars().count();
            out.push(Token::Punct(punct));
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
enum Node {
    Literal(Value),
    Name(String),
    Member(Box<Node>, Box<Node>, bool),
    Call(String, Vec<Node>),
    List(Vec<Node>),
    Map(Vec<(String, Node)>),
    Unary(&'static str, Box<Node>),
    Binary(String, Box<Node>, Box<Node>),
    Ternary(Box<Node>, Box<Node>, Box<Node>),
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }
    fn is(&self, punct: &str) -> bool {
        matches!(self.peek(), Some(Token::Punct(p)) if *p == punct)
    }
    fn expect(&mut self, punct: &str) -> Result<(), String> {
        if self.is(punct) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected {punct:?} at token {}", self.at + 1))
        }
    }
    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(format!("nested deeper than {MAX_NESTING}"));
        }
        Ok(())
    }

    fn expression(&mut self) -> Result<Node, String> {
        self.deeper()?;
        let condition = self.binary(0)?;
        let node = if self.is("?") {
            self.at += 1;
            let yes = self.expression()?;
            self.expect(":")?;
            let no = self.expression()?;
            Node::Ternary(Box::new(condition), Box::new(yes), Box::new(no))
        } else {
            condition
        };
        self.depth -= 1;
        Ok(node)
    }

    /// The binary operator at the cursor and its precedence (higher binds tighter).
    fn operator(&self) -> Option<(String, u8)> {
        let op = match self.peek()? {
            Token::Punct(p) => (*p).to_string(),
            Token::Ident(w)
                if [
                    "and",
                    "or",
                    "in",
                    "contains",
                    "startsWith",
                    "endsWith",
                    "matches",
                ]
                .contains(&w.as_str()) =>
            {
                w.clone()
            }
            Token::Ident(w)
                if w == "not"
                    && matches!(self.tokens.get(self.at + 1), Some(Token::Ident(n)) if n == "in") =>
            {
                "not in".into()
            }
            _ => return None,
        };
        // [expr-lang parser/operator/operator.go]: or 10, and 15, every comparison 20
        // (==, !=, <, <=, >, >=, in, matches, contains, startsWith, endsWith), + - 30,
        // * / % 60, ?? 500 (the tightest).
        let precedence = match op.as_str() {
            "||" | "or" => 1,
            "&&" | "and" => 2,
            "==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not in" | "contains" | "startsWith"
            | "endsWith" | "matches" => 3,
            "+" | "-" => 4,
            "*" | "/" | "%" => 5,
            "??" => 6,
            _ => return None,
        };
        Some((op, precedence))
    }

    fn binary(&mut self, min: u8) -> Result<Node, String> {
        let mut left = self.unary()?;
        while let Some((op, precedence)) = self.operator() {
            if precedence <= min {
                break;
            }
            self.at += if op == "not in" { 2 } else { 1 };
            let right = self.binary(precedence)?;
            left = Node::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Node, String> {
        let op = match self.peek() {
            Some(Token::Punct("!")) => Some("!"),
            Some(Token::Punct("-")) => Some("-"),
            Some(Token::Ident(w)) if w == "not" => Some("!"),
            _ => None,
        };
        if let Some(op) = op {
            self.at += 1;
            self.deeper()?;
            let operand = self.unary()?;
            self.depth -= 1;
            return Ok(Node::Unary(op, Box::new(operand)));
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Node, String> {
        let mut node = self.primary()?;
        loop {
            if self.is(".") || self.is("?.") {
                let optional = self.is("?.");
                self.at += 1;
                if optional && self.is("[") {
                    self.at += 1;
                    let index = self.expression()?;
                    self.expect("]")?;
                    node = Node::Member(Box::new(node), Box::new(index), true);
                    continue;
                }
                let Some(Token::Ident(field)) = self.peek().cloned() else {
                    return Err("expected a field name after '.'".into());
                };
                self.at += 1;
                node = Node::Member(
                    Box::new(node),
                    Box::new(Node::Literal(json!(field))),
                    optional,
                );
            } else if self.is("[") {
                self.at += 1;
                let index = self.expression()?;
                self.expect("]")?;
                node = Node::Member(Box::new(node), Box::new(index), false);
            } else {
                return Ok(node);
            }
        }
    }

    fn list(&mut self, close: &str) -> Result<Vec<Node>, String> {
        let mut items = Vec::new();
        while !self.is(close) {
            items.push(self.expression()?);
            if !self.is(close) {
                self.expect(",")?;
            }
        }
        self.expect(close)?;
        Ok(items)
    }

    fn primary(&mut self) -> Result<Node, String> {
        let token = self.peek().cloned().ok_or("unexpected end of expression")?;
        self.at += 1;
        Ok(match token {
            Token::Num(n) => Node::Literal(n),
            Token::Str(s) => Node::Literal(Value::String(s)),
            Token::Ident(word) => match word.as_str() {
                "true" => Node::Literal(json!(true)),
                "false" => Node::Literal(json!(false)),
                "nil" => Node::Literal(Value::Null),
                _ if self.is("(") => {
                    self.at += 1;
                    Node::Call(word, self.list(")")?)
                }
                _ => Node::Name(word),
            },
            Token::Punct("(") => {
                let inner = self.expression()?;
                self.expect(")")?;
                inner
            }
            Token::Punct("[") => Node::List(self.list("]")?),
            Token::Punct("{") => {
                let mut entries = Vec::new();
                while !self.is("}") {
                    let key = match self.peek().cloned() {
                        Some(Token::Ident(k) | Token::Str(k)) => k,
                        _ => return Err("a map key must be a name or a string".into()),
                    };
                    self.at += 1;
                    self.expect(":")?;
                    entries.push((key, self.expression()?));
                    if !self.is("}") {
                        self.expect(",")?;
                    }
                }
                self.expect("}")?;
                Node::Map(entries)
            }
            other => return Err(format!("unexpected {other:?}")),
        })
    }
}

fn parse(expression: &str) -> Result<Node, String> {
    let mut parser = Parser {
        tokens: tokens(expression)?,
        at: 0,
        depth: 0,
    };
    let node = parser.expression()?;
    if parser.at < parser.tokens.len() {
        return Err(format!("unexpected {:?}", parser.tokens[parser.at]));
    }
    Ok(node)
}

struct Env<'a> {
    names: &'a dyn Fn(&str) -> Option<Value>,
    /// Kargo's functions; `None` for a plain document (`yaml-parse`).
    scope: Option<&'a Scope<'a>>,
}

fn kind(value: &Value) -> &'static str {
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

fn arg(args: &[Value], i: usize) -> String {
    args.get(i)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Kargo's functions ([K pkg/expressions/function/functions.go]) and the few expr-lang
/// built-ins a template needs.
fn call(name: &str, args: &[Value], scope: Option<&Scope>) -> Result<Value, String> {
    let first = args.first().cloned().unwrap_or(Value::Null);
    let builtin = match name {
        "quote" => Some(Value::String(quote(&first)?)),
        "unsafeQuote" => Some(Value::String(unsafe_quote(&first)?)),
        "len" => Some(json!(match &first {
            Value::String(s) => s.chars().count(),
            Value::Array(a) => a.len(),
            Value::Object(m) => m.len(),
            other => return Err(format!("invalid argument for len (type {})", kind(other))),
        })),
        // expr-lang's string() is fmt's %v: nil is "<nil>".
        "string" => Some(Value::String(match &first {
            Value::Null => "<nil>".to_string(),
            other => to_text(other)?,
        })),
        "lower" => Some(json!(arg(args, 0).to_lowercase())),
        "upper" => Some(json!(arg(args, 0).to_uppercase())),
        "trim" => Some(json!(arg(args, 0).trim())),
        "hasPrefix" => Some(json!(arg(args, 0).starts_with(&arg(args, 1)))),
        "hasSuffix" => Some(json!(arg(args, 0).ends_with(&arg(args, 1)))),
        "trimPrefix" => Some(json!(
            arg(args, 0)
                .strip_prefix(arg(args, 1).as_str())
                .map(str::to_string)
                .unwrap_or_else(|| arg(args, 0))
        )),
        "semverDiff" => {
            if args.len() != 2 {
                return Err(format!("expected 2 arguments, got {}", args.len()));
            }
            for (i, which) in [(0, "first"), (1, "second")] {
                if !args[i].is_string() {
                    return Err(format!(
                        "{which} argument must be string, got {}",
                        kind(&args[i])
                    ));
                }
            }
            Some(json!(semver_diff(&arg(args, 0), &arg(args, 1))))
        }
        "warehouse" => {
            let name = arg(args, 0);
            if name.is_empty() {
                return Err("name must not be empty".into());
            }
            Some(json!({"kind": "Warehouse", "name": name}))
        }
        "always" => Some(json!(true)),
        _ => None,
    };
    if let Some(value) = builtin {
        return Ok(value);
    }
    let scope = scope.ok_or_else(|| format!("unknown function {name}()"))?;
    let freight = scope.freight;
    Ok(match name {
        "failure" => json!(scope.statuses.iter().any(|(_, s)| failed(s))),
        "success" => json!(!scope.statuses.iter().any(|(_, s)| failed(s))),
        "status" => json!(
            scope
                .statuses
                .iter()
                .find(|(a, _)| *a == arg(args, 0))
                .map(|(_, s)| s.clone())
                .unwrap_or_default()
        ),
        "secret" => scope
            .secrets
            .get(&arg(args, 0))
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new())),
        "chartFrom" => {
            let (repo, chart) = (arg(args, 0), arg(args, 1));
            let found = freight
                .get("charts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                // [K functions.go chartFrom, FindChart]: the repoURL and the name match
                // exactly; an oci:// repository's chart has no name.
                .find(|c| {
                    c.get("repoURL").and_then(Value::as_str) == Some(repo.as_str())
                        && c.get("name").and_then(Value::as_str).unwrap_or("") == chart
                })
                .ok_or(format!(
                    "the target Freight has no chart {chart} from {repo}"
                ))?;
            json!({"RepoURL": found["repoURL"], "Name": found["name"], "Version": found["version"]})
        }
        "imageFrom" => {
            let repo = arg(args, 0);
            let found = freight
                .get("images")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|i| i.get("repoURL").and_then(Value::as_str) == Some(repo.as_str()))
                .ok_or(format!("the target Freight has no image {repo}"))?;
            json!({"RepoURL": found["repoURL"], "Tag": found["tag"], "Digest": found["digest"]})
        }
        other => return Err(format!("function {other}() is not supported by the ground")),
    })
}

#[cfg(test)]
mod tests;
