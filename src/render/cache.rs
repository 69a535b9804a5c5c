//! The persistent render cache: helm/kustomize output keyed by a digest of every input. The
//! disk is the first level; a second level (the gate's remote cache in object storage,
//! `crate::remote_cache`) may stand behind it through [`SecondLevel`], which the render defines
//! and never sees past.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::git::hex;

/// A cache level behind the disk: asked for the entries the disk lacks, offered the renders
/// that ran afresh. It answers only outputs it verified were stored for that entry by a writer
/// it trusts (anything else is its miss), and it never makes the render wait on a write.
pub trait SecondLevel: Send + Sync + std::fmt::Debug {
    /// The stored outputs of these entries ([`RenderCache::entry`]), in their order; `None`
    /// where it has none it believes.
    fn fetch(&self, entries: &[String]) -> Vec<Option<String>>;
    /// [`SecondLevel::fetch`], its answers handed to `each` as they arrive, a batch at a time:
    /// (the entry's index in `entries`, the answer), every entry once. By default in one batch.
    fn fetch_each(&self, entries: &[String], each: &mut dyn FnMut(Answers<String>)) {
        each(self.fetch(entries).into_iter().enumerate().collect())
    }
    /// The output of a render that ran afresh under `entry`; returns at once.
    fn offer(&self, entry: &str, text: String);
    /// Runs `work` (the disk's copy of what this level answered) off the render's path, to
    /// be waited for before the process exits, as its writes are; by default at once.
    fn in_background(&self, work: Box<dyn FnOnce() + Send>) {
        work()
    }
}

/// Answers by the index of their entry in what was asked.
pub type Answers<T> = Vec<(usize, Option<T>)>;

/// Which level answered a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Disk,
    Second,
}

#[derive(Debug, Clone, Default)]
pub struct RenderCache {
    dir: Option<PathBuf>,
    second: Option<Arc<dyn SecondLevel>>,
}

impl RenderCache {
    pub fn disabled() -> Self {
        RenderCache {
            dir: None,
            second: None,
        }
    }

    pub fn at(dir: PathBuf) -> Self {
        RenderCache {
            dir: Some(dir),
            second: None,
        }
    }

    /// This cache with `second` behind the disk.
    pub fn with_second_level(mut self, second: Arc<dyn SecondLevel>) -> Self {
        self.second = Some(second);
        self
    }

