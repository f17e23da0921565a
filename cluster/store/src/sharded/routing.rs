//! Which backend holds a key: by resource (Kubernetes' `--etcd-servers-overrides`) and by
//! tenant (the namespace hashed over the tenant shards with a consistent-hash ring).

use std::collections::HashMap;

use consistent_hash::{DefaultHash, Node, StaticHashRing};

/// Virtual nodes per tenant shard on the ring: enough for an even spread at a handful of
/// shards, few enough that building the ring is instant.
const VNODES: usize = 128;

pub use tessera_core::keys::resource_segment;

/// Maps keys and prefixes to backend indexes. Index 0 is the default backend, then one per
/// resource override, then one per tenant shard.
pub(crate) struct Router {
    root: String,
    overrides: HashMap<String, usize>,
    first_tenant: usize,
    tenants: usize,
    ring: Option<StaticHashRing<'static, usize, (), DefaultHash>>,
    parts: usize,
}

/// The backends a prefix can touch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parts {
    One(usize),
    Many(Vec<usize>),
}

impl Parts {
    pub fn indexes(&self) -> Vec<usize> {
        match self {
            Parts::One(i) => vec![*i],
            Parts::Many(v) => v.clone(),
        }
    }
}

impl Router {
    /// `overrides` lists resource key segments in backend order (backend 1, 2, ...).
    pub fn new(root: &str, overrides: &[String], tenants: usize) -> Router {
        let overrides_map: HashMap<String, usize> = overrides
            .iter()
            .enumerate()
            .map(|(i, r)| (r.clone(), i + 1))
            .collect();
        let first_tenant = 1 + overrides.len();
        let ring = (tenants > 0).then(|| {
            StaticHashRing::new(
                DefaultHash,
                (0..tenants).map(|i| Node::new(i).quantity(VNODES)),
            )
        });
        Router {
            root: root.to_owned(),
            overrides: overrides_map,
            first_tenant,
            tenants,
            ring,
            parts: first_tenant + tenants,
        }
    }

    /// The tenant shard a namespace lives on (an index among the tenant shards).
    pub fn tenant_shard(&self, namespace: &str) -> Option<usize> {
        let ring = self.ring.as_ref()?;
        ring.calc_candidates(&namespace).next().map(|n| n.key)
    }

