//! Parsing: tokens as an expression tree, by precedence climbing.

use serde_json::Value;
use serde_json::json;

use super::lexer::{Token, tokens};

// ---- The expression language: the part of expr-lang ([expr-lang/expr docs: Language
// Definition]) Kargo's promotion templates use. Written here because the Rust port on
// crates.io (expr-lang 2.1) panics on a map literal whose values are not constants, which
// is exactly the `quote({...})` body Kargo's docs prescribe.

/// Nesting deeper than this is refused (a scenario's expression cannot exhaust the stack).
const MAX_NESTING: usize = 64;

#[derive(Debug, Clone)]
pub(super) enum Node {
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

pub(super) fn parse(expression: &str) -> Result<Node, String> {
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
