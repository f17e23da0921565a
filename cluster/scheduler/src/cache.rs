//! The scheduler's view of the cluster: nodes in one flat vector (the filter loop walks it
//! without chasing pointers), what each node's pods take, and the pods the scheduler has
//! *assumed* onto a node (reserved, binding in flight) before the API confirms them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use parking_lot::RwLock;

use crate::framework::ClusterEvent;
use crate::memo::FilterMemo;
use crate::queue::Usage;
use crate::resources::{NodeInfo, PodInfo};
use crate::topology::{Labels, Topology};

struct CachedPod {
    node: String,
    info: Arc<PodInfo>,
    assumed: bool,
}

/// Nodes and the pods on them.
#[derive(Default)]
pub struct Cache {
    nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    pods: HashMap<String, CachedPod>,
    /// The keys of `pods` by namespace: a new topology counter counts only the pods of the
    /// namespaces its selector can match.
    pods_by_ns: HashMap<String, HashSet<String>>,
    /// The keys of `pods` by namespace and label (`ns/key=value`): a new counter whose
    /// selector requires one of some values of a label walks only the pods carrying them,
    /// not its whole namespace (one new ReplicaSet in a namespace of 100,000 pods).
    pods_by_label: HashMap<String, HashSet<String>>,
    /// Pending pods nominated to a node by preemption, by key: the node's name and the
    /// victims (keys) evicted for it.
    nominations: HashMap<String, (String, Vec<String>)>,
    live_nodes: usize,
    /// The allocatable of every node with a Node (cpu, memory, pods).
    capacity: Usage,
    /// Pods that started (1) or stopped (-1) counting on a node since the last
    /// [`take_charges`](Cache::take_charges): what their tenants use.
    charges: Vec<(Arc<PodInfo>, i64)>,
    /// Pods counted by selector and topology domain, kept as pods and nodes change here.
    topology: Arc<RwLock<Topology>>,
    /// Topology keys the nodes' `domains` cover.
    domain_keys: usize,
    /// Counts changes to nodes and the pods counted on them; each node entry records the
    /// value of its last change.
    generation: u64,
    /// Local filters' results by class of alike pods, per node entry and generation.
    memo: FilterMemo,
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache keeping `topology` up to date (the one the plugins read).
    pub fn with_topology(topology: Arc<RwLock<Topology>>) -> Self {
        Cache {
            topology,
            ..Self::default()
        }
    }

    /// The topology counters.
    pub fn topology(&self) -> &Arc<RwLock<Topology>> {
        &self.topology
    }

    /// Makes sure the topology counters `needs` exist (each created by one scan of the
    /// counted pods the first time), before a pod's cycle reads them.
    pub fn ensure_counters(&mut self, needs: &[(crate::topology::Match, String)]) {
        if needs.is_empty() {
            return;
        }
        let mut topo = self.topology.write();
        for (what, key) in needs {
            // A pod matches only if every clause does (and no pod matches no clause), so
            // only the first clause's namespaces can hold pods to count — and of those, only
            // the pods carrying a value its selector requires, when it requires one.
            let first = what.0.first();
            let sets = match first.and_then(|c| self.label_postings(c)) {
                Some(sets) => sets,
                None => first
                    .into_iter()
                    .flat_map(|c| &c.namespaces)
                    .filter_map(|ns| self.pods_by_ns.get(ns))
                    .collect(),
            };
            let pods = sets
                .into_iter()
                .flatten()
                .filter_map(|k| self.pods.get(k))
                .map(|p| (&*p.info.pod, p.node.as_str()));
            topo.ensure_counter(what, key, pods);
        }
        drop(topo);
        self.sync_domains();
    }

