//! The two measurements of `bench federation` that need no running shards: how fast the
//! federation routes (its placement code alone, over a snapshot of S shards' summaries), and
//! how much of a fleet it fills compared with one ideal global pool.
//!
//! Utilization: a mixed workload (small and large pods, whole gangs) from many tenants, more
//! than the fleet holds, is offered in one order twice — through the federation's placement
//! (home shard with spill-over; gangs `Whole`) onto S shards whose nodes take their shares
//! best-fit, each shard's summary rebuilt from its nodes after every decision; and onto one
//! pool of every node, best-fit. Placed resources sharded ÷ global is the figure. The shards'
//! real schedulers are not in it (they spread rather than pack): it measures what splitting
//! the pool and routing by summaries costs, not the shard scheduler's packing.

use std::collections::BTreeMap;
use std::time::Instant;

use tessera_placement::{
    Decision, Mode, Policy, Request, ShardMap, ShardState, ShardWeight, Snapshot, Summary,
    SummaryBuilder, Workload,
};

/// Every node's allocatable: 8 cpu, 32 GiB, 110 pods.
pub const NODE: [u64; 3] = [8_000, 32 << 30, 110];

/// A small deterministic generator (the same workload every run).
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// The next value (xorshift64*).
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One workload of the mix.
#[derive(Clone, Debug)]
pub struct Item {
    /// Its tenant.
    pub tenant: String,
    /// cpu (millicores) and memory (bytes) per replica.
    pub cpu: u64,
    /// Memory per replica.
    pub memory: u64,
    /// Replicas.
    pub replicas: u64,
    /// All replicas in one shard or none (a gang).
    pub gang: bool,
}

/// A mix of small pods (70%), large pods (25%) and gangs (5%) from `tenants` tenants, until
/// it asks for `overcommit` × the cpu of `nodes` nodes.
pub fn mix(tenants: usize, nodes: u64, overcommit: f64, seed: u64) -> Vec<Item> {
    let mut rng = Rng::new(seed);
    let want = (nodes as f64 * NODE[0] as f64 * overcommit) as u64;
    let mut asked = 0;
    let mut out = Vec::new();
    while asked < want {
        let tenant = format!("t-{}", rng.range(0, tenants.max(1) as u64 - 1));
        let kind = rng.range(0, 99);
        let item = if kind < 70 {
            Item {
                tenant,
                cpu: rng.range(1, 8) * 125,
                memory: rng.range(1, 8) << 28,
                replicas: rng.range(1, 20),
                gang: false,
            }
        } else if kind < 95 {
            Item {
                tenant,
                cpu: rng.range(4, 12) * 500,
                memory: rng.range(8, 24) << 30,
                replicas: rng.range(1, 5),
                gang: false,
            }
        } else {
            Item {
                tenant,
                cpu: rng.range(2, 8) * 500,
                memory: rng.range(2, 16) << 30,
                replicas: rng.range(4, 32),
                gang: true,
            }
        };
        asked += item.cpu * item.replicas;
        out.push(item);
    }
    out
}

/// Nodes as classes of the same free room: (cpu, memory, pods) free → how many nodes.
/// Nodes start alike and pods come in few sizes, so there are far fewer classes than nodes.
#[derive(Clone, Debug)]
pub struct Pool {
    classes: BTreeMap<[u64; 3], u64>,
}

impl Pool {
    /// `nodes` empty nodes.
    pub fn new(nodes: u64) -> Pool {
        Pool {
            classes: BTreeMap::from([(NODE, nodes)]),
        }
    }

    /// The node class where `req` leaves the least room (cpu and memory as fractions of a
    /// node), if any fits.
    fn best_fit(&self, req: [u64; 3]) -> Option<[u64; 3]> {
        let mut best: Option<(f64, [u64; 3])> = None;
        for (free, n) in &self.classes {
            if *n == 0 || free.iter().zip(&req).any(|(f, r)| f < r) {
                continue;
            }
            let left = (free[0] - req[0]) as f64 / NODE[0] as f64
                + (free[1] - req[1]) as f64 / NODE[1] as f64;
            if best.is_none_or(|(b, _)| left < b) {
                best = Some((left, *free));
            }
        }
        best.map(|(_, k)| k)
    }

