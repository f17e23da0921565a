//! A shard's capacity, as its federation agent reports it: totals per resource and a
//! histogram of free **slots** (nodes grouped by what they have free), so that "how many
//! replicas of this size fit here" is answered without a node list.
//!
//! Amounts are integers in base units: `cpu` in millicores, `memory` and storage in bytes,
//! `pods` and extended resources (`nvidia.com/gpu`) in units. A slot's amounts are **lower
//! bounds** of what each of its nodes has free: exact while the node shapes fit in
//! [`MAX_SLOTS`], rounded down to fewer significant bits when they do not, so a fit computed
//! from slots never exceeds what the shard really has.

use std::collections::BTreeMap;

/// Significant bits kept of each slot amount at the first level of rounding: a node's free
/// amount is then under-counted by less than 1/64 (1.6 %).
pub const SIGNIFICANT_BITS: u32 = 6;

/// Most slots a summary carries: past this, amounts are rounded more coarsely until the
/// slots fit (a 5,000-node shard of one node shape has a few dozen).
pub const MAX_SLOTS: usize = 512;

/// Most groups (distinct values of the summary's node label keys) a summary carries: past
/// this, it carries none, and requests naming those labels are judged by the whole shard.
pub const MAX_GROUPS: usize = 64;

/// The resources every summary carries first, in this order.
pub const BASE_RESOURCES: [&str; 3] = ["cpu", "memory", "pods"];

/// Nodes with the same free amounts (after rounding down).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slot {
    /// What each of these nodes has free at least, per resource of the summary.
    pub free: Vec<u64>,
    /// How many nodes.
    pub count: u64,
}

/// A shard's capacity at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The resources, [`BASE_RESOURCES`] first, then extended ones by name.
    pub resources: Vec<String>,
    /// Allocatable totals per resource (schedulable nodes only).
    pub allocatable: Vec<u64>,
    /// Free totals per resource (exact).
    pub free: Vec<u64>,
    /// Free slots, sorted; counts add up to the schedulable nodes.
    pub slots: Vec<Slot>,
    /// Ready, schedulable nodes.
    pub nodes: u64,
    /// Bumped by the shard at every new summary: a stale or repeated one is recognised.
    pub version: u64,
    /// The node label keys the shard groups its nodes by (`topology.kubernetes.io/zone`),
    /// so that a replica that must run on some of them (a `nodeSelector`, a required node
    /// affinity) is judged by the room of those nodes alone. Empty: no groups.
    pub group_keys: Vec<String>,
    /// One group per distinct tuple of values of `group_keys` among the schedulable nodes
    /// (`""` for a node without the label); their nodes add up to `nodes`.
    pub groups: Vec<Group>,
    /// The shard's process nodes: tainted `tessera.io/runtime=process:NoSchedule`, so not
    /// counted above, and room only for a replica that must run on one (its `on` asks for
    /// `tessera.io/runtime: process`). Same resources, no groups, no pool of its own.
    pub process: Option<Box<Summary>>,
}

/// The label (and taint key) of process nodes, and its value.
pub const PROCESS_LABEL: (&str, &str) = ("tessera.io/runtime", "process");

/// For a replica that must run on process nodes (`on` asks for [`PROCESS_LABEL`] only), the
/// rest of `on`: it is judged by the shard's process pool.
pub fn on_process_nodes(on: &[(String, Vec<String>)]) -> Option<Vec<(String, Vec<String>)>> {
    let (key, value) = PROCESS_LABEL;
    on.iter()
        .any(|(k, vs)| k == key && vs.len() == 1 && vs[0] == value)
        .then(|| on.iter().filter(|(k, _)| k != key).cloned().collect())
}

/// The schedulable nodes of a shard with the same values of the summary's group keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// One value per group key (`""`: the node lacks that label).
    pub values: Vec<String>,
    /// Their capacity, over the same resources as the shard's (no groups of its own).
    pub summary: Summary,
}

