//! The tenant → shard map.
//!
//! Each shard holds virtual nodes on a hash ring in proportion to its capacity weight; a
//! tenant's **preference list** is the shards met walking the ring clockwise from the
//! tenant's hash, each once. The first is its **home** shard; its work spills over down the
//! list when the home shard is full, so a tenant stays on few shards. When a shard joins,
//! only the tenants whose preference it now heads move to it (about its share of all
//! tenants); when one leaves, only its tenants move, each to the next shard on its own list.
//!
//! The ring is `consistent_hash`'s `StaticHashRing` (the design card's crate) with its
//! `SipHash 1-3` under fixed keys: the same placement on every replica and across restarts.
//! A map carries a version so that the federation can persist it and say which one a
//! decision was made on.

use consistent_hash::{DefaultHash, Node, StaticHashRing};

/// The weight of a standard shard: its number of virtual nodes. Enough for an even spread
/// (a shard's share varies by about `1/sqrt(VNODES)` of itself), few enough that building the
/// ring for a thousand shards stays in milliseconds. The federation gives a shard
/// `VNODES × its capacity / a standard shard's capacity`.
pub const VNODES: u64 = 160;

/// The most virtual nodes one shard gets, whatever its weight.
pub const MAX_VNODES: u64 = 64 * VNODES;

/// A shard and its capacity weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardWeight {
    /// The shard's name.
    pub name: String,
    /// Its weight: the number of virtual nodes it holds on the ring ([`VNODES`] for a
    /// standard shard, at most [`MAX_VNODES`]), so its share is `weight / total`. A function
    /// of the shard's own capacity only: another shard joining changes no one else's weight,
    /// and so moves no tenant between the shards already there. Must be positive.
    pub weight: u64,
}

impl ShardWeight {
    /// A shard of `weight`.
    pub fn new(name: impl Into<String>, weight: u64) -> Self {
        ShardWeight {
            name: name.into(),
            weight,
        }
    }
}

/// Why a map cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MapError {
    /// Two shards of one name.
    #[error("shard {0:?} is listed twice: shard names must be unique")]
    Duplicate(String),
    /// A shard of weight 0.
    #[error(
        "shard {0:?} has weight 0: a shard in the map needs a positive capacity weight (cordon it instead)"
    )]
    ZeroWeight(String),
    /// A shard without a name.
    #[error("a shard has an empty name")]
    EmptyName,
}

/// The tenant → shard map of one moment.
pub struct ShardMap {
    version: u64,
    shards: Vec<ShardWeight>,
    ring: Option<StaticHashRing<'static, String, (), DefaultHash>>,
}

impl std::fmt::Debug for ShardMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMap")
            .field("version", &self.version)
            .field("shards", &self.shards)
            .finish()
    }
}

impl ShardMap {
    /// The map of `shards` (in any order: the result does not depend on it), as version
    /// `version`.
    pub fn new(version: u64, shards: &[ShardWeight]) -> Result<ShardMap, MapError> {
        let mut sorted = shards.to_vec();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        for w in sorted.windows(2) {
            if w[0].name == w[1].name {
                return Err(MapError::Duplicate(w[0].name.clone()));
            }
        }
        for s in &sorted {
            if s.name.is_empty() {
                return Err(MapError::EmptyName);
            }
            if s.weight == 0 {
                return Err(MapError::ZeroWeight(s.name.clone()));
            }
        }
        // Virtual nodes are hashed by the shard's name and sequence number: a shard keeps its
        // points on the ring whoever joins or leaves.
        let ring = (!sorted.is_empty()).then(|| {
            StaticHashRing::new(
                DefaultHash,
                sorted
                    .iter()
                    .map(|s| Node::new(s.name.clone()).quantity(s.weight.min(MAX_VNODES) as usize)),
            )
        });
        Ok(ShardMap {
            version,
            shards: sorted,
            ring,
        })
    }

    /// Its version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The shards in it, by name.
    pub fn shards(&self) -> &[ShardWeight] {
        &self.shards
    }

    /// The shards for `tenant` in order of preference: its home first, then where its work
    /// spills over. Every shard appears once.
    pub fn preference(&self, tenant: &str) -> Vec<&str> {
        let key = Self::key(tenant);
        match &self.ring {
            Some(r) => r.calc_candidates(&key).map(|n| n.key.as_str()).collect(),
            None => Vec::new(),
        }
    }

