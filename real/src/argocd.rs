//! Argo CD on the process cluster: Redis, the repo-server, the API server, the
//! applicationset-controller and the application-controller, each a process of the upstream
//! multicall binary built from `real/go/argocd-programs`, in namespace `argocd`.
//!
//! How they run out of a cluster (read from Argo CD's source, and its own local-run Procfile):
//! - the in-cluster destination (`https://kubernetes.default.svc`) is the process cluster: with
//!   `ARGOCD_FAKE_IN_CLUSTER=true` Argo CD takes it from `KUBECONFIG`;
//! - the applicationset-controller's manager reads only `KUBECONFIG` (controller-runtime
//!   ignores the `--kubeconfig` flag), and registers no health check, so its readiness is its
//!   metrics endpoint;
//! - the repo-server needs no API access; it finds `git`, `helm` and `kustomize` on PATH (there
//!   is no flag), so PATH starts with a folder of links to the pinned helm and the kustomize
//!   built here; GPG is off (it is on by default and needs a keyring folder);
//! - `argocd-cm` must carry the label `app.kubernetes.io/part-of: argocd` to be seen at all,
//!   and `argocd-secret` must exist; the API server writes its key there and creates the
//!   `default` AppProject;
//! - the API server runs with `--insecure` (no TLS) on loopback, with authentication on: it
//!   makes a random admin password on first start, in the Secret `argocd-initial-admin-secret`,
//!   and the tests log in with it; every listener (API, metrics, webhooks) is on 127.0.0.1;
//! - Redis asks for a random password (written to a 0600 config file, handed to Argo CD's
//!   programs as `REDIS_PASSWORD`), so another local user can neither read nor rewrite the cache;
//! - the application-controller is not started: nothing here syncs yet (the oracle compares
//!   renders), and it binds its metrics to every interface with no flag to change it
//!   (`controller/appcontroller.go`, `0.0.0.0:%d`).

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::{Layout, State, Tools, free_ports, kubectl_run, redis, start_component};

/// Where the tests reach Argo CD.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ArgoCd {
    /// The Argo CD version running (the multicall binary's).
    pub version: String,
    /// The API server (`http://127.0.0.1:N`, no TLS; log in as `admin` with the password in
    /// the Secret `argocd-initial-admin-secret`).
    pub api: String,
    /// The namespace Argo CD's objects live in.
    pub namespace: String,
    /// The repo-server's gRPC address (plaintext).
    pub repo_server: String,
}

/// The version `real/go/argocd-programs` pins.
pub const VERSION: &str = "v3.2.11";
pub const NAMESPACE: &str = "argocd";

pub(crate) fn start(layout: &Layout, state: &mut State, tools: &Tools, admin: &Path) -> Result<()> {
    let root = layout.root.join("argocd");
    remove_tree(&root)?;
    let tmp = root.join("tmp");
    let path_dir = root.join("path");
    // What the API server serves as static assets: nothing (its default would be a folder of
    // the machine's, and `root` holds the clones and the config).
    let assets = root.join("static");
    fs::create_dir_all(&tmp)?;
    fs::create_dir_all(&path_dir)?;
    fs::create_dir_all(&assets)?;
    let bin = layout.bin();
    let shown = |p: &Path| p.display().to_string();
    // What the repo-server runs: the gate's pinned helm, the kustomize built here, the
    // machine's git.
    for (name, target) in [
        ("helm", tools.helm.clone()),
        ("kustomize", bin.join("kustomize")),
    ] {
        std::os::unix::fs::symlink(&target, path_dir.join(name))
            .with_context(|| format!("link {name} for the repo-server"))?;
    }
    // An empty global git config: git's own ownership check stays on (no `safe.directory`).
    let gitconfig = root.join("gitconfig");
    fs::write(&gitconfig, "")?;
    let redis_password = random_hex(16)?;
    let path_var = format!("PATH={}:/usr/local/bin:/usr/bin:/bin", shown(&path_dir));

    apply_objects(&root, &tools.kubectl, admin)?;

    let [
        redis_port,
        repo_port,
        repo_metrics,
        api_port,
        api_metrics,
        appset_metrics,
        appset_webhook,
    ] = free_ports()?;
    let redis_address = format!("127.0.0.1:{redis_port}");
    let env = |extra: &[String]| -> Vec<String> {
        let mut argv = vec![
            "/usr/bin/env".to_string(),
            format!("HOME={}", shown(&root)),
            format!("TMPDIR={}", shown(&tmp)),
            path_var.clone(),
            format!("GIT_CONFIG_GLOBAL={}", shown(&gitconfig)),
            "GIT_CONFIG_NOSYSTEM=1".into(),
            format!("KUBECONFIG={}", shown(admin)),
            "ARGOCD_FAKE_IN_CLUSTER=true".into(),
            "ARGOCD_GPG_ENABLED=false".into(),
            format!("ARGOCD_ASK_PASS_SOCK={}", shown(&root.join("askpass.sock"))),
            format!("REDIS_PASSWORD={redis_password}"),
        ];
        argv.extend_from_slice(extra);
        argv
    };
    let kube = |name: &str| -> Vec<String> {
        vec![
            shown(&bin.join(name)),
            format!("--kubeconfig={}", shown(admin)),
            format!("--namespace={NAMESPACE}"),
            "--loglevel=info".into(),
        ]
    };

    start_redis(layout, state, &root, redis_port, &redis_password)?;

    let repo_server = format!("127.0.0.1:{repo_port}");
    let mut argv = env(&[]);
    argv.extend([
        shown(&bin.join("argocd-repo-server")),
        "--address=127.0.0.1".into(),
        format!("--port={repo_port}"),
        "--metrics-address=127.0.0.1".into(),
        format!("--metrics-port={repo_metrics}"),
        format!("--redis={redis_address}"),
        "--disable-tls".into(),
        "--loglevel=info".into(),
    ]);
    start_component(
        layout,
        state,
        "argocd-repo-server",
        argv,
        format!("http://127.0.0.1:{repo_metrics}/healthz"),
    )?;

    let mut argv = env(&[]);
    argv.extend(kube("argocd-server"));
    argv.extend([
        "--address=127.0.0.1".into(),
        format!("--port={api_port}"),
        "--metrics-address=127.0.0.1".into(),
        format!("--metrics-port={api_metrics}"),
        "--insecure".into(),
        format!("--repo-server={repo_server}"),
        "--repo-server-plaintext".into(),
        format!("--redis={redis_address}"),
        // No SSO: nothing to proxy to.
        "--dex-server=http://127.0.0.1:1".into(),
        format!("--staticassets={}", shown(&assets)),
    ]);
    let api = format!("http://127.0.0.1:{api_port}");
    start_component(
        layout,
        state,
        "argocd-server",
        argv,
        format!("{api}/healthz"),
    )?;

    let mut argv = env(&[]);
    argv.extend(kube("argocd-applicationset-controller"));
    argv.extend([
        format!("--metrics-addr=127.0.0.1:{appset_metrics}"),
        "--probe-addr=0".into(),
        format!("--webhook-addr=127.0.0.1:{appset_webhook}"),
        format!("--argocd-repo-server={repo_server}"),
        "--repo-server-plaintext".into(),
    ]);
    start_component(
        layout,
        state,
        "argocd-applicationset-controller",
        argv,
        format!("http://127.0.0.1:{appset_metrics}/metrics"),
    )?;

    state.argocd = Some(ArgoCd {
        version: VERSION.to_string(),
        api,
        namespace: NAMESPACE.to_string(),
        repo_server,
    });
    Ok(())
}

