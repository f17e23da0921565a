//! A Tenant's quota (`spec.quota`): the resources its pods may request across all of its
//! namespaces together, kept in `status.used`.
//!
//! The tenant's usage is reserved *before* a pod is created (a compare-and-swap on the Tenant)
//! and given back if the create fails, and given back after a pod is deleted — the order
//! Kubernetes' quota admission uses. The two writes are separate because a Tenant and its
//! pods may live on different stores of a sharded layout; a crash between them can leave a
//! reservation behind, which the quota controller (next issue) recomputes. Never an
//! overshoot: concurrent creates serialize on the Tenant's revision.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera_core::quantity::Quantity;

use super::{Api, decode_stored, encode, name_of, quantity_json, quantity_map, store_error};
use crate::status::ApiError;

/// How long a read of the Tenants list is reused to find a namespace's tenant.
const TENANTS_TTL: Duration = Duration::from_secs(1);

/// A list of a few cluster-scoped objects (Tenants, PriorityClasses), as read at one moment.
pub(super) type CachedList = Option<(Instant, Vec<Value>)>;

/// How a tenant charge is made.
#[derive(Clone, Copy)]
struct How {
    /// Charge (or refund).
    charge: bool,
    /// Check only; write nothing.
    dry_run: bool,
    /// Refuse what passes the quota (otherwise count it anyway).
    enforce: bool,
}

/// Whether Tenant `t` lists namespace `ns`.
fn owns(t: &Value, ns: &str) -> bool {
    t["spec"]["namespaces"]
        .as_array()
        .is_some_and(|a| a.iter().any(|n| n == ns))
}

impl Api {
    /// Every Tenant, read from the store now.
    pub(super) async fn tenants(&self) -> Result<Vec<Value>, ApiError> {
        let res = crate::request::find_resource("tessera.io", "v1alpha1", "tenants")?;
        self.list_all(res).await
    }

    /// Every object of the cluster-scoped `res`, read from the store now.
    pub(super) async fn list_all(
        &self,
        res: &'static crate::catalog::Resource,
    ) -> Result<Vec<Value>, ApiError> {
        self.list_in(res, None).await
    }

    /// Every object of `res` in namespace `ns` (None: in all, or cluster-scoped), read from
    /// the store now.
    pub(super) async fn list_in(
        &self,
        res: &'static crate::catalog::Resource,
        ns: Option<&str>,
    ) -> Result<Vec<Value>, ApiError> {
        let page = self
            .store
            .list(tessera_store::ListRequest {
                prefix: super::prefix(res, ns).into(),
                ..Default::default()
            })
            .await
            .map_err(store_error)?;
        Ok(page
            .kvs
            .iter()
            .filter_map(|kv| decode_stored(kv).ok())
            .collect())
    }

    /// After a write to `res`: a changed Tenant is read afresh by the next admission here
    /// (other API servers see it within `TENANTS_TTL`).
    pub(super) fn wrote(&self, res: &crate::catalog::Resource) {
        if res.kind == "Tenant" {
            *self.tenants.lock() = None;
        }
        self.priority_classes_changed(res);
    }

    /// `f` of every Tenant, from a list read at most `TENANTS_TTL` ago (tenants are few;
    /// pods are many), in place under the lock when it is fresh — nothing is cloned for the
    /// lookups made on every create and update — else from the store, kept for the next.
    async fn with_tenants<R>(&self, f: impl Fn(&[Value]) -> R) -> Result<R, ApiError> {
        let res = crate::request::find_resource("tessera.io", "v1alpha1", "tenants")?;
        self.with_cached(&self.tenants, res, TENANTS_TTL, f).await
    }

    /// `f` of every object of the cluster-scoped `res`, from the list in `cache` if it was
    /// read less than `ttl` ago (in place under the lock: nothing is cloned), else from the
    /// store, kept there for the next call.
    pub(super) async fn with_cached<R>(
        &self,
        cache: &parking_lot::Mutex<CachedList>,
        res: &'static crate::catalog::Resource,
        ttl: Duration,
        f: impl Fn(&[Value]) -> R,
    ) -> Result<R, ApiError> {
        {
            let cached = cache.lock();
            if let Some((at, list)) = cached.as_ref()
                && at.elapsed() < ttl
            {
                return Ok(f(list));
            }
        }
        let list = self.list_all(res).await?;
        let out = f(&list);
        *cache.lock() = Some((Instant::now(), list));
        Ok(out)
    }

