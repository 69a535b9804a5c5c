//! The render engine's room for executing queued jobs: de-duplication, the cache, helm and
//! kustomize runs.

use std::path::Path;

use super::engine::Engine;
use crate::render::cache::{Level, RenderCache};
use crate::render::progress;
use crate::render::source::RenderJob;
use crate::render::tools::Tool;
use crate::render::util::{parallel_map, trace};
use crate::render::{RenderConfig, charts, confine, kustomize, parsed, source};
use crate::yaml;

impl Engine<'_> {
    /// The tools a job's output depends on, with their versions: the part of its persistent
    /// cache entry its render key leaves out.
    fn tools_of(&self, job: &RenderJob) -> String {
        let helm = || format!("helm {}", self.config.helm.version());
        match job {
            RenderJob::Helm(_) => helm(),
            RenderJob::Kustomize(_) => {
                // Asked the first time a Kustomize render is looked up (`Tool::version` keeps it).
                let kubectl = self
                    .config
                    .kubectl
                    .as_ref()
                    .map(Tool::version)
                    .unwrap_or_default();
                // With --enable-helm, the charts a kustomization names are inflated by helm.
                if self.config.kustomize_enable_helm {
                    format!("kubectl {kubectl}\n{}", helm())
                } else {
                    format!("kubectl {kubectl}")
                }
            }
            RenderJob::Objects(_) => String::new(),
        }
    }

    /// Runs every queued job whose inputs were not rendered before: identical inputs run once,
    /// cached results are read back, the rest run in parallel.
    pub(super) fn execute_pending_jobs(&mut self) {
        let mut unique: Vec<(String, RenderJob)> = Vec::new();
        for (key, job) in std::mem::take(&mut self.queued) {
            if self.memo.contains_key(&key) || unique.iter().any(|(k, _)| *k == key) {
                continue;
            }
            unique.push((key, job));
        }
        self.stats.unique_renders += unique.len();
        progress::planned(unique.len());
        let mut to_run = Vec::new();
        let mut theirs = Vec::new();
        let mut guard = parsed::ClaimGuard::new(&self.config.parsed);
        let mut mine = Vec::new();
        for (key, job) in unique {
            match self.config.parsed.claim(&key) {
                parsed::Claim::Done(parsed) => {
                    self.memo.insert(key, parsed);
                    progress::done();
                    continue;
                }
                parsed::Claim::Theirs => {
                    theirs.push(key);
                    continue;
                }
                parsed::Claim::Mine => guard.hold(&key),
            }
            let entry = RenderCache::entry(&key, &self.tools_of(&job));
            mine.push((key, entry, job));
        }
        // The disk, then (one batch for the wave) the second level for what the disk lacks;
        // each answer parsed as it comes, while the rest arrive. The second level's answers go
        // to the disk once parsed (`keep`), off the render's path.
        let entries: Vec<String> = mine.iter().map(|(_, entry, _)| entry.clone()).collect();
        let mut mine: Vec<Option<(String, String, RenderJob)>> =
            mine.into_iter().map(Some).collect();
        let mut answers = Vec::new();
        {
            let config = self.config;
            let jobs = config.jobs.max(1);
            let (memo, stats) = (&mut self.memo, &mut self.stats);
            config.cache.find_each(&entries, &mut |batch| {
                let mut to_parse = Vec::new();
                let mut from_second = Vec::new();
                for (i, found) in batch {
                    let Some((key, entry, job)) = mine.get_mut(i).and_then(Option::take) else {
                        continue;
                    };
                    match found {
                        Some((text, level)) => {
                            stats.cache_hits += 1;
                            if level == Level::Second {
                                stats.remote_hits += 1;
                            }
                            from_second.push((level == Level::Second).then_some(entry));
                            progress::cache_hit();
                            to_parse.push(parsed::Output {
                                key,
                                label: "cached render".into(),
                                text,
                            });
                        }
                        None => to_run.push((key, entry, job)),
                    }
                }
                if to_parse.is_empty() {
                    return;
                }
                for (key, parsed) in config.parsed.parse(&to_parse, jobs) {
                    memo.insert(key, parsed);
                }
                answers.extend(
                    to_parse
                        .into_iter()
                        .zip(from_second)
                        .filter_map(|(output, entry)| Some((entry?, output.text))),
                );
            });
        }
        // Every entry is answered once; one left unanswered is rendered.
        to_run.extend(mine.into_iter().flatten());
        self.config.cache.keep(answers);
        for (_, _, job) in &to_run {
            match job {
                RenderJob::Helm(_) => self.stats.helm_runs += 1,
                RenderJob::Kustomize(_) => self.stats.kustomize_runs += 1,
                RenderJob::Objects(_) => {}
            }
        }
        longest_first(&mut to_run, |dir| {
            let digests = self.chart_digests.lock().unwrap_or_else(|p| p.into_inner());
            match digests.get(dir) {
                Some(Ok((_, bytes))) => *bytes,
                _ => 0,
            }
        });
        let config = self.config;
        let work = self.work.clone();
        let jobs = config.jobs.max(1);
        // Each fresh output is parsed by the worker that rendered it, outside its process
        // slot, while other renders run; then stored.
        let results = parallel_map(to_run, jobs, |(key, entry, job)| {
            let output = {
                let _slot = config.parsed.slot(jobs);
                trace(&key[..8], "job started");
                let started = std::time::Instant::now();
                let output = run_job(config, &work, &key, &job);
                let label = match (&output, &job) {
                    (Ok((label, _)), _) => label.clone(),
                    (Err(_), RenderJob::Helm(h)) => format!("helm template {}", h.chart_label),
                    (Err(_), RenderJob::Kustomize(k)) => format!("kustomize build {}", k.path),
                    (Err(_), RenderJob::Objects(_)) => "objects".to_string(),
                };
                progress::rendered(&label, started.elapsed());
                output
            };
            trace(&key[..8], "job rendered");
            match output {
                Ok((label, text)) => {
                    let output = parsed::Output { key, label, text };
                    let (key, parsed) = config
                        .parsed
                        .parse(std::slice::from_ref(&output), 1)
                        .pop()
                        .unwrap_or((output.key.clone(), Err("no parse result".into())));
                    trace(&key[..8], "job parsed");
                    if parsed.is_ok() {
                        config.cache.store(&entry, output.text);
                    }
                    (key, parsed)
                }
                Err(message) => {
                    config.parsed.insert(&key, Err(message.clone()));
                    (key, Err(message))
                }
            }
        });
        for (key, parsed) in results {
            self.memo.insert(key, parsed);
        }
        drop(guard);
        // Renders another render of this run was producing.
        for key in theirs {
            let parsed = self.config.parsed.wait(&key);
            self.memo.insert(key, parsed);
            progress::done();
        }
    }
}

