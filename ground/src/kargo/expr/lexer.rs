//! Lexing: an expression's text as tokens.

use serde_json::Value;
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Token {
    Num(Value),
    Str(String),
    Ident(String),
    Punct(&'static str),
}

pub(super) fn tokens(expression: &str) -> Result<Vec<Token>, String> {
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
