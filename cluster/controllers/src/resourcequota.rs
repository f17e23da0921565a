//! The resource quota controller: keeps each ResourceQuota's `status` equal to what its
//! namespace's objects use.
//!
//! The API server charges every create, refunds every delete and gives back a pod's charge
//! when it finishes, all in the writing transaction — so `status.used` is exact as writes
//! happen. This controller sets `status.hard` when `spec.hard` changes (a new limit starts
//! from what is used now), and recomputes every quota on a period (Kubernetes'
//! `--resource-quota-sync-period`, 5 min) to repair what no transaction could: quotas written
//! by hand, or older servers' counts.
//!
//! A recount must not race the charges. It reads the quota at revision `Q`, lists the
//! counted objects at exactly `Q` (`resourceVersionMatch=Exact`) — the objects whose charges
//! that quota holds — and writes the result with `Q` as precondition: any charge in between
//! changed the quota, the write conflicts, and the recount runs again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::{Value, json};
use tessera_client::catalog::RESOURCES;
use tessera_client::quota::{
    add_tracked, in_scope, quantity_json, quantity_map, tracked, usage_of,
};
use tessera_client::request::{ApiRequest, Verb};
use tessera_core::quantity::Quantity;
use tessera_runtime::EventClass;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Change, key_of};

use crate::context::{Context, res};

/// The controller's name.
pub const NAME: &str = "resourcequota-controller";
/// How often every quota is recounted (Kubernetes' default).
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);
/// Objects read per page when recounting.
const PAGE: usize = 500;

struct Quotas {
    ctx: Context,
    resync: Duration,
}

/// Runs the controller until dropped, recounting every quota each `resync`.
pub async fn run(ctx: Context, resync: Duration) {
    let quotas = ctx.informer::<ResourceQuota>(res("", "resourcequotas"));
    let r = Arc::new(Quotas {
        ctx: ctx.clone(),
        resync,
    });
    ctx.controller(NAME)
        .watches_with(&quotas, |c, q| {
            // Charges update quotas all the time; only a new quota or new limits need a
            // recount now (the rest waits for the period).
            let stale = match &c {
                Change::Added(_) => true,
                Change::Updated { old, new } => {
                    old.spec.as_ref().map(|s| &s.hard) != new.spec.as_ref().map(|s| &s.hard)
                        || new.status.as_ref().and_then(|s| s.hard.as_ref())
                            != new.spec.as_ref().and_then(|s| s.hard.as_ref())
                }
                Change::Deleted(_) => false,
            };
            if stale {
                q.add(key_of(&c.object().metadata), EventClass::Update);
            }
        })
        .run(r)
        .await;
}

impl Quotas {
    /// What the objects of `ns` in the scopes of quota `spec` used at revision `rv`, for the
    /// resources of `hard`.
    async fn usage_at(
        &self,
        ns: &str,
        rv: &str,
        hard: &BTreeMap<String, Quantity>,
        spec: &Value,
    ) -> Result<BTreeMap<String, Quantity>, ReconcileError> {
        let mut used: BTreeMap<String, Quantity> = hard
            .keys()
            .map(|k| (k.clone(), Quantity::from_units(0)))
            .collect();
        for r in RESOURCES
            .iter()
            .filter(|r| r.namespaced && tracked(r, hard))
        {
            let mut req = ApiRequest::new(Verb::List, r);
            req.namespace = Some(ns.to_owned());
            req.params.limit = PAGE;
            req.params.resource_version = Some(rv.to_owned());
            req.params.resource_version_match = Some("Exact".into());
            let mut each = |obj: Value| {
                if in_scope(spec, r, &obj) {
                    add_tracked(&mut used, usage_of(r, &obj));
                }
            };
            self.ctx
                .client
                .list_each(req, &mut each)
                .await
                .map_err(|e| {
                    ReconcileError::new(format!("listing {} in {ns}: {}", r.plural, e.message))
                })?;
        }
        Ok(used)
    }
}

#[async_trait]
impl Reconciler for Quotas {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let quotas = res("", "resourcequotas");
        let quota = match self.ctx.client.get(quotas, Some(ns), name).await {
            Ok(q) => q,
            Err(e) if e.code == 404 => return Ok(Action::Done),
            Err(e) => return Err(ReconcileError::new(e.message)),
        };
        let rv = quota["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let hard = quantity_map(&quota["spec"]["hard"]);
        let used = self.usage_at(ns, &rv, &hard, &quota["spec"]).await?;
        let status = json!({"hard": quantity_json(&hard), "used": quantity_json(&used)});
        let same = quantity_map(&quota["status"]["hard"]) == hard
            && quantity_map(&quota["status"]["used"]) == used;
        if !same {
            let mut next: Value = quota.clone();
            next["status"] = status;
            let mut req = ApiRequest::new(Verb::Update, quotas);
            req.namespace = Some(ns.to_owned());
            req.name = Some(name.to_owned());
            req.subresource = Some("status".into());
            req.body = next.to_string().into();
            match self.ctx.client.call(req).await {
                Ok(_) => {
                    tracing::info!(quota = %key, used = %quantity_json(&used), was = %quota["status"]["used"], "recounted a quota");
                }
                Err(e) if e.code == 404 => return Ok(Action::Done),
                // Charged meanwhile: recount (with back-off, as a busy namespace may charge
                // its quota again and again).
                Err(e) => return Err(ReconcileError::new(e.message)),
            }
        }
        Ok(Action::RequeueAfter(self.resync))
    }
}
