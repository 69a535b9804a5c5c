//! `bosun serve`: the intake Kargo's `http` promotion step POSTs to, a single worker that
//! triages one pull request at a time, and `/healthz`, `/metrics`, `/jobs`.
//!
//! The intake authenticates before it does anything: `Authorization: Bearer <secret>` or
//! `X-Bosun-Signature-256: sha256=<hex HMAC-SHA256 of the body>`. Anything else is a 401 and
//! no other effect. A delivery is idempotent per repository + pull request + head SHA. With
//! `forge.kind: gitlab`, GitLab's merge request webhook is taken too (`/webhooks/gitlab`,
//! authenticated by `X-Gitlab-Token`: [`gitlab`]).

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
use super::runner::{Bosun, Run, RunPath};
use crate::forge::RepoSlug;

pub mod gitlab;

/// The body Kargo's `http` step sends (docs/bosun.md has a ready-to-paste step).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntakeRequest {
    /// `owner/name`; on GitLab the project's full path (`group/sub/project`).
    pub repository: String,
    pub pull_request: u64,
    /// The head the promotion pushed; when absent, the pull request's head now.
    #[serde(default)]
    pub head_sha: Option<String>,
}

/// The route a delivery came in by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Intake {
    /// `/intake` (Kargo's `http` step).
    Intake,
    /// `/webhooks/gitlab`.
    GitlabHook,
}

