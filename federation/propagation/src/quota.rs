//! Fleet-wide tenant quotas: a Tenant's `spec.quota` bounds what the federation places for it
//! over **all** shards together, not in each shard alone (a Tenant is held by every shard,
//! so a shard's own check bounds only that shard).
//!
//! The ledger keeps, per tenant, what every placed workload holds: its pod's usage (as the
//! API server charges a pod: `cpu`, `requests.cpu`, `limits.memory`, `pods`, `count/pods`,
//! extended resources) times the replicas placed. Before a workload is placed, [`Ledger::admit`]
//! gives it as many replicas as fit in the quota beside what the tenant's other workloads hold,
//! and **reserves** them under the same lock, so two workloads placed at once can never share
//! the same room; [`Ledger::settle`] shrinks the reservation to what was placed. Like the
//! API server's quota admission, a quota lowered below what runs keeps what runs and holds
//! back what is new.
//!
//! Pure: the controller feeds it; no I/O here.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessera_core::quantity::Quantity;

/// Usage by quota name (`cpu`, `requests.memory`, `count/pods`, ...).
pub type Usage = BTreeMap<String, Quantity>;

/// What one workload holds.
#[derive(Clone, Debug, PartialEq)]
struct Charge {
    tenant: String,
    /// One pod's usage.
    per_pod: Usage,
    /// Replicas placed (or reserved).
    replicas: u64,
}

/// Why a workload got fewer replicas than it asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Replicas held back.
    pub replicas: u64,
    /// What to tell the user: the quota name that stops it, used and limit.
    pub why: String,
}

/// The tenants' placed usage.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Workload (queue key) → its charge.
    charges: HashMap<String, Charge>,
    /// Tenant → the sum of its workloads' charges.
    totals: HashMap<String, Usage>,
    /// Tenant → workloads held back by its quota (placed again when room frees).
    waiting: HashMap<String, BTreeSet<String>>,
}

fn add(total: &mut Usage, per_pod: &Usage, n: u64, plus: bool) {
    for (k, v) in per_pod {
        let e = total.entry(k.clone()).or_insert(Quantity::ZERO);
        *e = if plus {
            e.saturating_add(v.times(n))
        } else {
            e.saturating_sub(v.times(n))
        };
    }
}

impl Ledger {
    /// Records that `key` of `tenant` holds `replicas` pods of `per_pod` (replacing what it
    /// held). Returns whether the tenant's usage fell (so waiting workloads may fit now).
    pub fn set(&mut self, tenant: &str, key: &str, per_pod: Usage, replicas: u64) -> bool {
        let old = self.charges.remove(key);
        let fell = old.as_ref().is_some_and(|o| {
            o.tenant != tenant
                || o.replicas > replicas
                || o.per_pod.iter().any(|(k, v)| per_pod.get(k) < Some(v))
        });
        if let Some(o) = &old {
            self.take_out(o);
        }
        let charge = Charge {
            tenant: tenant.to_owned(),
            per_pod,
            replicas,
        };
        let total = self.totals.entry(tenant.to_owned()).or_default();
        add(total, &charge.per_pod, charge.replicas, true);
        self.charges.insert(key.to_owned(), charge);
        fell
    }

    fn take_out(&mut self, c: &Charge) {
        if let Some(total) = self.totals.get_mut(&c.tenant) {
            add(total, &c.per_pod, c.replicas, false);
        }
    }

    /// Whether `key` of `tenant` holds exactly `replicas` pods of `per_pod` already.
    pub fn holds(&self, tenant: &str, key: &str, per_pod: &Usage, replicas: u64) -> bool {
        self.charges
            .get(key)
            .is_some_and(|c| c.tenant == tenant && c.replicas == replicas && &c.per_pod == per_pod)
    }