/// Rounds `v` down for coarseness `level`: 0 keeps it exact (a shard of a few dozen node
/// shapes loses nothing: a 4-cpu pod still fits a node with exactly 4 cpu free), level `k ≥ 1`
/// keeps `SIGNIFICANT_BITS + 1 - k` significant bits (at least one).
pub fn round_down(v: u64, level: u32) -> u64 {
    if level == 0 {
        return v;
    }
    let keep = (SIGNIFICANT_BITS + 1).saturating_sub(level).max(1);
    let bits = 64 - v.leading_zeros();
    if bits <= keep {
        return v;
    }
    let drop = bits - keep;
    (v >> drop) << drop
}

/// The coarsest level [`round_down`] goes to.
const MAX_LEVEL: u32 = SIGNIFICANT_BITS + 1;

/// Groups `nodes` (free amounts each) into at most [`MAX_SLOTS`] slots, exact if they fit,
/// rounded down level by level until they do.
fn group<'a>(nodes: impl Iterator<Item = (&'a [u64], u64)> + Clone) -> Vec<Slot> {
    let mut level = 0;
    loop {
        let mut by: BTreeMap<Vec<u64>, u64> = BTreeMap::new();
        for (free, count) in nodes.clone() {
            let key: Vec<u64> = free.iter().map(|v| round_down(*v, level)).collect();
            *by.entry(key).or_default() += count;
        }
        if by.len() <= MAX_SLOTS || level >= MAX_LEVEL {
            return by
                .into_iter()
                .map(|(free, count)| Slot { free, count })
                .collect();
        }
        level += 1;
    }
}

/// Builds a summary from nodes, each as (allocatable, free) per resource in `resources`.
#[derive(Debug)]
pub struct SummaryBuilder {
    resources: Vec<String>,
    allocatable: Vec<u64>,
    free: Vec<u64>,
    /// Free amounts of nodes alike, and how many.
    nodes: Vec<(Vec<u64>, u64)>,
    count: u64,
    /// The label keys nodes are grouped by, and a builder per tuple of their values.
    group_keys: Vec<String>,
    groups: BTreeMap<Vec<String>, SummaryBuilder>,
}

impl SummaryBuilder {
    /// A builder for `extended` resources besides the base ones.
    pub fn new(extended: &[&str]) -> Self {
        let resources: Vec<String> = BASE_RESOURCES
            .iter()
            .chain(extended)
            .map(|s| (*s).to_owned())
            .collect();
        let n = resources.len();
        SummaryBuilder {
            resources,
            allocatable: vec![0; n],
            free: vec![0; n],
            nodes: Vec::new(),
            count: 0,
            group_keys: Vec::new(),
            groups: BTreeMap::new(),
        }
    }

    /// Groups the nodes added with [`SummaryBuilder::node_in`] by these label keys.
    pub fn group_by(mut self, keys: &[String]) -> Self {
        self.group_keys = keys.to_vec();
        self
    }

    /// The keys nodes are grouped by.
    pub fn group_keys(&self) -> &[String] {
        &self.group_keys
    }

    /// Adds one schedulable node whose group-key labels have `values` (one per key, `""`
    /// for a missing label).
    pub fn node_in(&mut self, values: &[String], allocatable: &[u64], free: &[u64]) {
        self.nodes_alike(allocatable, free, 1);
        if self.group_keys.is_empty() {
            return;
        }
        let ext: Vec<&str> = self.resources[BASE_RESOURCES.len()..]
            .iter()
            .map(String::as_str)
            .collect();
        self.groups
            .entry(values.to_vec())
            .or_insert_with(|| SummaryBuilder::new(&ext))
            .nodes_alike(allocatable, free, 1);
    }

