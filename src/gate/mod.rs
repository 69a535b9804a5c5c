//! The gate's verdict: render at the merge base and the head, diff, apply the rules, report.

pub mod check;
pub mod crd;
pub mod diff;
pub mod html;
pub mod publish;
pub mod report;
pub mod rules;
pub mod shard;
pub mod text;
pub mod verdict;

/// A scoped thread's result; its panic goes on in the caller.
pub(crate) fn joined<T>(result: std::thread::Result<T>) -> T {
    result.unwrap_or_else(|p| std::panic::resume_unwind(p))
}
