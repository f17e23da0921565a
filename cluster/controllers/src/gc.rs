//! The garbage collector: objects whose owners are all gone are deleted (background
//! propagation); an owner deleted with `propagationPolicy=Foreground` waits (its
//! `foregroundDeletion` finalizer) until its blocking dependents are gone; one deleted with
//! `Orphan` has its dependents' references to it removed before it goes.
//!
//! Every served kind (but Events) is watched with metadata only. Before deleting a dependent
//! whose owner is not in the cache, the owner is read from the API: a cache that has not yet
//! seen a new owner never causes a deletion.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use tessera_apiserver::catalog::{RESOURCES, Resource};
use tessera_apiserver::request::{ApiRequest, PatchType, Propagation, Verb};
use tessera_runtime::controller::{self, Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Change, Informer, PartialObject, key_of};
use tessera_runtime::{EventClass, WorkQueue};

use crate::context::{Context, Tasks};

/// The controller's name.
pub const NAME: &str = "garbage-collector";
/// The finalizer of a foreground deletion.
pub const FOREGROUND: &str = "foregroundDeletion";
/// The finalizer of an orphaning deletion.
pub const ORPHAN: &str = "orphan";

struct Gc {
    ctx: Context,
    kinds: Vec<(&'static Resource, Arc<Informer<PartialObject>>)>,
}

/// The kinds the collector watches: every served kind but Events and Namespaces.
pub fn watched() -> impl Iterator<Item = &'static Resource> {
    RESOURCES
        .iter()
        .filter(|r| r.plural != "events" && r.plural != "namespaces")
}

fn qkey(i: usize, key: &str) -> String {
    format!("{i}|{key}")
}

/// Runs the collector until dropped.
pub async fn run(ctx: Context) {
    let queue = ctx.queue(NAME);
    let mut kinds = Vec::new();
    for (i, r) in watched().enumerate() {
        let inf = ctx.informer::<PartialObject>(r);
        let q = queue.clone();
        inf.on_change(move |c| on_change(i, c, &q));
        kinds.push((r, inf));
    }
    let gc = Arc::new(Gc {
        ctx: ctx.clone(),
        kinds,
    });
    // A deletion queues the deleted object's dependents, wherever they are, and its owners
    // (one waiting in a foreground deletion looks again).
    for (_, inf) in &gc.kinds {
        let q = queue.clone();
        let weak = Arc::downgrade(&gc);
        inf.on_change(move |c| {
            if let Change::Deleted(o) = c
                && let Some(gc) = weak.upgrade()
            {
                let uid = o.metadata.uid.as_deref().unwrap_or("");
                for (j, (_, other)) in gc.kinds.iter().enumerate() {
                    for d in other.cache().owned_by(uid) {
                        q.add(qkey(j, &key_of(&d.metadata)), EventClass::Delete);
                    }
                }
                for r in o.metadata.owner_references.iter().flatten() {
                    if let Some(j) = gc.resource_of(&r.api_version, &r.kind) {
                        let key = match (gc.kinds[j].0.namespaced, o.metadata.namespace.as_deref())
                        {
                            (true, Some(ns)) => format!("{ns}/{}", r.name),
                            _ => r.name.clone(),
                        };
                        q.add(qkey(j, &key), EventClass::Update);
                    }
                }
            }
        });
    }
    let _tasks = Tasks(
        gc.kinds
            .iter()
            .map(|(_, inf)| tokio::spawn(inf.clone().run()))
            .collect(),
    );
    for (_, inf) in &gc.kinds {
        inf.synced().await;
    }
    controller::run(gc, queue, ctx.workers, ctx.runtime_metrics.clone()).await;
}

fn on_change(i: usize, c: &Change<PartialObject>, q: &WorkQueue<String>) {
    let m = &c.object().metadata;
    // Most updates (status, labels) change nothing the collector looks at: skip them rather
    // than re-check every owner on every pod status write.
    if let Change::Updated { old, new } = c {
        let (a, b) = (&old.metadata, &new.metadata);
        if a.owner_references == b.owner_references
            && a.deletion_timestamp == b.deletion_timestamp
            && a.finalizers == b.finalizers
        {
            return;
        }
    }
    let interesting = m.owner_references.as_ref().is_some_and(|r| !r.is_empty())
        || (m.deletion_timestamp.is_some()
            && m.finalizers
                .iter()
                .flatten()
                .any(|f| f == FOREGROUND || f == ORPHAN));
    if interesting && !matches!(c, Change::Deleted(_)) {
        let class = match c {
            Change::Added(_) => EventClass::Add,
            _ => EventClass::Update,
        };
        q.add(qkey(i, &key_of(m)), class);
    }
}

