//! The gate's temporary folders, named for their owner: `gate-<pid>.<start>-<what>-XXXXXX` under
//! the temp dir, where `<start>` is the process's start time (`/proc/<pid>/stat`, clock ticks
//! since boot). A run that is killed (SIGKILL, the OOM killer) cannot remove its folders, which
//! hold a pull request's files; a later run removes those whose owner is gone (no process of
//! that PID, or one started at another time: a reused PID). Only folders of exactly that shape,
//! directly under the temp dir, are removed, and a symbolic link is never followed.

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

/// `gate-<pid>.<start>-`: this process's prefix.
fn owner() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| {
        let start = start_time("self").unwrap_or(0);
        format!("gate-{}.{start}-", std::process::id())
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
    let Some((pid, start)) = owner.split_once('.') else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
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
        // file_type() does not follow a link.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || !is_leftover(name) {
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
        assert!(
            is_leftover("gate-4194309.1-tree-abc"),
            "a PID above pid_max"
        );
        let pid = std::process::id();
        assert!(
            is_leftover(&format!("gate-{pid}.1-tree-abc")),
            "a reused PID: another start time"
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
