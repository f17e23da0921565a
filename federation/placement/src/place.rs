//! Placement: which shards a workload goes to and how many replicas each, from a snapshot of
//! the shards (their map, state and capacity summaries) and the workload's policy.
//!
//! Deterministic: the same snapshot, workload and policy give the same decision on every
//! replica (no clock, no randomness; ties broken by preference order, then name). A decision
//! never gives a shard more replicas than its summary says fit, counting the replicas it
//! already runs of this workload as room (they are in its used capacity already).

use std::collections::BTreeMap;

use crate::map::ShardMap;
use crate::summary::{Request, Summary, human};

/// A taint on a shard: workloads that do not tolerate it are not placed there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value (may be empty).
    pub value: String,
    /// `NoSchedule` or `NoExecute` (both keep new work away; `PreferNoSchedule` is ignored).
    pub effect: String,
}

/// A toleration, as on pods: `Exists` matches any value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Toleration {
    /// Key (empty with `Exists`: every taint).
    pub key: String,
    /// `Equal` (default) or `Exists`.
    pub operator: String,
    /// Value for `Equal`.
    pub value: String,
    /// Effect (empty: every effect).
    pub effect: String,
}

impl Toleration {
    fn tolerates(&self, t: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != t.effect {
            return false;
        }
        if self.operator == "Exists" {
            return self.key.is_empty() || self.key == t.key;
        }
        self.key == t.key && self.value == t.value
    }
}

impl std::fmt::Display for Taint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

/// What the federation knows of one shard.
#[derive(Clone, Debug, Default)]
pub struct ShardState {
    /// Its lease is held: it is connected and answering.
    pub ready: bool,
    /// Cordoned: no new work.
    pub unschedulable: bool,
    /// Its labels (region, zone, ...).
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Its last capacity summary (none yet: nothing fits).
    pub summary: Option<Summary>,
    /// The summary is older than the federation accepts: discounted to no free room.
    pub stale: bool,
}

/// How replicas are spread over the chosen shards.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The default: the tenant's home shard, spilling over down its preference list for
    /// what does not fit there.
    #[default]
    Home,
    /// Every eligible shard runs all replicas.
    Duplicated,
    /// Divided by static weights per shard (by name; shards not listed get none).
    Weighted(BTreeMap<String, u64>),
    /// Divided in proportion to each eligible shard's room for this workload.
    ByCapacity,
    /// All replicas in one shard (a gang, a multi-role workload): the first on the tenant's
    /// list where all fit.
    Whole,
}

/// Where a workload may go.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Only these shards (empty: any).
    pub shard_names: Vec<String>,
    /// Only shards with all these labels.
    pub shard_labels: BTreeMap<String, String>,
    /// Taints it tolerates.
    pub tolerations: Vec<Toleration>,
    /// How replicas are spread.
    pub mode: Mode,
    /// Spread over groups of shards by label (each constraint on its own label).
    pub spread: Vec<Spread>,
    /// How it fails over, as the Placement says (mode, if given, and delay); `None`: by its
    /// kind. Not used by placement itself.
    pub failover: Option<(Option<crate::FailoverMode>, std::time::Duration)>,
}

/// Spread over the groups of shards sharing a label's value: groups are taken in the
/// tenant's order (a group's place is its first shard's), at most `max_groups` of them, and
/// the replicas must land in at least `min_groups` (or in as many as there are replicas).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spread {
    /// The shard label.
    pub label: String,
    /// Least groups used.
    pub min_groups: u64,
    /// Most groups used (none: no limit).
    pub max_groups: Option<u64>,
}

/// One workload to place.
#[derive(Clone, Debug)]
pub struct Workload<'a> {
    /// The tenant it belongs to (routes it on the map).
    pub tenant: &'a str,
    /// Replicas wanted.
    pub replicas: u64,
    /// What one replica asks for.
    pub request: &'a Request,
    /// Replicas it runs now per shard (their room counts as free for it).
    pub current: &'a BTreeMap<String, u64>,
}

/// Why a shard got nothing (or less than asked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Its lease lapsed.
    NotReady,
    /// Cordoned.
    Unschedulable,
    /// Not among the policy's shard names.
    NotSelected,
    /// A label the policy asks for is missing or different.
    LabelMismatch(String),
    /// A taint not tolerated.
    Taint(String),
    /// No summary yet, or a stale one.
    NoSummary,
    /// It lacks a resource altogether.
    NoResource(String),
    /// Not enough room: room for `room` replicas, largest free slot of each requested
    /// resource as text.
    Full {
        /// Replicas of this size it has room for.
        room: u64,
        /// What its largest free slot holds of the scarcest requested resource.
        largest: String,
    },
    /// Weighted placement gave it weight 0.
    NoWeight,
    /// A spread constraint leaves it out, or is not met.
    Spread(String),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::NotReady => f.write_str("is not ready"),
            Skip::Unschedulable => f.write_str("is cordoned"),
            Skip::NotSelected => f.write_str("is not selected by the placement"),
            Skip::LabelMismatch(l) => write!(f, "lacks label {l}"),
            Skip::Taint(t) => write!(f, "has taint {t}"),
            Skip::NoSummary => f.write_str("has reported no current capacity"),
            Skip::NoResource(r) => write!(f, "has no {r}"),
            Skip::Full { room, largest } => {
                write!(f, "has room for {room} (largest free slot: {largest})")
            }
            Skip::NoWeight => f.write_str("has no weight in the placement"),
            Skip::Spread(why) => write!(f, "is held back by the spread: {why}"),
        }
    }
}

