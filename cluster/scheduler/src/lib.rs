//! The shard's scheduler: kube-scheduler's framework (extension points as narrow traits,
//! plugins enabled and weighted by profile), a scheduling queue that requeues unschedulable
//! pods on the cluster events that could make them fit, a flat node cache with assumed pods,
//! and binding through the API's `pods/binding`.

pub mod cache;
pub mod config;
pub mod framework;
pub mod memo;
pub mod metrics;
pub mod plugins;
pub mod queue;
pub mod resources;
pub mod scheduler;
pub mod topology;

pub use scheduler::{Scheduler, SchedulerOptions};

/// `namespace/name` of an object.
pub fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    tessera_runtime::informer::key_of(meta)
}
