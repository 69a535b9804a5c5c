//! The CI job a platform team wires to pull requests: on every new head commit of an open
//! pull request, `gate charts pull` then `gate publish` — the real `gate` binary, against the
//! forge double and the chart repository double.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use crate::forge::ForgeDouble;
use crate::transcript::Transcript;

pub struct Ci {
    pub gate: PathBuf,
    pub slug: String,
    pub repo_url: String,
    pub git_url: String,
    pub forge_url: String,
    pub token: String,
    pub inventory: PathBuf,
    pub charts: PathBuf,
    pub chart_repo_mirrors: Vec<(String, String)>,
    pub workdir: PathBuf,
    pub cache: PathBuf,
    /// Off when Bosun is the gate runner.
    pub enabled: bool,
    /// The job is a GitLab CI job: it publishes through GitLab's API (`--forge gitlab`).
    pub gitlab: bool,
    checked: BTreeSet<(u64, String)>,
}

impl Ci {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gate: PathBuf,
        slug: &str,
        repo_url: &str,
        git_url: &str,
        forge_url: &str,
        token: &str,
        inventory: PathBuf,
        charts: PathBuf,
        workdir: PathBuf,
    ) -> Ci {
        let cache = workdir.join("render-cache");
        Ci {
            gate,
            slug: slug.into(),
            repo_url: repo_url.into(),
            git_url: git_url.into(),
            forge_url: forge_url.into(),
            token: token.into(),
            inventory,
            charts,
            chart_repo_mirrors: Vec::new(),
            workdir,
            cache,
            enabled: true,
            gitlab: false,
            checked: BTreeSet::new(),
        }
    }

    fn gate(&self) -> Command {
        let mut command = Command::new(&self.gate);
        command
            .env("GATE_CACHE_DIR", &self.cache)
            .env("GITHUB_TOKEN", &self.token);
        command
    }

    fn common(&self, command: &mut Command, checkout: &std::path::Path) {
        command
            .arg("--repo")
            .arg(checkout)
            .args(["--repo-url", &self.repo_url])
            .arg("--inventory")
            .arg(&self.inventory)
            .arg("--charts")
            .arg(&self.charts);
        for (from, to) in &self.chart_repo_mirrors {
            command
                .arg("--chart-repo-mirror")
                .arg(format!("{from}={to}"));
        }
    }

    pub async fn tick(&mut self, forge: &ForgeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        if !self.enabled {
            return false;
        }
        for (number, head, _branch) in forge.open_pulls(&self.slug) {
            if !self.checked.insert((number, head.clone())) {
                continue;
            }
            progress = true;
            let checkout = self.workdir.join("checkout");
            let prepared = if checkout.join(".git").exists() {
                crate::git::git(
                    &checkout,
                    &[
                        "fetch",
                        "--quiet",
                        "origin",
                        "+refs/heads/*:refs/remotes/origin/*",
                    ],
                )
                .map(|_| ())
            } else {
                std::fs::create_dir_all(&self.workdir)
                    .map_err(anyhow::Error::from)
                    .and_then(|_| {
                        crate::git::git(
                            &self.workdir,
                            &["clone", "--quiet", &self.git_url, "checkout"],
                        )
                        .map(|_| ())
                    })
            };
            if let Err(e) = prepared {
                transcript.say("ci", format!("#{number}: cannot check out: {e}"));
                continue;
            }
            let mut pull = self.gate();
            pull.args(["--quiet", "charts", "pull", "--revision", &head]);
            self.common(&mut pull, &checkout);
            let pulled = tokio::task::spawn_blocking(move || pull.output()).await;
            match pulled {
                Ok(Ok(output)) if !output.status.success() => {
                    transcript.say(
                        "ci",
                        format!(
                            "#{number} at {}: gate charts pull failed: {}",
                            &head[..7],
                            String::from_utf8_lossy(&output.stderr).trim()
                        ),
                    );
                }
                Ok(Err(e)) => transcript.say("ci", format!("#{number}: cannot run gate: {e}")),
                _ => {}
            }
            let mut publish = self.gate();
            let api = if self.gitlab {
                format!("{}/api/v4", self.forge_url)
            } else {
                self.forge_url.clone()
            };
            publish.args([
                "publish",
                "--repo-slug",
                &self.slug,
                "--pr",
                &number.to_string(),
                "--forge-url",
                &api,
            ]);
            if self.gitlab {
                publish.args(["--forge", "gitlab"]);
            }
            self.common(&mut publish, &checkout);
            let output = tokio::task::spawn_blocking(move || publish.output()).await;
            match output {
                Ok(Ok(output)) => {
                    let outcome = match output.status.code() {
                        Some(0) => "green",
                        Some(1) => "blocked",
                        Some(2) => "could not decide",
                        _ => "failed",
                    };
                    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
                    let detail = if stderr.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", stderr.lines().last().unwrap_or(""))
                    };
                    transcript.say(
                        "ci",
                        format!(
                            "gate publish {}#{number} at {}: {outcome}, exit {}{detail}",
                            self.slug,
                            &head[..7],
                            output.status.code().unwrap_or(-1)
                        ),
                    );
                }
                Ok(Err(e)) => transcript.say("ci", format!("#{number}: cannot run gate: {e}")),
                Err(e) => transcript.say("ci", format!("#{number}: {e}")),
            }
        }
        progress
    }
}
