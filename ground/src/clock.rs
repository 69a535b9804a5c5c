//! The ground's one clock: simulated time that only the ground's tick advances.
//!
//! Every double and actor of the ground (the API double's timestamps, Kargo's Promotions and
//! step timeouts, Argo CD's sync operations, Argo Rollouts' measurements, Prometheus' query
//! time, the forge double's comments and pull requests) reads this clock, never the wall
//! clock, so a seed and a timeline fix every timestamp a run writes. The product binaries
//! keep real time: the ground waits on what they do, not on how long they take.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where every run's clock starts: 2026-01-01T00:00:00Z.
pub const START_SECONDS: u64 = 1_767_225_600;

/// How much simulated time one tick of the ground is.
pub const TICK: Duration = Duration::from_secs(1);

/// Shared simulated time, in milliseconds since the Unix epoch. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Clock(Arc<AtomicU64>);

impl Default for Clock {
    fn default() -> Self {
        Clock(Arc::new(AtomicU64::new(START_SECONDS * 1000)))
    }
}

impl Clock {
    /// Seconds since the Unix epoch.
    pub fn seconds(&self) -> u64 {
        self.0.load(Ordering::SeqCst) / 1000
    }

    /// Seconds since the Unix epoch, with the milliseconds as a fraction.
    pub fn seconds_f64(&self) -> f64 {
        self.0.load(Ordering::SeqCst) as f64 / 1000.0
    }

    /// The time as Kubernetes and GitHub write it (`2026-01-01T00:00:05Z`).
    pub fn rfc3339(&self) -> String {
        crate::kube::store::rfc3339(self.seconds())
    }

    /// Moves time forward (only the ground's tick does).
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_time_that_only_advance_moves() {
        let clock = Clock::default();
        let other = clock.clone();
        assert_eq!(clock.rfc3339(), "2026-01-01T00:00:00Z");
        other.advance(TICK * 65);
        assert_eq!(clock.rfc3339(), "2026-01-01T00:01:05Z");
        assert_eq!(clock.seconds(), START_SECONDS + 65);
    }
}
