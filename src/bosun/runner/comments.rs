//! Bosun's words on a pull request: its comment, labels, status and hand-offs to a person;
//! attempts and refused values.

use std::path::Path;

use super::git_ops::git;
use super::{Bosun, COMMENT_MARKER, Run, RunPath, STATUS_CONTEXT, TriageError, short};
use crate::bosun::classify::{self, Handoff};
use crate::bosun::config::Config;
use crate::forge::{CommitStatus, PullRequest, RepoSlug, StatusState, upsert_marked_comment};

impl Bosun {
    /// Bosun's own status on a commit (never a failure). A forge that refuses it is logged,
    /// never an error.
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

    pub(super) async fn comment(
        &self,
        slug: &RepoSlug,
        number: u64,
        body: &str,
    ) -> Result<(), TriageError> {
        // A forge refuses a comment past 65,536 characters: whatever a chart or a release
        // note made it, it is cut to fit (the gate's report has the whole of it).
        const LIMIT: usize = 60_000;
        let body = if body.chars().count() > LIMIT {
            let cut: String = body.chars().take(LIMIT).collect();
            let cut = cut
                .rsplit_once('\n')
                .map_or(cut.as_str(), |(head, _)| head)
                .to_string();
            format!(
                "{cut}\n\n(cut here: the comment would be too long; the gate's report has the rest)\n"
            )
        } else {
            body.to_string()
        };
        let body = format!("{COMMENT_MARKER}\n{body}");
        upsert_marked_comment(
            self.forge.as_ref(),
            slug,
            number,
            &self.me,
            COMMENT_MARKER,
            &body,
        )
        .await?;
        Ok(())
    }

    pub(super) async fn label(
        &self,
        slug: &RepoSlug,
        number: u64,
        label: &str,
    ) -> Result<(), TriageError> {
        self.forge
            .add_labels(slug, number, &[label.to_string()])
            .await?;
        Ok(())
    }

    pub(super) async fn hand_off(
        &self,
        slug: &RepoSlug,
        number: u64,
        handoff: &Handoff,
        details: &[String],
        run: &mut Run,
    ) -> Result<String, TriageError> {
        let body = classify::handoff_comment(handoff, details);
        self.comment(slug, number, &body).await?;
        self.label(slug, number, &self.config.labels.needs_human)
            .await?;
        run.say(format!(
            "handed off to a person (label {}): {}",
            self.config.labels.needs_human, handoff.fact
        ));
        for line in details {
            run.say(format!("  {line}"));
        }
        run.path = RunPath::Handoff;
        Ok(format!("handed off: {}", handoff.fact))
    }

    /// Tells a pull request that its delivery is quarantined: the triage of `head` stopped the
    /// process `crashes` times. A hand-off comment (Bosun's own, updated in place), the
    /// needs-human label, and Bosun's status on the head (never a failure: the gate's check
    /// decides).
    pub async fn quarantine_handoff(
        &self,
        slug: &RepoSlug,
        number: u64,
        head: &str,
        crashes: u32,
        release: &str,
    ) -> Result<(), TriageError> {
        let handoff = Handoff {
            open: "the gate's report and Bosun's log for this pull request".into(),
            choice: format!("whether the change is safe to triage again; to release it, {release}"),
            fact: format!(
                "Bosun stopped {crashes} times while triaging {}, so this delivery is quarantined and never replayed automatically",
                short(head)
            ),
        };
        self.comment(slug, number, &classify::handoff_comment(&handoff, &[]))
            .await?;
        self.label(slug, number, &self.config.labels.needs_human)
            .await?;
        self.status(
            slug,
            head,
            StatusState::Success,
            "quarantined: this head's triage stopped Bosun; a person decides",
        )
        .await;
        Ok(())
    }
}

/// The handoff when the pull request's head branch is the default branch `config` names for
/// the repository or the base branch (`open` and `choice` as the repair words them).
pub(super) fn protected_branch(
    config: &Config,
    slug: &RepoSlug,
    pr: &PullRequest,
    (open, choice): (&str, &str),
) -> Option<Handoff> {
    let default_branch = config
        .repository(slug)
        .map(|r| r.default_branch.clone())
        .unwrap_or_default();
    (pr.head_ref == default_branch || pr.head_ref == pr.base_ref).then(|| Handoff {
        open: open.into(),
        choice: choice.into(),
        fact: format!(
            "the pull request's head branch is {}, and Bosun never pushes to the default or the base branch",
            pr.head_ref
        ),
    })
}

/// Repairs already pushed, from the attempt labels: the highest N of `<prefix>N`, or how many
/// such labels there are if that is more (a person removing one label does not reset the cap).
pub fn attempts_of(labels: &[String], prefix: &str) -> u32 {
    let numbered = labels
        .iter()
        .filter_map(|l| l.strip_prefix(prefix)?.parse::<u32>().ok());
    let count = labels.iter().filter(|l| l.starts_with(prefix)).count() as u32;
    numbered.max().unwrap_or(0).max(count)
}

/// The keys a values schema refused (`additional properties 'KEY' not allowed`), and the YAML
/// files at `revision` that set them, as `file (key KEY)`.
pub(super) fn refused_value_places(checkout: &Path, revision: &str, error: &str) -> Vec<String> {
    let mut keys: Vec<&str> = error
        .split("additional properties '")
        .skip(1)
        .filter_map(|rest| rest.split_once('\'').map(|(key, _)| key))
        .filter(|key| {
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let mut places = Vec::new();
    for key in keys {
        let pattern = format!("^[[:space:]]*{key}:");
        // No pathspec globs: pathspecs are literal here (GIT_LITERAL_PATHSPECS).
        let Ok(found) = git(checkout, &["grep", "-l", "-E", &pattern, revision]) else {
            continue;
        };
        for line in found.lines() {
            let file = line.strip_prefix(&format!("{revision}:")).unwrap_or(line);
            if file.ends_with(".yaml") || file.ends_with(".yml") {
                places.push(format!("{file} (key {key})"));
            }
        }
    }
    places
}
