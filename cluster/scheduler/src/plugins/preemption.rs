//! DefaultPreemption: when no node fits a pod, find a node where evicting pods of lower
//! priority makes room, with the fewest and least important victims — kube-scheduler's
//! PostFilter, plus Tessera's rule across tenants.
//!
//! - A pod with `preemptionPolicy: Never` never preempts; neither does one whose nominated
//!   node has a preemption under way (a victim evicted there — for it or for another pod
//!   nominated there — still on the node, even before the eviction is seen) or has
//!   lower-priority pods terminating.
//! - Victims have a lower priority than the preemptor and are not terminating. A pod of
//!   *another tenant* is a victim only if that tenant's weighted dominant share is above the
//!   preemptor's tenant's: a tenant under its share may preempt one over it, never the
//!   reverse — so priorities within a tenant order its own pods, and across tenants they
//!   cannot take back what fair share gives.
//! - Per node (only nodes where Filter said Unschedulable, never UnschedulableAndUnresolvable):
//!   remove every possible victim; if the pod still does not fit, the node cannot help.
//!   Otherwise put victims back one by one, most important first, those whose
//!   PodDisruptionBudget allows no disruption before the others, keeping back each one the
//!   pod still fits beside; the rest are the node's victims. Every filter of the profile
//!   judges the node as it would be: evicted pods free their room and no longer count in
//!   the node's domains for spreading and pod (anti-)affinity (kube-scheduler's
//!   `RemovePod`/`AddPod` extensions) — so a low-priority pod whose anti-affinity repels the
//!   pod can be a victim, and one the pod's required affinity needs is never one.
//! - Among candidate nodes (at most max(100, 10% of nodes) are examined, from a rotating
//!   start): fewest PodDisruptionBudget violations, then the lowest highest victim priority,
//!   then the lowest sum of victim priorities, then the fewest victims. Budgets are
//!   respected as Kubernetes does: a node whose victims break none is always preferred, but
//!   a pod that can only be placed by breaking a budget still preempts.
//!
//! The scheduler then sets the pod's `status.nominatedNodeName`, holds the room on that
//! node for it (pods of lower or equal priority leave it), and deletes the victims
//! gracefully, each with a `Preempted` event.

use std::sync::Arc;

use parking_lot::RwLock;
use tessera_core::LabelSelector;

use crate::framework::{
    Code, CycleState, Nomination, Plugin, PostFilterInput, PostFilterPlugin, Status,
};
use crate::queue::FairView;
use crate::resources::{NodeInfo, PodInfo};

/// The plugin's name.
pub const NAME: &str = "DefaultPreemption";

/// Where the cycle leaves the fair-share view for PostFilter.
pub const FAIR_VIEW: &str = "FairView";

/// Where the cycle leaves the node the pod is nominated to already, if any.
pub const NOMINATED: &str = "NominatedNode";

/// Where the cycle leaves whether a victim of the pod's last preemption is still on its node.
pub const UNDERWAY: &str = "PreemptionUnderway";

/// A PodDisruptionBudget as preemption reads it.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Its namespace.
    pub namespace: String,
    /// The pods it covers.
    pub selector: LabelSelector,
    /// `status.disruptionsAllowed`.
    pub allowed: i32,
}

/// The PodDisruptionBudgets as the scheduler sees them (written by the loop).
#[derive(Default)]
pub struct Budgets {
    list: RwLock<Vec<Budget>>,
}

impl Budgets {
    /// Replaces the budgets.
    pub fn set(&self, list: Vec<Budget>) {
        *self.list.write() = list;
    }
}

/// DefaultPreemption.
pub struct DefaultPreemption {
    budgets: Arc<Budgets>,
    next_start: std::sync::atomic::AtomicUsize,
}

impl DefaultPreemption {
    /// The plugin, reading `budgets`.
    pub fn new(budgets: Arc<Budgets>) -> Self {
        DefaultPreemption {
            budgets,
            next_start: Default::default(),
        }
    }
}

impl Plugin for DefaultPreemption {
    fn name(&self) -> &'static str {
        NAME
    }
    fn post_filter(&self) -> Option<&dyn PostFilterPlugin> {
        Some(self)
    }
}

/// A node where preemption would place the pod.
struct Candidate {
    node: usize,
    victims: Vec<Arc<PodInfo>>,
    violations: usize,
}

impl Candidate {
    /// kube-scheduler's order of preference: smaller is better.
    fn rank(&self) -> (usize, i64, i64, usize) {
        let highest = self
            .victims
            .iter()
            .map(|v| i64::from(v.priority))
            .max()
            .unwrap_or(i64::MIN);
        let sum: i64 = self.victims.iter().map(|v| i64::from(v.priority)).sum();
        (self.violations, highest, sum, self.victims.len())
    }
}

fn terminating(p: &PodInfo) -> bool {
    p.pod.metadata.deletion_timestamp.is_some()
}

fn policy_never(pod: &PodInfo) -> bool {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
}

