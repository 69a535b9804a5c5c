//! The observer's Prometheus metrics. Labels are bounded: namespace and Stage, or a static
//! reason; never error text.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub namespace: String,
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// A static outcome: no_drift, waiting, promoted, refused (the Stage has no promotion steps),
    /// freight_missing, already_failed, skipped, not_observed.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// A static reason: kube_api, promotion_refused, serialization.
    pub reason: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    pub freight_missing: Family<StageLabels, Gauge>,
    pub promotions_created: Family<StageLabels, Counter>,
    pub reconciles: Family<OutcomeLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kargo_observer");
        let freight_missing = Family::<StageLabels, Gauge>::default();
        registry.register(
            "freight_missing",
            "1 while an Application of the Stage runs images no Freight holds",
            freight_missing.clone(),
        );
        let promotions_created = Family::<StageLabels, Counter>::default();
        registry.register(
            "promotions_created",
            "Promotions the observer created",
            promotions_created.clone(),
        );
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        registry.register("reconciles", "Reconciles by outcome", reconciles.clone());
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconcile errors by reason",
            errors.clone(),
        );
        let reconcile_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            reconcile_duration.clone(),
        );
        Metrics {
            registry,
            freight_missing,
            promotions_created,
            reconciles,
            errors,
            reconcile_duration,
        }
    }
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
