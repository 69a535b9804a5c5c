//! The gate's verdict: render at the merge base and the head, diff, apply the rules, report.

pub mod check;
pub mod crd;
pub mod diff;
pub mod publish;
pub mod report;
pub mod rules;