/// Argo CD's namespace, with the ConfigMap and Secret its programs read, applied
/// server-side.
fn apply_objects(root: &Path, kubectl: &Path, admin: &Path) -> Result<()> {
    let objects = root.join("objects.json");
    fs::write(
        &objects,
        serde_json::json!({
            "apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "argocd-cm", "namespace": NAMESPACE,
                              "labels": {"app.kubernetes.io/part-of": "argocd"}},
                 "data": {}},
                {"apiVersion": "v1", "kind": "Secret",
                 "metadata": {"name": "argocd-secret", "namespace": NAMESPACE,
                              "labels": {"app.kubernetes.io/part-of": "argocd"}}}
            ]
        })
        .to_string(),
    )?;
    kubectl_run(
        kubectl,
        admin,
        &[
            "apply",
            "--server-side",
            "--field-manager=real-cluster",
            "-f",
            &objects.display().to_string(),
        ],
    )?;
    Ok(())
}

/// Redis on loopback with a password, no persistence; the password in a file only this user
/// reads, not on a command line `ps` shows.
fn start_redis(
    layout: &Layout,
    state: &mut State,
    root: &Path,
    port: u16,
    password: &str,
) -> Result<()> {
    let shown = |p: &Path| p.display().to_string();
    let redis_conf = root.join("redis.conf");
    write_private(
        &redis_conf,
        &format!(
            "bind 127.0.0.1\nport {port}\nrequirepass {password}\n\
             save \"\"\nappendonly no\ndir {}\n",
            shown(root)
        ),
    )?;
    let argv = vec![
        "/usr/bin/env".to_string(),
        format!("LD_LIBRARY_PATH={}", shown(&redis::libraries(layout))),
        shown(&redis::server(layout)),
        shown(&redis_conf),
    ];
    start_component(
        layout,
        state,
        "redis",
        argv,
        format!("redis://127.0.0.1:{port}"),
    )
}

/// Removes a folder and everything in it, first giving this user back the folders it made
/// unreadable: the repo-server keeps its clones under a 0300 folder
/// (`reposerver/repository/repository.go`), which `remove_dir_all` cannot list as non-root.
pub(crate) fn remove_tree(root: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fn open_up(dir: &Path) -> std::io::Result<()> {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                open_up(&entry.path())?;
            }
        }
        Ok(())
    }
    match fs::symlink_metadata(root) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("read {}", root.display())),
        Ok(meta) if meta.is_dir() => {
            open_up(root).with_context(|| format!("open up {}", root.display()))?
        }
        Ok(_) => {}
    }
    fs::remove_dir_all(root).with_context(|| format!("remove {}", root.display()))
}

/// A file only this user can read, created so (never world-readable for a moment).
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("write {}", path.display()))
}

/// `bytes` random bytes from the kernel, as hex.
fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buffer = vec![0u8; bytes];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buffer))
        .context("read /dev/urandom")?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}