impl Intake {
    /// The status of an authenticated, valid delivery Bosun does not take (`status` as the
    /// intake answers it: 429 queue full, 409 quarantined): GitLab's hook gets 200, since
    /// GitLab counts any other answer toward disabling the hook and never delivers again
    /// by itself (server/gitlab.rs); Kargo's `http` step reads the status and retries.
    fn not_taken(self, status: StatusCode) -> StatusCode {
        match self {
            Intake::Intake => status,
            Intake::GitlabHook => StatusCode::OK,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    /// accepted, duplicate, queue_full, not_recorded, unauthorized, invalid, ignored,
    /// unknown_repository, not_found, quarantined, forge_error
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    /// wait, green, worth-a-look, swap, escalate, handoff, closed, dropped, error
    path: &'static str,
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
    tracked: BTreeMap<(String, u64), Track>,
    /// Deliveries whose triage the process died in too often: pull request -> head. Never
    /// queued again; a new head is a new delivery.
    quarantined: BTreeMap<(String, u64), String>,
    /// The attempt count the running triage found before it counted itself (restored when
    /// the process stops gracefully: a SIGTERM is not a crash).
    running_attempt: Option<(String, u32)>,
    /// Finished polls of the tracked pull requests.
    polls: u64,
    /// Failed triages in a row per pull request, and the head they failed on (reset by one
    /// that finishes, and by a failure on another head).
    failures: HashMap<(String, u64), (String, u32)>,
    /// Failed triages waiting out their backoff before they are queued again.
    retrying: usize,
}

/// A pull request the poller follows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Track {
    /// The head last triaged to the end ("" when none was).
    head: String,
    /// The head the forge last showed, and when it changed (Unix seconds).
    seen_head: String,
    since: u64,
    /// Polls in a row the forge failed to answer; the next poll waits until `next_poll`.
    misses: u32,
    next_poll: u64,
}

impl Track {
    fn new(head: &str, now: u64) -> Track {
        Track {
            head: head.to_string(),
            seen_head: head.to_string(),
            since: now,
            ..Track::default()
        }
    }
}

/// A tracked pull request whose head has not changed for this long is forgotten (a delivery
/// or a new head starts following it again).
pub const TRACK_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// After a poll the forge did not answer, the next waits 2, 4, 8... minutes, at most this.
pub const POLL_BACKOFF_CAP: Duration = Duration::from_secs(6 * 3600);

/// What one poll does with a tracked pull request, from the forge's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PollStep {
    /// A head not triaged yet: queue it.
    Enqueue(String),
    /// Nothing new.
    Keep,
    /// Stop following it (why): closed, gone (404), or no new head for [`TRACK_EXPIRY`].
    Forget(&'static str),
    /// The forge failed: ask again after a pause that doubles.
    Backoff,
}

/// Decides a poll (and updates the head seen); pure but for `track`.
fn poll_step(
    track: &mut Track,
    answer: Result<&crate::forge::PullRequest, &crate::forge::ForgeError>,
    now: u64,
) -> PollStep {
    match answer {
        Ok(pr) if pr.state != "open" => PollStep::Forget("closed"),
        Ok(pr) => {
            track.misses = 0;
            track.next_poll = 0;
            if pr.head_sha != track.seen_head {
                track.seen_head = pr.head_sha.clone();
                track.since = now;
            }
            if now.saturating_sub(track.since) >= TRACK_EXPIRY.as_secs() {
                PollStep::Forget("no new head for 7 days")
            } else if pr.head_sha != track.head {
                PollStep::Enqueue(pr.head_sha.clone())
            } else {
                PollStep::Keep
            }
        }
        // A definite answer: the forge has no such pull request.
        Err(e) if matches!(e.status(), Some(404 | 410)) => {
            PollStep::Forget("the forge has no such pull request")
        }
        Err(_) => {
            track.misses = track.misses.saturating_add(1);
            let pause = 60u64
                .saturating_mul(1 << track.misses.min(20))
                .min(POLL_BACKOFF_CAP.as_secs());
            track.next_poll = now + pause;
            PollStep::Backoff
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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

/// Whether the poller asks the forge about a followed pull request at `now`: its pause is
/// over and no triage of it is queued or running (that triage reads the pull request itself;
/// a poll beside it would only ask the forge twice).
fn poll_due(jobs: &Jobs, key: &(String, u64), track: &Track, now: u64) -> bool {
    track.next_poll <= now && !jobs.heads.contains_key(key) && jobs.running.as_ref() != Some(key)
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
    /// GitLab's webhook token (`X-Gitlab-Token`); None: no `/webhooks/gitlab` route.
    gitlab_token: Option<Vec<u8>>,
    jobs: Mutex<Jobs>,
    metrics: Metrics,
    journal: Journal,
    wake: Notify,
}

type Shared = Arc<Server>;

/// The run of a triage that ended in an error: dropped (nothing to triage, now or later) or
/// failed (it may be tried again).
fn failed_run(slug: &RepoSlug, number: u64, e: super::runner::TriageError) -> Run {
    // A definite answer: nothing to triage, now or later.
    let dropped = matches!(
        e,
        super::runner::TriageError::UnknownRepository(_)
            | super::runner::TriageError::NoSuchPullRequest { .. }
    );
    if dropped {
        tracing::warn!(repository = %slug, pr = number, "delivery dropped: {e}");
    } else {
        tracing::error!(repository = %slug, pr = number, "triage failed: {e}");
    }
    Run {
        repository: slug.to_string(),
        pull_request: number,
        path: if dropped {
            RunPath::Dropped
        } else {
            RunPath::Error
        },
        lines: vec![format!(
            "{}: {e}",
            if dropped {
                "delivery dropped"
            } else {
                "triage failed"
            }
        )],
        ..Run::default()
    }
}

/// A triage that judged its pull request: its failures forgotten, the last head (the one
/// Bosun pushed, if any) followed and seen. Returns what the journal follows: (head, since).
fn track_judged(jobs: &mut Jobs, run: &Run, key: &(String, u64), now: u64) -> (String, u64) {
    jobs.failures.remove(key);
    let last_head = run.pushed.last().unwrap_or(&run.head).clone();
    let track = jobs
        .tracked
        .entry(key.clone())
        .or_insert_with(|| Track::new(&last_head, now));
    if track.seen_head != last_head {
        track.seen_head = last_head.clone();
        track.since = now;
    }
    track.head = last_head.clone();
    let since = track.since;
    // A head Bosun itself produced and judged is not a new delivery.
    jobs.seen.insert((key.0.clone(), key.1, last_head.clone()));
    (last_head, since)
}

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
    /// This head's triage killed the process before: it waits for a person.
    Quarantined,
}

impl Server {
    /// Opens the journal in Bosun's work folder, replays what an earlier process accepted and
    /// tracked, starts the worker; returns the server and the router to serve.
    ///
    /// An `attempt-` entry left by an earlier process is a triage it died in: after
    /// [`journal::CRASHES_BEFORE_QUARANTINE`] of them the delivery is quarantined (handed to a
    /// person, never replayed); fewer, and it is replayed after every other delivery.
    ///
    /// `gitlab_token`: with `forge.kind: gitlab`, the token GitLab's merge request webhook
    /// sends (`/webhooks/gitlab`, [`gitlab`]); None: that route does not exist.
    pub fn start(
        bosun: Arc<Bosun>,
        secret: Vec<u8>,
        gitlab_token: Option<Vec<u8>>,
    ) -> std::io::Result<(Shared, Router)> {
        let journal = Journal::open(&bosun.workdir.join("journal"))?;
        let server = Arc::new(Server {
            bosun,
            secret,
            gitlab_token,
            jobs: Mutex::new(Jobs::default()),
            metrics: Metrics::new(),
            journal,
            wake: Notify::new(),
        });
        server.restore()?;
        server.spawn_worker();
        let mut router = Router::new()
            .route("/intake", post(intake))
            .route("/healthz", get(|| async { "ok" }))
            .route("/metrics", get(metrics))
            .route("/jobs", get(jobs));
        if server.gitlab_token.is_some() {
            router = router.route(gitlab::ROUTE, post(gitlab::webhook));
        }
        let router = router.with_state(server.clone());
        Ok((server, router))
    }

    /// What an earlier process journaled: its crashed attempts (quarantined past the limit),
    /// the pull requests it tracked and quarantined (announced where it did not), and the
    /// deliveries it accepted, replayed (those a process died in last).
    fn restore(self: &Arc<Self>) -> std::io::Result<()> {
        let now = unix_now();
        for attempt in self.journal.load(journal::Kind::Attempt)? {
            if attempt.attempts >= journal::CRASHES_BEFORE_QUARANTINE {
                self.quarantine(&attempt)?;
            }
        }
        let suspects: HashSet<(String, u64, String)> = self
            .journal
            .load(journal::Kind::Attempt)?
            .into_iter()
            .map(|a| (a.repository, a.pull_request, a.head))
            .collect();
        let mut unannounced = Vec::new();
        {
            let tracked = self.journal.load(journal::Kind::Tracked)?;
            let quarantined = self.journal.load(journal::Kind::Quarantined)?;
            let mut jobs = lock(self);
            for entry in tracked {
                let since = if entry.since == 0 { now } else { entry.since };
                let mut track = Track::new(&entry.head, since);
                track.since = since;
                jobs.tracked
                    .insert((entry.repository, entry.pull_request), track);
            }
            for entry in quarantined {
                tracing::warn!(
                    repository = %entry.repository,
                    pr = entry.pull_request,
                    "quarantined: the triage of {} stopped Bosun {} times; not replayed (delete {} to release it)",
                    entry.head,
                    entry.attempts,
                    self
                        .journal
                        .file(journal::Kind::Quarantined, &entry.repository, entry.pull_request)
                        .display()
                );
                jobs.quarantined.insert(
                    (entry.repository.clone(), entry.pull_request),
                    entry.head.clone(),
                );
                if !entry.announced {
                    unannounced.push(entry);
                }
            }
        }
        // Deliveries a process died in go last: every other delivery is triaged first.
        let (mut replay, suspect): (Vec<_>, Vec<_>) = self
            .journal
            .load(journal::Kind::Pending)?
            .into_iter()
            .partition(|e| {
                !suspects.contains(&(e.repository.clone(), e.pull_request, e.head.clone()))
            });
        replay.extend(suspect);
        for entry in replay {
            match self.slug_of(&entry.repository) {
                Ok(slug) => {
                    tracing::info!(repository = %slug, pr = entry.pull_request, "replaying an accepted delivery");
                    self.enqueue(&slug, entry.pull_request, &entry.head);
                }
                Err(e) => tracing::warn!("journal entry {entry:?}: {e}"),
            }
        }
        if !unannounced.is_empty() {
            let announcer = self.clone();
            tokio::spawn(async move {
                for entry in unannounced {
                    announcer.announce_quarantine(entry).await;
                }
            });
        }
        Ok(())
    }

    /// The worker: one triage at a time, in the queue's order, woken when the queue was empty.
    fn spawn_worker(self: &Arc<Self>) {
        let worker = self.clone();
        tokio::spawn(async move {
            loop {
                let Some(((repository, number), delivered_head)) = worker.next_job() else {
                    worker.wake.notified().await;
                    continue;
                };
                let Ok(slug) = worker.slug_of(&repository) else {
                    continue;
                };
                Server::work(&worker, &slug, number, delivered_head).await;
            }
        });
    }

    /// The next queued pull request and the head delivered for it, marked running, its
    /// attempt on disk before the triage starts (and before /jobs says it runs): a process
    /// that dies in it leaves it behind.
    fn next_job(&self) -> Option<((String, u64), String)> {
        let mut jobs = lock(self);
        let key = jobs.queue.pop_front()?;
        let head = jobs.heads.remove(&key).unwrap_or_default();
        let before = self
            .journal
            .get(journal::Kind::Attempt, &key.0, key.1)
            .filter(|a| a.head == head)
            .map_or(0, |a| a.attempts);
        if let Err(e) = self.journal.put(
            journal::Kind::Attempt,
            &journal::Entry {
                repository: key.0.clone(),
                pull_request: key.1,
                head: head.clone(),
                attempts: before + 1,
                ..journal::Entry::default()
            },
        ) {
            tracing::error!("cannot journal the attempt on {}#{}: {e}", key.0, key.1);
        }
        jobs.running = Some(key.clone());
        jobs.running_attempt = Some((head.clone(), before));
        Some((key, head))
    }

    /// Sets a delivery aside for good: journaled as quarantined, its pending entry and its
    /// attempts forgotten (the comment to the pull request follows, `announce_quarantine`).
    fn quarantine(&self, attempt: &journal::Entry) -> std::io::Result<()> {
        let (repository, number) = (&attempt.repository, attempt.pull_request);
        tracing::error!(
            repository = %repository,
            pr = number,
            "the triage of {} stopped Bosun {} times: quarantined, never replayed",
            attempt.head,
            attempt.attempts
        );
        self.journal.put(
            journal::Kind::Quarantined,
            &journal::Entry {
                announced: false,
                ..attempt.clone()
            },
        )?;
        // Followed from here on, the quarantined head as judged: the hand-off tells a person
        // that a new commit releases it, and a triage that never ended journaled no
        // `Tracked` entry, so without this no poll would ever see that commit.
        if self
            .journal
            .get(journal::Kind::Tracked, repository, number)
            .is_none()
        {
            self.journal.put(
                journal::Kind::Tracked,
                &journal::Entry {
                    repository: repository.clone(),
                    pull_request: number,
                    head: attempt.head.clone(),
                    since: unix_now(),
                    ..journal::Entry::default()
                },
            )?;
        }
        if self
            .journal
            .get(journal::Kind::Pending, repository, number)
            .is_none_or(|p| p.head == attempt.head)
        {
            self.journal
                .remove(journal::Kind::Pending, repository, number)?;
        }
        self.journal
            .remove(journal::Kind::Attempt, repository, number)
    }

    /// Tells the pull request its delivery is quarantined (hand-off comment, label, Bosun's
    /// status), then journals that it was told; tried again at the next start when the forge
    /// fails.
    async fn announce_quarantine(&self, entry: journal::Entry) {
        let Ok(slug) = self.slug_of(&entry.repository) else {
            return;
        };
        let file = self.journal.file(
            journal::Kind::Quarantined,
            &entry.repository,
            entry.pull_request,
        );
        let release = format!(
            "delete {} from Bosun's work folder and deliver again, or push a new commit",
            file.file_name().and_then(|n| n.to_str()).map_or_else(
                || "the quarantine entry".to_string(),
                |n| format!("journal/{n}")
            )
        );
        match self
            .bosun
            .quarantine_handoff(
                &slug,
                entry.pull_request,
                &entry.head,
                entry.attempts,
                &release,
            )
            .await
        {
            Ok(()) => {
                if let Err(e) = self.journal.put(
                    journal::Kind::Quarantined,
                    &journal::Entry {
                        announced: true,
                        ..entry
                    },
                ) {
                    tracing::warn!("journal: {e}");
                }
            }
            Err(e) => tracing::warn!(
                repository = %slug,
                pr = entry.pull_request,
                "cannot tell the pull request it is quarantined (tried again at the next start): {e}"
            ),
        }
    }

    /// The process is stopping gracefully (SIGTERM, Ctrl-C): the running triage's attempt is
    /// given back, as a stop is not a crash.
    pub fn stop(&self) {
        let jobs = lock(self);
        if let (Some((repository, number)), Some((head, before))) =
            (&jobs.running, &jobs.running_attempt)
        {
            let result = if *before == 0 {
                self.journal
                    .remove(journal::Kind::Attempt, repository, *number)
            } else {
                self.journal.put(
                    journal::Kind::Attempt,
                    &journal::Entry {
                        repository: repository.clone(),
                        pull_request: *number,
                        head: head.clone(),
                        attempts: *before,
                        ..journal::Entry::default()
                    },
                )
            };
            if let Err(e) = result {
                tracing::warn!("journal: {e}");
            }
        }
    }

    /// Stops following a pull request and forgets its deliveries (closed, gone, expired, or
    /// of a repository no longer in bosun.yaml).
    fn forget(&self, jobs: &mut Jobs, repository: &str, number: u64) {
        let key = (repository.to_string(), number);
        jobs.failures.remove(&key);
        jobs.tracked.remove(&key);
        jobs.seen
            .retain(|(r, n, _)| !(r == repository && *n == number));
        if let Err(e) = self
            .journal
            .remove(journal::Kind::Tracked, repository, number)
        {
            tracing::warn!("journal: {e}");
        }
    }

    /// One triage, then the bookkeeping that makes it durable.
    async fn work(self: &Arc<Self>, slug: &RepoSlug, number: u64, delivered_head: String) {
        let started = std::time::Instant::now();
        let run = match self.bosun.triage(slug, number).await {
            Ok(run) => run,
            Err(e) => failed_run(slug, number, e),
        };
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .triages
            .get_or_create(&PathLabels {
                path: run.path.as_str(),
            })
            .inc();
        let repository = slug.to_string();
        let key = (repository.clone(), number);
        let mut jobs = lock(self);
        jobs.running = None;
        jobs.running_attempt = None;
        // The triage ended (whichever way): it did not take the process with it.
        if let Err(e) = self
            .journal
            .remove(journal::Kind::Attempt, &repository, number)
        {
            tracing::warn!("journal: {e}");
        }
        let now = unix_now();
        let tracked = match run.path {
            // A failed triage (the forge or git failing) may be delivered again; it stays in
            // the journal (a restart replays it) and is followed, so the poller tries again.
            RunPath::Error => Some(self.track_failed(&mut jobs, slug, number, delivered_head, now)),
            // Nothing more arrives for a closed pull request, nor for one the forge does not
            // have or a repository Bosun does not serve: forget its deliveries.
            RunPath::Closed | RunPath::Dropped => {
                self.forget(&mut jobs, &repository, number);
                None
            }
            _ => Some(track_judged(&mut jobs, &run, &key, now)),
        };
        // A newer delivery of the same pull request queued meanwhile keeps its journal entry.
        // Decided and removed under the lock `enqueue` journals under: no delivery accepted in
        // between can lose its entry. A failed triage keeps its entry.
        if run.path != RunPath::Error
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
        if let Some((head, since)) = tracked
            && let Err(e) = self.journal.put(
                journal::Kind::Tracked,
                &journal::Entry {
                    repository,
                    pull_request: number,
                    head,
                    since,
                    ..journal::Entry::default()
                },
            )
        {
            tracing::warn!("journal: {e}");
        }
    }

    /// A failed triage: its delivery may come again, the pull request is followed with no
    /// head judged, and while the failures in a row allow, the triage is queued again after a
    /// delay. Returns what the journal follows: (head, since).
    fn track_failed(
        self: &Arc<Self>,
        jobs: &mut Jobs,
        slug: &RepoSlug,
        number: u64,
        delivered_head: String,
        now: u64,
    ) -> (String, u64) {
        let key = (slug.to_string(), number);
        jobs.seen
            .remove(&(key.0.clone(), number, delivered_head.clone()));
        let track = jobs
            .tracked
            .entry(key.clone())
            .or_insert_with(|| Track::new("", now));
        track.head = String::new();
        let since = track.since;
        let failures = record_failure(jobs, &key, &delivered_head);
        if failures <= RETRIES_AFTER_FAILURE {
            jobs.retrying += 1;
            self.retry_later(slug.clone(), number, delivered_head, failures);
        }
        (String::new(), since)
    }

    /// Queues a failed triage again after the delay its `failures` in a row earn, unless
    /// something else came first (see `retry_stands`).
    fn retry_later(self: &Arc<Self>, slug: RepoSlug, number: u64, head: String, failures: u32) {
        let delay = retry_delay(failures);
        let server = self.clone();
        let key = (slug.to_string(), number);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut jobs = lock(&server);
            jobs.retrying -= 1;
            // Decided and queued under one lock: nothing can slip in between.
            if retry_stands(&jobs, &key, failures) {
                tracing::info!(repository = %slug, pr = number, "trying a failed triage again");
                match server.enqueue_locked(jobs, &slug, number, &head) {
                    Enqueued::Accepted | Enqueued::Duplicate => {}
                    Enqueued::Full => tracing::warn!(
                        "cannot queue {slug}#{number} again: the queue is full; the poller or a new delivery will"
                    ),
                    Enqueued::Quarantined => {}
                    Enqueued::NotRecorded(e) => {
                        tracing::warn!("cannot queue {slug}#{number} again: {e}")
                    }
                }
            }
        });
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
        if jobs.quarantined.get(&key).map(String::as_str) == Some(head) {
            return Enqueued::Quarantined;
        }
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
                ..journal::Entry::default()
            },
        ) {
            return Enqueued::NotRecorded(e.to_string());
        }
        // A new head of a quarantined pull request is a new delivery: the quarantine of the
        // old head is over.
        if jobs.quarantined.remove(&key).is_some()
            && let Err(e) = self
                .journal
                .remove(journal::Kind::Quarantined, &repository, number)
        {
            tracing::warn!("journal: {e}");
        }
        jobs.seen.insert((repository, number, head.to_string()));
        if let Some(older) = jobs.heads.insert(key.clone(), head.to_string()) {
            jobs.seen.remove(&(key.0.clone(), number, older));
        }
        if !queued {
            jobs.queue.push_back(key.clone());
        }
        jobs.tracked
            .entry(key)
            .or_insert_with(|| Track::new("", unix_now()));
        drop(jobs);
        self.wake.notify_one();
        Enqueued::Accepted
    }

    /// Re-triages tracked pull requests whose head moved (a person pushed): the gate runs on
    /// every new head commit. A pull request the forge has not (404), of a repository no
    /// longer in bosun.yaml, closed, or without a new head for [`TRACK_EXPIRY`] is forgotten;
    /// one the forge fails to answer is asked again after a pause that doubles.
    pub async fn poll(&self) {
        self.poll_at(unix_now()).await
    }

    /// `poll` at `now` (Unix seconds).
    pub async fn poll_at(&self, now: u64) {
        let tracked: Vec<((String, u64), Track)> = {
            let jobs = lock(self);
            jobs.tracked
                .iter()
                .filter(|(k, t)| poll_due(&jobs, k, t, now))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for ((repository, number), mut track) in tracked {
            let slug = match self.bosun.config.named(&repository) {
                Ok(Some(slug)) if slug.to_string() == repository => slug,
                _ => {
                    tracing::warn!(
                        "{repository}#{number}: not a repository in bosun.yaml; no longer followed"
                    );
                    self.forget(&mut lock(self), &repository, number);
                    continue;
                }
            };
            let key = (repository.clone(), number);
            // Asked again just before the forge is: a delivery may have queued it since.
            if !poll_due(&lock(self), &key, &track, now) {
                continue;
            }
            let answer = self.bosun.forge.pull_request(&slug, number).await;
            let step = poll_step(&mut track, answer.as_ref(), now);
            let mut jobs = lock(self);
            match step {
                PollStep::Forget(why) => {
                    tracing::info!(repository = %slug, pr = number, "no longer followed: {why}");
                    self.forget(&mut jobs, &repository, number);
                    continue;
                }
                PollStep::Backoff => {
                    if let Err(e) = &answer {
                        tracing::warn!(
                            "cannot read {slug}#{number} (asked again in {} s): {e}",
                            track.next_poll.saturating_sub(now)
                        );
                    }
                }
                PollStep::Keep | PollStep::Enqueue(_) => {}
            }
            // Only the poll's own fields: a triage may have finished meanwhile.
            if let Some(current) = jobs.tracked.get_mut(&key) {
                current.seen_head = track.seen_head.clone();
                current.since = track.since;
                current.misses = track.misses;
                current.next_poll = track.next_poll;
            }
            if let PollStep::Enqueue(head) = step {
                match self.enqueue_locked(jobs, &slug, number, &head) {
                    Enqueued::NotRecorded(e) => tracing::warn!("cannot queue {slug}#{number}: {e}"),
                    Enqueued::Accepted
                    | Enqueued::Duplicate
                    | Enqueued::Full
                    | Enqueued::Quarantined => {}
                }
            }
        }
        lock(self).polls += 1;
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

/// A request's headers and body, read within [`BODY_READ_TIMEOUT`] and [`MAX_BODY_BYTES`], or
/// the answer that refuses it.
async fn read_body(
    server: &Server,
    request: axum::extract::Request,
) -> Result<(HeaderMap, axum::body::Bytes), Response> {
    let headers = request.headers().clone();
    match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => Ok((headers, body)),
        Ok(Err(_)) => {
            server.count("invalid");
            Err(answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": format!("the body is larger than {MAX_BODY_BYTES} bytes or broken")}),
            ))
        }
        Err(_) => {
            server.count("invalid");
            Err(answer(
                StatusCode::REQUEST_TIMEOUT,
                json!({"error": "the body did not arrive in time"}),
            ))
        }
    }
}

