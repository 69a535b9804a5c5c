//! The apiVersion swap of dropped served versions, from the gate's evidence to the rewrites
//! ready to write: the swap plan, the head's render (scope and CRD schemas), the applier's
//! checks, the loss check, and the reshape behind the harness.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::{CapHit, Comment, PlanError, Prepared, Refusal, Renders, Repair, Step};
use crate::bosun::applier::{self, Policy, Rewrite};
use crate::bosun::classify::Handoff;
use crate::bosun::config::Config;
use crate::bosun::reshape::{self, Loss, Lossy, reshape_losses};
use crate::bosun::swap::{self, Swap};
use crate::gate::report;
use crate::gate::rules::DroppedServedVersion;
use crate::model::Request;
use crate::render::Rendering;

/// The swap planned and prepared, with what the loss check found.
pub struct Planned {
    pub plan: BTreeMap<String, Vec<Swap>>,
    pub rendering: Rendering,
    pub rewrites: Vec<Rewrite>,
    pub lossy: Vec<Lossy>,
    /// What a prompt holds back (`model.redact` over the built-in rules).
    pub redaction: crate::model::Rules,
}

/// The swap decided: every check passed.
pub struct Swapped {
    pub rewrites: Vec<Rewrite>,
    /// Manifests whose apiVersion moves.
    pub swapped: usize,
    /// One comment line per reshaped document (what moved, what was dropped).
    pub reshaped: Vec<String>,
}