    /// `$GATE_CACHE_DIR`, else `$XDG_CACHE_HOME/gitops-gate`, else `~/.cache/gitops-gate`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("GATE_CACHE_DIR").filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(dir).join("gitops-gate"));
        }
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("gitops-gate"))
    }

    /// The entry of a render: its key (every input but the tools, `HelmJob::render_key`) and
    /// the versions of the tools that produce it, so a new helm or kubectl renders afresh.
    pub fn entry(key: &str, tools: &str) -> String {
        let mut hasher = Sha256::new();
        for field in ["render-cache-v2", tools, key] {
            hasher.update((field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
        hex(&hasher.finalize())
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(
            dir.join("render")
                .join(&key[..2.min(key.len())])
                .join(format!("{key}.yaml")),
        )
    }

    pub fn get(&self, key: &str) -> Option<String> {
        std::fs::read_to_string(self.path(key)?).ok()
    }

    /// The stored outputs of these entries, in their order, and the level that had each: the
    /// disk first; what it lacks is asked of the second level in one batch, and what that
    /// answers is written to the disk.
    pub fn lookup(&self, entries: &[String]) -> Vec<Option<(String, Level)>> {
        let found = self.find(entries);
        for (entry, found) in entries.iter().zip(&found) {
            if let Some((text, Level::Second)) = found {
                self.put(entry, text);
            }
        }
        found
    }

    /// [`RenderCache::lookup`] without the disk's copy of the second level's answers: the
    /// caller hands them to [`RenderCache::keep`] once it is done with them, so the render
    /// neither waits for those writes nor copies the outputs for them.
    pub fn find(&self, entries: &[String]) -> Vec<Option<(String, Level)>> {
        let mut found: Vec<Option<(String, Level)>> = entries.iter().map(|_| None).collect();
        self.find_each(entries, &mut |answers| {
            for (i, answer) in answers {
                found[i] = answer;
            }
        });
        found
    }

    /// [`RenderCache::find`], each answer handed to `each` as it comes: the disk's in one
    /// batch, then the second level's (asked in one batch for what the disk lacks) as they
    /// arrive; every entry once.
    pub fn find_each(&self, entries: &[String], each: &mut dyn FnMut(Answers<(String, Level)>)) {
        let mut disk = Vec::new();
        let mut missing = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            match self.get(entry) {
                Some(text) => disk.push((i, Some((text, Level::Disk)))),
                None => missing.push(i),
            }
        }
        let Some(second) = self.second.as_ref().filter(|_| !missing.is_empty()) else {
            disk.extend(missing.into_iter().map(|i| (i, None)));
            each(disk);
            return;
        };
        if !disk.is_empty() {
            each(disk);
        }
        let asked: Vec<String> = missing.iter().map(|&i| entries[i].clone()).collect();
        second.fetch_each(&asked, &mut |answers| {
            each(
                answers
                    .into_iter()
                    .filter_map(|(j, text)| {
                        Some((*missing.get(j)?, text.map(|text| (text, Level::Second))))
                    })
                    .collect(),
            )
        });
    }

    /// Writes the second level's answers ([`RenderCache::find`]: entry, output) to the disk,
    /// off the caller's path ([`SecondLevel::in_background`]).
    pub fn keep(&self, answers: Vec<(String, String)>) {
        let (Some(second), Some(dir)) = (&self.second, &self.dir) else {
            return;
        };
        if answers.is_empty() {
            return;
        }
        let disk = RenderCache::at(dir.clone());
        second.in_background(Box::new(move || {
            for (entry, text) in answers {
                disk.put(&entry, &text);
            }
        }));
    }

    /// Stores a render that ran afresh: on the disk, and offered to the second level.
    pub fn store(&self, entry: &str, text: String) {
        self.put(entry, &text);
        if let Some(second) = &self.second {
            second.offer(entry, text);
        }
    }

    /// Stores a render; a failure to write only costs a re-render next time.
    pub fn put(&self, key: &str, text: &str) {
        let Some(path) = self.path(key) else { return };
        let Some(parent) = path.parent() else { return };
        if std::fs::create_dir_all(parent).is_err() {
            return;
        }
        // Write to a temporary file and rename, so a reader never sees half an entry.
        if let Ok(mut file) = tempfile::NamedTempFile::new_in(parent) {
            use std::io::Write;
            if file.write_all(text.as_bytes()).is_ok() {
                let _ = file.persist(&path);
            }
        }
    }
}

/// A digest of every file below `dir` (relative paths and contents).
pub fn digest_dir(dir: &Path) -> Result<String, String> {
    digest_and_bytes(dir).map(|(digest, _)| digest)
}

/// [`digest_dir`], and the bytes of the files it read: what a render of the chart there
/// costs, roughly (`jobs::longest_first`).
pub fn digest_and_bytes(dir: &Path) -> Result<(String, u64), String> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    files.sort();
    let mut hasher = Sha256::new();
    let mut bytes: u64 = 0;
    for relative in files {
        let content = std::fs::read(dir.join(&relative)).unwrap_or_default();
        hasher.update(relative.as_bytes());
        hasher.update([0]);
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(&content);
        bytes = bytes.saturating_add(content.len() as u64);
    }
    Ok((hex(&hasher.finalize()), bytes))
}

/// The bytes of the files below `dir`, from their metadata (nothing is read): a chart's cost
/// for the shards' dealing ([`super::key_weight`]). A directory [`digest_dir`] refuses (a
/// symbolic link inside) or cannot list counts as empty; its render says why.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut files = Vec::new();
    if collect(dir, dir, &mut files).is_err() {
        return 0;
    }
    files
        .iter()
        .filter_map(|relative| std::fs::symlink_metadata(dir.join(relative)).ok())
        .map(|metadata| metadata.len())
        .fold(0, u64::saturating_add)
}

