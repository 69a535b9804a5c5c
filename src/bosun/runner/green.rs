//! The green paths: release notes, the model's short summary, the green comment.

use std::fmt::Write as _;

use super::{Bosun, Run, RunPath, TriageError, model_calls, short};
use crate::bosun::classify::Route;
use crate::bosun::explain;
use crate::bosun::green_summary;
use crate::bosun::notes::{MAX_RELEASES, Notes, Release, manual_step};
use crate::forge::{PullRequest, RepoSlug};
use crate::gate::report::{self, ParsedReport, Summary};

/// The release notes for the images a green change moves (at most 5 images, 5 releases each),
/// as a comment section, and the manual steps they describe (worth-a-look reasons), read by
/// `notes` (None: release notes are off). Notes are hostile text: one escaped, clipped line
/// each. Whatever cannot be read is said in one line; it never fails the triage.
pub(super) async fn release_notes(
    notes: Option<&Notes>,
    summary: &Summary,
    run: &mut Run,
) -> (String, Vec<String>, Vec<(String, String, String)>) {
    let Some(notes) = notes else {
        return (String::new(), Vec::new(), Vec::new());
    };
    let mut quoted: Vec<(String, String, String)> = Vec::new();
    let mut lines = Vec::new();
    let mut manual = Vec::new();
    let mut unread = Vec::new();
    // One deadline for every look-up of this triage, whatever the per-request ones add up
    // to; the same move of one source repository is read once.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen_moves = std::collections::BTreeSet::new();
    for image in summary.images.iter().take(5) {
        if image.image.contains(" → ") {
            unread.push(format!(
                "{}: the repository changed, not one image's tags",
                image.image
            ));
            continue;
        }
        let Ok(found) = tokio::time::timeout_at(
            deadline,
            notes.for_image(&image.image, &image.from, &image.to),
        )
        .await
        else {
            unread.push("the look-ups ran past their deadline".into());
            break;
        };
        if let Some(why) = found.unread {
            unread.push(why);
        }
        let move_key = (found.source.clone(), image.from.clone(), image.to.clone());
        if found.source.is_some() && !seen_moves.insert(move_key) {
            continue;
        }
        for (index, release) in found.releases.iter().enumerate() {
            // Every release in the range is read for a manual step; the first few shown.
            if let Some(phrase) = manual_step(&release.body) {
                // The image and the tag come from a chart and a source host: escaped.
                manual.push(format!(
                    "the release notes of {} {} describe a manual step (\"{phrase}\")",
                    report::code(&image.image),
                    report::code(&release.tag)
                ));
            }
            if index >= MAX_RELEASES {
                continue;
            }
            quoted.push((
                image.image.clone(),
                release.tag.clone(),
                release.body.clone(),
            ));
            lines.push(quoted_line(&image.image, release));
        }
        if found.releases.len() > MAX_RELEASES {
            lines.push(format!(
                "- and {} earlier release{} in the range (read for manual steps, not shown)",
                found.releases.len() - MAX_RELEASES,
                crate::plural(found.releases.len() - MAX_RELEASES)
            ));
        }
    }
    if summary.images.len() > 5 {
        unread.push(format!(
            "{} more images (Bosun reads the first 5)",
            summary.images.len() - 5
        ));
    }
    manual.dedup();
    let unread: Vec<String> = unread
        .into_iter()
        .map(|u| {
            u.chars()
                .take(200)
                .collect::<String>()
                .replace('@', "@\u{200b}")
        })
        .collect();
    let out = section(&lines, &unread);
    run.say(format!(
        "release notes: {} release{} read{}",
        lines.len(),
        crate::plural(lines.len()),
        if unread.is_empty() {
            String::new()
        } else {
            format!(", {} not read", unread.len())
        }
    ));
    (out, manual, quoted)
}

/// One release quoted: the image, the tag, the link, the first 400 characters of its notes
/// on one line, escaped.
fn quoted_line(image: &str, release: &Release) -> String {
    let first: String = release
        .body
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(400)
        .collect();
    // A mention in a note must not notify anyone: a zero-width space after `@`.
    let quiet = |t: &str| t.replace('@', "@\u{200b}");
    format!(
        "- {} {}{}: {}{}",
        report::code(image),
        report::code(&release.tag),
        if release.url.is_empty() {
            String::new()
        } else {
            format!(" ({})", report::text(&quiet(&release.url)))
        },
        report::text(&quiet(&first)),
        if release.body.chars().count() > 400 {
            "…"
        } else {
            ""
        }
    )
}