impl DefaultPreemption {
    /// The victims of one node and how many of them break a budget; `None` if evicting
    /// every possible victim would not make the pod fit.
    fn victims_on(
        &self,
        node: &NodeInfo,
        possible: Vec<Arc<PodInfo>>,
        budgets: &[Budget],
        filter: &dyn Fn(&NodeInfo) -> Status,
    ) -> Option<(Vec<Arc<PodInfo>>, usize)> {
        let mut sim = node.clone();
        for v in &possible {
            sim.simulate_eviction(v);
        }
        if !filter(&sim).is_success() {
            return None;
        }
        // Those whose budget allows no more disruption are put back first.
        let mut left: Vec<i32> = budgets.iter().map(|b| b.allowed).collect();
        let mut violating = Vec::new();
        let mut other = Vec::new();
        for v in possible {
            let ns = v.pod.metadata.namespace.as_deref().unwrap_or("");
            let labels = tessera_runtime::informer::labels_of(&v.pod.metadata);
            let mut breaks = false;
            for (i, b) in budgets.iter().enumerate() {
                if b.namespace == ns && b.selector.matches(labels) {
                    left[i] -= 1;
                    breaks |= left[i] < 0;
                }
            }
            if breaks {
                violating.push(v);
            } else {
                other.push(v);
            }
        }
        let important = |a: &Arc<PodInfo>, b: &Arc<PodInfo>| b.priority.cmp(&a.priority);
        violating.sort_by(important);
        other.sort_by(important);
        let mut victims = Vec::new();
        let mut violations = 0;
        for (group, breaks) in [(violating, true), (other, false)] {
            for v in group {
                sim.undo_eviction(&v);
                if !filter(&sim).is_success() {
                    sim.simulate_eviction(&v);
                    victims.push(v);
                    violations += usize::from(breaks);
                }
            }
        }
        Some((victims, violations))
    }
}

impl PostFilterPlugin for DefaultPreemption {
    fn post_filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        input: &PostFilterInput<'_>,
    ) -> (Option<Nomination>, Status) {
        if policy_never(pod) {
            return (
                None,
                Status::unschedulable("preemption: not eligible due to preemptionPolicy=Never."),
            );
        }
        let underway = state.read::<bool>(UNDERWAY).copied().unwrap_or(false);
        let terminating_there = || {
            let Some(Some(node)) = state.read::<Option<String>>(NOMINATED) else {
                return false;
            };
            input.nodes.iter().any(|n| {
                &n.name == node
                    && n.pods
                        .iter()
                        .any(|p| terminating(p) && p.priority < pod.priority)
            })
        };
        if underway || terminating_there() {
            return (
                None,
                Status::unschedulable(
                    "preemption: not eligible due to a terminating pod on the nominated node.",
                ),
            );
        }
        let fair = state.read::<FairView>(FAIR_VIEW);
        let ns = pod.pod.metadata.namespace.as_deref().unwrap_or("");
        let mine = fair.map_or(0, |f| f.tenant(ns));
        let my_share = fair.map_or(0.0, |f| f.share(mine));
        let may_evict = |v: &PodInfo| {
            if v.priority >= pod.priority || terminating(v) {
                return false;
            }
            let theirs = fair.map_or(0, |f| {
                f.tenant(v.pod.metadata.namespace.as_deref().unwrap_or(""))
            });
            theirs == mine || fair.is_some_and(|f| f.share(theirs) > my_share)
        };
        let budgets = self.budgets.list.read().clone();
        let n = input.nodes.len();
        let enough = (n / 10).max(100).min(n);
        let start = self
            .next_start
            .load(std::sync::atomic::Ordering::Relaxed)
            .min(n.saturating_sub(1));
        let mut candidates: Vec<Candidate> = Vec::new();
        let (mut no_victims, mut not_helpful) = (0usize, 0usize);
        let mut looked = 0;
        for k in 0..n {
            looked = k + 1;
            let i = (start + k) % n;
            let node = &input.nodes[i];
            if node.node.is_none() {
                continue;
            }
            if input.codes.get(i) != Some(&Code::Unschedulable) {
                not_helpful += 1;
                continue;
            }
            let possible: Vec<Arc<PodInfo>> =
                node.pods.iter().filter(|v| may_evict(v)).cloned().collect();
            if possible.is_empty() {
                no_victims += 1;
                continue;
            }
            match self.victims_on(node, possible, &budgets, input.filter) {
                Some((victims, violations)) if !victims.is_empty() => {
                    candidates.push(Candidate {
                        node: i,
                        victims,
                        violations,
                    });
                    if candidates.len() >= enough {
                        break;
                    }
                }
                _ => no_victims += 1,
            }
        }
        if n > 0 {
            self.next_start
                .store((start + looked) % n, std::sync::atomic::Ordering::Relaxed);
        }
        let Some(best) = candidates.into_iter().min_by_key(Candidate::rank) else {
            // Sorted as strings, count first, as kube-scheduler writes it.
            let mut parts = Vec::new();
            if no_victims > 0 {
                parts.push(format!(
                    "{no_victims} No preemption victims found for incoming pod"
                ));
            }
            if not_helpful > 0 {
                parts.push(format!(
                    "{not_helpful} Preemption is not helpful for scheduling"
                ));
            }
            parts.sort_unstable();
            let live = input.nodes.iter().filter(|n| n.node.is_some()).count();
            return (
                None,
                Status::unschedulable(format!(
                    "preemption: 0/{live} nodes are available: {}.",
                    parts.join(", ")
                )),
            );
        };
        (
            Some(Nomination {
                node: input.nodes[best.node].name.clone(),
                victims: best.victims,
            }),
            Status::success(),
        )
    }
}

#[cfg(test)]
mod tests;
