//! The real `bosun serve`, run by the ground: configured against the forge double, the API
//! double (Argo CD cluster Secrets) and the chart repository doubles; Kargo's `http` step
//! reaches it at `https://bosun.example.test`. The ground reads its `/jobs` to know when it is
//! idle and to put what it did in the transcript.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::transcript::Transcript;

/// The URL scenarios write for Bosun's intake.
pub const BOSUN_ALIAS: &str = "https://bosun.example.test";
/// The shared secret the ground gives Bosun and Kargo's `bosun` Secret.
pub const WEBHOOK_SECRET: &str = "ground-bosun-webhook-secret";
/// The secret token of GitLab's merge request webhook (`X-Gitlab-Token`), on GitLab's face.
pub const GITLAB_WEBHOOK_TOKEN: &str = "ground-gitlab-webhook-token";

pub struct BosunProcess {
    child: Child,
    pub url: String,
    pub log: PathBuf,
    /// Bosun's work folder (checkouts, journal, the triage lock).
    pub workdir: PathBuf,
    seen: usize,
    bare: PathBuf,
    /// How to start the same process again (a restart after a crash).
    spawn: Box<dyn Fn() -> std::io::Result<Child> + Send + Sync>,
}

impl Drop for BosunProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Launch<'a> {
    pub binary: &'a Path,
    pub dir: &'a Path,
    pub forge_url: &'a str,
    pub forge_token: &'a str,
    pub slug: &'a str,
    pub repo_url: &'a str,
    pub bare: &'a Path,
    pub kubeconfig: &'a Path,
    pub tools: &'a Path,
    pub chart_mirrors: Vec<(String, String)>,
    /// The chart mirror the ground's Argo CD reads; Bosun pulls new versions into it, as the
    /// CI job does when it is the gate runner (a shared chart cache).
    pub charts: &'a Path,
    /// Keys merged over the generated bosun.yaml (a scenario's `bosun.config`).
    pub overrides: &'a Value,
    /// Bosun speaks the forge's GitLab face (`forge.kind: gitlab`, statuses, `/api/v4`).
    pub gitlab: bool,
    /// `--poll` seconds (0: off).
    pub poll: u64,
    /// Environment variables for the process (the model double's key).
    pub env: Vec<(String, String)>,
    /// A render cache shared with other processes (`ground::Options::render_cache`): Bosun's
    /// own (`workdir/render-cache`) is made a link to it, so Bosun reads the renders the
    /// gate already made of the same head (entries are content-addressed).
    pub render_cache: Option<PathBuf>,
}

pub(crate) fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                merge(base.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (_, Value::Null) => {}
        (base, over) => *base = over.clone(),
    }
}

