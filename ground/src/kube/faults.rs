//! Faults on demand, from a seed: the same seed replays the same faults in the same order.
//!
//! Each decision is drawn from a stream of its own, keyed by what it is about (a request's
//! method and path, one object's events on a watch, a restart at a tick), so the n-th request
//! to one path meets the same fault whatever unrelated requests the products' timing
//! interleaves with it. Requests that share a key (two observer replicas asking the same
//! path) still take its draws in the order they arrive.

use std::sync::Mutex;
use std::time::Duration;

use axum::http::Method;

use super::store::ApiError;

/// Rates are per mille (out of 1000) per request or per watch event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub seed: u64,
    /// 500 Internal Server Error on a non-watch request.
    pub server_error: u32,
    /// 429 Too Many Requests on a non-watch request.
    pub throttle: u32,
    /// 409 Conflict on an update.
    pub conflict: u32,
    /// A watch event lost with its connection: cut mid-line, the stream then ends.
    pub drop_watch_event: u32,
    pub duplicate_watch_event: u32,
    pub close_watch: u32,
    /// 410 Gone for a watch that resumes from a resourceVersion (as after a compaction).
    pub gone: u32,
    /// Per tick of the ground: the observer (and, separately, Bosun) is killed with SIGKILL
    /// and started again, as a node failure or an OOM kill would.
    pub restart: u32,
    /// The forge double's REST API (both faces; git over HTTP is left alone): 500 or 502.
    pub forge_server_error: u32,
    /// The forge double's REST API: a rate limit (GitHub's 403 with `x-ratelimit-remaining:
    /// 0`, a proxy's 429 on Gitea's face).
    pub forge_rate_limit: u32,
    /// The model double holds a request past Bosun's model timeout (it answers nothing).
    pub model_timeout: u32,
    /// Latency added to every request.
    pub latency_ms: u64,
    /// Latency added to every list of one resource (its plural): a cache that loads late.
    pub slow_list: Option<(&'static str, u64)>,
}

impl FaultPlan {
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// A mixed schedule for robustness runs.
    pub fn chaos(seed: u64) -> FaultPlan {
        FaultPlan {
            seed,
            server_error: 50,
            throttle: 30,
            conflict: 100,
            drop_watch_event: 50,
            duplicate_watch_event: 50,
            close_watch: 30,
            gone: 300,
            restart: 15,
            forge_server_error: 20,
            forge_rate_limit: 10,
            model_timeout: 100,
            latency_ms: 0,
            slow_list: None,
        }
    }

    pub fn is_quiet(&self) -> bool {
        FaultPlan {
            seed: self.seed,
            ..FaultPlan::default()
        } == *self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFault {
    Deliver,
    Drop,
    Duplicate,
    Close,
}

/// Counts of what was injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injected {
    pub server_errors: u64,
    pub throttles: u64,
    pub conflicts: u64,
    pub dropped_events: u64,
    pub duplicated_events: u64,
    pub closed_watches: u64,
    pub gone: u64,
    pub restarts: u64,
}

pub struct Faults {
    plan: Mutex<FaultPlan>,
    /// Draws taken so far per key.
    streams: Mutex<crate::draws::Draws>,
    /// Per user name: scripted outages (answered 500).
    outages: Mutex<crate::draws::Outages>,
    injected: Mutex<Injected>,
}

impl Faults {
    pub fn new(plan: FaultPlan) -> Faults {
        Faults {
            plan: Mutex::new(plan),
            streams: Mutex::new(crate::draws::Draws::default()),
            outages: Mutex::new(Default::default()),
            injected: Mutex::new(Injected::default()),
        }
    }

    /// Changes the plan (e.g. heal: `FaultPlan::none()`), keeping the random sequence.
    pub fn set(&self, plan: FaultPlan) {
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) = plan;
    }

