//! Which git repository a source or generator reads, at which revision.
//!
//! The repository under test is read at the revision being rendered, whatever a source's
//! `targetRevision` says (a preview must show the pull request, not `main`). Any other
//! repository needs a local mirror (`--git-mirror URL=DIR`); there is no network.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::git::{GitError, Snapshot, normalize_repo_url};

pub struct RepoResolver {
    repo_url: Option<String>,
    main: Arc<Snapshot>,
    mirrors: Vec<(String, PathBuf)>,
    loaded: Mutex<HashMap<(String, String), Arc<Snapshot>>>,
}

impl RepoResolver {
    pub fn new(
        main: Arc<Snapshot>,
        repo_url: Option<String>,
        mirrors: Vec<(String, PathBuf)>,
    ) -> Self {
        RepoResolver {
            repo_url,
            main,
            mirrors,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    pub fn main(&self) -> &Arc<Snapshot> {
        &self.main
    }

    pub fn is_main(&self, url: &str) -> bool {
        self.repo_url
            .as_deref()
            .is_some_and(|main| normalize_repo_url(main) == normalize_repo_url(url))
    }

    /// The snapshot a `repoURL` + `targetRevision` reads.
    pub fn resolve(&self, url: &str, revision: &str) -> Result<Arc<Snapshot>, String> {
        if self.is_main(url) {
            return Ok(self.main.clone());
        }
        let wanted = normalize_repo_url(url);
        let Some((_, dir)) = self
            .mirrors
            .iter()
            .find(|(u, _)| normalize_repo_url(u) == wanted)
        else {
            return Err(format!(
                "repository {url} is not the repository under test ({}) and no --git-mirror was given for it",
                self.repo_url
                    .as_deref()
                    .unwrap_or("unknown: pass --repo-url")
            ));
        };
        let revision = if revision.is_empty() {
            "HEAD"
        } else {
            revision
        };
        let key = (wanted, revision.to_string());
        if let Some(found) = self.loaded.lock().map_err(|e| e.to_string())?.get(&key) {
            return Ok(found.clone());
        }
        let snapshot = Snapshot::load(dir, revision)
            .or_else(|e| match e {
                // A branch name in targetRevision is a remote branch in a mirror clone; when
                // neither is there, the error names the revision as the Application wrote it.
                GitError::UnknownRevision { .. } => {
                    Snapshot::load(dir, &format!("origin/{revision}")).map_err(
                        |second| match second {
                            GitError::UnknownRevision { .. } => e,
                            other => other,
                        },
                    )
                }
                other => Err(other),
            })
            .map_err(|e| format!("mirror of {url}: {e}"))?;
        let snapshot = Arc::new(snapshot);
        self.loaded
            .lock()
            .map_err(|e| e.to_string())?
            .insert(key, snapshot.clone());
        Ok(snapshot)
    }
}