    /// Places up to `n` replicas of `req`, each on the best-fitting node; how many it placed.
    pub fn place(&mut self, req: [u64; 3], n: u64) -> u64 {
        for placed in 0..n {
            let Some(k) = self.best_fit(req) else {
                return placed;
            };
            let c = self.classes.get_mut(&k).expect("found above");
            *c -= 1;
            if *c == 0 {
                self.classes.remove(&k);
            }
            let after = [k[0] - req[0], k[1] - req[1], k[2] - req[2]];
            *self.classes.entry(after).or_insert(0) += 1;
        }
        n
    }

    /// Places all `n` or none.
    pub fn place_all(&mut self, req: [u64; 3], n: u64) -> bool {
        let mut trial = self.clone();
        if trial.place(req, n) == n {
            *self = trial;
            true
        } else {
            false
        }
    }

    /// Its capacity summary, as a shard's agent would send it.
    pub fn summary(&self, version: u64) -> Summary {
        let mut b = SummaryBuilder::new(&[]);
        for (free, n) in &self.classes {
            b.nodes_alike(&NODE, free, *n);
        }
        b.build(version)
    }
}

/// A snapshot of `shards` equal shards of `nodes` empty nodes each.
pub fn snapshot(shards: usize, nodes: u64) -> (Snapshot, Vec<String>) {
    let names: Vec<String> = (0..shards).map(|i| format!("shard-{i}")).collect();
    let weights: Vec<ShardWeight> = names
        .iter()
        .map(|n| ShardWeight::new(n.clone(), tessera_placement::map::VNODES))
        .collect();
    let map = ShardMap::new(1, &weights).expect("valid names");
    let summary = Pool::new(nodes).summary(1);
    let shards = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                ShardState {
                    ready: true,
                    summary: Some(summary.clone()),
                    ..ShardState::default()
                },
            )
        })
        .collect();
    (Snapshot { map, shards }, names)
}

fn policy(item: &Item) -> Policy {
    Policy {
        mode: if item.gang { Mode::Whole } else { Mode::Home },
        ..Policy::default()
    }
}

/// What the utilization run found.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fill {
    /// cpu placed through the federation, millicores.
    pub sharded_cpu: u64,
    /// Memory placed through the federation.
    pub sharded_memory: u64,
    /// cpu placed on the global pool.
    pub global_cpu: u64,
    /// Memory placed on the global pool.
    pub global_memory: u64,
    /// Fleet cpu.
    pub capacity_cpu: u64,
    /// Workloads offered.
    pub workloads: usize,
}

/// Offers `items` to `shards` × `nodes` through the federation and to one pool, best-fit.
pub fn utilization(shards: usize, nodes: u64, items: &[Item]) -> Fill {
    let mut fill = Fill {
        capacity_cpu: shards as u64 * nodes * NODE[0],
        workloads: items.len(),
        ..Fill::default()
    };
    let mut global = Pool::new(shards as u64 * nodes);
    for it in items {
        let req = [it.cpu, it.memory, 1];
        let placed = if it.gang {
            if global.place_all(req, it.replicas) {
                it.replicas
            } else {
                0
            }
        } else {
            global.place(req, it.replicas)
        };
        fill.global_cpu += placed * it.cpu;
        fill.global_memory += placed * it.memory;
    }
    let (mut snap, names) = snapshot(shards, nodes);
    let mut pools: BTreeMap<String, Pool> = names
        .iter()
        .map(|n| (n.clone(), Pool::new(nodes)))
        .collect();
    let none = BTreeMap::new();
    let mut version = 1;
    for it in items {
        let request = Request::cpu_memory(it.cpu, it.memory);
        let w = Workload {
            tenant: &it.tenant,
            replicas: it.replicas,
            request: &request,
            current: &none,
        };
        let d: Decision = snap.place(&w, &policy(it));
        let req = [it.cpu, it.memory, 1];
        version += 1;
        for (shard, n) in &d.shares {
            let pool = pools.get_mut(shard).expect("a known shard");
            let placed = if it.gang {
                if pool.place_all(req, *n) { *n } else { 0 }
            } else {
                pool.place(req, *n)
            };
            fill.sharded_cpu += placed * it.cpu;
            fill.sharded_memory += placed * it.memory;
            if let Some(s) = snap.shards.get_mut(shard) {
                s.summary = Some(pool.summary(version));
            }
        }
    }
    fill
}

/// How many decisions commit into one snapshot before the shards' next summaries replace it.
const SUMMARY_EVERY: usize = 10_000;