/// A placement decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Replicas per shard (shards with none are left out).
    pub shares: BTreeMap<String, u64>,
    /// Replicas that fit nowhere (they wait for room).
    pub unplaced: u64,
    /// Why each shard that was passed over (or given less) was.
    pub skipped: Vec<(String, Skip)>,
    /// Shards beyond the first choice that took replicas (spill-over).
    pub spilled: u64,
}

impl Decision {
    /// The one-line reason a workload (or part of it) waits, like kube-scheduler's
    /// "0/3 nodes are available: ...": counts per reason, most common first.
    pub fn why_pending(&self, total_shards: usize, request: &Request) -> String {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for (_, s) in &self.skipped {
            let key = match s {
                Skip::Full { .. } => format!("lack room for a replica of {}", request.describe()),
                other => other.to_string(),
            };
            *by.entry(key).or_default() += 1;
        }
        let mut parts: Vec<(usize, String)> = by.into_iter().map(|(k, n)| (n, k)).collect();
        parts.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let fit = self.shares.len();
        let reasons: Vec<String> = parts.into_iter().map(|(n, k)| format!("{n} {k}")).collect();
        format!(
            "{fit}/{total_shards} shards fit {}{}",
            self.unplaced,
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" more replica(s): {}", reasons.join(", "))
            }
        )
    }
}

/// The shards, their map and state: what every decision is a function of.
pub struct Snapshot {
    /// Tenant → shards.
    pub map: ShardMap,
    /// State by shard name.
    pub shards: BTreeMap<String, ShardState>,
}

impl Snapshot {
    /// Places `w` under `policy`. Pure: the snapshot is not changed (see [`Snapshot::commit`]).
    pub fn place(&self, w: &Workload<'_>, policy: &Policy) -> Decision {
        if matches!(policy.mode, Mode::Home | Mode::Whole) && policy.spread.is_empty() {
            return self.place_in_order(w, policy);
        }
        let d = self.place_looking_at_all(w, policy);
        spread_check(d, w, policy, &self.shards)
    }

    /// Every mode, with every shard's room looked at first.
    fn place_looking_at_all(&self, w: &Workload<'_>, policy: &Policy) -> Decision {
        let mut d = Decision::default();
        // Candidates in the tenant's order of preference (the map's shards), then any shard
        // not yet in the map (it joined since), by name.
        let mut order: Vec<&str> = self.map.preference(w.tenant);
        for name in self.shards.keys() {
            if !order.contains(&name.as_str()) {
                order.push(name);
            }
        }
        order.retain(|n| self.shards.contains_key(*n));
        // Room per eligible shard, in order.
        let mut eligible: Vec<(&str, u64)> = Vec::new();
        for name in order {
            let s = &self.shards[name];
            match self.room(name, s, w, policy) {
                Ok(room) => eligible.push((name, room)),
                Err(skip) => d.skipped.push((name.to_owned(), skip)),
            }
        }
        for sp in &policy.spread {
            // Groups in the tenant's order; shards of groups past the limit are left out.
            let mut groups: Vec<&str> = Vec::new();
            eligible.retain(|(name, _)| {
                let Some(v) = self.shards[*name].labels.get(&sp.label) else {
                    d.skipped
                        .push(((*name).to_owned(), Skip::LabelMismatch(sp.label.clone())));
                    return false;
                };
                if groups.contains(&v.as_str()) {
                    return true;
                }
                if sp.max_groups.is_some_and(|m| groups.len() as u64 >= m) {
                    d.skipped.push((
                        (*name).to_owned(),
                        Skip::Spread(format!("beyond maxGroups of {}", sp.label)),
                    ));
                    return false;
                }
                groups.push(v);
                true
            });
        }
        let want = w.replicas;
        let full = |d: &mut Decision, name: &str, room: u64| {
            let s = &self.shards[name];
            let largest = s
                .summary
                .as_ref()
                .map(|sum| scarcest(sum, w.request))
                .unwrap_or_default();
            d.skipped
                .push((name.to_owned(), Skip::Full { room, largest }));
        };
        match &policy.mode {
            Mode::Home => {
                let mut left = want;
                for (i, (name, room)) in eligible.iter().enumerate() {
                    if left == 0 {
                        break;
                    }
                    let n = left.min(*room);
                    if n > 0 {
                        d.shares.insert((*name).to_owned(), n);
                        if i > 0 {
                            d.spilled += n;
                        }
                        left -= n;
                    }
                    if n < want && left > 0 {
                        full(&mut d, name, *room);
                    }
                }
                d.unplaced = left;
            }
            Mode::Whole => match eligible.iter().position(|(_, room)| *room >= want) {
                Some(i) => {
                    if want > 0 {
                        d.shares.insert(eligible[i].0.to_owned(), want);
                    }
                    if i > 0 {
                        d.spilled = want;
                    }
                    for (name, room) in &eligible[..i] {
                        full(&mut d, name, *room);
                    }
                }
                None => {
                    for (name, room) in &eligible {
                        full(&mut d, name, *room);
                    }
                    d.unplaced = want;
                }
            },
            Mode::Duplicated => {
                for (name, room) in &eligible {
                    if *room >= want {
                        if want > 0 {
                            d.shares.insert((*name).to_owned(), want);
                        }
                    } else {
                        full(&mut d, name, *room);
                    }
                }
                if d.shares.is_empty() {
                    d.unplaced = want;
                }
            }
            Mode::Weighted(weights) => {
                let mut ws: Vec<(&str, u64, u64)> = Vec::new();
                for (name, room) in &eligible {
                    match weights.get(*name).copied().unwrap_or(0) {
                        0 => d.skipped.push(((*name).to_owned(), Skip::NoWeight)),
                        w => ws.push((name, w, *room)),
                    }
                }
                let shares = divide(want, &ws);
                for ((name, _, room), n) in ws.iter().zip(&shares) {
                    if *n > 0 {
                        d.shares.insert((*name).to_owned(), *n);
                    }
                    if n == room && want > shares.iter().sum::<u64>() {
                        full(&mut d, name, *room);
                    }
                }
                d.unplaced = want - shares.iter().sum::<u64>();
            }
            Mode::ByCapacity => {
                let ws: Vec<(&str, u64, u64)> = eligible
                    .iter()
                    .filter(|(_, room)| *room > 0)
                    .map(|(n, room)| (*n, *room, *room))
                    .collect();
                for (name, room) in &eligible {
                    if *room == 0 {
                        full(&mut d, name, 0);
                    }
                }
                let shares = divide(want, &ws);
                for ((name, _, _), n) in ws.iter().zip(&shares) {
                    if *n > 0 {
                        d.shares.insert((*name).to_owned(), *n);
                    }
                }
                d.unplaced = want - shares.iter().sum::<u64>();
            }
        }
        d
    }

