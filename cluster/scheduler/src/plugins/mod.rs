//! The built-in plugins and the registry that builds them by name.

pub mod affinity;
pub mod basic;
pub mod binder;
pub mod fit;
pub mod gang;
pub mod interpod;
pub mod preemption;
pub mod spread;
pub mod taints;

use std::sync::Arc;

use serde_json::Value;

use crate::framework::{Handle, Plugin};

/// Every built-in plugin name.
pub const NAMES: &[&str] = &[
    "PrioritySort",
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "NodeResourcesBalancedAllocation",
    "InterPodAffinity",
    "PodTopologySpread",
    "DefaultPreemption",
    "Coscheduling",
    "DefaultBinder",
];

/// A plugin's `pluginConfig` args: its defaults when there are none.
fn parse_args<T: serde::de::DeserializeOwned + Default>(
    plugin: &str,
    args: &Value,
) -> Result<T, String> {
    if args.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(args.clone()).map_err(|e| format!("{plugin} args: {e}"))
}

/// Builds the plugin `name` with its `pluginConfig` args (null for none).
pub fn build(name: &str, args: &Value, handle: &Handle) -> Result<Arc<dyn Plugin>, String> {
    if let Some(p) = basic::build(name) {
        return Ok(p);
    }
    Ok(match name {
        "TaintToleration" => Arc::new(taints::TaintToleration),
        "NodeAffinity" => Arc::new(affinity::NodeAffinity),
        "NodeResourcesBalancedAllocation" => Arc::new(fit::Balanced),
        "InterPodAffinity" => Arc::new(interpod::InterPodAffinity::new(handle.topology.clone())),
        "PodTopologySpread" => Arc::new(
            spread::PodTopologySpread::with_args(handle.topology.clone(), parse_args(name, args)?)
                .map_err(|e| format!("PodTopologySpread args: {e}"))?,
        ),
        "NodeResourcesFit" => Arc::new(
            fit::Fit::new(parse_args(name, args)?)
                .map_err(|e| format!("NodeResourcesFit args: {e}"))?,
        ),
        "Coscheduling" => Arc::new(gang::Coscheduling::new(handle)),
        "DefaultPreemption" => Arc::new(preemption::DefaultPreemption::new(handle.budgets.clone())),
        "DefaultBinder" => Arc::new(binder::DefaultBinder::new(handle.client.clone())),
        other => {
            return Err(format!(
                "unknown plugin {other:?}; known plugins: {}",
                NAMES.join(", ")
            ));
        }
    })
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod topology_tests;