    /// The pods that can match `clause`, as sets of keys without a key in two of them: for
    /// the requirement of its selector that names the values a pod must carry (`=`, `in`)
    /// and has the fewest pods carrying them, those pods of its namespaces. `None` if its
    /// selector requires no value (`!=`, `notin`, `exists` only): then its namespaces' pods.
    fn label_postings(&self, clause: &crate::topology::Clause) -> Option<Vec<&HashSet<String>>> {
        use tessera_core::selector::label::Operator;
        let selector = clause.selector.as_ref()?;
        selector
            .requirements()
            .iter()
            .filter(|r| matches!(r.operator, Operator::Equals | Operator::In))
            .map(|r| {
                // A pod has one value per key: the sets of two values (or namespaces) are
                // disjoint.
                clause
                    .namespaces
                    .iter()
                    .flat_map(|ns| r.values.iter().map(move |v| label_key(ns, &r.key, v)))
                    .filter_map(|k| self.pods_by_label.get(&k))
                    .collect::<Vec<_>>()
            })
            .min_by_key(|sets| sets.iter().map(|s| s.len()).sum::<usize>())
    }

    /// Copies every node's domain ids again once the topology has registered new keys.
    fn sync_domains(&mut self) {
        let topo = self.topology.read();
        if topo.key_count() == self.domain_keys {
            return;
        }
        self.domain_keys = topo.key_count();
        for n in &mut self.nodes {
            n.domains.clear();
            n.domains.extend_from_slice(topo.node_domain_ids(&n.name));
        }
    }

    /// Namespace labels or owners changed: counters and groups are rebuilt.
    pub fn set_namespaces(
        &mut self,
        namespaces: HashMap<String, Labels>,
        owners: HashMap<String, String>,
    ) {
        let pods = self
            .pods
            .iter()
            .map(|(k, p)| (k.as_str(), &*p.info.pod, p.node.as_str()));
        self.topology
            .write()
            .set_namespaces(namespaces, owners, pods);
        self.sync_domains();
    }

    /// The pod counted under `key`, if any.
    pub fn pod(&self, key: &str) -> Option<&Arc<PodInfo>> {
        self.pods.get(key).map(|p| &p.info)
    }

