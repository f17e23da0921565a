//! Pods counted by what they match, per node and per topology domain, kept up to date as the
//! cache counts and drops pods and as node labels change. PodTopologySpread and
//! InterPodAffinity read these counters instead of walking every pod in every cycle
//! (kube-scheduler rebuilds the same counts from all nodes for each pod).
//!
//! Two kinds of entries:
//! - a **counter** counts the pods a [`Match`] selects (the incoming pod's spread selector or
//!   one of its affinity terms). Created on first use by a scan of the cached pods, then kept
//!   incrementally; dropped when no cycle used it for [`IDLE_TICKS`] ticks.
//! - a **group** counts the pods that *carry* one affinity term (existing pods' terms, for
//!   the symmetric rules: an existing pod's anti-affinity keeps the incoming pod away). Pods
//!   with identical terms share a group, so an incoming pod is checked once per distinct
//!   term, not once per pod.
//!
//! Tenancy: a term's namespaces are only ever namespaces of the pod's own tenant (pods of
//! namespaces no Tenant owns see only such namespaces). A term naming another tenant's
//! namespace, or a `namespaceSelector` that would reach one, selects nothing there — so a
//! tenant can neither probe another's pods through scheduling outcomes nor keep another's
//! pods off nodes with an anti-affinity of its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm};
use tessera_core::LabelSelector;
use tessera_core::selector::label::{Operator, Requirement};

/// Labels of a pod, node or namespace.
pub type Labels = BTreeMap<String, String>;

/// Ticks (seconds) a counter stays without being used before it is dropped.
pub const IDLE_TICKS: u64 = 300;

static NO_LABELS: Labels = BTreeMap::new();

/// One condition on pods: in one of `namespaces`, with labels `selector` matches (`None`
/// matches nothing, as a nil selector does in Kubernetes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Clause {
    /// Namespaces the pod may be in.
    pub namespaces: BTreeSet<String>,
    /// Its label selector.
    pub selector: Option<LabelSelector>,
}

impl Clause {
    /// True if a pod in `ns` with `labels` satisfies the clause.
    pub fn matches(&self, ns: &str, labels: &Labels) -> bool {
        self.selector.as_ref().is_some_and(|s| s.matches(labels)) && self.namespaces.contains(ns)
    }
}

/// What a counter counts: pods satisfying every clause.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Match(pub Vec<Clause>);

impl Match {
    /// True if a pod in `ns` with `labels` satisfies every clause.
    pub fn matches(&self, ns: &str, labels: &Labels) -> bool {
        !self.0.is_empty() && self.0.iter().all(|c| c.matches(ns, labels))
    }
}

/// The kind of an existing pod's affinity term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TermKind {
    /// `podAffinity.required…`: scored with the hard pod affinity weight (1).
    RequiredAffinity,
    /// `podAntiAffinity.required…`: keeps matching pods out of its domain.
    RequiredAnti,
    /// `podAffinity.preferred…`: draws matching pods to its domain.
    PreferredAffinity,
    /// `podAntiAffinity.preferred…`: pushes matching pods away from its domain.
    PreferredAnti,
}

/// One affinity term, resolved against the pod that carries it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// Its kind.
    pub kind: TermKind,
    /// Its weight (preferred terms; 0 for required ones).
    pub weight: i32,
    /// The pods it selects.
    pub clause: Clause,
    /// The node label whose values are its domains.
    pub topology_key: String,
}

/// The required and the preferred terms of a pod's affinity or anti-affinity.
type Terms<'a> = (
    Option<&'a Vec<PodAffinityTerm>>,
    Option<&'a Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>,
);

/// A node's domain id for a key it does not carry.
pub const NO_DOMAIN: u32 = u32::MAX;

/// A registered topology key: its values interned as dense domain ids (never reused), and
/// how many live nodes carry each.
struct Key {
    name: String,
    ids: HashMap<String, u32>,
    nodes: Vec<u32>,
    /// Domains with at least one live node.
    live_domains: usize,
    /// Live nodes that carry the key.
    with_key: usize,
}

/// Counts per domain id of one key, and how many are not zero.
struct Domains {
    key: usize,
    counts: Vec<i64>,
    nonzero: usize,
}

impl Domains {
    fn bump(&mut self, d: u32, by: i64) {
        if d == NO_DOMAIN || by == 0 {
            return;
        }
        let d = d as usize;
        if self.counts.len() <= d {
            self.counts.resize(d + 1, 0);
        }
        let before = self.counts[d];
        self.counts[d] += by;
        match (before == 0, self.counts[d] == 0) {
            (true, false) => self.nonzero += 1,
            (false, true) => self.nonzero -= 1,
            _ => {}
        }
    }

