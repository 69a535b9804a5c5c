//! The process cluster: the upstream programs (etcd, the Kubernetes control plane, kwok) built
//! from the pinned Go modules under `real/go/` and run as plain processes on loopback, with
//! generated certificates, under `target/real`.
//!
//! - [`build`] compiles each program once per go.sum digest (a second run builds nothing);
//! - [`up`] starts etcd, kube-apiserver (RBAC and an audit log on), kube-controller-manager,
//!   kube-scheduler and kwok with one fake node, each waited on by its health endpoint, then
//!   installs the upstream Kargo and Argo CD CRDs read from the Go module cache and waits for
//!   them to be Established;
//! - [`down`] stops every process it started (each runs in a process group of its own) and
//!   checks that the ports are free again; [`up`] runs it first when a previous run left state;
//! - [`restart`] stops one component and starts it again with the same command line, which is
//!   how the tests restart the API server under a running observer.
//!
//! Nothing here sleeps for a fixed time to let a program start: every wait is a condition
//! polled against a deadline.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod argocd;
pub mod cloud;
mod pki;
mod redis;

/// A program `build` compiles: the Go module folder under `real/go` that pins it, the packages
/// and the names the binaries get.
struct Program {
    module: &'static str,
    /// `-ldflags`: Kubernetes reads its version from variables `go build` leaves at
    /// `v0.0.0-master` unless they are set (its own build sets them from git).
    ldflags: &'static str,
    /// (package, binary name)
    packages: &'static [(&'static str, &'static str)],
    /// What the cluster loses without it.
    role: &'static str,
}