    /// [`ShardMap::preference`] as it is walked: each shard is found only when asked for,
    /// so a decision that settles on the first shards does not hash through the whole ring.
    pub fn candidates<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let key = Self::key(tenant);
        self.ring
            .as_ref()
            .into_iter()
            .flat_map(move |r| r.calc_candidates(&key).map(|n| n.key.as_str()))
    }

    /// Whether shard `name` is on the map.
    pub fn contains(&self, name: &str) -> bool {
        self.shards
            .binary_search_by(|w| w.name.as_str().cmp(name))
            .is_ok()
    }

    /// The tenant's home shard (none in an empty map).
    pub fn home(&self, tenant: &str) -> Option<&str> {
        let key = Self::key(tenant);
        let ring = self.ring.as_ref()?;
        ring.calc_candidates(&key).next().map(|n| n.key.as_str())
    }

    /// What is hashed for a tenant: its name under a prefix of its own, so that a tenant
    /// and a shard of the same name do not collide with the shard's virtual nodes.
    fn key(tenant: &str) -> (&'static str, &str) {
        ("tenant", tenant)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    fn shards(n: usize) -> Vec<ShardWeight> {
        (0..n)
            .map(|i| ShardWeight::new(format!("shard-{i}"), VNODES))
            .collect()
    }

    fn tenants(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("tenant-{i}")).collect()
    }

    fn homes(m: &ShardMap, ts: &[String]) -> Vec<String> {
        ts.iter()
            .map(|t| m.home(t).expect("a home").to_owned())
            .collect()
    }

    #[test]
    fn invalid_maps_are_refused_with_the_reason() {
        let dup = [ShardWeight::new("a", 1), ShardWeight::new("a", 2)];
        assert_eq!(
            ShardMap::new(1, &dup).expect_err("dup"),
            MapError::Duplicate("a".into())
        );
        let zero = [ShardWeight::new("a", 0)];
        let e = ShardMap::new(1, &zero).expect_err("zero");
        assert!(e.to_string().contains("weight 0"), "{e}");
        assert_eq!(
            ShardMap::new(1, &[ShardWeight::new("", 1)]).expect_err("empty"),
            MapError::EmptyName
        );
        let empty = ShardMap::new(1, &[]).expect("an empty map");
        assert_eq!(empty.home("t"), None);
        assert!(empty.preference("t").is_empty());
    }

    #[test]
    fn a_preference_list_names_every_shard_once_home_first() {
        let m = ShardMap::new(7, &shards(5)).expect("map");
        assert_eq!(m.version(), 7);
        let list = m.preference("acme");
        assert_eq!(list.len(), 5);
        assert_eq!(list.iter().collect::<HashSet<_>>().len(), 5);
        assert_eq!(Some(list[0]), m.home("acme"));
    }

    #[test]
    fn shares_follow_weights() {
        let mut s = shards(4);
        s[0].weight = 3 * VNODES; // three times the others
        let m = ShardMap::new(1, &s).expect("map");
        let ts = tenants(20_000);
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for h in homes(&m, &ts) {
            *count.entry(h).or_default() += 1;
        }
        // Expected: 3/6 for shard-0, 1/6 for each other; within 15 % of that.
        let big = count["shard-0"] as f64 / ts.len() as f64;
        assert!((big - 0.5).abs() < 0.5 * 0.15, "shard-0 has {big}");
        for i in 1..4 {
            let share = count[&format!("shard-{i}")] as f64 / ts.len() as f64;
            assert!(
                (share - 1.0 / 6.0).abs() < (1.0 / 6.0) * 0.15,
                "shard-{i} has {share}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// A shard joining takes only tenants that now prefer it (≈ its share), and nobody
        /// else moves; one leaving moves only its own tenants, each to the next shard on its
        /// own list.
        #[test]
        fn joins_and_leaves_move_only_what_they_must(n in 2usize..24, seed in 0u64..1_000) {
            let ts: Vec<String> = (0..3_000).map(|i| format!("t{seed}-{i}")).collect();
            let before = ShardMap::new(1, &shards(n)).expect("map");
            let mut grown = shards(n);
            grown.push(ShardWeight::new("newcomer", VNODES));
            let after = ShardMap::new(2, &grown).expect("map");
            let (h0, h1) = (homes(&before, &ts), homes(&after, &ts));
            let moved = h0.iter().zip(&h1).filter(|(a, b)| a != b).count();
            for (a, b) in h0.iter().zip(&h1) {
                prop_assert!(a == b || b == "newcomer", "a tenant moved from {a} to {b}");
            }
            // Its fair share is 1/(n+1); allow for the ring's spread (1,000 random cases
            // stayed under 1.35 times it).
            let share = moved as f64 / ts.len() as f64;
            let fair = 1.0 / (n as f64 + 1.0);
            prop_assert!(share <= fair * 1.5 + 0.01, "{share} moved, fair share {fair}");

            // Leaving: shard-0 goes; its tenants go to their second choice, nobody else moves.
            let shrunk: Vec<ShardWeight> = shards(n).into_iter().skip(1).collect();
            let left = ShardMap::new(3, &shrunk).expect("map");
            for t in &ts {
                let old = before.preference(t);
                let new = left.home(t).expect("home");
                if old[0] == "shard-0" {
                    prop_assert_eq!(new, old[1]);
                } else {
                    prop_assert_eq!(new, old[0]);
                }
            }
        }

        /// The same shards in any order give the same map.
        #[test]
        fn the_map_does_not_depend_on_the_order_shards_are_listed(n in 1usize..16, rot in 0usize..16) {
            let a = shards(n);
            let mut b = a.clone();
            b.rotate_left(rot % n);
            b.reverse();
            let (ma, mb) = (ShardMap::new(1, &a).expect("a"), ShardMap::new(1, &b).expect("b"));
            for t in tenants(200) {
                prop_assert_eq!(ma.preference(&t), mb.preference(&t));
            }
        }
    }
}
