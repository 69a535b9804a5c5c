//! Freight names, aliases, label values and availability to a Stage.

use serde_json::Value;
use sha1::{Digest, Sha1};

use crate::kargo::{hex, text};

/// Kargo's Freight name: SHA-1 of `<origin>:<sorted artifact parts joined by |>`.
/// [K pkg/api/freight.go]
pub fn freight_name(freight: &Value) -> String {
    let origin = format!(
        "{}/{}",
        text(freight, "/origin/kind"),
        text(freight, "/origin/name")
    );
    let mut parts = Vec::new();
    for commit in freight
        .get("commits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let url = text(commit, "/repoURL")
            .trim_end_matches('/')
            .to_lowercase();
        let tag = text(commit, "/tag");
        parts.push(if tag.is_empty() {
            format!("{url}:{}", text(commit, "/id"))
        } else {
            format!("{url}:{tag}:{}", text(commit, "/id"))
        });
    }
    for image in freight
        .get("images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(format!(
            "{}:{}@{}",
            text(image, "/repoURL"),
            text(image, "/tag"),
            text(image, "/digest")
        ));
    }
    for chart in freight
        .get("charts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(format!(
            "{}/{}:{}",
            text(chart, "/repoURL").trim_end_matches('/').to_lowercase(),
            text(chart, "/name"),
            text(chart, "/version")
        ));
    }
    parts.sort();
    hex(&Sha1::digest(
        format!("{origin}:{}", parts.join("|")).as_bytes(),
    ))
}

/// A readable alias from a name, as Kargo's moniker generator gives one.
pub fn alias_for(name: &str) -> String {
    const ADJECTIVES: [&str; 16] = [
        "brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "lively", "nimble",
        "proud", "quiet", "rapid", "sunny", "tidy", "witty",
    ];
    const ANIMALS: [&str; 16] = [
        "otter", "heron", "lynx", "badger", "falcon", "marten", "ibex", "puffin", "gecko", "koala",
        "mole", "newt", "owl", "panda", "quail", "robin",
    ];
    let bytes = name.as_bytes();
    let a = bytes.first().copied().unwrap_or(0) as usize % ADJECTIVES.len();
    let b = bytes.get(1).copied().unwrap_or(0) as usize % ANIMALS.len();
    format!("{}-{}", ADJECTIVES[a], ANIMALS[b])
}

/// The label value Kargo uses for a Stage name (hash-shortened past 63 characters).
pub fn stage_label_value(stage: &str) -> String {
    if stage.len() <= 63 {
        return stage.to_string();
    }
    let digest = hex(&Sha1::digest(stage.as_bytes()));
    format!("{}-{}", &stage[..50], &digest[..12])
}

/// Is `freight` available to `stage` (origin requested, and direct, approved, or verified
/// upstream)? [K api/v1alpha1/stage_types.go IsFreightAvailable]
pub fn freight_available(stage: &Value, freight: &Value) -> bool {
    let stage_name = text(stage, "/metadata/name");
    let origin_name = text(freight, "/origin/name");
    stage
        .pointer("/spec/requestedFreight")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|request| {
            if text(request, "/origin/name") != origin_name {
                return false;
            }
            let approved = freight
                .pointer(&format!("/status/approvedFor/{stage_name}"))
                .is_some();
            let direct = request
                .pointer("/sources/direct")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let upstreams: Vec<&str> = request
                .pointer("/sources/stages")
                .and_then(Value::as_array)
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let all = request
                .pointer("/sources/availabilityStrategy")
                .and_then(Value::as_str)
                == Some("All");
            let verified = |s: &&str| {
                freight
                    .pointer(&format!("/status/verifiedIn/{s}"))
                    .is_some()
            };
            let upstream_ok = !upstreams.is_empty()
                && if all {
                    upstreams.iter().all(verified)
                } else {
                    upstreams.iter().any(verified)
                };
            approved || direct || upstream_ok
        })
}

/// For each Freight origin a Stage requests, the newest Freight of it (origins with none are
/// left out): (origin, Freight name).
pub(super) fn newest_requested(stage: &Value, freights: &[Value]) -> Vec<(String, String)> {
    stage
        .pointer("/spec/requestedFreight")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|request| {
            let origin = text(request, "/origin/name").to_string();
            let newest = newest_freight(freights.iter().collect(), &origin)?;
            Some((origin, newest))
        })
        .collect()
}

pub(super) fn newest_freight(freights: Vec<&Value>, origin: &str) -> Option<String> {
    freights
        .into_iter()
        .filter(|f| text(f, "/origin/name") == origin)
        .max_by_key(|f| {
            text(f, "/metadata/resourceVersion")
                .parse::<u64>()
                .unwrap_or(0)
        })
        .map(|f| text(f, "/metadata/name").to_string())
}

/// When Kargo takes a Freight to be discovered: `discoveredAt` (its webhook defaults it to the
/// creation time), else `metadata.creationTimestamp`.
fn discovered_at(freight: &Value) -> &str {
    match text(freight, "/discoveredAt") {
        "" => text(freight, "/metadata/creationTimestamp"),
        at => at,
    }
}

/// The Freight auto-promotion would pick for `origin` on `stage`
/// ([K pkg/api/auto_promotion.go SelectAutoPromotionCandidates, pkg/api/stage.go
/// ListFreightAvailableToStage]): the newest (by discovery time, then name, both descending)
/// of the origin's Freight AVAILABLE to the Stage (direct, approved, or verified upstream);
/// with `autoPromotionOptions.selectionPolicy: MatchUpstream` only Freight currently in the
/// (one) upstream Stage counts, and two such (a Promotion half recorded) give none this pass.
pub fn auto_promotion_candidate<'f>(
    stage: &Value,
    freights: impl IntoIterator<Item = &'f Value>,
    origin: &str,
) -> Option<&'f Value> {
    let request = stage
        .pointer("/spec/requestedFreight")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| text(r, "/origin/name") == origin)?;
    let direct = request
        .pointer("/sources/direct")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let match_upstream = !direct
        && text(request, "/sources/autoPromotionOptions/selectionPolicy") == "MatchUpstream";
    let upstream = request
        .pointer("/sources/stages/0")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut available: Vec<&Value> = freights
        .into_iter()
        .filter(|f| text(f, "/origin/name") == origin && freight_available(stage, f))
        .filter(|f| {
            !match_upstream
                || f.pointer(&format!("/status/currentlyIn/{upstream}"))
                    .is_some_and(|v| !v.is_null())
        })
        .collect();
    if match_upstream && available.len() > 1 {
        return None;
    }
    available.sort_by(|a, b| {
        discovered_at(b)
            .cmp(discovered_at(a))
            .then_with(|| text(b, "/metadata/name").cmp(text(a, "/metadata/name")))
    });
    available.into_iter().next()
}
