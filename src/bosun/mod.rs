//! Bosun: reads the gate's verdict on a pull request and repairs what is provable (the
//! apiVersion swap), escalates what has nothing to change, and hands the rest to a person. It
//! never merges, closes, fails a check or touches the cluster's workloads (it reads Argo CD's
//! cluster Secrets, nothing else).

pub mod applier;
pub mod classify;
pub mod config;
pub mod explain;
pub mod green_summary;
pub mod journal;
pub mod local;
pub mod migration;
pub mod notes;
pub mod repair;
pub mod reshape;
pub mod runner;
pub mod scalar_fix;
pub mod server;
pub mod swap;