/// Plans the swap for `dropped` on the head `renders` holds: its render, the promotion scope
/// and the deny/allow lists. A render failure is an error; a refused file is a handoff.
pub(super) fn plan_on(
    config: &Config,
    renders: &Renders<'_>,
    dropped: &[DroppedServedVersion],
) -> Result<Result<Planned, Refusal>, PlanError> {
    let checkout = renders.config().repo_dir.as_path();
    let plan = swap::plan(dropped);
    let rendering = renders
        .head()
        .as_ref()
        .map_err(|f| PlanError::HeadDoesNotRender {
            first: f
                .diagnostics
                .first()
                .map(|d| d.message.clone())
                .unwrap_or_default(),
        })?;
    let policy = super::head_policy(config, renders)?;
    let rewrites = match applier::prepare(checkout, &policy, &plan) {
        Ok(rewrites) => rewrites,
        Err(refusals) => {
            let files: Vec<String> = refusals.iter().map(|r| r.path.clone()).collect();
            return Ok(Err((
                Handoff {
                    open: files.join(", "),
                    choice: CHOICE.into(),
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
    let lossy = reshape::lossy_documents(&rewrites, &plan, dropped, rendering);
    Ok(Ok(Planned {
        plan,
        rendering: rendering.clone(),
        rewrites,
        lossy,
        redaction: config.model.redaction(),
    }))
}

/// The choice a person is given when the applier refuses a file of the swap.
const CHOICE: &str = "move each manifest's apiVersion to the version the gate names, or decide the file should not move";

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

    /// The handoff when the reshape needs `needed` calls and the cap allows fewer (`made` of
    /// `cap` already used for this head).
    pub fn cap_refusal(&self, needed: u32, hit: &CapHit) -> Refusal {
        (
            Handoff {
                open: self.files(),
                choice: "how to carry each listed value into the new version's shape (or decide to drop it)".into(),
                fact: format!(
                    "a reshape needs {needed} model call{} and {hit}; nothing was pushed, not even the clean swaps",
                    crate::plural(needed)
                ),
            },
            self.loss_lines(),
        )
    }

    /// The lossy documents' files, each once.
    pub fn files(&self) -> String {
        let mut files: Vec<&str> = self
            .lossy
            .iter()
            .map(|l| l.document.file.as_str())
            .collect();
        files.dedup();
        files.join(", ")
    }

    /// One line per value the swap alone would lose (a credential the prompt would hold
    /// back is not shown: its placeholder stands in).
    pub fn loss_lines(&self) -> Vec<String> {
        self.lossy
            .iter()
            .flat_map(|l| {
                let doc = report::text(&l.document.to_string());
                let held = redaction(l, &self.redaction).1;
                l.losses
                    .iter()
                    .map(move |x| format!("{doc}: {}", x.scrubbed(&held)))
            })
            .collect()
    }
}

/// The reshape's prompt for one lossy document and the values its placeholders stand for
/// (deterministic: `decide` computes it again to restore a reply).
fn redaction(item: &Lossy, rules: &crate::model::Rules) -> (Option<String>, crate::model::Held) {
    let Some(schema) = crate::schema::version_schema(&item.crd, &item.version) else {
        return (None, crate::model::Held::new());
    };
    let source = crate::schema::version_schema(&item.crd, &item.source);
    let (prompt, held) = reshape::prompt(&item.object, schema, source, &item.losses, rules);
    (Some(prompt), held)
}

/// A lossy document whose destination version the CRD gives no schema: no prompt to make.
#[derive(Debug, thiserror::Error)]
#[error("the CRD declares no schema for {version}")]
struct NoSchema {
    version: String,
}

/// The reshape's request for one lossy document.
fn request(item: &Lossy, rules: &crate::model::Rules) -> Result<Request, NoSchema> {
    let (Some(prompt), _) = redaction(item, rules) else {
        return Err(NoSchema {
            version: item.version.clone(),
        });
    };
    Ok(Request {
        purpose: "reshape".into(),
        subject: item.document.to_string(),
        system: reshape::SYSTEM.into(),
        prompt,
        schema: reshape::reply_schema(),
    })
}

/// The choice a person is given when a reshape is needed and Bosun does not make it.
const RESHAPE_CHOICE: &str =
    "how to carry each listed value into the new version's shape (or decide to drop it)";

/// Decides the repair from the plan and the model's replies so far (one per lossy document,
/// in order). Every reply is checked by the harness; any refusal hands off.
pub fn decide(
    planned: &Planned,
    dropped: &[DroppedServedVersion],
    model_configured: bool,
    replies: &[Result<crate::model::Reply, crate::model::Refusal>],
) -> Step<Swapped> {
    let swapped: usize = planned.plan.values().map(Vec::len).sum();
    if planned.lossy.is_empty() {
        return Step::Done(Ok(Swapped {
            rewrites: planned.rewrites.clone(),
            swapped,
            reshaped: Vec::new(),
        }));
    }
    if !(model_configured && planned.reshapable()) {
        return Step::Done(Err((
            planned.handoff(unreshaped_fact(planned, model_configured)),
            planned.loss_lines(),
        )));
    }
    let mut rewrites = planned.rewrites.clone();
    let mut lines = Vec::new();
    for (index, item) in planned.lossy.iter().enumerate() {
        let Some(reply) = replies.get(index) else {
            return planned.ask_from(index);
        };
        match reshape_one(planned, item, reply, &mut rewrites) {
            Ok(line) => lines.push(line),
            Err(refusal) => return Step::Done(Err(refusal)),
        }
    }
    if let Err(refusal) = nothing_left(planned, dropped, &rewrites) {
        return Step::Done(Err(refusal));
    }
    Step::Done(Ok(Swapped {
        rewrites,
        swapped,
        reshaped: lines,
    }))
}

impl Planned {
    /// The handoff of a reshape Bosun does not make: the lossy documents' files.
    fn handoff(&self, fact: String) -> Handoff {
        Handoff {
            open: self.files(),
            choice: RESHAPE_CHOICE.into(),
            fact,
        }
    }

    /// The requests for the lossy documents from `index` on (not yet asked), or the handoff
    /// when one has no prompt to make.
    fn ask_from(&self, index: usize) -> Step<Swapped> {
        let requests: Result<Vec<Request>, NoSchema> = self.lossy[index..]
            .iter()
            .map(|l| request(l, &self.redaction))
            .collect();
        match requests {
            Ok(requests) => Step::Ask(requests),
            Err(why) => Step::Done(Err((self.handoff(why.to_string()), vec![]))),
        }
    }
}

/// Why a lossy swap goes to a person without a model call.
fn unreshaped_fact(planned: &Planned, model_configured: bool) -> String {
    let count = planned.lossy.iter().map(|l| l.losses.len()).sum::<usize>();
    if planned
        .lossy
        .iter()
        .all(|l| l.losses.iter().all(|x| matches!(x, Loss::Unverifiable(_))))
    {
        format!(
            "the schema check could not run on {count} document{}, and an unchecked swap may lose data; nothing was pushed, not even the clean swaps",
            crate::plural(count)
        )
    } else if model_configured {
        format!(
            "the destination schema would prune or reject {count} value{} the swap alone would lose, in a chart template or a document the check could not read, which Bosun does not reshape; nothing was pushed, not even the clean swaps",
            crate::plural(count)
        )
    } else {
        format!(
            "the destination schema would prune or reject {count} value{} the swap alone would lose, and a reshape needs a model, which is not configured; nothing was pushed, not even the clean swaps",
            crate::plural(count)
        )
    }
}

/// One lossy document reshaped from the model's reply: the harness's verdict, written into
/// its file's rewrite; returns the comment's line for it.
fn reshape_one(
    planned: &Planned,
    item: &Lossy,
    reply: &Result<crate::model::Reply, crate::model::Refusal>,
    rewrites: &mut [Rewrite],
) -> Result<String, Refusal> {
    let doc = report::text(&item.document.to_string());
    let (_, held) = redaction(item, &planned.redaction);
    let losses = || {
        item.losses
            .iter()
            .map(|x| format!("{doc}: {}", x.scrubbed(&held)))
    };
    let reply = reply.as_ref().map_err(|refusal| {
        (
            planned.handoff(format!(
                "the model's reply for {} was refused ({refusal}); nothing was pushed, not even the clean swaps",
                item.document
            )),
            losses().collect(),
        )
    })?;
    // Every placeholder the reply carries becomes the original's value it stands for: a
    // held value is never taken from a reply, and the harness judges where it went.
    let restored = held.restore(&reply.value);
    let accepted = reshape::check_proposal(
        &item.object,
        &restored,
        &item.crd,
        &item.source,
        &item.version,
    )
    .map_err(|mut refused| {
        refused.detail = held.scrub(&refused.detail);
        let mut details = vec![format!("{doc}: the proposal was refused by {refused}")];
        details.extend(losses());
        (
            planned.handoff(format!(
                "the harness refused the model's reshape of {} (rule {}); nothing was pushed, not even the clean swaps",
                item.document, refused.rule
            )),
            details,
        )
    })?;
    let Some(rewrite) = rewrites.iter_mut().find(|r| r.path == item.document.file) else {
        return Err((
            planned.handoff(format!(
                "{} is not among the rewritten files",
                item.document.file
            )),
            vec![],
        ));
    };
    rewrite.after = reshape::replace_document(&rewrite.after, &item.object, &accepted.yaml)
        .map_err(|why| {
            (
                planned.handoff(format!(
                    "the reshaped {} cannot be written back: {why}; nothing was pushed, not even the clean swaps",
                    item.document
                )),
                vec![],
            )
        })?;
    Ok(reshaped_line(&doc, &held, &accepted, &item.version))
}

/// The comment's line for a reshaped document: what moved, what was dropped. A value the
/// prompt held back is named, never shown.
fn reshaped_line(
    doc: &str,
    held: &crate::model::Held,
    accepted: &reshape::Accepted,
    version: &str,
) -> String {
    let shown = |value: &Value| {
        if held.shows_held(value) {
            "(a sensitive value, not shown)".to_string()
        } else {
            report::text(&value.to_string())
        }
    };
    let mut parts = Vec::new();
    for (from, to, value) in &accepted.moved {
        parts.push(format!(
            "moved {} = {} to {}",
            report::code(from),
            shown(value),
            report::code(to)
        ));
    }
    for (path, value) in &accepted.dropped {
        parts.push(format!(
            "dropped {} = {} (the {} schema has no field for it)",
            report::code(path),
            shown(value),
            report::text(version)
        ));
    }
    let mut line = String::new();
    let _ = write!(line, "{doc}: {}", parts.join("; "));
    line
}

/// Belt and braces: the reshaped files lose nothing under the schema.
fn nothing_left(
    planned: &Planned,
    dropped: &[DroppedServedVersion],
    rewrites: &[Rewrite],
) -> Result<(), Refusal> {
    let left = reshape_losses(rewrites, &planned.plan, dropped, &planned.rendering);
    if left.is_empty() {
        return Ok(());
    }
    Err((
        planned.handoff(
            "the reshaped documents would still lose values; nothing was pushed, not even the clean swaps".into(),
        ),
        left.iter()
            .map(|(d, l)| {
                let held = planned
                    .lossy
                    .iter()
                    .find(|x| &x.document == d)
                    .map(|x| redaction(x, &planned.redaction).1)
                    .unwrap_or_default();
                format!("{}: {}", report::text(&d.to_string()), l.scrubbed(&held))
            })
            .collect(),
    ))
}

/// The swap as a [`Repair`]: the plan, the gate's evidence and the head's policy.
pub struct SwapRepair {
    planned: Planned,
    dropped: Vec<DroppedServedVersion>,
    policy: Policy,
}

impl SwapRepair {
    pub fn new(
        config: &Config,
        renders: &Renders<'_>,
        planned: Planned,
        dropped: &[DroppedServedVersion],
    ) -> Result<Self, PlanError> {
        Ok(SwapRepair {
            planned,
            dropped: dropped.to_vec(),
            policy: super::head_policy(config, renders)?,
        })
    }

    /// The commit message, the comment and the lines of a decided swap.
    fn prepared(&self, swapped: Swapped) -> Prepared {
        let Swapped {
            rewrites,
            swapped,
            reshaped,
        } = swapped;
        let files: Vec<&str> = rewrites.iter().map(|r| r.path.as_str()).collect();
        let mut message = if reshaped.is_empty() {
            format!(
                "Move {swapped} manifest{} off API versions the new chart stops serving\n\nBosun rewrote apiVersion values only, as the addons-gate report asked:\n",
                crate::plural(swapped)
            )
        } else {
            format!(
                "Move {swapped} manifest{} off API versions the new chart stops serving, reshaping {} for the new schema\n\nBosun rewrote apiVersion values as the addons-gate report asked, and re-serialised the reshaped documents from the structure its harness validated:\n",
                crate::plural(swapped),
                reshaped.len()
            )
        };
        for file in &files {
            let _ = writeln!(message, "- {file}");
        }
        let opening = (
            format!(
                "**Repaired.** The gate found manifests declaring API versions the new chart stops serving. Bosun moved {swapped} of them to the versions the gate named (commit "
            ),
            format!(
                "), {}:\n\n",
                if reshaped.is_empty() {
                    "changing apiVersion values only"
                } else {
                    "changing apiVersion values, and reshaping the documents listed below"
                }
            ),
        );
        let mut rest = String::new();
        for crd in &self.dropped {
            let _ = writeln!(
                rest,
                "- {} {} → {}: {}",
                report::code(&crd.kind),
                report::text(&crd.dropped.join(", ")),
                report::code(&format!("{}/{}", crd.group, crd.storage)),
                crd.consumers
                    .iter()
                    .map(|c| report::code(&c.path))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if !reshaped.is_empty() {
            rest.push_str("\nThe new schema has no place for some values as they were written, so these documents were reshaped (a model proposed each one; Bosun's harness checked that it keeps the object's identity, fits the new schema and carries no value the original or the schema did not supply, then wrote the YAML itself):\n\n");
            for line in &reshaped {
                let _ = writeln!(rest, "- {line}");
            }
        }
        Prepared {
            done: format!(
                "swapped apiVersions in {} file{} ({swapped} manifests)",
                files.len(),
                crate::plural(files.len())
            ),
            summary: format!("{swapped} manifest(s)"),
            changes: reshaped.iter().map(|l| format!("reshaped {l}")).collect(),
            message,
            comment: Comment {
                opening,
                rest,
                closing:
                    "\nThe gate re-runs on the pushed commit and counts the consumers again.\n"
                        .into(),
            },
            rewrites,
        }
    }
}

impl Repair for SwapRepair {
    fn calls_needed(&self, model: bool) -> u32 {
        self.planned.calls_needed(model)
    }

    fn cap_refusal(&self, needed: u32, hit: &CapHit) -> Refusal {
        self.planned.cap_refusal(needed, hit)
    }

    fn decide(
        &self,
        model: bool,
        replies: &[Result<crate::model::Reply, crate::model::Refusal>],
    ) -> Step {
        match decide(&self.planned, &self.dropped, model, replies) {
            Step::Ask(requests) => Step::Ask(requests),
            Step::Done(done) => Step::Done(done.map(|swapped| self.prepared(swapped))),
        }
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn choice(&self) -> &str {
        CHOICE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::rules::Consumer;
    use crate::model::{Reply, Usage};
    use crate::render::{ClusterRef, Origin, RenderedApplication};
    use serde_json::json;

    fn setup() -> (Planned, Vec<DroppedServedVersion>) {
        let crd_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "scenarios/sample/charts/charts.example.test/stable/external-secrets/2.10.0/crds/externalsecrets.yaml",
        );
        let crd: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(crd_path).unwrap()).unwrap();
        let doc = |api: &str| {
            format!(
                "apiVersion: {api}\nkind: ExternalSecret\nmetadata:\n  name: s\nspec:\n  refreshInterval: 1h\n  target:\n    name: s\n    immutable: true\n"
            )
        };
        let rewrites = vec![Rewrite {
            path: "s.yaml".into(),
            before: doc("external-secrets.io/v1beta1"),
            after: doc("external-secrets.io/v1"),
        }];
        let dropped = vec![DroppedServedVersion {
            crd: "externalsecrets.external-secrets.io".into(),
            group: "external-secrets.io".into(),
            kind: "ExternalSecret".into(),
            dropped: vec!["v1beta1".into()],
            served: vec!["v1".into()],
            storage: "v1".into(),
            clusters: vec!["prod".into()],
            consumers: vec![Consumer {
                path: "s.yaml".into(),
                document: 0,
                api_version: "external-secrets.io/v1beta1".into(),
                kind: "ExternalSecret".into(),
                namespace: String::new(),
                name: "s".into(),
                template: false,
            }],
        }];
        let plan = swap::plan(&dropped);
        let rendering = Rendering {
            revision: "r".into(),
            applications: vec![RenderedApplication {
                name: "es".into(),
                namespace: "argocd".into(),
                project: "default".into(),
                origin: Origin::File {
                    path: "a.yaml".into(),
                    document: 0,
                },
                cluster: ClusterRef {
                    name: "prod".into(),
                    server: "https://prod".into(),
                },
                destination_namespace: "es".into(),
                sources: vec![],
                objects: vec![std::sync::Arc::new(crd)],
                render_keys: vec![],
                manifest: Value::Null,
                stored: Value::Null,
                destination_unknown: None,
                values_files: Vec::new(),
            }],
            diagnostics: vec![],
            stats: Default::default(),
        };
        let lossy = reshape::lossy_documents(&rewrites, &plan, &dropped, &rendering);
        (
            Planned {
                plan,
                rendering,
                rewrites,
                lossy,
                redaction: Default::default(),
            },
            dropped,
        )
    }

    fn reply(value: Value) -> Result<Reply, crate::model::Refusal> {
        Ok(Reply {
            value,
            usage: Usage::default(),
        })
    }

    #[test]
    fn the_decision_asks_then_decides_from_the_replies_alone() {
        let (planned, dropped) = setup();
        assert_eq!(planned.calls_needed(true), 1);
        let Step::Ask(requests) = decide(&planned, &dropped, true, &[]) else {
            panic!("expected a request");
        };
        assert_eq!(requests.len(), 1);
        assert!(requests[0].prompt.contains("\"immutable\""));
        let good = json!({"document": {"apiVersion": "external-secrets.io/v1", "kind": "ExternalSecret",
            "metadata": {"name": "s"}, "spec": {"refreshInterval": "1h", "target": {"name": "s"}}}});
        let Step::Done(Ok(prepared)) = decide(&planned, &dropped, true, &[reply(good.clone())])
        else {
            panic!("expected a repair");
        };
        assert!(prepared.reshaped[0].contains("dropped `spec.target.immutable` = true"));
        assert!(!prepared.rewrites[0].after.contains("immutable"));
        // A refused call, a reply the harness refuses, or no model: a handoff.
        let refused = [Err(crate::model::Refusal::Empty)];
        assert!(matches!(
            decide(&planned, &dropped, true, &refused),
            Step::Done(Err(_))
        ));
        let mut invented = good;
        invented["document"]["spec"]["target"]["creationPolicy"] = json!("Merge");
        let Step::Done(Err((handoff, _))) = decide(&planned, &dropped, true, &[reply(invented)])
        else {
            panic!("expected a handoff");
        };
        assert!(
            handoff.fact.contains("accounted-values"),
            "{}",
            handoff.fact
        );
        let Step::Done(Err((handoff, _))) = decide(&planned, &dropped, false, &[]) else {
            panic!("expected a handoff");
        };
        assert!(handoff.fact.contains("not configured"));
    }
}
