//! The gate's temporary folders, named for their owner: `gate-<pid>.<start>.<ns>-<what>-XXXXXX`
//! under the temp dir, where `<start>` is the process's start time (`/proc/<pid>/stat`, clock
//! ticks since boot) and `<ns>` its PID namespace (the inode of `/proc/self/ns/pid`): a PID
//! means nothing in another namespace, so two containers sharing one temp dir never sweep each
//! other's live folders. A run that is killed (SIGKILL, the OOM killer) cannot remove its folders, which
//! hold a pull request's files; a later run removes those whose owner is gone (no process of
//! that PID, or one started at another time: a reused PID), in this PID namespace, and owned by
//! this user. Only folders of exactly that shape, directly under the temp dir, are removed, and
//! a symbolic link is never followed.

use std::path::Path;
use std::sync::OnceLock;

/// A process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or
/// `None` when there is no such process (or no `/proc`).
fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything: fields are counted
    // after its closing one.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's PID namespace: the inode `/proc/self/ns/pid` names (`pid:[4026531836]`), or
/// 0 when it cannot be read.
fn pid_namespace() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .and_then(|l| {
                let l = l.to_string_lossy().to_string();
                l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
            })
            .unwrap_or(0)
    })
}

/// `gate-<pid>.<start>.<ns>-`: this process's prefix.
fn owner() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| {
        let start = start_time("self").unwrap_or(0);
        format!("gate-{}.{start}.{}-", std::process::id(), pid_namespace())
    })
}

/// A new temporary folder for `what` (`tree`, `render`, `helm`), carrying this process's name.
pub fn dir(what: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("{}{what}-", owner()))
        .tempdir()
}

/// Whether a folder name is an owned folder whose owner is gone.
fn is_leftover(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("gate-") else {
        return false;
    };
    let Some((owner, _)) = rest.split_once('-') else {
        return false;
    };
    let mut parts = owner.split('.');
    let (Some(pid), Some(start), Some(ns), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Ok(pid), Ok(start), Ok(ns)) =
        (pid.parse::<u32>(), start.parse::<u64>(), ns.parse::<u64>())
    else {
        return false;
    };
    // Another PID namespace's PIDs cannot be looked up from here: keep its folders.
    if ns == 0 || ns != pid_namespace() {
        return false;
    }
    if pid == 0 || !Path::new("/proc/self/stat").exists() {
        // Without /proc nothing can be told: keep everything.
        return false;
    }
    match start_time(&pid.to_string()) {
        None => true,
        Some(now) => now != start,
    }
}

/// Removes the folders under `root` that killed runs left; returns how many. Never follows a
/// symbolic link (a link of that name is left alone), never touches another name.
pub fn sweep(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // file_type() does not follow a link; a folder of another user is never ours.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || !is_leftover(name) {
            continue;
        }
        use std::os::unix::fs::MetadataExt;
        let mine = entry
            .metadata()
            .is_ok_and(|m| m.uid() == rustix::process::getuid().as_raw());
        if !mine {
            continue;
        }
        // remove_dir_all removes links inside, never what they point at.
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) => tracing::debug!("cannot remove {}: {e}", entry.path().display()),
        }
    }
    removed
}

/// [`sweep`] of the temp dir, once per process.
pub fn sweep_temp_dir() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let removed = sweep(&std::env::temp_dir());
        if removed > 0 {
            tracing::info!("removed {removed} temporary folders of killed gate runs");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_owned_folders_of_gone_owners_are_leftovers() {
        let own = owner().trim_end_matches('-').to_string();
        assert!(
            !is_leftover(&format!("{own}-tree-abc")),
            "this process's own"
        );
        let ns = pid_namespace();
        assert!(
            is_leftover(&format!("gate-4194309.1.{ns}-tree-abc")),
            "a PID above pid_max"
        );
        let pid = std::process::id();
        assert!(
            is_leftover(&format!("gate-{pid}.1.{ns}-tree-abc")),
            "a reused PID: another start time"
        );
        assert!(
            !is_leftover(&format!("gate-4194309.1.{}-tree-abc", ns + 1)),
            "another PID namespace's folder is kept: its PIDs mean nothing here"
        );
        assert!(
            !is_leftover("gate-4194309.1-tree-abc"),
            "a name without a namespace is kept"
        );
        for other in [
            "gate-tree-abc",
            "gate-abc.1-tree",
            "gate-4194309-tree",
            "other-4194309.1-tree",
            "gate-4194309.x-tree",
        ] {
            assert!(!is_leftover(other), "{other}");
        }
    }
}
