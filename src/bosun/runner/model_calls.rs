//! The model-call caps: calls counted per head in Bosun's own comment, reserved first, and
//! bounded per pull request (every head's count together) and per head.

use std::collections::BTreeMap;

use super::{TriageError, short};
use crate::bosun::config::ModelConfig;
use crate::bosun::repair::CapHit;
use crate::forge::{
    COMMENT_READ_BUDGET, Comment, Forge, RepoSlug, find_comments, upsert_marked_comment,
};

/// The marker of Bosun's model-calls comment: a comment of its own (no other comment of
/// Bosun's ever replaces it), updated in place, holding one line per head of the pull request:
/// `<!-- bosun:model-calls HEAD N -->`. Written before the calls, so a restart, a re-delivery
/// or a poll of the same head counts them; a new head starts a new count.
pub(super) const MODEL_CALLS_COMMENT: &str = "<!-- bosun:model-calls v1 -->";
pub(super) const MODEL_CALLS_MARK: &str = "<!-- bosun:model-calls ";

/// Every head's count of model calls, from Bosun's model-calls comment (the largest where a
/// head is written twice).
fn counts(comments: &[Comment], me: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for rest in comments
        .iter()
        .filter(|c| c.author == me && c.body.starts_with(MODEL_CALLS_COMMENT))
        .flat_map(|c| {
            c.body
                .match_indices(MODEL_CALLS_MARK)
                .map(|(i, _)| &c.body[i + MODEL_CALLS_MARK.len()..])
        })
    {
        let mut words = rest.split_whitespace();
        if let (Some(head), Some(Ok(n))) = (words.next(), words.next().map(str::parse::<u32>)) {
            let kept = out.entry(head.to_string()).or_insert(0);
            *kept = (*kept).max(n);
        }
    }
    out
}

/// Model calls already made for `head`, from Bosun's model-calls comment.
pub(super) fn model_calls_made(comments: &[Comment], me: &str, head: &str) -> u32 {
    counts(comments, me).get(head).copied().unwrap_or(0)
}

/// Whether `needed` more calls for `head` fit both caps: the pull request's, counted across
/// every head it has had (a person's push does not reset it), then the head's.
pub(super) fn calls_allowed(
    comments: &[Comment],
    me: &str,
    head: &str,
    needed: u32,
    model: &ModelConfig,
) -> Result<(), CapHit> {
    let counts = counts(comments, me);
    let total: u32 = counts.values().fold(0, |sum, n| sum.saturating_add(*n));
    if total.saturating_add(needed) > model.max_calls_per_pull_request {
        return Err(CapHit {
            made: total,
            cap: model.max_calls_per_pull_request,
            per_head: false,
        });
    }
    let here = counts.get(head).copied().unwrap_or(0);
    if here.saturating_add(needed) > model.max_calls_per_head {
        return Err(CapHit {
            made: here,
            cap: model.max_calls_per_head,
            per_head: true,
        });
    }
    Ok(())
}

/// The model-calls comment with `head`'s count set to `n` (other heads' lines kept).
pub(super) fn model_calls_body(
    comments: &[Comment],
    me: &str,
    head: &str,
    n: u32,
    cap: u32,
) -> String {
    let mut lines: Vec<String> = comments
        .iter()
        .filter(|c| c.author == me && c.body.starts_with(MODEL_CALLS_COMMENT))
        .flat_map(|c| c.body.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            l.starts_with(MODEL_CALLS_MARK) && !l.starts_with(&format!("{MODEL_CALLS_MARK}{head} "))
        })
        .collect();
    lines.push(format!("{MODEL_CALLS_MARK}{head} {n} -->"));
    format!(
        "{MODEL_CALLS_COMMENT}\nBosun's model calls on this pull request (at most {cap} across its heads, `model.maxCallsPerPullRequest`): {n} for `{}`.\n{}\n",
        short(head),
        lines.join("\n")
    )
}

/// Counts `needed` model calls for this head before they are made, in Bosun's own comment
/// (restart-safe), as the login `me`: `Ok(Err(hit))` when a cap of `caps` does not allow them.
/// The count is read newest first and bounded: the walk stops at Bosun's one model-calls comment
/// (only created after a walk that saw every comment and none of it, so there is one). When the
/// budget ends the walk without it, the count is unknown and taken as the cap: a flood of
/// comments can stop the model, never reset its count.
pub(super) async fn reserve(
    forge: &dyn Forge,
    me: &str,
    caps: &ModelConfig,
    slug: &RepoSlug,
    number: u64,
    head: &str,
    needed: u32,
) -> Result<Result<(), CapHit>, TriageError> {
    let cap = caps.max_calls_per_pull_request;
    let search = find_comments(forge, slug, number, COMMENT_READ_BUDGET, 1, |c| {
        c.author == me && c.body.starts_with(MODEL_CALLS_COMMENT)
    })
    .await?;
    if search.found.is_empty() && !search.complete {
        return Ok(Err(CapHit {
            made: cap,
            cap,
            per_head: false,
        }));
    }
    let comments = search.found;
    if let Err(hit) = calls_allowed(&comments, me, head, needed, caps) {
        return Ok(Err(hit));
    }
    let made = model_calls_made(&comments, me, head);
    let body = model_calls_body(&comments, me, head, made + needed, cap);
    match comments.first() {
        Some(existing) if existing.body == body => {}
        Some(existing) => {
            forge.update_comment(slug, existing.id, &body).await?;
        }
        None => {
            upsert_marked_comment(forge, slug, number, me, MODEL_CALLS_COMMENT, &body).await?;
        }
    }
    Ok(Ok(()))
}