async fn intake(State(server): State<Shared>, request: axum::extract::Request) -> Response {
    let (headers, body) = match read_body(&server, request).await {
        Ok(read) => read,
        Err(refused) => return refused,
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
    // On GitLab a project's full path, subgroups included, whatever its case (GitLab finds
    // projects ignoring it, and Kargo's provider lowercases the URL): queued under
    // bosun.yaml's spelling, as GitLab's webhook is.
    let slug: RepoSlug = match server.bosun.config.named(&request.repository) {
        Ok(Some(slug)) => slug,
        Ok(None) => return server.unknown_repository(&request.repository),
        Err(e) => {
            server.count("invalid");
            return answer(StatusCode::BAD_REQUEST, json!({"error": e.to_string()}));
        }
    };
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
            // A definite answer: nothing to accept.
            Err(e) if matches!(e.status(), Some(404 | 410)) => {
                server.count("not_found");
                return answer(
                    StatusCode::NOT_FOUND,
                    json!({"error": format!("{slug} has no pull request {}", request.pull_request)}),
                );
            }
            Err(e) => {
                server.count("forge_error");
                return answer(
                    StatusCode::BAD_GATEWAY,
                    json!({"error": format!("cannot read the pull request: {e}")}),
                );
            }
        },
    };
    server.accept(&slug, request.pull_request, &head)
}

