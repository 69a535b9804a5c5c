//! The persistent render cache: helm/kustomize output keyed by a digest of every input.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::git::hex;

#[derive(Debug, Clone, Default)]
pub struct RenderCache {
    dir: Option<PathBuf>,
}

impl RenderCache {
    pub fn disabled() -> Self {
        RenderCache { dir: None }
    }

    pub fn at(dir: PathBuf) -> Self {
        RenderCache { dir: Some(dir) }
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
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    files.sort();
    let mut hasher = Sha256::new();
    for relative in files {
        let content = std::fs::read(dir.join(&relative)).unwrap_or_default();
        hasher.update(relative.as_bytes());
        hasher.update([0]);
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(&content);
    }
    Ok(hex(&hasher.finalize()))
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
