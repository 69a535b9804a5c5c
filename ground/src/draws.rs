//! Seeded draws keyed by what they decide: every fault decision of the ground (a request's
//! `METHOD path`, a watch event, a restart at a tick) takes the next number of its own stream,
//! so the products' timing, which reorders requests, does not reshuffle the faults of other
//! keys. A stream is splitmix64 over the seed, an FNV-1a hash of the key (stable across Rust
//! versions, unlike std's hasher) and the draw's index within the key.

use std::collections::HashMap;

/// Draw counts per key (by the key's hash).
#[derive(Debug, Default)]
pub struct Draws {
    streams: HashMap<u64, u64>,
}

impl Draws {
    /// The next number of `key`'s stream under `seed`.
    pub fn next(&mut self, seed: u64, key: &str) -> u64 {
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let count = self.streams.entry(hash).or_insert(0);
        *count += 1;
        let mut z = seed
            .wrapping_add(hash)
            .wrapping_add(count.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True for `per_mille` of `key`'s draws; no draw is taken when `per_mille` is 0.
    pub fn roll(&mut self, seed: u64, key: &str, per_mille: u32) -> bool {
        per_mille > 0 && self.next(seed, key) % 1000 < u64::from(per_mille)
    }
}

/// Scripted outages (the timeline's `outage`): per client, what an outage hits and how many
/// more of its requests fail. The forge and the API double share it.
#[derive(Debug, Default)]
pub struct Outages(std::collections::BTreeMap<String, Outage>);

/// One client's outage: the method it hits (any when `None`), the path's ending it hits (any
/// when `None`), how many matching requests pass first, and how many then fail.
#[derive(Debug, Default)]
struct Outage {
    method: Option<String>,
    path: Option<String>,
    after: u32,
    left: u32,
}

impl Outages {
    /// `user`'s next `requests` requests (of `method` only, when given) fail.
    pub fn set(&mut self, user: &str, method: Option<&str>, requests: u32) {
        self.set_on(user, method, None, 0, requests);
    }

    /// `user`'s requests of `method` (any when `None`) to a path ending in `path` (any when
    /// `None`): the next `after` pass, then `requests` fail.
    pub fn set_on(
        &mut self,
        user: &str,
        method: Option<&str>,
        path: Option<&str>,
        after: u32,
        requests: u32,
    ) {
        self.0.insert(
            user.to_string(),
            Outage {
                method: method.map(str::to_ascii_uppercase),
                path: path.map(str::to_string),
                after,
                left: requests,
            },
        );
    }

    /// Whether this request of `user` falls in its outage; it is counted when it does.
    pub fn take(&mut self, user: &str, method: &str) -> bool {
        self.take_at(user, method, "")
    }

    /// [`Outages::take`] for a request to `path`.
    pub fn take_at(&mut self, user: &str, method: &str, path: &str) -> bool {
        let Some(outage) = self.0.get_mut(user) else {
            return false;
        };
        let hits = outage.left > 0
            && outage.method.as_deref().is_none_or(|m| m == method)
            && outage.path.as_deref().is_none_or(|p| path.ends_with(p));
        if !hits {
            return false;
        }
        if outage.after > 0 {
            outage.after -= 1;
            return false;
        }
        outage.left -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_draws_the_same_numbers_whatever_other_keys_draw_between() {
        let mut alone = Draws::default();
        let mine: Vec<u64> = (0..5).map(|_| alone.next(7, "GET /a")).collect();
        let mut mixed = Draws::default();
        let mut interleaved = Vec::new();
        for i in 0..5 {
            mixed.next(7, &format!("POST /b/{i}"));
            interleaved.push(mixed.next(7, "GET /a"));
            mixed.next(7, "GET /c");
        }
        assert_eq!(mine, interleaved);
        let mut other_seed = Draws::default();
        assert_ne!(other_seed.next(8, "GET /a"), mine[0]);
    }

    #[test]
    fn an_outage_hits_its_client_and_method_so_many_times() {
        let mut outages = Outages::default();
        outages.set("bosun", Some("post"), 2);
        assert!(!outages.take("bosun", "GET"));
        assert!(!outages.take("kargo", "POST"));
        assert!(outages.take("bosun", "POST"));
        assert!(outages.take("bosun", "POST"));
        assert!(!outages.take("bosun", "POST"));
        outages.set_on("forge", Some("post"), Some("/labels"), 1, 1);
        assert!(!outages.take_at("forge", "POST", "/repos/o/r/issues/1/comments"));
        assert!(!outages.take_at("forge", "POST", "/repos/o/r/issues/1/labels"));
        assert!(outages.take_at("forge", "POST", "/repos/o/r/issues/1/labels"));
        assert!(!outages.take_at("forge", "POST", "/repos/o/r/issues/1/labels"));
        outages.set("kargo", None, 1);
        assert!(outages.take("kargo", "PATCH"));
    }

    #[test]
    fn per_mille_is_respected() {
        let mut draws = Draws::default();
        let hits = (0..10_000).filter(|_| draws.roll(3, "k", 100)).count();
        assert!((800..1200).contains(&hits), "{hits}");
        assert!(!(0..100).any(|_| draws.roll(3, "k", 0)));
    }
}