    /// Whether a tenant token's claims still hold: its Tenant exists with the same uid and
    /// `spec.tokenGeneration` (read through the same short-lived cache as admission; a write
    /// to a Tenant through this server clears it at once).
    pub async fn tenant_token_current(&self, claims: &crate::auth::TenantClaims) -> bool {
        let found = |list: &[Value]| {
            list.iter()
                .find(|t| name_of(t) == claims.name)
                .is_some_and(|t| claims.still_hold(t))
        };
        match self.with_tenants(found).await {
            Ok(ok) => ok,
            Err(e) => {
                tracing::warn!(error = %e.message, "reading Tenants to check a token");
                false
            }
        }
    }

    /// The Tenant that owns `ns`, if any.
    pub(super) async fn tenant_of(&self, ns: &str) -> Result<Option<Value>, ApiError> {
        self.with_tenants(|list| list.iter().find(|t| owns(t, ns)).cloned())
            .await
    }

    /// The Tenant that owns `ns` and has a quota, if any (as cached).
    async fn quota_tenant(&self, ns: &str) -> Result<Option<Value>, ApiError> {
        Ok(self.tenant_of(ns).await?.filter(|t| {
            t["spec"]["quota"]
                .as_object()
                .is_some_and(|q| !q.is_empty())
        }))
    }

    /// Whether the quota of the tenant owning `ns` limits stored bytes (as cached): a caller
    /// measures an object's encoded size only then.
    pub(super) async fn tenant_counts_bytes(&self, ns: &str) -> Result<bool, ApiError> {
        self.with_tenants(|list| {
            list.iter()
                .find(|t| owns(t, ns))
                .is_some_and(|t| t["spec"]["quota"].get(crate::quota::STORED_BYTES).is_some())
        })
        .await
    }

    /// Charges (or with `charge == false` refunds) object `obj` of `res` to the quota of the
    /// tenant owning `ns`: a pod's requests and limits and `count/pods`, any other object its
    /// `count/<resource>` (`count/configmaps`, `count/deployments.apps`), and with `stored`
    /// (its encoded length) its stored bytes. Returns whether anything was charged. Refuses
    /// with 403 what would exceed it. A quota that names none of what the object uses is not
    /// touched (no write to the Tenant).
    pub(super) async fn tenant_quota(
        &self,
        ns: &str,
        res: &crate::catalog::Resource,
        obj: &Value,
        charge: bool,
        dry_run: bool,
        stored: Option<usize>,
    ) -> Result<bool, ApiError> {
        let mut usage = crate::quota::usage_of(res, obj);
        if let Some(len) = stored {
            usage.insert(
                crate::quota::STORED_BYTES.into(),
                crate::quota::stored_charge(len),
            );
        }
        let how = How {
            charge,
            dry_run,
            enforce: true,
        };
        self.tenant_charge(ns, res, name_of(obj), &usage, how).await
    }

    /// An update changed an object's stored size from `old` to `new` bytes: growth into
    /// more blocks is charged before the write (`true` if charged, to be refunded if the
    /// write fails) — refused with 403 past the quota if `enforce` (the tenant's own writes;
    /// system components' status writes are counted, never refused) — and shrinking is
    /// refunded after it. Nothing happens unless the tenant's quota limits stored bytes and
    /// the block count changed.
    pub(super) async fn tenant_resize(
        &self,
        ns: &str,
        res: &crate::catalog::Resource,
        name: &str,
        (old, new): (usize, usize),
        dry_run: bool,
        enforce: bool,
    ) -> Result<bool, ApiError> {
        let (a, b) = (
            crate::quota::stored_charge(old),
            crate::quota::stored_charge(new),
        );
        if a == b {
            return Ok(false);
        }
        let grow = b > a;
        let delta = if grow {
            b.saturating_sub(a)
        } else {
            a.saturating_sub(b)
        };
        let usage = BTreeMap::from([(crate::quota::STORED_BYTES.to_owned(), delta)]);
        let how = How {
            charge: grow,
            dry_run,
            enforce,
        };
        self.tenant_charge(ns, res, name, &usage, how).await
    }