    fn get(&self, d: u32) -> i64 {
        self.counts.get(d as usize).copied().unwrap_or(0)
    }
}

struct Counter {
    what: Match,
    /// Matching pods on all nodes.
    total: i64,
    per_node: HashMap<String, i64>,
    domains: Vec<Domains>,
    last_used: u64,
}

struct Group {
    term: Term,
    per_node: HashMap<String, i64>,
    per_domain: Domains,
    total: i64,
}

/// Finds the selector of the Services and the controlling ReplicaSet or StatefulSet that
/// select a pod (kube-scheduler's `DefaultSelector`), for system default spreading.
pub type DefaultSelector = Arc<dyn Fn(&Pod) -> Option<LabelSelector> + Send + Sync>;

/// Counters, groups and what they need: node labels, namespace labels and owners.
#[derive(Default)]
pub struct Topology {
    default_selector: Option<DefaultSelector>,
    counters: Vec<Option<Counter>>,
    free_counters: Vec<usize>,
    counter_ids: HashMap<Match, usize>,
    counters_by_ns: HashMap<String, Vec<usize>>,
    groups: Vec<Option<Group>>,
    free_groups: Vec<usize>,
    group_ids: HashMap<Term, usize>,
    groups_by_ns: HashMap<String, Vec<usize>>,
    /// The groups each counted pod with terms is in (by pod key).
    pod_groups: HashMap<String, Vec<usize>>,
    /// Live nodes (with a Node) by name.
    nodes: HashMap<String, Arc<Node>>,
    /// Each live node's domain id per registered key (in key order).
    node_domains: HashMap<String, Vec<u32>>,
    /// Registered topology keys, by id.
    keys: Vec<Key>,
    key_ids: HashMap<String, usize>,
    /// Namespace labels, for `namespaceSelector`.
    namespaces: HashMap<String, Labels>,
    /// Namespace → owning tenant.
    owners: HashMap<String, String>,
    tick: u64,
}

