//! What a pod asks for and what a node has, as flat integers computed once per object, so the
//! per-node checks of a scheduling cycle are additions and comparisons.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use tessera_core::Quantity;

/// cpu, memory, ephemeral storage, pod slots and extended resources (`example.com/gpu`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU in millicores.
    pub milli_cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: i64,
    /// Pods (a node's slots; 1 for a pod).
    pub pods: i64,
    /// Extended resources by name, in units (empty for most pods: no allocation).
    pub extended: Vec<(String, i64)>,
}

/// Requests a container without any is counted with when *scoring* (not when fitting), as
/// kube-scheduler does: 100 millicores and 200 MiB.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// See [`DEFAULT_MILLI_CPU_REQUEST`].
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

fn parse(q: &K8sQuantity) -> Option<Quantity> {
    Quantity::from_str(&q.0).ok()
}

impl Resources {
    /// Adds `name = q` from a resource list.
    fn add_named(&mut self, name: &str, q: &K8sQuantity) {
        let Some(v) = parse(q) else { return };
        match name {
            "cpu" => self.milli_cpu += v.milli_ceil(),
            "memory" => self.memory += v.units_ceil(),
            "ephemeral-storage" => self.ephemeral_storage += v.units_ceil(),
            "pods" => self.pods += v.units_ceil(),
            n if n.contains('/') && !n.starts_with("requests.") => {
                let units = v.units_ceil();
                match self.extended.iter_mut().find(|(k, _)| k == n) {
                    Some((_, x)) => *x += units,
                    None => self.extended.push((n.to_owned(), units)),
                }
            }
            _ => {}
        }
    }

    /// The amounts of a resource list (a node's allocatable, a container's requests);
    /// quantities that do not parse count as nothing.
    pub fn from_list(list: Option<&BTreeMap<String, K8sQuantity>>) -> Resources {
        let mut r = Resources::default();
        for (k, q) in list.into_iter().flatten() {
            r.add_named(k, q);
        }
        r
    }

    /// `self += other`.
    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.pods += other.pods;
        for (k, v) in &other.extended {
            match self.extended.iter_mut().find(|(x, _)| x == k) {
                Some((_, x)) => *x += v,
                None => self.extended.push((k.clone(), *v)),
            }
        }
    }

    /// `self -= other`.
    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        self.pods -= other.pods;
        for (k, v) in &other.extended {
            if let Some((_, x)) = self.extended.iter_mut().find(|(x, _)| x == k) {
                *x -= v;
            }
        }
    }

    /// Each field the larger of the two.
    fn max_with(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        for (k, v) in &other.extended {
            match self.extended.iter_mut().find(|(x, _)| x == k) {
                Some((_, x)) => *x = (*x).max(*v),
                None => self.extended.push((k.clone(), *v)),
            }
        }
    }

    /// The amounts in base units by resource name (`cpu` in millicores, `memory` in bytes,
    /// extended resources in units), zeros left out: what the federation's capacity
    /// summaries count (`pods` is one per replica there; ephemeral storage is not counted).
    pub fn amounts(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = [("cpu", self.milli_cpu), ("memory", self.memory)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .chain(self.extended.iter().cloned())
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| (k, v as u64))
            .collect();
        out.sort();
        out
    }

    /// The amount of extended resource `name`.
    pub fn extended(&self, name: &str) -> i64 {
        self.extended
            .iter()
            .find(|(k, _)| k == name)
            .map_or(0, |(_, v)| *v)
    }
}

fn container_requests(c: &Container) -> Resources {
    let r = c.resources.as_ref();
    // Requests default to limits (the API server defaults them too; this keeps objects
    // written before defaulting right).
    let mut req = Resources::from_list(r.and_then(|r| r.requests.as_ref()));
    let lim = Resources::from_list(r.and_then(|r| r.limits.as_ref()));
    if req.milli_cpu == 0 {
        req.milli_cpu = lim.milli_cpu;
    }
    if req.memory == 0 {
        req.memory = lim.memory;
    }
    req
}

/// What one pod of `spec` asks for to fit: the sum of its containers' requests, or the
/// largest init container's if larger, plus the pod's overhead; `pods` is 1. `each` sees
/// every regular container with its requests (the scheduler's scoring and ports).
fn spec_requests(
    spec: Option<&PodSpec>,
    mut each: impl FnMut(&Container, &Resources),
) -> Resources {
    let mut requests = Resources::default();
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        let r = container_requests(c);
        each(c, &r);
        requests.add(&r);
    }
    for c in spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
    {
        requests.max_with(&container_requests(c));
    }
    if let Some(overhead) = spec.and_then(|s| s.overhead.as_ref()) {
        requests.add(&Resources::from_list(Some(overhead)));
    }
    requests.pods = 1;
    requests
}

/// What one pod of `spec` asks for to fit, as the scheduler counts it (see
/// [`PodInfo::requests`]).
pub fn pod_spec_requests(spec: Option<&PodSpec>) -> Resources {
    spec_requests(spec, |_, _| {})
}

