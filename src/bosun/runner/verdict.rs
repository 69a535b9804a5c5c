//! The gate's published verdict (report comment, addons-gate check) and Bosun's status.

use super::*;

impl Bosun {
    pub(super) async fn status(
        &self,
        slug: &RepoSlug,
        sha: &str,
        state: StatusState,
        description: &str,
    ) {
        let status = CommitStatus {
            context: STATUS_CONTEXT.into(),
            state,
            // GitHub caps a status description at 140 characters.
            description: description.chars().take(140).collect(),
            creator: String::new(),
        };
        if let Err(e) = self.forge.set_status(slug, sha, &status).await {
            tracing::warn!("cannot set the bosun status on {sha}: {e}");
        }
    }

    /// The gate's report for this pull request: the comment that starts with the marker and
    /// was written by the gate's identity. Anything else is ignored. Read newest first and
    /// bounded ([`crate::forge::COMMENT_READ_BUDGET`]): the walk stops at the report.
    pub(super) async fn published_report(
        &self,
        slug: &RepoSlug,
        number: u64,
        published: Option<u64>,
    ) -> Result<Option<(ParsedReport, String, String)>, TriageError> {
        let author = self.config.gate_author(&self.me);
        // The comment the gate run just updated, when Bosun ran it; else the newest.
        let search = crate::forge::find_comments(
            self.forge.as_ref(),
            slug,
            number,
            crate::forge::COMMENT_READ_BUDGET,
            1,
            |c| {
                c.author == author
                    && c.body.starts_with(MARKER)
                    && published.is_none_or(|id| c.id == id)
            },
        )
        .await?;
        Ok(search.found.first().and_then(|c| {
            report::parse(&c.body)
                .ok()
                .map(|parsed| (parsed, report::digest(&c.body), c.body.clone()))
        }))
    }

    /// The `addons-gate` check (run or status) on a commit, if the gate published one. When
    /// another identity runs the gate (`forge.gateAuthor`, often a CI bot other workflows share),
    /// the check must be that identity's and carry the digest of the report comment read:
    /// a comment posted alone under the shared identity is not the gate's verdict.
    pub(super) async fn check_published(
        &self,
        slug: &RepoSlug,
        sha: &str,
        report_digest: Option<&str>,
        report_green: bool,
    ) -> Result<bool, TriageError> {
        let author = self.config.gate_author(&self.me);
        let shared = author != self.me;
        let app = author.trim_end_matches("[bot]");
        let runs = self.forge.check_runs(slug, sha).await?;
        // Under a shared identity the check must also agree with the report it names.
        let run_ok = |r: &crate::forge::CheckRun| {
            r.name == CHECK_NAME
                && (!shared
                    || (r.app.trim_end_matches("[bot]") == app
                        && (r.conclusion == crate::forge::Conclusion::Success) == report_green
                        && report_digest.is_some_and(|d| {
                            r.external_id == format!("{}{d}", publish::REPORT_REFERENCE)
                        })))
        };
        if runs.iter().any(run_ok) {
            return Ok(true);
        }
        let statuses = self.forge.statuses(slug, sha).await?;
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
}
