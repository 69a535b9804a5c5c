//! Finding the real `helm` and `kubectl` binaries, and saying which one is used.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use super::confine::{ConfineError, Confined, Limits, Output};

/// A tool's version, asked once per process, and whether a background ask was started.
type VersionCell = Arc<(OnceLock<String>, AtomicBool)>;

/// Where a tool was found, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSource {
    Flag,
    Environment,
    ProjectTools,
    Path,
}

impl std::fmt::Display for ToolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToolSource::Flag => "command-line flag",
            ToolSource::Environment => "environment",
            ToolSource::ProjectTools => "cargo xtask tools",
            ToolSource::Path => "PATH",
        })
    }
}

#[derive(Debug, Clone)]
pub struct Tool {
    pub name: &'static str,
    pub path: PathBuf,
    pub source: ToolSource,
    /// The deadline, memory ceiling and output cap every call of this tool runs under.
    pub limits: Limits,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "no {name} found: tried {tried}; run `cargo xtask tools` to install the pinned {name}, or pass --{name} PATH / set {env}"
)]
pub struct ToolNotFound {
    pub name: &'static str,
    pub env: &'static str,
    pub tried: String,
}

/// The folder `cargo xtask tools` installs into, relative to the workspace.
pub const PROJECT_TOOLS_DIR: &str = "target/tools";

fn project_tool_candidates(name: &str) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    // A binary built in this workspace sits in target/<profile>/; the tools sit in target/tools/.
    if let Ok(exe) = std::env::current_exe() {
        for ancestor in exe.ancestors().skip(1).take(3) {
            if ancestor.file_name().is_some_and(|n| n == "target") {
                candidates.push(ancestor.join("tools").join(name));
            }
        }
    }
    candidates.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(PROJECT_TOOLS_DIR)
            .join(name),
    );
    candidates
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds `name` from a flag, an environment variable, the project's tools folder, then `PATH`.
/// A flag or variable that names a missing binary is an error, not a reason to look elsewhere.
pub fn find_tool(
    name: &'static str,
    flag: Option<&Path>,
    env: &'static str,
) -> Result<Tool, ToolNotFound> {
    let env_value = std::env::var_os(env)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    find_tool_in(
        name,
        flag,
        env,
        env_value.as_deref(),
        &project_tool_candidates(name),
        &path_var,
    )
}

fn find_tool_in(
    name: &'static str,
    flag: Option<&Path>,
    env: &'static str,
    env_value: Option<&Path>,
    project: &[PathBuf],
    path_var: &std::ffi::OsStr,
) -> Result<Tool, ToolNotFound> {
    let not_found = |tried: String| ToolNotFound { name, env, tried };
    if let Some(path) = flag {
        if is_executable(path) {
            return Ok(Tool {
                name,
                path: path.to_path_buf(),
                source: ToolSource::Flag,
                limits: Limits::default(),
            });
        }
        return Err(not_found(format!(
            "--{name} {} (not an executable file)",
            path.display()
        )));
    }
    if let Some(path) = env_value {
        if is_executable(path) {
            return Ok(Tool {
                name,
                path: path.to_path_buf(),
                source: ToolSource::Environment,
                limits: Limits::default(),
            });
        }
        return Err(not_found(format!(
            "${env}={} (not an executable file)",
            path.display()
        )));
    }
    let mut tried = Vec::new();
    for path in project {
        if is_executable(path) {
            return Ok(Tool {
                name,
                path: path.clone(),
                source: ToolSource::ProjectTools,
                limits: Limits::default(),
            });
        }
        tried.push(path.display().to_string());
    }
    for dir in std::env::split_paths(path_var) {
        let path = dir.join(name);
        if is_executable(&path) {
            return Ok(Tool {
                name,
                path,
                source: ToolSource::Path,
                limits: Limits::default(),
            });
        }
    }
    tried.push("PATH".to_string());
    Err(not_found(tried.join(", ")))
}

impl Tool {
    /// A confined call of this tool (scrubbed environment, no network, [`Limits`]) with its
    /// per-user state in `home`, so a user's own repositories, plugins and credentials never
    /// change or see a render.
    pub fn confined(&self, home: &Path) -> Confined {
        Confined::new(&self.path, home)
    }

    /// Runs a confined call under this tool's limits.
    pub fn run(&self, call: Confined) -> Result<Output, ConfineError> {
        call.run(&self.limits)
    }

    /// The tool's version (`v4.1.4`; part of every disk cache entry of its renders and of
    /// messages). Asked once per process and path: `kubectl version` alone costs about 0.2 s,
    /// and a check renders three times. Different tools are asked at the same time; two asks
    /// of one tool wait for the first.
    pub fn version(&self) -> String {
        self.version_cell()
            .0
            .get_or_init(|| self.ask_version())
            .clone()
    }

    /// Asks the version in the background, so that a later [`Tool::version`] finds it asked
    /// (or waits for the ask already under way) rather than starting it then. Only the first
    /// call for a tool starts a thread.
    pub fn prefetch_version(&self) {
        if self
            .version_cell()
            .1
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let tool = self.clone();
        std::thread::spawn(move || tool.version());
    }

    /// The process-wide cell of this tool's version, and whether a prefetch started.
    fn version_cell(&self) -> VersionCell {
        static VERSIONS: std::sync::Mutex<Option<HashMap<PathBuf, VersionCell>>> =
            std::sync::Mutex::new(None);
        let mut versions = VERSIONS.lock().unwrap_or_else(|p| p.into_inner());
        versions
            .get_or_insert_with(Default::default)
            .entry(self.path.clone())
            .or_default()
            .clone()
    }

    fn ask_version(&self) -> String {
        let args: &[&str] = if self.name == "helm" {
            &["version", "--short"]
        } else {
            &["version", "--client", "-o", "json"]
        };
        Command::new(&self.path)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                let text = String::from_utf8_lossy(&o.stdout).to_string();
                if self.name == "helm" {
                    text.trim().to_string()
                } else {
                    serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| {
                            v.pointer("/clientVersion/gitVersion")
                                .and_then(|s| s.as_str().map(str::to_string))
                        })
                        .unwrap_or_else(|| text.trim().to_string())
                }
            })
            .unwrap_or_else(|| "unknown".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_choices_must_exist() {
        let err = find_tool_in(
            "helm",
            Some(Path::new("/nope/helm")),
            "GATE_HELM",
            None,
            &[],
            "".as_ref(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no helm found: tried --helm /nope/helm (not an executable file); run `cargo xtask tools` to install the pinned helm, or pass --helm PATH / set GATE_HELM"
        );
        let err = find_tool_in(
            "helm",
            None,
            "GATE_HELM",
            Some(Path::new("/nope/h")),
            &[],
            "".as_ref(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("$GATE_HELM=/nope/h"));
    }

    #[test]
    fn falls_back_to_project_tools_then_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = find_tool_in(
            "helm",
            None,
            "GATE_HELM",
            None,
            &[dir.path().join("helm")],
            dir.path().as_os_str(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("PATH"), "{err}");
        let helm = dir.path().join("helm");
        std::fs::write(&helm, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&helm, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found =
            find_tool_in("helm", None, "GATE_HELM", None, &[], dir.path().as_os_str()).unwrap();
        assert_eq!(found.source, ToolSource::Path);
        let found = find_tool_in(
            "helm",
            None,
            "GATE_HELM",
            None,
            std::slice::from_ref(&helm),
            "".as_ref(),
        )
        .unwrap();
        assert_eq!(found.source, ToolSource::ProjectTools);
    }
}