    /// Every node entry (including placeholders without a Node: skip those).
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// The entry of node `name`.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|i| &self.nodes[*i])
    }

    /// Changes so far to nodes and the pods counted on them (a snapshot's version: a
    /// decision made at generation `g` is stale where an entry's generation is above `g`).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The filter results remembered for classes of alike pods (valid for this cache's
    /// generations only, so it lives here).
    pub fn memo(&self) -> &FilterMemo {
        &self.memo
    }

    /// The memo, to prepare classes for a round of decisions.
    pub fn memo_mut(&mut self) -> &mut FilterMemo {
        &mut self.memo
    }

    /// Marks entry `i` changed.
    fn touch(&mut self, i: usize) {
        self.generation += 1;
        self.nodes[i].generation = self.generation;
    }

    /// Nodes with a Node object.
    pub fn node_count(&self) -> usize {
        self.live_nodes
    }

    /// Pods counted on nodes (bound and assumed).
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// The allocatable of all nodes (cpu, memory, pods).
    pub fn capacity(&self) -> Usage {
        self.capacity
    }

    /// The pods that started (1) or stopped (-1) counting since the last call.
    pub fn take_charges(&mut self) -> Vec<(Arc<PodInfo>, i64)> {
        std::mem::take(&mut self.charges)
    }

    fn count_pod(&mut self, i: usize, pod: &Arc<PodInfo>) {
        self.touch(i);
        self.nodes[i].add_pod(pod);
        self.topology
            .write()
            .add_pod(&pod.key, &pod.pod, &self.nodes[i].name);
        if pod.pod.spec.as_ref().is_some_and(|s| s.affinity.is_some()) {
            // Its terms may have registered a key.
            self.sync_domains();
        }
        self.charges.push((pod.clone(), 1));
    }

    /// Pods assumed and not yet confirmed by the API.
    pub fn assumed_count(&self) -> usize {
        self.pods.values().filter(|p| p.assumed).count()
    }

    /// True if `key` is assumed (binding in flight or not yet seen bound).
    pub fn is_assumed(&self, key: &str) -> bool {
        self.pods.get(key).is_some_and(|p| p.assumed)
    }

    /// True if the cache counts `key` on some node.
    pub fn has_pod(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    fn slot(&mut self, name: &str) -> usize {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        self.nodes.push(NodeInfo::empty(name));
        let i = self.nodes.len() - 1;
        self.index.insert(name.to_owned(), i);
        self.touch(i);
        i
    }

    /// Adds or updates a Node; returns the cluster events the change amounts to.
    pub fn upsert_node(&mut self, node: Arc<Node>) -> Vec<ClusterEvent> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let i = self.slot(&name);
        self.touch(i);
        let entry = &mut self.nodes[i];
        let mut events = Vec::new();
        let before = Usage::of(&entry.allocatable);
        match entry.node.take() {
            None => {
                self.live_nodes += 1;
                events.push(ClusterEvent::NodeAdd);
            }
            Some(old) => {
                let spec = |n: &Node| n.spec.clone().unwrap_or_default();
                let (a, b) = (spec(&old), spec(&node));
                if a.taints != b.taints {
                    events.push(ClusterEvent::NodeTaint);
                }
                if a.unschedulable != b.unschedulable {
                    events.push(ClusterEvent::NodeUnschedulable);
                }
                if old.metadata.labels != node.metadata.labels {
                    events.push(ClusterEvent::NodeLabel);
                }
                let alloc = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
                if alloc(&old) != alloc(&node) {
                    events.push(ClusterEvent::NodeAllocatable);
                }
            }
        }
        entry.set_node(node.clone());
        {
            let mut topo = self.topology.write();
            topo.set_node(&name, Some(node));
            entry.domains.clear();
            entry.domains.extend_from_slice(topo.node_domain_ids(&name));
        }
        if !events.contains(&ClusterEvent::NodeAdd) {
            self.capacity.add(before, -1);
        }
        self.capacity.add(Usage::of(&entry.allocatable), 1);
        events
    }

    /// Removes a Node (its entry stays, without the Node, while pods still count on it).
    pub fn remove_node(&mut self, name: &str) {
        let Some(&i) = self.index.get(name) else {
            return;
        };
        self.touch(i);
        if self.nodes[i].node.take().is_some() {
            self.topology.write().set_node(name, None);
            self.nodes[i].domains.clear();
            self.live_nodes -= 1;
            self.capacity.add(Usage::of(&self.nodes[i].allocatable), -1);
        }
        self.drop_if_unused(i);
    }

    fn drop_if_unused(&mut self, i: usize) {
        let e = &self.nodes[i];
        if e.node.is_some() || e.requested.pods > 0 || !e.nominated.is_empty() {
            return;
        }
        let name = e.name.clone();
        self.index.remove(&name);
        self.nodes.swap_remove(i);
        if i < self.nodes.len() {
            let moved = self.nodes[i].name.clone();
            self.index.insert(moved, i);
        }
    }

    /// Counts `pod` on `node` before the API confirms it.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.clear_nomination(&pod.key);
        self.remove_pod(&pod.key);
        let i = self.slot(node);
        self.count_pod(i, &pod);
        self.put_pod(CachedPod {
            node: node.to_owned(),
            info: pod,
            assumed: true,
        });
    }

    /// Nominates a pending pod to `node` (preemption chose it): until the pod is placed or
    /// gone, pods of lower or equal priority leave it the room there.
    pub fn nominate(&mut self, pod: Arc<PodInfo>, node: &str, victims: Vec<String>) {
        self.clear_nomination(&pod.key);
        let i = self.slot(node);
        self.touch(i);
        self.nominations
            .insert(pod.key.clone(), (node.to_owned(), victims));
        self.nodes[i].nominated.push(pod);
    }

    /// Ends a pod's nomination (placed, bound, deleted, or nominated elsewhere).
    pub fn clear_nomination(&mut self, key: &str) {
        let Some((node, _)) = self.nominations.remove(key) else {
            return;
        };
        if let Some(&i) = self.index.get(&node) {
            self.touch(i);
            let n = &mut self.nodes[i].nominated;
            if let Some(j) = n.iter().position(|p| p.key == key) {
                n.swap_remove(j);
            }
            self.drop_if_unused(i);
        }
    }

    /// The node a pending pod is nominated to.
    pub fn nominated_node(&self, key: &str) -> Option<&NodeInfo> {
        let i = self.index.get(&self.nominations.get(key)?.0)?;
        Some(&self.nodes[*i])
    }

    /// True while a victim evicted for a nomination to `key`'s nominated node — its own or
    /// another pod's — is still counted there: preemption on that node is under way (the
    /// eviction may not even be seen yet), so `key` must wait, not preempt again. (The
    /// other nominations hold their room there already, so while their victims are still
    /// present the node looks fuller than it will be; a pod that preempted again elsewhere
    /// would leave its own victim's room unused. This is kube-scheduler's rule of not
    /// preempting while lower-priority pods terminate on the nominated node.)
    pub fn preemption_underway(&self, key: &str) -> bool {
        let Some(node) = self.nominated_node(key) else {
            return false;
        };
        node.nominated.iter().any(|p| {
            self.nominations
                .get(&p.key)
                .is_some_and(|(_, victims)| victims.iter().any(|v| self.pods.contains_key(v)))
        })
    }

    /// Undoes an assumption (binding failed). A pod the API already confirmed stays.
    pub fn forget(&mut self, key: &str) {
        if self.is_assumed(key) {
            self.remove_pod(key);
        }
    }

    /// Confirms a pod the cache already counts on `node` (without recomputing it); false if
    /// it is not counted there.
    pub fn confirm_existing(&mut self, key: &str, node: &str) -> bool {
        match self.pods.get_mut(key) {
            Some(p) if p.node == node => {
                p.assumed = false;
                true
            }
            _ => false,
        }
    }

    /// A pod the API shows on `node` (and not finished): counted there, confirmed.
    pub fn confirm_pod(&mut self, pod: Arc<PodInfo>, node: &str) {
        if let Some(p) = self.pods.get_mut(&pod.key)
            && p.node == node
        {
            p.assumed = false;
            return;
        }
        self.remove_pod(&pod.key);
        let i = self.slot(node);
        self.count_pod(i, &pod);
        self.put_pod(CachedPod {
            node: node.to_owned(),
            info: pod,
            assumed: false,
        });
    }

    /// Keeps `p` under its key, indexed by namespace.
    fn put_pod(&mut self, p: CachedPod) {
        let key = p.info.key.clone();
        let ns = namespace_of_key(&key);
        for (k, v) in p.info.pod.metadata.labels.iter().flatten() {
            self.pods_by_label
                .entry(label_key(ns, k, v))
                .or_default()
                .insert(key.clone());
        }
        self.pods_by_ns
            .entry(ns.to_owned())
            .or_default()
            .insert(key.clone());
        self.pods.insert(key, p);
    }

    /// Stops counting a pod (deleted or finished); true if it was counted.
    pub fn remove_pod(&mut self, key: &str) -> bool {
        let Some(p) = self.pods.remove(key) else {
            return false;
        };
        let ns = namespace_of_key(key);
        if let Some(keys) = self.pods_by_ns.get_mut(ns) {
            keys.remove(key);
            if keys.is_empty() {
                self.pods_by_ns.remove(ns);
            }
        }
        for (k, v) in p.info.pod.metadata.labels.iter().flatten() {
            let posting = label_key(ns, k, v);
            if let Some(keys) = self.pods_by_label.get_mut(&posting) {
                keys.remove(key);
                if keys.is_empty() {
                    self.pods_by_label.remove(&posting);
                }
            }
        }
        self.topology.write().remove_pod(key, &p.info.pod, &p.node);
        if let Some(&i) = self.index.get(&p.node) {
            self.touch(i);
            self.nodes[i].remove_pod(&p.info);
            self.drop_if_unused(i);
        }
        self.charges.push((p.info, -1));
        true
    }
}

