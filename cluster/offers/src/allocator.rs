//! Dominant Resource Fairness over offers (Ghodsi et al., NSDI 2011, as Mesos' allocator
//! applies it): each free node is offered whole to the framework whose role has the least
//! weighted dominant share — its largest fraction of any one resource of the shard, divided
//! by its weight — and offered resources count as that framework's until they come back.
//! Pure: the service hands in nodes and frameworks and sends the offers this decides.

use std::collections::HashMap;

/// cpu (milli) and memory (bytes).
pub type Amounts = [i64; 2];

/// A node with room to offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeNode {
    /// Its name.
    pub name: String,
    /// What is free on it now (allocatable less what its pods, tasks being launched and
    /// outstanding offers hold).
    pub free: Amounts,
}

/// A framework as the allocator sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Its id.
    pub id: String,
    /// The role its share counts under.
    pub role: String,
    /// The role's weight (> 0).
    pub weight: f64,
    /// What it holds: its tasks' requests and its outstanding offers (in every shard, for a
    /// framework of the fleet).
    pub holds: Amounts,
    /// What its share is a share of: the shard's offerable total, or the fleet's.
    pub total: Amounts,
    /// How much a node offered here in this round counts towards its share, per resource:
    /// 1, or for a framework of the fleet the fleet's total over this shard's — every shard
    /// offers its free nodes in the same round, each from the same (slightly old) ledger, so
    /// each corrects its own part of an imbalance, not all of it.
    pub scale: [f64; 2],
    /// Nodes it declined, not to be offered to it again yet.
    pub refuses: Vec<String>,
}

/// The dominant share of `holds` out of `total`.
pub fn dominant_share(holds: &Amounts, total: &Amounts) -> f64 {
    holds
        .iter()
        .zip(total)
        .filter(|(_, t)| **t > 0)
        .map(|(h, t)| *h as f64 / *t as f64)
        .fold(0.0, f64::max)
}

