//! The controller runtime every controller stands on: list+watch caches ([`informer`]) shared
//! per process ([`shared`]), the priority work queue ([`queue`]), controllers and their
//! reconcile runner ([`controller`]), leader election ([`leader`]), expectations and Events.

pub mod affinity;
pub mod client;
pub mod controller;
pub mod events;
pub mod expectations;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod mutation;
pub mod queue;
pub mod selector;
pub mod shared;
pub mod taints;
pub mod tunnel;

pub use controller::{Action, ReconcileError, Reconciler};
pub use informer::{Cache, Change, Informer, Scope, Subscription};
pub use queue::{EventClass, QueueConfig, WorkQueue};
pub use shared::Informers;
