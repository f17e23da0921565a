//! The namespace controller: a namespace being deleted has all its contents deleted — the
//! built-in kinds and the namespaced kinds of every CustomResourceDefinition — and once
//! nothing is left its `kubernetes` finalizer is removed, which deletes it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Namespace;
use serde_json::json;
use tessera_client::catalog::{APIEXTENSIONS, RESOURCES, Resource};
use tessera_client::request::{ApiRequest, PatchType, Verb};
use tessera_runtime::EventClass;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Cache, key_of};

use crate::context::{Context, res};

/// The controller's name.
pub const NAME: &str = "namespace-controller";

struct Ns {
    ctx: Context,
    namespaces: Arc<Cache<Namespace>>,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let inf = ctx.informer::<Namespace>(res("", "namespaces"));
    let r = Arc::new(Ns {
        ctx: ctx.clone(),
        namespaces: inf.cache().clone(),
    });
    ctx.controller(NAME)
        .watches_with(&inf, |c, q| {
            if c.object().metadata.deletion_timestamp.is_some() {
                q.add(key_of(&c.object().metadata), EventClass::Update);
            }
        })
        .run(r)
        .await;
}

impl Ns {
    /// The storage version of every namespaced custom kind, as the CRDs say now (read when
    /// a namespace is deleted, which is rare, rather than watched).
    async fn custom_kinds(&self) -> Result<Vec<&'static Resource>, ReconcileError> {
        let crds = ApiRequest::new(Verb::List, res(APIEXTENSIONS, "customresourcedefinitions"));
        let list = self.ctx.client.list(crds).await?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(tessera_client::catalog::custom_storage_resource)
            .filter(|r| r.namespaced)
            .collect())
    }
}

#[async_trait]
impl Reconciler for Ns {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(ns) = self.namespaces.get(key) else {
            return Ok(Action::Done);
        };
        if ns.metadata.deletion_timestamp.is_none() {
            return Ok(Action::Done);
        }
        let name = ns.metadata.name.clone().unwrap_or_default();
        let mut left = 0usize;
        let mut kinds: Vec<&'static Resource> = RESOURCES.iter().filter(|r| r.namespaced).collect();
        kinds.extend(self.custom_kinds().await?);
        for r in kinds {
            let mut req = ApiRequest::new(Verb::List, r);
            req.namespace = Some(name.clone());
            let list = self.ctx.client.list(req).await?;
            for item in list["items"].as_array().into_iter().flatten() {
                left += 1;
                if item["metadata"]["deletionTimestamp"].is_string() {
                    continue;
                }
                let mut del = ApiRequest::new(Verb::Delete, r);
                del.namespace = Some(name.clone());
                del.name = item["metadata"]["name"].as_str().map(str::to_owned);
                del.params.propagation = Some(tessera_client::request::Propagation::Background);
                match self.ctx.client.call(del).await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 || e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if left > 0 {
            // Pods wait for their agents, finalizers for their controllers: look again soon.
            return Ok(Action::RequeueAfter(Duration::from_millis(500)));
        }
        let finalizers: Vec<String> = ns
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != "kubernetes")
            .collect();
        match self
            .ctx
            .client
            .patch(
                res("", "namespaces"),
                None,
                &name,
                None,
                PatchType::Merge,
                &json!({"spec": {"finalizers": finalizers}}),
            )
            .await
        {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.code == 404 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}
