//! The controller runtime every controller stands on (issue 4, being built): today the
//! priority work queue; the list+watch cache and the reconcile runner join it.

pub mod metrics;
pub mod queue;
