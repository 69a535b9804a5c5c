//! The reshape check: before anything is pushed, every document the swap rewrote is put
//! through the destination version's structural schema (from the CRD at the head). A field the
//! new schema would prune, or a value it would reject, means the swap alone loses data: the
//! apiserver would accept the document and quietly drop the value, while the render, the gate
//! and the repository all look fine.

mod harness;
mod loss;
mod paths;
mod replace;
mod request;

pub use self::harness::{Accepted, check_proposal, check_proposal_without, order_like};
pub use self::loss::{DocumentRef, Loss, Lossy, crd_for, losses, lossy_documents, reshape_losses};
pub use self::paths::{DocPath, Seg, leaf_paths, leaves, path_text};
pub use self::replace::{ReplaceError, Yaml11Hazard, replace_document};
pub use self::request::{SYSTEM, prompt, reply_schema};

pub(crate) use self::replace::yaml11_hazard;

/// The harness rules a reshape proposal must pass, in the order they run. Each refusal names
/// one (docs/prompt-contract.md).
pub mod rule {
    /// The reply is an object with a `document` object (and nothing else).
    pub const SHAPE: &str = "reply-shape";
    /// apiVersion (the destination), kind, and the whole of metadata are the original's.
    pub const IDENTITY: &str = "identity";
    /// The destination schema prunes nothing from the proposal and validates it, CEL rules
    /// included (a rule that cannot be evaluated refuses).
    pub const SCHEMA: &str = "schema-fit";
    /// Every value of the original the destination keeps is at its path, unchanged.
    pub const KEPT: &str = "kept-values";
    /// Every value of the proposal is the original's at that path, a value the schema change
    /// displaced (used once, moved only to a field the destination schema names and the
    /// source schema lacks, of a type that takes it), or one the schema dictates (default,
    /// one-value enum, const).
    pub const ACCOUNTED: &str = "accounted-values";
    /// Our own YAML of the accepted structure reads back as that structure.
    pub const READ_BACK: &str = "read-back";
}

/// Why a proposal was refused: the rule and the value or path concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::gate::report::text;
        write!(f, "`{}`: {}", self.rule, text(&self.detail))
    }
}

#[cfg(test)]
mod tests;
