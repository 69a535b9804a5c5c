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
