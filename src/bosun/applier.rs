//! The one applier every write passes through. It enforces, for every file, before anything is
//! written: the path stays inside the repository (no `..`, no absolute path, no symbolic link
//! on the way), the deny-list and the allowlist, the promotion scope, and from-value equality
//! (the file still holds the value the plan was made from). It refuses and reports every
//! problem at once; it never half-applies. Writes are atomic per file (temporary file in the
//! same folder, then rename), and every new content is prepared before the first rename.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};

use globset::{GlobSet, GlobSetBuilder};
use serde_json::Value;

use super::swap::{self, Swap};
use crate::render::Rendering;

/// Which files an edit may touch.
#[derive(Debug, Clone)]
pub struct Policy {
    deny: GlobSet,
    allow: GlobSet,
    /// None: the whole repository (the lists still apply).
    scope: Option<Scope>,
}

/// The files the head's Applications deploy or render from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Source directories (a file under one is in scope); "" is the whole repository.
    pub directories: BTreeSet<String>,
    /// Values files layered by Applications.
    pub files: BTreeSet<String>,
}

impl Scope {
    /// From the head's rendering: every source `path` an Application of this repository
    /// reads, and every values file it layers (`$ref/...` or relative to the chart).
    pub fn of(rendering: &Rendering, is_this_repository: impl Fn(&str) -> bool) -> Scope {
        let mut scope = Scope::default();
        for app in &rendering.applications {
            let refs: BTreeMap<&str, &Value> = app
                .sources
                .iter()
                .filter_map(|s| Some((s.get("ref")?.as_str()?, s)))
                .collect();
            for source in &app.sources {
                let repo = source.get("repoURL").and_then(Value::as_str).unwrap_or("");
                let path = source.get("path").and_then(Value::as_str);
                if let Some(path) = path
                    && is_this_repository(repo)
                {
                    scope.directories.insert(crate::paths::normalize(path));
                }
                for file in source
                    .pointer("/helm/valueFiles")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    if let Some(rest) = file.strip_prefix('$') {
                        let (name, relative) = rest.split_once('/').unwrap_or((rest, ""));
                        if let Some(r) = refs.get(name)
                            && is_this_repository(
                                r.get("repoURL").and_then(Value::as_str).unwrap_or(""),
                            )
                        {
                            scope.files.insert(crate::paths::normalize(relative));
                        }
                    } else if let Some(path) = path
                        && is_this_repository(repo)
                    {
                        scope
                            .files
                            .insert(crate::paths::normalize(&format!("{path}/{file}")));
                    }
                }
            }
        }
        scope
    }

    pub fn contains(&self, path: &str) -> bool {
        self.files.contains(path)
            || self.directories.iter().any(|dir| {
                dir.is_empty()
                    || path
                        .strip_prefix(dir.as_str())
                        .is_some_and(|r| r.starts_with('/'))
            })
    }
}

/// Why the deny-list or the allowlist could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("glob {pattern:?}: {error}")]
    Glob {
        pattern: String,
        error: globset::Error,
    },
    #[error("{0}")]
    Set(globset::Error),
}

/// A glob set; `case_insensitive` for the deny-list, which must hold whatever the case of a
/// path on a case-insensitive filesystem (denying more is the safe side; the allowlist stays
/// exact, allowing less).
fn globs(patterns: &[String], case_insensitive: bool) -> Result<GlobSet, PolicyError> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        builder.add(
            globset::GlobBuilder::new(pattern)
                .case_insensitive(case_insensitive)
                .literal_separator(false)
                .build()
                .map_err(|error| PolicyError::Glob {
                    pattern: pattern.clone(),
                    error,
                })?,
        );
    }
    builder.build().map_err(PolicyError::Set)
}

impl Policy {
    pub fn new(
        deny: &[String],
        allow: &[String],
        scope: Option<Scope>,
    ) -> Result<Policy, PolicyError> {
        Ok(Policy {
            deny: globs(deny, true)?,
            allow: globs(allow, false)?,
            scope,
        })
    }
}

/// Why a file was refused: (path as the plan named it, reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub path: String,
    pub reason: Reason,
}