/// A host port a pod uses: protocol, host IP (`0.0.0.0` for all), port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The address it binds (`0.0.0.0` for all).
    pub ip: String,
    /// The port.
    pub port: i32,
}

impl HostPort {
    /// True if the two cannot both be bound on one node.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// What the scheduler needs of a pod, computed once when it is queued.
#[derive(Clone, Debug)]
pub struct PodInfo {
    /// The pod.
    pub pod: Arc<Pod>,
    /// `namespace/name`.
    pub key: String,
    /// What it asks for to fit: the sum of its containers' requests, or the largest init
    /// container's if larger, plus the pod's overhead; `pods` is 1.
    pub requests: Resources,
    /// cpu and memory for scoring, with defaults for containers that request none.
    pub non_zero: (i64, i64),
    /// Host ports it binds.
    pub host_ports: Vec<HostPort>,
    /// Its priority (`spec.priority`).
    pub priority: i32,
}

impl PodInfo {
    /// Computes the pod's requests, ports and priority.
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        let key = crate::key_of(&pod.metadata);
        let mut non_zero = (0, 0);
        let mut host_ports = Vec::new();
        let spec = pod.spec.as_ref();
        let requests = spec_requests(spec, |c, r| {
            non_zero.0 += if r.milli_cpu == 0 {
                DEFAULT_MILLI_CPU_REQUEST
            } else {
                r.milli_cpu
            };
            non_zero.1 += if r.memory == 0 {
                DEFAULT_MEMORY_REQUEST
            } else {
                r.memory
            };
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                    host_ports.push(HostPort {
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        ip: p.host_ip.clone().unwrap_or_else(|| "0.0.0.0".into()),
                        port: hp,
                    });
                }
            }
        });
        let priority = spec.and_then(|s| s.priority).unwrap_or(0);
        PodInfo {
            pod,
            key,
            requests,
            non_zero,
            host_ports,
            priority,
        }
    }

    /// The pod's name.
    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or("")
    }

    /// The pod's UID.
    pub fn uid(&self) -> &str {
        self.pod.metadata.uid.as_deref().unwrap_or("")
    }
}

/// A node as the scheduler sees it: its object, what it can hold and what its pods (bound
/// and assumed) take.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
    /// The Node (None while pods name a node the cache has not seen, or after it went away
    /// with pods still on it: such entries are never candidates).
    pub node: Option<Arc<Node>>,
    /// What it can hold (`status.allocatable`, or `capacity`).
    pub allocatable: Resources,
    /// The sum of its pods' requests (`pods` counts them).
    pub requested: Resources,
    /// The sum of its pods' scoring requests (cpu, memory).
    pub non_zero_requested: (i64, i64),
    /// Host ports its pods bind.
    pub used_ports: Vec<HostPort>,
    /// `spec.unschedulable` (cordoned), copied out of the Node so filters read flat data.
    pub unschedulable: bool,
    /// `spec.taints`, copied out of the Node (empty for most nodes: no allocation).
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// Its domain id for each topology key the topology counters use (by key id;
    /// [`crate::topology::NO_DOMAIN`] without the label), so spreading and pod affinity
    /// read a number here instead of looking labels up.
    pub domains: Vec<u32>,
    /// The pods counted here (what preemption chooses victims from).
    pub pods: Vec<Arc<PodInfo>>,
    /// Pods nominated to this node by preemption, waiting for their victims to go: a pod of
    /// lower or equal priority must leave them the room.
    pub nominated: Vec<Arc<PodInfo>>,
    /// Pods a preemption simulation took off this copy of the entry (empty in the cache).
    /// Filters that read counts kept outside the node — spreading and pod affinity — take
    /// these out of the node's domain, as kube-scheduler's `RemovePod` extensions do.
    pub evicted: Vec<Arc<PodInfo>>,
    /// The cache's [`generation`](crate::cache::Cache::generation) when this entry last
    /// changed: a placement decided against an older one is stale (optimistic placement).
    pub generation: u64,
}