/// Why [`run_helm`] has no output: its message is the one a render would give.
#[derive(Debug, thiserror::Error)]
pub enum HelmRunError {
    /// No scratch directory to run helm in.
    #[error("scratch directory: {0}")]
    Scratch(std::io::Error),
    /// The job failed: the renderer's message (helm's first error line, the chart unreadable,
    /// its output not UTF-8).
    #[error("{0}")]
    Render(String),
}

/// Runs one helm job on its own (confined like every render's helm), for a check outside a
/// render: Bosun's values migration renders the chart with the values it proposes. Returns
/// helm's output, or its error.
pub fn run_helm(config: &RenderConfig, job: &source::HelmJob) -> Result<String, HelmRunError> {
    let work = crate::scratch::dir("helm").map_err(HelmRunError::Scratch)?;
    let key = job.render_key();
    run_job(config, work.path(), &key, &RenderJob::Helm(job.clone()))
        .map(|(_, text)| text)
        .map_err(HelmRunError::Render)
}

/// Runs one helm or kustomize job; returns (label, stdout).
fn run_job(
    config: &RenderConfig,
    work: &Path,
    key: &str,
    job: &RenderJob,
) -> Result<(String, String), String> {
    let scratch = work.join(format!("job-{}", &key[..key.len().min(16)]));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    match job {
        RenderJob::Helm(h) => {
            let chart_path = match &h.chart {
                source::ChartLocation::Mirror(dir) => dir.clone(),
                source::ChartLocation::Git { snapshot, path } => snapshot
                    .materialized_root()
                    .map_err(|e| e.to_string())?
                    .path()
                    .join(path),
            };
            let args = h.args(&chart_path, &scratch)?;
            let output = config
                .helm
                .run(config.helm.confined(&work.join("helm-home")).args(&args))
                .map_err(|e| format!("helm template of {}: {e}", h.chart_label))?;
            if !output.status.success() {
                return Err(format!(
                    "helm template of {} failed: {}",
                    h.chart_label,
                    charts::first_error_line(&String::from_utf8_lossy(&output.stderr))
                ));
            }
            let label = format!("helm template {}", h.chart_label);
            let text = utf8_owned(output.stdout, &label)?;
            Ok((label, text))
        }
        RenderJob::Kustomize(k) => {
            let kubectl = config.kubectl.as_ref().ok_or(
                "a Kustomize source needs kubectl (run `cargo xtask tools`, pass --kubectl PATH or set GATE_KUBECTL)",
            )?;
            let root = k.snapshot.materialized_root().map_err(|e| e.to_string())?;
            let build = k.build_dir(root.path(), &key[..key.len().min(16)])?;
            let with_charts =
                kustomize::check_confined(&build.root, &build.dir, config.kustomize_enable_helm)
                    .map_err(|e| format!("kustomize build of {}: {e}", k.path))?;
            // Charts are inflated into a private copy of the tree (the shared one stays as
            // the commit has it).
            let copy = if !with_charts.is_empty() {
                let tree = crate::scratch::dir("tree")
                    .map_err(|e| format!("cannot copy the tree: {e}"))?;
                kustomize::copy_dir(&build.root, tree.path())
                    .map_err(|e| format!("{}: {e}", tree.path().display()))?;
                let dir = tree
                    .path()
                    .join(build.dir.strip_prefix(&build.root).unwrap_or(Path::new("")));
                kustomize::inflate(
                    tree.path(),
                    &with_charts,
                    &config.helm,
                    config.charts.as_deref(),
                    &scratch,
                )
                .map_err(|e| format!("kustomize build of {}: {e}", k.path))?;
                Some((tree, dir))
            } else {
                None
            };
            let dir = copy.as_ref().map(|(_, d)| d).unwrap_or(&build.dir);
            let output = kubectl
                .run(
                    kubectl
                        .confined(&work.join("helm-home"))
                        .arg("kustomize")
                        .arg(dir),
                )
                .map_err(|e| format!("kustomize build of {}: {e}", k.path))?;
            if !output.status.success() {
                return Err(format!(
                    "kustomize build of {} failed: {}",
                    k.path,
                    confine::stderr_cause(&output.stderr, 3)
                ));
            }
            let label = format!("kustomize build {}", k.path);
            let text = utf8_owned(output.stdout, &label)?;
            Ok((label, text))
        }
        RenderJob::Objects(_) => Ok((String::new(), String::new())),
    }
}

