//! Real git, run as a process: the forge double keeps real bare repositories.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Runs git with a fixed identity and dates taken from the environment; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=Proving Ground",
            "-c",
            "user.email=ground@example.test",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        // Fixed dates: the same scenario makes the same commits, so transcripts are stable.
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .output()
        .with_context(|| format!("cannot run git in {}", dir.display()))?;
    if !output.status.success() {
        bail!(
            "git {} in {}: {}",
            args.join(" "),
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The commit a ref or sha names, if any.
pub fn rev_parse(dir: &Path, reference: &str) -> Option<String> {
    // The doubles ask for their branches' heads on nearly every request (about 190 times a
    // story): read the ref as git stores it rather than start a process each time. Anything
    // the reader is not sure of (not found, a symbolic or odd ref) goes to git itself.
    read_branch_ref(dir, reference).or_else(|| git_rev_parse(dir, reference))
}

/// The commit `reference` names, as `git rev-parse` answers.
fn git_rev_parse(dir: &Path, reference: &str) -> Option<String> {
    git(
        dir,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{reference}^{{commit}}"),
        ],
    )
    .ok()
    .filter(|s| !s.is_empty())
}

/// The commit id `refs/heads/NAME` holds in a repository of git's files ref backend: the
/// loose ref file, else its line in `packed-refs`. `None` for anything else (a name git's
/// check-ref-format would refuse or that could leave `refs/`, a symbolic ref, a reftable
/// repository, a missing branch): the caller asks git. Git writes both files by lock file
/// and rename, so a read sees a whole ref.
fn read_branch_ref(dir: &Path, reference: &str) -> Option<String> {
    let name = reference.strip_prefix("refs/heads/")?;
    let plain = name.split('/').all(|part| {
        !part.is_empty()
            && !part.starts_with('.')
            && !part.ends_with(".lock")
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    }) && !name.contains("..");
    if !plain {
        return None;
    }
    let is_commit_id = |text: &str| text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit());
    // A repository's folder (`.git` in a work tree, the folder itself when bare).
    let git_dir = [dir.join(".git"), dir.to_path_buf()]
        .into_iter()
        .find(|d| d.join("refs").is_dir() && d.join("HEAD").is_file())?;
    if let Ok(text) = std::fs::read_to_string(git_dir.join("refs/heads").join(name)) {
        let text = text.trim_end();
        return is_commit_id(text).then(|| text.to_string());
    }
    let packed = std::fs::read_to_string(git_dir.join("packed-refs")).ok()?;
    // `<id> <name>` lines; `#` headers and `^<peeled>` lines never match a branch's name.
    packed
        .lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(id, full)| *full == reference && is_commit_id(id))
        .map(|(id, _)| id.to_string())
}

/// Creates a bare repository whose `main` holds the files of `content` (one commit).
pub fn init_bare_from(bare: &Path, content: &Path, message: &str) -> Result<String> {
    std::fs::create_dir_all(bare)?;
    git(
        bare,
        &["init", "--quiet", "--bare", "--initial-branch=main"],
    )?;
    let work = tempfile_dir()?;
    copy_tree(content, work.path())?;
    git(work.path(), &["init", "--quiet", "--initial-branch=main"])?;
    git(work.path(), &["add", "-A"])?;
    git(work.path(), &["commit", "--quiet", "-m", message])?;
    let url = format!("file://{}", bare.display());
    git(work.path(), &["push", "--quiet", &url, "main"])?;
    rev_parse(bare, "refs/heads/main").context("main after push")
}

pub fn tempfile_dir() -> Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new().prefix("ground-").tempdir()?)
}

pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Merges `head` into `base_branch` of a bare repository with a merge commit, as GitHub's
/// "Create a merge commit" does. Returns the merge commit, or None on a conflict.
pub fn merge_into(
    bare: &Path,
    base_branch: &str,
    head: &str,
    message: &str,
) -> Result<Option<String>> {
    let base = rev_parse(bare, &format!("refs/heads/{base_branch}")).context("base branch")?;
    let output = Command::new("git")
        .arg("-C")
        .arg(bare)
        .args(["merge-tree", "--write-tree", &base, head])
        .output()?;
    if !output.status.success() {
        return Ok(None);
    }
    let tree = String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let commit = git(
        bare,
        &["commit-tree", &tree, "-p", &base, "-p", head, "-m", message],
    )?;
    git(
        bare,
        &[
            "update-ref",
            &format!("refs/heads/{base_branch}"),
            &commit,
            &base,
        ],
    )?;
    Ok(Some(commit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_is_read_as_git_reads_it_loose_or_packed_and_odd_names_go_to_git() {
        let content = tempfile_dir().unwrap();
        std::fs::write(content.path().join("a.txt"), "a").unwrap();
        let root = tempfile_dir().unwrap();
        let bare = root.path().join("r.git");
        let main = init_bare_from(&bare, content.path(), "first").unwrap();
        git(&bare, &["update-ref", "refs/heads/feature/x", &main]).unwrap();
        for name in ["refs/heads/main", "refs/heads/feature/x"] {
            assert_eq!(
                read_branch_ref(&bare, name),
                git_rev_parse(&bare, name),
                "{name}"
            );
            assert_eq!(read_branch_ref(&bare, name).as_deref(), Some(main.as_str()));
        }
        git(&bare, &["pack-refs", "--all"]).unwrap();
        assert!(!bare.join("refs/heads/main").exists(), "packed");
        assert_eq!(
            read_branch_ref(&bare, "refs/heads/main").as_deref(),
            Some(main.as_str())
        );
        assert_eq!(
            rev_parse(&bare, "refs/heads/main").as_deref(),
            Some(main.as_str())
        );
        // Missing, outside refs/heads, escaping or odd: not read here (git answers).
        for name in [
            "refs/heads/nope",
            "main",
            "refs/heads/../../HEAD",
            "refs/heads/../config",
            "refs/heads/.hidden",
            "refs/heads/a.lock",
            "refs/heads/a//b",
            "refs/heads/",
        ] {
            assert_eq!(read_branch_ref(&bare, name), None, "{name}");
        }
        assert_eq!(rev_parse(&bare, "refs/heads/nope"), None);
        assert_eq!(rev_parse(&bare, &main).as_deref(), Some(main.as_str()));
    }
}