    /// Forgets `key` (deleted). Returns the tenant whose usage fell, if any.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let c = self.charges.remove(key)?;
        self.take_out(&c);
        for w in self.waiting.values_mut() {
            w.remove(key);
        }
        (c.replicas > 0).then_some(c.tenant)
    }

    /// What `tenant`'s workloads hold now.
    pub fn used(&self, tenant: &str) -> Usage {
        self.totals.get(tenant).cloned().unwrap_or_default()
    }

    /// How many of `want` replicas of `per_pod` workload `key` of `tenant` may hold under
    /// `quota`, beside what the tenant's other workloads hold — reserved at once (call
    /// [`Ledger::settle`] with what was placed). What is held back is said in [`Held`], and
    /// `key` is kept among the tenant's waiting workloads until it fits.
    pub fn admit(
        &mut self,
        tenant: &str,
        key: &str,
        per_pod: &Usage,
        want: u64,
        quota: &Usage,
    ) -> (u64, Option<Held>) {
        let mut others = self.used(tenant);
        if let Some(own) = self.charges.get(key).filter(|c| c.tenant == tenant) {
            add(&mut others, &own.per_pod, own.replicas, false);
        }
        let mut allowed = want;
        let mut stop: Option<(&str, Quantity, Quantity)> = None;
        for (name, limit) in quota {
            let Some(each) = per_pod.get(name) else {
                continue;
            };
            let used = others.get(name).copied().unwrap_or(Quantity::ZERO);
            let Some(fit) = limit.saturating_sub(used).count_within(*each) else {
                continue;
            };
            if fit < allowed {
                allowed = fit;
                stop = Some((name, used, *limit));
            }
        }
        self.set(tenant, key, per_pod.clone(), allowed);
        let waiting = self.waiting.entry(tenant.to_owned()).or_default();
        let held = stop.filter(|_| allowed < want).map(|(name, used, limit)| {
            waiting.insert(key.to_owned());
            Held {
                replicas: want - allowed,
                why: format!(
                    "tenant {tenant:?} quota: {} more replica(s) of {name} {} would exceed {name} (placed {used} of {limit} fleet-wide)",
                    want - allowed,
                    per_pod[name],
                ),
            }
        });
        if held.is_none() {
            waiting.remove(key);
        }
        (allowed, held)
    }

    /// `key` holds `placed` replicas (at most what [`Ledger::admit`] reserved). Returns
    /// whether the tenant's usage fell.
    pub fn settle(&mut self, key: &str, placed: u64) -> bool {
        let Some(c) = self.charges.get(key).cloned() else {
            return false;
        };
        self.set(&c.tenant, key, c.per_pod, placed.min(c.replicas))
    }

    /// The workloads of `tenant` held back by its quota.
    pub fn waiting(&self, tenant: &str) -> Vec<String> {
        self.waiting
            .get(tenant)
            .map(|w| w.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The usage one pod of `template` (a pod template: `{spec: {containers: ...}}`) is charged,
/// as the API server charges a pod: requests and limits, `pods` and `count/pods`.
pub fn pod_charge(template: &serde_json::Value) -> Usage {
    let mut u = tessera_client::quota::pod_usage(template);
    u.insert("count/pods".into(), Quantity::from_units(1));
    u
}

/// The part of a quota that pods are charged against (what the ledger bounds); the rest
/// (`count/deployments.apps`, stored bytes) the federation's API server counts itself.
pub fn pod_quota(quota: &Usage) -> Usage {
    quota
        .iter()
        .filter(|(k, _)| !k.starts_with("count/") || *k == "count/pods")
        .filter(|(k, _)| k.as_str() != tessera_client::quota::STORED_BYTES)
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn cpu_pod(cpu: &str) -> Usage {
        pod_charge(&json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"cpu": cpu}}}]}}))
    }

    fn quota(pairs: &[(&str, &str)]) -> Usage {
        pairs.iter().map(|(k, v)| ((*k).into(), q(v))).collect()
    }

    #[test]
    fn a_pod_is_charged_as_the_api_server_charges_it() {
        let u = cpu_pod("500m");
        assert_eq!(u["cpu"], q("500m"));
        assert_eq!(u["requests.cpu"], q("500m"));
        assert_eq!(u["pods"], q("1"));
        assert_eq!(u["count/pods"], q("1"));
        let pq = pod_quota(&quota(&[
            ("cpu", "4"),
            ("count/deployments.apps", "2"),
            ("count/pods", "9"),
            (tessera_client::quota::STORED_BYTES, "1Mi"),
        ]));
        assert_eq!(
            pq.keys().map(String::as_str).collect::<Vec<_>>(),
            ["count/pods", "cpu"]
        );
    }

    #[test]
    fn replicas_are_admitted_up_to_the_quota_over_every_workload() {
        let mut l = Ledger::default();
        let limit = quota(&[("cpu", "10"), ("pods", "100")]);
        let pod = cpu_pod("4");
        assert_eq!(l.admit("t", "a", &pod, 2, &limit), (2, None));
        let (n, held) = l.admit("t", "b", &pod, 3, &limit);
        assert_eq!(n, 0, "8 of 10 cpu held by a: no 4-cpu replica fits");
        let held = held.expect("held");
        assert_eq!(held.replicas, 3);
        assert!(
            held.why.contains("would exceed cpu (placed 8 of 10"),
            "{}",
            held.why
        );
        assert_eq!(l.waiting("t"), ["b"]);
        // Another tenant is not charged for t's.
        assert_eq!(l.admit("u", "c", &pod, 2, &limit), (2, None));
        // Re-admitting a leaves its own charge out of the count.
        assert_eq!(l.admit("t", "a", &pod, 2, &limit), (2, None));
        // a placed only 1: room for one of b's.
        assert!(l.settle("a", 1));
        assert_eq!(l.admit("t", "b", &pod, 3, &limit).0, 1);
        assert_eq!(l.used("t")["cpu"], q("8"));
        // a deleted: b fits whole and waits no more.
        assert_eq!(l.remove("a").as_deref(), Some("t"));
        assert_eq!(l.admit("t", "b", &pod, 2, &limit), (2, None));
        assert!(l.waiting("t").is_empty());
        assert!(l.holds("t", "b", &pod, 2));
        assert!(!l.holds("t", "b", &pod, 3) && !l.holds("u", "b", &pod, 2));
    }

    #[test]
    fn a_quota_on_a_resource_the_pod_does_not_use_does_not_hold_it() {
        let mut l = Ledger::default();
        let limit = quota(&[("nvidia.com/gpu", "1"), ("limits.memory", "1Gi")]);
        assert_eq!(l.admit("t", "a", &cpu_pod("1"), 50, &limit), (50, None));
    }

    proptest! {
        /// However workloads come, are re-admitted, settle and go, what a tenant holds never
        /// passes its quota, and the total is the sum of its workloads' charges.
        #[test]
        fn the_quota_is_never_passed(ops in proptest::collection::vec(
            (0usize..6, 0u64..8, 1u64..5, 0u8..3), 1..60)) {
            let mut l = Ledger::default();
            let limit = quota(&[("cpu", "20"), ("count/pods", "12")]);
            for (w, want, cpu, op) in ops {
                let key = format!("w{w}");
                match op {
                    0 | 1 => {
                        let (n, _) = l.admit("t", &key, &cpu_pod(&cpu.to_string()), want, &limit);
                        prop_assert!(n <= want);
                        if op == 1 {
                            l.settle(&key, n / 2);
                        }
                    }
                    _ => {
                        l.remove(&key);
                    }
                }
                let used = l.used("t");
                prop_assert!(used.get("cpu").copied().unwrap_or(Quantity::ZERO) <= q("20"));
                prop_assert!(used.get("count/pods").copied().unwrap_or(Quantity::ZERO) <= q("12"));
                let mut sum = Usage::new();
                for c in l.charges.values() {
                    add(&mut sum, &c.per_pod, c.replicas, true);
                }
                for (k, v) in &used {
                    prop_assert_eq!(sum.get(k).copied().unwrap_or(Quantity::ZERO), *v);
                }
            }
        }
    }
}