/// The files below `dir`; a symbolic link anywhere is refused (helm would follow it out of
/// the chart, to any file on the machine).
fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if kind.is_symlink() {
            return Err(format!(
                "{} is a symbolic link inside a chart; the gate never follows one",
                path.display()
            ));
        }
        if kind.is_dir() {
            collect(root, &path, out)?;
        } else if let Ok(relative) = path.strip_prefix(root) {
            out.push(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chart's bytes are its files' sizes, read from their metadata; a chart with a
    /// symbolic link inside (which its digest refuses) weighs nothing.
    #[test]
    fn a_charts_bytes_are_its_files_and_nothing_through_a_link() {
        let chart = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(chart.path().join("templates")).unwrap();
        std::fs::write(chart.path().join("Chart.yaml"), "x".repeat(100)).unwrap();
        std::fs::write(chart.path().join("templates/a.yaml"), "y".repeat(50)).unwrap();
        assert_eq!(dir_bytes(chart.path()), 150);
        std::os::unix::fs::symlink("/etc/hostname", chart.path().join("templates/l")).unwrap();
        assert_eq!(dir_bytes(chart.path()), 0);
        assert_eq!(dir_bytes(&chart.path().join("absent")), 0);
    }

    #[test]
    fn an_entry_changes_with_the_tools_and_keeps_its_fields_apart() {
        let key = "0123abcd";
        assert_eq!(
            RenderCache::entry(key, "helm v4.1.4"),
            RenderCache::entry(key, "helm v4.1.4")
        );
        assert_ne!(
            RenderCache::entry(key, "helm v4.1.4"),
            RenderCache::entry(key, "helm v4.1.5")
        );
        // Joined without lengths, both would hash "...cab".
        assert_ne!(
            RenderCache::entry("ab", "c"),
            RenderCache::entry("b", "ca"),
            "a byte moved from the key to the tools is another entry"
        );
        // A stored render is read back under its entry only.
        let dir = tempfile::tempdir().unwrap();
        let cache = RenderCache::at(dir.path().to_path_buf());
        cache.put(&RenderCache::entry(key, "helm v4.1.4"), "kind: A\n");
        assert_eq!(
            cache
                .get(&RenderCache::entry(key, "helm v4.1.4"))
                .as_deref(),
            Some("kind: A\n")
        );
        assert_eq!(cache.get(&RenderCache::entry(key, "helm v4.1.5")), None);
    }

    /// A second level that holds what it is given and records what it is asked.
    #[derive(Debug, Default)]
    struct Remote {
        held: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
        asked: std::sync::Mutex<Vec<Vec<String>>>,
    }

    impl SecondLevel for Remote {
        fn fetch(&self, entries: &[String]) -> Vec<Option<String>> {
            self.asked.lock().unwrap().push(entries.to_vec());
            let held = self.held.lock().unwrap();
            entries.iter().map(|e| held.get(e).cloned()).collect()
        }
        fn offer(&self, entry: &str, text: String) {
            self.held.lock().unwrap().insert(entry.to_string(), text);
        }
    }

    #[test]
    fn the_second_level_answers_what_the_disk_lacks_and_fills_the_disk() {
        let remote = Arc::new(Remote::default());
        let writer_disk = tempfile::tempdir().unwrap();
        let writer =
            RenderCache::at(writer_disk.path().to_path_buf()).with_second_level(remote.clone());
        writer.store("a", "kind: A\n".into());
        assert_eq!(
            writer.get("a").as_deref(),
            Some("kind: A\n"),
            "the disk too"
        );
        // A new runner: an empty disk, the same second level.
        let reader_disk = tempfile::tempdir().unwrap();
        let reader =
            RenderCache::at(reader_disk.path().to_path_buf()).with_second_level(remote.clone());
        reader.put("b", "kind: B\n");
        let entries = ["a".to_string(), "b".to_string(), "c".to_string()];
        assert_eq!(
            reader.lookup(&entries),
            vec![
                Some(("kind: A\n".to_string(), Level::Second)),
                Some(("kind: B\n".to_string(), Level::Disk)),
                None
            ]
        );
        assert_eq!(
            remote.asked.lock().unwrap().last().unwrap(),
            &vec!["a".to_string(), "c".to_string()],
            "only what the disk lacks, in one batch"
        );
        // The second level's answer is on the disk now: asked again, the disk answers.
        assert_eq!(
            reader.lookup(&entries[..1]),
            vec![Some(("kind: A\n".to_string(), Level::Disk))]
        );
        assert_eq!(remote.asked.lock().unwrap().len(), 1);
    }

    #[test]
    fn answers_come_as_they_arrive_each_once_and_are_kept_on_the_disk_when_handed_back() {
        let remote = Arc::new(Remote::default());
        remote.offer("a", "kind: A\n".into());
        remote.offer("c", "kind: C\n".into());
        let disk = tempfile::tempdir().unwrap();
        let cache = RenderCache::at(disk.path().to_path_buf()).with_second_level(remote.clone());
        cache.put("b", "kind: B\n");
        let entries = ["a", "b", "c", "d"].map(String::from);
        let mut batches = Vec::new();
        cache.find_each(&entries, &mut |answers| batches.push(answers));
        assert_eq!(
            batches,
            vec![
                vec![(1, Some(("kind: B\n".to_string(), Level::Disk)))],
                vec![
                    (0, Some(("kind: A\n".to_string(), Level::Second))),
                    (2, Some(("kind: C\n".to_string(), Level::Second))),
                    (3, None)
                ],
            ],
            "the disk's first, then the second level's, each entry once"
        );
        // `find` leaves the disk to `keep`.
        assert_eq!(cache.find(&entries)[0].as_ref().unwrap().1, Level::Second);
        cache.keep(vec![("a".into(), "kind: A\n".into())]);
        assert_eq!(cache.get("a").as_deref(), Some("kind: A\n"));
    }

    #[test]
    fn a_symbolic_link_in_a_chart_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("templates")).unwrap();
        std::fs::write(dir.path().join("Chart.yaml"), "name: x").unwrap();
        assert!(digest_dir(dir.path()).is_ok());
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("templates/x.yaml")).unwrap();
        let err = digest_dir(dir.path()).unwrap_err();
        assert!(err.contains("symbolic link inside a chart"), "{err}");
    }
}
