//! Fair sharing between tenants: which tenant's queue the next pod comes from.
//!
//! Each Tenant (`tessera.io/v1alpha1`, owning namespaces, with a weight) has its own active
//! queue; the namespaces no Tenant owns share one more, [`NO_TENANT`]. The dispatcher picks
//! the tenant with the lowest *weighted dominant share* (Ghodsi et al., "Dominant Resource
//! Fairness", NSDI 2011; Mesos' DRF sorter): a tenant's share of a resource is what its pods
//! on this shard request of it divided by the shard's allocatable, its dominant share the
//! largest of those over cpu, memory and pod slots, divided by its weight. Pod slots count so
//! that pods requesting nothing are not free. Ties go round robin (the tenant served longest
//! ago first).
//!
//! The tenants with pods ready to schedule are kept ordered by (share, last served), so a
//! pick is O(log tenants) and a change of one tenant's usage re-sorts only that tenant: no
//! work per pending pod, and none per idle tenant.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::resources::Resources;

use super::Sizes;

/// The queue of pods whose namespace no Tenant owns (the name kubectl shows for nothing).
pub const NO_TENANT: &str = "<none>";

/// What dominant shares are computed over: cpu (millicores), memory (bytes) and pod slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Millicores.
    pub milli_cpu: i64,
    /// Bytes.
    pub memory: i64,
    /// Pods (slots).
    pub pods: i64,
}

impl Usage {
    /// The cpu, memory and pods of `r`.
    pub fn of(r: &Resources) -> Usage {
        Usage {
            milli_cpu: r.milli_cpu,
            memory: r.memory,
            pods: r.pods,
        }
    }

    /// `self += sign * o`.
    pub fn add(&mut self, o: Usage, sign: i64) {
        self.milli_cpu += sign * o.milli_cpu;
        self.memory += sign * o.memory;
        self.pods += sign * o.pods;
    }

    /// The largest of the fractions `self / of`, over the resources `of` has.
    pub(crate) fn dominant(&self, of: &Usage) -> f64 {
        let frac = |used: i64, total: i64| {
            if total > 0 {
                used.max(0) as f64 / total as f64
            } else {
                0.0
            }
        };
        frac(self.milli_cpu, of.milli_cpu)
            .max(frac(self.memory, of.memory))
            .max(frac(self.pods, of.pods))
    }
}

/// A tenant as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSpec {
    /// Its name.
    pub name: String,
    /// Its relative share (`spec.weight`, at least 1).
    pub weight: u32,
    /// The namespaces it owns.
    pub namespaces: Vec<String>,
}

/// One tenant's standing (also what metrics and `bench scheduler` read).
#[derive(Clone, Debug, PartialEq)]
pub struct Standing {
    /// The tenant ([`NO_TENANT`] for namespaces without one).
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// What its pods on the shard request.
    pub usage: Usage,
    /// Its weighted dominant share.
    pub share: f64,
    /// Its pods in the queue, by place.
    pub sizes: Sizes,
}

struct Tenant {
    name: String,
    weight: u32,
    usage: Usage,
    /// Its key in `ready` while it has pods ready to schedule.
    ready: Option<(u64, u64)>,
    served: u64,
    sizes: Sizes,
}

/// The tenants, their usage and the order the dispatcher serves them in.
pub(super) struct Fair {
    /// Index 0 is [`NO_TENANT`]; indexes are stable (a deleted Tenant keeps its slot,
    /// owning nothing, and is reused if it comes back).
    tenants: Vec<Tenant>,
    by_name: HashMap<String, u32>,
    /// Namespace → tenant, shared with [`FairView`]s (replaced whole when Tenants change).
    owner: Arc<HashMap<String, u32>>,
    ns_usage: HashMap<String, Usage>,
    capacity: Usage,
    ready: BTreeSet<(u64, u64, u32)>,
    served_seq: u64,
}

impl Fair {
    pub(super) fn new() -> Fair {
        let mut f = Fair {
            tenants: Vec::new(),
            by_name: HashMap::new(),
            owner: Arc::default(),
            ns_usage: HashMap::new(),
            capacity: Usage::default(),
            ready: BTreeSet::new(),
            served_seq: 0,
        };
        f.slot(NO_TENANT, 1);
        f
    }

    fn slot(&mut self, name: &str, weight: u32) -> u32 {
        if let Some(&i) = self.by_name.get(name) {
            self.tenants[i as usize].weight = weight;
            return i;
        }
        let i = self.tenants.len() as u32;
        self.tenants.push(Tenant {
            name: name.to_owned(),
            weight,
            usage: Usage::default(),
            ready: None,
            served: 0,
            sizes: Sizes::default(),
        });
        self.by_name.insert(name.to_owned(), i);
        i
    }

    /// How many tenant slots exist (queues are indexed by them).
    pub(super) fn len(&self) -> usize {
        self.tenants.len()
    }

    /// The name of tenant `i`.
    pub(super) fn name(&self, i: u32) -> &str {
        &self.tenants[i as usize].name
    }

    /// The tenant that owns namespace `ns`.
    pub(super) fn tenant_of(&self, ns: &str) -> u32 {
        self.owner.get(ns).copied().unwrap_or(0)
    }

    fn share(&self, t: &Tenant) -> f64 {
        t.usage.dominant(&self.capacity) / f64::from(t.weight.max(1))
    }

    fn key(&self, i: u32) -> (u64, u64) {
        let t = &self.tenants[i as usize];
        // Non-negative floats order as their bits do.
        (self.share(t).to_bits(), t.served)
    }

