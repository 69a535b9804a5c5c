//! Git for a triage: Bosun's checkouts (`Checkouts`), credentials given to one git process at a
//! time, commit as Bosun and push without force.

use std::path::{Path, PathBuf};

use super::{TriageError, scrubbed};
use crate::bosun::applier::Rewrite;
use crate::bosun::config::Config;
use crate::forge::RepoSlug;
use crate::git::{Git, GitError};

/// git on the checkout: nothing of the repository's configuration, hooks or attributes runs
/// and no transport is allowed ([`crate::git::Git::local`]).
pub(super) fn git(dir: &Path, args: &[&str]) -> Result<String, TriageError> {
    git_as(dir, args, Access::Local)
}

/// Whether a git command talks to the forge, and with which credentials.
enum Access<'a> {
    Local,
    /// The forge's URL, user name and token, when Bosun has a token.
    Remote(Option<(&'a str, &'a str, &'a str)>),
}

/// The credential helper of one git process: it answers `get` with the user name and the token
/// from that process's environment, so the token is never in `.git/config`, a URL or a file,
/// and only for the forge's own protocol and host (not a redirect's or a submodule's). The
/// empty `credential.helper=` before it drops every helper a user or system configured (a
/// `store` helper would write the token to disk).
pub(super) const CREDENTIAL_HELPER: &str = "credential.helper=!f() { test \"$1\" = get || exit 0; h=; p=; while IFS= read -r line; do case \"$line\" in host=*) h=\"${line#host=}\";; protocol=*) p=\"${line#protocol=}\";; esac; done; test \"$h\" = \"$BOSUN_GIT_HOST\" && test \"$p\" = \"$BOSUN_GIT_PROTOCOL\" || exit 0; echo \"username=$BOSUN_GIT_USERNAME\"; echo \"password=$BOSUN_GIT_TOKEN\"; }; f";

/// git with Bosun's token given through [`CREDENTIAL_HELPER`] when a remote call has
/// credentials.
fn git_as(dir: &Path, args: &[&str], access: Access<'_>) -> Result<String, TriageError> {
    let (mut command, credentials) = match access {
        Access::Local => (Git::local(dir), None),
        Access::Remote(credentials) => (Git::remote(dir), credentials),
    };
    if let Some((url, username, token)) = credentials {
        let (protocol, rest) = url.split_once("://").unwrap_or(("", url));
        let host = rest.split('/').next().unwrap_or("");
        command = command
            .args(&["-c", "credential.helper=", "-c", CREDENTIAL_HELPER])
            .env("BOSUN_GIT_HOST", host)
            .env("BOSUN_GIT_PROTOCOL", protocol)
            .env("BOSUN_GIT_USERNAME", username)
            .env("BOSUN_GIT_TOKEN", token)
            .env("GIT_TERMINAL_PROMPT", "0");
    }
    command
        .args(args)
        .literal_pathspecs()
        .run_text()
        .map_err(|e| match e {
            GitError::Spawn { source, .. } => TriageError::Git(format!("cannot run git: {source}")),
            GitError::Command { stderr, .. } => {
                // Never echo a URL with a token in it.
                let args: Vec<&str> = args
                    .iter()
                    .map(|a| if a.contains('@') { "<url>" } else { a })
                    .collect();
                TriageError::Git(format!("git {} failed: {stderr}", args.join(" ")))
            }
            other => TriageError::Git(other.to_string()),
        })
}

/// `sha` checked out detached and clean in `checkout` (nothing of an earlier repair left).
pub(super) fn detach_clean(checkout: &Path, sha: &str) -> Result<(), TriageError> {
    git(
        checkout,
        &["checkout", "--quiet", "--force", "--detach", sha],
    )?;
    git(checkout, &["clean", "--quiet", "-fdx"])?;
    Ok(())
}

/// Where the checkout of `slug` lives: `<workdir>/checkouts/<owner>/<name>`, a namespace of
/// subgroups in one folder (`platform%2Fteam/gitops`).
fn checkout_dir(workdir: &Path, slug: &RepoSlug) -> PathBuf {
    workdir
        .join("checkouts")
        .join(slug.owner.replace('/', "%2F"))
        .join(&slug.name)
}

/// Bosun's clones of its repositories, `<workdir>/checkouts/<owner>/<name>`, and the git it runs
/// on them: the forge's token goes to a git process that talks to the forge, and to no other.
/// A GitLab namespace of subgroups is one folder, its slashes written `%2F` (as GitLab's API
/// writes them; `%` is in no repository path): no checkout is ever inside another's work tree
/// (`platform/team` beside `platform/team/gitops`).
pub(super) struct Checkouts<'a> {
    pub(super) config: &'a Config,
    pub(super) workdir: &'a Path,
    /// Bosun's forge token (for git over HTTPS; empty when there is none).
    pub(super) token: &'a str,
}