const PROGRAMS: &[Program] = &[
    Program {
        module: "etcd",
        ldflags: "",
        packages: &[("go.etcd.io/etcd/server/v3", "etcd")],
        role: "the API server's storage",
    },
    Program {
        module: "kubernetes",
        ldflags: "-X k8s.io/component-base/version.gitVersion=v1.34.4 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=v1.34.4 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=34",
        packages: &[
            ("k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
            (
                "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-controller-manager",
            ),
            ("k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
        ],
        role: "the control plane",
    },
    Program {
        module: "kwok",
        ldflags: "",
        packages: &[("sigs.k8s.io/kwok/cmd/kwok", "kwok")],
        role: "fake nodes that run Pods without a container runtime",
    },
    Program {
        module: "kustomize",
        ldflags: "-X sigs.k8s.io/kustomize/api/provenance.version=v5.6.0",
        packages: &[("sigs.k8s.io/kustomize/kustomize/v5", "kustomize")],
        role: "kustomize for Argo CD's repo-server (the version the pinned kubectl embeds)",
    },
    Program {
        module: "fake-gcs-server",
        ldflags: "",
        packages: &[("github.com/fsouza/fake-gcs-server", "fake-gcs-server")],
        role: "a Google Cloud Storage emulator for the remote render cache's tests",
    },
    Program {
        module: "argocd-programs",
        ldflags: "-X github.com/argoproj/argo-cd/v3/common.version=3.2.11",
        packages: &[("github.com/argoproj/argo-cd/v3/cmd", "argocd")],
        role: "Argo CD: the gate's oracle and the stories' deployer",
    },
];

/// The names the Argo CD multicall binary answers to (it picks the program by the base name of
/// argv[0]): `build` links each to `argocd`.
pub const ARGOCD_PROGRAMS: &[&str] = &[
    "argocd-server",
    "argocd-repo-server",
    "argocd-applicationset-controller",
    "argocd-application-controller",
];

/// Modules whose files (CRDs) the cluster reads from the Go module cache: (module folder under
/// real/go, module path, the CRD folder inside it, the file names to take: empty for all).
const CRD_SOURCES: &[(&str, &str, &str, &[&str])] = &[
    (
        "kargo",
        "github.com/akuity/kargo",
        "charts/kargo/resources/crds",
        &[],
    ),
    (
        "argocd",
        "github.com/argoproj/argo-cd/v3",
        "manifests/crds",
        &[
            "application-crd.yaml",
            "applicationset-crd.yaml",
            "appproject-crd.yaml",
        ],
    ),
];

/// Where the process cluster keeps everything: `target/real` of the workspace.
#[derive(Clone, Debug)]
pub struct Layout {
    pub root: PathBuf,
    /// The workspace root (holds `real/go`).
    pub project: PathBuf,
}

impl Layout {
    pub fn new(project: &Path) -> Self {
        Layout {
            root: project.join("target/real"),
            project: project.to_path_buf(),
        }
    }
    pub fn bin(&self) -> PathBuf {
        self.root.join("bin")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }
    pub fn state_file(&self) -> PathBuf {
        self.root.join("cluster.json")
    }
    /// The cluster-admin kubeconfig (a client certificate in group system:masters).
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("admin.kubeconfig")
    }
    /// The API server's audit log: one JSON event per request (user, verb, resource).
    pub fn audit_log(&self) -> PathBuf {
        self.logs().join("audit.log")
    }
    fn go_module(&self, name: &str) -> PathBuf {
        self.project.join("real/go").join(name)
    }
}

/// What `build` did for each program.
#[derive(Debug, Default)]
pub struct BuildReport {
    pub built: Vec<(String, Duration)>,
    pub cached: Vec<String>,
    /// (program, the exact error)
    pub failed: Vec<(String, String)>,
}

/// The digest a program's binaries are keyed by: its go.mod and go.sum, the Go version and the
/// packages.
fn digest(module: &Path, program: &Program, go_version: &str) -> Result<String> {
    let mut hash = Sha256::new();
    for file in ["go.mod", "go.sum"] {
        let path = module.join(file);
        hash.update(fs::read(&path).with_context(|| format!("read {}", path.display()))?);
    }
    hash.update(go_version.as_bytes());
    hash.update(program.ldflags.as_bytes());
    for (package, name) in program.packages {
        hash.update(package.as_bytes());
        hash.update(name.as_bytes());
    }
    Ok(format!("{:x}", hash.finalize()))
}

fn go() -> Command {
    let mut command = Command::new("go");
    // The pins are the go.sum lines: never let a build rewrite them.
    command.env("GOFLAGS", "-mod=readonly");
    command
}

/// The Go version that builds in `dir` (a module's `go` line can make the go command switch
/// toolchains, so ask there).
fn go_version_in(dir: &Path) -> Result<String> {
    let output = go()
        .current_dir(dir)
        .args(["env", "GOVERSION"])
        .stdin(Stdio::null())
        .output()
        .context("run `go env GOVERSION`: the process cluster needs the Go toolchain on PATH")?;
    if !output.status.success() {
        bail!(
            "`go env GOVERSION` in {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn go_version() -> Result<String> {
    let output = go()
        .arg("version")
        .output()
        .context("run `go version`: the process cluster needs the Go toolchain on PATH")?;
    if !output.status.success() {
        bail!(
            "`go version` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// True when the Go toolchain is on PATH.
pub fn go_present() -> bool {
    go_version().is_ok()
}

/// Compiles every program whose binaries are missing or whose digest changed, into
/// `target/real/bin`, and downloads the modules the CRDs are read from. A program that fails
/// is reported with its exact error and the rest are still built.
pub fn build(layout: &Layout) -> Result<BuildReport> {
    go_version()?;
    let bin = layout.bin();
    fs::create_dir_all(&bin)?;
    let mut report = BuildReport::default();
    for program in PROGRAMS {
        let module = layout.go_module(program.module);
        let go_version = go_version_in(&module)?;
        let digest = digest(&module, program, &go_version)?;
        let stamp = bin.join(format!("{}.digest", program.module));
        let present = program
            .packages
            .iter()
            .all(|(_, name)| bin.join(name).is_file());
        if present && fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == digest) {
            report.cached.push(program.module.to_string());
            continue;
        }
        let started = Instant::now();
        let staging = bin.join(format!(".{}.building", program.module));
        let _ = fs::remove_dir_all(&staging);
        fs::create_dir_all(&staging)?;
        let mut failed = None;
        for (package, name) in program.packages {
            let output = go()
                .current_dir(&module)
                .args(["build", "-trimpath", "-ldflags", program.ldflags, "-o"])
                .arg(staging.join(name))
                .arg(package)
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("run go build {package}"))?;
            if !output.status.success() {
                failed = Some(format!(
                    "go build {package} (in real/go/{}): {}",
                    program.module,
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
                break;
            }
        }
        if let Some(error) = failed {
            let _ = fs::remove_dir_all(&staging);
            report.failed.push((program.module.to_string(), error));
            continue;
        }
        // Move the binaries in only when every one built, then write the stamp: a build cut
        // short leaves the old stamp, so the next run builds again.
        for (_, name) in program.packages {
            fs::rename(staging.join(name), bin.join(name))?;
        }
        if program.module == "argocd-programs" {
            link_argocd_programs(&bin)?;
        }
        let _ = fs::remove_dir_all(&staging);
        write_atomic(&stamp, digest.as_bytes())?;
        report
            .built
            .push((program.module.to_string(), started.elapsed()));
    }
    if bin.join("argocd").is_file() {
        link_argocd_programs(&bin)?;
    }
    match redis::install(layout) {
        Ok(true) => report.built.push(("redis".into(), Duration::ZERO)),
        Ok(false) => report.cached.push("redis".into()),
        Err(error) => report.failed.push(("redis".into(), format!("{error:#}"))),
    }
    for (module, path, _, _) in CRD_SOURCES {
        if let Err(error) = module_dir(layout, module, path) {
            report
                .failed
                .push((module.to_string(), format!("{error:#}")));
        }
    }
    Ok(report)
}

/// `argocd-server`, `argocd-repo-server`, ... as symbolic links to the multicall `argocd`.
fn link_argocd_programs(bin: &Path) -> Result<()> {
    for name in ARGOCD_PROGRAMS {
        let link = bin.join(name);
        if fs::read_link(&link).is_ok_and(|target| target == Path::new("argocd")) {
            continue;
        }
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink("argocd", &link)
            .with_context(|| format!("link {}", link.display()))?;
    }
    Ok(())
}

/// The folder of `path` in the Go module cache, downloading it (checked against go.sum) if
/// needed.
pub fn module_dir(layout: &Layout, module: &str, path: &str) -> Result<PathBuf> {
    module_dir_with(layout, module, path, true)
}

/// The folder of `path` in the Go module cache, never downloading (`up` runs offline: `build`
/// downloaded what it needs, and a start must not hang on a proxy).
pub fn cached_module_dir(layout: &Layout, module: &str, path: &str) -> Result<PathBuf> {
    module_dir_with(layout, module, path, false).with_context(|| {
        format!("{path} is not in the Go module cache: run `cargo xtask real build`")
    })
}

fn module_dir_with(layout: &Layout, module: &str, path: &str, download: bool) -> Result<PathBuf> {
    let mut command = go();
    if !download {
        command.env("GOPROXY", "off");
    }
    let output = command
        .current_dir(layout.go_module(module))
        .args(["mod", "download", "-json", path])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run go mod download {path}"))?;
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "go mod download -json {path}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
    })?;
    if let Some(error) = value["Error"].as_str() {
        bail!("go mod download {path} (in real/go/{module}): {error}");
    }
    let dir = value["Dir"]
        .as_str()
        .with_context(|| format!("go mod download {path} named no folder"))?;
    Ok(PathBuf::from(dir))
}

/// One running program of the cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Component {
    pub name: String,
    pub pid: u32,
    /// The process's start time (clock ticks since boot, /proc/<pid>/stat field 22) and the
    /// boot it started in: a pid is only ours while both still match, so `down` never signals
    /// a process that reused the number (after a reboot, or a target/ from elsewhere).
    #[serde(default)]
    pub started: u64,
    /// Empty in a state written before identities were recorded: then only the pid is known.
    #[serde(default)]
    pub boot: String,
    pub argv: Vec<String>,
    pub log: PathBuf,
    /// The URL its readiness is read from (`GET` answers 200 when ready).
    pub ready: String,
}

/// What `up` started: written to `target/real/cluster.json` and read by `down`, `status`,
/// `restart` and the tests.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    pub server: String,
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
    pub components: Vec<Component>,
    /// The upstream CRDs installed: (source module, CRD name).
    pub crds: Vec<(String, String)>,
    /// The fake node kwok runs Pods on, when kwok was built.
    pub node: Option<String>,
    /// Argo CD, when it was built.
    #[serde(default)]
    pub argocd: Option<argocd::ArgoCd>,
}

impl State {
    pub fn read(layout: &Layout) -> Result<Option<State>> {
        let path = layout.state_file();
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("{} is not a cluster state", path.display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
        }
    }
    fn write(&self, layout: &Layout) -> Result<()> {
        write_atomic(&layout.state_file(), &serde_json::to_vec_pretty(self)?)
    }
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.name == name)
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let temporary = path.with_extension("partial");
    let mut file = fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&temporary, path)?;
    Ok(())
}