/// A tool's output as text without copying it (megabytes for a CRD-heavy chart), or the
/// error naming the first byte that is not UTF-8.
fn utf8_owned(bytes: Vec<u8>, label: &str) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|e| match yaml::utf8(e.as_bytes(), label) {
        Err(message) => message,
        Ok(_) => format!("{label}: not UTF-8 text"),
    })
}

/// The renders of a wave, the costliest first, so that the process slots do not end on one
/// long render while the others idle (a CRD-heavy chart takes ten times a small one): a helm
/// render's cost is its chart's bytes (`bytes_of` a mirror's chart directory, as its digest
/// read them; a chart in a repository, whose files are not on disk, counts as small), the
/// others' none. Stable: equal costs keep their order.
fn longest_first(to_run: &mut [(String, String, RenderJob)], bytes_of: impl Fn(&Path) -> u64) {
    to_run.sort_by_cached_key(|(_, _, job)| {
        let bytes = match job {
            RenderJob::Helm(helm) => match &helm.chart {
                source::ChartLocation::Mirror(dir) => bytes_of(dir),
                source::ChartLocation::Git { .. } => 0,
            },
            RenderJob::Kustomize(_) | RenderJob::Objects(_) => 0,
        };
        std::cmp::Reverse(bytes)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::source::{ChartLocation, HelmJob};

    #[test]
    fn the_largest_charts_render_first() {
        let charts = tempfile::tempdir().unwrap();
        let chart = |name: &str, bytes: usize| {
            let dir = charts.path().join(name);
            std::fs::create_dir_all(dir.join("templates/crds")).unwrap();
            std::fs::write(dir.join("Chart.yaml"), "name: x\n").unwrap();
            std::fs::write(dir.join("templates/crds/a.yaml"), "x".repeat(bytes)).unwrap();
            dir
        };
        let job = |key: &str, dir: std::path::PathBuf| {
            let job = RenderJob::Helm(HelmJob {
                chart_label: key.into(),
                ..HelmJob::of_chart(ChartLocation::Mirror(dir))
            });
            (key.to_string(), String::new(), job)
        };
        let (small, heavy, middle) = (
            chart("small", 10),
            chart("heavy", 40_000),
            chart("mid", 900),
        );
        let mut to_run = vec![
            job("small-1", small.clone()),
            job("heavy-1", heavy.clone()),
            job("small-2", small),
            job("middle", middle),
            job("heavy-2", heavy),
        ];
        longest_first(&mut to_run, |dir| {
            crate::render::cache::digest_and_bytes(dir).map_or(0, |(_, bytes)| bytes)
        });
        let order: Vec<&str> = to_run.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(
            order,
            ["heavy-1", "heavy-2", "middle", "small-1", "small-2"]
        );
    }
}
