//! A shard's capacity summary from its nodes and pods: per schedulable node, allocatable
//! minus what its pods request; then the demand not yet on a node — pending pods, and
//! replicas the federation assigned that the shard has not created yet — taken out best-fit,
//! so the federation does not send more work on the strength of room already promised.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use tessera_placement::{Request, Summary, SummaryBuilder};
use tessera_proto::federation::v1 as pb;
use tessera_scheduler::plugins::affinity::required_node_labels;
use tessera_scheduler::resources::{Resources, pod_spec_requests};

/// `r` as amounts over a summary's `resources` (cpu, memory, pods, then extended ones).
fn vector(r: &Resources, resources: &[String]) -> Vec<u64> {
    resources
        .iter()
        .map(|name| {
            let v = match name.as_str() {
                "cpu" => r.milli_cpu,
                "memory" => r.memory,
                "pods" => r.pods,
                other => r.extended(other),
            };
            v.max(0) as u64
        })
        .collect()
}

/// Whether new pods may go to `n`: Ready, not cordoned, no NoSchedule/NoExecute taint.
pub fn schedulable(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    if spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    }) {
        return false;
    }
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `p` still holds (or will hold) resources.
pub fn active(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Pods running and pending, and the summary of `nodes` and `pods`, with `promised`
/// (request, count) taken out as well, as version `version`.
pub fn build(
    nodes: &[std::sync::Arc<Node>],
    pods: &[std::sync::Arc<Pod>],
    promised: &[(Request, u64)],
    group_keys: &[String],
    version: u64,
) -> (Summary, u64, u64) {
    let mut extended: BTreeSet<String> = BTreeSet::new();
    for n in nodes {
        for k in n
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            if k.contains('/') {
                extended.insert(k.clone());
            }
        }
    }
    let ext: Vec<&str> = extended.iter().map(String::as_str).collect();
    let mut b = SummaryBuilder::new(&ext).group_by(group_keys);
    let resources: Vec<String> = tessera_placement::summary::BASE_RESOURCES
        .iter()
        .map(|s| (*s).to_owned())
        .chain(extended.iter().cloned())
        .collect();
    // Requests per node, and pending demand.
    let mut used: HashMap<&str, Resources> = HashMap::new();
    let mut pending: Vec<Request> = Vec::new();
    let (mut running, mut waiting) = (0u64, 0u64);
    for p in pods {
        if !active(p) || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let spec = p.spec.as_ref();
        let req = pod_spec_requests(spec);
        match spec.and_then(|s| s.node_name.as_deref()) {
            Some(node) => {
                running += 1;
                used.entry(node).or_default().add(&req);
            }
            None => {
                waiting += 1;
                pending.push(Request {
                    amounts: req.amounts(),
                    on: required_node_labels(spec),
                });
            }
        }
    }
    let none = Resources::default();
    for n in nodes {
        if !schedulable(n) {
            continue;
        }
        let alloc = Resources::from_list(n.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        let alloc = vector(&alloc, &resources);
        let u = n
            .metadata
            .name
            .as_deref()
            .and_then(|name| used.get(name))
            .unwrap_or(&none);
        let free: Vec<u64> = alloc
            .iter()
            .zip(vector(u, &resources))
            .map(|(a, x)| a.saturating_sub(x))
            .collect();
        let labels = n.metadata.labels.as_ref();
        let values: Vec<String> = group_keys
            .iter()
            .map(|k| labels.and_then(|l| l.get(k)).cloned().unwrap_or_default())
            .collect();
        b.node_in(&values, &alloc, &free);
    }
    let mut s = b.build(version);
    for r in &pending {
        if let Ok(v) = r.vector_for(&s) {
            s.reserve_on(&v, 1, &r.on);
        }
    }
    for (r, n) in promised {
        if let Ok(v) = r.vector_for(&s) {
            s.reserve_on(&v, *n, &r.on);
        }
    }
    (s, running, waiting)
}

/// `s` as the stream carries it (the counters of pods and assignments left to the caller).
pub fn to_pb(s: &Summary) -> pb::CapacitySummary {
    let slots = |slots: &[tessera_placement::Slot]| {
        slots
            .iter()
            .map(|x| pb::Slot {
                free: x.free.clone(),
                count: x.count,
            })
            .collect()
    };
    pb::CapacitySummary {
        version: s.version,
        resources: s.resources.clone(),
        allocatable: s.allocatable.clone(),
        free: s.free.clone(),
        slots: slots(&s.slots),
        nodes: s.nodes,
        group_keys: s.group_keys.clone(),
        groups: s
            .groups
            .iter()
            .map(|g| pb::NodeGroup {
                values: g.values.clone(),
                allocatable: g.summary.allocatable.clone(),
                free: g.summary.free.clone(),
                slots: slots(&g.summary.slots),
                nodes: g.summary.nodes,
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSpec, ResourceRequirements, Taint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(name: &str, cpu: &str, ready: bool, taint: bool) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: taint.then(|| {
                    vec![Taint {
                        key: "dedicated".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".into(), Quantity(cpu.into())),
                        ("memory".into(), Quantity("8Gi".into())),
                        ("pods".into(), Quantity("10".into())),
                    ]
                    .into(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        })
    }

    fn pod(node: Option<&str>, cpu: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta::default(),
            spec: Some(PodSpec {
                node_name: node.map(str::to_owned),
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some([("cpu".into(), Quantity(cpu.into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        })
    }

    #[test]
    fn free_room_is_what_pods_leave_on_schedulable_nodes_less_what_is_promised() {
        let nodes = vec![
            node("a", "4", true, false),
            node("b", "4", true, false),
            node("down", "4", false, false),
            node("tainted", "4", true, true),
        ];
        let pods = vec![pod(Some("a"), "3"), pod(None, "1")];
        let (s, running, waiting) = build(&nodes, &pods, &[], &[], 1);
        assert_eq!((running, waiting), (1, 1));
        assert_eq!(s.nodes, 2, "only ready, untainted nodes count");
        assert_eq!(s.allocatable[0], 8000);
        // a: 1 cpu left; b: 4, less the pending pod's 1 (best fit takes a's 1 first).
        assert_eq!(s.free[0], 4000);
        let one = Request::cpu_memory(1000, 0).vector_for(&s).expect("known");
        assert_eq!(s.fits(&one), 4);
        let promised = vec![(Request::cpu_memory(2000, 0), 1)];
        let (s, _, _) = build(&nodes, &pods, &promised, &[], 2);
        assert_eq!(s.fits(&one), 2);
        s.validate().expect("valid");
    }
}
