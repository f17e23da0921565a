//! Small filters: NodeName (`spec.nodeName` asked for), NodeUnschedulable (cordoned nodes),
//! NodePorts (host ports free), and the PrioritySort queue order.

use std::sync::Arc;

use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, PreFilterPlugin, QueueSortPlugin, QueuedPod,
    Status,
};
use crate::plugins::taints::tolerates;
use crate::resources::{NodeInfo, PodInfo};

/// PrioritySort: higher `spec.priority` first; within a priority, pods not tried yet before
/// retries (a new pod is not held up behind pods that already failed and were woken by an
/// event or a backoff); then the pod queued earliest — a gang's members all at the place of
/// its first member queued ([`QueuedPod::order`]), in the order they were queued.
pub struct PrioritySort;

impl Plugin for PrioritySort {
    fn name(&self) -> &'static str {
        "PrioritySort"
    }
    fn queue_sort(&self) -> Option<&dyn QueueSortPlugin> {
        Some(self)
    }
}

impl QueueSortPlugin for PrioritySort {
    fn less(&self, a: &QueuedPod, b: &QueuedPod) -> bool {
        let fresh = |p: &QueuedPod| p.attempts == 0;
        let key = |p: &QueuedPod| {
            (
                p.info.priority,
                fresh(p),
                std::cmp::Reverse(p.order),
                std::cmp::Reverse(p.enqueued),
            )
        };
        key(a) > key(b)
    }
}

/// NodeName: a pod that names a node (`spec.nodeName` in its template, or set by a user
/// before scheduling) goes only there.
pub struct NodeName;

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }
    fn filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl FilterPlugin for NodeName {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        match pod.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(want) if !want.is_empty() && want != node.name => {
                Status::unresolvable("node(s) didn't match the requested node name").by("NodeName")
            }
            _ => Status::success(),
        }
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd]
    }
}

/// NodeUnschedulable: cordoned nodes (`spec.unschedulable`) take only pods that tolerate
/// `node.kubernetes.io/unschedulable:NoSchedule`.
pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }
    fn filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl FilterPlugin for NodeUnschedulable {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if !node.unschedulable {
            return Status::success();
        }
        let taint = k8s_openapi::api::core::v1::Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tolerations = pod.pod.spec.as_ref().and_then(|s| s.tolerations.as_deref());
        if tolerates(tolerations.unwrap_or_default(), &taint) {
            Status::success()
        } else {
            Status::unresolvable("node(s) were unschedulable").by("NodeUnschedulable")
        }
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::NodeUnschedulable]
    }
}

/// NodePorts: a node whose pods already bind a pod's host port cannot take it.
pub struct NodePorts;

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }
    fn pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl PreFilterPlugin for NodePorts {
    fn pre_filter(&self, _: &mut CycleState, pod: &PodInfo) -> Status {
        if pod.host_ports.is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }
}

impl FilterPlugin for NodePorts {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let clash = pod
            .host_ports
            .iter()
            .any(|p| node.used_ports.iter().any(|u| u.conflicts(p)));
        if clash {
            Status::unschedulable("node(s) didn't have free ports for the requested pod ports")
                .by("NodePorts")
        } else {
            Status::success()
        }
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::AssignedPodDelete]
    }
}

/// The plugins of this module, by name.
pub fn build(name: &str) -> Option<Arc<dyn Plugin>> {
    Some(match name {
        "PrioritySort" => Arc::new(PrioritySort),
        "NodeName" => Arc::new(NodeName),
        "NodeUnschedulable" => Arc::new(NodeUnschedulable),
        "NodePorts" => Arc::new(NodePorts),
        _ => return None,
    })
}
