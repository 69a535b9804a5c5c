//! `bosun serve`: the intake Kargo's `http` promotion step POSTs to, a single worker that
//! triages one pull request at a time, and `/healthz`, `/metrics`, `/jobs`.
//!
//! The intake authenticates before it does anything: `Authorization: Bearer <secret>` or
//! `X-Bosun-Signature-256: sha256=<hex HMAC-SHA256 of the body>`. Anything else is a 401 and
//! no other effect. A delivery is idempotent per repository + pull request + head SHA.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
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
use tokio::sync::mpsc;

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
    /// accepted, duplicate, unauthorized, invalid, unknown_repository, forge_error
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
    pending: usize,
    running: Option<(String, u64)>,
    /// The latest runs (newest last), bounded.
    done: Vec<Run>,
    /// Open pull requests taken in, with the head last triaged (for the poller).
    tracked: BTreeMap<(String, u64), String>,
}

pub struct Server {
    bosun: Arc<Bosun>,
    secret: Vec<u8>,
    jobs: Mutex<Jobs>,
    metrics: Metrics,
    queue: mpsc::UnboundedSender<(RepoSlug, u64, String)>,
}

type Shared = Arc<Server>;

fn lock(server: &Server) -> MutexGuard<'_, Jobs> {
    server
        .jobs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const DONE_KEPT: usize = 200;

impl Server {
    /// Starts the worker; returns the server and the router to serve.
    pub fn start(bosun: Arc<Bosun>, secret: Vec<u8>) -> (Shared, Router) {
        let (queue, mut receiver) = mpsc::unbounded_channel::<(RepoSlug, u64, String)>();
        let server = Arc::new(Server {
            bosun,
            secret,
            jobs: Mutex::new(Jobs::default()),
            metrics: Metrics::new(),
            queue,
        });
        let worker = server.clone();
        tokio::spawn(async move {
            while let Some((slug, number, delivered_head)) = receiver.recv().await {
                {
                    let mut jobs = lock(&worker);
                    jobs.pending = jobs.pending.saturating_sub(1);
                    jobs.running = Some((slug.to_string(), number));
                }
                let started = std::time::Instant::now();
                let run = match worker.bosun.triage(&slug, number).await {
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
                worker
                    .metrics
                    .duration
                    .observe(started.elapsed().as_secs_f64());
                worker
                    .metrics
                    .triages
                    .get_or_create(&PathLabels {
                        path: run.path.clone(),
                    })
                    .inc();
                let mut jobs = lock(&worker);
                jobs.running = None;
                let repository = slug.to_string();
                match run.path.as_str() {
                    // A failed triage (the forge or git failing) may be delivered again.
                    "error" => {
                        jobs.seen.remove(&(repository, number, delivered_head));
                    }
                    // Nothing more arrives for a closed pull request: forget its deliveries.
                    "closed" => {
                        jobs.tracked.remove(&(repository.clone(), number));
                        jobs.seen
                            .retain(|(r, n, _)| !(*r == repository && *n == number));
                    }
                    _ => {
                        let last_head = run.pushed.last().unwrap_or(&run.head).clone();
                        jobs.tracked
                            .insert((repository.clone(), number), last_head.clone());
                        // A head Bosun itself produced and judged is not a new delivery.
                        jobs.seen.insert((repository, number, last_head));
                    }
                }
                jobs.done.push(run);
                if jobs.done.len() > DONE_KEPT {
                    jobs.done.remove(0);
                }
            }
        });
        let router = Router::new()
            .route("/intake", post(intake))
            .route("/healthz", get(|| async { "ok" }))
            .route("/metrics", get(metrics))
            .route("/jobs", get(jobs))
            .with_state(server.clone());
        (server, router)
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
            && let Some(token) = value.strip_prefix("Bearer ")
        {
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

    /// Takes a pull request in (deduplicated by head) and queues a triage.
    pub fn enqueue(&self, slug: &RepoSlug, number: u64, head: &str) -> bool {
        let mut jobs = lock(self);
        if !jobs
            .seen
            .insert((slug.to_string(), number, head.to_string()))
        {
            return false;
        }
        jobs.pending += 1;
        jobs.tracked.entry((slug.to_string(), number)).or_default();
        drop(jobs);
        let _ = self.queue.send((slug.clone(), number, head.to_string()));
        true
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
                    self.enqueue(&slug, number, &pr.head_sha);
                }
                Ok(pr) if pr.state != "open" => {
                    lock(self).tracked.remove(&(repository, number));
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

async fn intake(State(server): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
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
    if server.enqueue(&slug, request.pull_request, &head) {
        server.count("accepted");
        answer(
            StatusCode::ACCEPTED,
            json!({"status": "accepted", "repository": slug.to_string(), "pullRequest": request.pull_request, "headSha": head}),
        )
    } else {
        server.count("duplicate");
        answer(
            StatusCode::OK,
            json!({"status": "duplicate", "repository": slug.to_string(), "pullRequest": request.pull_request, "headSha": head}),
        )
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
            "pending": jobs.pending,
            "running": jobs.running.as_ref().map(|(r, n)| json!({"repository": r, "pullRequest": n})),
            "idle": jobs.pending == 0 && jobs.running.is_none(),
            "done": jobs.done,
        }),
    )
}
