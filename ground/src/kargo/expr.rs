//! The subset of Kargo's `${{ }}` expressions the ground's promotion steps evaluate:
//! `ctx.*`, `vars.*`, `outputs.<alias>.<path>` (or `outputs['alias']`), literals, and the
//! functions `chartFrom(repoURL[, name])`, `imageFrom(repoURL)`, `quote(x)`. Anything else is
//! an error naming the expression, never a silent empty string.

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
}

/// Evaluates every `${{ }}` in a config value. A string that is exactly one expression takes
/// the expression's type (a PR number stays a number); otherwise results are interpolated.
pub fn evaluate_value(value: &Value, scope: &Scope) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => evaluate_string(s, scope)?,
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

fn evaluate_string(text: &str, scope: &Scope) -> Result<Value, String> {
    let trimmed = text.trim();
    if trimmed.starts_with("${{") && trimmed.ends_with("}}") && trimmed.matches("${{").count() == 1
    {
        return evaluate(&trimmed[3..trimmed.len() - 2], scope);
    }
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 3..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("unterminated expression in {text:?}"))?;
        let value = evaluate(&after[..end], scope)?;
        match value {
            Value::String(s) => out.push_str(&s),
            other => out.push_str(&other.to_string()),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(Value::String(out))
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Num(f64),
    Dot,
    Comma,
    Open,
    Close,
    OpenBracket,
    CloseBracket,
}

fn tokens(expression: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expression.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\n' => i += 1,
            '.' => {
                out.push(Token::Dot);
                i += 1
            }
            ',' => {
                out.push(Token::Comma);
                i += 1
            }
            '(' => {
                out.push(Token::Open);
                i += 1
            }
            ')' => {
                out.push(Token::Close);
                i += 1
            }
            '[' => {
                out.push(Token::OpenBracket);
                i += 1
            }
            ']' => {
                out.push(Token::CloseBracket);
                i += 1
            }
            '\'' | '"' => {
                let quote = c;
                let mut s = String::new();
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        i += 1;
                    }
                    s.push(chars[i]);
                    i += 1;
                }
                if i >= chars.len() {
                    return Err(format!("unterminated string in {expression:?}"));
                }
                i += 1;
                out.push(Token::Str(s));
            }
            c if c.is_ascii_digit() => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                out.push(Token::Num(
                    text.parse().map_err(|_| format!("bad number {text:?}"))?,
                ));
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            other => {
                return Err(format!(
                    "expression {expression:?}: the ground does not support {other:?}"
                ));
            }
        }
    }
    Ok(out)
}

struct Reader<'t> {
    tokens: &'t [Token],
    position: usize,
    source: &'t str,
}

impl Reader<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.position)
    }
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.position).cloned();
        self.position += 1;
        t
    }
    fn error(&self, what: &str) -> String {
        format!("expression {:?}: {what}", self.source.trim())
    }
}

pub fn evaluate(expression: &str, scope: &Scope) -> Result<Value, String> {
    let tokens = tokens(expression)?;
    let mut reader = Reader {
        tokens: &tokens,
        position: 0,
        source: expression,
    };
    let value = primary(&mut reader, scope)?;
    if reader.peek().is_some() {
        return Err(reader.error("operators are not supported by the ground"));
    }
    Ok(value)
}

fn primary(reader: &mut Reader, scope: &Scope) -> Result<Value, String> {
    let mut value = match reader.next() {
        Some(Token::Str(s)) => Value::String(s),
        Some(Token::Num(n)) => json!(n),
        Some(Token::Ident(name)) if reader.peek() == Some(&Token::Open) => {
            reader.next();
            let mut args = Vec::new();
            while reader.peek() != Some(&Token::Close) {
                args.push(primary(reader, scope)?);
                if reader.peek() == Some(&Token::Comma) {
                    reader.next();
                }
                if reader.peek().is_none() {
                    return Err(reader.error("unclosed call"));
                }
            }
            reader.next();
            call(&name, &args, scope).map_err(|e| reader.error(&e))?
        }
        Some(Token::Ident(name)) => match name.as_str() {
            "ctx" => scope.ctx.clone(),
            "vars" => Value::Object(scope.vars.clone()),
            "outputs" => Value::Object(scope.outputs.clone()),
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            other => return Err(reader.error(&format!("unknown name {other:?}"))),
        },
        _ => return Err(reader.error("expected a value")),
    };
    loop {
        match reader.peek() {
            Some(Token::Dot) => {
                reader.next();
                let Some(Token::Ident(field)) = reader.next() else {
                    return Err(reader.error("expected a field after '.'"));
                };
                value = field_of(&value, &field)
                    .ok_or_else(|| reader.error(&format!("no field {field:?}")))?;
            }
            Some(Token::OpenBracket) => {
                reader.next();
                let index = primary(reader, scope)?;
                if reader.next() != Some(Token::CloseBracket) {
                    return Err(reader.error("expected ']'"));
                }
                value = match &index {
                    Value::String(k) => field_of(&value, k),
                    Value::Number(n) => n.as_f64().and_then(|i| value.get(i as usize).cloned()),
                    _ => None,
                }
                .ok_or_else(|| reader.error(&format!("no element {index}")))?;
            }
            _ => return Ok(value),
        }
    }
}

