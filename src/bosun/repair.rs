//! The repair of dropped served versions, from the gate's evidence to the rewrites ready to
//! write: the swap plan, the head's render (scope and CRD schemas), the applier's checks, the
//! loss check, and the reshape behind the harness. No forge and no push here: `triage` (on a
//! pull request) and `bosun repair` (on a local checkout) both call it, so a repair is decided
//! the same way wherever it runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::applier::{self, Policy, Rewrite, Scope};
use super::classify::Handoff;
use super::config::{Config, PromotionScope};
use super::reshape::{self, Loss, Lossy, reshape_losses};
use super::swap::{self, Swap};
use crate::gate::report;
use crate::gate::rules::DroppedServedVersion;
use crate::model::{Model, Request};
use crate::render::{self, RenderConfig, Rendering};

/// A handoff and the detail lines that go under it.
pub type Refusal = (Handoff, Vec<String>);

/// The swap planned and prepared, with what the loss check found.
pub struct Planned {
    pub plan: BTreeMap<String, Vec<Swap>>,
    pub rendering: Rendering,
    pub rewrites: Vec<Rewrite>,
    pub lossy: Vec<Lossy>,
}

/// Rewrites ready to write: every check passed.
pub struct Prepared {
    pub rewrites: Vec<Rewrite>,
    /// Manifests whose apiVersion moves.
    pub swapped: usize,
    /// One comment line per reshaped document (what moved, what was dropped).
    pub reshaped: Vec<String>,
}