/// The namespace part of a pod key (`namespace/name`).
fn namespace_of_key(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

/// The posting of label `key`=`value` in namespace `ns`: one string, unambiguous because a
/// namespace has no `/` and a label key no `=`.
fn label_key(ns: &str, key: &str, value: &str) -> String {
    let mut s = String::with_capacity(ns.len() + key.len() + value.len() + 2);
    s.push_str(ns);
    s.push('/');
    s.push_str(key);
    s.push('=');
    s.push_str(value);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn node(name: &str, cpu: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "status": {"allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "10"}}}))
            .expect("node"),
        )
    }

    fn pod(name: &str, milli: u32) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
                "spec": {"containers": [{"name": "c", "image": "x",
                    "resources": {"requests": {"cpu": format!("{milli}m")}}}]}}))
            .expect("pod"),
        )))
    }

    #[test]
    fn node_changes_become_cluster_events() {
        let mut c = Cache::new();
        assert_eq!(c.upsert_node(node("a", "1")), vec![ClusterEvent::NodeAdd]);
        assert_eq!(
            c.upsert_node(node("a", "2")),
            vec![ClusterEvent::NodeAllocatable]
        );
        assert_eq!(c.upsert_node(node("a", "2")), vec![]);
        assert_eq!(c.node_count(), 1);
        c.remove_node("a");
        assert_eq!(c.node_count(), 0);
        assert!(c.node("a").is_none());
    }

    proptest! {
        /// A counter made after any placements and removals counts exactly the placed pods
        /// its clauses match, though it walks only its namespaces' pods carrying a value its
        /// selector requires (or all its namespaces' pods when it requires none).
        #[test]
        fn new_counters_count_the_pods_of_their_namespaces(
            ops in proptest::collection::vec((0u8..3, 0u8..8, 0u8..4, any::<bool>()), 1..60),
            wanted in proptest::collection::btree_set(0u8..4, 0..4),
            selector in proptest::sample::select(vec![
                "app=x", "app in (x,y)", "app=x,tier=web", "app!=x", "app", "tier in (web),app=y",
                "app notin (y)",
            ]),
        ) {
            // Labels: 0 app=x, 1 app=y, 2 app=x and tier=web, 3 none. A pod placed again
            // may carry other labels than before.
            let labels = |l: u8| match l {
                0 => json!({"app": "x"}),
                1 => json!({"app": "y"}),
                2 => json!({"app": "x", "tier": "web"}),
                _ => json!({}),
            };
            let in_ns = |ns: u8, p: u8, l: u8| {
                Arc::new(PodInfo::new(Arc::new(
                    serde_json::from_value(json!({"metadata": {"name": format!("p{p}"),
                        "namespace": format!("ns{ns}"), "labels": labels(l)},
                        "spec": {"containers": [{"name": "c", "image": "x"}]}}))
                    .expect("pod"),
                )))
            };
            let mut c = Cache::new();
            c.upsert_node(node("n0", "4"));
            let mut model = std::collections::BTreeMap::new();
            for (ns, p, l, place) in ops {
                if place {
                    c.assume(in_ns(ns, p, l), "n0");
                    model.insert((ns, p), l);
                } else {
                    c.remove_pod(&format!("ns{ns}/p{p}"));
                    model.remove(&(ns, p));
                }
            }
            let selector: tessera_core::selector::label::LabelSelector =
                selector.parse().expect("selector");
            let what = crate::topology::Match(vec![crate::topology::Clause {
                namespaces: wanted.iter().map(|n| format!("ns{n}")).collect(),
                selector: Some(selector.clone()),
            }]);
            c.ensure_counters(&[(what.clone(), "kubernetes.io/hostname".to_owned())]);
            let topo = c.topology().read();
            let id = topo.counter(&what).expect("made");
            // What a scan of every placed pod counts.
            let want = model
                .iter()
                .filter(|((ns, _), l)| {
                    let labels: std::collections::BTreeMap<String, String> =
                        serde_json::from_value(labels(**l)).expect("labels");
                    wanted.contains(ns) && selector.matches(&labels)
                })
                .count();
            prop_assert_eq!(topo.total(id), want as i64);
        }
    }

    /// A preemption is under way for every pod nominated to a node until the victims
    /// evicted there for any of them are gone; not for a pod nominated elsewhere.
    #[test]
    fn preemption_is_under_way_until_every_victim_on_the_node_is_gone() {
        let mut c = Cache::new();
        for n in ["n0", "n1"] {
            c.upsert_node(node(n, "4"));
        }
        for v in ["va", "vb", "vc"] {
            c.confirm_pod(pod(v, 1000), if v == "vc" { "n1" } else { "n0" });
        }
        c.nominate(pod("a", 1000), "n0", vec!["ns/va".into()]);
        c.nominate(pod("b", 1000), "n0", vec!["ns/vb".into()]);
        c.nominate(pod("c", 1000), "n1", vec!["ns/vc".into()]);
        assert!(c.preemption_underway("ns/a") && c.preemption_underway("ns/b"));
        c.remove_pod("ns/va");
        assert!(
            c.preemption_underway("ns/a"),
            "b's victim still holds room on a's node"
        );
        assert!(c.preemption_underway("ns/c"));
        c.remove_pod("ns/vb");
        assert!(!c.preemption_underway("ns/a") && !c.preemption_underway("ns/b"));
        assert!(c.preemption_underway("ns/c"), "n1 is another node");
        c.remove_pod("ns/vc");
        assert!(!c.preemption_underway("ns/c"));
        assert!(!c.preemption_underway("ns/none"), "not nominated");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Node(u8, bool),
        Assume(u8, u8, u16),
        Confirm(u8, u8, u16),
        Forget(u8),
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, any::<bool>()).prop_map(|(n, up)| Op::Node(n, up)),
            (0u8..12, 0u8..4, 1u16..900).prop_map(|(p, n, m)| Op::Assume(p, n, m)),
            (0u8..12, 0u8..4, 1u16..900).prop_map(|(p, n, m)| Op::Confirm(p, n, m)),
            (0u8..12).prop_map(Op::Forget),
            (0u8..12).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Whatever happens, each node's requested resources are exactly the sum of the pods
        /// the cache counts on it, and no entry without a Node lingers once it is empty.
        #[test]
        fn requested_is_always_the_sum_of_counted_pods(ops in proptest::collection::vec(op(), 1..80)) {
            let mut c = Cache::new();
            let mut model: HashMap<String, (String, i64)> = HashMap::new();
            for op in ops {
                match op {
                    Op::Node(n, true) => { c.upsert_node(node(&format!("n{n}"), "4")); }
                    Op::Node(n, false) => c.remove_node(&format!("n{n}")),
                    Op::Assume(p, n, m) => {
                        c.assume(pod(&format!("p{p}"), m.into()), &format!("n{n}"));
                        model.insert(format!("ns/p{p}"), (format!("n{n}"), i64::from(m)));
                    }
                    Op::Confirm(p, n, m) => {
                        let key = format!("ns/p{p}");
                        let node = format!("n{n}");
                        // A confirmed pod on the node it was assumed on keeps its accounting.
                        let m = match model.get(&key) {
                            Some((on, had)) if *on == node => *had,
                            _ => i64::from(m),
                        };
                        c.confirm_pod(pod(&format!("p{p}"), m as u32), &node);
                        model.insert(key, (node, m));
                    }
                    Op::Forget(p) => {
                        let key = format!("ns/p{p}");
                        if c.is_assumed(&key) { model.remove(&key); }
                        c.forget(&key);
                    }
                    Op::Remove(p) => {
                        let key = format!("ns/p{p}");
                        prop_assert_eq!(c.remove_pod(&key), model.remove(&key).is_some());
                    }
                }
                for n in c.nodes() {
                    let want: i64 = model.values().filter(|(on, _)| *on == n.name).map(|(_, m)| *m).sum();
                    let count = model.values().filter(|(on, _)| *on == n.name).count() as i64;
                    prop_assert_eq!(n.requested.milli_cpu, want, "node {}", n.name);
                    prop_assert_eq!(n.requested.pods, count);
                    prop_assert!(n.node.is_some() || count > 0, "empty placeholder {} kept", n.name);
                }
                prop_assert_eq!(c.pod_count(), model.len());
            }
        }
    }
}