fn field_of(value: &Value, field: &str) -> Option<Value> {
    value.get(field).cloned()
}

fn call(name: &str, args: &[Value], scope: &Scope) -> Result<Value, String> {
    let arg = |i: usize| {
        args.get(i)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    match name {
        "quote" => Ok(Value::String(match args.first() {
            Some(Value::String(s)) => serde_json::to_string(s).unwrap_or_default(),
            Some(other) => serde_json::to_string(&other.to_string()).unwrap_or_default(),
            None => "\"\"".into(),
        })),
        "secret" => Ok(scope
            .secrets
            .get(&arg(0))
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()))),
        "chartFrom" => {
            let (repo, chart) = (arg(0), arg(1));
            let found = scope
                .freight
                .get("charts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| {
                    c.get("repoURL")
                        .and_then(Value::as_str)
                        .map(|u| u.trim_end_matches('/'))
                        == Some(repo.trim_end_matches('/'))
                        && (chart.is_empty()
                            || c.get("name").and_then(Value::as_str) == Some(chart.as_str()))
                });
            let found = found.ok_or(format!(
                "the target Freight has no chart {chart} from {repo}"
            ))?;
            Ok(
                json!({"RepoURL": found["repoURL"], "Name": found["name"], "Version": found["version"]}),
            )
        }
        "imageFrom" => {
            let repo = arg(0);
            let found = scope
                .freight
                .get("images")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|i| i.get("repoURL").and_then(Value::as_str) == Some(repo.as_str()))
                .ok_or(format!("the target Freight has no image {repo}"))?;
            Ok(json!({"RepoURL": found["repoURL"], "Tag": found["tag"], "Digest": found["digest"]}))
        }
        other => Err(format!("function {other}() is not supported by the ground")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions() {
        let vars: Map<String, Value> = [("repo".to_string(), json!("https://git/x"))]
            .into_iter()
            .collect();
        let outputs: Map<String, Value> = [
            ("open-pr".to_string(), json!({"pr": {"id": 7}})),
            ("push".to_string(), json!({"branch": "kargo/p"})),
        ]
        .into_iter()
        .collect();
        let freight = json!({"charts": [{"repoURL": "https://charts/stable", "name": "c", "version": "1.2.3"}]});
        let scope = Scope {
            ctx: json!({"stage": "prod"}),
            vars: &vars,
            outputs: &outputs,
            freight: &freight,
            secrets: &Map::new(),
        };
        assert_eq!(
            evaluate_string("${{ outputs['open-pr'].pr.id }}", &scope).unwrap(),
            json!(7)
        );
        assert_eq!(
            evaluate_string(
                "branch ${{ outputs.push.branch }} for ${{ ctx.stage }}",
                &scope
            )
            .unwrap(),
            json!("branch kargo/p for prod")
        );
        assert_eq!(
            evaluate_string(
                "${{ chartFrom('https://charts/stable', 'c').Version }}",
                &scope
            )
            .unwrap(),
            json!("1.2.3")
        );
        assert_eq!(
            evaluate_string("${{ vars.repo }}", &scope).unwrap(),
            json!("https://git/x")
        );
        assert!(evaluate_string("${{ 1 + 1 }}", &scope).is_err());
        assert!(evaluate_string("${{ nope.x }}", &scope).is_err());
    }
}
