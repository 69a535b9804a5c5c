//! The HTML report (`gate check --html`, `gate publish --html`): one self-contained page
//! beside the comment, for a change whose diff outgrows it. The verdict, every finding with
//! its evidence, per distinct change a collapsed diff of every changed object (coloured on
//! the server), a filter by cluster, Application, kind and rule, and links to the
//! repository's files.
//!
//! Every string a chart or a pull request chose reaches the page through `maud`, which
//! escapes each interpolated value as text (`&`, `<`, `>`, `"`) unless it is explicitly
//! marked pre-escaped; nothing here marks a chart's string so. Attributes are always
//! double-quoted. Invisible characters are shown (`\u{202E}`) as in the Markdown. The page
//! loads nothing (`default-src 'none'`), and its one inline script runs by its hash, so even
//! markup that slipped through could neither run a script nor fetch anything.
//!
//! The filter never meets a chart's string: each distinct cluster, Application, kind and rule
//! is a number (its place in the filter's list), the list shows the value, and an element
//! names its values by number (`data-cluster="0 3"`), so no value (a line break, a space, a
//! quote) can split or merge another. A blocking finding is never hidden by the filter (it is
//! why the gate is red), and a finding that names no value of a facet (no cluster: a file of
//! the repository) is not hidden by a choice of that facet: the filter hides only what names
//! other values.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde_json::Value;

use super::diff::{AppDiff, AppStatus, FieldChange, ObjectsDiff};
use super::report::visible;
use super::rules::{Finding, Severity};
use super::verdict::{GateResult, Outcome};
use crate::forge::ForgeKind;

/// Where the page links a repository file: the repository's URL as Applications write it,
/// and which forge serves its web pages (guessed from the host when not known).
#[derive(Debug, Clone, Default)]
pub struct Links {
    pub repo_url: Option<String>,
    pub forge: Option<ForgeKind>,
}

/// The most characters one value shows in a diff line (a values blob can be megabytes).
const VALUE_CHARS: usize = 4_000;

/// The inline script: the filter (collapse is `<details>`, no script). Constant text: no
/// value from the result is ever written into it.
///
/// An element's facets are option numbers separated by spaces; an element without a
/// facet's attribute names none of it (the filter leaves it be); `data-pinned` (a blocking
/// finding) is always shown. `#cluster=2&rule=0` in the page's address selects on load (a
/// link to a filtered view).
const SCRIPT: &str = r#"
(function () {
  var selects = document.querySelectorAll('select[data-filter]');
  function apply() {
    var want = {};
    selects.forEach(function (s) { want[s.getAttribute('data-filter')] = s.value; });
    var shown = 0, all = 0;
    document.querySelectorAll('[data-facets]').forEach(function (el) {
      var show = true;
      if (!el.hasAttribute('data-pinned')) {
        Object.keys(want).forEach(function (k) {
          if (!want[k]) return;
          var have = el.getAttribute('data-' + k);
          if (have === null) return;
          if (have.split(' ').indexOf(want[k]) < 0) show = false;
        });
      }
      el.hidden = !show;
      all += 1;
      if (show) shown += 1;
    });
    var status = document.getElementById('filter-status');
    if (status) status.textContent = shown + ' of ' + all + ' shown';
  }
  var preset = {};
  location.hash.replace(/^#/, '').split('&').forEach(function (pair) {
    var at = pair.indexOf('=');
    if (at > 0) preset[pair.slice(0, at)] = pair.slice(at + 1);
  });
  selects.forEach(function (s) {
    var k = s.getAttribute('data-filter');
    if (Object.prototype.hasOwnProperty.call(preset, k)) s.value = preset[k];
    s.addEventListener('change', apply);
  });
  apply();
})();
"#;