/// `n` distinct free loopback ports: every listener is held until all are chosen, so two picks
/// cannot return the same port.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0u16; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// The last `lines` lines of a log, for an error that says why a program did not come up.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // After the command's closing parenthesis come fields 3 onwards.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// True while the component's process group still has a member and its leader is the process
/// `up` started (same boot, same start time), not one that reused the pid.
fn ours(component: &Component) -> bool {
    if !component.boot.is_empty() && component.boot != boot_id() {
        return false;
    }
    if let Some(started) = start_time(component.pid)
        && component.started != 0
        && started != component.started
    {
        return false;
    }
    let Some(pid) = rustix::process::Pid::from_raw(component.pid as i32) else {
        return false;
    };
    // The leader may have exited while others of its group run on: ask for the group.
    rustix::process::test_kill_process_group(pid).is_ok() && group_has_live_member(component.pid)
}

/// A group whose members are all zombies counts as gone (nothing left to stop).
fn group_has_live_member(pgid: u32) -> bool {
    let Ok(entries) = fs::read_dir("/proc") else {
        return true;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .any(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    let mut fields = rest.split_whitespace();
                    let state = fields.next()?;
                    let group: u32 = fields.nth(1)?.parse().ok()?;
                    Some(group == pgid && state != "Z" && state != "X")
                })
                .unwrap_or(false)
        })
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) has a /proc entry too: read its state.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next())
        })
        .flatten()
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// A command that runs `argv` with no file descriptor but 0, 1 and 2 inherited from this
/// process. A component outlives whoever started it (a test restarts the API server): an
/// inherited descriptor, such as the one of a `flock` the test runs under or a pipe its runner
/// reads, would stay open as long as the component runs. bash closes every other descriptor
/// and then execs the program, so the pid is the program's.
fn without_inherited_fds(argv: &[String]) -> Command {
    let mut command = Command::new("/bin/bash");
    command
        // A non-interactive bash would source these first.
        .env_remove("BASH_ENV")
        .env_remove("ENV")
        .arg("-c")
        .arg(r#"for fd in /proc/$$/fd/*; do fd=${fd##*/}; if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null; fi; done; exec "$@""#)
        .arg("real-cluster")
        .args(argv);
    command
}

fn spawn(layout: &Layout, name: &str, argv: &[String], ready: &str) -> Result<Component> {
    fs::create_dir_all(layout.logs())?;
    let log = layout.logs().join(format!("{name}.log"));
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let child = without_inherited_fds(argv)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        // A group of its own: `down` stops it and anything it started, and a signal to the
        // shell or test that started it does not reach it.
        .process_group(0)
        .spawn()
        .with_context(|| format!("start {name} ({})", argv[0]))?;
    let pid = child.id();
    Ok(Component {
        name: name.to_string(),
        pid,
        started: start_time(pid).unwrap_or_default(),
        boot: boot_id(),
        argv: argv.to_vec(),
        log,
        ready: ready.to_string(),
    })
}

/// An HTTP agent that trusts only the cluster's CA.
fn agent(layout: &Layout) -> Result<ureq::Agent> {
    let ca = fs::read(layout.pki().join("ca.crt"))?;
    let ca = ureq::tls::Certificate::from_pem(&ca)?;
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&[ca]))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into())
}