    fn rekey(&mut self, i: u32) {
        let Some(old) = self.tenants[i as usize].ready else {
            return;
        };
        let new = self.key(i);
        if new != old {
            self.ready.remove(&(old.0, old.1, i));
            self.ready.insert((new.0, new.1, i));
            self.tenants[i as usize].ready = Some(new);
        }
    }

    /// Tenant `i` has pods ready to schedule.
    pub(super) fn mark_ready(&mut self, i: u32) {
        if self.tenants[i as usize].ready.is_none() {
            let k = self.key(i);
            self.ready.insert((k.0, k.1, i));
            self.tenants[i as usize].ready = Some(k);
        }
    }

    /// Tenant `i` has no pod ready to schedule.
    pub(super) fn unready(&mut self, i: u32) {
        if let Some(k) = self.tenants[i as usize].ready.take() {
            self.ready.remove(&(k.0, k.1, i));
        }
    }

    /// The ready tenant to serve next: the lowest weighted dominant share, then the one
    /// served longest ago.
    pub(super) fn next(&self) -> Option<u32> {
        self.ready.first().map(|k| k.2)
    }

    /// Tenant `i` was just served: among equal shares it goes last.
    pub(super) fn served(&mut self, i: u32) {
        self.served_seq += 1;
        self.tenants[i as usize].served = self.served_seq;
        self.rekey(i);
    }

    /// A pod of namespace `ns` started (`sign` 1) or stopped (-1) counting on a node.
    pub(super) fn charge(&mut self, ns: &str, u: Usage, sign: i64) {
        match self.ns_usage.get_mut(ns) {
            Some(x) => x.add(u, sign),
            None => {
                let mut x = Usage::default();
                x.add(u, sign);
                self.ns_usage.insert(ns.to_owned(), x);
            }
        }
        let i = self.tenant_of(ns);
        self.tenants[i as usize].usage.add(u, sign);
        self.rekey(i);
    }

    /// The shard's allocatable changed.
    pub(super) fn set_capacity(&mut self, c: Usage) {
        if c == self.capacity {
            return;
        }
        self.capacity = c;
        let ready: Vec<u32> = self.ready.iter().map(|k| k.2).collect();
        for i in ready {
            self.rekey(i);
        }
    }

    /// The Tenants now (all of them): owners and weights change; usage is recounted from
    /// what each namespace uses. Returns true if any namespace changed owner.
    pub(super) fn set_tenants(&mut self, specs: &[TenantSpec]) -> bool {
        let mut owner = HashMap::new();
        let mut listed = vec![false; self.tenants.len() + specs.len()];
        for s in specs {
            let i = self.slot(&s.name, s.weight.max(1));
            listed[i as usize] = true;
            for ns in &s.namespaces {
                owner.entry(ns.clone()).or_insert(i);
            }
        }
        // Tenants no longer listed keep their slot with weight 1 and no namespaces.
        for (t, listed) in self.tenants.iter_mut().zip(&listed).skip(1) {
            if !listed {
                t.weight = 1;
            }
        }
        let moved = owner != *self.owner;
        if moved {
            self.owner = Arc::new(owner);
            for t in &mut self.tenants {
                t.usage = Usage::default();
            }
            let usages: Vec<(u32, Usage)> = self
                .ns_usage
                .iter()
                .map(|(ns, u)| (self.tenant_of(ns), *u))
                .collect();
            for (i, u) in usages {
                self.tenants[i as usize].usage.add(u, 1);
            }
        }
        // Weights (and with moves, usage) changed: re-sort the ready tenants.
        let ready: Vec<u32> = self.ready.iter().map(|k| k.2).collect();
        for i in ready {
            self.rekey(i);
        }
        moved
    }

    /// The queue sizes of tenant `i`, to be kept by the queue.
    pub(super) fn sizes_mut(&mut self, i: u32) -> &mut Sizes {
        &mut self.tenants[i as usize].sizes
    }

    /// Clears every tenant's sizes (before a recount).
    pub(super) fn clear_sizes(&mut self) {
        for t in &mut self.tenants {
            t.sizes = Sizes::default();
        }
    }

    /// Every tenant's standing.
    pub(super) fn standings(&self) -> Vec<Standing> {
        self.tenants
            .iter()
            .map(|t| Standing {
                name: t.name.clone(),
                weight: t.weight,
                usage: t.usage,
                share: self.share(t),
                sizes: t.sizes,
            })
            .collect()
    }

    /// Who owns which namespace and every tenant's weighted dominant share, now.
    pub(super) fn view(&self) -> FairView {
        FairView {
            owner: self.owner.clone(),
            shares: self.tenants.iter().map(|t| self.share(t)).collect(),
        }
    }
}

/// Who owns which namespace and each tenant's weighted dominant share, at one moment: what
/// preemption across tenants is decided on.
#[derive(Clone, Debug, Default)]
pub struct FairView {
    owner: Arc<HashMap<String, u32>>,
    shares: Vec<f64>,
}

impl FairView {
    /// The tenant owning `ns` (0: no tenant).
    pub fn tenant(&self, ns: &str) -> u32 {
        self.owner.get(ns).copied().unwrap_or(0)
    }

    /// Tenant `t`'s weighted dominant share.
    pub fn share(&self, t: u32) -> f64 {
        self.shares.get(t as usize).copied().unwrap_or(0.0)
    }

    /// A view of tenants of `shares` (by index) owning `(namespace, tenant index)` (for
    /// tests).
    pub fn of(shares: &[f64], owners: &[(&str, u32)]) -> FairView {
        FairView {
            owner: Arc::new(owners.iter().map(|(n, t)| ((*n).to_owned(), *t)).collect()),
            shares: shares.to_vec(),
        }
    }
}
