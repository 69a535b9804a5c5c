//! ApplicationSet templating in both of Argo CD's modes.
//!
//! * fasttemplate (the default): `{{ key }}` is replaced by the string parameter `key`; an
//!   unknown key, or a parameter that is not a string, is left verbatim.
//! * `goTemplate: true`: Go `text/template` with Sprig. Rather than reimplement Go templates,
//!   the project evaluates them with helm's own engine (the same Go library and the same Sprig),
//!   one helm process per batch: every distinct template string becomes a named template, every
//!   parameter set is rendered through `include`. Argo CD's additions are bridged: `normalize`
//!   is provided as a named template, `<no value>` (which helm would blank) is preserved, and
//!   `missingkey=error` is enforced by checking field references against the parameters.

use std::path::Path;

use serde_json::{Map, Value};

use super::tools::Tool;

/// The parameters of one generated Application.
pub type Params = Map<String, Value>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateMode {
    Fast,
    Go { missing_key_error: bool },
}

impl TemplateMode {
    pub fn is_go(&self) -> bool {
        matches!(self, TemplateMode::Go { .. })
    }
}

/// Replaces `{{ key }}` tags the way Argo CD's fasttemplate path does.
pub fn fasttemplate(text: &str, params: &Params) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(format!(
                "invalid template {text:?}: cannot find end tag \"}}}}\""
            ));
        };
        let tag = &after[..end];
        let key = tag.trim();
        match params.get(key) {
            Some(Value::String(value)) if !key.is_empty() => out.push_str(value),
            _ => {
                out.push_str("{{");
                out.push_str(tag);
                out.push_str("}}");
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Applies `f` to every string value and every map key of `value` (Argo CD templates keys too).
pub fn map_strings(
    value: &Value,
    f: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Value, String> {
    Ok(match value {
        Value::String(s) => Value::String(f(s)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| map_strings(v, f))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(object) => {
            let mut out = Map::with_capacity(object.len());
            for (k, v) in object {
                out.insert(f(k)?, map_strings(v, f)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// Collects every string value and key of `value` that contains a template action.
pub fn collect_templates(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => push_template(s, out),
        Value::Array(items) => items.iter().for_each(|v| collect_templates(v, out)),
        Value::Object(object) => {
            for (k, v) in object {
                push_template(k, out);
                collect_templates(v, out);
            }
        }
        _ => {}
    }
}

/// Which parameter set an error is about, as a person finds it: the generator's `name` (a
/// cluster's, or a list element's) when it has one, and its position.
pub fn describe_params(params: &Params, index: usize) -> String {
    let named = ["name", "cluster", "server", "path"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_str).map(|v| (k, v)));
    match named {
        Some((key, value)) => format!("parameter set {index} ({key}={value:?})"),
        None => format!("parameter set {index}"),
    }
}

/// The field path (`spec.destination.namespace`, `metadata.labels[env]` for a key) where a
/// template string first occurs in `value`, for error messages.
pub fn field_of(value: &Value, template: &str) -> Option<String> {
    fn walk(value: &Value, template: &str, path: &str) -> Option<String> {
        match value {
            Value::String(s) if s == template => Some(path.to_string()),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, template, &format!("{path}[{i}]"))),
            Value::Object(object) => object.iter().find_map(|(k, v)| {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if k == template {
                    return Some(format!("{path}[{k}] (a key)"));
                }
                walk(v, template, &here)
            }),
            _ => None,
        }
    }
    walk(value, template, "")
}

fn push_template(s: &str, out: &mut Vec<String>) {
    if s.contains("{{") && !out.iter().any(|o| o == s) {
        out.push(s.to_string());
    }
}

const NO_VALUE_MARK: &str = "__GITOPS_GATE_NO_VALUE__";

/// Functions helm's template engine offers that Argo CD's goTemplate does not: Argo CD gives
/// Sprig's generic function map less `env`, `expandenv` and `getHostByName`, plus its own
/// `normalize`, `slugify`, `toYaml`, `fromYaml` and `fromYamlArray`
/// (`applicationset/utils/utils.go`). The gate evaluates goTemplate with helm's engine, so it
/// refuses these by name rather than render what Argo CD would reject.
const NOT_IN_ARGO_CD: &[(&str, &str)] = &[
    ("include", "a Helm-only function"),
    ("tpl", "a Helm-only function"),
    ("required", "a Helm-only function"),
    ("lookup", "a Helm-only function"),
    ("toToml", "a Helm-only function"),
    ("fromToml", "a Helm-only function"),
    ("toYamlPretty", "a Helm-only function"),
    ("fromJsonArray", "a Helm-only function"),
    (
        "env",
        "Argo CD removes it: a template may not read the controller's environment",
    ),
    (
        "expandenv",
        "Argo CD removes it: a template may not read the controller's environment",
    ),
    (
        "getHostByName",
        "Argo CD removes it: a template may not reach the network",
    ),
    (
        "block",
        "`block` inside an ApplicationSet template is not supported by the gate yet; write `define` and `template`",
    ),
];

/// One field's template with its `define` blocks taken out: Argo CD parses each field on its
/// own, so the names it defines belong to that field. The gate renders every field inside a
/// named template of its own, where a nested `define` is not allowed; so the definitions are
/// hoisted to the top level under `<field>.<name>`, and `template "<name>"` in that field is
/// renamed to match. Returns (body, hoisted definitions).
fn hoist_defines(template: &str, field: &str) -> Result<(String, String), String> {
    let actions = action_spans(template);
    check_blocks(template, &actions)?;
    let Taken {
        body,
        hoisted,
        names,
    } = take_defines(template, &actions)?;
    let rename = |text: &str| {
        let mut text = text.to_string();
        for name in &names {
            text = transform_actions(&text, |action| {
                action.replace(
                    &format!("template \"{name}\""),
                    &format!("template \"{field}.{name}\""),
                )
            });
        }
        text
    };
    let mut defines = String::new();
    for (name, inner) in &hoisted {
        defines.push_str(&format!(
            "{{{{ define \"{field}.{name}\" }}}}{}{{{{ end }}}}\n",
            rename(inner)
        ));
    }
    let body = rename(&body);
    // A field sees only the names it defines: not another field's, not the gate's own.
    if let Some(called) = foreign_call(field, &names, [&body, &defines]) {
        return Err(format!(
            "template {template:?}: `template {called}` names no template this field defines"
        ));
    }
    Ok((body, defines))
}

/// The (start, end) byte offsets of every action, `{{` to `}}` inclusive.
fn action_spans(template: &str) -> Vec<(usize, usize)> {
    let mut actions = Vec::new();
    let mut from = 0;
    while let Some(start) = template[from..].find("{{").map(|s| from + s) {
        let Some(end) = action_end(&template[start + 2..]).map(|e| start + 2 + e + 2) else {
            break;
        };
        actions.push((start, end));
        from = end;
    }
    actions
}

/// The keyword an action starts with (`define`, `end`, `if`, ...; a field or a pipeline's
/// first word otherwise).
fn action_keyword(template: &str, (start, end): (usize, usize)) -> &str {
    let inner = template[start + 2..end - 2]
        .trim_start_matches('-')
        .trim_end_matches('-')
        .trim();
    inner
        .split(|c: char| c.is_whitespace() || c == '(')
        .next()
        .unwrap_or("")
}

/// Go's parser: a `define` only at the top level, every `end` closing a block, every block
/// closed.
fn check_blocks(template: &str, actions: &[(usize, usize)]) -> Result<(), String> {
    let mut depth = 0i32;
    for &action in actions {
        match action_keyword(template, action) {
            "define" if depth > 0 => {
                return Err(format!(
                    "template {template:?}: unexpected `define` inside a block (Go refuses it)"
                ));
            }
            "if" | "range" | "with" | "define" | "block" => depth += 1,
            "end" => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!(
                        "template {template:?}: unexpected {{{{end}}}} (Go refuses it)"
                    ));
                }
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!(
            "template {template:?}: a block is not closed with {{{{end}}}}"
        ));
    }
    Ok(())
}

/// A field's template with its definitions taken out.
struct Taken {
    /// The template without its `define` blocks.
    body: String,
    /// Each definition: (name, the text it defines).
    hoisted: Vec<(String, String)>,
    /// The names defined, in order.
    names: Vec<String>,
}

/// Takes every top-level `define ... end` out of the template, applying the trim markers
/// around it as Go's lexer does.
fn take_defines(template: &str, actions: &[(usize, usize)]) -> Result<Taken, String> {
    let keyword = |action| action_keyword(template, action);
    let mut names = Vec::new();
    let mut hoisted = Vec::new();
    let mut body = String::new();
    let mut copied = 0;
    let mut index = 0;
    while index < actions.len() {
        if keyword(actions[index]) != "define" {
            index += 1;
            continue;
        }
        let (start, head_end) = actions[index];
        let head = &template[start..head_end];
        let name = head
            .split('"')
            .nth(1)
            .ok_or_else(|| format!("template {template:?}: `define` needs a quoted name"))?
            .to_string();
        let mut depth = 1;
        let mut close = None;
        for (j, &action) in actions.iter().enumerate().skip(index + 1) {
            match keyword(action) {
                "if" | "range" | "with" | "define" | "block" => depth += 1,
                "end" => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.ok_or_else(|| {
            format!("template {template:?}: `define \"{name}\"` has no matching `end`")
        })?;
        // Trim markers act on the text around the definition, as Go's lexer applies them.
        let before = &template[copied..start];
        if head.starts_with("{{-") {
            body.push_str(before.trim_end());
        } else {
            body.push_str(before);
        }
        let (end_start, end_end) = actions[close];
        let mut inner = &template[head_end..end_start];
        if head.ends_with("-}}") {
            inner = inner.trim_start();
        }
        if template[end_start..end_end].starts_with("{{-") {
            inner = inner.trim_end();
        }
        hoisted.push((name.clone(), inner.to_string()));
        copied = end_end;
        if template[end_start..end_end].ends_with("-}}") {
            let rest = &template[copied..];
            copied += rest.len() - rest.trim_start().len();
        }
        names.push(name);
        index = close + 1;
    }
    body.push_str(&template[copied..]);
    Ok(Taken {
        body,
        hoisted,
        names,
    })
}

/// The first `template` call (its first 60 characters) in `texts` that names no template the
/// field defines (`<field>.<name>` after the renaming).
fn foreign_call(field: &str, names: &[String], texts: [&String; 2]) -> Option<String> {
    let mut foreign = None;
    for text in texts {
        transform_actions(text, |action| {
            let trimmed = action.trim_start_matches('-').trim();
            if let Some(rest) = trimmed.strip_prefix("template")
                && rest.starts_with(char::is_whitespace)
            {
                let called = rest.trim_start();
                let name = called.strip_prefix('"').and_then(|r| r.split('"').next());
                let own = name.is_some_and(|n| {
                    n.strip_prefix(&format!("{field}."))
                        .is_some_and(|bare| names.iter().any(|m| m == bare))
                });
                if !own && foreign.is_none() {
                    foreign = Some(called.chars().take(60).collect::<String>());
                }
            }
            action.to_string()
        });
    }
    foreign
}

/// Renders `templates` (Go templates) once per parameter set, with helm's template engine.
/// Returns, per parameter set, the rendered string for each template.
pub fn go_render_batch(
    helm: &Tool,
    work: &Path,
    templates: &[String],
    param_sets: &[Params],
    missing_key_error: bool,
) -> Result<Vec<Vec<String>>, String> {
    if templates.is_empty() || param_sets.is_empty() {
        return Ok(vec![Vec::new(); param_sets.len()]);
    }
    if missing_key_error {
        for template in templates {
            for (index, params) in param_sets.iter().enumerate() {
                if let Some(key) = first_missing_key(template, params) {
                    return Err(format!(
                        "template {template:?}: map has no entry for key {key:?} (missingkey=error), for {}",
                        describe_params(params, index)
                    ));
                }
            }
        }
    }
    for template in templates {
        for (function, why) in NOT_IN_ARGO_CD {
            if mentions_function(template, function) {
                return Err(format!(
                    "template {template:?}: `{function}` is not a function of Argo CD's goTemplate ({why})"
                ));
            }
        }
        if mentions_function(template, "slugify") {
            return Err(format!(
                "template {template:?}: the Argo CD function `slugify` is not supported by the gate yet"
            ));
        }
    }
    let chart = work.join("gotemplate");
    let templates_dir = chart.join("templates");
    let io = |e: std::io::Error| {
        format!(
            "could not write the template chart in {}: {e}",
            chart.display()
        )
    };
    std::fs::create_dir_all(&templates_dir).map_err(io)?;
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: gotemplate\nversion: 0.0.0\n",
    )
    .map_err(io)?;
    let mut defines = String::from(
        "{{ define \"argocd.normalize\" }}{{ regexReplaceAll \"[^-a-z0-9.]\" (. | toString | lower) \"-\" | trunc 253 | trimAll \"-.\" }}{{ end }}\n",
    );
    let mut names = Vec::new();
    for (index, template) in templates.iter().enumerate() {
        let name = format!("s{index}");
        let (body, hoisted) = hoist_defines(template, &name)?;
        defines.push_str(&rewrite_function(
            &hoisted,
            "normalize",
            "include \"argocd.normalize\"",
        ));
        defines.push_str(&format!(
            "{{{{ define \"{name}\" }}}}{}{{{{ end }}}}\n",
            rewrite_function(&body, "normalize", "include \"argocd.normalize\"")
        ));
        names.push(name);
    }
    std::fs::write(templates_dir.join("_strings.tpl"), defines).map_err(io)?;
    let driver = format!(
        "{{{{- $results := list -}}}}\n{{{{- range $p := .Values.params -}}}}\n{{{{- $row := list -}}}}\n{{{{- range $name := $.Values.names -}}}}\n{{{{- $row = append $row (include $name $p | replace \"<no value>\" \"{NO_VALUE_MARK}\") -}}}}\n{{{{- end -}}}}\n{{{{- $results = append $results $row -}}}}\n{{{{- end -}}}}\n{{{{ toJson (dict \"results\" $results) }}}}\n"
    );
    std::fs::write(templates_dir.join("out.yaml"), driver).map_err(io)?;
    let values = serde_json::json!({ "params": param_sets, "names": names });
    let values_path = work.join("gotemplate-values.json");
    std::fs::write(&values_path, values.to_string()).map_err(io)?;

    let output = helm
        .run(
            helm.confined(&work.join("helm-home"))
                .arg("template")
                .arg("gotemplate")
                .arg(&chart)
                .arg("--values")
                .arg(&values_path),
        )
        .map_err(|e| format!("go template: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(explain_go_error(stderr.trim(), templates));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json_line = stdout
        .lines()
        .find(|l| l.starts_with("{\"results\""))
        .ok_or_else(|| format!("helm printed no template results: {}", stdout.trim()))?;
    let parsed: Value =
        serde_json::from_str(json_line).map_err(|e| format!("template results: {e}"))?;
    let rows = parsed["results"].as_array().cloned().unwrap_or_default();
    Ok(rows
        .into_iter()
        .map(|row| {
            row.as_array()
                .map(|cells| {
                    cells
                        .iter()
                        .map(|c| {
                            c.as_str()
                                .unwrap_or("")
                                .replace(NO_VALUE_MARK, "<no value>")
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect())
}

fn explain_go_error(stderr: &str, templates: &[String]) -> String {
    let line = stderr
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("Error"))
        .unwrap_or(stderr);
    // helm names our wrapper templates `s<N>`; show the ApplicationSet's own text instead.
    for (index, template) in templates.iter().enumerate() {
        if line.contains(&format!("\"s{index}\"")) {
            let detail = line.rsplit(": ").next().unwrap_or(line);
            let at = line.find("at <").map(|i| {
                let rest = &line[i + 3..];
                rest[..rest.find('>').map(|e| e + 1).unwrap_or(rest.len())].to_string()
            });
            return match at {
                Some(at) => format!("template {template:?}: at {at}: {detail}"),
                None => format!("template {template:?}: {detail}"),
            };
        }
    }
    let line = line.trim_start_matches("Error: ");
    let line = line.split("_strings.tpl:").last().unwrap_or(line);
    format!("go template: {line}")
}

/// Rewrites a bare function name inside template actions (outside string literals).
fn rewrite_function(template: &str, function: &str, replacement: &str) -> String {
    transform_actions(template, |action| {
        let mut out = String::new();
        let mut chars = action.char_indices().peekable();
        let bytes = action.as_bytes();
        let mut in_string: Option<char> = None;
        while let Some((i, c)) = chars.next() {
            if let Some(q) = in_string {
                out.push(c);
                if c == '\\' && q != '`' {
                    if let Some((_, n)) = chars.next() {
                        out.push(n);
                    }
                } else if c == q {
                    in_string = None;
                }
                continue;
            }
            // Go's quoted strings, raw strings and rune constants (`'"'`).
            if c == '"' || c == '`' || c == '\'' {
                in_string = Some(c);
                out.push(c);
                continue;
            }
            let word_start = i == 0
                || !is_ident(bytes[i - 1] as char) && bytes[i - 1] != b'.' && bytes[i - 1] != b'$';
            if word_start && action[i..].starts_with(function) {
                let end = i + function.len();
                if end == action.len() || !is_ident(bytes[end] as char) {
                    out.push_str(replacement);
                    for _ in 1..function.len() {
                        chars.next();
                    }
                    continue;
                }
            }
            out.push(c);
        }
        out
    })
}

fn mentions_function(template: &str, function: &str) -> bool {
    rewrite_function(template, function, "\u{1}") != template
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Where an action's text ends: the first `}}` outside a quoted string, raw string, rune
/// constant or comment (Go's lexer ends an action there, not at a `}}` inside a string).
fn action_end(action: &str) -> Option<usize> {
    let bytes = action.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'"' | b'\'' | b'`') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    if bytes[i] == b'\\' && quote != b'`' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = action[i + 2..].find("*/").map(|e| i + 2 + e + 2)?;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn transform_actions(template: &str, mut f: impl FnMut(&str) -> String) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start + 2]);
        let after = &rest[start + 2..];
        let Some(end) = action_end(after) else {
            out.push_str(after);
            return out;
        };
        out.push_str(&f(&after[..end]));
        out.push_str("}}");
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The first field reference (`.a.b`, `$.a.b`) at the top level of a Go template that does
/// not resolve in `params`. References inside `range`/`with` blocks, where the dot moves, are
/// not checked.
pub fn first_missing_key(template: &str, params: &Params) -> Option<String> {
    // One entry per open block: true when the block moves the dot (`range`, `with`, `define`).
    let mut blocks: Vec<bool> = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after.find("}}")?;
        let action = after[..end].trim_matches(|c: char| c == '-' || c.is_whitespace());
        rest = &after[end + 2..];
        if action.starts_with("/*") {
            continue;
        }
        let first_word = action.split_whitespace().next().unwrap_or("");
        let dot_moved = blocks.iter().any(|moves| *moves);
        match first_word {
            "end" => {
                blocks.pop();
                continue;
            }
            "range" | "with" | "define" | "block" => {
                if !dot_moved
                    && matches!(first_word, "range" | "with")
                    && let Some(missing) = missing_in_action(&action[first_word.len()..], params)
                {
                    return Some(missing);
                }
                blocks.push(true);
                continue;
            }
            "if" => blocks.push(false),
            _ => {}
        }
        if !dot_moved && let Some(missing) = missing_in_action(action, params) {
            return Some(missing);
        }
    }
    None
}

fn missing_in_action(action: &str, params: &Params) -> Option<String> {
    let bytes = action.as_bytes();
    let mut i = 0;
    let mut in_string: Option<u8> = None;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = in_string {
            if c == b'\\' && q == b'"' {
                i += 2;
                continue;
            }
            if c == q {
                in_string = None;
            }
            i += 1;
            continue;
        }
        if c == b'"' || c == b'`' {
            in_string = Some(c);
            i += 1;
            continue;
        }
        let starts_chain = c == b'.'
            && (i == 0 || matches!(bytes[i - 1], b' ' | b'(' | b'|' | b'\t' | b'$'))
            && bytes
                .get(i + 1)
                .is_some_and(|n| n.is_ascii_alphabetic() || *n == b'_');
        let after_variable =
            i > 0 && bytes[i - 1] == b'$' && (i < 2 || !is_ident(bytes[i - 2] as char));
        if starts_chain && (i == 0 || bytes[i - 1] != b'$' || after_variable) {
            let mut j = i;
            while j < bytes.len() && (is_ident(bytes[j] as char) || bytes[j] == b'.') {
                j += 1;
            }
            let chain = &action[i + 1..j];
            let mut current: Option<&Value> = None;
            for (n, key) in chain.split('.').filter(|k| !k.is_empty()).enumerate() {
                let next = if n == 0 {
                    params.get(key)
                } else {
                    match current {
                        Some(Value::Object(m)) => m.get(key),
                        // Field access on a non-map is a different Go error; helm reports it.
                        _ => break,
                    }
                };
                match next {
                    Some(v) => current = Some(v),
                    None => return Some(key.to_string()),
                }
            }
            i = j;
            continue;
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests;