impl Server {
    /// The 422 for a repository bosun.yaml does not list (counted), or None.
    /// The answer to a delivery of a repository bosun.yaml does not list (`slug` checked).
    fn unknown_repository(&self, slug: &str) -> Response {
        self.count("unknown_repository");
        answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"error": format!("{slug} is not a repository in bosun.yaml")}),
        )
    }

    /// The repository a journal entry or a queue key names (bosun.yaml's spelling, written by
    /// this server), parsed as the forge names repositories.
    fn slug_of(&self, repository: &str) -> Result<RepoSlug, crate::forge::SlugError> {
        RepoSlug::for_forge(self.bosun.config.forge.kind, repository)
    }

    /// Queues an authenticated, validated delivery and answers what became of it.
    fn accept(&self, slug: &RepoSlug, number: u64, head: &str) -> Response {
        self.accept_as(slug, number, head, Intake::Intake)
    }

    /// [`accept`](Self::accept) for a route: GitLab's hook is answered 200 for a delivery
    /// Bosun does not take (a full queue, a quarantined head), which the intake answers 429
    /// and 409 (server/gitlab.rs: GitLab disables a hook that keeps failing, and never
    /// delivers again by itself).
    fn accept_as(&self, slug: &RepoSlug, number: u64, head: &str, route: Intake) -> Response {
        let refused = |status: StatusCode| route.not_taken(status);
        let said = json!({"repository": slug.to_string(), "pullRequest": number, "headSha": head});
        let with = |status: &str| {
            let mut body = said.clone();
            body["status"] = status.into();
            body
        };
        match self.enqueue(slug, number, head) {
            Enqueued::Accepted => {
                self.count("accepted");
                answer(StatusCode::ACCEPTED, with("accepted"))
            }
            Enqueued::Duplicate => {
                self.count("duplicate");
                answer(StatusCode::OK, with("duplicate"))
            }
            Enqueued::Full => {
                self.count("queue_full");
                let mut body = with("queue-full");
                body["error"] = format!(
                    "{MAX_QUEUED_PER_REPOSITORY} pull requests of {slug} are waiting; deliver again later"
                )
                .into();
                (
                    [(header::RETRY_AFTER, "30")],
                    answer(refused(StatusCode::TOO_MANY_REQUESTS), body),
                )
                    .into_response()
            }
            Enqueued::Quarantined => {
                self.count("quarantined");
                let mut body = with("quarantined");
                body["error"] = "this head's triage stopped Bosun before; it waits for a person (docs/bosun.md, quarantine)".into();
                answer(refused(StatusCode::CONFLICT), body)
            }
            Enqueued::NotRecorded(e) => {
                self.count("not_recorded");
                tracing::error!("cannot journal a delivery of {slug}#{number}: {e}");
                answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"error": "the delivery could not be recorded; deliver again"}),
                )
            }
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
            "tracked": jobs.tracked.len(),
            "polls": jobs.polls,
            "quarantined": jobs.quarantined.iter().map(|((r, n), head)| json!({"repository": r, "pullRequest": n, "head": head})).collect::<Vec<_>>(),
            "done": jobs.done,
        }),
    )
}