    /// The shards in `tenant`'s order, walked lazily: the map's shards, then any shard not
    /// yet on it (it joined since), by name.
    fn order<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let on_map = self
            .map
            .candidates(tenant)
            .filter(|n| self.shards.contains_key(*n));
        let joined = self
            .shards
            .keys()
            .filter(|n| !self.map.contains(n))
            .map(String::as_str);
        on_map.chain(joined)
    }

    /// `Home` and `Whole`: the tenant's shards in order until the replicas are placed, so a
    /// decision costs what it looks at (the home shard, mostly), not every shard's room. The
    /// shards after the one that settled it are not looked at (their reasons are needed only
    /// when something stays unplaced, and then every shard is).
    fn place_in_order(&self, w: &Workload<'_>, policy: &Policy) -> Decision {
        let mut d = Decision::default();
        let want = w.replicas;
        let whole = policy.mode == Mode::Whole;
        let mut left = want;
        let mut eligible = 0usize;
        for name in self.order(w.tenant) {
            if !whole && left == 0 {
                break;
            }
            let s = &self.shards[name];
            let room = match self.room(name, s, w, policy) {
                Ok(room) => room,
                Err(skip) => {
                    d.skipped.push((name.to_owned(), skip));
                    continue;
                }
            };
            let first = eligible == 0;
            eligible += 1;
            if whole {
                if room >= want {
                    if want > 0 {
                        d.shares.insert(name.to_owned(), want);
                    }
                    if !first {
                        d.spilled = want;
                    }
                    return d;
                }
                self.full(&mut d, name, room, w.request);
                continue;
            }
            let n = left.min(room);
            if n > 0 {
                d.shares.insert(name.to_owned(), n);
                if !first {
                    d.spilled += n;
                }
                left -= n;
            }
            if n < want && left > 0 {
                self.full(&mut d, name, room, w.request);
            }
        }
        d.unplaced = if whole { want } else { left };
        d
    }

    /// Notes that shard `name` has room for only `room` replicas.
    fn full(&self, d: &mut Decision, name: &str, room: u64, request: &Request) {
        let largest = self.shards[name]
            .summary
            .as_ref()
            .map(|sum| scarcest(sum, request))
            .unwrap_or_default();
        d.skipped
            .push((name.to_owned(), Skip::Full { room, largest }));
    }

    /// Takes what `d` placed out of the summaries, so that the next decision on this snapshot
    /// does not count the same room twice (before the shards report it used).
    pub fn commit(&mut self, w: &Workload<'_>, d: &Decision) {
        for (name, n) in &d.shares {
            let prev = w.current.get(name).copied().unwrap_or(0);
            let extra = n.saturating_sub(prev);
            if extra == 0 {
                continue;
            }
            if let Some(sum) = self.shards.get_mut(name).and_then(|s| s.summary.as_mut())
                && let Ok(v) = w.request.vector_for(sum)
            {
                sum.reserve_on(&v, extra, &w.request.on);
            }
        }
    }

    /// How many replicas of `w` shard `name` has room for, or why none may go there.
    /// Whether what `policy` places may no longer run on shard `name`: the shard left the
    /// federation, or carries a `NoExecute` taint the policy does not tolerate (a drain).
    /// Such shares move to other shards (a lost shard is failover's business, not this).
    pub fn evicts(&self, name: &str, policy: &Policy) -> Option<String> {
        let Some(s) = self.shards.get(name) else {
            return Some(format!("shard {name} left the federation"));
        };
        s.taints
            .iter()
            .find(|t| {
                t.effect == "NoExecute" && !policy.tolerations.iter().any(|tol| tol.tolerates(t))
            })
            .map(|t| format!("shard {name} has taint {t}"))
    }

    fn room(&self, name: &str, s: &ShardState, w: &Workload<'_>, p: &Policy) -> Result<u64, Skip> {
        if !p.shard_names.is_empty() && !p.shard_names.iter().any(|n| n == name) {
            return Err(Skip::NotSelected);
        }
        for (k, v) in &p.shard_labels {
            if s.labels.get(k) != Some(v) {
                return Err(Skip::LabelMismatch(format!("{k}={v}")));
            }
        }
        if !s.ready {
            return Err(Skip::NotReady);
        }
        if s.unschedulable {
            return Err(Skip::Unschedulable);
        }
        for t in &s.taints {
            if matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                && !p.tolerations.iter().any(|tol| tol.tolerates(t))
            {
                return Err(Skip::Taint(t.to_string()));
            }
        }
        let current = w.current.get(name).copied().unwrap_or(0);
        let Some(sum) = s.summary.as_ref().filter(|_| !s.stale) else {
            // Without a fresh summary, what runs there may stay; nothing more goes.
            return if current > 0 {
                Ok(current)
            } else {
                Err(Skip::NoSummary)
            };
        };
        let v = w
            .request
            .vector_for(sum)
            .map_err(|r| Skip::NoResource(r.to_owned()))?;
        Ok(sum.fits_on(&v, &w.request.on).saturating_add(current))
    }
}