    /// The index of resource `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.resources.iter().position(|r| r == name)
    }

    /// Adds one schedulable node: its allocatable and free amounts per resource (free is
    /// clamped to 0 when requests exceed allocatable).
    pub fn node(&mut self, allocatable: &[u64], free: &[u64]) {
        self.nodes_alike(allocatable, free, 1);
    }

    /// Adds `count` schedulable nodes with the same allocatable and free amounts.
    pub fn nodes_alike(&mut self, allocatable: &[u64], free: &[u64], count: u64) {
        if count == 0 {
            return;
        }
        for i in 0..self.resources.len() {
            self.allocatable[i] += allocatable.get(i).copied().unwrap_or(0) * count;
            self.free[i] += free.get(i).copied().unwrap_or(0) * count;
        }
        let mut f = free.to_vec();
        f.resize(self.resources.len(), 0);
        self.nodes.push((f, count));
        self.count += count;
    }

    /// The summary, as version `version`.
    pub fn build(self, version: u64) -> Summary {
        let nodes = self.count;
        let slots = group(self.nodes.iter().map(|(n, c)| (n.as_slice(), *c)));
        let (group_keys, groups) = if self.group_keys.is_empty() || self.groups.len() > MAX_GROUPS {
            (Vec::new(), Vec::new())
        } else {
            let groups = self
                .groups
                .into_iter()
                .map(|(values, b)| Group {
                    values,
                    summary: b.build(version),
                })
                .collect();
            (self.group_keys, groups)
        };
        Summary {
            resources: self.resources,
            allocatable: self.allocatable,
            free: self.free,
            slots,
            nodes,
            version,
            group_keys,
            groups,
            process: None,
        }
    }
}

/// What one replica asks for: (resource, amount) pairs; `pods: 1` is implied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Request {
    /// Amounts by resource name, in base units.
    pub amounts: Vec<(String, u64)>,
    /// Node labels a replica's node must have: each `(key, values)` asks for one of the
    /// values (a `nodeSelector` entry, a required node affinity `In`). A shard whose summary
    /// groups its nodes by a key is judged by the matching groups alone; keys it does not
    /// group by are left to its scheduler.
    pub on: Vec<(String, Vec<String>)>,
}

impl Request {
    /// A request of `cpu_milli` millicores and `memory` bytes.
    pub fn cpu_memory(cpu_milli: u64, memory: u64) -> Self {
        Request {
            amounts: vec![("cpu".into(), cpu_milli), ("memory".into(), memory)],
            on: Vec::new(),
        }
    }

    /// This request as a vector over `summary`'s resources (with `pods: 1`), or the name of
    /// a resource the summary does not have at all.
    pub fn vector_for<'a>(&'a self, summary: &Summary) -> Result<Vec<u64>, &'a str> {
        let mut v = vec![0; summary.resources.len()];
        if let Some(p) = summary.resources.iter().position(|r| r == "pods") {
            v[p] = 1;
        }
        for (name, amount) in &self.amounts {
            if *amount == 0 {
                continue;
            }
            match summary.resources.iter().position(|r| r == name) {
                Some(i) => v[i] = v[i].max(*amount),
                None => return Err(name),
            }
        }
        Ok(v)
    }

    /// A short human form: `cpu 500m, memory 1Gi`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (name, amount) in &self.amounts {
            if *amount == 0 {
                continue;
            }
            parts.push(format!("{name} {}", human(name, *amount)));
        }
        let mut out = if parts.is_empty() {
            "nothing".to_owned()
        } else {
            parts.join(", ")
        };
        for (k, vs) in &self.on {
            out.push_str(&format!(" on {k}={}", vs.join("|")));
        }
        out
    }
}

/// An amount of `resource` as Kubernetes would write it.
pub fn human(resource: &str, v: u64) -> String {
    match resource {
        "cpu" if v.is_multiple_of(1000) => format!("{}", v / 1000),
        "cpu" => format!("{v}m"),
        "memory" | "ephemeral-storage" => {
            const UNITS: [(&str, u64); 4] = [
                ("Ti", 1 << 40),
                ("Gi", 1 << 30),
                ("Mi", 1 << 20),
                ("Ki", 1 << 10),
            ];
            for (u, f) in UNITS {
                if v >= f && v.is_multiple_of(f) {
                    return format!("{}{u}", v / f);
                }
            }
            v.to_string()
        }
        _ => v.to_string(),
    }
}

fn per_node(free: &[u64], req: &[u64]) -> u64 {
    let mut n = u64::MAX;
    for (f, r) in free.iter().zip(req) {
        if *r > 0 {
            n = n.min(f / r);
        }
    }
    if n == u64::MAX { 0 } else { n }
}