/// Why the applier refuses one file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("the path leaves the repository or is not a plain relative path")]
    NotPlain,
    /// The path (repository-relative) up to the link.
    #[error("{0} is a symbolic link; Bosun never writes through one")]
    SymbolicLink(String),
    /// The filesystem's error, as it said it.
    #[error("cannot read it: {0}")]
    Unreadable(String),
    #[error("not a regular file")]
    NotAFile,
    #[error("the deny-list matches it")]
    Denied,
    #[error("the allowlist does not match it")]
    NotAllowed,
    #[error("outside the promotion scope: no Application deploys it or renders from it")]
    OutOfScope,
    #[error("the file changed since the rewrite was planned from it")]
    Changed,
    /// The swap cannot be applied to the file's text.
    #[error(transparent)]
    Swap(swap::SwapError),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

/// A file the applier accepted: its content before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub path: String,
    pub before: String,
    pub after: String,
}

/// Checks one repository-relative path: relative, normal, and no symbolic link on the way.
fn safe_path(root: &Path, path: &str) -> Result<(), Reason> {
    let relative = Path::new(path);
    if path.is_empty()
        || relative.is_absolute()
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(Reason::NotPlain);
    }
    let mut current = root.to_path_buf();
    for component in relative.components() {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(Reason::SymbolicLink(
                    current
                        .strip_prefix(root)
                        .unwrap_or(&current)
                        .display()
                        .to_string(),
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(Reason::Unreadable(e.to_string())),
        }
    }
    if !current.is_file() {
        return Err(Reason::NotAFile);
    }
    Ok(())
}

/// Whether the policy lets Bosun write `path`: a plain path inside the tree with no link on
/// the way, not denied, allowed, and in the promotion scope.
fn admit(root: &Path, policy: &Policy, path: &str) -> Result<(), Reason> {
    safe_path(root, path)?;
    // The lists see the path as the filesystem resolves it: `a//b` and `a/./b` are `a/b`.
    let normal = crate::paths::normalize(path);
    if policy.deny.is_match(&normal) {
        return Err(Reason::Denied);
    }
    if !policy.allow.is_match(&normal) {
        return Err(Reason::NotAllowed);
    }
    if let Some(scope) = &policy.scope
        && !scope.contains(path)
    {
        return Err(Reason::OutOfScope);
    }
    Ok(())
}

/// Checks rewrites planned elsewhere (the values migration) against the same policy, and
/// that each file still holds exactly the content the rewrite was planned from. Writes
/// nothing; refuses with every reason.
pub fn admit_rewrites(
    root: &Path,
    policy: &Policy,
    rewrites: &[Rewrite],
) -> Result<(), Vec<Refusal>> {
    let mut refusals = Vec::new();
    for rewrite in rewrites {
        let refuse = |reason: Reason| Refusal {
            path: rewrite.path.clone(),
            reason,
        };
        if let Err(reason) = admit(root, policy, &rewrite.path) {
            refusals.push(refuse(reason));
            continue;
        }
        match std::fs::read_to_string(root.join(&rewrite.path)) {
            Ok(now) if now == rewrite.before => {}
            Ok(_) => refusals.push(refuse(Reason::Changed)),
            Err(e) => refusals.push(refuse(Reason::Unreadable(e.to_string()))),
        }
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals)
    }
}

/// Plans every file's new content, or refuses with every reason. Writes nothing.
pub fn prepare(
    root: &Path,
    policy: &Policy,
    plan: &BTreeMap<String, Vec<Swap>>,
) -> Result<Vec<Rewrite>, Vec<Refusal>> {
    let mut refusals = Vec::new();
    let mut rewrites = Vec::new();
    for (path, swaps) in plan {
        let refuse = |reason: Reason| Refusal {
            path: path.clone(),
            reason,
        };
        if let Err(reason) = admit(root, policy, path) {
            refusals.push(refuse(reason));
            continue;
        }
        let before = match std::fs::read_to_string(root.join(path)) {
            Ok(text) => text,
            Err(e) => {
                refusals.push(refuse(Reason::Unreadable(e.to_string())));
                continue;
            }
        };
        match swap::apply(&before, swaps) {
            Ok(after) => rewrites.push(Rewrite {
                path: path.clone(),
                before,
                after,
            }),
            Err(e) => refusals.push(refuse(Reason::Swap(e))),
        }
    }
    if refusals.is_empty() {
        Ok(rewrites)
    } else {
        Err(refusals)
    }
}

