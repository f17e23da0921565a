//! The root CA publisher: every namespace that is not being deleted has a ConfigMap
//! `kube-root-ca.crt` whose `ca.crt` is the CA bundle that signs the API server's certificate,
//! so that workloads can verify the server; changed or deleted, it is put back.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::Cache;

use crate::context::{Context, res, run_per_namespace};
use crate::serviceaccount::is_active;

/// The controller's name.
pub const NAME: &str = "root-ca-cert-publisher";

/// The ConfigMap every namespace has.
pub const CONFIG_MAP: &str = "kube-root-ca.crt";

/// Its key holding the PEM bundle.
pub const KEY: &str = "ca.crt";

struct Publisher {
    ctx: Context,
    bundle: String,
    namespaces: Arc<Cache<Namespace>>,
    maps: Arc<Cache<ConfigMap>>,
}

/// Runs the controller until dropped, publishing `bundle` (PEM).
pub async fn run(ctx: Context, bundle: String) {
    let c = ctx.clone();
    run_per_namespace(
        ctx,
        NAME,
        res("", "configmaps"),
        CONFIG_MAP,
        |namespaces, maps| Publisher {
            ctx: c,
            bundle,
            namespaces,
            maps,
        },
    )
    .await;
}

#[async_trait]
impl Reconciler for Publisher {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        match self.namespaces.get(key) {
            Some(ns) if is_active(&ns) => {}
            _ => return Ok(Action::Done),
        }
        let cms = res("", "configmaps");
        let data = json!({ KEY: self.bundle });
        let result = match self.maps.get(&format!("{key}/{CONFIG_MAP}")) {
            None => {
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CONFIG_MAP, "namespace": key}, "data": data});
                self.ctx.client.create(cms, Some(key), &cm).await
            }
            Some(cm) if cm.data.as_ref().and_then(|d| d.get(KEY)) == Some(&self.bundle) => {
                return Ok(Action::Done);
            }
            Some(cm) => {
                // Put the bundle back, only if nobody wrote since the cache saw it.
                let patch = json!({"metadata": {"resourceVersion": cm.metadata.resource_version},
                    "data": data});
                self.ctx
                    .client
                    .patch(
                        cms,
                        Some(key),
                        CONFIG_MAP,
                        None,
                        tessera_client::request::PatchType::Merge,
                        &patch,
                    )
                    .await
            }
        };
        match result {
            Ok(_) => Ok(Action::Done),
            // 409: someone wrote it meanwhile; the watch brings the change back here.
            Err(e) if e.code == 409 || e.code == 404 || e.code == 403 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}