/// Routing alone: `decisions` placements of workloads from `tenants` tenants on a snapshot
/// of `shards` shards of `nodes` nodes, each decision committed (its room reserved in the
/// snapshot, as the federation does until the shard reports it), the summaries renewed every
/// 10,000 decisions (as shards report; without it a long run fills the fleet and measures
/// only "fits nowhere"). Decisions per second.
pub fn placements_per_sec(shards: usize, nodes: u64, tenants: usize, decisions: usize) -> f64 {
    let (mut fresh, names) = snapshot(shards, nodes);
    // Shards half full of the mix, so that summaries carry the slot histograms of busy
    // shards (one slot for empty, identical nodes would flatter the figure).
    for (i, name) in names.iter().enumerate() {
        let mut pool = Pool::new(nodes);
        let mut used = 0;
        for it in mix(tenants, nodes, 0.5, 100 + i as u64) {
            used += pool.place([it.cpu, it.memory, 1], it.replicas) * it.cpu;
            if used * 2 >= nodes * NODE[0] {
                break;
            }
        }
        if let Some(s) = fresh.shards.get_mut(name) {
            s.summary = Some(pool.summary(1));
        }
    }
    let fresh_summaries: Vec<(String, ShardState)> = fresh
        .shards
        .iter()
        .map(|(n, s)| (n.clone(), s.clone()))
        .collect();
    let mut snap = fresh;
    let mut rng = Rng::new(11);
    let requests: Vec<(String, Request, u64, bool)> = (0..decisions.min(10_000))
        .map(|_| {
            let t = format!("t-{}", rng.range(0, tenants.max(1) as u64 - 1));
            let r = Request::cpu_memory(rng.range(1, 8) * 125, rng.range(1, 8) << 28);
            (t, r, rng.range(1, 5), rng.range(0, 19) == 0)
        })
        .collect();
    let none = BTreeMap::new();
    let started = Instant::now();
    let mut placed = 0u64;
    for i in 0..decisions {
        let (tenant, request, replicas, gang) = &requests[i % requests.len()];
        let w = Workload {
            tenant,
            replicas: *replicas,
            request,
            current: &none,
        };
        let p = Policy {
            mode: if *gang { Mode::Whole } else { Mode::Home },
            ..Policy::default()
        };
        if i > 0 && i % SUMMARY_EVERY == 0 {
            for (n, s) in &fresh_summaries {
                snap.shards.insert(n.clone(), s.clone());
            }
        }
        let d = snap.place(&w, &p);
        snap.commit(&w, &d);
        placed += d.shares.values().sum::<u64>();
    }
    let secs = started.elapsed().as_secs_f64();
    std::hint::black_box(placed);
    decisions as f64 / secs.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_packs_best_fit_and_refuses_what_does_not_fit() {
        let mut p = Pool::new(2);
        // 6 cpu then 2 cpu: best fit puts the 2 beside the 6, leaving a whole node.
        assert_eq!(p.place([6_000, 1 << 30, 1], 1), 1);
        assert_eq!(p.place([2_000, 1 << 30, 1], 1), 1);
        assert_eq!(p.place([8_000, 1 << 30, 1], 1), 1, "a whole node is left");
        assert_eq!(p.place([1_000, 1 << 30, 1], 3), 0, "nothing is left");
        let mut g = Pool::new(1);
        assert!(!g.place_all([3_000, 1 << 30, 1], 3), "a gang of 9 cpu on 8");
        assert_eq!(g.summary(1).free[0], 8_000, "a refused gang takes nothing");
        assert!(g.place_all([2_000, 1 << 30, 1], 4));
        assert_eq!(g.summary(2).free[0], 0);
    }

    #[test]
    fn the_federation_never_places_more_than_the_global_pool_holds() {
        let items = mix(50, 4 * 20, 1.3, 3);
        let f = utilization(4, 20, &items);
        assert!(f.global_cpu <= f.capacity_cpu);
        assert!(f.sharded_cpu <= f.capacity_cpu);
        assert!(f.global_cpu > f.capacity_cpu / 2, "{f:?}");
        // Both are near full; the figure is their ratio.
        assert!(f.sharded_cpu > 0, "{f:?}");
    }

    #[test]
    fn the_mix_is_the_same_every_run_and_asks_for_more_than_the_fleet() {
        let a = mix(10, 10, 1.2, 5);
        let b = mix(10, 10, 1.2, 5);
        assert_eq!(a.len(), b.len());
        let asked: u64 = a.iter().map(|i| i.cpu * i.replicas).sum();
        assert!(asked >= 10 * NODE[0] * 12 / 10);
        assert!(a.iter().any(|i| i.gang) || a.len() < 20);
    }
}