const STYLE: &str = r#"
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 72em; padding: 0 1em; color: #1f2328; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h1.green { color: #1a7f37; } h1.blocked { color: #cf222e; } h1.undecided { color: #9a6700; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
pre { background: #f6f8fa; padding: .6em .8em; overflow-x: auto; margin: .3em 0; white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #d0d7de; padding: .25em .6em; text-align: left; vertical-align: top; }
details { border: 1px solid #d0d7de; border-radius: 6px; padding: .3em .7em; margin: .4em 0; }
details > summary { cursor: pointer; }
.sev-blocking { color: #cf222e; font-weight: 600; } .sev-note { color: #57606a; font-weight: 600; }
.status { color: #57606a; }
#filters { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #d0d7de; }
#filters label { margin-right: 1em; }
.diff .add { background: #dafbe1; display: block; } .diff .del { background: #ffebe9; display: block; }
.diff .ctx { display: block; color: #57606a; }
.k { color: #0550ae; } .s { color: #0a3069; } .n { color: #953800; } .b { color: #8250df; } .z { color: #6e7781; } .j { color: #24292f; }
.cut { color: #9a6700; font-style: italic; }
"#;

/// The page's Content-Security-Policy: nothing loaded, inline style, the one script by hash.
fn content_security_policy() -> String {
    use base64::Engine as _;
    use sha2::{Digest as _, Sha256};
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(SCRIPT.as_bytes()));
    format!(
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{hash}'; base-uri 'none'; form-action 'none'"
    )
}

/// Text a chart or a pull request chose, invisible characters shown; maud escapes it.
fn t(s: &str) -> String {
    visible(s).into_owned()
}

/// A facet value as the filter's list shows it: on one line, control characters (a line
/// break, a tab, NUL) shown as `\u{000A}` beside the invisible ones.
fn one_line(s: &str) -> String {
    visible(s)
        .chars()
        .map(|c| {
            if c.is_control() {
                format!("\\u{{{:04X}}}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A commit as the page names it: its first 12 digits when it is a commit id, else (a
/// revision that did not resolve, a verdict from elsewhere) the text, at most 40
/// characters, as a chart's text is shown.
fn short_commit(commit: &str) -> String {
    if crate::git::is_commit_id(commit) {
        commit[..12].to_string()
    } else {
        one_line(&commit.chars().take(40).collect::<String>())
    }
}

/// What a filter can select: a page element's clusters, Applications, kinds and rules.
#[derive(Default)]
struct Facets {
    cluster: BTreeSet<String>,
    application: BTreeSet<String>,
    kind: BTreeSet<String>,
    rule: BTreeSet<String>,
}

/// Each facet's values in the filter's lists, by name -> their number there.
struct Numbers([HashMap<String, usize>; 4]);

impl Numbers {
    fn of(options: &[BTreeSet<String>; 4]) -> Numbers {
        Numbers(options.each_ref().map(|values| {
            values
                .iter()
                .enumerate()
                .map(|(number, value)| (value.clone(), number))
                .collect()
        }))
    }

    /// A set of one facet (0 cluster, 1 Application, 2 kind, 3 rule) as the numbers of its
    /// values, separated by spaces.
    fn encode(&self, facet: usize, set: &BTreeSet<String>) -> String {
        set.iter()
            .filter_map(|value| self.0[facet].get(value))
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// For a finding: None (no attribute: the filter does not hide it for this facet) when
    /// it names no value.
    fn encode_named(&self, facet: usize, set: &BTreeSet<String>) -> Option<String> {
        (!set.is_empty()).then(|| self.encode(facet, set))
    }
}

/// An Application as findings name it: `ns/name on cluster`, or a bare name.
fn split_application(text: &str) -> (String, Option<String>) {
    let (app, cluster) = match text.rsplit_once(" on ") {
        Some((app, cluster)) => (app, Some(cluster.to_string())),
        None => (text, None),
    };
    let name = app.rsplit_once('/').map_or(app, |(_, name)| name);
    (name.to_string(), cluster)
}

/// The facets a finding's evidence names (any shape: the keys are what the rules write).
fn finding_facets(finding: &Finding) -> Facets {
    fn walk(value: &Value, facets: &mut Facets, paths: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    let strings: Vec<&str> = match value {
                        Value::String(s) => vec![s.as_str()],
                        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
                        _ => vec![],
                    };
                    match key.as_str() {
                        "cluster" | "clusters" => {
                            facets.cluster.extend(strings.iter().map(|s| s.to_string()))
                        }
                        "application" | "applications" => {
                            for s in strings {
                                let (name, cluster) = split_application(s);
                                facets.application.insert(name);
                                facets.cluster.extend(cluster);
                            }
                        }
                        "kind" => facets.kind.extend(strings.iter().map(|s| s.to_string())),
                        "path" | "file" | "files" => {
                            paths.extend(strings.iter().map(|s| s.to_string()))
                        }
                        _ => {}
                    }
                    walk(value, facets, paths);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, facets, paths)),
            _ => {}
        }
    }
    let mut facets = Facets::default();
    facets.rule.insert(finding.rule.clone());
    walk(&finding.evidence, &mut facets, &mut Vec::new());
    facets
}

/// The repository files a finding's evidence names (`path`, `file`, `files`).
fn finding_paths(finding: &Finding) -> BTreeSet<String> {
    fn walk(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    if matches!(key.as_str(), "path" | "file" | "files") {
                        match value {
                            Value::String(s) => {
                                out.insert(s.clone());
                            }
                            Value::Array(items) => out
                                .extend(items.iter().filter_map(Value::as_str).map(str::to_string)),
                            _ => {}
                        }
                    }
                    walk(value, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(&finding.evidence, &mut out);
    out
}

/// The web address of a repository file at a commit, when the repository's URL is a forge's
/// web address (`https://host/owner/name`, the `.git` dropped): GitHub's `/blob/<sha>/path`,
/// GitLab's `/-/blob/<sha>/path`, Gitea's `/src/commit/<sha>/path`. None for any other URL
/// (ssh, a scheme other than https, credentials, a query) and for a path that is not a plain
/// relative repository path: the page shows the path as text then.
pub fn blob_url(links: &Links, head: &str, path: &str) -> Option<String> {
    let url = links.repo_url.as_deref()?;
    let rest = url.strip_prefix("https://")?;
    let rest = rest.trim_end_matches('/');
    let rest = rest.strip_suffix(".git").unwrap_or(rest);
    let (host, repo_path) = rest.split_once('/')?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    let segments: Vec<&str> = repo_path.split('/').collect();
    let segment_ok = |s: &&str| {
        !s.is_empty()
            && *s != "."
            && *s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    if !host_ok || segments.len() < 2 || !segments.iter().all(segment_ok) {
        return None;
    }
    if !crate::git::is_commit_id(head) {
        return None;
    }
    let normal = crate::paths::normalize(path);
    if normal.is_empty() || crate::paths::escapes_root(path) || path.starts_with('/') {
        return None;
    }
    let forge = links.forge.or_else(|| {
        let host = host.to_ascii_lowercase();
        if host == "github.com" {
            Some(ForgeKind::Github)
        } else if host == "gitlab.com" || host.starts_with("gitlab.") {
            Some(ForgeKind::Gitlab)
        } else if host == "codeberg.org" || host.starts_with("gitea.") {
            Some(ForgeKind::Gitea)
        } else {
            None
        }
    })?;
    let encoded: Vec<String> = normal
        .split('/')
        .map(|s| percent_encoding::utf8_percent_encode(s, PATH_SEGMENT).to_string())
        .collect();
    let middle = match forge {
        ForgeKind::Github => "blob",
        ForgeKind::Gitlab => "-/blob",
        ForgeKind::Gitea => "src/commit",
    };
    Some(format!(
        "https://{host}/{}/{middle}/{head}/{}",
        segments.join("/"),
        encoded.join("/")
    ))
}

/// What a path segment in a link keeps as is: letters, digits, `-._~`.
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A repository path: a link when the repository is on a forge's web, else the text.
fn path_link(links: &Links, head: &str, path: &str) -> Markup {
    match blob_url(links, head, path) {
        Some(href) => html! { a href=(href) { code { (t(path)) } } },
        None => html! { code { (t(path)) } },
    }
}

/// One value, coloured by its JSON type, clipped.
fn value_markup(value: &Value) -> Markup {
    let (class, text) = match value {
        Value::String(s) => ("s", s.clone()),
        Value::Number(n) => ("n", n.to_string()),
        Value::Bool(b) => ("b", b.to_string()),
        Value::Null => ("z", "null".to_string()),
        other => ("j", serde_json::to_string(other).unwrap_or_default()),
    };
    let count = text.chars().count();
    let shown: String = text.chars().take(VALUE_CHARS).collect();
    html! {
        span class=(class) { (t(&shown)) }
        @if count > VALUE_CHARS {
            span class="cut" { " … (" (count - VALUE_CHARS) " more characters: see --json)" }
        }
    }
}

/// A field change as unified-diff lines: `- path: old`, `+ path: new`.
fn field_lines(field: &FieldChange) -> Markup {
    html! {
        @if let Some(old) = &field.old {
            span class="del" { "- " span class="k" { (t(&field.path)) } ": " (value_markup(old)) }
        }
        @if let Some(new) = &field.new {
            span class="add" { "+ " span class="k" { (t(&field.path)) } ": " (value_markup(new)) }
        }
    }
}

/// The objects of one shared diff: added and removed as lines, each changed object a
/// collapsed `<details>` holding its field diff.
fn objects_markup(diff: &ObjectsDiff) -> Markup {
    html! {
        @if !diff.added.is_empty() || !diff.removed.is_empty() {
            pre class="diff" {
                @for object in &diff.added {
                    span class="add" { "+ added " (t(&object.to_string())) }
                }
                @for object in &diff.removed {
                    span class="del" { "- removed " (t(&object.to_string())) }
                }
            }
        }
        @for change in &diff.changed {
            details class="object" data-kind=(t(&change.object.kind)) {
                summary {
                    "changed " code { (t(&change.object.to_string())) }
                    " (" (change.fields.len()) " field" (crate::plural(change.fields.len())) ")"
                }
                @if let Some(crd) = &change.crd {
                    p {
                        "CustomResourceDefinition versions: "
                        (crd.before.iter().map(|v| t(&v.name)).collect::<Vec<_>>().join(", "))
                        " → "
                        (crd.after.iter().map(|v| t(&v.name)).collect::<Vec<_>>().join(", "))
                        "; schema fields " (crd.schema_fields_added) " added, "
                        (crd.schema_fields_removed) " removed, "
                        (crd.schema_fields_changed) " changed"
                    }
                }
                pre class="diff" {
                    @for field in change.fields.iter() { (field_lines(field)) }
                }
            }
        }
    }
}

/// One Application's own changes (chart moves, the Application's fields) and its objects,
/// the objects' markup made once per shared diff.
fn app_body(app: &AppDiff, memo: &mut HashMap<*const ObjectsDiff, String>) -> String {
    let mut objects = |diff: &Arc<ObjectsDiff>| -> String {
        memo.entry(Arc::as_ptr(diff))
            .or_insert_with(|| objects_markup(diff).into_string())
            .clone()
    };
    let chart_only = app.chart_only.as_ref().map(&mut objects);
    let all = objects(&app.objects);
    html! {
        @for chart_move in &app.chart_moves {
            p { "chart " code { (t(&chart_move.chart)) } " " code { (t(&chart_move.from)) }
                " → " code { (t(&chart_move.to)) } " from " code { (t(&chart_move.repo_url)) } }
        }
        @if !app.application_fields.is_empty() {
            details class="object" data-kind="Application" {
                summary { "the Application itself (" (app.application_fields.len()) " field"
                    (crate::plural(app.application_fields.len())) ")" }
                pre class="diff" { @for field in &app.application_fields { (field_lines(field)) } }
            }
        }
        @if let Some(chart_only) = chart_only {
            p { "The chart's own change (this change's values at both versions):" }
            (PreEscaped(chart_only))
            p { "Everything this change deploys differently:" }
        }
        (PreEscaped(all))
    }
    .into_string()
}

fn status_word(status: AppStatus) -> &'static str {
    match status {
        AppStatus::Added => "added",
        AppStatus::Removed => "removed",
        AppStatus::Changed => "changed",
    }
}

/// Applications whose changes read the same, shown once with where they apply.
struct Group<'a> {
    status: &'static str,
    body: String,
    apps: Vec<&'a AppDiff>,
}

fn groups(result: &GateResult) -> Vec<Group<'_>> {
    let mut memo = HashMap::new();
    let mut out: Vec<Group<'_>> = Vec::new();
    let mut index: HashMap<(&'static str, String), usize> = HashMap::new();
    for app in &result.diff.applications {
        let status = status_word(app.status);
        let body = app_body(app, &mut memo);
        match index.get(&(status, body.clone())) {
            Some(&at) => out[at].apps.push(app),
            None => {
                index.insert((status, body.clone()), out.len());
                out.push(Group {
                    status,
                    body,
                    apps: vec![app],
                });
            }
        }
    }
    out
}

fn outcome_words(outcome: Outcome) -> (&'static str, &'static str) {
    match outcome {
        Outcome::Green => ("passed", "green"),
        Outcome::Blocked => ("blocked", "blocked"),
        Outcome::Undecided => ("could not decide", "undecided"),
    }
}

/// Evidence as indented JSON, keys and values coloured, paths linked.
fn evidence_markup(value: &Value, links: &Links, head: &str) -> Markup {
    fn walk(value: &Value, depth: usize, key: Option<&str>, out: &mut String, ctx: (&Links, &str)) {
        let pad = "  ".repeat(depth);
        match value {
            Value::Object(map) if !map.is_empty() => {
                out.push_str("{\n");
                let last = map.len() - 1;
                for (i, (k, v)) in map.iter().enumerate() {
                    out.push_str(&pad);
                    out.push_str("  ");
                    let _ = write!(
                        out,
                        "{}: ",
                        html! { span class="k" { (t(&serde_json::to_string(k).unwrap_or_default())) } }
                            .into_string()
                    );
                    walk(v, depth + 1, Some(k), out, ctx);
                    out.push_str(if i == last { "\n" } else { ",\n" });
                }
                out.push_str(&pad);
                out.push('}');
            }
            Value::Array(items) if !items.is_empty() => {
                out.push_str("[\n");
                let last = items.len() - 1;
                for (i, v) in items.iter().enumerate() {
                    out.push_str(&pad);
                    out.push_str("  ");
                    walk(v, depth + 1, key, out, ctx);
                    out.push_str(if i == last { "\n" } else { ",\n" });
                }
                out.push_str(&pad);
                out.push(']');
            }
            Value::String(s) if matches!(key, Some("path" | "file" | "files")) => {
                out.push_str(&path_link(ctx.0, ctx.1, s).into_string());
            }
            other => {
                let text = match other {
                    Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
                    other => other.to_string(),
                };
                let class = match other {
                    Value::String(_) => "s",
                    Value::Number(_) => "n",
                    Value::Bool(_) => "b",
                    Value::Null => "z",
                    _ => "j",
                };
                out.push_str(&html! { span class=(class) { (t(&text)) } }.into_string());
            }
        }
    }
    let mut out = String::new();
    walk(value, 0, None, &mut out, (links, head));
    // Every piece above went through maud (escaped), or is constant punctuation.
    PreEscaped(out)
}

/// The page: the verdict, the filter, the findings and the changes.
pub fn render(result: &GateResult, links: &Links) -> String {
    let (outcome, class) = outcome_words(result.verdict.outcome);
    let groups = groups(result);
    let finding_facets: Vec<Facets> = result.findings.iter().map(finding_facets).collect();
    let group_facets = group_facets(&groups, &result.findings, &finding_facets);
    let options = filter_options(finding_facets.iter().chain(&group_facets));
    let numbers = Numbers::of(&options);
    let blocking = result
        .findings
        .iter()
        .any(|f| f.severity == Severity::Blocking);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy" content=(content_security_policy());
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { "addons-gate: " (outcome) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                (page_header(result, outcome, class))
                (filters(&options, blocking))
                (findings_section(result, &finding_facets, &numbers, links))
                (changes_section(result, &groups, &group_facets, &numbers))
                @if let Some(confinement) = result.confinement {
                    footer { p { em { (confinement.footer()) } } }
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
    .into_string()
}

/// Each group's facets: its Applications' clusters, names and object kinds, and the rules of
/// the findings naming one of its Applications.
fn group_facets(
    groups: &[Group<'_>],
    findings: &[Finding],
    finding_facets: &[Facets],
) -> Vec<Facets> {
    let mut rules_by_app: HashMap<&str, BTreeSet<String>> = HashMap::new();
    for (finding, facets) in findings.iter().zip(finding_facets) {
        for app in &facets.application {
            rules_by_app
                .entry(app.as_str())
                .or_default()
                .insert(finding.rule.clone());
        }
    }
    groups
        .iter()
        .map(|g| {
            let mut facets = Facets::default();
            for app in &g.apps {
                facets.cluster.insert(app.app.cluster.clone());
                facets.application.insert(app.app.name.clone());
                if let Some(rules) = rules_by_app.get(app.app.name.as_str()) {
                    facets.rule.extend(rules.iter().cloned());
                }
                for object in app
                    .objects
                    .added
                    .iter()
                    .chain(&app.objects.removed)
                    .chain(app.objects.changed.iter().map(|c| &c.object))
                {
                    facets.kind.insert(object.kind.clone());
                }
                if !app.application_fields.is_empty() {
                    facets.kind.insert("Application".to_string());
                }
            }
            facets
        })
        .collect()
}

/// The filter's lists (cluster, Application, kind, rule): every value any element names.
fn filter_options<'a>(all: impl Iterator<Item = &'a Facets>) -> [BTreeSet<String>; 4] {
    let mut options: [BTreeSet<String>; 4] = Default::default();
    for facets in all {
        options[0].extend(facets.cluster.iter().cloned());
        options[1].extend(facets.application.iter().cloned());
        options[2].extend(facets.kind.iter().cloned());
        options[3].extend(facets.rule.iter().cloned());
    }
    options
}

/// The verdict: outcome, commits, counts, and why the gate could not decide.
fn page_header(result: &GateResult, outcome: &str, class: &str) -> Markup {
    let v = &result.verdict;
    let counts = &v.counts;
    let per_rule = |label: &str, counts: &BTreeMap<String, usize>| -> Markup {
        html! {
            @if !counts.is_empty() {
                tr { th { (label) } td { @for (rule, n) in counts { code { (t(rule)) } " " (n) br; } } }
            }
        }
    };
    html! {
        header {
            h1 id="outcome" class=(class) { "addons-gate: " (outcome) }
            p {
                code { (short_commit(&v.base)) } " (merge base) → " code { (short_commit(&v.head)) } " (head)"
            }
            table id="counts" {
                tr { th { "Applications" } td {
                    span id="applications-changed" { (counts.applications_changed) } " changed, "
                    span id="applications-added" { (counts.applications_added) } " added, "
                    span id="applications-removed" { (counts.applications_removed) } " removed"
                } }
                tr { th { "objects" } td {
                    span id="objects-added" { (counts.objects_added) } " added, "
                    span id="objects-changed" { (counts.objects_changed) } " changed, "
                    span id="objects-removed" { (counts.objects_removed) } " removed"
                } }
                (per_rule("blocking", &v.blocking))
                (per_rule("notes", &v.notes))
            }
            @if !v.errors.is_empty() {
                h2 { "Why the gate could not decide" }
                ul id="errors" { @for error in &v.errors { li { pre { (t(error)) } } } }
            }
        }
    }
}

/// The filter: one list per facet, each value by its number.
fn filters(options: &[BTreeSet<String>; 4], blocking: bool) -> Markup {
    html! {
        nav id="filters" {
            @for (name, label, values) in [
                ("cluster", "cluster", &options[0]),
                ("application", "Application", &options[1]),
                ("kind", "kind", &options[2]),
                ("rule", "rule", &options[3]),
            ] {
                label {
                    (label) " "
                    select data-filter=(name) {
                        option value="" { "all" }
                        @for (number, value) in values.iter().enumerate() {
                            option value=(number) { (one_line(value)) }
                        }
                    }
                }
            }
            span id="filter-status" {}
            @if blocking {
                " " span class="status" { "(blocking findings are always shown)" }
            }
        }
    }
}

/// Every finding with its evidence (a blocking one open and pinned).
fn findings_section(
    result: &GateResult,
    finding_facets: &[Facets],
    numbers: &Numbers,
    links: &Links,
) -> Markup {
    let head = &result.verdict.head;
    html! {
        section id="findings" {
            h2 { "Findings (" (result.findings.len()) ")" }
            @if result.findings.is_empty() { p { "No findings." } }
            @for (finding, facets) in result.findings.iter().zip(finding_facets) {
                @let severity = match finding.severity { Severity::Blocking => "blocking", Severity::Note => "note" };
                details class={ "finding " (severity) } open[finding.severity == Severity::Blocking]
                    data-facets="" data-pinned=[(finding.severity == Severity::Blocking).then_some("")]
                    data-cluster=[numbers.encode_named(0, &facets.cluster)]
                    data-application=[numbers.encode_named(1, &facets.application)]
                    data-kind=[numbers.encode_named(2, &facets.kind)]
                    data-rule=[numbers.encode_named(3, &facets.rule)] {
                    summary {
                        span class={ "sev-" (severity) } { (severity) } " "
                        code class="rule" { (t(&finding.rule)) } ": "
                        span class="summary" { (t(&finding.summary)) }
                    }
                    @let paths = finding_paths(finding);
                    @if !paths.is_empty() {
                        p { "Files: " @for path in &paths { (path_link(links, head, path)) " " } }
                    }
                    pre class="evidence" { (evidence_markup(&finding.evidence, links, head)) }
                }
            }
        }
    }
}

/// What the change deploys: each group of Applications whose changes read the same, once.
fn changes_section(
    result: &GateResult,
    groups: &[Group<'_>],
    group_facets: &[Facets],
    numbers: &Numbers,
) -> Markup {
    html! {
        section id="changes" {
            h2 { "What this change deploys (" (result.diff.applications.len()) " Applications)" }
            @if result.verdict.outcome != Outcome::Undecided && result.diff.applications.is_empty() {
                p { "The render is identical at both commits." }
            }
            @for (group, facets) in groups.iter().zip(group_facets) {
                section class="application" data-facets=""
                    data-cluster=(numbers.encode(0, &facets.cluster))
                    data-application=(numbers.encode(1, &facets.application))
                    data-kind=(numbers.encode(2, &facets.kind))
                    data-rule=(numbers.encode(3, &facets.rule)) {
                    h3 {
                        @if group.apps.len() == 1 {
                            (t(&group.apps[0].app.to_string()))
                        } @else {
                            (group.apps.len()) " Applications"
                        }
                        " " span class="status" { "(" (group.status) ")" }
                    }
                    @if group.apps.len() > 1 {
                        details class="where" {
                            summary { "where: " (group.apps.len()) " Applications" }
                            ul { @for app in &group.apps { li { (t(&app.app.to_string())) } } }
                        }
                    }
                    (PreEscaped(&group.body))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(url: &str) -> Links {
        Links {
            repo_url: Some(url.to_string()),
            forge: None,
        }
    }

    const HEAD: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn a_forge_web_url_links_the_file_at_the_head() {
        assert_eq!(
            blob_url(
                &links("https://github.com/org/gitops.git"),
                HEAD,
                "apps/a b.yaml"
            )
            .as_deref(),
            Some(
                "https://github.com/org/gitops/blob/0123456789abcdef0123456789abcdef01234567/apps/a%20b.yaml"
            )
        );
        assert_eq!(
            blob_url(
                &links("https://gitlab.com/group/sub/gitops"),
                HEAD,
                "x.yaml"
            )
            .as_deref(),
            Some(
                "https://gitlab.com/group/sub/gitops/-/blob/0123456789abcdef0123456789abcdef01234567/x.yaml"
            )
        );
    }

    #[test]
    fn anything_but_a_plain_https_forge_url_and_path_is_not_linked() {
        for url in [
            "javascript:alert(1)//github.com/a/b",
            "http://github.com/a/b",
            "git@github.com:a/b.git",
            "https://user:pw@github.com/a/b",
            "https://github.com/a/b?x=1",
            "https://github.com/a\"onmouseover=x/b",
            "https://git.example.test/platform/gitops.git",
        ] {
            assert_eq!(blob_url(&links(url), HEAD, "x.yaml"), None, "{url}");
        }
        for path in ["../x", "/etc/passwd", ""] {
            assert_eq!(
                blob_url(&links("https://github.com/a/b"), HEAD, path),
                None,
                "{path}"
            );
        }
        assert_eq!(
            blob_url(&links("https://github.com/a/b"), "HEAD", "x.yaml"),
            None
        );
    }

    #[test]
    fn a_commit_is_shortened_only_when_it_is_a_commit_id() {
        assert_eq!(short_commit(HEAD), "0123456789ab");
        // Not a commit id: as given, never sliced inside a character.
        for text in ["", "HEAD", "aaaaaaaaaaa€€", "brånch-€€€€-no-such"] {
            assert_eq!(short_commit(text), text);
        }
        assert_eq!(short_commit(&"é".repeat(50)), "é".repeat(40));
        assert_eq!(short_commit("a\nb\u{202E}"), "a\\u{000A}b\\u{202E}");
    }

    #[test]
    fn facet_values_are_numbered_and_shown_on_one_line() {
        let options: [BTreeSet<String>; 4] = [
            ["prod-eu", "prod-eu\nprod-us", "prod-us"]
                .map(String::from)
                .into(),
            BTreeSet::new(),
            BTreeSet::new(),
            BTreeSet::new(),
        ];
        let numbers = Numbers::of(&options);
        let set = |values: &[&str]| values.iter().map(|v| v.to_string()).collect();
        assert_eq!(numbers.encode(0, &set(&["prod-eu\nprod-us"])), "1");
        assert_eq!(numbers.encode(0, &set(&["prod-us", "prod-eu"])), "0 2");
        assert_eq!(numbers.encode_named(0, &set(&[])), None);
        assert_eq!(
            one_line("prod-eu\nprod-us\t\0"),
            "prod-eu\\u{000A}prod-us\\u{0009}\\u{0000}"
        );
    }

    #[test]
    fn the_content_security_policy_names_the_scripts_hash() {
        let policy = content_security_policy();
        assert!(policy.starts_with("default-src 'none';"), "{policy}");
        assert!(policy.contains("script-src 'sha256-"), "{policy}");
    }
}
