//! The service account controller: every namespace that is not being deleted has a
//! ServiceAccount named `default` (pods that name none run as it, and clients such as the
//! official Python client read it); deleted, it is made again.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use serde_json::json;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::Cache;

use crate::context::{Context, res, run_per_namespace};

/// The controller's name.
pub const NAME: &str = "serviceaccount-controller";

/// The account every namespace has.
pub const DEFAULT_ACCOUNT: &str = "default";

struct Accounts {
    ctx: Context,
    namespaces: Arc<Cache<Namespace>>,
    accounts: Arc<Cache<ServiceAccount>>,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let c = ctx.clone();
    run_per_namespace(
        ctx,
        NAME,
        res("", "serviceaccounts"),
        DEFAULT_ACCOUNT,
        |namespaces, accounts| Accounts {
            ctx: c,
            namespaces,
            accounts,
        },
    )
    .await;
}

/// Whether objects may be made in `ns`: it exists and is not being deleted.
pub(crate) fn is_active(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_none()
        && ns.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Terminating")
}

#[async_trait]
impl Reconciler for Accounts {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        match self.namespaces.get(key) {
            Some(ns) if is_active(&ns) => {}
            _ => return Ok(Action::Done),
        }
        if self
            .accounts
            .get(&format!("{key}/{DEFAULT_ACCOUNT}"))
            .is_some()
        {
            return Ok(Action::Done);
        }
        let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_ACCOUNT, "namespace": key}});
        match self
            .ctx
            .client
            .create(res("", "serviceaccounts"), Some(key), &account)
            .await
        {
            Ok(_) => Ok(Action::Done),
            // Made meanwhile, or the namespace began to go away: nothing to do.
            Err(e) if e.code == 409 || e.code == 404 || e.code == 403 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}
