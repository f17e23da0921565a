//! Two-level scheduling for frameworks, after Mesos: a framework subscribes over gRPC
//! (`tessera.offers.v1`), is offered nodes' free resources as Dominant Resource Fairness
//! allows, and launches tasks by accepting — each task a pod the shard's scheduler binds to
//! the offered node, so frameworks and Kubernetes workloads share nodes without either
//! double-allocating. [`batch`] is an example framework.

pub mod allocator;
pub mod batch;
pub mod metrics;
pub mod service;

pub use metrics::OfferMetrics;
pub use service::{
    Authenticate, EventTx, FleetView, Ledger, Offers, OffersConfig, admit, bearer, first_subscribe,
    framework_id, may_resubscribe,
};
