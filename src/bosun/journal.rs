//! Bosun's durable state: every accepted delivery and every tracked pull request is a small
//! file in the work folder, written atomically (temporary file, fsync, rename, fsync of the
//! folder) before the intake answers. A restart replays what is there; nothing accepted is lost
//! with the process.
//!
//! Two more kinds guard against a pull request that kills the process: an `attempt-` entry is
//! written (durably) before a triage starts and removed when it ends, so one still there at
//! start names a triage a process died in; after [`CRASHES_BEFORE_QUARANTINE`] of them the
//! delivery is `quarantined-`: handed to a person and never replayed.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Triages of one head that a process died in before a delivery is quarantined.
pub const CRASHES_BEFORE_QUARANTINE: u32 = 2;

/// One pull request and the head it was delivered (or last triaged) at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    pub repository: String,
    pub pull_request: u64,
    pub head: String,
    /// `attempt-`: triages of this head started and not (yet) ended; `quarantined-`: the
    /// triages the process died in.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// `tracked-`: when the head last changed (Unix seconds; 0 in older entries: unknown).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub since: u64,
    /// `quarantined-`: the pull request has been told (hand-off comment, label, status).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub announced: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Accepted and not yet triaged to the end.
    Pending,
    /// Open and followed by the poller.
    Tracked,
    /// A triage started and not ended: written before it starts, removed when it ends.
    Attempt,
    /// A triage the process died in too often: never replayed, released by a person.
    Quarantined,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Pending => "pending-",
            Kind::Tracked => "tracked-",
            Kind::Attempt => "attempt-",
            Kind::Quarantined => "quarantined-",
        }
    }
}

#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
}

impl Journal {
    /// The journal in `dir` (created, owner-only).
    pub fn open(dir: &Path) -> std::io::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(Journal {
            dir: dir.to_path_buf(),
        })
    }

    /// The file of one pull request's entry of a kind (named in logs and /jobs, so a person
    /// can find and delete it).
    pub fn file(&self, kind: Kind, repository: &str, pull_request: u64) -> PathBuf {
        let digest = Sha256::digest(format!("{repository}#{pull_request}").as_bytes());
        self.dir.join(format!(
            "{}{}.json",
            kind.prefix(),
            hex::encode(&digest[..12])
        ))
    }

    /// Records `entry` (replacing the one of the same pull request); durable when it returns.
    pub fn put(&self, kind: Kind, entry: &Entry) -> std::io::Result<()> {
        let target = self.file(kind, &entry.repository, entry.pull_request);
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(&serde_json::to_vec(entry).map_err(std::io::Error::other)?)?;
        file.as_file().sync_all()?;
        file.persist(&target).map_err(|e| e.error)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// The entry of one pull request, if there is one that parses.
    pub fn get(&self, kind: Kind, repository: &str, pull_request: u64) -> Option<Entry> {
        let bytes = std::fs::read(self.file(kind, repository, pull_request)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Forgets the entry of one pull request.
    pub fn remove(&self, kind: Kind, repository: &str, pull_request: u64) -> std::io::Result<()> {
        match std::fs::remove_file(self.file(kind, repository, pull_request)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => std::fs::File::open(&self.dir)?.sync_all(),
        }
    }

    /// Every entry of a kind. A file that does not parse is renamed `*.bad` (kept for a person,
    /// never replayed) and reported.
    pub fn load(&self, kind: Kind) -> std::io::Result<Vec<Entry>> {
        let mut entries = Vec::new();
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(kind.prefix()) && n.ends_with(".json"))
            })
            .collect();
        names.sort();
        for path in names {
            let parsed = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Entry>(&bytes).ok());
            match parsed {
                Some(entry) => entries.push(entry),
                None => {
                    tracing::warn!(
                        "{}: not a journal entry; renamed to .bad and not replayed",
                        path.display()
                    );
                    let _ = std::fs::rename(&path, path.with_extension("bad"));
                }
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pr: u64, head: &str) -> Entry {
        Entry {
            repository: "platform/gitops".into(),
            pull_request: pr,
            head: head.into(),
            ..Entry::default()
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_the_newest_head_replaces_the_older() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        journal.put(Kind::Pending, &entry(7, "aaa")).unwrap();
        journal.put(Kind::Pending, &entry(7, "bbb")).unwrap();
        journal.put(Kind::Pending, &entry(8, "ccc")).unwrap();
        journal.put(Kind::Tracked, &entry(7, "aaa")).unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        let mut pending = journal.load(Kind::Pending).unwrap();
        pending.sort_by_key(|e| e.pull_request);
        assert_eq!(pending, [entry(7, "bbb"), entry(8, "ccc")]);
        assert_eq!(journal.load(Kind::Tracked).unwrap(), [entry(7, "aaa")]);
        journal.remove(Kind::Pending, "platform/gitops", 7).unwrap();
        journal
            .remove(Kind::Pending, "platform/gitops", 99)
            .unwrap();
        assert_eq!(journal.load(Kind::Pending).unwrap(), [entry(8, "ccc")]);
    }

    #[test]
    fn a_damaged_entry_is_set_aside_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        std::fs::write(dir.path().join("pending-x.json"), b"{\"repo").unwrap();
        assert!(journal.load(Kind::Pending).unwrap().is_empty());
        assert!(dir.path().join("pending-x.bad").exists());
    }
}