/// The pause after a failed `accept` (EMFILE, ENFILE, ENOMEM, ...): 10 ms, doubling to
/// [`ACCEPT_PAUSE_CAP`]; reset by an accepted connection. The error is logged once per burst,
/// and the burst's length once it ends: a process out of file descriptors neither spins nor
/// floods its log.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    failures: u32,
}

/// The longest pause between two accepts that failed.
pub const ACCEPT_PAUSE_CAP: Duration = Duration::from_secs(1);

impl AcceptBackoff {
    /// A failed accept: how long to pause, and whether to log it (the first of a burst).
    pub fn failed(&mut self) -> (Duration, bool) {
        self.failures = self.failures.saturating_add(1);
        let pause = Duration::from_millis(10u64 << (self.failures - 1).min(10));
        (pause.min(ACCEPT_PAUSE_CAP), self.failures == 1)
    }

    /// An accepted connection: the failures of the burst it ends, if there were any.
    pub fn recovered(&mut self) -> Option<u32> {
        let failures = std::mem::take(&mut self.failures);
        (failures > 0).then_some(failures)
    }
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
    let mut backoff = AcceptBackoff::default();
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            permit = slots.clone().acquire_owned() => permit.map_err(std::io::Error::other)?,
        };
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    if let Some(failures) = backoff.recovered() {
                        tracing::info!("accept works again after {failures} failed tries");
                    }
                    accepted
                }
                Err(e) => {
                    let (pause, first) = backoff.failed();
                    if first {
                        tracing::warn!(
                            "accept: {e}; pausing up to {} ms between tries until it works again",
                            ACCEPT_PAUSE_CAP.as_millis()
                        );
                    }
                    drop(permit);
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(pause) => {}
                    }
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
mod route_tests {
    use super::*;

