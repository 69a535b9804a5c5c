//! The absences ARCHITECTURE.md states, enforced by reading the product's source (`src/`):
//!
//! - the pure rooms (`src/render`, `src/gate/rules`, `src/bosun/classify.rs`, every `decide`
//!   function of Bosun's repairs) reach for no Kubernetes client, HTTP client, process, async
//!   runtime or command-line parser;
//! - no file but `src/git.rs` runs git;
//! - no file but `src/remote_cache.rs` reaches object storage (the render asks it through
//!   `render::cache::SecondLevel`);
//! - no Bosun file but the applier writes files (a checkout is written only through it).
//!
//! Plain Rust over the text: comments and the insides of string literals are blanked before a
//! rule looks (so a doc comment may name what a rule forbids), and test code (`tests.rs`, an
//! item under `#[cfg(test)]`) is left out. Each failure names the file, the line and the rule.

use std::path::{Path, PathBuf};

/// A source file as the rules read it.
struct Source {
    /// Repository-relative, with `/`.
    path: String,
    /// The text with comments blanked and test items blanked; string literals kept.
    code: String,
    /// [`Source::code`] with the insides of string and char literals blanked too.
    bare: String,
}

impl Source {
    fn line_of(&self, offset: usize) -> usize {
        self.code[..offset].bytes().filter(|b| *b == b'\n').count() + 1
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every product source file under `src/`, test files left out.
fn sources() -> Vec<Source> {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files
        .into_iter()
        .filter(|p| p.file_name().is_none_or(|n| n != "tests.rs"))
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            let path = p
                .strip_prefix(&root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let (mut code, mut bare) = blank(&text);
            blank_test_items(&mut code, &mut bare);
            Source { path, code, bare }
        })
        .collect()
}

/// `(code, bare)`: comments blanked in both; the insides of string and char literals blanked
/// in `bare` only. Offsets and lines are those of the file (a blanked byte becomes a space,
/// a newline stays).
fn blank(text: &str) -> (String, String) {
    let b = text.as_bytes();
    let mut code = b.to_vec();
    let mut bare = b.to_vec();
    let space = |v: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut v[from..to] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            let end = b[i..]
                .iter()
                .position(|x| *x == b'\n')
                .map_or(b.len(), |n| i + n);
            space(&mut code, i, end);
            space(&mut bare, i, end);
            i = end;
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            let mut j = i;
            while j < b.len() {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            space(&mut code, i, j);
            space(&mut bare, i, j);
            i = j;
        } else if (c == b'r' || (c == b'b' && next == Some(b'r')))
            && (i == 0 || !is_ident(b[i - 1]))
            && raw_string_start(b, i).is_some()
        {
            let (open_end, hashes) = raw_string_start(b, i).expect("checked");
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = b[open_end..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |n| open_end + n);
            space(&mut bare, open_end, end);
            i = end + close.len();
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            space(&mut bare, i + 1, j.min(b.len()));
            i = j + 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}', '"'), not a lifetime ('a).
            let end = if next == Some(b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|x| *x == b'\'')
                    .map(|n| i + 2 + n)
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match end {
                Some(end) => {
                    space(&mut bare, i + 1, end);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    (
        String::from_utf8(code).expect("blanking keeps UTF-8"),
        String::from_utf8(bare).expect("blanking keeps UTF-8"),
    )
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `r"`, `r#"`, `br"`…: the offset after the opening quote and the number of `#`.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let mut j = i + if b[i] == b'b' { 2 } else { 1 };
    let mut hashes = 0;
    while b.get(j) == Some(&b'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&b'"')).then_some((j + 1, hashes))
}

/// The offset just past the item starting at `from` in `bare`: its matching `}`, or its `;`
/// when it has no body.
fn item_end(bare: &str, from: usize) -> usize {
    let b = bare.as_bytes();
    let mut depth = 0usize;
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Blanks every item under `#[cfg(test)]` (a `mod tests { … }`, a test-only function).
fn blank_test_items(code: &mut String, bare: &mut String) {
    let mut from = 0;
    while let Some(at) = bare[from..].find("#[cfg(test)]").map(|n| from + n) {
        let end = item_end(bare, at + "#[cfg(test)]".len());
        let spaced = |s: &str| -> String {
            s.chars()
                .map(|c| if c == '\n' { '\n' } else { ' ' })
                .collect()
        };
        let blanked = spaced(&bare[at..end]);
        bare.replace_range(at..end, &blanked);
        let blanked = spaced(&code[at..end]);
        code.replace_range(at..end, &blanked);
        from = end;
    }
}

/// Every offset in `hay` where `needle` stands as a word: not the tail of a longer
/// identifier, nor (when it ends with an identifier's character) its head.
fn find_word(hay: &str, needle: &str) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    let open_end = needle.bytes().next_back().is_some_and(is_ident);
    while let Some(at) = hay[from..].find(needle).map(|n| from + n) {
        let before = hay[..at].bytes().next_back();
        let after = hay.as_bytes().get(at + needle.len()).copied();
        if before.is_none_or(|b| !is_ident(b)) && !(open_end && after.is_some_and(is_ident)) {
            found.push(at);
        }
        from = at + needle.len();
    }
    found
}

/// One broken absence: where and which rule.
struct Violation {
    path: String,
    line: usize,
    rule: &'static str,
    what: String,
}

fn report(violations: Vec<Violation>) {
    if violations.is_empty() {
        return;
    }
    let lines: Vec<String> = violations
        .iter()
        .map(|v| format!("{}:{}: {} ({})", v.path, v.line, v.rule, v.what))
        .collect();
    panic!(
        "{} absence(s) broken (see ARCHITECTURE.md, Invariants):\n{}",
        lines.len(),
        lines.join("\n")
    );
}

/// What a pure room must not reach for, as it appears in code.
const FORBIDDEN_IN_PURE_ROOMS: &[(&str, &str)] = &[
    ("kube::", "a Kubernetes client"),
    ("reqwest", "an HTTP client"),
    ("process::Command", "a process"),
    ("Command::new", "a process"),
    ("CommandExt", "a process"),
    ("tokio", "the async runtime"),
    ("clap", "a command-line parser"),
    ("object_store", "an object store client"),
];

/// Files of a pure room that may do one thing the room otherwise forbids, and why.
const PURE_ROOM_ALLOWED: &[(&str, &str)] = &[
    // The render's one way to run helm and kubectl: scrubbed environment, network
    // namespace, deadline, memory ceiling, output cap, process-group kill.
    ("src/render/confine.rs", "a process"),
    // `helm version` / `kubectl version` of the pinned tool the configuration names (no
    // repository input reaches it), for the render cache's key.
    ("src/render/tools.rs", "a process"),
];

fn in_pure_room(path: &str) -> bool {
    path.starts_with("src/render/")
        || path.starts_with("src/gate/rules/")
        || path == "src/gate/rules.rs"
        || path == "src/bosun/classify.rs"
        || BOSUN_DECISIONS
            .iter()
            .any(|room| path == format!("{room}.rs") || path.starts_with(&format!("{room}/")))
}

/// Bosun's decisions whose `decide` is split into functions of their own, with their
/// harnesses: pure as a whole, so the split keeps every line `decide` runs in reach of the
/// check.
const BOSUN_DECISIONS: &[&str] = &[
    "src/bosun/migration",
    "src/bosun/reshape",
    "src/bosun/scalar_fix",
    "src/bosun/repair/swap",
];

/// The bodies of every `fn decide` (Bosun's repairs and the pure decisions they call), as
/// offset ranges in `bare`.
fn decide_bodies(source: &Source) -> Vec<(usize, usize)> {
    find_word(&source.bare, "fn decide")
        .into_iter()
        .filter(|&at| {
            source.bare[at + "fn decide".len()..]
                .bytes()
                .next()
                .is_some_and(|b| !is_ident(b))
        })
        .map(|at| (at, item_end(&source.bare, at)))
        .collect()
}

#[test]
fn pure_rooms_reach_for_no_client_process_runtime_or_cli() {
    let mut violations = Vec::new();
    for source in sources() {
        let mut ranges = Vec::new();
        let rule = if in_pure_room(&source.path) {
            ranges.push((0, source.bare.len()));
            "a pure room (src/render, src/gate/rules, src/bosun/classify.rs, Bosun's decisions) reaches for"
        } else if source.path.starts_with("src/bosun/") {
            ranges.extend(decide_bodies(&source));
            "a repair's `decide` (pure) reaches for"
        } else {
            continue;
        };
        for (from, to) in ranges {
            for (needle, what) in FORBIDDEN_IN_PURE_ROOMS {
                if PURE_ROOM_ALLOWED.contains(&(source.path.as_str(), what)) {
                    continue;
                }
                for at in find_word(&source.bare[..to], needle) {
                    if at >= from {
                        violations.push(Violation {
                            path: source.path.clone(),
                            line: source.line_of(at),
                            rule,
                            what: format!("{what}: `{needle}`"),
                        });
                    }
                }
            }
        }
    }
    report(violations);
}

#[test]
fn no_file_but_src_git_rs_runs_git() {
    let rule = "git runs outside src/git.rs (use git::Git)";
    let mut violations = Vec::new();
    for source in sources() {
        if source.path == "src/git.rs" {
            continue;
        }
        // A process whose program is git, named directly or by a path ending in /git.
        for at in find_word(&source.code, "Command::new(") {
            let argument = source.code[at + "Command::new(".len()..]
                .trim_start()
                .split([')', ','])
                .next()
                .unwrap_or("")
                .trim();
            let program = argument.trim_matches('"');
            if argument.starts_with('"') && (program == "git" || program.ends_with("/git")) {
                violations.push(Violation {
                    path: source.path.clone(),
                    line: source.line_of(at),
                    rule,
                    what: format!("Command::new({argument})"),
                });
            }
        }
        // git through a shell (`sh -c "git …"`), or a literal program name handed on.
        for (at, _) in source.code.match_indices("\"git ") {
            let before = source.bare[..at].trim_end();
            if before.ends_with("Command::new(") || before.ends_with(".arg(") {
                violations.push(Violation {
                    path: source.path.clone(),
                    line: source.line_of(at),
                    rule,
                    what: "a shell command line starting with git".to_string(),
                });
            }
        }
        // The raw commands of src/git.rs (private there; a re-export would bring them back).
        for needle in ["git::git(", "git::git_remote(", "git::{git", "git::git;"] {
            for at in find_word(&source.bare, needle) {
                violations.push(Violation {
                    path: source.path.clone(),
                    line: source.line_of(at),
                    rule,
                    what: format!("`{needle}`"),
                });
            }
        }
    }
    report(violations);
}

#[test]
fn no_file_but_the_remote_cache_reaches_object_storage() {
    let rule =
        "object storage outside src/remote_cache.rs (render asks render::cache::SecondLevel)";
    let mut violations = Vec::new();
    for source in sources() {
        if source.path == "src/remote_cache.rs" {
            continue;
        }
        for at in find_word(&source.bare, "object_store") {
            violations.push(Violation {
                path: source.path.clone(),
                line: source.line_of(at),
                rule,
                what: "`object_store`".to_string(),
            });
        }
    }
    report(violations);
}

/// What writes a file, a folder or its metadata.
const WRITES: &[&str] = &[
    "fs::write",
    "File::create",
    "OpenOptions",
    "fs::rename",
    "fs::copy",
    "fs::remove_file",
    "fs::remove_dir",
    "fs::create_dir",
    "fs::set_permissions",
    "fs::hard_link",
    "fs::symlink",
    "NamedTempFile",
    "tempfile::Builder",
    ".persist(",
];

/// Bosun files that write, none of them into a checkout's tree, and why. Everything else of
/// Bosun writes a checkout only through the applier (src/bosun/applier.rs).
const WRITES_ALLOWED: &[(&str, &str)] = &[
    // The journal of deliveries and triages, under `<workdir>/journal`.
    ("src/bosun/journal.rs", "fs::create_dir"),
    ("src/bosun/journal.rs", "fs::set_permissions"),
    ("src/bosun/journal.rs", "NamedTempFile"),
    ("src/bosun/journal.rs", ".persist("),
    ("src/bosun/journal.rs", "fs::remove_file"),
    ("src/bosun/journal.rs", "fs::rename"),
    // The work folder's lock file (`<workdir>/.lock`), one triage at a time.
    ("src/bosun/runner/round.rs", "OpenOptions"),
    // The checkout's own folder, made empty before `git init` (git writes the checkout).
    ("src/bosun/runner/git_ops.rs", "fs::create_dir"),
    // `bosun repair`'s scratch folder for its worktree (git writes the worktree).
    ("src/bosun/local.rs", "tempfile::Builder"),
    // The work folder, its checkouts/ and tmp/ folders and its lock, made at start.
    ("src/bin/bosun/setup.rs", "fs::create_dir"),
    ("src/bin/bosun/setup.rs", "fs::set_permissions"),
    ("src/bin/bosun/setup.rs", "OpenOptions"),
    ("src/bin/bosun/setup.rs", "fs::remove_dir"),
    // `bosun repair`'s work folder, made private.
    ("src/bin/bosun/local.rs", "fs::create_dir"),
    ("src/bin/bosun/local.rs", "fs::set_permissions"),
];

#[test]
fn no_bosun_file_but_the_applier_writes_files() {
    let rule = "a Bosun file writes files outside the applier (src/bosun/applier*)";
    let mut violations = Vec::new();
    for source in sources() {
        let bosun =
            source.path.starts_with("src/bosun/") || source.path.starts_with("src/bin/bosun/");
        if !bosun || source.path.starts_with("src/bosun/applier") {
            continue;
        }
        for needle in WRITES {
            if WRITES_ALLOWED.contains(&(source.path.as_str(), needle)) {
                continue;
            }
            let found = if needle.starts_with('.') {
                source
                    .bare
                    .match_indices(needle)
                    .map(|(at, _)| at)
                    .collect()
            } else {
                find_word(&source.bare, needle)
            };
            for at in found {
                violations.push(Violation {
                    path: source.path.clone(),
                    line: source.line_of(at),
                    rule,
                    what: format!("`{needle}`"),
                });
            }
        }
    }
    report(violations);
}

/// The reader itself: comments and strings do not count, test items are left out.
#[test]
fn the_reader_blanks_comments_strings_and_test_items() {
    let text = "// kube::Api\nlet a = \"reqwest\"; let r = r#\"tokio\"#; let c = '\"';\n/* clap */ fn f<'a>() {}\n#[cfg(test)]\nmod tests { use tokio; }\nfn g() { tokio::spawn() }\n";
    let (mut code, mut bare) = blank(text);
    blank_test_items(&mut code, &mut bare);
    assert_eq!(code.len(), text.len());
    assert!(!code.contains("kube::") && !code.contains("clap"));
    assert!(code.contains("\"reqwest\""));
    assert!(!bare.contains("reqwest"));
    assert_eq!(find_word(&bare, "tokio").len(), 1, "{bare}");
    assert!(bare.contains("fn f<'a>()"));
}
