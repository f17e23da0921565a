//! A shard's capacity summary from its nodes and pods: per schedulable node, allocatable
//! minus what its pods request; then the demand not yet on a node — pending pods, and
//! replicas the federation assigned that the shard has not created yet — taken out best-fit,
//! so the federation does not send more work on the strength of room already promised.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use tessera_client::types::{
    BORROWED_TAINT_KEY, LENT_FROM_LABEL, LENT_TO_ANNOTATION, LOAN_LABEL, PROCESS_TAINT_KEY,
    PROCESS_TAINT_VALUE,
};
use tessera_placement::summary::on_process_nodes;
use tessera_placement::{Request, Summary, SummaryBuilder};
use tessera_proto::federation::v1 as pb;
use tessera_scheduler::plugins::affinity::required_node_labels;
use tessera_scheduler::resources::{Resources, pod_spec_requests};

/// The amount of `name` (one of a summary's resources: cpu, memory, pods, then extended
/// ones) in `r`.
fn amount(r: &Resources, name: &str) -> u64 {
    let v = match name {
        "cpu" => r.milli_cpu,
        "memory" => r.memory,
        "pods" => r.pods,
        other => r.extended(other),
    };
    v.max(0) as u64
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

/// Whether new pods that tolerate the process taint may go to `n`: Ready, not cordoned, and
/// its only NoSchedule/NoExecute taint is `tessera.io/runtime=process:NoSchedule`.
pub fn process_pool(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    let mut process = false;
    for t in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        if t.key == PROCESS_TAINT_KEY && t.value.as_deref() == Some(PROCESS_TAINT_VALUE) {
            process = true;
        } else if t.effect == "NoSchedule" || t.effect == "NoExecute" {
            return false;
        }
    }
    process
        && n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `n` is another shard's node lent here: Ready, not cordoned, and its only
/// NoSchedule/NoExecute taints the borrowed one (and the process one, for a process node).
pub fn borrowed_pool(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    let mut borrowed = false;
    for t in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        if t.key == BORROWED_TAINT_KEY && t.effect == "NoSchedule" {
            borrowed = true;
        } else if t.key != PROCESS_TAINT_KEY
            && (t.effect == "NoSchedule" || t.effect == "NoExecute")
        {
            return false;
        }
    }
    borrowed
        && n.status
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

/// A node as the summary counts it: its allocatable parsed once, and whether new pods may go
/// there.
struct NodeRow {
    node: Arc<Node>,
    allocatable: Resources,
    schedulable: bool,
    /// In the process pool (see [`process_pool`]).
    process: bool,
    /// This shard's node lent out: (borrower, loan).
    lent: Option<(String, String)>,
    /// Another shard's node borrowed here: its loan.
    borrowed: Option<String>,
}

/// The lending side of a summary: what [`Ledger::summary_with_lending`] finds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LendingView {
    /// Pending pods no node has room for that may run on a borrowed node, and their
    /// requests in all (the summary's resources, in order).
    pub unmet_pods: u64,
    /// Their requests in all.
    pub unmet: Vec<u64>,
    /// Of those, the ones that must run on a process node (not counted above), and their
    /// requests.
    pub unmet_process_pods: u64,
    /// Their requests in all.
    pub unmet_process: Vec<u64>,
    /// Pending pods no node has room for, whatever they tolerate.
    pub own_unmet_pods: u64,
    /// Nodes with no active pod that may be lent: (name, allocatable, process), at most
    /// [`MAX_IDLE_REPORTED`].
    pub idle: Vec<(String, Vec<u64>, bool)>,
    /// Nodes new pods may go to (its own and borrowed ones), process nodes included.
    pub schedulable_nodes: u64,
    /// This shard's nodes lent out: (node, borrower, loan).
    pub lent: Vec<(String, String, String)>,
    /// Nodes registered here for a loan: (node, loan, idle).
    pub borrowed: Vec<(String, String, bool)>,
    /// Cpu (millicores) of this shard's own nodes as the summary counts them with no loan at
    /// all: borrowed ones out, lent ones in.
    pub own_cpu_milli: u64,
}

/// Most idle nodes a summary names (the federation lends a few at a time).
pub const MAX_IDLE_REPORTED: usize = 64;

