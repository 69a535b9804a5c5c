//! The credentials: secrets made for `up`, the logins file it writes, read back by `play`.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{CLUSTER, CONTEXT, GITEA_ADMIN, GITEA_LOCAL, STAGED, Secret, relative};

fn random_hex(bytes: usize) -> Result<String> {
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buffer))
        .context("reading /dev/urandom")?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

pub(super) fn credentials_path(root: &Path) -> PathBuf {
    root.join(STAGED).join("credentials")
}

/// The Gitea admin password `up` wrote to target/kind/credentials (what `play` pushes and
/// merges with).
pub(super) fn existing(root: &Path) -> Result<HashMap<Secret, String>> {
    let path = credentials_path(root);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: no credentials; run `cargo xtask kind up` first",
            relative(root, &path)
        )
    })?;
    let password = text
        .lines()
        .find(|line| line.starts_with("Gitea "))
        .and_then(|line| line.rsplit_once("password "))
        .map(|(_, password)| password.trim().to_string())
        .filter(|password| !password.is_empty())
        .with_context(|| format!("{}: no Gitea password line", relative(root, &path)))?;
    Ok(HashMap::from([(Secret::GiteaPassword, password)]))
}

/// Writes the logins to target/kind/credentials (readable by the user only).
pub(super) fn write_credentials(root: &Path, text: &str) -> Result<()> {
    let path = credentials_path(root);
    std::fs::create_dir_all(root.join(STAGED))?;
    let _ = std::fs::remove_file(&path);
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?
    };
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Generates every secret a plan needs but the captured ones, and the text of the logins file.
/// The Kargo admin password is random; the chart gets its bcrypt hash (cost 10, as Kargo's docs
/// make it with `htpasswd -bnBC 10`).
pub(super) fn generate() -> Result<(HashMap<Secret, String>, String)> {
    let kargo_password = random_hex(16)?;
    let gitea_password = random_hex(16)?;
    let hash = bcrypt::hash(&kargo_password, 10).context("hashing the Kargo admin password")?;
    let logins = format!(
        "# Logins of the kind cluster {CLUSTER}, written by `cargo xtask kind up`. Keep private.\n\
         Argo CD  http://127.0.0.1:31080  user admin, password: kubectl --context {CONTEXT} --namespace argocd get secret argocd-initial-admin-secret --output jsonpath='{{.data.password}}' | base64 -d\n\
         Kargo    http://127.0.0.1:31081  user admin, password {kargo_password}\n\
         Gitea    {GITEA_LOCAL}  user {GITEA_ADMIN}, password {gitea_password}\n"
    );
    let values = HashMap::from([
        (Secret::KargoPasswordHash, hash),
        (Secret::KargoTokenSigningKey, random_hex(32)?),
        (Secret::GiteaPassword, gitea_password),
        (Secret::BosunWebhook, random_hex(32)?),
    ]);
    Ok((values, logins))
}