impl Checkouts<'_> {
    fn dir(&self, slug: &RepoSlug) -> PathBuf {
        checkout_dir(self.workdir, slug)
    }

    /// A clone of the repository, fetched up to date.
    pub(super) fn fetch(&self, slug: &RepoSlug) -> Result<PathBuf, TriageError> {
        let dir = self.dir(slug);
        let remote = self.config.git_remote(slug);
        if !dir.join(".git").exists() {
            std::fs::create_dir_all(&dir).map_err(|e| TriageError::Git(e.to_string()))?;
            git(&dir, &["init", "--quiet"])?;
            git(&dir, &["remote", "add", "origin", &remote.url])?;
        } else {
            // Also rewrites a URL an older Bosun stored with the token in it.
            git(&dir, &["remote", "set-url", "origin", &remote.url])?;
        }
        self.remote(
            &dir,
            &[
                "fetch",
                "--quiet",
                "--prune",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
            ],
            slug,
        )?;
        Ok(dir)
    }

    /// A git command that talks to the forge: the token goes to that process only.
    fn remote(&self, dir: &Path, args: &[&str], slug: &RepoSlug) -> Result<String, TriageError> {
        let remote = self.config.git_remote(slug);
        let credentials = remote
            .username
            .as_deref()
            .filter(|_| !self.token.is_empty())
            .map(|user| (remote.url.as_str(), user, self.token));
        git_as(dir, args, Access::Remote(credentials)).map_err(|e| scrubbed(e, self.token))
    }

    /// Commits the written rewrites as Bosun. Returns the commit.
    pub(super) fn commit(
        &self,
        checkout: &Path,
        rewrites: &[Rewrite],
        message: &str,
    ) -> Result<String, TriageError> {
        let identity = &self.config.commit;
        let mut add = vec!["add", "--"];
        add.extend(rewrites.iter().map(|r| r.path.as_str()));
        git(checkout, &add)?;
        let args = identity.commit_args(message);
        git(
            checkout,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )?;
        git(checkout, &["rev-parse", "HEAD"])
    }

    /// Whether `head` is a commit Bosun made (committed with its identity): a repair it
    /// pushed, whichever run or process pushed it. Unknown (git cannot read it) is `false`.
    /// A person can forge the identity; that only keeps the model's summary off the head.
    pub(super) fn own_repair(&self, checkout: &Path, head: &str) -> bool {
        let identity = &self.config.commit;
        git(checkout, &["log", "-1", "--format=%cn%x00%ce", head, "--"]).is_ok_and(|out| {
            out.split_once('\0')
                .is_some_and(|(name, email)| name == identity.name && email == identity.email)
        })
    }

    /// Pushes the checkout's HEAD to `branch` without force; a failed push puts the checkout
    /// back on `head`.
    pub(super) fn push(
        &self,
        slug: &RepoSlug,
        checkout: &Path,
        branch: &str,
        head: &str,
    ) -> Result<(), TriageError> {
        // No force: if the branch moved since the gate read it, the push fails and the
        // branch stays as it is.
        if let Err(e) = self.remote(
            checkout,
            &[
                "push",
                "--quiet",
                "origin",
                &format!("HEAD:refs/heads/{branch}"),
            ],
            slug,
        ) {
            git(
                checkout,
                &["checkout", "--quiet", "--force", "--detach", head],
            )?;
            return Err(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A project in a subgroup has a checkout of its own, never inside the checkout of a
    /// project whose path is a prefix of its own.
    #[test]
    fn a_subgroups_checkout_is_never_inside_another() {
        let workdir = Path::new("/work");
        let slug = |path: &str| crate::forge::gitlab::project_path(path).unwrap();
        assert_eq!(
            checkout_dir(workdir, &slug("platform/gitops")),
            Path::new("/work/checkouts/platform/gitops"),
            "a group's project keeps its folder"
        );
        let paths = [
            "platform/team",
            "platform/team/gitops",
            "platform/team/gitops/deeper",
            "platform/team%2Fgitops",
        ];
        let dirs: Vec<PathBuf> = paths[..3]
            .iter()
            .map(|p| checkout_dir(workdir, &slug(p)))
            .collect();
        assert_eq!(dirs[1], Path::new("/work/checkouts/platform%2Fteam/gitops"));
        for (i, a) in dirs.iter().enumerate() {
            assert_eq!(
                a.parent().and_then(Path::parent),
                Some(Path::new("/work/checkouts"))
            );
            for (j, b) in dirs.iter().enumerate() {
                assert!(
                    i == j || !b.starts_with(a),
                    "{} holds {}",
                    a.display(),
                    b.display()
                );
            }
        }
        // `%` is in no GitLab path, so no project's folder is another namespace's.
        assert!(crate::forge::gitlab::project_path(paths[3]).is_err());
    }
}