impl Gc {
    fn resource_of(&self, api_version: &str, kind: &str) -> Option<usize> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.kinds
            .iter()
            .position(|(r, _)| r.kind == kind && r.group == group && r.version == version)
    }

    /// All dependents of `uid`: (kind index, object).
    fn dependents(&self, uid: &str) -> Vec<(usize, Arc<PartialObject>)> {
        let mut out = Vec::new();
        for (j, (_, inf)) in self.kinds.iter().enumerate() {
            for d in inf.cache().owned_by(uid) {
                out.push((j, d));
            }
        }
        out
    }

    /// Whether the owner named by `r` exists (with that UID), asking the API when the cache
    /// has not seen it.
    async fn owner_exists(
        &self,
        ns: Option<&str>,
        r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Result<Option<Arc<PartialObject>>, ReconcileError> {
        let Some(i) = self.resource_of(&r.api_version, &r.kind) else {
            // A kind this API does not serve: never delete on its account.
            return Ok(Some(Arc::new(PartialObject::default())));
        };
        let (res, inf) = &self.kinds[i];
        let ns = if res.namespaced { ns } else { None };
        let key = match ns {
            Some(ns) => format!("{ns}/{}", r.name),
            None => r.name.clone(),
        };
        if let Some(o) = inf.cache().get(&key)
            && o.metadata.uid.as_deref() == Some(r.uid.as_str())
        {
            return Ok(Some(o));
        }
        match self.ctx.client.get(res, ns, &r.name).await {
            Ok(v) if v["metadata"]["uid"].as_str() == Some(r.uid.as_str()) => {
                let o: PartialObject = serde_json::from_value(v).unwrap_or_default();
                Ok(Some(Arc::new(o)))
            }
            Ok(_) => Ok(None),
            Err(e) if e.code == 404 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(
        &self,
        i: usize,
        o: &PartialObject,
        propagation: Option<Propagation>,
    ) -> Result<(), ReconcileError> {
        let (res, _) = &self.kinds[i];
        let mut req = ApiRequest::new(Verb::Delete, res);
        req.namespace = o.metadata.namespace.clone();
        req.name = o.metadata.name.clone();
        req.params.propagation = propagation;
        req.body = json!({"kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": o.metadata.uid}})
        .to_string()
        .into();
        match self.ctx.client.call(req).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 || e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn patch_meta(
        &self,
        i: usize,
        o: &PartialObject,
        meta: serde_json::Value,
    ) -> Result<(), ReconcileError> {
        let (res, _) = &self.kinds[i];
        let mut meta = meta;
        meta["resourceVersion"] = json!(o.metadata.resource_version);
        match self
            .ctx
            .client
            .patch(
                res,
                o.metadata.namespace.as_deref(),
                o.metadata.name.as_deref().unwrap_or(""),
                None,
                PatchType::Merge,
                &json!({"metadata": meta}),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn without_finalizer(o: &PartialObject, f: &str) -> Vec<String> {
        o.metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|x| *x != f)
            .cloned()
            .collect()
    }
}

#[async_trait]
impl Reconciler for Gc {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some((i, okey)) = key.split_once('|') else {
            return Ok(Action::Done);
        };
        let i: usize = i.parse().unwrap_or(usize::MAX);
        let Some((_, inf)) = self.kinds.get(i) else {
            return Ok(Action::Done);
        };
        let Some(o) = inf.cache().get(okey) else {
            return Ok(Action::Done);
        };
        let uid = o.metadata.uid.clone().unwrap_or_default();
        let finalizers: Vec<String> = o.metadata.finalizers.clone().unwrap_or_default();
        let deleting = o.metadata.deletion_timestamp.is_some();

        if deleting && finalizers.iter().any(|f| f == ORPHAN) {
            for (j, d) in self.dependents(&uid) {
                let refs: Vec<_> = d
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.uid != uid)
                    .cloned()
                    .collect();
                self.patch_meta(j, &d, json!({"ownerReferences": refs}))
                    .await?;
            }
            let rest = Gc::without_finalizer(&o, ORPHAN);
            self.patch_meta(i, &o, json!({"finalizers": rest})).await?;
            return Ok(Action::Done);
        }
        if deleting && finalizers.iter().any(|f| f == FOREGROUND) {
            let mut blocking = false;
            for (j, d) in self.dependents(&uid) {
                let blocks = d
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.uid == uid && r.block_owner_deletion == Some(true));
                blocking |= blocks;
                if d.metadata.deletion_timestamp.is_none() {
                    self.delete(j, &d, Some(Propagation::Foreground)).await?;
                }
            }
            if !blocking {
                let rest = Gc::without_finalizer(&o, FOREGROUND);
                self.patch_meta(i, &o, json!({"finalizers": rest})).await?;
            }
            // Dependents going away queue this owner again.
            return Ok(Action::Done);
        }
        let refs = o.metadata.owner_references.clone().unwrap_or_default();
        if refs.is_empty() || deleting {
            return Ok(Action::Done);
        }
        let mut alive = Vec::new();
        let mut foreground_owner = false;
        for r in &refs {
            if let Some(owner) = self
                .owner_exists(o.metadata.namespace.as_deref(), r)
                .await?
            {
                foreground_owner |= owner.metadata.deletion_timestamp.is_some()
                    && owner
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FOREGROUND);
                alive.push(r.clone());
            }
        }
        if alive.is_empty() {
            tracing::debug!(object = %key, "every owner is gone; deleting");
            self.delete(i, &o, Some(Propagation::Background)).await?;
        } else if foreground_owner && alive.len() == 1 {
            self.delete(i, &o, Some(Propagation::Foreground)).await?;
        } else if alive.len() < refs.len() {
            self.patch_meta(i, &o, json!({"ownerReferences": alive}))
                .await?;
        }
        Ok(Action::Done)
    }
}
