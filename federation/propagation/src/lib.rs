//! The federation's controllers on the runtime: placement of each workload applied at the
//! federation, its propagation to the chosen shards, and its status aggregated back.

pub mod controller;
mod custom;
pub mod dependencies;
pub mod gang;
pub mod moves;
pub mod policy;
pub mod quota;
pub mod status;

pub use controller::{Options, run};