/// A decision that uses fewer groups of a spread label than its constraint asks for places
/// nothing: it waits, saying so.
fn spread_check(
    mut d: Decision,
    w: &Workload<'_>,
    policy: &Policy,
    shards: &BTreeMap<String, ShardState>,
) -> Decision {
    for sp in &policy.spread {
        let mut used: Vec<&str> = d
            .shares
            .keys()
            .filter_map(|n| shards.get(n).and_then(|s| s.labels.get(&sp.label)))
            .map(String::as_str)
            .collect();
        used.sort_unstable();
        used.dedup();
        let need = sp.min_groups.min(w.replicas);
        if (used.len() as u64) < need {
            let why = format!(
                "{} of {} group(s) of {} have room (minGroups {})",
                used.len(),
                need,
                sp.label,
                sp.min_groups
            );
            for name in std::mem::take(&mut d.shares).into_keys() {
                d.skipped.push((name, Skip::Spread(why.clone())));
            }
            d.unplaced = w.replicas;
            d.spilled = 0;
        }
    }
    d
}

/// What the largest free slot holds of the requested resource it is shortest of.
fn scarcest(sum: &Summary, req: &Request) -> String {
    let mut worst: Option<(f64, String)> = None;
    for (name, amount) in &req.amounts {
        if *amount == 0 {
            continue;
        }
        let Some(i) = sum.resources.iter().position(|r| r == name) else {
            continue;
        };
        let largest = sum.largest_free(i);
        let ratio = largest as f64 / *amount as f64;
        if worst.as_ref().is_none_or(|(r, _)| ratio < *r) {
            worst = Some((ratio, format!("{name} {}", human(name, largest))));
        }
    }
    worst
        .map(|(_, s)| s)
        .unwrap_or_else(|| "no free pod slot".into())
}

