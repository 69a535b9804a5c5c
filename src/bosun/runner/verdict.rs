//! The gate's published verdict read back: the report comment by its marker and author, and
//! the `addons-gate` check (run or status) beside it.

use super::TriageError;
use crate::forge::{
    COMMENT_READ_BUDGET, CheckRun, Conclusion, Forge, RepoSlug, StatusState, find_comments,
};
use crate::gate::publish::{self, CHECK_NAME};
use crate::gate::report::{self, MARKER, ParsedReport};

/// The gate's report for this pull request: the comment that starts with the marker and was
/// written by the gate's identity (`author`). Anything else is ignored. Read newest first and
/// bounded ([`crate::forge::COMMENT_READ_BUDGET`]): the walk stops at the report. With
/// `published` (the comment the gate run just updated, when Bosun ran it), only that comment;
/// else the newest.
pub(super) async fn published_report(
    forge: &dyn Forge,
    author: &str,
    slug: &RepoSlug,
    number: u64,
    published: Option<u64>,
) -> Result<Option<(ParsedReport, String, String)>, TriageError> {
    let search = find_comments(forge, slug, number, COMMENT_READ_BUDGET, 1, |c| {
        c.author == author && c.body.starts_with(MARKER) && published.is_none_or(|id| c.id == id)
    })
    .await?;
    Ok(search.found.first().and_then(|c| {
        report::parse(&c.body)
            .ok()
            .map(|parsed| (parsed, report::digest(&c.body), c.body.clone()))
    }))
}

/// The `addons-gate` check (run or status) on a commit, if the gate (`author`) published one.
/// When another identity than Bosun's own (`me`) runs the gate (`forge.gateAuthor`, often a CI
/// bot other workflows share), the check must be that identity's and carry the digest of the
/// report comment read: a comment posted alone under the shared identity is not the gate's
/// verdict.
pub(super) async fn check_published(
    forge: &dyn Forge,
    author: &str,
    me: &str,
    slug: &RepoSlug,
    sha: &str,
    report_digest: Option<&str>,
    report_green: bool,
) -> Result<bool, TriageError> {
    let shared = author != me;
    let app = author.trim_end_matches("[bot]");
    let runs = forge.check_runs(slug, sha).await?;
    // Under a shared identity the check must also agree with the report it names.
    let run_ok = |r: &CheckRun| {
        r.name == CHECK_NAME
            && (!shared
                || (r.app.trim_end_matches("[bot]") == app
                    && (r.conclusion == Conclusion::Success) == report_green
                    && report_digest.is_some_and(|d| {
                        r.external_id == format!("{}{d}", publish::REPORT_REFERENCE)
                    })))
    };
    if runs.iter().any(run_ok) {
        return Ok(true);
    }
    let statuses = forge.statuses(slug, sha).await?;
    Ok(statuses.iter().any(|s| {
        s.context == CHECK_NAME
            && (!shared
                || (s.creator == author
                    && (s.state == StatusState::Success) == report_green
                    && report_digest.is_some_and(|d| {
                        s.description
                            .ends_with(&format!("{}{d}", publish::STATUS_REPORT_MARK))
                    })))
    }))
}