impl Summary {
    /// The groups whose nodes satisfy every constraint of `on` on a key this summary
    /// groups by — `None` when `on` names none of them (the whole shard then counts).
    pub fn matching(&self, on: &[(String, Vec<String>)]) -> Option<Vec<usize>> {
        let used: Vec<(usize, &Vec<String>)> = on
            .iter()
            .filter_map(|(k, vs)| Some((self.group_keys.iter().position(|g| g == k)?, vs)))
            .collect();
        if used.is_empty() {
            return None;
        }
        Some(
            self.groups
                .iter()
                .enumerate()
                .filter(|(_, g)| {
                    used.iter()
                        .all(|(i, vs)| g.values.get(*i).is_some_and(|v| vs.contains(v)))
                })
                .map(|(i, _)| i)
                .collect(),
        )
    }

    /// How many replicas of `req` (a vector over this summary's resources) that must run
    /// on nodes labelled as `on` says fit (a lower bound, as [`Summary::fits`]).
    pub fn fits_on(&self, req: &[u64], on: &[(String, Vec<String>)]) -> u64 {
        if let Some(rest) = on_process_nodes(on) {
            return self.process.as_deref().map_or(0, |p| p.fits_on(req, &rest));
        }
        match self.matching(on) {
            None => self.fits(req),
            Some(groups) => groups
                .iter()
                .map(|i| self.groups[*i].summary.fits(req))
                .fold(0u64, u64::saturating_add)
                .min(self.fits(req)),
        }
    }

    /// Takes `n` replicas of `req` to run on nodes labelled as `on` says out of the shard
    /// and out of its groups (the matching ones, or — for a replica that may run anywhere —
    /// every group, fullest first, as best fit would), so the groups stay lower bounds;
    /// returns how many were taken.
    pub fn reserve_on(&mut self, req: &[u64], n: u64, on: &[(String, Vec<String>)]) -> u64 {
        if let Some(rest) = on_process_nodes(on) {
            return self
                .process
                .as_deref_mut()
                .map_or(0, |p| p.reserve_on(req, n, &rest));
        }
        if self.groups.is_empty() {
            return self.reserve(req, n);
        }
        let (mut groups, n) = match self.matching(on) {
            None => ((0..self.groups.len()).collect::<Vec<_>>(), n),
            Some(g) => {
                let room = g
                    .iter()
                    .map(|i| self.groups[*i].summary.fits(req))
                    .fold(0u64, u64::saturating_add);
                (g, n.min(room))
            }
        };
        let taken = self.reserve(req, n);
        groups.sort_by_key(|i| self.groups[*i].summary.fits(req));
        let mut left = taken;
        for i in groups {
            if left == 0 {
                break;
            }
            left -= self.groups[i].summary.reserve(req, left);
        }
        taken
    }

    /// How many replicas of `req` (a vector over this summary's resources) fit, counting
    /// slots only (a lower bound of the truth).
    pub fn fits(&self, req: &[u64]) -> u64 {
        self.slots
            .iter()
            .map(|s| s.count.saturating_mul(per_node(&s.free, req)))
            .fold(0u64, u64::saturating_add)
    }

    /// The slot with the most room for `req`'s largest amount — for saying what is missing.
    pub fn largest_free(&self, resource: usize) -> u64 {
        self.slots
            .iter()
            .map(|s| s.free.get(resource).copied().unwrap_or(0))
            .max()
            .unwrap_or(0)
    }