/// Whether pod `spec` tolerates the taint borrowed nodes carry (any lender's).
pub fn tolerates_borrowed(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> bool {
    spec.and_then(|s| s.tolerations.as_ref()).is_some_and(|ts| {
        ts.iter().any(|t| {
            (t.key.as_deref() == Some(BORROWED_TAINT_KEY)
                || (t.key.is_none() && t.operator.as_deref() == Some("Exists")))
                && t.effect.as_deref().is_none_or(|e| e == "NoSchedule")
        })
    })
}

/// Where an active pod's request is counted.
enum Counted {
    /// On its node (by name); whether a DaemonSet runs it (such pods do not keep a node
    /// from counting as idle).
    On(String, Resources, bool),
    /// Not on a node yet: demand the summary takes out best-fit (and whether it may go to a
    /// borrowed node).
    Pending(Request, bool),
}

/// A shard's nodes and pods as its capacity summary counts them, kept up to date one change
/// at a time from the informers. A summary is then a pass over per-node numbers — no
/// quantity parsed, no pod visited — however many pods the shard holds and however often
/// it changes; before, every summary (up to four a second per busy shard) parsed every
/// node's allocatable and walked every pod.
#[derive(Default)]
pub struct Ledger {
    nodes: HashMap<String, NodeRow>,
    /// The requests of the active pods on each node, by node name (a pod may name a node
    /// not seen yet).
    used: HashMap<String, Resources>,
    /// Each counted pod by its key.
    pods: HashMap<String, Counted>,
    /// Active pods on each node that a DaemonSet does not run, by node name.
    work: HashMap<String, u32>,
    /// The pending pods' keys, in order (the summary reserves their demand in this order).
    pending: BTreeSet<String>,
    /// Pods seen pending and then on a node, since the ledger began: the shard's placements
    /// (a counter the federation turns into a rate).
    bound: u64,
}

impl Ledger {
    /// Counts `node` (added or changed).
    pub fn set_node(&mut self, node: &Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let allocatable =
            Resources::from_list(node.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        let labels = node.metadata.labels.as_ref();
        let loan = labels.and_then(|l| l.get(LOAN_LABEL)).cloned();
        let borrowed = loan
            .clone()
            .filter(|_| labels.is_some_and(|l| l.contains_key(LENT_FROM_LABEL)));
        let lent = match (
            &borrowed,
            loan,
            node.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(LENT_TO_ANNOTATION)),
        ) {
            (None, Some(loan), Some(to)) => Some((to.clone(), loan)),
            _ => None,
        };
        // A borrowed node counts as the borrower's own (its room is what the borrower's
        // waiting replicas are placed on), a process one in the process pool.
        let borrowing = borrowed_pool(node);
        let is_process = labels
            .and_then(|l| l.get(PROCESS_TAINT_KEY))
            .map(String::as_str)
            == Some(PROCESS_TAINT_VALUE);
        self.nodes.insert(
            name,
            NodeRow {
                node: node.clone(),
                allocatable,
                schedulable: schedulable(node) || (borrowing && !is_process),
                process: process_pool(node) || (borrowing && is_process),
                lent,
                borrowed,
            },
        );
    }

    /// Whether node `name` runs no active pod but a DaemonSet's (those run on every node
    /// and are evicted with the node's other pods when it is lent).
    pub fn idle(&self, name: &str) -> bool {
        !self.work.contains_key(name)
    }

    /// Forgets the node `name` (its pods' requests stay counted until they go).
    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    /// Counts the pod `key` as `pod` now is (added or changed): its request on its node, or
    /// as pending demand; nothing once it has finished or is being deleted.
    pub fn set_pod(&mut self, key: &str, pod: &Pod) {
        let was_pending = self.pending.contains(key);
        self.remove_pod(key);
        if !active(pod) || pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let spec = pod.spec.as_ref();
        if was_pending && spec.and_then(|s| s.node_name.as_deref()).is_some() {
            self.bound += 1;
        }
        let req = pod_spec_requests(spec);
        let counted = match spec.and_then(|s| s.node_name.as_deref()) {
            Some(node) => {
                self.used.entry(node.to_owned()).or_default().add(&req);
                let daemon = pod
                    .metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|os| os.iter().any(|o| o.kind == "DaemonSet"));
                if !daemon {
                    *self.work.entry(node.to_owned()).or_default() += 1;
                }
                Counted::On(node.to_owned(), req, daemon)
            }
            None => {
                self.pending.insert(key.to_owned());
                Counted::Pending(
                    Request {
                        amounts: req.amounts(),
                        on: required_node_labels(spec),
                    },
                    tolerates_borrowed(spec),
                )
            }
        };
        self.pods.insert(key.to_owned(), counted);
    }

    /// Stops counting the pod `key`.
    pub fn remove_pod(&mut self, key: &str) {
        match self.pods.remove(key) {
            Some(Counted::On(node, req, daemon)) => {
                if !daemon && let Some(n) = self.work.get_mut(&node) {
                    *n -= 1;
                    if *n == 0 {
                        self.work.remove(&node);
                    }
                }
                if let Some(u) = self.used.get_mut(&node) {
                    u.sub(&req);
                }
            }
            Some(Counted::Pending(..)) => {
                self.pending.remove(key);
            }
            None => {}
        }
    }

    /// Pods seen pending and then on a node since the ledger began.
    pub fn pods_bound(&self) -> u64 {
        self.bound
    }

    /// Pods running and pending, and the summary, with `promised` (request, count) taken
    /// out as well, as version `version`.
    pub fn summary(
        &self,
        promised: &[(Request, u64)],
        group_keys: &[String],
        version: u64,
    ) -> (Summary, u64, u64) {
        let (s, running, pending, _) = self.summary_with_lending(promised, group_keys, version);
        (s, running, pending)
    }

    /// [`Ledger::summary`], and what elastic shards need to know: the demand no node has
    /// room for, idle nodes, and the nodes lent and borrowed.
    pub fn summary_with_lending(
        &self,
        promised: &[(Request, u64)],
        group_keys: &[String],
        version: u64,
    ) -> (Summary, u64, u64, LendingView) {
        let mut extended: BTreeSet<&str> = BTreeSet::new();
        for row in self.nodes.values() {
            for (k, _) in &row.allocatable.extended {
                extended.insert(k);
            }
        }
        let ext: Vec<&str> = extended.iter().copied().collect();
        let mut b = SummaryBuilder::new(&ext).group_by(group_keys);
        let resources: Vec<String> = tessera_placement::summary::BASE_RESOURCES
            .iter()
            .copied()
            .chain(extended.iter().copied())
            .map(str::to_owned)
            .collect();
        let none = Resources::default();
        // Buffers reused from node to node (only group label values are copied per node).
        let mut values: Vec<String> = Vec::with_capacity(group_keys.len());
        let mut alloc: Vec<u64> = Vec::with_capacity(resources.len());
        let mut free: Vec<u64> = Vec::with_capacity(resources.len());
        // Process nodes: a pool of their own, for replicas that must run on one.
        let mut pool = SummaryBuilder::new(&ext);
        let mut any = false;
        let mut view = LendingView::default();
        let (mut lent_cpu, mut borrowed_cpu) = (0u64, 0u64);
        for (name, row) in &self.nodes {
            let used = self.used.get(name).unwrap_or(&none);
            let idle = self.idle(name);
            let cpu = row.allocatable.milli_cpu.max(0) as u64;
            if let Some((to, loan)) = &row.lent {
                view.lent.push((name.clone(), to.clone(), loan.clone()));
                lent_cpu += cpu;
            }
            if let Some(loan) = &row.borrowed {
                view.borrowed.push((name.clone(), loan.clone(), idle));
            }
            if !row.schedulable && !row.process {
                continue;
            }
            view.schedulable_nodes += 1;
            if row.borrowed.is_some() && !row.process {
                borrowed_cpu += cpu;
            }
            if idle
                && row.lent.is_none()
                && row.borrowed.is_none()
                && view.idle.len() < MAX_IDLE_REPORTED
            {
                let alloc = resources
                    .iter()
                    .map(|r| amount(&row.allocatable, r))
                    .collect();
                view.idle.push((name.clone(), alloc, row.process));
            }
            alloc.clear();
            free.clear();
            for r in &resources {
                let a = amount(&row.allocatable, r);
                alloc.push(a);
                free.push(a.saturating_sub(amount(used, r)));
            }
            if row.process {
                any = true;
                pool.node_in(&[], &alloc, &free);
                continue;
            }
            let labels = row.node.metadata.labels.as_ref();
            values.clear();
            values.extend(
                group_keys
                    .iter()
                    .map(|k| labels.and_then(|l| l.get(k)).cloned().unwrap_or_default()),
            );
            b.node_in(&values, &alloc, &free);
        }
        let mut s = b.build(version);
        view.own_cpu_milli =
            (s.allocatable.first().copied().unwrap_or(0) + lent_cpu).saturating_sub(borrowed_cpu);
        if any {
            s.process = Some(Box::new(pool.build(version)));
        }
        view.unmet = vec![0; s.resources.len()];
        view.unmet_process = vec![0; s.resources.len()];
        for key in &self.pending {
            if let Some(Counted::Pending(r, borrows)) = self.pods.get(key)
                && let Ok(v) = r.vector_for(&s)
                && s.reserve_on(&v, 1, &r.on) == 0
            {
                view.own_unmet_pods += 1;
                if *borrows {
                    let (pods, unmet) = if on_process_nodes(&r.on).is_some() {
                        (&mut view.unmet_process_pods, &mut view.unmet_process)
                    } else {
                        (&mut view.unmet_pods, &mut view.unmet)
                    };
                    *pods += 1;
                    for (u, x) in unmet.iter_mut().zip(&v) {
                        *u += x;
                    }
                }
            }
        }
        view.lent.sort_unstable();
        view.borrowed.sort_unstable();
        for (r, n) in promised {
            if let Ok(v) = r.vector_for(&s) {
                s.reserve_on(&v, *n, &r.on);
            }
        }
        let running = (self.pods.len() - self.pending.len()) as u64;
        (s, running, self.pending.len() as u64, view)
    }
}

