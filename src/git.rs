//! The product's one git runner: a repository's tree at one revision, read from git objects
//! (no checkout, no work tree); revisions resolved, fetched and merge-based; repository URLs
//! (origin's without credentials, compared the way people write them). The render engine,
//! the gate and Bosun read repositories through it.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use crate::paths::normalize;

/// Why a revision could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("{repo}: unknown revision {revision:?} (git: {stderr})")]
    UnknownRevision {
        repo: String,
        revision: String,
        stderr: String,
    },
    #[error("{repo}: git {args} failed: {stderr}")]
    Command {
        repo: String,
        args: String,
        stderr: String,
    },
    #[error("{repo}: could not run git: {source}")]
    Spawn {
        repo: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{repo}: unexpected output from git cat-file: {detail}")]
    Protocol { repo: String, detail: String },
    #[error(
        "{repo}: {path:?} at {commit} is {size} bytes, over the {limit_mib} MiB a repository file may hold (the YAML budget); the gate does not read it"
    )]
    TooLarge {
        repo: String,
        commit: String,
        path: String,
        size: u64,
        limit_mib: u64,
    },
    #[error("could not write the tree of {commit} to {dir}: {source}")]
    Materialize {
        commit: String,
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

/// Every regular file of one commit, in memory, by repository-relative path.
#[derive(Debug)]
pub struct Snapshot {
    /// The repository the snapshot was read from.
    pub repo_dir: PathBuf,
    /// The full commit id the revision resolved to.
    pub commit: String,
    files: BTreeMap<String, Vec<u8>>,
    /// Symbolic links are recorded but never followed or written out: a link can point outside
    /// the repository, and nothing Argo CD deploys should depend on one.
    symlinks: BTreeMap<String, String>,
    materialized: OnceLock<Result<Arc<tempfile::TempDir>, String>>,
}

/// `git -C repo` as every part of the product runs it: nothing a repository's configuration,
/// hooks or attributes name runs (see [`PROGRAMS_OFF`] and [`driver_names`]), and no
/// transport at all (`GIT_ALLOW_PROTOCOL` empty: no fetch, push, remote helper, SSH command,
/// credential helper or lazy fetch of a promisor). A repository's `.git/config` may come from
/// anyone (`bosun repair --repo DIR` on a repository received as it is). The calls that must
/// talk to a remote use [`git_remote`].
fn git(repo: &Path) -> Command {
    let mut command = git_remote(repo);
    command.env("GIT_ALLOW_PROTOCOL", "");
    command
}

/// [`git`] for the calls that talk to a remote (`fetch`, `push`): the transports the
/// configuration allows are allowed; everything else of [`git`] holds. Only for a repository
/// whose configuration the product wrote or the CI checked out.
fn git_remote(repo: &Path) -> Command {
    let mut command = Command::new("git");
    command.arg("-C").arg(repo).env("GIT_TERMINAL_PROMPT", "0");
    // Configuration given through the environment wins over every file (command scope), and
    // is inherited by the git processes git starts (a worktree's checkout, auto maintenance).
    let inherited: usize = std::env::var("GIT_CONFIG_COUNT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut pairs: Vec<(String, String)> = PROGRAMS_OFF
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    match driver_names(repo) {
        Ok(names) => {
            for name in names {
                for (section, program) in DRIVER_PROGRAMS {
                    pairs.push((format!("{section}.{name}.{program}"), String::new()));
                }
                pairs.push((format!("filter.{name}.required"), "false".to_string()));
            }
        }
        // The configuration could not be read: a key git refuses makes the command fail
        // rather than run with a driver left on.
        Err(()) => pairs.push(("unreadable-configuration".to_string(), String::new())),
    }
    for (i, (key, value)) in pairs.iter().enumerate() {
        command
            .env(format!("GIT_CONFIG_KEY_{}", inherited + i), key)
            .env(format!("GIT_CONFIG_VALUE_{}", inherited + i), value);
    }
    command.env("GIT_CONFIG_COUNT", (inherited + pairs.len()).to_string());
    command
}

/// One git command as the rest of the product runs it: built and spawned here only, so every
/// git process of the product has [`git`]'s guards. Callers say what they need on top: a
/// transport ([`Git::remote`]), literal pathspecs, an environment variable for this one
/// process (a credential helper's input), the arguments.
pub struct Git {
    repo: PathBuf,
    command: Command,
    args: Vec<String>,
}

impl Git {
    /// git in `repo` with no transport at all (see [`git`]).
    pub fn local(repo: &Path) -> Git {
        Git {
            repo: repo.to_path_buf(),
            command: git(repo),
            args: Vec::new(),
        }
    }

    /// git in `repo` for a call that talks to a remote (`fetch`, `push`; see [`git_remote`]).
    pub fn remote(repo: &Path) -> Git {
        Git {
            repo: repo.to_path_buf(),
            command: git_remote(repo),
            args: Vec::new(),
        }
    }

    /// A file named like pathspec magic (`:(exclude)x`) is only ever that file.
    pub fn literal_pathspecs(mut self) -> Git {
        self.command.env("GIT_LITERAL_PATHSPECS", "1");
        self
    }

    /// An environment variable of this one git process.
    pub fn env(mut self, key: &str, value: &str) -> Git {
        self.command.env(key, value);
        self
    }

    /// Arguments, in order (options before the subcommand, then the subcommand's).
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Git {
        for arg in args {
            self.command.arg(arg.as_ref());
            self.args.push(arg.as_ref().to_string());
        }
        self
    }

    /// Runs it: its standard output when it succeeds; [`GitError::Spawn`] when git cannot
    /// start, [`GitError::Command`] (its standard error, trimmed) when it fails.
    pub fn run(mut self) -> Result<Vec<u8>, GitError> {
        let output = self.command.output().map_err(|source| GitError::Spawn {
            repo: self.repo.display().to_string(),
            source,
        })?;
        if !output.status.success() {
            return Err(GitError::Command {
                repo: self.repo.display().to_string(),
                args: self.args.join(" "),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(output.stdout)
    }

    /// [`Git::run`], its output read as text and trimmed.
    pub fn run_text(self) -> Result<String, GitError> {
        self.run()
            .map(|out| String::from_utf8_lossy(&out).trim().to_string())
    }
}

/// Configuration that would make git run a program on its own, turned off for every git
/// process: hooks (`core.hooksPath` at a file, so no hook is found), the file-system monitor,
/// an external diff, signing, automatic maintenance (it runs `git gc` and its hook) and
/// submodules followed by checkouts. A pager runs only on a terminal; git's output is always
/// read by the product.
pub const PROGRAMS_OFF: &[(&str, &str)] = &[
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("diff.external", ""),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
];

/// The program keys of an attribute-selected driver (`.gitattributes` picks a driver by
/// name: `filter=x`, `diff=x`, `merge=x`), each set empty for every name configured: git then
/// runs nothing (an empty filter is no filter; an empty diff or merge program cannot start).
/// A name no configuration defines does nothing.
const DRIVER_PROGRAMS: &[(&str, &str)] = &[
    ("filter", "clean"),
    ("filter", "smudge"),
    ("filter", "process"),
    ("diff", "command"),
    ("diff", "textconv"),
    ("merge", "driver"),
];

/// Every driver name the configuration of `repo` defines (`filter.<name>.*`, `diff.<name>.*`,
/// `merge.<name>.*`), read as the git process in `repo` reads it (includes, `includeIf`
/// conditions, every scope); read again for each command, since a condition can change.
fn driver_names(repo: &Path) -> Result<Vec<String>, ()> {
    let output = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "config",
            "-z",
            "--name-only",
            "--get-regexp",
            r"^(filter|diff|merge)\..*\.",
        ])
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .output()
        .map_err(|_| ())?;
    match output.status.code() {
        Some(0) => {}
        Some(1) => return Ok(Vec::new()), // nothing matched
        // Outside a repository git still reads the user's and the system's files; a folder
        // that is no repository is answered by the command itself.
        _ if !repo.exists() => return Ok(Vec::new()),
        _ => return Err(()),
    }
    let mut names = Vec::new();
    for key in output.stdout.split(|b| *b == 0).filter(|k| !k.is_empty()) {
        // A name that is not UTF-8 is refused rather than left on.
        let key = std::str::from_utf8(key).map_err(|_| ())?;
        if let Some((name, _)) = key
            .split_once('.')
            .and_then(|(_, rest)| rest.rsplit_once('.'))
        {
            names.push(name.to_string());
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

fn run_git(repo: &Path, args: &[&str]) -> Result<Vec<u8>, GitError> {
    Git::local(repo).args(args).run()
}

/// Resolves a revision (branch, tag, sha, `HEAD~1`) to a full commit id.
pub fn resolve_commit(repo: &Path, revision: &str) -> Result<String, GitError> {
    // A branch or tag cannot start with `-` (git check-ref-format); such a string could only
    // be read as an option.
    if revision.starts_with('-') || revision.is_empty() {
        return Err(GitError::UnknownRevision {
            repo: repo.display().to_string(),
            revision: revision.to_string(),
            stderr: "not a revision".to_string(),
        });
    }
    let spec = format!("{revision}^{{commit}}");
    let output = git(repo)
        .args(["rev-parse", "--verify", "--quiet", &spec])
        .output()
        .map_err(|source| GitError::Spawn {
            repo: repo.display().to_string(),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        return Err(GitError::UnknownRevision {
            repo: repo.display().to_string(),
            revision: revision.to_string(),
            stderr: if stderr.is_empty() {
                "no such commit".to_string()
            } else {
                stderr
            },
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// Whether `text` is a full commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits. A
/// head that arrives from outside (a delivery, a forge's answer, a flag) must be one before
/// any use: anything else could be read by git as an option or a revision expression.
pub fn is_commit_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Makes sure a commit is in the local repository, fetching it from `origin` when not.
pub fn ensure_commit(repo: &Path, sha: &str) -> Result<(), GitError> {
    if !is_commit_id(sha) {
        return Err(GitError::UnknownRevision {
            repo: repo.display().to_string(),
            revision: sha.chars().take(80).collect(),
            stderr: "not a commit id (40 or 64 lowercase hex digits)".to_string(),
        });
    }
    if resolve_commit(repo, sha).is_ok() {
        return Ok(());
    }
    let fetched = git_remote(repo)
        .args(["fetch", "--quiet", "origin", sha])
        .output()
        .map_err(|source| GitError::Spawn {
            repo: repo.display().to_string(),
            source,
        })
        .and_then(|output| {
            if output.status.success() {
                Ok(())
            } else {
                Err(GitError::Command {
                    repo: repo.display().to_string(),
                    args: "fetch origin".to_string(),
                    stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
                })
            }
        });
    if fetched.is_err() || resolve_commit(repo, sha).is_err() {
        return Err(GitError::Command {
            repo: repo.display().to_string(),
            args: format!("fetch origin {sha}"),
            stderr: format!(
                "commit {sha} is not here and could not be fetched from origin: {}",
                match fetched {
                    Err(GitError::Command { stderr, .. }) => stderr,
                    Err(other) => other.to_string(),
                    Ok(_) => String::new(),
                }
            ),
        });
    }
    Ok(())
}

/// The URL of the `origin` remote, if the repository has one, without any user or password
/// (a CI checkout keeps its token there; nothing of it may reach a render or a report).
pub fn origin_url(repo: &Path) -> Option<String> {
    run_git(repo, &["remote", "get-url", "origin"])
        .ok()
        .map(|out| without_credentials(String::from_utf8_lossy(&out).trim()))
        .filter(|url| !url.is_empty())
}

/// `https://user:token@host/path` -> `https://host/path`; other URLs unchanged.
pub fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

/// Compares repository URLs the way people write them: scheme, `.git` suffix, trailing `/`
/// and the case of the host do not matter.
pub fn normalize_repo_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    let url = url.strip_suffix(".git").unwrap_or(url);
    let without_scheme = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url);
    // git@host:org/repo -> host/org/repo
    let without_user = without_scheme
        .rsplit_once('@')
        .map(|(_, r)| r)
        .unwrap_or(without_scheme);
    let unified = without_user.replacen(':', "/", 1);
    match unified.split_once('/') {
        Some((host, path)) => format!("{}/{}", host.to_lowercase(), path),
        None => unified.to_lowercase(),
    }
}

/// The merge base of two revisions (the last commit both share).
pub fn merge_base(repo: &Path, a: &str, b: &str) -> Result<String, GitError> {
    let out = run_git(repo, &["merge-base", a, b])?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

impl Snapshot {
    /// Reads every file of `revision` from the object database.
    pub fn load(repo: &Path, revision: &str) -> Result<Snapshot, GitError> {
        let commit = resolve_commit(repo, revision)?;
        // `-l`: each blob's size, so a file over the budget is refused before it is read.
        let listing = run_git(repo, &["ls-tree", "-r", "-z", "-l", "--full-tree", &commit])?;
        let mut blobs: Vec<(String, String, bool)> = Vec::new();
        for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            let entry = String::from_utf8_lossy(entry);
            let Some((meta, path)) = entry.split_once('\t') else {
                return Err(GitError::Protocol {
                    repo: repo.display().to_string(),
                    detail: format!("ls-tree line without a tab: {entry}"),
                });
            };
            // The size is padded with spaces.
            let mut parts = meta.split(' ').filter(|p| !p.is_empty());
            let (mode, kind, oid, size) = (parts.next(), parts.next(), parts.next(), parts.next());
            if kind != Some("blob") {
                continue; // submodules (commit entries) are not part of this repository's tree
            }
            let (Some(mode), Some(oid)) = (mode, oid) else {
                continue;
            };
            let size: u64 =
                size.and_then(|s| s.parse().ok())
                    .ok_or_else(|| GitError::Protocol {
                        repo: repo.display().to_string(),
                        detail: format!("ls-tree line without a size: {entry}"),
                    })?;
            if size > crate::yaml::MAX_FILE_BYTES {
                return Err(too_large(repo, &commit, path, size));
            }
            blobs.push((path.to_string(), oid.to_string(), mode == "120000"));
        }
        let contents = cat_blobs(repo, blobs.iter().map(|(_, oid, _)| oid.as_str()))?;
        let mut files = BTreeMap::new();
        let mut symlinks = BTreeMap::new();
        for ((path, _, is_link), content) in blobs.into_iter().zip(contents) {
            if is_link {
                symlinks.insert(path, String::from_utf8_lossy(&content).to_string());
            } else {
                files.insert(path, content);
            }
        }
        Ok(Snapshot {
            repo_dir: repo.to_path_buf(),
            commit,
            files,
            symlinks,
            materialized: OnceLock::new(),
        })
    }

    /// Builds a snapshot from files in memory (tests and synthetic repositories).
    pub fn from_files(commit: &str, files: BTreeMap<String, Vec<u8>>) -> Snapshot {
        Snapshot {
            repo_dir: PathBuf::new(),
            commit: commit.to_string(),
            files,
            symlinks: BTreeMap::new(),
            materialized: OnceLock::new(),
        }
    }

    pub fn read(&self, path: &str) -> Option<&[u8]> {
        self.files.get(normalize(path).as_str()).map(Vec::as_slice)
    }

    pub fn read_string(&self, path: &str) -> Option<String> {
        self.read(path)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    pub fn exists(&self, path: &str) -> bool {
        self.files.contains_key(normalize(path).as_str())
    }

    pub fn is_symlink(&self, path: &str) -> bool {
        self.symlinks.contains_key(normalize(path).as_str())
    }

    /// Every file path, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Every file below `dir` (recursively), as (path, content).
    pub fn files_under<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a str, &'a [u8])> {
        let prefix = dir_prefix(dir);
        self.files
            .range(prefix.clone()..)
            .take_while(move |(p, _)| p.starts_with(&prefix))
            .map(|(p, c)| (p.as_str(), c.as_slice()))
    }

    /// Every YAML file that can hold manifests: not inside a chart directory (a `Chart.yaml`
    /// above it: templates, not manifests) and not in a hidden folder (`.github`), sorted.
    pub fn manifest_files(&self) -> Vec<&str> {
        let chart_dirs: Vec<&str> = self
            .paths()
            .filter_map(|p| p.strip_suffix("Chart.yaml"))
            .collect();
        self.paths()
            .filter(|path| path.ends_with(".yaml") || path.ends_with(".yml"))
            .filter(|path| !path.split('/').any(|s| s.starts_with('.')))
            .filter(|path| !chart_dirs.iter().any(|dir| path.starts_with(dir)))
            .collect()
    }

    /// Every directory of the tree (not the root), sorted.
    pub fn directories(&self) -> Vec<String> {
        let mut dirs = std::collections::BTreeSet::new();
        for path in self.files.keys().chain(self.symlinks.keys()) {
            let mut current = path.as_str();
            while let Some((parent, _)) = current.rsplit_once('/') {
                if !dirs.insert(parent.to_string()) {
                    break;
                }
                current = parent;
            }
        }
        dirs.into_iter().collect()
    }

    pub fn is_dir(&self, dir: &str) -> bool {
        let prefix = dir_prefix(dir);
        prefix.is_empty()
            || self
                .files
                .range(prefix.clone()..)
                .next()
                .is_some_and(|(p, _)| p.starts_with(&prefix))
    }

    /// A digest of every file below `dir`: equal digests mean equal trees.
    pub fn digest_under(&self, dir: &str) -> String {
        let mut hasher = Sha256::new();
        let prefix = dir_prefix(dir);
        for (path, content) in self.files_under(dir) {
            hasher.update(&path.as_bytes()[prefix.len()..]);
            hasher.update([0]);
            hasher.update((content.len() as u64).to_le_bytes());
            hasher.update(content);
        }
        hex(&hasher.finalize())
    }

    /// The tree written to a temporary directory, once per snapshot (helm and kustomize need
    /// files on disk). Symbolic links are not written.
    pub fn materialized_root(&self) -> Result<Arc<tempfile::TempDir>, GitError> {
        let result = self.materialized.get_or_init(|| {
            let dir = crate::scratch::dir("tree").map_err(|e| e.to_string())?;
            for (path, content) in &self.files {
                let target = dir.path().join(path);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| format!("{path}: {e}"))?;
                }
                std::fs::write(&target, content).map_err(|e| format!("{path}: {e}"))?;
            }
            Ok(Arc::new(dir))
        });
        result.clone().map_err(|message| GitError::Materialize {
            commit: self.commit.clone(),
            dir: std::env::temp_dir().display().to_string(),
            source: std::io::Error::other(message),
        })
    }
}

/// A file over [`crate::yaml::MAX_FILE_BYTES`], refused by the size git reports.
fn too_large(repo: &Path, commit: &str, path: &str, size: u64) -> GitError {
    GitError::TooLarge {
        repo: repo.display().to_string(),
        commit: commit[..commit.len().min(12)].to_string(),
        path: path.chars().take(200).collect(),
        size,
        limit_mib: crate::yaml::MAX_FILE_BYTES >> 20,
    }
}

fn dir_prefix(dir: &str) -> String {
    let dir = normalize(dir);
    if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

fn cat_blobs<'a>(
    repo: &Path,
    oids: impl Iterator<Item = &'a str>,
) -> Result<Vec<Vec<u8>>, GitError> {
    // Each distinct object is asked for once: a fleet repository holds hundreds of files with
    // the same content (one values file per cluster), and each ask is a lookup and an inflate.
    let asked: Vec<&str> = oids.collect();
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut oids: Vec<String> = Vec::new();
    let order: Vec<usize> = asked
        .iter()
        .map(|oid| {
            *at.entry(oid).or_insert_with(|| {
                oids.push(oid.to_string());
                oids.len() - 1
            })
        })
        .collect();
    if oids.is_empty() {
        return Ok(Vec::new());
    }
    let repo_name = repo.display().to_string();
    let mut child = git(repo)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| GitError::Spawn {
            repo: repo_name.clone(),
            source,
        })?;
    let mut stdin = child.stdin.take().ok_or_else(|| GitError::Protocol {
        repo: repo_name.clone(),
        detail: "no stdin".into(),
    })?;
    let request: String = oids.iter().map(|o| format!("{o}\n")).collect();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(request.as_bytes());
    });
    let stdout = child.stdout.take().ok_or_else(|| GitError::Protocol {
        repo: repo_name.clone(),
        detail: "no stdout".into(),
    })?;
    let mut reader = BufReader::new(stdout);
    let mut contents = Vec::with_capacity(oids.len());
    for oid in &oids {
        let mut header = String::new();
        reader
            .read_line(&mut header)
            .map_err(|e| GitError::Protocol {
                repo: repo_name.clone(),
                detail: e.to_string(),
            })?;
        let size: usize = header
            .trim_end()
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| GitError::Protocol {
                repo: repo_name.clone(),
                detail: format!("bad header for {oid}: {header:?}"),
            })?;
        // Never allocated past the budget, whatever the object database says.
        if size as u64 > crate::yaml::MAX_FILE_BYTES {
            let _ = child.kill();
            let _ = child.wait();
            return Err(GitError::Protocol {
                repo: repo_name.clone(),
                detail: format!(
                    "object {oid} is {size} bytes, over the {} MiB a repository file may hold",
                    crate::yaml::MAX_FILE_BYTES >> 20
                ),
            });
        }
        let mut content = vec![0; size + 1];
        reader
            .read_exact(&mut content)
            .map_err(|e| GitError::Protocol {
                repo: repo_name.clone(),
                detail: e.to_string(),
            })?;
        content.truncate(size);
        contents.push(content);
    }
    let _ = writer.join();
    let _ = child.wait();
    // Each path gets its object's content; the last path to use an object takes it.
    let mut last_use = vec![0; contents.len()];
    for (position, &i) in order.iter().enumerate() {
        last_use[i] = position;
    }
    let mut contents: Vec<Option<Vec<u8>>> = contents.into_iter().map(Some).collect();
    Ok(order
        .iter()
        .enumerate()
        .map(|(position, &i)| {
            if last_use[i] == position {
                contents[i].take().unwrap_or_default()
            } else {
                contents[i].clone().unwrap_or_default()
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_full_lowercase_commit_id_is_one() {
        let sha1 = "0123456789abcdef0123456789abcdef01234567";
        assert!(is_commit_id(sha1));
        assert!(is_commit_id(&"a".repeat(64)));
        for not in [
            "",
            "main",
            "HEAD~1",
            &sha1[..12],
            &sha1.to_uppercase(),
            &format!("{sha1}\n"),
            &format!("-{}", &sha1[1..]),
            &"g".repeat(40),
            &"a".repeat(41),
        ] {
            assert!(!is_commit_id(not), "{not:?}");
        }
        let err = ensure_commit(Path::new("."), "--upload-pack=touch x").unwrap_err();
        assert!(err.to_string().contains("not a commit id"), "{err}");
    }

    #[test]
    fn credentials_are_taken_out_of_remote_urls() {
        assert_eq!(
            without_credentials("https://x-access-token:ghs_abc@github.com/o/r.git"),
            "https://github.com/o/r.git"
        );
        assert_eq!(
            without_credentials("https://github.com/o/r.git"),
            "https://github.com/o/r.git"
        );
        assert_eq!(
            without_credentials("git@github.com:o/r.git"),
            "git@github.com:o/r.git"
        );
    }

    #[test]
    fn a_revision_that_reads_as_an_option_is_refused_before_git_runs() {
        // No repository is needed: the refusal comes first.
        for revision in ["--output=/tmp/x", "-h", ""] {
            let err = resolve_commit(Path::new("/nonexistent"), revision).unwrap_err();
            assert!(err.to_string().contains("not a revision"), "{err}");
        }
    }

    /// git in `repo` as a test's author; returns what it printed, trimmed.
    fn git_in(repo: &Path) -> impl Fn(&[&str]) -> String + '_ {
        move |args| {
            let out = git(repo)
                .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        }
    }

    #[test]
    fn files_that_share_content_each_get_it_and_others_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        let git = git_in(repo);
        git(&["init", "-q"]);
        for (path, text) in [
            ("a.yaml", "same: 1\n"),
            ("b/c.yaml", "other: 2\n"),
            ("d.yaml", "same: 1\n"),
            ("e.yaml", ""),
            ("f.yaml", ""),
        ] {
            let file = repo.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        git(&["add", "-A"]);
        git(&["commit", "-qm", "files"]);
        let snapshot = Snapshot::load(repo, "HEAD").unwrap();
        assert_eq!(snapshot.read_string("a.yaml").unwrap(), "same: 1\n");
        assert_eq!(snapshot.read_string("b/c.yaml").unwrap(), "other: 2\n");
        assert_eq!(snapshot.read_string("d.yaml").unwrap(), "same: 1\n");
        assert_eq!(snapshot.read_string("e.yaml").unwrap(), "");
        assert_eq!(snapshot.read_string("f.yaml").unwrap(), "");
    }

    #[test]
    fn a_full_id_loads_as_the_commit_it_names_or_tags() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        let git = git_in(repo);
        git(&["init", "-q"]);
        std::fs::write(repo.join("a.yaml"), "a: 1\n").unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", "a"]);
        let commit = git(&["rev-parse", "HEAD"]);
        let by_id = Snapshot::load(repo, &commit).unwrap();
        assert_eq!(by_id.commit, commit);
        assert_eq!(by_id.read_string("a.yaml").unwrap(), "a: 1\n");
        assert_eq!(by_id.commit, Snapshot::load(repo, "HEAD").unwrap().commit);
        // An annotated tag's own id names the commit it tags.
        git(&["tag", "-a", "v1", "-m", "v1"]);
        let tag = git(&["rev-parse", "v1"]);
        assert_ne!(tag, commit);
        assert_eq!(Snapshot::load(repo, &tag).unwrap().commit, commit);
        // A full id that is a tree or a blob, or no object at all, is no commit.
        let tree = git(&["rev-parse", "HEAD^{tree}"]);
        let blob = git(&["rev-parse", "HEAD:a.yaml"]);
        for id in [tree, blob, "0".repeat(40)] {
            let err = Snapshot::load(repo, &id).unwrap_err();
            assert!(
                matches!(err, GitError::UnknownRevision { .. }),
                "{id}: {err}"
            );
        }
    }

    #[test]
    fn the_runner_runs_no_hook_monitor_driver_or_transport_a_repository_names() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (repo, marks) = (dir.path().join("repo"), dir.path().join("marks"));
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::create_dir_all(&marks).unwrap();
        let git = git_in(&repo);
        git(&["init", "-q"]);
        std::fs::write(repo.join(".gitattributes"), "* filter=x diff=x\n").unwrap();
        std::fs::write(repo.join("a.yaml"), "a: 1\n").unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", "a"]);
        let program = dir.path().join("mark");
        std::fs::write(
            &program,
            format!("#!/bin/sh\ntouch '{}/ran'\nexec cat\n", marks.display()),
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let program = program.display().to_string();
        for (key, value) in [
            ("core.fsmonitor", program.as_str()),
            ("filter.x.smudge", &program),
            ("filter.x.clean", &program),
            ("filter.x.required", "true"),
            ("diff.x.textconv", &program),
            ("protocol.allow", "always"),
            ("remote.origin.url", "ext::sh -c touch% marks/ran"),
        ] {
            git(&["config", key, value]);
        }
        for hook in ["post-checkout", "reference-transaction", "pre-commit"] {
            std::fs::copy(&program, repo.join(".git/hooks").join(hook)).unwrap();
        }
        std::fs::remove_file(repo.join("a.yaml")).unwrap();
        let run = |args: &[&str]| git_in(&repo)(args);
        run(&["checkout", "--quiet", "--force", "--detach", "HEAD"]);
        std::fs::write(repo.join("a.yaml"), "a: 2\n").unwrap();
        run(&["add", "a.yaml"]);
        run(&["commit", "-qm", "b"]);
        run(&["update-ref", "refs/heads/b", "HEAD"]);
        run(&["status", "--porcelain"]);
        let fetch = crate::git::git(&repo)
            .args(["fetch", "origin"])
            .output()
            .unwrap();
        assert!(!fetch.status.success());
        assert!(
            String::from_utf8_lossy(&fetch.stderr).contains("not allowed"),
            "{fetch:?}"
        );
        assert_eq!(std::fs::read_dir(&marks).unwrap().count(), 0);
    }

    #[test]
    fn directories_and_files_under() {
        let mut files = BTreeMap::new();
        files.insert("a/b/c.yaml".to_string(), b"x".to_vec());
        files.insert("a/d.yaml".to_string(), b"y".to_vec());
        files.insert("ab.yaml".to_string(), b"z".to_vec());
        let snap = Snapshot::from_files("0", files);
        assert_eq!(snap.directories(), vec!["a", "a/b"]);
        let under: Vec<_> = snap.files_under("a").map(|(p, _)| p).collect();
        assert_eq!(under, vec!["a/b/c.yaml", "a/d.yaml"]);
        assert!(snap.is_dir("a/b"));
        assert!(!snap.is_dir("a/b/c.yaml"));
    }

    #[test]
    fn repo_urls_compare_loosely() {
        let a = normalize_repo_url("https://Git.Example.test/platform/gitops.git");
        assert_eq!(a, normalize_repo_url("git.example.test/platform/gitops/"));
        assert_eq!(
            a,
            normalize_repo_url("ssh://git@git.example.test/platform/gitops")
        );
        assert_eq!(
            a,
            normalize_repo_url("git@git.example.test:platform/gitops.git")
        );
        assert_ne!(
            a,
            normalize_repo_url("https://git.example.test/platform/other")
        );
    }
}
