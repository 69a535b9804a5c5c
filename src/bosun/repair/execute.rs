//! The one executor of a repair: model calls (reserved first) -> `decide` -> the applier's
//! admission -> the write -> commit -> push -> comment. Where the repair lands is a [`Sink`]:
//! a pull request's branch on the forge (the triage) or a local branch (`bosun repair`).

use std::path::Path;

use super::{CapHit, Prepared, Refusal, Repair, Step};
use crate::bosun::applier::{self, Rewrite};
use crate::bosun::classify::Handoff;
use crate::model::Model;

/// Where a repair lands: the tree it is written into, and the commit, the push and the word
/// to a person around it.
#[async_trait::async_trait]
pub trait Sink: Send {
    type Error: Send;

    /// The checkout the rewrites are admitted against and written into.
    fn tree(&self) -> &Path;

    /// Counts `needed` model calls before they are made: `Err` when a cap does not allow them.
    async fn reserve(&mut self, needed: u32) -> Result<Result<(), CapHit>, Self::Error>;

    /// One line of what happened (a model call's outcome).
    fn say(&mut self, line: String);

    /// Hands the repair to a person: nothing is written. Returns the sink's one-line account.
    async fn hand_off(&mut self, refusal: Refusal) -> Result<String, Self::Error>;

    /// The rewrites could not be written.
    fn write_failed(&self, error: std::io::Error) -> Self::Error;

    /// Commits the written `rewrites` with `message`: returns the commit.
    async fn commit(&mut self, rewrites: &[Rewrite], message: &str) -> Result<String, Self::Error>;

    /// Publishes `commit` (a push without force, or a branch of its own).
    async fn push(&mut self, commit: &str) -> Result<(), Self::Error>;

    /// Tells a person what the repair did.
    async fn comment(&mut self, prepared: &Prepared, commit: &str) -> Result<(), Self::Error>;
}

/// How an executed repair ended.
pub enum Executed {
    /// Handed to a person, with the sink's account.
    HandedOff(String),
    /// Pushed: the commit.
    Pushed(String),
}

/// Runs `repair` to the end through `sink`: reserves the calls it needs, makes each call
/// `decide` asks for (one at a time), has the applier admit what it decided, writes it,
/// commits, pushes and comments. Any refusal hands off and writes nothing.
pub async fn execute<S: Sink>(
    repair: &dyn Repair,
    model: Option<&dyn Model>,
    sink: &mut S,
) -> Result<Executed, S::Error> {
    // Model calls are counted before they are made (a restart counts them).
    let needed = repair.calls_needed(model.is_some());
    if needed > 0
        && let Err(hit) = sink.reserve(needed).await?
    {
        let refusal = repair.cap_refusal(needed, &hit);
        return sink.hand_off(refusal).await.map(Executed::HandedOff);
    }
    let mut replies = Vec::new();
    let prepared = loop {
        let step = tokio::task::block_in_place(|| repair.decide(model.is_some(), &replies));
        match step {
            Step::Done(Ok(prepared)) => break prepared,
            Step::Done(Err(refusal)) => {
                return sink.hand_off(refusal).await.map(Executed::HandedOff);
            }
            Step::Ask(requests) => {
                let (Some(model), Some(request)) = (model, requests.into_iter().next()) else {
                    // decide never asks without a model; refuse rather than loop.
                    let refusal = (
                        Handoff {
                            open: String::new(),
                            choice: repair.choice().to_string(),
                            fact: "the repair needs a model, which is not configured".into(),
                        },
                        vec![],
                    );
                    return sink.hand_off(refusal).await.map(Executed::HandedOff);
                };
                let mut said = Vec::new();
                let reply = super::call(model, &request, &mut |line| said.push(line)).await;
                for line in said {
                    sink.say(line);
                }
                replies.push(reply);
            }
        }
    };
    // The applier admits every rewrite, whatever planned it (the scope, the lists, the file
    // still as it was read).
    if let Err(refusal) = super::admit(repair, sink.tree(), &prepared.rewrites) {
        return sink.hand_off(refusal).await.map(Executed::HandedOff);
    }
    applier::write(sink.tree(), &prepared.rewrites).map_err(|e| sink.write_failed(e))?;
    let commit = sink.commit(&prepared.rewrites, &prepared.message).await?;
    sink.push(&commit).await?;
    sink.comment(&prepared, &commit).await?;
    Ok(Executed::Pushed(commit))
}