/// Pods running and pending, and the summary of `nodes` and `pods`, with `promised`
/// (request, count) taken out as well, as version `version`: a [`Ledger`] of them, built at
/// once.
pub fn build(
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    promised: &[(Request, u64)],
    group_keys: &[String],
    version: u64,
) -> (Summary, u64, u64) {
    let mut l = Ledger::default();
    for n in nodes {
        l.set_node(n);
    }
    for (i, p) in pods.iter().enumerate() {
        l.set_pod(&i.to_string(), p);
    }
    l.summary(promised, group_keys, version)
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
        process: s.process.as_deref().map(|p| Box::new(to_pb(p))),
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
    fn a_placement_is_a_pod_seen_pending_then_on_a_node() {
        let mut l = Ledger::default();
        l.set_node(&node("n1", "8", true, false));
        l.set_pod("a", &pod(None, "1"));
        l.set_pod("b", &pod(Some("n1"), "1"));
        assert_eq!(
            l.pods_bound(),
            0,
            "first seen bound: placed before the ledger began"
        );
        l.set_pod("a", &pod(Some("n1"), "1"));
        assert_eq!(l.pods_bound(), 1);
        // Later changes of a bound pod are not placements again.
        l.set_pod("a", &pod(Some("n1"), "1"));
        l.remove_pod("a");
        assert_eq!(l.pods_bound(), 1);
    }

    /// `n` with the process nodes' taint (and `extra`, another NoSchedule taint).
    fn process_node(name: &str, cpu: &str, extra: bool) -> Arc<Node> {
        let mut n = Arc::unwrap_or_clone(node(name, cpu, true, extra));
        let spec = n.spec.get_or_insert_with(Default::default);
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: PROCESS_TAINT_KEY.into(),
            value: Some(PROCESS_TAINT_VALUE.into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
        Arc::new(n)
    }

    /// `n` marked as one of this shard's nodes lent to `to` (loan `loan`), or — `borrowed` —
    /// as another shard's node lent here.
    fn on_loan(n: Arc<Node>, loan: &str, to: &str, borrowed: bool) -> Arc<Node> {
        let mut n = Arc::unwrap_or_clone(n);
        let labels = n.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(LOAN_LABEL.into(), loan.into());
        let taint = if borrowed {
            labels.insert(LENT_FROM_LABEL.into(), to.into());
            Taint {
                key: BORROWED_TAINT_KEY.into(),
                value: Some(to.into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }
        } else {
            n.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(LENT_TO_ANNOTATION.into(), to.into());
            Taint {
                key: tessera_client::types::LENT_TAINT_KEY.into(),
                value: Some(to.into()),
                effect: "NoExecute".into(),
                ..Default::default()
            }
        };
        n.spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(taint);
        Arc::new(n)
    }

    #[test]
    fn the_lending_view_names_idle_nodes_unmet_demand_and_loans() {
        let nodes = vec![
            node("busy", "4", true, false),
            node("idle", "4", true, false),
            on_loan(node("away", "4", true, false), "l1", "b", false),
            on_loan(node("guest", "2", true, false), "l2", "c", true),
        ];
        let mut borrows = Arc::unwrap_or_clone(pod(None, "4"));
        borrows
            .spec
            .as_mut()
            .expect("spec")
            .tolerations
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::Toleration {
                key: Some(BORROWED_TAINT_KEY.into()),
                operator: Some("Exists".into()),
                ..Default::default()
            });
        // Pending pods are taken out in key order: the first 4-cpu one fits on `idle`, then
        // neither of the others fits anywhere (busy has 3 left, the guest 2): unmet, and one
        // of them may use a borrowed node.
        // A DaemonSet's pod does not keep a node from being idle.
        let mut daemon = Arc::unwrap_or_clone(pod(Some("idle"), "0"));
        daemon.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "DaemonSet".into(),
                name: "logs".into(),
                ..Default::default()
            },
        ]);
        let pods: Vec<(String, Arc<Pod>)> = vec![
            ("on-busy".into(), pod(Some("busy"), "1")),
            ("daemon".into(), Arc::new(daemon)),
            ("a-fits".into(), pod(None, "4")),
            ("b-borrows".into(), Arc::new(borrows)),
            ("c-stays".into(), pod(None, "4")),
        ];
        let mut l = Ledger::default();
        for n in &nodes {
            l.set_node(n);
        }
        for (k, p) in &pods {
            l.set_pod(k, p);
        }
        let (s, _, pending, v) = l.summary_with_lending(&[], &[], 1);
        assert_eq!(pending, 3);
        // busy, idle and the borrowed guest count; the node lent away does not.
        assert_eq!((s.nodes, v.schedulable_nodes), (3, 3));
        assert_eq!(v.own_unmet_pods, 2);
        assert_eq!(
            v.unmet_pods, 1,
            "only the pod that tolerates borrowed nodes"
        );
        assert_eq!(v.unmet[0], 4000);
        // Idle and ours: `idle` only (not the guest, not the node away).
        let idle: Vec<&str> = v.idle.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(idle, vec!["idle"]);
        assert_eq!(v.lent, vec![("away".into(), "b".into(), "l1".into())]);
        assert_eq!(v.borrowed, vec![("guest".into(), "l2".into(), true)]);
        // The map weight is reckoned from our own nodes: the guest out, the node away in.
        assert_eq!(v.own_cpu_milli, 4000 + 4000 + 4000);
        assert_eq!(s.allocatable[0], 4000 + 4000 + 2000);
    }

    #[test]
    fn process_nodes_are_a_pool_of_their_own() {
        let nodes = vec![
            node("plain", "4", true, false),
            process_node("box-0", "2", false),
            process_node("box-1", "2", true),
        ];
        let mut on_box = Arc::unwrap_or_clone(pod(Some("box-0"), "1"));
        on_box.metadata.name = Some("on-box".into());
        let (s, _, _) = build(&nodes, &[Arc::new(on_box)], &[], &[], 1);
        assert_eq!(
            (s.nodes, s.free[0]),
            (1, 4000),
            "process nodes are not the shard's room"
        );
        let pool = s.process.as_deref().expect("a process pool");
        assert_eq!(
            pool.nodes, 1,
            "a process node with another taint is in neither"
        );
        assert_eq!(pool.free[0], 1000, "its pods' requests are taken out");
        pool.validate().expect("valid");
        assert!(
            to_pb(&s)
                .process
                .is_some_and(|p| p.nodes == 1 && p.free[0] == 1000)
        );
        let (none, _, _) = build(&nodes[..1], &[], &[], &[], 1);
        assert!(none.process.is_none(), "no process nodes: no pool");
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

    /// One change to a shard, as the informers deliver it.
    #[derive(Clone, Debug)]
    enum Op {
        Node {
            n: usize,
            cpu: u32,
            ready: bool,
            taint: bool,
            zone: usize,
        },
        NodeGone(usize),
        Pod {
            p: usize,
            on: Option<usize>,
            cpu: u32,
            done: bool,
            deleting: bool,
        },
        PodGone(usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (
                0..4usize,
                1..9u32,
                any::<bool>(),
                proptest::bool::weighted(0.2),
                0..2usize
            )
                .prop_map(|(n, cpu, ready, taint, zone)| Op::Node {
                    n,
                    cpu,
                    ready,
                    taint,
                    zone
                }),
            (0..4usize).prop_map(Op::NodeGone),
            (
                0..8usize,
                proptest::option::of(0..5usize),
                1..4u32,
                proptest::bool::weighted(0.2),
                proptest::bool::weighted(0.1)
            )
                .prop_map(|(p, on, cpu, done, deleting)| Op::Pod {
                    p,
                    on,
                    cpu,
                    done,
                    deleting
                }),
            (0..8usize).prop_map(Op::PodGone),
        ]
    }

    fn zoned(name: &str, cpu: u32, ready: bool, taint: bool, zone: usize) -> Arc<Node> {
        let mut n = Arc::unwrap_or_clone(node(name, &cpu.to_string(), ready, taint));
        n.metadata.labels = Some([("zone".to_owned(), format!("z{zone}"))].into());
        Arc::new(n)
    }

    fn pod_of(on: Option<usize>, cpu: u32, done: bool, deleting: bool) -> Arc<Pod> {
        let name = on.map(|n| format!("n{n}"));
        let mut p = Arc::unwrap_or_clone(pod(name.as_deref(), &format!("{cpu}00m")));
        if done {
            p.status = Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            });
        }
        if deleting {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        Arc::new(p)
    }

    proptest::proptest! {
        /// A ledger kept change by change (nodes and pods added, changed, bound, finished,
        /// deleted, in any order, pods on nodes not seen yet) says exactly what one built at
        /// once from the objects left says.
        #[test]
        fn a_ledger_kept_change_by_change_equals_one_built_at_once(
            ops in proptest::collection::vec(op(), 0..60),
        ) {
            let mut kept = Ledger::default();
            let mut nodes: std::collections::BTreeMap<String, Arc<Node>> = Default::default();
            let mut pods: std::collections::BTreeMap<String, Arc<Pod>> = Default::default();
            for op in ops {
                match op {
                    Op::Node { n, cpu, ready, taint, zone } => {
                        let name = format!("n{n}");
                        let node = zoned(&name, cpu, ready, taint, zone);
                        kept.set_node(&node);
                        nodes.insert(name, node);
                    }
                    Op::NodeGone(n) => {
                        let name = format!("n{n}");
                        kept.remove_node(&name);
                        nodes.remove(&name);
                    }
                    Op::Pod { p, on, cpu, done, deleting } => {
                        let key = format!("ns/p{p}");
                        let pod = pod_of(on, cpu, done, deleting);
                        kept.set_pod(&key, &pod);
                        pods.insert(key, pod);
                    }
                    Op::PodGone(p) => {
                        let key = format!("ns/p{p}");
                        kept.remove_pod(&key);
                        pods.remove(&key);
                    }
                }
            }
            let mut fresh = Ledger::default();
            for n in nodes.values() {
                fresh.set_node(n);
            }
            for (k, p) in &pods {
                fresh.set_pod(k, p);
            }
            let keys = vec!["zone".to_owned()];
            let promised = vec![(Request::cpu_memory(500, 0), 2)];
            let (a, ra, pa) = kept.summary(&promised, &keys, 7);
            let (b, rb, pb) = fresh.summary(&promised, &keys, 7);
            proptest::prop_assert_eq!((ra, pa), (rb, pb));
            proptest::prop_assert_eq!(to_pb(&a), to_pb(&b));
            proptest::prop_assert!(a.validate().is_ok());
        }
    }
}
