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

/// Tenants, as read at one moment.
pub(super) type TenantList = Option<(Instant, Vec<Value>)>;

impl Api {
    /// Every Tenant, read from the store now.
    pub(super) async fn tenants(&self) -> Result<Vec<Value>, ApiError> {
        let res = crate::request::find_resource("tessera.io", "v1alpha1", "tenants")?;
        let page = self
            .store
            .list(tessera_store::ListRequest {
                prefix: super::prefix(res, None).into(),
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
        let cached = {
            let c = self.tenants.lock();
            c.as_ref()
                .filter(|(at, _)| at.elapsed() < TENANTS_TTL)
                .map(|(_, list)| found(list))
        };
        if let Some(ok) = cached {
            return ok;
        }
        match self.tenants().await {
            Ok(list) => {
                let ok = found(&list);
                *self.tenants.lock() = Some((Instant::now(), list));
                ok
            }
            Err(e) => {
                tracing::warn!(error = %e.message, "reading Tenants to check a token");
                false
            }
        }
    }

    /// The Tenant that owns `ns`, if any (from a list read at most `TENANTS_TTL` ago:
    /// tenants are few; pods are many).
    pub(super) async fn tenant_of(&self, ns: &str) -> Result<Option<Value>, ApiError> {
        let fresh = {
            let cached = self.tenants.lock();
            cached
                .as_ref()
                .filter(|(at, _)| at.elapsed() < TENANTS_TTL)
                .map(|(_, list)| list.clone())
        };
        let list = match fresh {
            Some(l) => l,
            None => {
                let list = self.tenants().await?;
                *self.tenants.lock() = Some((Instant::now(), list.clone()));
                list
            }
        };
        Ok(list.into_iter().find(|t| {
            t["spec"]["namespaces"]
                .as_array()
                .is_some_and(|a| a.iter().any(|n| n == ns))
        }))
    }

    /// The Tenant that owns `ns` and has a quota, if any (as cached).
    async fn quota_tenant(&self, ns: &str) -> Result<Option<Value>, ApiError> {
        Ok(self.tenant_of(ns).await?.filter(|t| {
            t["spec"]["quota"]
                .as_object()
                .is_some_and(|q| !q.is_empty())
        }))
    }

    /// Charges (or with `charge == false` refunds) object `obj` of `res` to the quota of the
    /// tenant owning `ns`: a pod's requests and limits and `count/pods`, any other object its
    /// `count/<resource>` (`count/configmaps`, `count/deployments.apps`). Returns whether
    /// anything was charged. Refuses with 403 what would exceed it. A quota that names none
    /// of what the object uses is not touched (no write to the Tenant).
    pub(super) async fn tenant_quota(
        &self,
        ns: &str,
        res: &crate::catalog::Resource,
        obj: &Value,
        charge: bool,
        dry_run: bool,
    ) -> Result<bool, ApiError> {
        let Some(cached) = self.quota_tenant(ns).await? else {
            return Ok(false);
        };
        let usage = crate::quota::usage_of(res, obj);
        // Most objects are nothing the quota names: no read or write of the Tenant for them.
        if !quantity_map(&cached["spec"]["quota"])
            .keys()
            .any(|k| usage.contains_key(k))
        {
            return Ok(false);
        }
        let tenant = name_of(&cached).to_owned();
        let pod = obj;
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
                self.tenant_usage(&t, &quota).await?
            };
            if let Err(over) = super::admission::charge_usage(&mut used, &usage, &quota, charge) {
                return Err(ApiError::forbidden(format!(
                    "{what} \"{}\" is forbidden: exceeded tenant quota: {tenant}, {over} (across the tenant's namespaces)",
                    name_of(pod)
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

    /// Gives an object's charge back to its tenant after it stopped counting (removed, or a
    /// pod finished); a pod that had already finished was refunded then. Best effort: a
    /// failure is logged (Tenant quotas are not recounted yet).
    pub(super) async fn refund_tenant(&self, res: &crate::catalog::Resource, obj: &Value) {
        let Some(ns) = obj["metadata"]["namespace"].as_str() else {
            return;
        };
        if let Err(e) = self.tenant_quota(ns, res, obj, false, false).await {
            tracing::warn!(error = %e, object = %name_of(obj), "could not refund a tenant quota");
        }
    }

    /// What the tenant's pods request now, over all its namespaces (when `status.used` was
    /// never set).
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
        }
        Ok(total)
    }
}