/// The comment's section: the quoted releases, then what could not be read.
fn section(lines: &[String], unread: &[String]) -> String {
    let mut out = String::new();
    if !lines.is_empty() {
        out.push_str("\nRelease notes (the maintainers' own, for the image tags this change moves; quoted, not checked):\n\n");
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !unread.is_empty() {
        let _ = writeln!(
            out,
            "\nRelease notes not read: {}.",
            unread
                .iter()
                .map(|u| report::text(u))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    out
}

impl Bosun {
    /// One model call for a short summary of a green change, counted with the other calls of
    /// this head; the harness (`green_summary::check`) lets it through only when every
    /// version, image, key and kind it names is in the report or the notes. None otherwise
    /// (the deterministic explanation stands alone).
    pub(super) async fn model_summary(
        &self,
        slug: &RepoSlug,
        number: u64,
        head: &str,
        report: &ParsedReport,
        quoted: &[(String, String, String)],
        run: &mut Run,
    ) -> Result<Option<(String, bool)>, TriageError> {
        let (Some(model), Some(summary)) = (self.model.as_deref(), report.summary.as_ref()) else {
            return Ok(None);
        };
        let reserved = model_calls::reserve(
            self.forge.as_ref(),
            &self.me,
            &self.config.model,
            slug,
            number,
            head,
            1,
        )
        .await?;
        if reserved.is_err() {
            run.say("no model summary: the model-call cap is used");
            return Ok(None);
        }
        let material = green_summary::material(
            summary,
            &report.verdict,
            quoted,
            &self.config.model.redaction(),
        );
        let reply = model.call(&green_summary::request(&material)).await;
        match reply.map_err(|r| r.to_string()).and_then(|reply| {
            green_summary::check(&reply.value, &material)
                .map_err(|r| format!("rule {}: {}", r.rule, r.detail))
        }) {
            Ok((text, step)) => {
                run.say("model summary accepted");
                // What the model took from the notes is the notes' words: quoted as theirs,
                // never under the "checked" line (the grounding rule reads no note).
                let quiet = |t: &str| report::text(t).replace('@', "@\u{200b}");
                let (own, taken): (Vec<_>, Vec<_>) = green_summary::sentences(&text, &material)
                    .into_iter()
                    .partition(|(_, quoted)| !quoted);
                let own: Vec<String> = own.into_iter().map(|(s, _)| quiet(&s)).collect();
                let taken: Vec<String> = taken
                    .into_iter()
                    .map(|(s, _)| format!("“{}”", quiet(&s)))
                    .collect();
                let mut line = if own.is_empty() {
                    "In short (a model's summary, in the release notes' own words)".to_string()
                } else {
                    format!(
                        "In short (a model's summary; every version, image, key and kind it names was checked against the report and the notes): {}",
                        own.join(" ")
                    )
                };
                if !taken.is_empty() {
                    let _ = write!(
                        line,
                        "{}the release notes' words, as the model quoted them (the maintainers', not checked): {}",
                        if own.is_empty() { ": " } else { " And " },
                        taken.join(" ")
                    );
                }
                Ok(Some((line, step)))
            }
            Err(why) => {
                run.say(format!(
                    "model summary refused ({why}); the explanation stands alone"
                ));
                Ok(None)
            }
        }
    }

    /// The green paths: explained, worth a look, or green on a repair.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn green(
        &self,
        slug: &RepoSlug,
        number: u64,
        pr: &PullRequest,
        report: Option<&ParsedReport>,
        path: Route,
        notes: &str,
        run: &mut Run,
    ) -> Result<Option<String>, TriageError> {
        let explained = report
            .and_then(|r| r.summary.as_ref().map(|s| explain::section(s, &r.verdict)))
            .map(|e| format!("{e}{notes}"));
        match path {
            Route::Green => {
                run.path = if run.pushed.is_empty() {
                    RunPath::Green
                } else {
                    RunPath::Swap
                };
                if run.pushed.is_empty() {
                    // A held pull request with a green gate: say what it does, so the person
                    // who merges reads it in one place.
                    if let Some(explained) = &explained {
                        self.comment(
                            slug,
                            number,
                            &format!("**The gate is green.** Nothing here needs a change; the merge is a person's.\n\n{explained}"),
                        )
                        .await?;
                        run.say("addons-gate is green; explained");
                        return Ok(Some("addons-gate is green; explained".into()));
                    }
                    run.say("addons-gate is green; nothing to do");
                    Ok(Some("addons-gate is green; nothing to do".into()))
                } else {
                    if let Some(repaired) = &run.repaired {
                        let body = format!(
                            "{repaired}\nThe gate re-ran on `{}` and is green.\n{}",
                            short(&pr.head_sha),
                            explained.map(|e| format!("\n{e}")).unwrap_or_default()
                        );
                        self.comment(slug, number, &body).await?;
                    }
                    run.say("addons-gate is green on the repair");
                    Ok(Some(format!(
                        "repaired in {}; addons-gate is green",
                        short(&pr.head_sha)
                    )))
                }
            }
            Route::WorthALook(reasons) => {
                let mut body = String::new();
                if let Some(repaired) = &run.repaired {
                    let _ = writeln!(
                        body,
                        "{repaired}\nThe gate re-ran on `{}` and is green.\n",
                        short(&pr.head_sha)
                    );
                }
                let _ = writeln!(
                    body,
                    "**Worth a look before merging.** The gate is green, and the render shows that {}. Nothing blocks; the gate's report has the details.",
                    reasons.join(", and ")
                );
                if let Some(explained) = &explained {
                    let _ = write!(body, "\n{explained}");
                }
                self.comment(slug, number, &body).await?;
                self.label(slug, number, &self.config.labels.worth_a_look)
                    .await?;
                run.say(format!(
                    "worth a look (label {}): {}",
                    self.config.labels.worth_a_look,
                    reasons.join("; ")
                ));
                run.path = RunPath::WorthALook;
                Ok(Some(format!("green; worth a look: {}", reasons.join("; "))))
            }
            _ => unreachable!("green() is called with a green path"),
        }
    }
}
