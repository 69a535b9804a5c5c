//! Shared test helpers: git repositories made from fixture folders, and the gate binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod real;

pub const SAMPLE_REPO_URL: &str = "https://git.example.test/platform/gitops.git";

pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn sample_dir() -> PathBuf {
    project_root().join("scenarios/sample")
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.test",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?} failed in {}", dir.display());
}

pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read fixture dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A git repository whose first commit (on `main`) holds the files of `fixture`.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
}

impl TestRepo {
    pub fn from_fixture(fixture: &Path) -> TestRepo {
        let dir = tempfile::Builder::new()
            .prefix("gate-test-repo-")
            .tempdir()
            .expect("tempdir");
        copy_tree(fixture, dir.path());
        git(dir.path(), &["init", "-q", "-b", "main"]);
        git(dir.path(), &["add", "-A"]);
        git(dir.path(), &["commit", "-q", "-m", "initial"]);
        TestRepo { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Copies `overlay` over the tree (files only; `*.delete` marker files remove their
    /// namesake) and commits on a new branch; returns the commit id.
    pub fn commit_overlay(&self, overlay: &Path, branch: &str, message: &str) -> String {
        git(self.path(), &["checkout", "-q", "-B", branch]);
        apply_overlay(overlay, self.path());
        git(self.path(), &["add", "-A"]);
        git(
            self.path(),
            &["commit", "-q", "--allow-empty", "-m", message],
        );
        self.head()
    }

    pub fn head(&self) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(self.path())
            .args(["rev-parse", "HEAD"])
            .output()
            .expect("git");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

fn apply_overlay(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read overlay") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().to_string();
        let target = to.join(&name);
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
            apply_overlay(&entry.path(), &target);
        } else if let Some(original) = name.strip_suffix(".delete") {
            let _ = std::fs::remove_file(to.join(original));
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A loopback listener that counts every connection made to it: the gate's proxy variables
/// point at it, and hostile inputs name it directly, so a test can assert that a render
/// reached no network at all.
pub struct NetworkWatch {
    pub url: String,
    pub port: u16,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl NetworkWatch {
    /// One watch per test binary.
    pub fn get() -> &'static NetworkWatch {
        static WATCH: std::sync::OnceLock<NetworkWatch> = std::sync::OnceLock::new();
        WATCH.get_or_init(|| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
            let port = listener.local_addr().expect("address").port();
            let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counter = connections.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    drop(stream);
                }
            });
            NetworkWatch {
                url: format!("http://127.0.0.1:{port}"),
                port,
                connections,
            }
        })
    }

    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The gate binary with a private, empty render cache, and every proxy variable pointing at
/// the [`NetworkWatch`] (a render that reaches for the network is counted there).
pub fn gate(cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gate"));
    let watch = NetworkWatch::get();
    command
        .env("GATE_CACHE_DIR", cache)
        .env_remove("GATE_HELM")
        .env_remove("GATE_KUBECTL");
    for key in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env(key, &watch.url);
    }
    // The gate's own forge client talks to the doubles on loopback; helm and kubectl get no
    // NO_PROXY (the gate scrubs their environment), and hostile inputs name the watch directly.
    command
        .env("NO_PROXY", "127.0.0.1,localhost,::1")
        .env("no_proxy", "127.0.0.1,localhost,::1");
    command
}

/// `gate check` of the branch `pr` of `repo` against `main`, with the sample repository's URL,
/// inventory and chart mirror (more arguments may follow).
pub fn gate_check_sample(cache: &Path, repo: &Path) -> Command {
    let mut command = gate(cache);
    command
        .args(["check", "--head", "pr", "--default-branch", "main"])
        .args(["--repo-url", SAMPLE_REPO_URL])
        .arg("--repo")
        .arg(repo)
        .arg("--inventory")
        .arg(sample_dir().join("inventory.yaml"))
        .arg("--charts")
        .arg(sample_dir().join("charts"));
    command
}

/// `helm template RELEASE charts/CHART --namespace NAMESPACE ARGS...` with the pinned helm.
pub fn helm_template(chart: &str, namespace: &str, args: &[&str]) -> std::process::Output {
    Command::new(project_root().join("target/tools/helm"))
        .args(["template", chart])
        .arg(project_root().join("charts").join(chart))
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .expect("helm runs")
}

/// The objects a successful `helm template` printed.
pub fn rendered_objects(output: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    gitops_loop::yaml::parse_documents(&String::from_utf8_lossy(&output.stdout), "helm template")
        .expect("helm printed YAML")
}

/// A hostile server on loopback that answers every request with the same bytes (status line,
/// headers and body as given, then closes), counting the requests. Returns its URL and the
/// counter.
pub async fn same_answer(
    head: &'static str,
    body: std::sync::Arc<Vec<u8>>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (url, count)
}

/// A render of the sample repository at `repo` as the gate's library runs it: the sample's
/// inventory and chart mirror, the pinned tools, a cache at `cache`.
pub fn sample_render_config(repo: &Path, cache: &Path) -> gitops_loop::render::RenderConfig {
    use gitops_loop::render::{
        self, RenderConfig, cache::RenderCache, inventory::Inventory, tools,
    };
    let root = project_root();
    let tool = |name: &'static str| tools::Tool {
        name,
        path: root.join("target/tools").join(name),
        source: tools::ToolSource::Flag,
        limits: Default::default(),
    };
    let inventory_path = sample_dir().join("inventory.yaml");
    RenderConfig {
        repo_dir: repo.to_path_buf(),
        repo_url: Some(SAMPLE_REPO_URL.into()),
        inventory: Inventory::parse(
            &std::fs::read_to_string(&inventory_path).unwrap(),
            "inventory.yaml",
        )
        .unwrap(),
        charts: Some(sample_dir().join("charts")),
        git_mirrors: Vec::new(),
        helm: tool("helm"),
        kubectl: Some(tool("kubectl")),
        cache: RenderCache::at(cache.to_path_buf()),
        max_depth: render::DEFAULT_MAX_DEPTH,
        jobs: 2,
        chart_pulls: Default::default(),
        chart_repo_mirrors: Vec::new(),
        kustomize_enable_helm: false,
        parsed: Default::default(),
    }
}

/// The render caches every ground a test binary plays shares (`ground::Options::render_cache`:
/// the gates' apart from the Argo CD doubles'): the stories repeat the same renders, and
/// entries are content-addressed, so a later story reads what an earlier one rendered.
/// Emptied once per process, so a run starts cold.
pub fn shared_render_cache(binary: &str) -> PathBuf {
    static SHARED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| {
            let dir =
                PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{binary}-render-cache"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("the shared render cache's folder");
            dir
        })
        .clone()
}
