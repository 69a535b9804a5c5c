//! `bosun serve`: the intake Kargo's `http` promotion step POSTs to, a single worker that
//! triages one pull request at a time, and `/healthz`, `/metrics`, `/jobs`.
//!
//! The intake authenticates before it does anything: `Authorization: Bearer <secret>` or
//! `X-Bosun-Signature-256: sha256=<hex HMAC-SHA256 of the body>`. Anything else is a 401 and
//! no other effect. A delivery is idempotent per repository + pull request + head SHA.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hmac::{Hmac, Mac};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::sync::Notify;

use super::journal::{self, Journal};
use super::triage::{Bosun, Run};
use crate::forge::RepoSlug;

/// The body Kargo's `http` step sends (docs/bosun.md has a ready-to-paste step).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntakeRequest {
    /// `owner/name`.
    pub repository: String,
    pub pull_request: u64,
    /// The head the promotion pushed; when absent, the pull request's head now.
    #[serde(default)]
    pub head_sha: Option<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    /// accepted, duplicate, queue_full, not_recorded, unauthorized, invalid,
    /// unknown_repository, forge_error
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    /// wait, green, worth-a-look, swap, escalate, handoff, closed, error
    path: String,
}

struct Metrics {
    registry: Registry,
    intakes: Family<ResultLabels, Counter>,
    triages: Family<PathLabels, Counter>,
    duration: Histogram,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("bosun");
        let intakes = Family::<ResultLabels, Counter>::default();
        registry.register("intakes", "Intake deliveries by result", intakes.clone());
        let triages = Family::<PathLabels, Counter>::default();
        registry.register("triages", "Triages by the path taken", triages.clone());
        let duration = Histogram::new(exponential_buckets(0.05, 2.0, 12));
        registry.register(
            "triage_duration_seconds",
            "Time from taking a pull request to the last action",
            duration.clone(),
        );
        Metrics {
            registry,
            intakes,
            triages,
            duration,
        }
    }
}

#[derive(Default)]
struct Jobs {
    seen: HashSet<(String, u64, String)>,
    /// Pull requests waiting for the worker, oldest first; each once.
    queue: VecDeque<(String, u64)>,
    /// The newest delivered head of each queued pull request.
    heads: HashMap<(String, u64), String>,
    running: Option<(String, u64)>,
    /// The latest runs (newest last), bounded.
    done: Vec<Run>,
    /// Open pull requests taken in, with the head last triaged (for the poller).
    tracked: BTreeMap<(String, u64), String>,
    /// Failed triages in a row per pull request, and the head they failed on (reset by one
    /// that finishes, and by a failure on another head).
    failures: HashMap<(String, u64), (String, u32)>,
    /// Failed triages waiting out their backoff before they are queued again.
    retrying: usize,
}

/// A failed triage (the forge, git or the API server failing) is queued again after 2, 4, 8,
/// 16 and 32 s; after that only a new delivery, the poller or a restart tries again. A failure
/// is not a verdict: a transient 500 must not leave a pull request without its gate.
pub const RETRIES_AFTER_FAILURE: u32 = 5;

fn retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.clamp(1, RETRIES_AFTER_FAILURE))
}

/// Counts a failed triage of `head`: the run of failures on that head so far.
fn record_failure(jobs: &mut Jobs, key: &(String, u64), head: &str) -> u32 {
    let entry = jobs
        .failures
        .entry(key.clone())
        .or_insert_with(|| (head.to_string(), 0));
    if entry.0 != head {
        *entry = (head.to_string(), 0);
    }
    entry.1 += 1;
    entry.1
}

/// Whether a retry scheduled after failure number `scheduled` still stands when it wakes: no
/// triage of the pull request has finished, failed again or started since, and none is
/// queued (a newer delivery, or the same one, triages it anyway).
fn retry_stands(jobs: &Jobs, key: &(String, u64), scheduled: u32) -> bool {
    jobs.failures.get(key).map(|(_, n)| *n) == Some(scheduled)
        && !jobs.heads.contains_key(key)
        && jobs.running.as_ref() != Some(key)
}