/// Divides `total` over `(name, weight, cap)` in proportion to weight, each share at most its
/// cap, by largest remainder (ties to the earlier entry); what a capped share cannot take
/// goes to the others by weight. Returns the shares in order.
pub fn divide(total: u64, ws: &[(&str, u64, u64)]) -> Vec<u64> {
    let mut shares = vec![0u64; ws.len()];
    let mut open: Vec<usize> = (0..ws.len()).filter(|i| ws[*i].2 > 0).collect();
    let mut left = total;
    while left > 0 && !open.is_empty() {
        let wsum: u128 = open.iter().map(|i| ws[*i].1 as u128).sum();
        if wsum == 0 {
            break;
        }
        // Ideal shares of what is left, floors first.
        let mut give: Vec<(usize, u64, u128)> = open
            .iter()
            .map(|i| {
                let exact = left as u128 * ws[*i].1 as u128;
                (*i, (exact / wsum) as u64, exact % wsum)
            })
            .collect();
        let mut rest = left - give.iter().map(|g| g.1).sum::<u64>();
        let mut by_rem: Vec<usize> = (0..give.len()).collect();
        by_rem.sort_by(|a, b| give[*b].2.cmp(&give[*a].2).then(a.cmp(b)));
        for k in by_rem {
            if rest == 0 {
                break;
            }
            give[k].1 += 1;
            rest -= 1;
        }
        let mut capped = false;
        for (i, n, _) in give {
            let room = ws[i].2 - shares[i];
            let take = n.min(room);
            if take < n {
                capped = true;
            }
            shares[i] += take;
            left -= take;
        }
        open.retain(|i| shares[*i] < ws[*i].2);
        if !capped {
            break;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::map::{ShardWeight, VNODES};
    use crate::summary::SummaryBuilder;

    const GI: u64 = 1 << 30;

    fn summary(nodes: u64, cpu_free: u64) -> Summary {
        let mut b = SummaryBuilder::new(&[]);
        for _ in 0..nodes {
            b.node(&[8000, 32 * GI, 110], &[cpu_free, 32 * GI, 110]);
        }
        b.build(1)
    }

    fn snapshot(shards: &[(&str, u64, u64)]) -> Snapshot {
        let map = ShardMap::new(
            1,
            &shards
                .iter()
                .map(|(n, _, _)| ShardWeight::new(*n, VNODES))
                .collect::<Vec<_>>(),
        )
        .expect("map");
        Snapshot {
            map,
            shards: shards
                .iter()
                .map(|(n, nodes, cpu)| {
                    (
                        (*n).to_owned(),
                        ShardState {
                            ready: true,
                            summary: Some(summary(*nodes, *cpu)),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        }
    }

    fn one_cpu() -> Request {
        Request::cpu_memory(1000, GI)
    }

    fn regions(snap: &mut Snapshot, of: &[(&str, Option<&str>)]) {
        for (name, region) in of {
            let s = snap.shards.get_mut(*name).expect("a shard");
            s.labels.clear();
            if let Some(r) = region {
                s.labels.insert("region".into(), (*r).into());
            }
        }
    }

    fn groups_used(snap: &Snapshot, d: &Decision) -> Vec<String> {
        let mut g: Vec<String> = d
            .shares
            .keys()
            .map(|n| snap.shards[n].labels["region"].clone())
            .collect();
        g.sort();
        g.dedup();
        g
    }

    #[test]
    fn spread_uses_groups_in_the_tenants_order_within_min_and_max() {
        let mut snap = snapshot(&[
            ("a", 4, 8000),
            ("b", 4, 8000),
            ("c", 4, 8000),
            ("d", 4, 8000),
            ("e", 4, 8000),
        ]);
        regions(
            &mut snap,
            &[
                ("a", Some("eu")),
                ("b", Some("eu")),
                ("c", Some("us")),
                ("d", Some("ap")),
                ("e", None),
            ],
        );
        let req = one_cpu();
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t",
            replicas: 12,
            request: &req,
            current: &none,
        };
        let spread = |min, max| Policy {
            mode: Mode::ByCapacity,
            spread: vec![Spread {
                label: "region".into(),
                min_groups: min,
                max_groups: max,
            }],
            ..Default::default()
        };
        // No limit: every region, and the shard without the label is left out, saying why.
        let d = snap.place(&w, &spread(2, None));
        assert_eq!(d.unplaced, 0, "{d:?}");
        assert_eq!(groups_used(&snap, &d), ["ap", "eu", "us"]);
        assert!(
            d.skipped
                .contains(&("e".into(), Skip::LabelMismatch("region".into())))
        );
        // At most one region: the tenant's nearest, every replica in it.
        let d = snap.place(&w, &spread(1, Some(1)));
        assert_eq!(d.unplaced, 0);
        let first = snap
            .map
            .preference("t")
            .into_iter()
            .find_map(|n| snap.shards[n].labels.get("region").cloned())
            .expect("a labelled shard");
        assert_eq!(groups_used(&snap, &d), [first]);
        // Two regions at most and at least two: exactly two.
        let d = snap.place(&w, &spread(2, Some(2)));
        assert_eq!(groups_used(&snap, &d).len(), 2, "{d:?}");
        // One replica cannot be in two regions: as many groups as replicas is enough.
        let one = Workload {
            replicas: 1,
            ..w.clone()
        };
        assert_eq!(snap.place(&one, &spread(2, None)).unplaced, 0);
    }

    #[test]
    fn a_spread_that_cannot_be_met_waits_and_says_why() {
        let mut snap = snapshot(&[("a", 4, 8000), ("b", 4, 0), ("c", 4, 0)]);
        regions(
            &mut snap,
            &[("a", Some("eu")), ("b", Some("us")), ("c", Some("ap"))],
        );
        let req = one_cpu();
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t",
            replicas: 4,
            request: &req,
            current: &none,
        };
        let policy = Policy {
            mode: Mode::Duplicated,
            spread: vec![Spread {
                label: "region".into(),
                min_groups: 2,
                max_groups: None,
            }],
            ..Default::default()
        };
        let d = snap.place(&w, &policy);
        assert!(d.shares.is_empty(), "only eu has room: nothing goes: {d:?}");
        assert_eq!(d.unplaced, 4);
        let why = d.why_pending(3, &req);
        assert!(
            why.contains("1 of 2 group(s) of region have room (minGroups 2)"),
            "{why}"
        );
        // Home with a spread honours it too (the API asks for Duplicated or Divided).
        let home = Policy {
            mode: Mode::Home,
            ..policy.clone()
        };
        assert_eq!(snap.place(&w, &home).unplaced, 4);
    }

    #[test]
    fn home_first_then_spill_over_down_the_list() {
        let snap = snapshot(&[("a", 2, 8000), ("b", 2, 8000), ("c", 2, 8000)]);
        let req = one_cpu();
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t1",
            replicas: 10,
            request: &req,
            current: &none,
        };
        let pref = snap.map.preference("t1");
        let d = snap.place(&w, &Policy::default());
        assert_eq!(d.shares.get(pref[0]), Some(&10), "all at home: {d:?}");
        assert_eq!(d.spilled, 0);
        let w = Workload { replicas: 20, ..w };
        let d = snap.place(&w, &Policy::default());
        assert_eq!(d.shares.get(pref[0]), Some(&16));
        assert_eq!(d.shares.get(pref[1]), Some(&4));
        assert_eq!(d.spilled, 4);
        let w = Workload { replicas: 50, ..w };
        let d = snap.place(&w, &Policy::default());
        assert_eq!(d.unplaced, 2);
        assert!(
            d.why_pending(3, &req).starts_with(
                "3/3 shards fit 2 more replica(s): 3 lack room for a replica of cpu 1, memory 1Gi"
            ),
            "{}",
            d.why_pending(3, &req)
        );
    }

    #[test]
    fn weights_divide_and_capacity_caps() {
        let snap = snapshot(&[("a", 10, 8000), ("b", 10, 8000), ("c", 10, 8000)]);
        let req = one_cpu();
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t1",
            replicas: 100,
            request: &req,
            current: &none,
        };
        let weights: BTreeMap<String, u64> =
            [("a".into(), 1), ("b".into(), 2), ("c".into(), 1)].into();
        let policy = Policy {
            mode: Mode::Weighted(weights.clone()),
            ..Default::default()
        };
        let d = snap.place(&w, &policy);
        assert_eq!(
            d.shares,
            [("a".into(), 25), ("b".into(), 50), ("c".into(), 25)].into()
        );
        // b has room for 20 only: the rest goes to a and c by their weights.
        let mut snap = snap;
        snap.shards.get_mut("b").expect("b").summary = Some(summary(10, 2000));
        let d = snap.place(&w, &policy);
        assert_eq!(
            d.shares,
            [("a".into(), 40), ("b".into(), 20), ("c".into(), 40)].into()
        );
        assert_eq!(d.unplaced, 0);
    }

    #[test]
    fn whole_goes_where_all_fit_or_waits() {
        let snap = snapshot(&[("a", 1, 8000), ("b", 4, 8000)]);
        let req = one_cpu();
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t1",
            replicas: 20,
            request: &req,
            current: &none,
        };
        let policy = Policy {
            mode: Mode::Whole,
            ..Default::default()
        };
        let d = snap.place(&w, &policy);
        assert_eq!(d.shares, [("b".into(), 20)].into());
        let w = Workload { replicas: 40, ..w };
        let d = snap.place(&w, &policy);
        assert!(d.shares.is_empty());
        assert_eq!(d.unplaced, 40);
    }

    #[test]
    fn only_an_untolerated_no_execute_taint_or_a_shard_gone_evicts() {
        let mut snap = snapshot(&[("a", 2, 8000), ("b", 2, 8000)]);
        let plain = Policy::default();
        assert_eq!(snap.evicts("a", &plain), None);
        snap.shards.get_mut("a").expect("a").taints = vec![Taint {
            key: "tessera.io/unreachable".into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        }];
        snap.shards.get_mut("a").expect("a").unschedulable = true;
        assert_eq!(snap.evicts("a", &plain), None, "cordons keep what runs");
        snap.shards.get_mut("b").expect("b").taints = vec![Taint {
            key: "tessera.io/drain".into(),
            value: String::new(),
            effect: "NoExecute".into(),
        }];
        assert_eq!(
            snap.evicts("b", &plain).as_deref(),
            Some("shard b has taint tessera.io/drain:NoExecute")
        );
        let tolerant = Policy {
            tolerations: vec![Toleration {
                key: "tessera.io/drain".into(),
                operator: "Exists".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(snap.evicts("b", &tolerant), None);
        assert!(snap.evicts("c", &plain).is_some(), "a shard that left");
    }

    #[test]
    fn taints_affinity_cordons_and_readiness_exclude_with_reasons() {
        let mut snap = snapshot(&[
            ("a", 4, 8000),
            ("b", 4, 8000),
            ("c", 4, 8000),
            ("d", 4, 8000),
        ]);
        snap.shards.get_mut("a").expect("a").taints = vec![Taint {
            key: "dedicated".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into(),
        }];
        snap.shards.get_mut("b").expect("b").unschedulable = true;
        snap.shards.get_mut("c").expect("c").ready = false;
        snap.shards
            .get_mut("d")
            .expect("d")
            .labels
            .insert("region".into(), "eu".into());
        let req = one_cpu();
        let none = BTreeMap::new();
        let w = Workload {
            tenant: "t1",
            replicas: 5,
            request: &req,
            current: &none,
        };
        let d = snap.place(&w, &Policy::default());
        assert_eq!(d.shares, [("d".into(), 5)].into());
        let policy = Policy {
            shard_labels: [("region".into(), "us".into())].into(),
            ..Default::default()
        };
        let d = snap.place(&w, &policy);
        assert_eq!(d.unplaced, 5);
        let why = d.why_pending(4, &req);
        assert!(why.contains("4 lacks label region=us"), "{why}");
        let d = snap.place(&w, &Policy::default());
        let reasons: Vec<String> = d.skipped.iter().map(|(n, s)| format!("{n} {s}")).collect();
        assert!(reasons.contains(&"a has taint dedicated=gpu:NoSchedule".to_owned()));
        assert!(reasons.contains(&"b is cordoned".to_owned()));
        assert!(reasons.contains(&"c is not ready".to_owned()));
        let tolerant = Policy {
            tolerations: vec![Toleration {
                key: "dedicated".into(),
                operator: "Exists".into(),
                ..Default::default()
            }],
            shard_names: vec!["a".into()],
            ..Default::default()
        };
        assert_eq!(snap.place(&w, &tolerant).shares, [("a".into(), 5)].into());
    }

    #[test]
    fn replicas_already_running_count_as_room() {
        // Full shard, but the workload's own 10 replicas run there: scaling to 10 keeps them.
        let snap = snapshot(&[("a", 1, 0)]);
        let req = one_cpu();
        let current: BTreeMap<String, u64> = [("a".into(), 10)].into();
        let w = Workload {
            tenant: "t1",
            replicas: 10,
            request: &req,
            current: &current,
        };
        assert_eq!(snap.place(&w, &Policy::default()).shares, current);
    }

    #[test]
    fn divide_is_proportional_and_respects_caps() {
        assert_eq!(
            divide(4, &[("a", 1, 10), ("b", 2, 10), ("c", 1, 10)]),
            [1, 2, 1]
        );
        assert_eq!(divide(5, &[("a", 1, 10), ("b", 1, 10)]), [3, 2]);
        assert_eq!(divide(10, &[("a", 1, 1), ("b", 1, 100)]), [1, 9]);
        assert_eq!(divide(10, &[("a", 1, 2), ("b", 1, 3)]), [2, 3]);
        assert_eq!(divide(0, &[("a", 1, 2)]), [0]);
    }

    fn arb_snapshot() -> impl Strategy<Value = Vec<(u64, u64)>> {
        prop::collection::vec((0u64..6, 0u64..8_001), 1..8)
    }

    fn mode() -> impl Strategy<Value = u8> {
        0u8..5
    }

    proptest! {
        /// No decision gives a shard more than its summary says fits, it places everything
        /// that fits somewhere (for Home), and the same input gives the same decision.
        #[test]
        fn placement_never_exceeds_free_capacity_and_is_deterministic(
            shards in arb_snapshot(), replicas in 0u64..200, cpu in 1u64..4_000, m in mode(),
            weights in prop::collection::vec(0u64..5, 8),
        ) {
            let names: Vec<String> = (0..shards.len()).map(|i| format!("s{i}")).collect();
            let spec: Vec<(&str, u64, u64)> = names
                .iter()
                .zip(&shards)
                .map(|(n, (nodes, free))| (n.as_str(), *nodes, *free))
                .collect();
            let snap = snapshot(&spec);
            let req = Request::cpu_memory(cpu, GI);
            let none = BTreeMap::new();
            let w = Workload { tenant: "t", replicas, request: &req, current: &none };
            let mode = match m {
                0 => Mode::Home,
                1 => Mode::Duplicated,
                2 => Mode::Whole,
                3 => Mode::ByCapacity,
                _ => Mode::Weighted(names.iter().cloned().zip(weights.iter().copied()).collect()),
            };
            let policy = Policy { mode: mode.clone(), ..Default::default() };
            let d = snap.place(&w, &policy);
            let mut total = 0;
            for (name, n) in &d.shares {
                let sum = snap.shards[name].summary.as_ref().expect("summary");
                let fits = sum.fits(&req.vector_for(sum).expect("known"));
                prop_assert!(*n <= fits, "{} got {} but fits {}", name, n, fits);
                // And the real per-node truth: each node has `free` cpu.
                prop_assert!(*n * cpu <= sum.free[0]);
                total += n;
            }
            if mode != Mode::Duplicated {
                prop_assert_eq!(total + d.unplaced, replicas);
            }
            if mode == Mode::Home {
                let all: u64 = snap.shards.values().map(|s| {
                    let sum = s.summary.as_ref().expect("summary");
                    sum.fits(&req.vector_for(sum).expect("known"))
                }).sum();
                prop_assert_eq!(d.unplaced, replicas.saturating_sub(all));
            }
            prop_assert_eq!(snap.place(&w, &policy), d);
        }

        /// Home and Whole walk the tenant's shards only until they settle: the same shares,
        /// spill-over and unplaced replicas as looking at every shard first, and the same
        /// reasons whenever something waits. Tenants and shards vary, some not ready and
        /// one not yet on the map.
        #[test]
        fn walking_the_list_decides_as_looking_at_every_shard(
            shards in arb_snapshot(), replicas in 0u64..200, cpu in 1u64..4_000,
            whole in any::<bool>(), tenant in "[a-z]{1,8}", not_ready in 0usize..8,
        ) {
            let names: Vec<String> = (0..shards.len()).map(|i| format!("s{i}")).collect();
            let spec: Vec<(&str, u64, u64)> = names
                .iter()
                .zip(&shards)
                .map(|(n, (nodes, free))| (n.as_str(), *nodes, *free))
                .collect();
            let mut snap = snapshot(&spec);
            if let Some(s) = names.get(not_ready).and_then(|n| snap.shards.get_mut(n)) {
                s.ready = false;
            }
            // A shard that joined after the map was made: last on every list.
            let mut late = snap.shards.values().next().cloned().expect("a shard");
            late.ready = true;
            snap.shards.insert("zz-late".into(), late);
            let req = Request::cpu_memory(cpu, GI);
            let none = BTreeMap::new();
            let w = Workload { tenant: &tenant, replicas, request: &req, current: &none };
            let policy = Policy {
                mode: if whole { Mode::Whole } else { Mode::Home },
                ..Default::default()
            };
            let walked = snap.place(&w, &policy);
            let all = snap.place_looking_at_all(&w, &policy);
            prop_assert_eq!(&walked.shares, &all.shares);
            prop_assert_eq!(walked.unplaced, all.unplaced);
            prop_assert_eq!(walked.spilled, all.spilled);
            if walked.unplaced > 0 {
                // The same reasons (their order is not part of the decision: the message
                // counts them), so the same message.
                let sorted = |d: &Decision| {
                    let mut v: Vec<String> = d.skipped.iter().map(|(n, s)| format!("{n}:{s:?}")).collect();
                    v.sort();
                    v
                };
                prop_assert_eq!(sorted(&walked), sorted(&all));
                prop_assert_eq!(
                    walked.why_pending(snap.shards.len(), &req),
                    all.why_pending(snap.shards.len(), &req)
                );
            }
        }

        /// With room everywhere, weighted shares are within one replica of the exact
        /// proportion.
        #[test]
        fn weights_are_honoured_within_one_replica(
            replicas in 0u64..1_000, weights in prop::collection::vec(1u64..10, 1..8),
        ) {
            let names: Vec<String> = (0..weights.len()).map(|i| format!("s{i}")).collect();
            let spec: Vec<(&str, u64, u64)> = names.iter().map(|n| (n.as_str(), 20, 8000)).collect();
            let snap = snapshot(&spec);
            let req = Request::cpu_memory(100, 1);
            let none = BTreeMap::new();
            let w = Workload { tenant: "t", replicas, request: &req, current: &none };
            let policy = Policy {
                mode: Mode::Weighted(names.iter().cloned().zip(weights.iter().copied()).collect()),
                ..Default::default()
            };
            let d = snap.place(&w, &policy);
            let wsum: u64 = weights.iter().sum();
            for (name, wt) in names.iter().zip(&weights) {
                let got = d.shares.get(name).copied().unwrap_or(0) as f64;
                let exact = replicas as f64 * *wt as f64 / wsum as f64;
                prop_assert!((got - exact).abs() < 1.0, "{} got {} exact {}", name, got, exact);
            }
            prop_assert_eq!(d.unplaced, 0);
        }

        /// Committing decisions one after another never overfills: the sum over workloads
        /// placed on one snapshot stays within each shard's first summary.
        #[test]
        fn committed_decisions_do_not_double_count_room(
            shards in arb_snapshot(), sizes in prop::collection::vec((1u64..30, 1u64..4_000), 1..20),
        ) {
            let names: Vec<String> = (0..shards.len()).map(|i| format!("s{i}")).collect();
            let spec: Vec<(&str, u64, u64)> = names
                .iter()
                .zip(&shards)
                .map(|(n, (nodes, free))| (n.as_str(), *nodes, *free))
                .collect();
            let mut snap = snapshot(&spec);
            let before: BTreeMap<String, u64> = snap.shards.iter().map(|(n, s)| (n.clone(), s.summary.as_ref().expect("s").free[0])).collect();
            let mut used: BTreeMap<String, u64> = BTreeMap::new();
            let none = BTreeMap::new();
            for (i, (replicas, cpu)) in sizes.iter().enumerate() {
                let req = Request::cpu_memory(*cpu, 1);
                let tenant = format!("t{i}");
                let w = Workload { tenant: &tenant, replicas: *replicas, request: &req, current: &none };
                let d = snap.place(&w, &Policy::default());
                snap.commit(&w, &d);
                for (n, k) in &d.shares {
                    *used.entry(n.clone()).or_default() += k * cpu;
                }
            }
            for (n, u) in used {
                prop_assert!(u <= before[&n], "{} used {} of {}", n, u, before[&n]);
            }
        }
    }
}