/// Writes every rewrite: all temporary files first, then the renames. A failure before the
/// renames leaves every file as it was.
pub fn write(root: &Path, rewrites: &[Rewrite]) -> std::io::Result<()> {
    let mut staged = Vec::new();
    for rewrite in rewrites {
        let target = root.join(&rewrite.path);
        let dir = target.parent().unwrap_or(root);
        let mut file = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut file, rewrite.after.as_bytes())?;
        if let Ok(meta) = std::fs::metadata(&target) {
            file.as_file().set_permissions(meta.permissions())?;
        }
        staged.push((file, target));
    }
    for (file, target) in staged {
        file.persist(&target).map_err(|e| e.error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_for(path: &str) -> BTreeMap<String, Vec<Swap>> {
        BTreeMap::from([(path.to_string(), vec![crate::bosun::swap::test_swap(path)])])
    }

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("apps")).unwrap();
        std::fs::write(
            dir.path().join("apps/a.yaml"),
            "apiVersion: e.io/v1beta1 # c\nkind: E\nmetadata: {name: a}\n",
        )
        .unwrap();
        dir
    }

    fn policy(deny: &[&str], scope: Option<Scope>) -> Policy {
        let deny: Vec<String> = deny.iter().map(|s| s.to_string()).collect();
        Policy::new(&deny, &["**/*.yaml".into()], scope).unwrap()
    }

    #[test]
    fn an_allowed_file_in_scope_is_rewritten() {
        let dir = repo();
        let mut scope = Scope::default();
        scope.directories.insert("apps".into());
        let rewrites = prepare(
            dir.path(),
            &policy(&[], Some(scope)),
            &plan_for("apps/a.yaml"),
        )
        .unwrap();
        assert_eq!(
            rewrites[0].after,
            "apiVersion: e.io/v1 # c\nkind: E\nmetadata: {name: a}\n"
        );
        write(dir.path(), &rewrites).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("apps/a.yaml")).unwrap(),
            rewrites[0].after
        );
    }

    #[test]
    fn denied_out_of_scope_escaping_and_linked_paths_are_refused() {
        let dir = repo();
        let refused = |path: &str, policy: &Policy| {
            prepare(dir.path(), policy, &plan_for(path)).unwrap_err()[0]
                .reason
                .to_string()
        };
        assert_eq!(
            refused("apps/a.yaml", &policy(&["apps/**"], None)),
            "the deny-list matches it"
        );
        let mut elsewhere = Scope::default();
        elsewhere.directories.insert("platform".into());
        assert!(
            refused("apps/a.yaml", &policy(&[], Some(elsewhere)))
                .starts_with("outside the promotion scope")
        );
        // The deny-list sees the path as the filesystem resolves it, in any case.
        for spelling in ["apps//a.yaml", "apps/./a.yaml", "apps///./a.yaml"] {
            assert_eq!(
                refused(spelling, &policy(&["apps/a.yaml"], None)),
                "the deny-list matches it",
                "{spelling}"
            );
        }
        assert_eq!(
            refused("apps/a.yaml", &policy(&["APPS/*.YAML"], None)),
            "the deny-list matches it"
        );
        assert!(refused("../a.yaml", &policy(&[], None)).contains("leaves the repository"));
        assert!(refused("/etc/a.yaml", &policy(&[], None)).contains("leaves the repository"));
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("x.yaml"),
            "apiVersion: e.io/v1beta1\nkind: E\nmetadata: {name: a}\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("linked")).unwrap();
        assert!(refused("linked/x.yaml", &policy(&[], None)).contains("symbolic link"));
        // Nothing was written anywhere.
        assert!(
            std::fs::read_to_string(outside.path().join("x.yaml"))
                .unwrap()
                .contains("v1beta1")
        );
    }

    #[test]
    fn one_refusal_means_no_file_is_rewritten() {
        let dir = repo();
        std::fs::write(
            dir.path().join("apps/b.yaml"),
            "apiVersion: e.io/v1beta1\nkind: E\nmetadata: {name: a}\n",
        )
        .unwrap();
        let mut plan = plan_for("apps/a.yaml");
        plan.extend(plan_for("apps/b.yaml"));
        let refusals = prepare(dir.path(), &policy(&["apps/b.yaml"], None), &plan).unwrap_err();
        assert_eq!(refusals.len(), 1);
        assert!(
            std::fs::read_to_string(dir.path().join("apps/a.yaml"))
                .unwrap()
                .contains("v1beta1")
        );
    }
}