/// Plans the swap for `dropped` on the checkout `head_config` renders (its `revision` is the
/// head): renders the head, applies the promotion scope and the deny/allow lists. A render
/// failure is an error; a refused file is a handoff.
pub fn plan(
    config: &Config,
    head_config: &RenderConfig,
    dropped: &[DroppedServedVersion],
) -> Result<Result<Planned, Refusal>, String> {
    let checkout = head_config.repo_dir.as_path();
    let url = head_config.repo_url.as_deref().unwrap_or_default();
    let plan = swap::plan(dropped);
    let rendering = render::render(head_config).map_err(|f| {
        format!(
            "the head does not render: {}",
            f.diagnostics
                .first()
                .map(|d| d.message.as_str())
                .unwrap_or("")
        )
    })?;
    let scope = match config.promotion_scope {
        PromotionScope::Deployed => Some(Scope::of(&rendering, |repo| {
            repo.is_empty()
                || crate::render::repos::normalize_repo_url(repo)
                    == crate::render::repos::normalize_repo_url(url)
        })),
        PromotionScope::Repository => None,
    };
    let policy = Policy::new(&config.deny, &config.allow, scope)?;
    let rewrites = match applier::prepare(checkout, &policy, &plan) {
        Ok(rewrites) => rewrites,
        Err(refusals) => {
            let files: Vec<String> = refusals.iter().map(|r| r.path.clone()).collect();
            return Ok(Err((
                Handoff {
                    open: files.join(", "),
                    choice: "move each manifest's apiVersion to the version the gate names, or decide the file should not move".into(),
                    fact: format!(
                        "the applier refused {} (nothing was pushed, not even the files it accepted)",
                        refusals
                            .iter()
                            .map(|r| format!("{}: {}", r.path, r.reason))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                },
                vec![],
            )));
        }
    };
    let lossy = reshape::lossy_documents(&rewrites, &plan, dropped, &rendering);
    Ok(Ok(Planned {
        plan,
        rendering,
        rewrites,
        lossy,
    }))
}

impl Planned {
    /// Every lossy document can go to a model: a plain manifest whose losses were checked
    /// (a chart template is text with expressions; an unverifiable document is not sent).
    pub fn reshapable(&self) -> bool {
        !self.lossy.is_empty()
            && self.lossy.iter().all(|l| {
                !l.template && l.losses.iter().all(|x| !matches!(x, Loss::Unverifiable(_)))
            })
    }

    /// Model calls `finish` will make with a model configured.
    pub fn calls_needed(&self, model: bool) -> u32 {
        if model && self.reshapable() {
            self.lossy.len() as u32
        } else {
            0
        }
    }

    fn files(&self) -> String {
        let mut files: Vec<&str> = self
            .lossy
            .iter()
            .map(|l| l.document.file.as_str())
            .collect();
        files.dedup();
        files.join(", ")
    }

    fn loss_lines(&self) -> Vec<String> {
        self.lossy
            .iter()
            .flat_map(|l| {
                let doc = report::text(&l.document.to_string());
                l.losses.iter().map(move |x| format!("{doc}: {x}"))
            })
            .collect()
    }
}

/// Reshapes what needs it (one model call per lossy document) and checks the rewrites lose
/// nothing. Any refusal is a handoff, and then nothing may be written, the clean swaps
/// included. `say` hears one line per call.
pub async fn finish(
    planned: Planned,
    dropped: &[DroppedServedVersion],
    model: Option<&dyn Model>,
    say: &mut (dyn FnMut(String) + Send),
) -> Result<Prepared, Refusal> {
    let swapped: usize = planned.plan.values().map(Vec::len).sum();
    let choice =
        "how to carry each listed value into the new version's shape (or decide to drop it)";
    let handoff = |fact: String| Handoff {
        open: planned.files(),
        choice: choice.into(),
        fact,
    };
    if planned.lossy.is_empty() {
        return Ok(Prepared {
            rewrites: planned.rewrites,
            swapped,
            reshaped: Vec::new(),
        });
    }
    let count = planned.lossy.iter().map(|l| l.losses.len()).sum::<usize>();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let Some(model) = model.filter(|_| planned.reshapable()) else {
        let fact = if planned
            .lossy
            .iter()
            .all(|l| l.losses.iter().all(|x| matches!(x, Loss::Unverifiable(_))))
        {
            format!(
                "the schema check could not run on {count} document{}, and an unchecked swap may lose data; nothing was pushed, not even the clean swaps",
                plural(count)
            )
        } else if model.is_some() {
            format!(
                "the destination schema would prune or reject {count} value{} the swap alone would lose, in a chart template or a document the check could not read, which Bosun does not reshape; nothing was pushed, not even the clean swaps",
                plural(count)
            )
        } else {
            format!(
                "the destination schema would prune or reject {count} value{} the swap alone would lose, and a reshape needs a model, which is not configured; nothing was pushed, not even the clean swaps",
                plural(count)
            )
        };
        return Err((handoff(fact), planned.loss_lines()));
    };
    let mut rewrites = planned.rewrites.clone();
    let mut lines = Vec::new();
    for item in &planned.lossy {
        let doc = report::text(&item.document.to_string());
        let Some(schema) = crate::schema::version_schema(&item.crd, &item.version) else {
            return Err((
                handoff(format!("the CRD declares no schema for {}", item.version)),
                vec![],
            ));
        };
        let request = Request {
            purpose: "reshape".into(),
            subject: item.document.to_string(),
            system: reshape::SYSTEM.into(),
            prompt: reshape::prompt(&item.object, schema, &item.losses),
            schema: reshape::reply_schema(),
        };
        let reply = match model.call(&request).await {
            Ok(reply) => reply,
            Err(refusal) => {
                say(format!(
                    "model call for {} refused: {refusal}",
                    item.document
                ));
                return Err((
                    handoff(format!(
                        "the model's reply for {} was refused ({refusal}); nothing was pushed, not even the clean swaps",
                        item.document
                    )),
                    item.losses.iter().map(|x| format!("{doc}: {x}")).collect(),
                ));
            }
        };
        let accepted = match reshape::check_proposal(
            &item.object,
            &reply.value,
            &item.crd,
            &item.version,
        ) {
            Ok(accepted) => accepted,
            Err(refused) => {
                say(format!(
                    "reshape of {} refused by {}: {}",
                    item.document, refused.rule, refused.detail
                ));
                let mut details = vec![format!("{doc}: the proposal was refused by {refused}")];
                details.extend(item.losses.iter().map(|x| format!("{doc}: {x}")));
                return Err((
                    handoff(format!(
                        "the harness refused the model's reshape of {} (rule {}); nothing was pushed, not even the clean swaps",
                        item.document, refused.rule
                    )),
                    details,
                ));
            }
        };
        let Some(rewrite) = rewrites.iter_mut().find(|r| r.path == item.document.file) else {
            return Err((
                handoff(format!(
                    "{} is not among the rewritten files",
                    item.document.file
                )),
                vec![],
            ));
        };
        match reshape::replace_document(&rewrite.after, &item.object, &accepted.yaml) {
            Ok(after) => rewrite.after = after,
            Err(why) => {
                return Err((
                    handoff(format!(
                        "the reshaped {} cannot be written back: {why}; nothing was pushed, not even the clean swaps",
                        item.document
                    )),
                    vec![],
                ));
            }
        }
        let mut parts = Vec::new();
        for (from, to, value) in &accepted.moved {
            parts.push(format!(
                "moved {} = {} to {}",
                report::code(from),
                report::text(&value.to_string()),
                report::code(to)
            ));
        }
        for (path, value) in &accepted.dropped {
            parts.push(format!(
                "dropped {} = {} (the {} schema has no field for it)",
                report::code(path),
                report::text(&value.to_string()),
                report::text(&item.version)
            ));
        }
        say(format!(
            "reshaped {} ({} tokens in, {} out)",
            item.document, reply.usage.input_tokens, reply.usage.output_tokens
        ));
        let mut line = String::new();
        let _ = write!(line, "{doc}: {}", parts.join("; "));
        lines.push(line);
    }
    // Belt and braces: the reshaped files lose nothing under the schema.
    let left = reshape_losses(&rewrites, &planned.plan, dropped, &planned.rendering);
    if !left.is_empty() {
        return Err((
            Handoff {
                open: planned.files(),
                choice: choice.into(),
                fact: "the reshaped documents would still lose values; nothing was pushed, not even the clean swaps".into(),
            },
            left.iter()
                .map(|(d, l)| format!("{}: {l}", report::text(&d.to_string())))
                .collect(),
        ));
    }
    Ok(Prepared {
        rewrites,
        swapped,
        reshaped: lines,
    })
}
