//! How far the renders of this process are, for a progress line on a terminal: render jobs
//! planned (after de-duplication) and done, how many came from the cache, and the slowest
//! helm or kustomize run so far. Counted always (a few atomic additions per job); shown only
//! by a caller that asks (`gate render` and `gate check` on a terminal).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

static PLANNED: AtomicUsize = AtomicUsize::new(0);
static DONE: AtomicUsize = AtomicUsize::new(0);
static CACHE_HITS: AtomicUsize = AtomicUsize::new(0);
static SLOWEST_MS: AtomicU64 = AtomicU64::new(0);
static SLOWEST: Mutex<String> = Mutex::new(String::new());

/// What the progress line shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub planned: usize,
    pub done: usize,
    pub cache_hits: usize,
    /// The slowest render so far: what it rendered and how long it took.
    pub slowest: Option<(String, Duration)>,
}

pub(super) fn planned(n: usize) {
    PLANNED.fetch_add(n, Ordering::Relaxed);
}

pub(super) fn done() {
    DONE.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn cache_hit() {
    CACHE_HITS.fetch_add(1, Ordering::Relaxed);
    done();
}

/// A helm or kustomize run finished after `took`.
pub(super) fn rendered(label: &str, took: Duration) {
    let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
    // Another run may beat this one between the two steps: the label is the slower's.
    if SLOWEST_MS.fetch_max(ms, Ordering::Relaxed) < ms
        && let Ok(mut slowest) = SLOWEST.lock()
        && SLOWEST_MS.load(Ordering::Relaxed) == ms
    {
        *slowest = label.to_string();
    }
    done();
}

/// The counts now.
pub fn snapshot() -> Snapshot {
    let ms = SLOWEST_MS.load(Ordering::Relaxed);
    let label = SLOWEST.lock().map(|s| s.clone()).unwrap_or_default();
    Snapshot {
        planned: PLANNED.load(Ordering::Relaxed),
        done: DONE.load(Ordering::Relaxed),
        cache_hits: CACHE_HITS.load(Ordering::Relaxed),
        slowest: (!label.is_empty()).then(|| (label, Duration::from_millis(ms))),
    }
}

impl Snapshot {
    /// `12/40 renders, 7 from cache, slowest: helm template x 1.4 s`
    pub fn line(&self) -> String {
        let mut line = format!(
            "{}/{} renders, {} from cache",
            self.done.min(self.planned),
            self.planned,
            self.cache_hits
        );
        if let Some((label, took)) = &self.slowest {
            // A label names a chart or a path the repository chose: one line, no controls.
            let label: String = label
                .chars()
                .take(60)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            line.push_str(&format!(", slowest: {label} {:.1} s", took.as_secs_f64()));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_done_planned_hits_and_the_slowest() {
        let snapshot = Snapshot {
            planned: 4,
            done: 2,
            cache_hits: 1,
            slowest: Some(("helm template a\nb".into(), Duration::from_millis(1500))),
        };
        assert_eq!(
            snapshot.line(),
            "2/4 renders, 1 from cache, slowest: helm template a b 1.5 s"
        );
    }
}