impl BosunProcess {
    pub async fn start(launch: Launch<'_>) -> Result<BosunProcess> {
        let workdir = launch.dir.join("bosun");
        std::fs::create_dir_all(&workdir)?;
        if let Some(shared) = &launch.render_cache {
            let own = workdir.join("render-cache");
            if std::fs::symlink_metadata(&own).is_err() {
                std::fs::create_dir_all(shared)?;
                std::os::unix::fs::symlink(shared, &own)?;
            }
        }
        let mut config = json!({
            "forge": {
                "apiUrl": launch.forge_url,
                "tokenEnv": "BOSUN_FORGE_TOKEN",
                // Smart HTTP, as GitHub serves it; the token goes to git through Bosun's
                // credential helper, never into a URL on disk.
                "gitUrl": format!(
                    "{}/{{slug}}.git",
                    launch.forge_url.replacen("http://", "http://x-access-token:{token}@", 1)
                ),
                "checkMode": "check-run",
            },
            "repositories": [{"slug": launch.slug, "url": launch.repo_url}],
            "inventory": {"kubernetes": {"namespace": "argocd"}},
            "charts": {
                "dir": launch.charts,
                "mirrors": launch.chart_mirrors.iter().map(|(from, to)| json!({"from": from, "to": to})).collect::<Vec<_>>(),
            },
            "workdir": workdir,
        });
        if launch.gitlab {
            // GitLab: the v4 API, commit statuses, git over HTTPS with `oauth2` as the user.
            merge(
                &mut config,
                &json!({"forge": {
                    "kind": "gitlab",
                    "apiUrl": format!("{}/api/v4", launch.forge_url),
                    "gitUrl": format!(
                        "{}/{{slug}}.git",
                        launch.forge_url.replacen("http://", "http://oauth2:{token}@", 1)
                    ),
                    "checkMode": "status",
                }}),
            );
        }
        merge(&mut config, launch.overrides);
        let config_path = workdir.join("bosun.yaml");
        std::fs::write(&config_path, gitops_loop::yaml::to_string(&config))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = launch.dir.join("bosun.log");
        let binary = launch.binary.to_path_buf();
        let forge_token = launch.forge_token.to_string();
        let kubeconfig = launch.kubeconfig.to_path_buf();
        let tools = launch.tools.to_path_buf();
        let poll = launch.poll.to_string();
        let extra_env = launch.env.clone();
        let log_path = log.clone();
        let spawn = move || -> std::io::Result<Child> {
            // Appended to: a restarted process's log follows the first one's.
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)?;
            Command::new(&binary)
                .envs(extra_env.iter().map(|(k, v)| (k, v)))
                .env("BOSUN_FORGE_TOKEN", &forge_token)
                // Fixed commit dates, as the ground's own commits: a run repeats byte for byte.
                .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
                .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
                .env("BOSUN_WEBHOOK_SECRET", WEBHOOK_SECRET)
                .env("BOSUN_GITLAB_WEBHOOK_TOKEN", GITLAB_WEBHOOK_TOKEN)
                .env("KUBECONFIG", &kubeconfig)
                .env("GATE_HELM", tools.join("helm"))
                .env("GATE_KUBECTL", tools.join("kubectl"))
                .env(
                    "RUST_LOG",
                    std::env::var("GROUND_BOSUN_LOG").unwrap_or_else(|_| "info".into()),
                )
                .arg("--config")
                .arg(&config_path)
                .args([
                    "serve",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--poll",
                    &poll,
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
        };
        let child = spawn().context("cannot start bosun")?;
        let url = format!("http://127.0.0.1:{port}");
        let mut process = BosunProcess {
            child,
            url,
            log,
            workdir,
            seen: 0,
            bare: launch.bare.to_path_buf(),
            spawn: Box::new(spawn),
        };
        process.await_healthy().await?;
        Ok(process)
    }

    /// Waits until /healthz answers (bounded by a minute, as a loaded machine may take
    /// seconds to start it and replay its journal; the process may also have exited).
    async fn await_healthy(&mut self) -> Result<()> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < until {
            if let Ok(response) = crate::http::client()
                .get(format!("{}/healthz", self.url))
                .send()
                .await
                && response.status().is_success()
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "bosun exited with {status}: {}",
                    std::fs::read_to_string(&self.log)
                        .unwrap_or_default()
                        .trim()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        anyhow::bail!("bosun did not answer /healthz on {}", self.url)
    }

    /// The process id (for `prlimit` and /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a node failure or an OOM kill would: no shutdown path runs.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Starts the process again on the same port, configuration and work folder.
    pub async fn restart(&mut self) -> Result<()> {
        self.child = (self.spawn)().context("cannot start bosun again")?;
        self.seen = 0;
        self.await_healthy().await
    }

    async fn jobs(&self) -> Result<Value> {
        Ok(crate::http::client()
            .get(format!("{}/jobs", self.url))
            .send()
            .await?
            .json()
            .await?)
    }

    /// True while Bosun has work queued or running.
    pub async fn busy(&self) -> bool {
        match self.jobs().await {
            Ok(jobs) => jobs["idle"] != json!(true),
            Err(_) => false,
        }
    }

    /// Waits (in real time, at most `at_most`) until Bosun has nothing queued or running: a
    /// triage is one job from Kargo's POST to its last write (every round, the gate runs
    /// inside it), so the ground lets it finish before the tick ends and its writes land at
    /// the tick that set it off, however long it took. Retries after a failed triage wait on
    /// Bosun's own timer (seconds), so they do not hold the tick.
    pub async fn finish_work(&self, at_most: std::time::Duration) {
        let until = std::time::Instant::now() + at_most;
        while std::time::Instant::now() < until {
            let Ok(jobs) = self.jobs().await else {
                return;
            };
            if jobs["pending"].as_u64().unwrap_or(0) == 0 && jobs["running"].is_null() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Puts finished triages in the transcript (with the diff of anything pushed). True when
    /// there was something new.
    pub async fn tick(&mut self, transcript: &Transcript) -> bool {
        let Ok(jobs) = self.jobs().await else {
            return false;
        };
        let done = jobs["done"].as_array().cloned().unwrap_or_default();
        let new = done.len().saturating_sub(self.seen);
        if new == 0 {
            return false;
        }
        for run in &done[done.len() - new..] {
            let pr = run["pullRequest"].as_u64().unwrap_or(0);
            for line in run["lines"].as_array().into_iter().flatten() {
                transcript.say("bosun", format!("#{pr}: {}", line.as_str().unwrap_or("")));
            }
            for commit in run["pushed"].as_array().into_iter().flatten() {
                let commit = commit.as_str().unwrap_or("");
                for line in pushed_diff(&self.bare, commit) {
                    transcript.say("bosun", format!("#{pr}:   {line}"));
                }
            }
        }
        self.seen = done.len();
        true
    }
}

/// The lines a commit changed, per file: `path: -old` / `path: +new`.
pub fn pushed_diff(bare: &Path, commit: &str) -> Vec<String> {
    let Ok(output) = crate::git::git(
        bare,
        &["show", "--format=", "--unified=0", "--no-color", commit],
    ) else {
        return vec![format!("(cannot show {commit})")];
    };
    let mut file = String::new();
    let mut lines = Vec::new();
    for line in output.lines() {
        if let Some(path) = line.strip_prefix("+++ b/") {
            file = path.to_string();
        } else if line.starts_with("---") || line.starts_with("+++") {
            continue;
        } else if line.starts_with('-') || line.starts_with('+') {
            lines.push(format!("{file}: {line}"));
        }
    }
    lines
}
