//! Kustomize sources as Argo CD's repo-server builds them (argo-cd v3.5
//! `util/kustomize/kustomize.go`): the job, its build folder with the Application's
//! options written into the kustomization, and its cache key. `tree` keeps the build inside
//! the materialised tree.

mod tree;

pub use tree::*;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::git::hex;
use crate::paths::normalize;
use crate::render::source::{KustomizeJob, non_empty};
use crate::yaml;

impl KustomizeJob {
    /// A digest of every input of this build but the tools, which are one per run (the
    /// persistent cache adds their versions, `RenderCache::entry`).
    pub fn render_key(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"kustomize-v1\0");
        // A kustomization can reach anywhere in the repository: key on the whole tree.
        hasher.update(self.snapshot.digest_under("").as_bytes());
        hasher.update(self.path.as_bytes());
        hasher.update(b"\0");
        hasher.update(self.options.to_string().as_bytes());
        // The charts `helmCharts` inflate come from the mirror, not the tree.
        for chart in &self.charts {
            hasher.update(b"\0chart\0");
            hasher.update((chart.len() as u64).to_le_bytes());
            hasher.update(chart.as_bytes());
        }
        hex(&hasher.finalize())
    }

    /// The directory to build. With `kustomize` options, Argo CD runs `kustomize edit set ...`
    /// on the kustomization; the gate does the same edits on a copy placed beside the original
    /// (same depth, so relative references still resolve), leaving the shared tree untouched.
    pub fn build_dir(&self, root: &Path, copy_id: &str) -> Result<BuildDir, String> {
        let target = root.join(&self.path);
        let options = match &self.options {
            Value::Object(m) if m.values().any(|v| non_empty(Some(v))) => m,
            _ => {
                return Ok(BuildDir {
                    dir: target,
                    root: root.to_path_buf(),
                    _copy: None,
                });
            }
        };
        // The repository's root has no folder beside it inside the tree: the whole tree is
        // copied to a tree of its own (removed when the build is done).
        let (copy, build_root, tree) = if normalize(&self.path).is_empty() {
            let tree =
                crate::scratch::dir("tree").map_err(|e| format!("cannot copy the tree: {e}"))?;
            copy_dir(&target, tree.path())
                .map_err(|e| format!("{}: {e}", tree.path().display()))?;
            (
                tree.path().to_path_buf(),
                tree.path().to_path_buf(),
                Some(tree),
            )
        } else {
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| "root".into());
            let copy = target.with_file_name(format!("{name}.gate-{copy_id}"));
            copy_dir(&target, &copy).map_err(|e| format!("{}: {e}", copy.display()))?;
            (copy, root.to_path_buf(), None)
        };
        let file = super::kustomize::kustomization_file(&copy)
            .ok_or(format!("{}: no kustomization file", self.path))?;
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut kustomization =
            yaml::parse_document(&text, &format!("{}/kustomization.yaml", self.path))
                .map_err(|e| e.to_string())?;
        if !kustomization.is_object() {
            kustomization = json!({});
        }
        edit_kustomization(&mut kustomization, options);
        std::fs::remove_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let text = serde_json::to_string_pretty(&kustomization).map_err(|e| e.to_string())?;
        std::fs::write(copy.join("kustomization.yaml"), text)
            .map_err(|e| format!("{}: {e}", copy.display()))?;
        Ok(BuildDir {
            dir: copy,
            root: build_root,
            _copy: tree,
        })
    }
}

/// Where kustomize builds: the folder, the tree it must stay in, and the copy of the tree to
/// remove afterwards (when the source is the repository's root and carries options).
pub struct BuildDir {
    pub dir: PathBuf,
    pub root: PathBuf,
    _copy: Option<tempfile::TempDir>,
}

pub(crate) fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The edits `kustomize edit set|add ...` makes for each of a source's kustomize options.
fn edit_kustomization(kustomization: &mut Value, options: &serde_json::Map<String, Value>) {
    let Some(k) = kustomization.as_object_mut() else {
        return;
    };
    for field in ["namePrefix", "nameSuffix", "namespace"] {
        if let Some(Value::String(v)) = options.get(field).filter(|v| non_empty(Some(v))) {
            k.insert(field.to_string(), json!(v));
        }
    }
    for (option, field) in [
        ("commonLabels", "commonLabels"),
        ("commonAnnotations", "commonAnnotations"),
    ] {
        if let Some(Value::Object(add)) = options.get(option) {
            let entry = k.entry(field.to_string()).or_insert_with(|| json!({}));
            if let Value::Object(existing) = entry {
                for (key, value) in add {
                    existing.insert(key.clone(), value.clone());
                }
            }
        }
    }
    if let Some(Value::Array(images)) = options.get("images") {
        let entry = k.entry("images".to_string()).or_insert_with(|| json!([]));
        if let Value::Array(existing) = entry {
            for image in images
                .iter()
                .filter_map(Value::as_str)
                .map(parse_kustomize_image)
            {
                match existing
                    .iter_mut()
                    .find(|e| e.get("name") == image.get("name"))
                {
                    Some(found) => json_patch::merge(found, &image),
                    None => existing.push(image),
                }
            }
        }
    }
    if let Some(Value::Array(replicas)) = options.get("replicas") {
        let entry = k.entry("replicas".to_string()).or_insert_with(|| json!([]));
        if let Value::Array(existing) = entry {
            for replica in replicas {
                existing.retain(|e| e.get("name") != replica.get("name"));
                existing.push(replica.clone());
            }
        }
    }
    for field in ["components", "patches"] {
        if let Some(Value::Array(add)) = options.get(field) {
            let entry = k.entry(field.to_string()).or_insert_with(|| json!([]));
            if let Value::Array(existing) = entry {
                for item in add {
                    if !existing.contains(item) {
                        existing.push(item.clone());
                    }
                }
            }
        }
    }
}

fn parse_kustomize_image(spec: &str) -> Value {
    let (name, rest) = match spec.split_once('=') {
        Some((name, new)) => (name.to_string(), Some(new.to_string())),
        None => (String::new(), None),
    };
    let image = rest.clone().unwrap_or_else(|| spec.to_string());
    let (image_name, digest) = image
        .split_once('@')
        .map(|(n, d)| (n.to_string(), Some(d.to_string())))
        .unwrap_or((image.clone(), None));
    let (image_name, tag) = match image_name.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n.to_string(), Some(t.to_string())),
        _ => (image_name, None),
    };
    let mut out = serde_json::Map::new();
    if rest.is_some() {
        out.insert("name".into(), json!(name));
        out.insert("newName".into(), json!(image_name));
    } else {
        out.insert("name".into(), json!(image_name));
    }
    if let Some(tag) = tag {
        out.insert("newTag".into(), json!(tag));
    }
    if let Some(digest) = digest {
        out.insert("digest".into(), json!(digest));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kustomize_images() {
        assert_eq!(
            parse_kustomize_image("nginx:1.2"),
            json!({"name": "nginx", "newTag": "1.2"})
        );
        assert_eq!(
            parse_kustomize_image("nginx=ghcr.io/x/nginx:1.3"),
            json!({"name": "nginx", "newName": "ghcr.io/x/nginx", "newTag": "1.3"})
        );
    }
}
