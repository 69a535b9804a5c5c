//! Redis for Argo CD's cache, from Debian's packages: `apt-get download` fetches them (apt checks
//! them against the signed archive index) and `dpkg -x` unpacks them under `target/real/redis`,
//! so nothing is installed on the machine and no root is needed. `redis-server` is Debian's
//! link to `redis-check-rdb` (Redis picks its mode by the name it runs under).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::Layout;

/// The packages unpacked: the server and the two libraries it links that a Debian machine
/// without Redis lacks.
const PACKAGES: &[&str] = &["redis-tools", "libjemalloc2", "liblzf1"];

fn root(layout: &Layout) -> PathBuf {
    layout.root.join("redis")
}

/// The server binary.
pub fn server(layout: &Layout) -> PathBuf {
    root(layout).join("usr/bin/redis-server")
}

/// The folder its libraries are in (for `LD_LIBRARY_PATH`).
pub fn libraries(layout: &Layout) -> PathBuf {
    root(layout).join("usr/lib/x86_64-linux-gnu")
}

fn version(layout: &Layout) -> Option<String> {
    let output = Command::new(server(layout))
        .arg("--version")
        .env("LD_LIBRARY_PATH", libraries(layout))
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    (output.status.success() && text.starts_with("Redis server")).then(|| text.trim().to_string())
}

/// Unpacks Redis unless a working one is there; true when it did.
pub fn install(layout: &Layout) -> Result<bool> {
    if version(layout).is_some() {
        return Ok(false);
    }
    let scratch = layout.root.join(".redis.download");
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    let download = || {
        Command::new("apt-get")
            .arg("download")
            .args(PACKAGES)
            .current_dir(&scratch)
            .stdin(Stdio::null())
            .output()
            .context("run apt-get download (Redis comes from Debian's packages)")
    };
    let mut output = download()?;
    if !output.status.success() {
        // A machine whose package lists were never fetched knows no candidate version: fetch
        // them once and try again.
        let update = Command::new("apt-get")
            .args(["update", "-qq"])
            .stdin(Stdio::null())
            .output()
            .context("run apt-get update")?;
        if update.status.success() {
            output = download()?;
        }
    }
    if !output.status.success() {
        bail!(
            "apt-get download {}: {}",
            PACKAGES.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let unpacked = layout.root.join(".redis.unpacked");
    let _ = fs::remove_dir_all(&unpacked);
    fs::create_dir_all(&unpacked)?;
    for entry in fs::read_dir(&scratch)? {
        let deb = entry?.path();
        if deb.extension().is_none_or(|e| e != "deb") {
            continue;
        }
        let status = Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(&unpacked)
            .stdin(Stdio::null())
            .status()
            .context("run dpkg -x")?;
        if !status.success() {
            bail!("dpkg -x {} failed ({status})", deb.display());
        }
    }
    link(&unpacked.join("usr/bin/redis-server"))?;
    let _ = fs::remove_dir_all(root(layout));
    fs::rename(&unpacked, root(layout))?;
    let _ = fs::remove_dir_all(&scratch);
    if version(layout).is_none() {
        bail!(
            "{} does not run after unpacking Debian's {}",
            server(layout).display(),
            PACKAGES.join(", ")
        );
    }
    Ok(true)
}

fn link(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    std::os::unix::fs::symlink("redis-check-rdb", path)
        .with_context(|| format!("link {}", path.display()))
}