fn pod_labels(pod: &Pod) -> &Labels {
    pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

fn pod_ns(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("")
}

fn node_labels(node: &Node) -> &Labels {
    node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// Whether the topology counts a pod: a terminating pod no longer does (Kubernetes leaves
/// pods being deleted out of spreading and affinity).
pub fn counts(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
}

fn bump_node(map: &mut HashMap<String, i64>, key: &str, by: i64) {
    if let Some(v) = map.get_mut(key) {
        *v += by;
        if *v == 0 {
            map.remove(key);
        }
    } else if by != 0 {
        map.insert(key.to_owned(), by);
    }
}

/// How many of `evicted` — pods a preemption simulation took off one node — count and
/// satisfy `what`: what that node's domain counts less while they are gone.
pub fn evicted_matching(evicted: &[Arc<crate::resources::PodInfo>], what: &Match) -> i64 {
    evicted
        .iter()
        .filter(|v| counts(&v.pod) && what.matches(pod_ns(&v.pod), pod_labels(&v.pod)))
        .count() as i64
}

/// The selector of a term or constraint, with `matchLabelKeys` (the pod's values of those
/// labels must match) and `mismatchLabelKeys` (must not) folded in. `None` for a nil selector.
pub fn selector_of(
    sel: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    match_keys: &[String],
    mismatch_keys: &[String],
    labels: &Labels,
) -> Option<LabelSelector> {
    let base = tessera_runtime::selector::from_metav1(sel?).ok()?;
    if match_keys.is_empty() && mismatch_keys.is_empty() {
        return Some(base);
    }
    let mut reqs = base.requirements().to_vec();
    for (keys, operator) in [(match_keys, Operator::In), (mismatch_keys, Operator::NotIn)] {
        for k in keys {
            if let Some(v) = labels.get(k) {
                reqs.push(Requirement {
                    key: k.clone(),
                    operator,
                    values: vec![v.clone()],
                });
            }
        }
    }
    Some(LabelSelector::from_requirements(reqs))
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets how a pod's default spreading selector is found.
    pub fn set_default_selector(&mut self, f: DefaultSelector) {
        self.default_selector = Some(f);
    }

    /// The selector default spreading constraints of `pod` use: `None` (no defaults) when
    /// nothing selects the pod.
    pub fn default_selector(&self, pod: &Pod) -> Option<LabelSelector> {
        self.default_selector
            .as_ref()
            .and_then(|f| f(pod))
            .filter(|s| !s.is_empty())
    }

    /// The namespaces a term of a pod in `ns` may select: its own namespace when the term
    /// names none; else the named ones and those `namespace_selector` matches — all limited
    /// to the pod's tenant.
    pub fn scope(
        &self,
        ns: &str,
        named: &[String],
        namespace_selector: Option<&LabelSelector>,
    ) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        if named.is_empty() && namespace_selector.is_none() {
            out.insert(ns.to_owned());
            return out;
        }
        let owner = self.owners.get(ns);
        let same = |other: &str| self.owners.get(other) == owner;
        for n in named {
            if same(n) {
                out.insert(n.clone());
            }
        }
        if let Some(sel) = namespace_selector {
            for (n, labels) in &self.namespaces {
                if same(n) && sel.matches(labels) {
                    out.insert(n.clone());
                }
            }
            // The pod's own namespace, even before its Namespace is seen.
            if sel.matches(self.namespaces.get(ns).unwrap_or(&NO_LABELS)) {
                out.insert(ns.to_owned());
            }
        }
        out
    }

    /// The clause of an affinity term of `pod`.
    pub fn term_clause(&self, pod: &Pod, t: &PodAffinityTerm) -> Clause {
        let ns = pod_ns(pod);
        let ns_sel = t
            .namespace_selector
            .as_ref()
            .and_then(|s| tessera_runtime::selector::from_metav1(s).ok());
        Clause {
            namespaces: self.scope(
                ns,
                t.namespaces.as_deref().unwrap_or_default(),
                ns_sel.as_ref(),
            ),
            selector: selector_of(
                t.label_selector.as_ref(),
                t.match_label_keys.as_deref().unwrap_or_default(),
                t.mismatch_label_keys.as_deref().unwrap_or_default(),
                pod_labels(pod),
            ),
        }
    }

    fn term(&self, pod: &Pod, kind: TermKind, weight: i32, t: &PodAffinityTerm) -> Term {
        Term {
            kind,
            weight,
            clause: self.term_clause(pod, t),
            topology_key: t.topology_key.clone(),
        }
    }

    /// Every affinity term `pod` carries, resolved.
    pub fn pod_terms(&self, pod: &Pod) -> Vec<Term> {
        let Some(a) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut add = |(required, preferred): Terms<'_>, kinds: (TermKind, TermKind)| {
            for t in required.into_iter().flatten() {
                out.push(self.term(pod, kinds.0, 0, t));
            }
            for w in preferred.into_iter().flatten() {
                out.push(self.term(pod, kinds.1, w.weight, &w.pod_affinity_term));
            }
        };
        if let Some(pa) = &a.pod_affinity {
            add(
                (
                    pa.required_during_scheduling_ignored_during_execution
                        .as_ref(),
                    pa.preferred_during_scheduling_ignored_during_execution
                        .as_ref(),
                ),
                (TermKind::RequiredAffinity, TermKind::PreferredAffinity),
            );
        }
        if let Some(pa) = &a.pod_anti_affinity {
            add(
                (
                    pa.required_during_scheduling_ignored_during_execution
                        .as_ref(),
                    pa.preferred_during_scheduling_ignored_during_execution
                        .as_ref(),
                ),
                (TermKind::RequiredAnti, TermKind::PreferredAnti),
            );
        }
        out
    }

    /// The live nodes.
    pub fn live_nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.values()
    }

    /// How many live nodes there are.
    pub fn live_count(&self) -> usize {
        self.nodes.len()
    }

    /// The id of registered key `key`.
    pub fn key_id(&self, key: &str) -> Option<usize> {
        self.key_ids.get(key).copied()
    }

    /// How many keys are registered (ids are `0..key_count()`).
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// How many live nodes carry key `k`.
    pub fn nodes_with_key(&self, k: usize) -> usize {
        self.keys[k].with_key
    }

    /// How many of key `k`'s domains have live nodes.
    pub fn live_domains(&self, k: usize) -> usize {
        self.keys[k].live_domains
    }

    /// How many domain ids key `k` has handed out (live or not).
    pub fn domain_ids(&self, k: usize) -> usize {
        self.keys[k].nodes.len()
    }

    /// Whether domain `d` of key `k` has live nodes.
    pub fn domain_is_live(&self, k: usize, d: u32) -> bool {
        self.keys[k].nodes.get(d as usize).is_some_and(|n| *n > 0)
    }

    /// Live node `node`'s domain ids, one per registered key.
    pub fn node_domain_ids(&self, node: &str) -> &[u32] {
        self.node_domains.get(node).map_or(&[], Vec::as_slice)
    }

    /// The domain of key `k` that `node` is in: from its cached ids, else from its labels
    /// (a key registered after the node was cached), else [`NO_DOMAIN`].
    pub fn domain_of(&self, node: &crate::resources::NodeInfo, k: usize) -> u32 {
        if let Some(d) = node.domains.get(k) {
            return *d;
        }
        node.labels()
            .and_then(|l| l.get(&self.keys[k].name))
            .and_then(|v| self.keys[k].ids.get(v))
            .copied()
            .unwrap_or(NO_DOMAIN)
    }

    /// How many live nodes carry each value of `key` (for tests and debugging).
    pub fn key_domains(&self, key: &str) -> Option<HashMap<String, u32>> {
        let k = &self.keys[self.key_id(key)?];
        Some(
            k.ids
                .iter()
                .filter(|(_, d)| k.nodes[**d as usize] > 0)
                .map(|(v, d)| (v.clone(), k.nodes[*d as usize]))
                .collect(),
        )
    }

    fn intern(key: &mut Key, value: &str) -> u32 {
        if let Some(d) = key.ids.get(value) {
            return *d;
        }
        let d = key.nodes.len() as u32;
        key.ids.insert(value.to_owned(), d);
        key.nodes.push(0);
        d
    }

    /// Registers `key` (its domains are kept from now on); returns its id.
    pub fn register_key(&mut self, key: &str) -> usize {
        if let Some(k) = self.key_ids.get(key) {
            return *k;
        }
        let mut k = Key {
            name: key.to_owned(),
            ids: HashMap::new(),
            nodes: Vec::new(),
            live_domains: 0,
            with_key: 0,
        };
        let id = self.keys.len();
        for (name, n) in &self.nodes {
            let d = match node_labels(n).get(key) {
                Some(v) => {
                    let d = Self::intern(&mut k, v);
                    if k.nodes[d as usize] == 0 {
                        k.live_domains += 1;
                    }
                    k.nodes[d as usize] += 1;
                    k.with_key += 1;
                    d
                }
                None => NO_DOMAIN,
            };
            let ids = self.node_domains.entry(name.clone()).or_default();
            ids.resize(id, NO_DOMAIN);
            ids.push(d);
        }
        self.keys.push(k);
        self.key_ids.insert(key.to_owned(), id);
        id
    }

    /// The counter of `what`, if one exists.
    pub fn counter(&self, what: &Match) -> Option<usize> {
        self.counter_ids.get(what).copied()
    }

    /// Counter `id`'s matching pods per node.
    pub fn per_node(&self, id: usize) -> &HashMap<String, i64> {
        static EMPTY: std::sync::LazyLock<HashMap<String, i64>> =
            std::sync::LazyLock::new(HashMap::new);
        self.counters[id].as_ref().map_or(&EMPTY, |c| &c.per_node)
    }

    /// Where counter `id` keeps its counts for key `k` (an index for [`Topology::count`]).
    pub fn slot(&self, id: usize, k: usize) -> Option<usize> {
        self.counters[id]
            .as_ref()?
            .domains
            .iter()
            .position(|d| d.key == k)
    }

    /// Counter `id`'s matching pods in domain `d` of the key at `slot`.
    pub fn count(&self, id: usize, slot: usize, d: u32) -> i64 {
        self.counters[id]
            .as_ref()
            .and_then(|c| c.domains.get(slot))
            .map_or(0, |dm| dm.get(d))
    }

    /// Counter `id`'s counts by domain id for the key at `slot`, and how many are not zero.
    pub fn counts(&self, id: usize, slot: usize) -> (&[i64], usize) {
        match self.counters[id].as_ref().and_then(|c| c.domains.get(slot)) {
            Some(dm) => (&dm.counts, dm.nonzero),
            None => (&[], 0),
        }
    }

    /// Counter `id`'s matching pods per value of `key` (for tests and debugging).
    pub fn per_domain(&self, id: usize, key: &str) -> Option<HashMap<String, i64>> {
        let k = self.key_id(key)?;
        let dm = &self.counters[id].as_ref()?.domains[self.slot(id, k)?];
        Some(
            self.keys[k]
                .ids
                .iter()
                .filter(|(_, d)| dm.get(**d) != 0)
                .map(|(v, d)| (v.clone(), dm.get(*d)))
                .collect(),
        )
    }

    /// All pods counter `id` counts.
    pub fn total(&self, id: usize) -> i64 {
        self.counters[id].as_ref().map_or(0, |c| c.total)
    }

    /// Creates (by scanning `pods`: `(pod, node)`) or touches the counter of `what`, with
    /// domain counts for `key`; returns its id.
    pub fn ensure_counter<'a>(
        &mut self,
        what: &Match,
        key: &str,
        pods: impl Iterator<Item = (&'a Pod, &'a str)>,
    ) -> usize {
        let tick = self.tick;
        let id = match self.counter_ids.get(what) {
            Some(&id) => id,
            None => {
                let mut c = Counter {
                    what: what.clone(),
                    total: 0,
                    per_node: HashMap::new(),
                    domains: Vec::new(),
                    last_used: tick,
                };
                for (pod, node) in pods {
                    if counts(pod) && what.matches(pod_ns(pod), pod_labels(pod)) {
                        *c.per_node.entry(node.to_owned()).or_insert(0) += 1;
                        c.total += 1;
                    }
                }
                let id = match self.free_counters.pop() {
                    Some(id) => {
                        self.counters[id] = Some(c);
                        id
                    }
                    None => {
                        self.counters.push(Some(c));
                        self.counters.len() - 1
                    }
                };
                if let Some(first) = what.0.first() {
                    for ns in &first.namespaces {
                        self.counters_by_ns.entry(ns.clone()).or_default().push(id);
                    }
                }
                self.counter_ids.insert(what.clone(), id);
                id
            }
        };
        let k = self.register_key(key);
        if self.slot(id, k).is_none() {
            let mut dm = Domains {
                key: k,
                counts: Vec::new(),
                nonzero: 0,
            };
            let c = self.counters[id].as_ref().expect("live counter");
            for (node, n) in &c.per_node {
                if let Some(d) = self.node_domains.get(node).and_then(|ids| ids.get(k)) {
                    dm.bump(*d, *n);
                }
            }
            let c = self.counters[id].as_mut().expect("live counter");
            c.domains.push(dm);
        }
        if let Some(c) = self.counters[id].as_mut() {
            c.last_used = tick;
        }
        id
    }

    /// The groups (id and term) whose term selects a pod in `ns` with `labels`.
    pub fn groups_matching<'a>(
        &'a self,
        ns: &'a str,
        labels: &'a Labels,
    ) -> impl Iterator<Item = (usize, &'a Term)> + 'a {
        self.groups_by_ns
            .get(ns)
            .into_iter()
            .flatten()
            .filter_map(|&g| Some((g, self.groups[g].as_ref()?)))
            .filter(move |(_, g)| g.term.clause.matches(ns, labels))
            .map(|(id, g)| (id, &g.term))
    }

    /// The id of group `id`'s topology key.
    pub fn group_key(&self, id: usize) -> usize {
        self.groups[id].as_ref().map_or(0, |g| g.per_domain.key)
    }

    /// Pods carrying group `id`'s term per value of its key (for tests and debugging).
    pub fn group_domains(&self, id: usize) -> HashMap<String, i64> {
        let Some(g) = self.groups[id].as_ref() else {
            return HashMap::new();
        };
        self.keys[g.per_domain.key]
            .ids
            .iter()
            .filter(|(_, d)| g.per_domain.get(**d) != 0)
            .map(|(v, d)| (v.clone(), g.per_domain.get(*d)))
            .collect()
    }

    /// Whether the counted pod `key` carries group `id`'s term.
    pub fn pod_in_group(&self, key: &str, id: usize) -> bool {
        self.pod_groups.get(key).is_some_and(|g| g.contains(&id))
    }

    /// Pods carrying group `id`'s term in domain `d` of its topology key.
    pub fn group_count(&self, id: usize, d: u32) -> i64 {
        self.groups[id].as_ref().map_or(0, |g| g.per_domain.get(d))
    }

    /// A pod starts counting on `node`.
    pub fn add_pod(&mut self, key: &str, pod: &Pod, node: &str) {
        self.count_pod(key, pod, node, 1);
    }

    /// A pod stops counting on `node`.
    pub fn remove_pod(&mut self, key: &str, pod: &Pod, node: &str) {
        self.count_pod(key, pod, node, -1);
    }

    fn count_pod(&mut self, key: &str, pod: &Pod, node: &str, by: i64) {
        if !counts(pod) {
            return;
        }
        let ns = pod_ns(pod);
        let labels = pod_labels(pod);
        let ids = self.node_domains.get(node);
        for &id in self.counters_by_ns.get(ns).into_iter().flatten() {
            let Some(c) = self.counters[id].as_mut() else {
                continue;
            };
            if !c.what.matches(ns, labels) {
                continue;
            }
            bump_node(&mut c.per_node, node, by);
            c.total += by;
            if let Some(ids) = ids {
                for dm in &mut c.domains {
                    dm.bump(ids.get(dm.key).copied().unwrap_or(NO_DOMAIN), by);
                }
            }
        }
        if by > 0 {
            let terms = self.pod_terms(pod);
            if terms.is_empty() {
                return;
            }
            let mut ids = Vec::with_capacity(terms.len());
            for term in terms {
                let id = self.group(term);
                ids.push(id);
                self.count_in_group(id, node, 1);
            }
            self.pod_groups.insert(key.to_owned(), ids);
        } else if let Some(ids) = self.pod_groups.remove(key) {
            for id in ids {
                self.count_in_group(id, node, -1);
            }
        }
    }

    fn group(&mut self, term: Term) -> usize {
        if let Some(&id) = self.group_ids.get(&term) {
            return id;
        }
        let k = self.register_key(&term.topology_key);
        let g = Group {
            term: term.clone(),
            per_node: HashMap::new(),
            per_domain: Domains {
                key: k,
                counts: Vec::new(),
                nonzero: 0,
            },
            total: 0,
        };
        let id = match self.free_groups.pop() {
            Some(id) => {
                self.groups[id] = Some(g);
                id
            }
            None => {
                self.groups.push(Some(g));
                self.groups.len() - 1
            }
        };
        for ns in &term.clause.namespaces {
            self.groups_by_ns.entry(ns.clone()).or_default().push(id);
        }
        self.group_ids.insert(term, id);
        id
    }

    fn count_in_group(&mut self, id: usize, node: &str, by: i64) {
        let ids = self.node_domains.get(node);
        let Some(g) = self.groups[id].as_mut() else {
            return;
        };
        let d = ids
            .and_then(|ids| ids.get(g.per_domain.key))
            .copied()
            .unwrap_or(NO_DOMAIN);
        bump_node(&mut g.per_node, node, by);
        g.per_domain.bump(d, by);
        g.total += by;
        if g.total == 0 {
            let g = self.groups[id].take().expect("live group");
            for ns in &g.term.clause.namespaces {
                if let Some(v) = self.groups_by_ns.get_mut(ns) {
                    v.retain(|x| *x != id);
                    if v.is_empty() {
                        self.groups_by_ns.remove(ns);
                    }
                }
            }
            self.group_ids.remove(&g.term);
            self.free_groups.push(id);
        }
    }

    /// A node was added, changed or (with `None`) went away: domains follow its labels.
    pub fn set_node(&mut self, name: &str, node: Option<Arc<Node>>) {
        let old: Vec<u32> = self.node_domains.get(name).cloned().unwrap_or_default();
        let new: Vec<u32> = match &node {
            None => Vec::new(),
            Some(n) => {
                let labels = node_labels(n);
                self.keys
                    .iter_mut()
                    .map(|k| match labels.get(&k.name) {
                        Some(v) => Self::intern(k, v),
                        None => NO_DOMAIN,
                    })
                    .collect()
            }
        };
        let at = |ids: &[u32], k: usize| ids.get(k).copied().unwrap_or(NO_DOMAIN);
        let was_live = self.nodes.contains_key(name);
        for (k, key) in self.keys.iter_mut().enumerate() {
            let (a, b) = (at(&old, k), at(&new, k));
            let (a_live, b_live) = (was_live && a != NO_DOMAIN, node.is_some() && b != NO_DOMAIN);
            if a == b && a_live == b_live {
                continue;
            }
            if a_live {
                let n = &mut key.nodes[a as usize];
                *n -= 1;
                if *n == 0 {
                    key.live_domains -= 1;
                }
                key.with_key -= 1;
            }
            if b_live {
                let n = &mut key.nodes[b as usize];
                if *n == 0 {
                    key.live_domains += 1;
                }
                *n += 1;
                key.with_key += 1;
            }
        }
        if old != new {
            for c in self.counters.iter_mut().flatten() {
                let Some(&n) = c.per_node.get(name) else {
                    continue;
                };
                for dm in &mut c.domains {
                    let (a, b) = (at(&old, dm.key), at(&new, dm.key));
                    if a != b {
                        dm.bump(a, -n);
                        dm.bump(b, n);
                    }
                }
            }
            for g in self.groups.iter_mut().flatten() {
                let Some(&n) = g.per_node.get(name) else {
                    continue;
                };
                let k = g.per_domain.key;
                let (a, b) = (at(&old, k), at(&new, k));
                if a != b {
                    g.per_domain.bump(a, -n);
                    g.per_domain.bump(b, n);
                }
            }
        }
        match node {
            Some(n) => {
                self.nodes.insert(name.to_owned(), n);
                self.node_domains.insert(name.to_owned(), new);
            }
            None => {
                self.nodes.remove(name);
                self.node_domains.remove(name);
            }
        }
    }

    /// Namespace labels and owners changed: every counter and group is rebuilt from `pods`
    /// (counters lazily, when next used).
    pub fn set_namespaces<'a>(
        &mut self,
        namespaces: HashMap<String, Labels>,
        owners: HashMap<String, String>,
        pods: impl Iterator<Item = (&'a str, &'a Pod, &'a str)>,
    ) {
        if namespaces == self.namespaces && owners == self.owners {
            return;
        }
        self.namespaces = namespaces;
        self.owners = owners;
        self.counters.clear();
        self.free_counters.clear();
        self.counter_ids.clear();
        self.counters_by_ns.clear();
        self.groups.clear();
        self.free_groups.clear();
        self.group_ids.clear();
        self.groups_by_ns.clear();
        self.pod_groups.clear();
        for (key, pod, node) in pods {
            if counts(pod) && pod.spec.as_ref().is_some_and(|s| s.affinity.is_some()) {
                self.add_pod(key, pod, node);
            }
        }
    }

    /// Drops counters no cycle used for [`IDLE_TICKS`] ticks; call once a second.
    pub fn tick(&mut self) {
        self.tick += 1;
        let tick = self.tick;
        for id in 0..self.counters.len() {
            let idle = self.counters[id]
                .as_ref()
                .is_some_and(|c| tick - c.last_used > IDLE_TICKS);
            if !idle {
                continue;
            }
            let c = self.counters[id].take().expect("live counter");
            if let Some(first) = c.what.0.first() {
                for ns in &first.namespaces {
                    if let Some(v) = self.counters_by_ns.get_mut(ns) {
                        v.retain(|x| *x != id);
                        if v.is_empty() {
                            self.counters_by_ns.remove(ns);
                        }
                    }
                }
            }
            self.counter_ids.remove(&c.what);
            self.free_counters.push(id);
        }
    }

    /// Live counters and groups (for metrics and tests).
    pub fn sizes(&self) -> (usize, usize) {
        (self.counter_ids.len(), self.group_ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const ZONE: &str = "zone";

    fn node(name: &str, zone: Option<u8>) -> Arc<Node> {
        let labels = match zone {
            Some(z) => json!({ ZONE: format!("z{z}") }),
            None => json!({}),
        };
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("node"),
        )
    }

    fn pod(i: u8, app: u8, anti: bool, dying: bool) -> Pod {
        let mut p = json!({"metadata": {"name": format!("p{i}"), "namespace": "ns",
            "labels": {"app": format!("a{app}")}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}});
        if anti {
            p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                [{"labelSelector": {"matchLabels": {"app": "a0"}}, "topologyKey": ZONE}]}});
        }
        if dying {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(p).expect("pod")
    }

    fn app(a: u8) -> Match {
        Match(vec![Clause {
            namespaces: BTreeSet::from(["ns".to_owned()]),
            selector: Some(LabelSelector::from_requirements(vec![Requirement {
                key: "app".into(),
                operator: Operator::Equals,
                values: vec![format!("a{a}")],
            }])),
        }])
    }

    #[derive(Debug, Clone)]
    enum Op {
        Node(u8, Option<u8>),
        NodeGone(u8),
        Add(u8, u8, u8, bool, bool),
        Remove(u8),
        Counter(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..5, proptest::option::of(0u8..3)).prop_map(|(n, z)| Op::Node(n, z)),
            (0u8..5).prop_map(Op::NodeGone),
            (0u8..16, 0u8..6, 0u8..2, any::<bool>(), any::<bool>())
                .prop_map(|(p, n, a, anti, dying)| Op::Add(p, n, a, anti, dying)),
            (0u8..16).prop_map(Op::Remove),
            (0u8..2).prop_map(Op::Counter),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever pods and nodes do, in whatever order, and whenever a counter is created,
        /// each counter's per-node and per-domain counts and each group's per-domain count
        /// equal a count from scratch over the live pods and nodes.
        #[test]
        fn counters_equal_a_recount(ops in proptest::collection::vec(op(), 1..120)) {
            let mut t = Topology::new();
            let mut pods: HashMap<String, (Pod, String)> = HashMap::new();
            let mut nodes: HashMap<String, Option<u8>> = HashMap::new();
            let mut made: Vec<u8> = Vec::new();
            for op in ops {
                match op {
                    Op::Node(n, z) => {
                        let name = format!("n{n}");
                        t.set_node(&name, Some(node(&name, z)));
                        nodes.insert(name, z);
                    }
                    Op::NodeGone(n) => {
                        let name = format!("n{n}");
                        t.set_node(&name, None);
                        nodes.remove(&name);
                    }
                    Op::Add(p, n, a, anti, dying) => {
                        let key = format!("ns/p{p}");
                        if let Some((old, on)) = pods.remove(&key) {
                            t.remove_pod(&key, &old, &on);
                        }
                        let pd = pod(p, a, anti, dying);
                        let on = format!("n{n}");
                        t.add_pod(&key, &pd, &on);
                        pods.insert(key, (pd, on));
                    }
                    Op::Remove(p) => {
                        let key = format!("ns/p{p}");
                        if let Some((old, on)) = pods.remove(&key) {
                            t.remove_pod(&key, &old, &on);
                        }
                    }
                    Op::Counter(a) => {
                        let all = pods.values().map(|(p, n)| (p, n.as_str()));
                        t.ensure_counter(&app(a), ZONE, all);
                        if !made.contains(&a) {
                            made.push(a);
                        }
                    }
                }
                let zone_of = |n: &str| nodes.get(n).copied().flatten().map(|z| format!("z{z}"));
                for &a in &made {
                    let id = t.counter(&app(a)).expect("counter kept");
                    let mut per_node: HashMap<String, i64> = HashMap::new();
                    let mut per_zone: HashMap<String, i64> = HashMap::new();
                    for (p, n) in pods.values() {
                        if counts(p) && app(a).matches("ns", pod_labels(p)) {
                            *per_node.entry(n.clone()).or_insert(0) += 1;
                            if let Some(z) = zone_of(n) {
                                *per_zone.entry(z).or_insert(0) += 1;
                            }
                        }
                    }
                    prop_assert_eq!(t.per_node(id), &per_node);
                    prop_assert_eq!(t.total(id), per_node.values().sum::<i64>());
                    prop_assert_eq!(t.per_domain(id, ZONE).expect("zone kept"), per_zone);
                }
                // The anti-affinity group (selecting app=a0) per zone: its carriers.
                let mut carriers: HashMap<String, i64> = HashMap::new();
                for (p, n) in pods.values() {
                    let carries = p.spec.as_ref().is_some_and(|s| s.affinity.is_some());
                    if counts(p) && carries && let Some(z) = zone_of(n) {
                        *carriers.entry(z).or_insert(0) += 1;
                    }
                }
                let a0 = Labels::from([("app".to_owned(), "a0".to_owned())]);
                let groups: Vec<usize> = t.groups_matching("ns", &a0).map(|(g, _)| g).collect();
                prop_assert!(groups.len() <= 1);
                let got = groups.first().map(|g| t.group_domains(*g)).unwrap_or_default();
                prop_assert_eq!(got, carriers);
                // Live nodes per zone.
                if t.key_domains(ZONE).is_some() {
                    let mut want: HashMap<String, u32> = HashMap::new();
                    for z in nodes.values().flatten() {
                        *want.entry(format!("z{z}")).or_insert(0) += 1;
                    }
                    prop_assert_eq!(t.key_domains(ZONE).expect("kept"), want.clone());
                    let k = t.key_id(ZONE).expect("registered");
                    prop_assert_eq!(t.nodes_with_key(k), nodes.values().flatten().count());
                    prop_assert_eq!(t.live_domains(k), want.len());
                    // Each live node's domain id stands for its zone.
                    for (name, z) in &nodes {
                        let d = t.node_domain_ids(name).get(k).copied().unwrap_or(NO_DOMAIN);
                        match z {
                            None => prop_assert_eq!(d, NO_DOMAIN),
                            Some(z) => prop_assert_eq!(
                                t.keys[k].ids.get(&format!("z{z}")).copied(),
                                Some(d)
                            ),
                        }
                    }
                }
            }
        }
    }
}