    /// Takes `n` replicas of `req` out of the slots, best fit first (the nodes with the least
    /// room that still hold one), as the shard's scheduler will use them; returns how many
    /// were taken (fewer than `n` when they do not all fit). Totals follow.
    pub fn reserve(&mut self, req: &[u64], n: u64) -> u64 {
        let mut order: Vec<(u64, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let k = per_node(&s.free, req);
                (k > 0 && s.count > 0).then_some((k, i))
            })
            .collect();
        order.sort();
        let mut left = n;
        let mut added: Vec<Slot> = Vec::new();
        for (k, i) in order {
            if left == 0 {
                break;
            }
            let slot = &mut self.slots[i];
            let full_nodes = (left / k).min(slot.count);
            let mut used = full_nodes;
            if full_nodes > 0 {
                added.push(Slot {
                    free: minus(&slot.free, req, k),
                    count: full_nodes,
                });
                left -= full_nodes * k;
            }
            if left > 0 && left < k && used < slot.count {
                added.push(Slot {
                    free: minus(&slot.free, req, left),
                    count: 1,
                });
                used += 1;
                left = 0;
            }
            slot.count -= used;
        }
        let taken = n - left;
        for (f, r) in self.free.iter_mut().zip(req) {
            *f = f.saturating_sub(r.saturating_mul(taken));
        }
        self.slots.retain(|s| s.count > 0);
        for a in added {
            match self.slots.iter_mut().find(|s| s.free == a.free) {
                Some(s) => s.count += a.count,
                None => self.slots.push(a),
            }
        }
        if self.slots.len() > MAX_SLOTS {
            self.slots = group(self.slots.iter().map(|s| (s.free.as_slice(), s.count)));
        }
        self.slots.sort();
        taken
    }

    /// Checks the summary is well formed: what a shard sends is not trusted.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.resources.len();
        if n < BASE_RESOURCES.len()
            || self.resources[..BASE_RESOURCES.len()]
                .iter()
                .zip(BASE_RESOURCES)
                .any(|(a, b)| a != b)
        {
            return Err(format!(
                "resources must start with {}",
                BASE_RESOURCES.join(", ")
            ));
        }
        for (i, r) in self.resources.iter().enumerate() {
            if r.is_empty() || self.resources[..i].contains(r) {
                return Err(format!("resource {r:?} is empty or listed twice"));
            }
        }
        if self.allocatable.len() != n || self.free.len() != n {
            return Err(format!(
                "allocatable and free must have one amount per resource ({n})"
            ));
        }
        if let Some(i) = (0..n).find(|i| self.free[*i] > self.allocatable[*i]) {
            return Err(format!(
                "free {} exceeds allocatable {} for {}",
                self.free[i], self.allocatable[i], self.resources[i]
            ));
        }
        let mut count = 0u64;
        for s in &self.slots {
            if s.free.len() != n {
                return Err(format!("a slot must have one amount per resource ({n})"));
            }
            count = count.saturating_add(s.count);
        }
        if count != self.nodes {
            return Err(format!(
                "slots hold {count} nodes, the summary says {}",
                self.nodes
            ));
        }
        if self.slots.len() > MAX_SLOTS {
            return Err(format!("{} slots, at most {MAX_SLOTS}", self.slots.len()));
        }
        if self.groups.len() > MAX_GROUPS {
            return Err(format!(
                "{} groups, at most {MAX_GROUPS}",
                self.groups.len()
            ));
        }
        if self.group_keys.is_empty() != self.groups.is_empty() && self.nodes > 0 {
            return Err("groups need group keys, and group keys groups".into());
        }
        if let Some(p) = &self.process {
            if p.resources != self.resources || !p.groups.is_empty() || p.process.is_some() {
                return Err(
                    "the process pool must have the shard's resources, no groups and no pool"
                        .into(),
                );
            }
            p.validate().map_err(|e| format!("process pool: {e}"))?;
        }
        let mut in_groups = 0u64;
        for (i, g) in self.groups.iter().enumerate() {
            if g.values.len() != self.group_keys.len() {
                return Err(format!(
                    "group {i} has {} values for {} keys",
                    g.values.len(),
                    self.group_keys.len()
                ));
            }
            if self.groups[..i].iter().any(|o| o.values == g.values) {
                return Err(format!("group {:?} is listed twice", g.values));
            }
            if g.summary.resources != self.resources || !g.summary.groups.is_empty() {
                return Err(format!(
                    "group {:?} must have the shard's resources and no groups",
                    g.values
                ));
            }
            g.summary
                .validate()
                .map_err(|e| format!("group {:?}: {e}", g.values))?;
            in_groups = in_groups.saturating_add(g.summary.nodes);
        }
        if !self.groups.is_empty() && in_groups != self.nodes {
            return Err(format!(
                "groups hold {in_groups} nodes, the summary says {}",
                self.nodes
            ));
        }
        for i in 0..n {
            let in_slots = self
                .slots
                .iter()
                .map(|s| s.free[i].saturating_mul(s.count))
                .fold(0u64, u64::saturating_add);
            if in_slots > self.free[i] {
                return Err(format!(
                    "slots hold {in_slots} free {}, more than the total {}",
                    self.resources[i], self.free[i]
                ));
            }
        }
        Ok(())
    }
}