/// Offers each node in `nodes` (in order) to one framework: the one whose role's weighted
/// dominant share is least (then its own share, then its id), among those not refusing the
/// node; each offer counts toward its framework's share for the next. Frameworks of one role
/// should share one `total`. Nodes with less than `min` of a resource free are not offered.
/// Returns (candidate index, node index) pairs.
pub fn allocate(
    nodes: &[FreeNode],
    candidates: &[Candidate],
    min: &Amounts,
) -> Vec<(usize, usize)> {
    let mut holds: Vec<Amounts> = candidates.iter().map(|c| c.holds).collect();
    let mut out = Vec::new();
    for (ni, node) in nodes.iter().enumerate() {
        if node.free.iter().zip(min).any(|(f, m)| f < m) {
            continue;
        }
        // Each role's holdings, as of the offers made so far.
        let mut by_role: HashMap<&str, Amounts> = HashMap::new();
        for (c, h) in candidates.iter().zip(&holds) {
            let r = by_role.entry(c.role.as_str()).or_default();
            r[0] += h[0];
            r[1] += h[1];
        }
        let key = |i: usize| {
            let c = &candidates[i];
            let role = dominant_share(&by_role[c.role.as_str()], &c.total) / c.weight.max(1e-9);
            (role, dominant_share(&holds[i], &c.total))
        };
        let best = (0..candidates.len())
            .filter(|i| !candidates[*i].refuses.iter().any(|n| n == &node.name))
            .min_by(|a, b| {
                key(*a)
                    .partial_cmp(&key(*b))
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| candidates[*a].id.cmp(&candidates[*b].id))
            });
        if let Some(i) = best {
            let scale = candidates[i].scale;
            holds[i][0] += (node.free[0] as f64 * scale[0]) as i64;
            holds[i][1] += (node.free[1] as f64 * scale[1]) as i64;
            out.push((i, ni));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: i64 = 1 << 30;

    fn node(name: &str, cpu: i64, mem: i64) -> FreeNode {
        FreeNode {
            name: name.into(),
            free: [cpu, mem],
        }
    }

    fn fw(id: &str, role: &str, weight: f64, holds: Amounts, total: Amounts) -> Candidate {
        Candidate {
            id: id.into(),
            role: role.into(),
            weight,
            holds,
            total,
            scale: [1.0, 1.0],
            refuses: Vec::new(),
        }
    }

    #[test]
    fn the_dominant_share_is_the_largest_fraction() {
        let total = [10_000, 100 * GI];
        assert_eq!(dominant_share(&[1_000, 50 * GI], &total), 0.5);
        assert_eq!(dominant_share(&[5_000, GI], &total), 0.5);
        assert_eq!(dominant_share(&[0, 0], &total), 0.0);
        assert_eq!(dominant_share(&[5, 5], &[0, 0]), 0.0, "nothing to share");
    }

    #[test]
    fn the_least_served_framework_gets_each_node_in_turn() {
        let total = [8_000, 32 * GI];
        let nodes = [
            node("a", 2_000, 8 * GI),
            node("b", 2_000, 8 * GI),
            node("c", 2_000, 8 * GI),
        ];
        let fws = [
            fw("x", "r1", 1.0, [0, 0], total),
            fw("y", "r2", 1.0, [2_000, 0], total),
        ];
        // x holds nothing: it gets a. Then both hold a quarter: the tie goes to x by id,
        // and x, now at a half, leaves c to y.
        let got = allocate(&nodes, &fws, &[100, 0]);
        assert_eq!(got, [(0, 0), (0, 1), (1, 2)]);
    }

    #[test]
    fn weights_scale_the_share_a_role_may_reach() {
        let total = [40_000, 160 * GI];
        let nodes: Vec<FreeNode> = (0..40)
            .map(|i| node(&format!("n{i}"), 1_000, 4 * GI))
            .collect();
        let fws = [
            fw("light", "r1", 1.0, [0, 0], total),
            fw("heavy", "r3", 3.0, [0, 0], total),
        ];
        let got = allocate(&nodes, &fws, &[0, 0]);
        let heavy = got.iter().filter(|(c, _)| *c == 1).count();
        assert_eq!(heavy, 30, "three quarters to the weight-3 role");
    }

    #[test]
    fn frameworks_of_one_role_share_its_share() {
        let total = [4_000, 16 * GI];
        let nodes: Vec<FreeNode> = (0..4)
            .map(|i| node(&format!("n{i}"), 1_000, 4 * GI))
            .collect();
        // Two frameworks in role r, one in role s: r's two get half between them.
        let fws = [
            fw("a", "r", 1.0, [0, 0], total),
            fw("b", "r", 1.0, [0, 0], total),
            fw("c", "s", 1.0, [0, 0], total),
        ];
        let got = allocate(&nodes, &fws, &[0, 0]);
        let to_c = got.iter().filter(|(c, _)| *c == 2).count();
        assert_eq!(to_c, 2, "{got:?}");
    }

    #[test]
    fn a_refused_node_goes_to_the_next_and_small_nodes_to_nobody() {
        let total = [4_000, 16 * GI];
        let nodes = [node("a", 2_000, 8 * GI), node("tiny", 50, GI)];
        let mut x = fw("x", "r", 1.0, [0, 0], total);
        x.refuses = vec!["a".into()];
        let fws = [x, fw("y", "r2", 1.0, [3_000, 0], total)];
        assert_eq!(allocate(&nodes, &fws, &[100, 0]), [(1, 0)]);
        // Refused by everyone: not offered.
        let mut y = fws[1].clone();
        y.refuses = vec!["a".into()];
        assert!(allocate(&nodes, &[fws[0].clone(), y], &[100, 0]).is_empty());
    }

    #[test]
    fn a_fleet_framework_holding_much_elsewhere_yields_this_shards_nodes() {
        // The fleet offers 8 cpu, half of it here. x already holds 4 cpu in another shard,
        // y nothing: equal weights, so the fleet is even once y holds 4 too — every node
        // here goes to y, where a shard ranking by its own share alone would split them.
        let fleet = [8_000, 32 * GI];
        let nodes: Vec<FreeNode> = (0..4)
            .map(|i| node(&format!("n{i}"), 1_000, 4 * GI))
            .collect();
        let fws = [
            fw("x", "r1", 1.0, [4_000, 4 * GI], fleet),
            fw("y", "r2", 1.0, [0, 0], fleet),
        ];
        let got = allocate(&nodes, &fws, &[0, 0]);
        assert_eq!(got, [(1, 0), (1, 1), (1, 2), (1, 3)]);
        // Ranked by this shard alone, they split.
        let local = [4_000, 16 * GI];
        let fws = [
            fw("x", "r1", 1.0, [0, 0], local),
            fw("y", "r2", 1.0, [0, 0], local),
        ];
        let got = allocate(&nodes, &fws, &[0, 0]);
        assert_eq!(got.iter().filter(|(c, _)| *c == 1).count(), 2);
    }

    #[test]
    fn a_shard_corrects_only_its_part_of_a_fleet_imbalance_in_one_round() {
        // Four equal shards; x holds nothing, y holds 8 cpu elsewhere, out of a fleet of 32.
        // Here 8 nodes of 1 cpu are free.
        let fleet = [32_000, 128 * GI];
        let nodes: Vec<FreeNode> = (0..8)
            .map(|i| node(&format!("n{i}"), 1_000, 4 * GI))
            .collect();
        let x = fw("x", "r1", 1.0, [0, 0], fleet);
        let y = fw("y", "r2", 1.0, [8_000, 8 * GI], fleet);
        // Counted at face value, x gets all 8 here — and so in every shard at once: 32.
        let got = allocate(&nodes, &[x.clone(), y.clone()], &[0, 0]);
        assert_eq!(got.iter().filter(|(c, _)| *c == 0).count(), 8);
        // Counted at the fleet's scale (×4), x is level with y after 2 nodes (8 across the
        // four shards); the rest alternate, x first on ties.
        let (mut x, mut y) = (x, y);
        x.scale = [4.0, 4.0];
        y.scale = [4.0, 4.0];
        let got = allocate(&nodes, &[x, y], &[0, 0]);
        let to: Vec<usize> = got.iter().map(|(c, _)| *c).collect();
        assert_eq!(to, [0, 0, 0, 1, 0, 1, 0, 1]);
    }
}