impl NodeInfo {
    /// An entry for a node name with nothing known yet.
    pub fn empty(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.to_owned(),
            node: None,
            allocatable: Resources::default(),
            requested: Resources::default(),
            non_zero_requested: (0, 0),
            used_ports: Vec::new(),
            unschedulable: false,
            taints: Vec::new(),
            domains: Vec::new(),
            pods: Vec::new(),
            nominated: Vec::new(),
            evicted: Vec::new(),
            generation: 0,
        }
    }

    /// Sets the Node object (and with it the allocatable resources).
    pub fn set_node(&mut self, node: Arc<Node>) {
        let status = node.status.as_ref();
        let alloc = status
            .and_then(|s| s.allocatable.as_ref())
            .or_else(|| status.and_then(|s| s.capacity.as_ref()));
        self.allocatable = Resources::from_list(alloc);
        let spec = node.spec.as_ref();
        self.unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        self.taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
        self.node = Some(node);
    }

    /// Accounts for a pod on this node.
    pub fn add_pod(&mut self, p: &Arc<PodInfo>) {
        self.pods.push(p.clone());
        self.requested.add(&p.requests);
        self.non_zero_requested.0 += p.non_zero.0;
        self.non_zero_requested.1 += p.non_zero.1;
        self.used_ports.extend(p.host_ports.iter().cloned());
    }

    /// Stops accounting for a pod.
    pub fn remove_pod(&mut self, p: &PodInfo) {
        if let Some(i) = self.pods.iter().position(|x| x.key == p.key) {
            self.pods.swap_remove(i);
        }
        self.requested.sub(&p.requests);
        self.non_zero_requested.0 -= p.non_zero.0;
        self.non_zero_requested.1 -= p.non_zero.1;
        for hp in &p.host_ports {
            if let Some(i) = self.used_ports.iter().position(|x| x == hp) {
                self.used_ports.swap_remove(i);
            }
        }
    }

    /// Simulates evicting a pod (preemption's "what if it were gone"): its room is free
    /// and it is listed in [`evicted`](Self::evicted) for the filters that count pods by
    /// domain.
    pub fn simulate_eviction(&mut self, p: &Arc<PodInfo>) {
        self.remove_pod(p);
        self.evicted.push(p.clone());
    }

    /// Undoes [`simulate_eviction`](Self::simulate_eviction): the pod is back.
    pub fn undo_eviction(&mut self, p: &Arc<PodInfo>) {
        if let Some(i) = self.evicted.iter().position(|x| x.key == p.key) {
            self.evicted.swap_remove(i);
        }
        self.add_pod(p);
    }

    /// What the pods nominated here that `pod` must leave room for request: those of at
    /// least its priority, other than itself (`None` when there are none: the common case
    /// costs nothing).
    pub fn nominated_for(&self, pod: &PodInfo) -> Option<Resources> {
        let mut out: Option<Resources> = None;
        for n in &self.nominated {
            if n.priority >= pod.priority && n.key != pod.key {
                out.get_or_insert_with(Resources::default).add(&n.requests);
            }
        }
        out
    }

    /// The node's labels.
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.node.as_ref()?.metadata.labels.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> PodInfo {
        PodInfo::new(Arc::new(serde_json::from_value(v).expect("pod")))
    }

    #[test]
    fn a_pod_spec_requests_its_containers_sum_or_its_largest_init_container() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"}}},
                {"name": "c", "resources": {}},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2", "memory": "bad"}}}],
        }))
        .expect("spec");
        assert_eq!(
            pod_spec_requests(Some(&spec)).amounts(),
            vec![
                ("cpu".into(), 2000),
                ("memory".into(), 1 << 30),
                ("nvidia.com/gpu".into(), 2)
            ]
        );
        assert!(pod_spec_requests(None).amounts().is_empty());
    }

    #[test]
    fn requests_sum_containers_and_take_the_largest_init_container() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "containers": [
                    {"name": "a", "image": "x", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
                     "ports": [{"containerPort": 80, "hostPort": 8080}]},
                    {"name": "b", "image": "x", "resources": {"limits": {"cpu": "1", "example.com/gpu": "2"}}},
                    {"name": "c", "image": "x"}
                ],
                "initContainers": [{"name": "i", "image": "x", "resources": {"requests": {"cpu": "3"}}}],
                "overhead": {"cpu": "10m"}
            }
        }));
        assert_eq!(p.key, "ns/p");
        assert_eq!(
            p.requests.milli_cpu, 3_010,
            "init container is larger, plus overhead"
        );
        assert_eq!(p.requests.memory, 1 << 30);
        assert_eq!(p.requests.pods, 1);
        assert_eq!(
            p.requests.extended("example.com/gpu"),
            0,
            "limits of extended resources are not requests here"
        );
        assert_eq!(
            p.non_zero,
            (250 + 1_000 + 100, (1 << 30) + 2 * DEFAULT_MEMORY_REQUEST)
        );
        assert_eq!(p.host_ports.len(), 1);
        assert_eq!(p.host_ports[0].port, 8080);
    }

    #[test]
    fn node_accounting_adds_and_removes_exactly() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
        }))
        .expect("node");
        let mut n = NodeInfo::empty("n");
        n.set_node(Arc::new(node));
        assert_eq!(n.allocatable.milli_cpu, 4_000);
        assert_eq!(n.allocatable.pods, 110);
        let p = pod(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "a", "image": "x",
                "resources": {"requests": {"cpu": "1"}}, "ports": [{"containerPort": 1, "hostPort": 9}]}]}}));
        let p = Arc::new(p);
        n.add_pod(&p);
        n.add_pod(&p);
        assert_eq!(n.requested.milli_cpu, 2_000);
        assert_eq!(n.requested.pods, 2);
        n.remove_pod(&p);
        n.remove_pod(&p);
        assert_eq!(n.requested, Resources::default());
        assert!(n.used_ports.is_empty());
    }
}