    async fn tenant_charge(
        &self,
        ns: &str,
        res: &crate::catalog::Resource,
        name: &str,
        usage: &BTreeMap<String, Quantity>,
        how: How,
    ) -> Result<bool, ApiError> {
        let How {
            charge,
            dry_run,
            enforce,
        } = how;
        let Some(cached) = self.quota_tenant(ns).await? else {
            return Ok(false);
        };
        // Most objects are nothing the quota names: no read or write of the Tenant for them.
        if !quantity_map(&cached["spec"]["quota"])
            .keys()
            .any(|k| usage.contains_key(k))
        {
            return Ok(false);
        }
        let tenant = name_of(&cached).to_owned();
        let what = crate::status::qualified(res.group, res.plural);
        let tenants = crate::request::find_resource("tessera.io", "v1alpha1", "tenants")?;
        let key = super::object_key(tenants, None, &tenant);
        for _attempt in 0..32 {
            let Some(kv) = self.store.get(key.as_bytes()).await.map_err(store_error)? else {
                return Ok(false);
            };
            let mut t = decode_stored(&kv)?;
            let quota = quantity_map(&t["spec"]["quota"]);
            if !quota.keys().any(|k| usage.contains_key(k)) {
                return Ok(false);
            }
            let mut used = if t["status"]["used"].is_object() {
                quantity_map(&t["status"]["used"])
            } else {
                BTreeMap::new()
            };
            // What the quota names but was never counted (a quota just set, or a name just
            // added to it) is counted now from what is stored.
            let uncounted: BTreeMap<String, Quantity> = quota
                .iter()
                .filter(|(k, _)| !used.contains_key(*k))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            if !uncounted.is_empty() {
                used.extend(self.tenant_usage(&t, &uncounted).await?);
            }
            // Not enforced: counted, never refused (a system component's status write).
            let limits = if enforce {
                quota.clone()
            } else {
                quota
                    .keys()
                    .map(|k| (k.clone(), Quantity::from_units(i64::MAX)))
                    .collect()
            };
            if let Err(over) = super::admission::charge_usage(&mut used, usage, &limits, charge) {
                return Err(ApiError::forbidden(format!(
                    "{what} \"{name}\" is forbidden: exceeded tenant quota: {tenant}, {over} (across the tenant's namespaces)"
                )));
            }
            if dry_run {
                return Ok(false);
            }
            t["status"]["used"] = quantity_json(&used);
            match self
                .store
                .update(kv.key.clone(), encode(&t)?, kv.mod_revision)
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if e.precondition().is_some() => continue,
                Err(e) => return Err(store_error(e)),
            }
        }
        Err(ApiError::conflict_because(
            "tessera.io",
            "tenants",
            &tenant,
            "the tenant's quota kept changing; try again",
        ))
    }

    /// Gives an object's charge back to its tenant after it stopped counting: removed
    /// (`stored`: the length it had in the store, whose bytes go back too), or a pod finished
    /// (`None`: it is still stored); a pod that had already finished was refunded then. Best
    /// effort: a failure is logged (Tenant quotas are not recounted yet).
    pub(super) async fn refund_tenant(
        &self,
        res: &crate::catalog::Resource,
        obj: &Value,
        stored: Option<usize>,
    ) {
        let Some(ns) = obj["metadata"]["namespace"].as_str() else {
            return;
        };
        if let Err(e) = self.tenant_quota(ns, res, obj, false, false, stored).await {
            tracing::warn!(error = %e, object = %name_of(obj), "could not refund a tenant quota");
        }
    }

    /// What the tenant's objects use now of what `quota` names, over all its namespaces
    /// (for names `status.used` does not hold yet).
    async fn tenant_usage(
        &self,
        tenant: &Value,
        quota: &BTreeMap<String, Quantity>,
    ) -> Result<BTreeMap<String, Quantity>, ApiError> {
        let mut total: BTreeMap<String, Quantity> = BTreeMap::new();
        for ns in tenant["spec"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(ns) = ns.as_str() else { continue };
            for (k, v) in self.usage_in(ns, quota, &Value::Null).await? {
                let e = total.entry(k).or_insert_with(|| Quantity::from_units(0));
                *e = e.saturating_add(v);
            }
            if quota.contains_key(crate::quota::STORED_BYTES) {
                let bytes = self.stored_in(ns).await?;
                let e = total
                    .entry(crate::quota::STORED_BYTES.to_owned())
                    .or_insert_with(|| Quantity::from_units(0));
                *e = e.saturating_add(bytes);
            }
        }
        Ok(total)
    }

    /// What every object in `ns` is charged for its stored bytes.
    async fn stored_in(&self, ns: &str) -> Result<Quantity, ApiError> {
        let mut total = Quantity::from_units(0);
        for res in crate::catalog::RESOURCES.iter().filter(|r| r.namespaced) {
            let page = self
                .store
                .list(tessera_store::ListRequest {
                    prefix: super::prefix(res, Some(ns)).into(),
                    ..Default::default()
                })
                .await
                .map_err(store_error)?;
            for kv in &page.kvs {
                let obj = decode_stored(kv)?;
                total = total
                    .saturating_add(crate::quota::stored_charge(crate::quota::charged_len(&obj)));
            }
        }
        Ok(total)
    }
}
