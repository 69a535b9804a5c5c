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

use serde_json::{Map, Value};

mod eval;
mod functions;
mod lexer;
mod parser;
mod templates;

pub use self::eval::{evaluate, evaluate_in};
pub use self::functions::{quote, semver_diff, unsafe_quote};
pub use self::templates::{evaluate_template, evaluate_value};

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

#[cfg(test)]
mod tests;