    fn segments<'a>(&self, path: &'a [u8]) -> Option<Vec<&'a [u8]>> {
        let rest = path.strip_prefix(self.root.as_bytes())?;
        Some(rest.split(|b| *b == b'/').collect())
    }

    /// The backend that holds `key`.
    pub fn route_key(&self, key: &[u8]) -> usize {
        let Some(segs) = self.segments(key) else {
            return 0;
        };
        let resource = std::str::from_utf8(segs[0]).unwrap_or("");
        if let Some(i) = self.overrides.get(resource) {
            return *i;
        }
        match (segs.len(), self.tenants) {
            (3, n) if n > 0 => {
                let ns = std::str::from_utf8(segs[1]).unwrap_or("");
                self.first_tenant + self.tenant_shard(ns).unwrap_or(0)
            }
            _ => 0,
        }
    }

    /// The backends that can hold keys under `prefix`.
    pub fn route_prefix(&self, prefix: &[u8]) -> Parts {
        let all = || Parts::Many((0..self.parts).collect());
        let Some(segs) = self.segments(prefix) else {
            return if self.root.as_bytes().starts_with(prefix) {
                all()
            } else {
                Parts::One(0)
            };
        };
        // segs ends with "" when the prefix ends in '/': that segment is complete.
        let complete = |i: usize| segs.len() > i + 1;
        if !complete(0) {
            return all();
        }
        let resource = std::str::from_utf8(segs[0]).unwrap_or("");
        if let Some(i) = self.overrides.get(resource) {
            return Parts::One(*i);
        }
        if self.tenants == 0 {
            return Parts::One(0);
        }
        if complete(1) {
            // `/root/<resource>/<namespace>/...`: only namespaced keys of one namespace.
            let ns = std::str::from_utf8(segs[1]).unwrap_or("");
            return Parts::One(self.first_tenant + self.tenant_shard(ns).unwrap_or(0));
        }
        // Cluster-scoped keys of this resource live in the default backend, namespaced ones
        // on the tenant shards.
        let mut v = vec![0];
        v.extend(self.first_tenant..self.parts);
        Parts::Many(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        Router::new("/registry/", &["events".to_owned()], 3)
    }

    #[test]
    fn keys_route_by_resource_then_namespace() {
        let r = router();
        assert_eq!(r.route_key(b"/registry/events/ns1/e1"), 1);
        assert_eq!(r.route_key(b"/registry/nodes/n1"), 0);
        assert_eq!(r.route_key(b"/other/x"), 0);
        let a = r.route_key(b"/registry/pods/team-a/p1");
        assert!((2..5).contains(&a));
        assert_eq!(r.route_key(b"/registry/deployments/team-a/d"), a);
        assert_eq!(
            r.route_prefix(b"/registry/pods/team-a/"),
            Parts::One(a),
            "a namespace's list touches one shard"
        );
    }

    #[test]
    fn prefixes_fan_out_only_where_needed() {
        let r = router();
        assert_eq!(r.route_prefix(b"/registry/events/"), Parts::One(1));
        assert_eq!(
            r.route_prefix(b"/registry/pods/"),
            Parts::Many(vec![0, 2, 3, 4])
        );
        assert_eq!(
            r.route_prefix(b"/registry/"),
            Parts::Many(vec![0, 1, 2, 3, 4])
        );
        assert_eq!(
            r.route_prefix(b"/registry/po"),
            Parts::Many(vec![0, 1, 2, 3, 4])
        );
        assert_eq!(r.route_prefix(b"/"), Parts::Many(vec![0, 1, 2, 3, 4]));
        let plain = Router::new("/registry/", &[], 0);
        assert_eq!(plain.route_prefix(b"/registry/pods/"), Parts::One(0));
    }

    #[test]
    fn namespaces_spread_over_tenant_shards() {
        let r = Router::new("/registry/", &[], 4);
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            counts[r.tenant_shard(&format!("tenant-{i}")).expect("ring")] += 1;
        }
        for c in counts {
            assert!((600..1400).contains(&c), "uneven spread: {counts:?}");
        }
    }

    #[test]
    fn adding_a_shard_moves_only_some_namespaces() {
        let before = Router::new("/registry/", &[], 4);
        let after = Router::new("/registry/", &[], 5);
        let moved = (0..4000)
            .filter(|i| {
                let ns = format!("tenant-{i}");
                before.tenant_shard(&ns) != after.tenant_shard(&ns)
            })
            .count();
        // Ideal is 1/5 of them; a modulo hash would move 4/5.
        assert!(moved < 1400, "{moved} of 4000 moved");
    }

    proptest::proptest! {
        /// Every key is found by a list or watch of every one of its prefixes: the backend it
        /// is stored on is always among the backends the prefix fans out to.
        #[test]
        fn every_prefix_of_a_key_covers_its_backend(
            resource in proptest::sample::select(vec!["pods", "events", "nodes", "podgroups.tessera.io"]),
            namespace in "[a-z][a-z0-9-]{0,12}",
            name in "[a-z0-9.-]{1,12}",
            namespaced in proptest::bool::ANY,
            tenants in 0usize..5,
        ) {
            let r = Router::new("/registry/", &["events".to_owned()], tenants);
            let key = if namespaced {
                format!("/registry/{resource}/{namespace}/{name}")
            } else {
                format!("/registry/{resource}/{name}")
            };
            let home = r.route_key(key.as_bytes());
            proptest::prop_assert!(home < 2 + tenants);
            for cut in 1..=key.len() {
                let prefix = &key.as_bytes()[..cut];
                proptest::prop_assert!(
                    r.route_prefix(prefix).indexes().contains(&home),
                    "{key} lives on {home} but {:?} fans out to {:?}",
                    String::from_utf8_lossy(prefix),
                    r.route_prefix(prefix)
                );
            }
        }
    }
}