    pub fn plan(&self) -> FaultPlan {
        *self.plan.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn injected(&self) -> Injected {
        self.injected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn roll(&self, key: &str, per_mille: u32) -> bool {
        let seed = self.plan().seed;
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .roll(seed, key, per_mille)
    }

    fn count(&self, f: impl FnOnce(&mut Injected)) {
        f(&mut self.injected.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn latency(&self) -> Option<Duration> {
        let ms = self.plan().latency_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// The delay of a request whose path ends in `last_segment`, when it is a list the plan
    /// slows down.
    pub fn list_delay(&self, last_segment: &str, is_watch: bool) -> Option<Duration> {
        match self.plan().slow_list {
            Some((plural, ms)) if !is_watch && plural == last_segment => {
                Some(Duration::from_millis(ms))
            }
            _ => None,
        }
    }

    /// Answers `user`'s next `requests` non-watch requests (of `method` only, when given) with
    /// 500.
    pub fn outage(&self, user: &str, method: Option<&str>, requests: u32) {
        self.outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set(user, method, requests);
    }

    /// A 500 when an outage holds for `user`'s request.
    pub fn outage_error(&self, user: &str, method: &Method) -> Option<ApiError> {
        let hit = self
            .outages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(user, method.as_str());
        hit.then(|| {
            ApiError::new(
                500,
                "InternalError",
                "an error on the server (an outage) has prevented the request from succeeding",
            )
        })
    }

    /// A 500 or 429 for the request `method path`.
    pub fn request_error(&self, method: &Method, path: &str) -> Option<ApiError> {
        let plan = self.plan();
        let key = format!("{method} {path}");
        if self.roll(&key, plan.server_error) {
            self.count(|i| i.server_errors += 1);
            return Some(ApiError::new(
                500,
                "InternalError",
                "an error on the server (injected fault) has prevented the request from succeeding",
            ));
        }
        if self.roll(&key, plan.throttle) {
            self.count(|i| i.throttles += 1);
            return Some(ApiError::new(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later (injected fault)",
            ));
        }
        None
    }

    /// A 409 for an update of the object at `path`.
    pub fn conflict(&self, path: &str) -> Option<ApiError> {
        if self.roll(&format!("conflict {path}"), self.plan().conflict) {
            self.count(|i| i.conflicts += 1);
            return Some(ApiError::new(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again (injected fault)",
            ));
        }
        None
    }

    /// Whether `process` (observer, bosun) is killed and started again after `tick`.
    pub fn restart(&self, process: &str, tick: u64) -> bool {
        if self.roll(&format!("restart {process} at {tick}"), self.plan().restart) {
            self.count(|i| i.restarts += 1);
            return true;
        }
        false
    }

    /// How far into the tick's work (real time, under 4 s) a restart of `process` drawn at
    /// `tick` lands: a triage that takes longer is killed part-way, one that ends sooner is
    /// killed idle.
    pub fn restart_moment(&self, process: &str, tick: u64) -> Duration {
        let seed = self.plan().seed;
        let draw = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next(seed, &format!("restart {process} at {tick}: moment"));
        Duration::from_millis(draw % 4000)
    }

    /// Whether a resuming watch answers 410 Gone.
    pub fn gone(&self, path: &str) -> bool {
        if self.roll(&format!("gone {path}"), self.plan().gone) {
            self.count(|i| i.gone += 1);
            return true;
        }
        false
    }

    /// What happens to the next event about `object` (namespace/name) on a watch of `path`:
    /// its n-th event there draws the n-th time, whatever other writes interleave.
    pub fn watch_event(&self, path: &str, object: &str) -> WatchFault {
        let plan = self.plan();
        let key = format!("watch {path} {object}");
        if self.roll(&key, plan.close_watch) {
            self.count(|i| i.closed_watches += 1);
            WatchFault::Close
        } else if self.roll(&key, plan.drop_watch_event) {
            self.count(|i| i.dropped_events += 1);
            WatchFault::Drop
        } else if self.roll(&key, plan.duplicate_watch_event) {
            self.count(|i| i.duplicated_events += 1);
            WatchFault::Duplicate
        } else {
            WatchFault::Deliver
        }
    }
}
