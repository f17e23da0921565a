//! NodeResourcesFit: a pod fits a node if what it requests is at most what the node has left
//! (cpu, memory, ephemeral storage, pod slots, extended resources); scoring spreads pods
//! (LeastAllocated) or packs them (MostAllocated). Also NodeResourcesBalancedAllocation,
//! which prefers nodes whose cpu and memory use stay even.

use serde::Deserialize;

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, MAX_NODE_SCORE, Plugin, PreFilterPlugin, ScorePlugin,
    Status,
};
use crate::resources::{NodeInfo, PodInfo};

/// Registered name.
pub const NAME: &str = "NodeResourcesFit";
/// Registered name of the balance scorer.
pub const BALANCED: &str = "NodeResourcesBalancedAllocation";

/// How NodeResourcesFit scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
pub enum Strategy {
    /// Prefer nodes with the most room left (spreads).
    #[default]
    LeastAllocated,
    /// Prefer nodes already most used (packs, leaving whole nodes free).
    MostAllocated,
}

/// `pluginConfig` args of NodeResourcesFit.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FitArgs {
    /// The scoring strategy.
    #[serde(default)]
    pub scoring_strategy: Option<ScoringStrategy>,
}

/// `scoringStrategy`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScoringStrategy {
    /// `LeastAllocated` or `MostAllocated`.
    #[serde(default, rename = "type")]
    pub kind: Strategy,
    /// Weights of cpu and memory (others are not scored).
    #[serde(default)]
    pub resources: Vec<ResourceWeight>,
}

/// A resource's weight in the score.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceWeight {
    /// `cpu` or `memory`.
    pub name: String,
    /// Its weight.
    pub weight: i64,
}

/// NodeResourcesFit.
pub struct Fit {
    strategy: Strategy,
    cpu_weight: i64,
    memory_weight: i64,
}

impl Fit {
    /// Built from its args.
    pub fn new(args: FitArgs) -> Result<Fit, String> {
        let s = args.scoring_strategy.unwrap_or_default();
        let (mut cpu, mut mem) = (1, 1);
        if !s.resources.is_empty() {
            (cpu, mem) = (0, 0);
            for r in &s.resources {
                if r.weight < 0 {
                    return Err(format!("resource {} has a negative weight", r.name));
                }
                match r.name.as_str() {
                    "cpu" => cpu = r.weight,
                    "memory" => mem = r.weight,
                    other => {
                        return Err(format!(
                            "scoring resource {other:?} is not supported (cpu and memory are)"
                        ));
                    }
                }
            }
            if cpu + mem == 0 {
                return Err("scoring resources have a total weight of 0".into());
            }
        }
        Ok(Fit {
            strategy: s.kind,
            cpu_weight: cpu,
            memory_weight: mem,
        })
    }
}

impl Plugin for Fit {
    fn name(&self) -> &'static str {
        NAME
    }
    fn pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
    fn score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
}

impl PreFilterPlugin for Fit {
    fn pre_filter(&self, _: &mut CycleState, _: &PodInfo) -> Status {
        // Requests are computed once when the pod is queued (PodInfo); nothing more to do.
        Status::success()
    }
}

/// The reasons a node cannot hold `pod`, in Kubernetes' words (empty if it can).
pub fn insufficient(pod: &PodInfo, node: &NodeInfo) -> Vec<std::borrow::Cow<'static, str>> {
    // Room held for pods nominated here by preemption counts as used.
    let held = node.nominated_for(pod).map(|mut n| {
        n.add(&node.requested);
        n
    });
    let (r, a, u) = (
        &pod.requests,
        &node.allocatable,
        held.as_ref().unwrap_or(&node.requested),
    );
    let mut why = Vec::new();
    if u.pods + 1 > a.pods {
        why.push("Too many pods".into());
    }
    if r.milli_cpu > 0 && r.milli_cpu > a.milli_cpu - u.milli_cpu {
        why.push("Insufficient cpu".into());
    }
    if r.memory > 0 && r.memory > a.memory - u.memory {
        why.push("Insufficient memory".into());
    }
    if r.ephemeral_storage > 0 && r.ephemeral_storage > a.ephemeral_storage - u.ephemeral_storage {
        why.push("Insufficient ephemeral-storage".into());
    }
    for (name, v) in &r.extended {
        if *v > 0 && *v > a.extended(name) - u.extended(name) {
            why.push(format!("Insufficient {name}").into());
        }
    }
    why
}

impl FilterPlugin for Fit {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let why = insufficient(pod, node);
        if why.is_empty() {
            Status::success()
        } else {
            Status {
                code: crate::framework::Code::Unschedulable,
                reasons: why,
                plugin: NAME,
            }
        }
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeAllocatable,
            ClusterEvent::AssignedPodDelete,
        ]
    }
}

fn fraction_score(requested: i64, capacity: i64, strategy: Strategy) -> i64 {
    if capacity <= 0 {
        return 0;
    }
    let requested = requested.min(capacity);
    match strategy {
        Strategy::LeastAllocated => (capacity - requested) * MAX_NODE_SCORE / capacity,
        Strategy::MostAllocated => requested * MAX_NODE_SCORE / capacity,
    }
}

impl ScorePlugin for Fit {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let cpu = fraction_score(
            node.non_zero_requested.0 + pod.non_zero.0,
            node.allocatable.milli_cpu,
            self.strategy,
        );
        let mem = fraction_score(
            node.non_zero_requested.1 + pod.non_zero.1,
            node.allocatable.memory,
            self.strategy,
        );
        Ok((cpu * self.cpu_weight + mem * self.memory_weight)
            / (self.cpu_weight + self.memory_weight))
    }
}

/// NodeResourcesBalancedAllocation: nodes where cpu and memory would be used evenly score
/// higher.
pub struct Balanced;

impl Plugin for Balanced {
    fn name(&self) -> &'static str {
        BALANCED
    }
    fn score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
}

impl ScorePlugin for Balanced {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Result<i64, Status> {
        let frac = |req: i64, cap: i64| {
            if cap <= 0 {
                1.0
            } else {
                (req as f64 / cap as f64).min(1.0)
            }
        };
        let c = frac(
            node.non_zero_requested.0 + pod.non_zero.0,
            node.allocatable.milli_cpu,
        );
        let m = frac(
            node.non_zero_requested.1 + pod.non_zero.1,
            node.allocatable.memory,
        );
        // The standard deviation of two fractions is half their difference.
        let std = (c - m).abs() / 2.0;
        Ok(((1.0 - std) * MAX_NODE_SCORE as f64) as i64)
    }
}