fn is_ready(agent: &ureq::Agent, url: &str) -> bool {
    if let Some(address) = url.strip_prefix("redis://") {
        return redis_pong(address);
    }
    agent
        .get(url)
        .call()
        .is_ok_and(|response| response.status() == 200)
}

/// True when a Redis server at `address` answers PING (Redis has no HTTP endpoint).
fn redis_pong(address: &str) -> bool {
    use std::io::Read;
    let Ok(address) = address.parse() else {
        return false;
    };
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    // A server that asks for a password answers `-NOAUTH …`: it is up all the same.
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}

/// Waits until the component answers 200 on its readiness URL; fails with its log's tail if it
/// exits first or the deadline passes.
fn wait_ready(layout: &Layout, component: &Component, limit: Duration) -> Result<()> {
    let agent = agent(layout)?;
    let start = Instant::now();
    loop {
        if is_ready(&agent, &component.ready) {
            return Ok(());
        }
        if !alive(component.pid) {
            bail!(
                "{} exited before it was ready; the end of {}:\n{}",
                component.name,
                component.log.display(),
                log_tail(&component.log, 30)
            );
        }
        if start.elapsed() > limit {
            bail!(
                "{} not ready after {limit:?} ({}); the end of {}:\n{}",
                component.name,
                component.ready,
                component.log.display(),
                log_tail(&component.log, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn stop(component: &Component, limit: Duration) -> Result<()> {
    let Some(pid) = rustix::process::Pid::from_raw(component.pid as i32) else {
        return Ok(());
    };
    if !ours(component) {
        return Ok(());
    }
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
    let start = Instant::now();
    while ours(component) {
        if start.elapsed() > limit {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            let kill = Instant::now();
            while ours(component) {
                if kill.elapsed() > Duration::from_secs(10) {
                    bail!(
                        "{} (pid {}) survives SIGKILL",
                        component.name,
                        component.pid
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The ports a component's command line binds (`--...port=N`, `--...-urls=http://127.0.0.1:N`,
/// `--server-address=127.0.0.1:N`), so `down` can check each is free again.
fn ports(argv: &[String]) -> Vec<u16> {
    let mut ports = Vec::new();
    // Redis takes `--port N` as two words.
    for pair in argv.windows(2) {
        if pair[0] == "--port"
            && let Ok(port) = pair[1].parse()
        {
            ports.push(port);
        }
    }
    for arg in argv {
        let Some((flag, value)) = arg.split_once('=') else {
            continue;
        };
        if !(flag.contains("port") || flag.contains("listen") || flag.contains("addr")) {
            continue;
        }
        for part in value.split(',') {
            if let Some(port) = part.rsplit(':').next().and_then(|p| p.parse().ok())
                && (flag.contains("listen") || part.contains(':'))
            {
                ports.push(port);
            } else if flag.ends_with("port")
                && let Ok(port) = part.parse()
            {
                ports.push(port);
            }
        }
    }
    ports
}

/// Stops every process `up` started, newest first, and checks their ports are free.
pub fn down(layout: &Layout) -> Result<()> {
    let Some(state) = State::read(layout)? else {
        return Ok(());
    };
    let mut errors = Vec::new();
    for component in state.components.iter().rev() {
        if let Err(error) = stop(component, Duration::from_secs(15)) {
            errors.push(format!("{error:#}"));
        }
    }
    if !errors.is_empty() {
        bail!("could not stop every component: {}", errors.join("; "));
    }
    let start = Instant::now();
    for component in &state.components {
        for port in ports(&component.argv) {
            while TcpListener::bind(("127.0.0.1", port)).is_err() {
                if start.elapsed() > Duration::from_secs(30) {
                    bail!("port {port} of {} is still taken", component.name);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    fs::remove_file(layout.state_file())?;
    // The repo-server's clones: gone with the cluster, not piling up across runs.
    argocd::remove_tree(&layout.root.join("argocd").join("tmp"))?;
    Ok(())
}

/// One line per component: running or not, and ready or not.
pub fn status(layout: &Layout) -> Result<Vec<String>> {
    let Some(state) = State::read(layout)? else {
        return Ok(vec![
            "no process cluster (cargo xtask real up starts one)".into(),
        ]);
    };
    let agent = agent(layout)?;
    let mut lines = vec![format!(
        "server {} (kubeconfig {})",
        state.server,
        state.kubeconfig.display()
    )];
    for component in &state.components {
        let running = ours(component);
        let ready = running && is_ready(&agent, &component.ready);
        lines.push(format!(
            "{:<24} pid {:<8} {}",
            component.name,
            component.pid,
            match (running, ready) {
                (true, true) => "ready",
                (true, false) => "running, not ready",
                _ => "STOPPED",
            }
        ));
    }
    Ok(lines)
}

/// Stops one component and starts it again with the same command line, waiting for it to be
/// ready (how a test restarts the API server under a running observer).
pub fn restart(layout: &Layout, name: &str) -> Result<()> {
    let mut state = State::read(layout)?.context("no process cluster is up")?;
    let index = state
        .components
        .iter()
        .position(|c| c.name == name)
        .with_context(|| format!("no component {name} in the process cluster"))?;
    let old = state.components[index].clone();
    stop(&old, Duration::from_secs(15))?;
    let start = Instant::now();
    for port in ports(&old.argv) {
        while TcpListener::bind(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("port {port} of {name} is still taken after it stopped");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let new = spawn(layout, name, &old.argv, &old.ready)?;
    state.components[index] = new.clone();
    state.write(layout)?;
    wait_ready(layout, &new, Duration::from_secs(120))
}

/// The audit policy: every request's metadata (user, verb, resource), nothing of its body.
const AUDIT_POLICY: &str = r#"{"apiVersion":"audit.k8s.io/v1","kind":"Policy","omitStages":["RequestReceived","ResponseStarted"],"rules":[{"level":"Metadata"}]}"#;

fn kubeconfig(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": "user", "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}],
        "current-context": "real",
    })
    .to_string()
}

/// Starts one component and records it at once, so a failure part way leaves a state `down`
/// can clean up; then waits for it to be ready.
fn start_component(
    layout: &Layout,
    state: &mut State,
    name: &str,
    argv: Vec<String>,
    ready: String,
) -> Result<()> {
    let component = spawn(layout, name, &argv, &ready)?;
    state.components.push(component.clone());
    if let Err(error) = state.write(layout) {
        // Unrecorded, nothing could stop it later: stop it now.
        let _ = stop(&component, Duration::from_secs(5));
        return Err(error);
    }
    wait_ready(layout, &component, Duration::from_secs(180))
}

/// Runs the pinned kubectl as the cluster admin; its stdout.
fn kubectl_run(kubectl: &Path, admin: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new(kubectl)
        .arg(format!("--kubeconfig={}", admin.display()))
        .arg("--request-timeout=60s")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", kubectl.display()))?;
    if !output.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The pinned client tools the cluster uses: kubectl applies the CRDs, and Argo CD's
/// repo-server renders with helm (the gate's own pins, so the oracle compares engines, not
/// tool versions).
#[derive(Clone, Debug)]
pub struct Tools {
    pub kubectl: PathBuf,
    pub helm: PathBuf,
}

/// Starts the cluster.
pub fn up(layout: &Layout, tools: &Tools) -> Result<State> {
    let kubectl = tools.kubectl.as_path();
    if State::read(layout)?.is_some() {
        eprintln!("real: a previous cluster left state behind; stopping it first");
        down(layout)?;
    }
    let bin = layout.bin();
    for name in ["etcd", "kube-apiserver"] {
        if !bin.join(name).is_file() {
            bail!(
                "{} is missing: run `cargo xtask real build` first",
                bin.join(name).display()
            );
        }
    }
    let _ = fs::remove_dir_all(layout.root.join("etcd"));
    let _ = fs::remove_dir_all(layout.logs());
    fs::create_dir_all(layout.logs())?;
    let pki = pki::write(&layout.pki())?;
    let path = |p: &Path| p.display().to_string();
    let b = |name: &str| path(&bin.join(name));

    let mut state = State {
        server: String::new(),
        kubeconfig: layout.kubeconfig(),
        audit_log: layout.audit_log(),
        components: Vec::new(),
        crds: Vec::new(),
        node: None,
        argocd: None,
    };
    let start = |state: &mut State, name: &str, argv: Vec<String>, ready: String| {
        start_component(layout, state, name, argv, ready)
    };

    // Every port the cluster binds, chosen at once.
    let [
        client,
        peer,
        etcd_metrics,
        api,
        kcm_port,
        scheduler_port,
        kwok_port,
    ] = free_ports()?;
    start_etcd(layout, &mut state, &pki, client, peer, etcd_metrics)?;
    let (etcd_cert, etcd_key) = pki.client("etcd-client")?;

    let server = format!("https://127.0.0.1:{api}");
    state.server = server.clone();
    let audit_policy = layout.root.join("audit-policy.json");
    fs::write(&audit_policy, AUDIT_POLICY)?;
    start(
        &mut state,
        "kube-apiserver",
        vec![
            b("kube-apiserver"),
            format!("--etcd-servers=https://127.0.0.1:{client}"),
            format!("--etcd-cafile={}", path(&pki.ca_cert)),
            format!("--etcd-certfile={}", path(&etcd_cert)),
            format!("--etcd-keyfile={}", path(&etcd_key)),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api}"),
            format!("--tls-cert-file={}", path(&pki.serving_cert)),
            format!("--tls-private-key-file={}", path(&pki.serving_key)),
            format!("--client-ca-file={}", path(&pki.ca_cert)),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", path(&pki.sa_public)),
            format!("--service-account-signing-key-file={}", path(&pki.sa_key)),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            format!("--audit-policy-file={}", path(&audit_policy)),
            format!("--audit-log-path={}", path(&layout.audit_log())),
            "--audit-log-format=json".into(),
            // One file for the cluster's life (lumberjack rotates at 100 MB by default, and
            // the RBAC test reads one file).
            "--audit-log-maxsize=100000".into(),
            "--profiling=false".into(),
        ],
        format!("{server}/readyz"),
    )?;

    let config = |user: &str| -> Result<PathBuf> {
        let (cert, key) = pki.client(user)?;
        let file = layout.root.join(format!("{user}.kubeconfig"));
        fs::write(&file, kubeconfig(&server, &pki.ca_cert, &cert, &key))?;
        Ok(file)
    };
    let admin = config("admin")?;
    start_control_plane(layout, &mut state, &pki, &config, kcm_port, scheduler_port)?;
    let kubectl_run = |args: &[&str]| kubectl_run(kubectl, &admin, args);
    if bin.join("kwok").is_file() {
        let own = config("kwok")?;
        start_kwok(layout, &mut state, &own, &kubectl_run, kwok_port)?;
    }

    // The upstream CRDs, read from the module cache, applied and waited for.
    apply_upstream_crds(layout, &mut state, &kubectl_run)?;
    state.write(layout)?;
    let names: Vec<String> = state.crds.iter().map(|(_, n)| format!("crd/{n}")).collect();
    let mut args = vec!["wait", "--for=condition=Established", "--timeout=120s"];
    args.extend(names.iter().map(String::as_str));
    kubectl_run(&args)?;
    if let Some(node) = &state.node {
        kubectl_run(&[
            "wait",
            "--for=condition=Ready",
            "--timeout=120s",
            &format!("node/{node}"),
        ])?;
    }
    state.write(layout)?;
    if bin.join("argocd").is_file() {
        argocd::start(layout, &mut state, tools, &admin)?;
        state.write(layout)?;
    }
    Ok(state)
}

/// etcd on loopback: clients with a certificate of the cluster's CA, health on a port of its
/// own, no fsync.
fn start_etcd(
    layout: &Layout,
    state: &mut State,
    pki: &pki::Pki,
    client: u16,
    peer: u16,
    metrics: u16,
) -> Result<()> {
    let path = |p: &Path| p.display().to_string();
    start_component(
        layout,
        state,
        "etcd",
        vec![
            path(&layout.bin().join("etcd")),
            "--name=real".into(),
            format!("--data-dir={}", path(&layout.root.join("etcd"))),
            // Clients present a certificate of the cluster's CA: any local process could read
            // Secrets or write RBAC through an open etcd.
            format!("--listen-client-urls=https://127.0.0.1:{client}"),
            format!("--advertise-client-urls=https://127.0.0.1:{client}"),
            "--client-cert-auth=true".into(),
            format!("--trusted-ca-file={}", path(&pki.ca_cert)),
            format!("--cert-file={}", path(&pki.serving_cert)),
            format!("--key-file={}", path(&pki.serving_key)),
            // Health only, on a port of its own: readiness is read there.
            format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=real=http://127.0.0.1:{peer}"),
            // A disposable cluster: durability buys nothing and costs every write a sync.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
        format!("http://127.0.0.1:{metrics}/health"),
    )
}

/// The controller manager and the scheduler, each when it was built. What they share: their
/// own kubeconfig (`config` writes one per user) for the API server and for delegated
/// authentication and authorization, loopback, the serving pair.
fn start_control_plane(
    layout: &Layout,
    state: &mut State,
    pki: &pki::Pki,
    config: &dyn Fn(&str) -> Result<PathBuf>,
    kcm_port: u16,
    scheduler_port: u16,
) -> Result<()> {
    let bin = layout.bin();
    let path = |p: &Path| p.display().to_string();
    let control_plane = |name: &str, port: u16| -> Result<Vec<String>> {
        let own = path(&config(name)?);
        Ok(vec![
            path(&bin.join(name)),
            format!("--kubeconfig={own}"),
            format!("--authentication-kubeconfig={own}"),
            format!("--authorization-kubeconfig={own}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", path(&pki.serving_cert)),
            format!("--tls-private-key-file={}", path(&pki.serving_key)),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
        ])
    };
    if bin.join("kube-controller-manager").is_file() {
        let mut argv = control_plane("kube-controller-manager", kcm_port)?;
        argv.extend([
            format!("--service-account-private-key-file={}", path(&pki.sa_key)),
            format!("--root-ca-file={}", path(&pki.ca_cert)),
            "--use-service-account-credentials=true".into(),
        ]);
        start_component(
            layout,
            state,
            "kube-controller-manager",
            argv,
            format!("https://127.0.0.1:{kcm_port}/healthz"),
        )?;
    }
    if bin.join("kube-scheduler").is_file() {
        start_component(
            layout,
            state,
            "kube-scheduler",
            control_plane("kube-scheduler", scheduler_port)?,
            format!("https://127.0.0.1:{scheduler_port}/healthz"),
        )?;
    }
    Ok(())
}

/// The kwok node: its Node object applied, then kwok (with its own kubeconfig) managing it
/// with kwok's own "fast" stages, read from its module: Nodes become Ready (with a Lease
/// heartbeat), Pods Running and Ready.
fn start_kwok(
    layout: &Layout,
    state: &mut State,
    kubeconfig: &Path,
    kubectl: &dyn Fn(&[&str]) -> Result<String>,
    port: u16,
) -> Result<()> {
    let path = |p: &Path| p.display().to_string();
    let node = "kwok-node-0";
    let manifest = layout.root.join("node.json");
    fs::write(
        &manifest,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                       "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}
        })
        .to_string(),
    )?;
    kubectl(&["apply", "-f", &path(&manifest)])?;
    let stages = cached_module_dir(layout, "kwok", "sigs.k8s.io/kwok")?.join("kustomize/stage");
    let configs = [
        "node/fast/node-initialize.yaml",
        "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
        "pod/fast/pod-ready.yaml",
        "pod/fast/pod-complete.yaml",
        "pod/fast/pod-delete.yaml",
    ]
    .iter()
    .map(|f| path(&stages.join(f)))
    .collect::<Vec<_>>()
    .join(",");
    start_component(
        layout,
        state,
        "kwok",
        vec![
            path(&layout.bin().join("kwok")),
            format!("--config={configs}"),
            format!("--kubeconfig={}", path(kubeconfig)),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
            "--node-ip=127.0.0.1".into(),
            format!("--server-address=127.0.0.1:{port}"),
        ],
        format!("http://127.0.0.1:{port}/healthz"),
    )?;
    state.node = Some(node.to_string());
    Ok(())
}

/// The upstream CRDs ([`CRD_SOURCES`]), read from the module cache and applied server-side;
/// each applied CRD is recorded in the state.
fn apply_upstream_crds(
    layout: &Layout,
    state: &mut State,
    kubectl: &dyn Fn(&[&str]) -> Result<String>,
) -> Result<()> {
    for (module, module_path, folder, only) in CRD_SOURCES {
        let dir = cached_module_dir(layout, module, module_path)?.join(folder);
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .with_context(|| format!("read {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|e| e == "yaml")
                    && (only.is_empty()
                        || p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| only.contains(&n)))
            })
            .collect();
        files.sort();
        for file in files {
            let names = kubectl(&[
                "apply",
                "--server-side",
                "--field-manager=real-cluster",
                "-o",
                "name",
                "-f",
                &file.display().to_string(),
            ])?;
            for name in names.lines().filter(|l| !l.trim().is_empty()) {
                let name = name
                    .trim()
                    .trim_start_matches("customresourcedefinition.apiextensions.k8s.io/");
                state.crds.push((module_path.to_string(), name.to_string()));
            }
        }
    }
    Ok(())
}

/// Resident memory of every component, in KiB (from /proc), for the README's budget.
pub fn rss_kib(state: &State) -> Vec<(String, u64)> {
    state
        .components
        .iter()
        .map(|c| {
            let rss = fs::read_to_string(format!("/proc/{}/status", c.pid))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("VmRSS:"))
                        .and_then(|l| l.split_whitespace().nth(1))
                        .and_then(|n| n.parse().ok())
                })
                .unwrap_or(0);
            (c.name.clone(), rss)
        })
        .collect()
}

/// What each program is for, for the build report.
pub fn roles() -> Vec<(&'static str, &'static str)> {
    PROGRAMS.iter().map(|p| (p.module, p.role)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_inherits_no_descriptor_but_the_standard_three() {
        let inner: Vec<String> = ["bash", "-c", "ls /proc/$$/fd; true"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let wrapped = without_inherited_fds(&inner);
        let mut argv = vec![wrapped.get_program().to_string_lossy().into_owned()];
        argv.extend(wrapped.get_args().map(|a| a.to_string_lossy().into_owned()));
        // The parent holds descriptor 7 open without close-on-exec, as flock(1) does.
        let output = Command::new("bash")
            .args(["-c", "exec 7</dev/null; exec \"$@\"", "parent"])
            .args(&argv)
            .output()
            .unwrap();
        let fds: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(
            fds,
            ["0", "1", "2"],
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // And without the wrapper the descriptor would reach it (the test can fail).
        let bare = Command::new("bash")
            .args(["-c", "exec 7</dev/null; exec \"$@\"", "parent"])
            .args(&inner)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&bare.stdout)
                .split_whitespace()
                .any(|f| f == "7")
        );
    }

    #[test]
    fn ports_are_read_from_the_flags_that_bind_them() {
        let argv: Vec<String> = [
            "etcd",
            "--listen-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--secure-port=6443",
            "--server-address=127.0.0.1:10247",
            "--bind-address=127.0.0.1",
            "--data-dir=/tmp/x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut found = ports(&argv);
        found.sort();
        found.dedup();
        assert_eq!(found, vec![2379, 2380, 6443, 10247]);
    }
}
