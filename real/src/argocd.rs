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
//! - the API server runs with `--insecure --disable-auth` on loopback: the tests read it
//!   without a login, as any local process could; nothing here is meant to be reachable from
//!   elsewhere.

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
    /// The API server (`http://127.0.0.1:N`, no TLS, no authentication).
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
    let _ = fs::remove_dir_all(&root);
    let tmp = root.join("tmp");
    let path_dir = root.join("path");
    fs::create_dir_all(&tmp)?;
    fs::create_dir_all(&path_dir)?;
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
    let gitconfig = root.join("gitconfig");
    // Repositories the tests make are owned by this user, but say so for any clone folder.
    fs::write(&gitconfig, "[safe]\n\tdirectory = *\n")?;
    let path_var = format!("PATH={}:/usr/local/bin:/usr/bin:/bin", shown(&path_dir));

    let kubectl = |args: &[&str]| kubectl_run(&tools.kubectl, admin, args);
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
    kubectl(&[
        "apply",
        "--server-side",
        "--field-manager=real-cluster",
        "-f",
        &shown(&objects),
    ])?;

    let [
        redis_port,
        repo_port,
        repo_metrics,
        api_port,
        api_metrics,
        appset_metrics,
        appset_webhook,
        controller_metrics,
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

    let argv = vec![
        "/usr/bin/env".to_string(),
        format!("LD_LIBRARY_PATH={}", shown(&redis::libraries(layout))),
        shown(&redis::server(layout)),
        "--bind".into(),
        "127.0.0.1".into(),
        "--port".into(),
        redis_port.to_string(),
        // A cache only: nothing to persist.
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
        "--dir".into(),
        shown(&root),
    ];
    start_component(
        layout,
        state,
        "redis",
        argv,
        format!("redis://{redis_address}"),
    )?;

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
        format!("--metrics-port={api_metrics}"),
        "--insecure".into(),
        "--disable-auth".into(),
        format!("--repo-server={repo_server}"),
        "--repo-server-plaintext".into(),
        format!("--redis={redis_address}"),
        // No SSO: nothing to proxy to.
        "--dex-server=http://127.0.0.1:1".into(),
        format!("--staticassets={}", shown(&root)),
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

    let mut argv = env(&[]);
    argv.extend(kube("argocd-application-controller"));
    argv.extend([
        format!("--metrics-port={controller_metrics}"),
        format!("--repo-server={repo_server}"),
        "--repo-server-plaintext".into(),
        format!("--redis={redis_address}"),
    ]);
    start_component(
        layout,
        state,
        "argocd-application-controller",
        argv,
        format!("http://127.0.0.1:{controller_metrics}/healthz"),
    )?;

    state.argocd = Some(ArgoCd {
        version: VERSION.to_string(),
        api,
        namespace: NAMESPACE.to_string(),
        repo_server,
    });
    Ok(())
}