/// The most pull requests of one repository waiting for the worker; a delivery past it is
/// answered 429 (Kargo's step retries), never silently dropped.
pub const MAX_QUEUED_PER_REPOSITORY: usize = 64;
/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest intake body (an intake request is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Connections served at once; past it, new ones wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 256;

pub struct Server {
    bosun: Arc<Bosun>,
    secret: Vec<u8>,
    jobs: Mutex<Jobs>,
    metrics: Metrics,
    journal: Journal,
    wake: Notify,
}

type Shared = Arc<Server>;

fn lock(server: &Server) -> MutexGuard<'_, Jobs> {
    server
        .jobs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const DONE_KEPT: usize = 200;

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// Queued (or its queued head replaced) and journaled.
    Accepted,
    /// This head of this pull request was taken before.
    Duplicate,
    /// The repository has [`MAX_QUEUED_PER_REPOSITORY`] pull requests waiting.
    Full,
    /// The journal could not be written: nothing was accepted.
    NotRecorded(String),
}

impl Server {
    /// Opens the journal in Bosun's work folder, replays what an earlier process accepted and
    /// tracked, starts the worker; returns the server and the router to serve.
    pub fn start(bosun: Arc<Bosun>, secret: Vec<u8>) -> std::io::Result<(Shared, Router)> {
        let journal = Journal::open(&bosun.workdir.join("journal"))?;
        let server = Arc::new(Server {
            bosun,
            secret,
            jobs: Mutex::new(Jobs::default()),
            metrics: Metrics::new(),
            journal,
            wake: Notify::new(),
        });
        {
            let tracked = server.journal.load(journal::Kind::Tracked)?;
            let mut jobs = lock(&server);
            for entry in tracked {
                jobs.tracked
                    .insert((entry.repository, entry.pull_request), entry.head);
            }
        }
        for entry in server.journal.load(journal::Kind::Pending)? {
            match entry.repository.parse::<RepoSlug>() {
                Ok(slug) => {
                    tracing::info!(repository = %slug, pr = entry.pull_request, "replaying an accepted delivery");
                    server.enqueue(&slug, entry.pull_request, &entry.head);
                }
                Err(e) => tracing::warn!("journal entry {entry:?}: {e}"),
            }
        }
        let worker = server.clone();
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut jobs = lock(&worker);
                    let next = jobs.queue.pop_front();
                    if let Some(key) = &next {
                        let head = jobs.heads.remove(key).unwrap_or_default();
                        jobs.running = Some(key.clone());
                        Some((key.clone(), head))
                    } else {
                        None
                    }
                };
                let Some(((repository, number), delivered_head)) = next else {
                    worker.wake.notified().await;
                    continue;
                };
                let Ok(slug) = repository.parse::<RepoSlug>() else {
                    continue;
                };
                Server::work(&worker, &slug, number, delivered_head).await;
            }
        });
        let router = Router::new()
            .route("/intake", post(intake))
            .route("/healthz", get(|| async { "ok" }))
            .route("/metrics", get(metrics))
            .route("/jobs", get(jobs))
            .with_state(server.clone());
        Ok((server, router))
    }

    /// One triage, then the bookkeeping that makes it durable.
    async fn work(self: &Arc<Self>, slug: &RepoSlug, number: u64, delivered_head: String) {
        let started = std::time::Instant::now();
        let run = match self.bosun.triage(slug, number).await {
            Ok(run) => run,
            Err(e) => {
                tracing::error!(repository = %slug, pr = number, "triage failed: {e}");
                Run {
                    repository: slug.to_string(),
                    pull_request: number,
                    path: "error".into(),
                    lines: vec![format!("triage failed: {e}")],
                    ..Run::default()
                }
            }
        };
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .triages
            .get_or_create(&PathLabels {
                path: run.path.clone(),
            })
            .inc();
        let repository = slug.to_string();
        let key = (repository.clone(), number);
        let mut jobs = lock(self);
        jobs.running = None;
        let tracked = match run.path.as_str() {
            // A failed triage (the forge or git failing) may be delivered again; it stays in
            // the journal (a restart replays it) and is followed, so the poller tries again.
            "error" => {
                jobs.seen
                    .remove(&(repository.clone(), number, delivered_head.clone()));
                jobs.tracked.insert(key.clone(), String::new());
                let failures = record_failure(&mut jobs, &key, &delivered_head);
                if failures <= RETRIES_AFTER_FAILURE {
                    let delay = retry_delay(failures);
                    jobs.retrying += 1;
                    let server = self.clone();
                    let slug = slug.clone();
                    let key = key.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let mut jobs = lock(&server);
                        jobs.retrying -= 1;
                        // Decided and queued under one lock: nothing can slip in between.
                        if retry_stands(&jobs, &key, failures) {
                            tracing::info!(repository = %slug, pr = number, "trying a failed triage again");
                            match server.enqueue_locked(jobs, &slug, number, &delivered_head) {
                                Enqueued::Accepted | Enqueued::Duplicate => {}
                                Enqueued::Full => tracing::warn!(
                                    "cannot queue {slug}#{number} again: the queue is full; the poller or a new delivery will"
                                ),
                                Enqueued::NotRecorded(e) => {
                                    tracing::warn!("cannot queue {slug}#{number} again: {e}")
                                }
                            }
                        }
                    });
                }
                Some(String::new())
            }
            // Nothing more arrives for a closed pull request: forget its deliveries.
            "closed" => {
                jobs.failures.remove(&key);
                jobs.tracked.remove(&key);
                jobs.seen
                    .retain(|(r, n, _)| !(*r == repository && *n == number));
                if let Err(e) = self
                    .journal
                    .remove(journal::Kind::Tracked, &repository, number)
                {
                    tracing::warn!("journal: {e}");
                }
                None
            }
            _ => {
                jobs.failures.remove(&key);
                let last_head = run.pushed.last().unwrap_or(&run.head).clone();
                jobs.tracked.insert(key.clone(), last_head.clone());
                // A head Bosun itself produced and judged is not a new delivery.
                jobs.seen
                    .insert((repository.clone(), number, last_head.clone()));
                Some(last_head)
            }
        };
        // A newer delivery of the same pull request queued meanwhile keeps its journal entry.
        // Decided and removed under the lock `enqueue` journals under: no delivery accepted in
        // between can lose its entry. A failed triage keeps its entry.
        if run.path != "error"
            && !jobs.heads.contains_key(&key)
            && let Err(e) = self
                .journal
                .remove(journal::Kind::Pending, &repository, number)
        {
            tracing::warn!("journal: {e}");
        }
        jobs.done.push(run);
        if jobs.done.len() > DONE_KEPT {
            jobs.done.remove(0);
        }
        drop(jobs);
        if let Some(head) = tracked
            && let Err(e) = self.journal.put(
                journal::Kind::Tracked,
                &journal::Entry {
                    repository: repository.clone(),
                    pull_request: number,
                    head,
                },
            )
        {
            tracing::warn!("journal: {e}");
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .intakes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    fn authenticated(&self, headers: &HeaderMap, body: &[u8]) -> bool {
        if self.secret.is_empty() {
            return false;
        }
        if let Some(value) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            && let Some((scheme, token)) = value.split_once(' ')
            && scheme.eq_ignore_ascii_case("bearer")
        {
            let token = token.trim();
            return bool::from(token.as_bytes().ct_eq(&self.secret));
        }
        if let Some(value) = headers
            .get("x-bosun-signature-256")
            .and_then(|v| v.to_str().ok())
            && let Some(signature) = value.strip_prefix("sha256=")
            && let Ok(signature) = hex::decode(signature)
            && let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(&self.secret)
        {
            mac.update(body);
            return mac.verify_slice(&signature).is_ok();
        }
        false
    }

    /// Takes a pull request in (deduplicated by head), records it in the journal and queues a
    /// triage; a newer head of a queued pull request replaces the older one.
    pub fn enqueue(&self, slug: &RepoSlug, number: u64, head: &str) -> Enqueued {
        self.enqueue_locked(lock(self), slug, number, head)
    }

    /// `enqueue` under a lock the caller already holds.
    fn enqueue_locked(
        &self,
        mut jobs: MutexGuard<'_, Jobs>,
        slug: &RepoSlug,
        number: u64,
        head: &str,
    ) -> Enqueued {
        let repository = slug.to_string();
        let key = (repository.clone(), number);
        if jobs
            .seen
            .contains(&(repository.clone(), number, head.to_string()))
        {
            return Enqueued::Duplicate;
        }
        let queued = jobs.heads.contains_key(&key);
        if !queued
            && jobs.queue.iter().filter(|(r, _)| *r == repository).count()
                >= MAX_QUEUED_PER_REPOSITORY
        {
            return Enqueued::Full;
        }
        // Durable before it is accepted (the lock keeps journal and queue in step).
        if let Err(e) = self.journal.put(
            journal::Kind::Pending,
            &journal::Entry {
                repository: repository.clone(),
                pull_request: number,
                head: head.to_string(),
            },
        ) {
            return Enqueued::NotRecorded(e.to_string());
        }
        jobs.seen.insert((repository, number, head.to_string()));
        if let Some(older) = jobs.heads.insert(key.clone(), head.to_string()) {
            jobs.seen.remove(&(key.0.clone(), number, older));
        }
        if !queued {
            jobs.queue.push_back(key.clone());
        }
        jobs.tracked.entry(key).or_default();
        drop(jobs);
        self.wake.notify_one();
        Enqueued::Accepted
    }

    /// Re-triages tracked pull requests whose head moved (a person pushed): the gate runs on
    /// every new head commit.
    pub async fn poll(&self) {
        let tracked: Vec<((String, u64), String)> = lock(self)
            .tracked
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for ((repository, number), last) in tracked {
            let Ok(slug) = repository.parse::<RepoSlug>() else {
                continue;
            };
            match self.bosun.forge.pull_request(&slug, number).await {
                Ok(pr) if pr.state == "open" && pr.head_sha != last => {
                    if let Enqueued::NotRecorded(e) = self.enqueue(&slug, number, &pr.head_sha) {
                        tracing::warn!("cannot queue {slug}#{number}: {e}");
                    }
                }
                Ok(pr) if pr.state != "open" => {
                    lock(self).tracked.remove(&(repository.clone(), number));
                    if let Err(e) = self
                        .journal
                        .remove(journal::Kind::Tracked, &repository, number)
                    {
                        tracing::warn!("journal: {e}");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot read {slug}#{number}: {e}"),
            }
        }
    }
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn intake(State(server): State<Shared>, request: axum::extract::Request) -> Response {
    let headers = request.headers().clone();
    let body = match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            server.count("invalid");
            return answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": format!("the body is larger than {MAX_BODY_BYTES} bytes or broken")}),
            );
        }
        Err(_) => {
            server.count("invalid");
            return answer(
                StatusCode::REQUEST_TIMEOUT,
                json!({"error": "the body did not arrive in time"}),
            );
        }
    };
    if !server.authenticated(&headers, &body) {
        server.count("unauthorized");
        return answer(
            StatusCode::UNAUTHORIZED,
            json!({"error": "missing or wrong credentials"}),
        );
    }
    let request: IntakeRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            server.count("invalid");
            return answer(
                StatusCode::BAD_REQUEST,
                json!({"error": format!("the body is not an intake request: {e}")}),
            );
        }
    };
    let slug: RepoSlug = match request.repository.parse() {
        Ok(slug) => slug,
        Err(e) => {
            server.count("invalid");
            return answer(StatusCode::BAD_REQUEST, json!({"error": e}));
        }
    };
    if server.bosun.config.repository(&slug).is_none() {
        server.count("unknown_repository");
        return answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"error": format!("{slug} is not a repository in bosun.yaml")}),
        );
    }
    let head = match request.head_sha {
        // A head from outside must be a commit id before anything uses it (git reads it).
        Some(head) if !crate::git::is_commit_id(&head) => {
            server.count("invalid");
            return answer(
                StatusCode::BAD_REQUEST,
                json!({"error": format!(
                    "headSha {:?} is not a commit id (40 or 64 lowercase hex digits)",
                    head.chars().take(80).collect::<String>()
                )}),
            );
        }
        Some(head) => head,
        None => match server
            .bosun
            .forge
            .pull_request(&slug, request.pull_request)
            .await
        {
            Ok(pr) => pr.head_sha,
            Err(e) => {
                server.count("forge_error");
                return answer(
                    StatusCode::BAD_GATEWAY,
                    json!({"error": format!("cannot read the pull request: {e}")}),
                );
            }
        },
    };
    let said = json!({"repository": slug.to_string(), "pullRequest": request.pull_request, "headSha": head});
    let with = |status: &str| {
        let mut body = said.clone();
        body["status"] = status.into();
        body
    };
    match server.enqueue(&slug, request.pull_request, &head) {
        Enqueued::Accepted => {
            server.count("accepted");
            answer(StatusCode::ACCEPTED, with("accepted"))
        }
        Enqueued::Duplicate => {
            server.count("duplicate");
            answer(StatusCode::OK, with("duplicate"))
        }
        Enqueued::Full => {
            server.count("queue_full");
            let mut body = with("queue-full");
            body["error"] = format!(
                "{MAX_QUEUED_PER_REPOSITORY} pull requests of {slug} are waiting; deliver again later"
            )
            .into();
            (
                [(header::RETRY_AFTER, "30")],
                answer(StatusCode::TOO_MANY_REQUESTS, body),
            )
                .into_response()
        }
        Enqueued::NotRecorded(e) => {
            server.count("not_recorded");
            tracing::error!(
                "cannot journal a delivery of {slug}#{}: {e}",
                request.pull_request
            );
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "the delivery could not be recorded; deliver again"}),
            )
        }
    }
}

