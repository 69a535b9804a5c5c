//! The observer: when Argo CD runs an image tag Kargo never promoted, create the Promotion that
//! lets Kargo's bookkeeping catch up. `decision` is the pure core; `controller` the kube-rs
//! shell (watches, caches, reconcile); `projection` what the caches keep of each kind;
//! `metrics` the Prometheus families.

pub mod controller;
pub mod decision;
pub mod metrics;
pub mod projection;