fn minus(free: &[u64], req: &[u64], times: u64) -> Vec<u64> {
    free.iter()
        .zip(req)
        .map(|(f, r)| f.saturating_sub(r.saturating_mul(times)))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const GI: u64 = 1 << 30;

    fn shard(nodes: &[(u64, u64, u64)]) -> Summary {
        let mut b = SummaryBuilder::new(&[]);
        for (cpu, mem, pods) in nodes {
            b.node(&[16_000, 64 * GI, 110], &[*cpu, *mem, *pods]);
        }
        b.build(1)
    }

    #[test]
    fn fits_counts_per_node_not_totals() {
        // 2 cpu free on each of two nodes: 4 cpu in total, but no 3-cpu replica fits.
        let s = shard(&[(2000, 8 * GI, 10), (2000, 8 * GI, 10)]);
        assert_eq!(s.free[0], 4000);
        let three = Request::cpu_memory(3000, GI).vector_for(&s).expect("known");
        assert_eq!(s.fits(&three), 0);
        let one = Request::cpu_memory(1000, GI).vector_for(&s).expect("known");
        assert_eq!(s.fits(&one), 4);
        // The pods dimension limits too.
        let tiny = Request::cpu_memory(1, 1).vector_for(&s).expect("known");
        assert_eq!(s.fits(&tiny), 20);
        s.validate().expect("valid");
    }

    #[test]
    fn process_nodes_hold_only_replicas_that_must_run_on_them() {
        let mut s = shard(&[(4000, 8 * GI, 10)]);
        s.process = Some(Box::new(shard(&[(2000, 8 * GI, 10)])));
        s.validate().expect("valid");
        let one = Request::cpu_memory(1000, GI).vector_for(&s).expect("known");
        let plain: Vec<(String, Vec<String>)> = Vec::new();
        let process = vec![("tessera.io/runtime".to_owned(), vec!["process".to_owned()])];
        let either = vec![(
            "tessera.io/runtime".to_owned(),
            vec!["process".to_owned(), "sim".to_owned()],
        )];
        assert_eq!(
            s.fits_on(&one, &plain),
            4,
            "the pool is not counted for others"
        );
        assert_eq!(s.fits_on(&one, &process), 2, "only the pool counts");
        assert_eq!(
            s.fits_on(&one, &either),
            4,
            "not only process nodes: the shard's room"
        );
        assert_eq!(s.reserve_on(&one, 3, &process), 2, "the pool holds 2");
        assert_eq!(s.fits_on(&one, &process), 0);
        assert_eq!(
            s.fits_on(&one, &plain),
            4,
            "taken from the pool, not the shard"
        );
        let mut none = shard(&[(4000, 8 * GI, 10)]);
        assert_eq!(none.fits_on(&one, &process), 0, "no process nodes: no room");
        assert_eq!(none.reserve_on(&one, 1, &process), 0);
        none.process = Some(Box::new(zoned(&[("a", 2000)])));
        assert!(
            none.validate().is_err(),
            "a pool with groups of its own is refused"
        );
    }

    fn zoned(nodes: &[(&str, u64)]) -> Summary {
        let mut b = SummaryBuilder::new(&[]).group_by(&["zone".to_owned()]);
        for (zone, cpu) in nodes {
            b.node_in(&[(*zone).to_owned()], &[*cpu, GI, 10], &[*cpu, GI, 10]);
        }
        b.build(1)
    }

    fn on(zones: &[&str]) -> Vec<(String, Vec<String>)> {
        vec![(
            "zone".to_owned(),
            zones.iter().map(|z| (*z).to_owned()).collect(),
        )]
    }

    #[test]
    fn a_replica_pinned_to_a_zone_counts_that_zones_nodes_only() {
        let mut s = zoned(&[("a", 4000), ("a", 4000), ("b", 8000), ("", 8000)]);
        s.validate().expect("valid");
        assert_eq!(s.groups.len(), 3, "a, b and nodes without the label");
        let four = Request::cpu_memory(4000, 0).vector_for(&s).expect("known");
        assert_eq!(s.fits(&four), 6);
        assert_eq!(s.fits_on(&four, &on(&["a"])), 2);
        assert_eq!(s.fits_on(&four, &on(&["a", "b"])), 4);
        assert_eq!(s.fits_on(&four, &on(&["c"])), 0);
        // A key the shard does not group by is left to its scheduler.
        let other = vec![("pool".to_owned(), vec!["x".to_owned()])];
        assert_eq!(s.fits_on(&four, &other), 6);
        // Reserving in a zone takes from it and from the shard.
        assert_eq!(s.reserve_on(&four, 5, &on(&["a"])), 2, "only 2 fit in a");
        assert_eq!(s.fits_on(&four, &on(&["a"])), 0);
        assert_eq!(s.fits(&four), 4);
        // A replica that may go anywhere is taken out of some group too.
        assert_eq!(s.reserve_on(&four, 3, &[]), 3);
        let in_groups: u64 = s.groups.iter().map(|g| g.summary.fits(&four)).sum();
        assert_eq!((s.fits(&four), in_groups), (1, 1));
        s.validate().expect("still valid");
    }

    #[test]
    fn too_many_groups_are_left_out_and_malformed_groups_refused() {
        let many: Vec<(String, u64)> = (0..=MAX_GROUPS).map(|i| (format!("z{i}"), 1000)).collect();
        let refs: Vec<(&str, u64)> = many.iter().map(|(z, c)| (z.as_str(), *c)).collect();
        let s = zoned(&refs);
        assert!(s.groups.is_empty() && s.group_keys.is_empty());
        s.validate().expect("valid without groups");
        let mut bad = zoned(&[("a", 1000), ("b", 1000)]);
        bad.groups[1].summary.nodes = 7;
        assert!(bad.validate().is_err());
        let mut bad = zoned(&[("a", 1000), ("b", 1000)]);
        bad.groups[1].values.push("extra".into());
        assert!(bad.validate().expect_err("refused").contains("values"));
        let mut bad = zoned(&[("a", 1000), ("b", 1000)]);
        bad.groups[1].values = bad.groups[0].values.clone();
        assert!(bad.validate().expect_err("refused").contains("twice"));
    }

    proptest! {
        /// However pinned and free replicas are reserved, what the shard and its groups are
        /// said to fit never exceeds what the nodes truly hold: per zone while only pinned
        /// replicas were taken (where a free one lands is the scheduler's choice), and over
        /// the shard always; the groups never claim more than the shard.
        #[test]
        fn a_zones_room_stays_a_lower_bound(
            nodes in proptest::collection::vec((0usize..3, 1u64..9), 1..30),
            ops in proptest::collection::vec((0usize..4, 1u64..6), 0..20),
        ) {
            let zones = ["a", "b", "c"];
            let shape: Vec<(&str, u64)> = nodes.iter().map(|(z, c)| (zones[*z], *c * 1000)).collect();
            let mut s = zoned(&shape);
            let one = Request::cpu_memory(1000, 0).vector_for(&s).expect("known");
            let mut truth: Vec<u64> = zones.iter().map(|z| {
                shape.iter().filter(|(zz, _)| zz == z).map(|(_, c)| c / 1000).sum()
            }).collect();
            let mut total: u64 = truth.iter().sum();
            let mut only_pinned = true;
            for (z, n) in ops {
                let pin = if z < 3 { on(&[zones[z]]) } else { Vec::new() };
                let taken = s.reserve_on(&one, n, &pin);
                total -= taken;
                if z < 3 {
                    prop_assert!(taken <= truth[z]);
                    truth[z] -= taken;
                } else {
                    only_pinned = false;
                }
                if only_pinned {
                    for (i, zone) in zones.iter().enumerate() {
                        prop_assert!(s.fits_on(&one, &on(&[zone])) <= truth[i]);
                    }
                }
                let in_groups: u64 = s.groups.iter().map(|g| g.summary.fits(&one)).sum();
                prop_assert!(in_groups <= s.fits(&one));
                prop_assert!(s.fits(&one) <= total);
                s.validate().map_err(TestCaseError::fail)?;
            }
        }
    }

    #[test]
    fn an_unknown_extended_resource_fits_nowhere() {
        let s = shard(&[(2000, 8 * GI, 10)]);
        let gpu = Request {
            amounts: vec![("nvidia.com/gpu".into(), 1)],
            on: Vec::new(),
        };
        assert_eq!(gpu.vector_for(&s), Err("nvidia.com/gpu"));
        let mut b = SummaryBuilder::new(&["nvidia.com/gpu"]);
        b.node(&[8000, GI, 110, 4], &[8000, GI, 110, 3]);
        let s = b.build(1);
        let v = gpu.vector_for(&s).expect("known");
        assert_eq!(s.fits(&v), 3);
    }

    #[test]
    fn malformed_summaries_are_refused_with_the_reason() {
        let mut s = shard(&[(2000, GI, 10)]);
        s.nodes = 7;
        assert!(
            s.validate()
                .expect_err("invalid")
                .contains("slots hold 1 nodes")
        );
        let mut s = shard(&[(2000, GI, 10)]);
        s.free[0] = 17_000;
        assert!(
            s.validate()
                .expect_err("invalid")
                .contains("exceeds allocatable")
        );
        let mut s = shard(&[(2000, GI, 10)]);
        s.resources.swap(0, 1);
        assert!(
            s.validate()
                .expect_err("invalid")
                .contains("must start with")
        );
        let mut s = shard(&[(2000, GI, 10)]);
        s.slots[0].free[0] = 7000;
        assert!(
            s.validate()
                .expect_err("invalid")
                .contains("more than the total")
        );
    }

    #[test]
    fn many_node_shapes_are_coarsened_to_the_slot_limit() {
        let mut b = SummaryBuilder::new(&[]);
        for i in 0..5_000u64 {
            b.node(
                &[64_000, 256 * GI, 110],
                &[i * 7 + 1, i * 51 * (1 << 20) + 1, i % 110],
            );
        }
        let s = b.build(1);
        assert!(s.slots.len() <= MAX_SLOTS, "{} slots", s.slots.len());
        assert_eq!(s.slots.iter().map(|s| s.count).sum::<u64>(), 5_000);
        s.validate().expect("valid");
    }

    fn nodes() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
        prop::collection::vec((0u64..16_000, 0u64..64 * GI, 0u64..110), 1..60)
    }

    proptest! {
        /// What the slots say fits really fits, node by node, and loses less than one node's
        /// rounding per node.
        #[test]
        fn fits_is_a_lower_bound_of_the_truth(ns in nodes(), cpu in 1u64..8_000, mem in 1u64..16 * GI) {
            let s = shard(&ns);
            let req = Request::cpu_memory(cpu, mem).vector_for(&s).expect("known");
            let truth: u64 = ns.iter().map(|(c, m, p)| (c / cpu).min(m / mem).min(*p)).sum();
            let est = s.fits(&req);
            prop_assert!(est <= truth, "estimated {} > true {}", est, truth);
            s.validate().expect("valid");
        }

        /// Reserving takes what fits, never more, and what is left fits exactly that much less
        /// (or less, after rounding).
        #[test]
        fn reserve_never_overcommits(ns in nodes(), cpu in 1u64..8_000, mem in 1u64..16 * GI, n in 0u64..200) {
            let mut s = shard(&ns);
            let req = Request::cpu_memory(cpu, mem).vector_for(&s).expect("known");
            let before = s.fits(&req);
            let taken = s.reserve(&req, n);
            prop_assert_eq!(taken, n.min(before));
            prop_assert!(s.fits(&req) <= before - taken);
            prop_assert_eq!(s.slots.iter().map(|x| x.count).sum::<u64>(), ns.len() as u64);
            s.validate().expect("still valid");
        }
    }
}