async fn metrics(State(server): State<Shared>) -> Response {
    let mut text = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut text, &server.metrics.registry);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn jobs(State(server): State<Shared>) -> Response {
    let jobs = lock(&server);
    answer(
        StatusCode::OK,
        json!({
            "pending": jobs.queue.len(),
            "running": jobs.running.as_ref().map(|(r, n)| json!({"repository": r, "pullRequest": n})),
            "retrying": jobs.retrying,
            "idle": jobs.queue.is_empty() && jobs.running.is_none() && jobs.retrying == 0,
            "done": jobs.done,
        }),
    )
}

/// Serves `router` on `listener` until `shutdown` resolves, with a header read timeout and a
/// bound on connections served at once: a client that opens connections and never finishes a
/// request cannot exhaust the process's file descriptors or hold the intake.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let service = hyper_util::service::TowerToHyperService::new(router);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            permit = slots.clone().acquire_owned() => permit.map_err(std::io::Error::other)?,
        };
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    continue;
                }
            },
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = connection.await;
        });
    }
}

#[cfg(test)]
mod retry_tests {
    use super::*;

    #[test]
    fn failures_count_per_head_and_a_new_head_starts_again() {
        let mut jobs = Jobs::default();
        let key = ("o/r".to_string(), 1);
        assert_eq!(record_failure(&mut jobs, &key, "aaa"), 1);
        assert_eq!(record_failure(&mut jobs, &key, "aaa"), 2);
        assert_eq!(record_failure(&mut jobs, &key, "bbb"), 1);
        assert_eq!(retry_delay(1), Duration::from_secs(2));
        assert_eq!(retry_delay(RETRIES_AFTER_FAILURE), Duration::from_secs(32));
    }

    #[test]
    fn a_retry_gives_way_to_any_triage_since_its_failure() {
        let key = ("o/r".to_string(), 1);
        let mut jobs = Jobs::default();
        record_failure(&mut jobs, &key, "aaa");
        assert!(retry_stands(&jobs, &key, 1));
        // A newer delivery queued, or running.
        jobs.heads.insert(key.clone(), "bbb".into());
        assert!(!retry_stands(&jobs, &key, 1));
        jobs.heads.clear();
        jobs.running = Some(key.clone());
        assert!(!retry_stands(&jobs, &key, 1));
        jobs.running = None;
        // Another failure since (its own retry stands instead), or a finished triage.
        record_failure(&mut jobs, &key, "aaa");
        assert!(!retry_stands(&jobs, &key, 1));
        assert!(retry_stands(&jobs, &key, 2));
        jobs.failures.clear();
        assert!(!retry_stands(&jobs, &key, 2));
    }
}