    /// A full queue and a quarantined head are 429 and 409 on the intake (Kargo retries) and
    /// 200 on GitLab's hook (GitLab would count them toward disabling it).
    #[test]
    fn gitlabs_hook_is_answered_200_for_a_delivery_bosun_does_not_take() {
        for status in [StatusCode::TOO_MANY_REQUESTS, StatusCode::CONFLICT] {
            assert_eq!(Intake::Intake.not_taken(status), status);
            assert_eq!(Intake::GitlabHook.not_taken(status), StatusCode::OK);
        }
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

#[cfg(test)]
mod poll_tests {
    use super::*;
    use crate::forge::{ForgeError, PullRequest};

    #[test]
    fn a_pull_request_queued_or_being_triaged_is_not_polled() {
        let key = ("o/r".to_string(), 1);
        let mut jobs = Jobs::default();
        let track = Track::new("", 100);
        assert!(poll_due(&jobs, &key, &track, 100));
        jobs.heads.insert(key.clone(), "aaa".into());
        assert!(!poll_due(&jobs, &key, &track, 100), "queued");
        jobs.heads.clear();
        jobs.running = Some(key.clone());
        assert!(!poll_due(&jobs, &key, &track, 100), "running");
        jobs.running = Some(("o/r".to_string(), 2));
        assert!(poll_due(&jobs, &key, &track, 100), "another one running");
        let later = Track {
            next_poll: 160,
            ..track
        };
        assert!(!poll_due(&jobs, &key, &later, 100), "pausing");
        assert!(poll_due(&jobs, &key, &later, 160));
    }

    fn pr(head: &str, state: &str) -> PullRequest {
        PullRequest {
            number: 7,
            state: state.into(),
            title: String::new(),
            author: String::new(),
            head_sha: head.into(),
            head_ref: "b".into(),
            head_repo: "o/r".into(),
            base_sha: String::new(),
            base_ref: "main".into(),
            labels: Vec::new(),
            merged: false,
        }
    }

    fn http(status: u16) -> ForgeError {
        ForgeError::Http {
            method: "GET".into(),
            path: "/repos/o/r/pulls/7".into(),
            status,
            message: String::new(),
        }
    }

    const DAY: u64 = 24 * 3600;

    #[test]
    fn a_tracked_pull_request_expires_seven_days_after_its_last_new_head() {
        let start = 1_000_000;
        let mut track = Track::new("aaa", start);
        assert_eq!(
            poll_step(&mut track, Ok(&pr("aaa", "open")), start + 6 * DAY),
            PollStep::Keep
        );
        // A new head restarts the clock (and is queued).
        assert_eq!(
            poll_step(&mut track, Ok(&pr("bbb", "open")), start + 6 * DAY),
            PollStep::Enqueue("bbb".into())
        );
        track.head = "bbb".into();
        assert_eq!(
            poll_step(&mut track, Ok(&pr("bbb", "open")), start + 12 * DAY),
            PollStep::Keep
        );
        assert_eq!(
            poll_step(&mut track, Ok(&pr("bbb", "open")), start + 13 * DAY),
            PollStep::Forget("no new head for 7 days")
        );
        // A head never triaged to the end (failures) is not retried past the week either.
        let mut failing = Track::new("", start);
        failing.seen_head = "ccc".into();
        assert_eq!(
            poll_step(&mut failing, Ok(&pr("ccc", "open")), start + DAY),
            PollStep::Enqueue("ccc".into())
        );
        assert!(matches!(
            poll_step(&mut failing, Ok(&pr("ccc", "open")), start + 8 * DAY),
            PollStep::Forget(_)
        ));
    }

    #[test]
    fn a_404_is_definite_and_other_failures_back_off_exponentially() {
        let now = 5_000;
        let mut track = Track::new("aaa", now);
        assert!(matches!(
            poll_step(&mut track, Err(&http(404)), now),
            PollStep::Forget(_)
        ));
        assert!(matches!(
            poll_step(&mut track, Ok(&pr("aaa", "closed")), now),
            PollStep::Forget("closed")
        ));
        let mut pauses = Vec::new();
        for _ in 0..12 {
            assert_eq!(
                poll_step(&mut track, Err(&http(502)), now),
                PollStep::Backoff
            );
            pauses.push(track.next_poll - now);
        }
        assert_eq!(&pauses[..4], [120, 240, 480, 960]);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*pauses.last().unwrap(), POLL_BACKOFF_CAP.as_secs());
        // An answer ends the backoff.
        assert_eq!(
            poll_step(&mut track, Ok(&pr("aaa", "open")), now),
            PollStep::Keep
        );
        assert_eq!((track.misses, track.next_poll), (0, 0));
    }

    #[test]
    fn accept_failures_pause_longer_to_a_cap_and_log_once_per_burst() {
        let mut backoff = AcceptBackoff::default();
        let mut logged = 0;
        let mut pauses = Vec::new();
        for _ in 0..20 {
            let (pause, log) = backoff.failed();
            logged += usize::from(log);
            pauses.push(pause);
        }
        assert_eq!(logged, 1);
        assert_eq!(pauses[0], Duration::from_millis(10));
        assert_eq!(pauses[1], Duration::from_millis(20));
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*pauses.last().unwrap(), ACCEPT_PAUSE_CAP);
        assert_eq!(backoff.recovered(), Some(20));
        assert_eq!(backoff.recovered(), None);
        // A new burst starts short and is logged again.
        assert_eq!(backoff.failed(), (Duration::from_millis(10), true));
    }
}
