//! The garbage collector: objects whose owners are all gone are deleted (background
//! propagation); an owner deleted with `propagationPolicy=Foreground` waits (its
//! `foregroundDeletion` finalizer) until its blocking dependents are gone; one deleted with
//! `Orphan` has its dependents' references to it removed before it goes.
//!
//! Every built-in kind (but Events) is watched with metadata only. Before deleting a
//! dependent whose owner is not in the cache, the owner is read from the API: a cache that has
//! not yet seen a new owner never causes a deletion.
//!
//! Owners of custom kinds (a Deployment an operator made for its custom object) are not
//! watched: every [`CUSTOM_SWEEP`] each custom kind that owns something is listed once, and a
//! dependent whose owner's UID is not among them is queued; its reconcile reads the owner
//! from the API before anything is deleted. An owner of a kind no CRD defines (any more) is
//! never a reason to delete.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tessera_client::catalog::{APIEXTENSIONS, RESOURCES, Resource};
use tessera_client::request::{ApiRequest, PatchType, Propagation, Verb};
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Change, Informer, PartialObject, key_of};
use tessera_runtime::{EventClass, WorkQueue};

use crate::context::Context;

/// The controller's name.
pub const NAME: &str = "garbage-collector";
/// The finalizer of a foreground deletion.
pub const FOREGROUND: &str = "foregroundDeletion";
/// The finalizer of an orphaning deletion.
pub const ORPHAN: &str = "orphan";

/// How often dependents of custom objects are looked at.
pub const CUSTOM_SWEEP: Duration = Duration::from_secs(10);

/// What a conditional delete did.
#[derive(Debug, PartialEq, Eq)]
enum Deleted {
    Yes,
    /// The object changed (or went) since the copy the decision was made on.
    Changed,
}

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
    let kinds: Vec<_> = watched()
        .map(|r| (r, ctx.informer::<PartialObject>(r)))
        .collect();
    let gc = Arc::new(Gc {
        ctx: ctx.clone(),
        kinds,
    });
    let mut controller = ctx.controller(NAME);
    let queue = controller.queue().clone();
    let weak = Arc::downgrade(&gc);
    let _sweeps = tessera_runtime::informer::Tasks(vec![tokio::spawn(async move {
        loop {
            tokio::time::sleep(CUSTOM_SWEEP).await;
            let Some(gc) = weak.upgrade() else {
                return;
            };
            if let Err(e) = gc.sweep_custom_owners(&queue).await {
                tracing::warn!(error = %e, "looking at the dependents of custom objects");
            }
        }
    })]);
    for (i, (_, inf)) in gc.kinds.iter().enumerate() {
        // A deletion queues the deleted object's dependents, wherever they are, and its
        // owners (one waiting in a foreground deletion looks again).
        let weak = Arc::downgrade(&gc);
        controller = controller.watches_with(inf, move |c, q| {
            on_change(i, c, q);
            if let Change::Deleted(o) = c
                && let Some(gc) = weak.upgrade()
            {
                gc.queue_related(o, q);
            }
        });
    }
    controller.run(gc).await;
}

impl Gc {
    fn queue_related(&self, o: &PartialObject, q: &WorkQueue<String>) {
        let uid = o.metadata.uid.as_deref().unwrap_or("");
        for (j, (_, other)) in self.kinds.iter().enumerate() {
            for d in other.cache().owned_by(uid) {
                q.add(qkey(j, &key_of(&d.metadata)), EventClass::Delete);
            }
        }
        for r in o.metadata.owner_references.iter().flatten() {
            if let Some(j) = self.resource_of(&r.api_version, &r.kind) {
                let key = match (self.kinds[j].0.namespaced, o.metadata.namespace.as_deref()) {
                    (true, Some(ns)) => format!("{ns}/{}", r.name),
                    _ => r.name.clone(),
                };
                q.add(qkey(j, &key), EventClass::Update);
            }
        }
    }
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
    /// The resource of every kind a CRD defines, by (apiVersion, kind), as the CRDs say now.
    async fn custom_kinds(
        &self,
    ) -> Result<HashMap<(String, String), &'static Resource>, ReconcileError> {
        let crds = crate::context::res(APIEXTENSIONS, "customresourcedefinitions");
        let list = self
            .ctx
            .client
            .list(ApiRequest::new(Verb::List, crds))
            .await?;
        let mut out = HashMap::new();
        for crd in list["items"].as_array().into_iter().flatten() {
            for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let Some(version) = v["name"].as_str().filter(|_| v["served"] == true) else {
                    continue;
                };
                if let Some(r) = tessera_client::catalog::custom_resource(crd, version) {
                    out.insert((format!("{}/{}", r.group, r.version), r.kind.to_owned()), r);
                }
            }
        }
        Ok(out)
    }

    /// Queues every dependent (in the caches) of a custom object that is gone: each custom
    /// kind referenced as an owner is listed once.
    async fn sweep_custom_owners(&self, q: &WorkQueue<String>) -> Result<(), ReconcileError> {
        let mut wanted: HashMap<(String, String), Vec<(String, String)>> = HashMap::new();
        for (j, (_, inf)) in self.kinds.iter().enumerate() {
            for o in inf.cache().list() {
                for r in o.metadata.owner_references.iter().flatten() {
                    if self.resource_of(&r.api_version, &r.kind).is_none() {
                        wanted
                            .entry((r.api_version.clone(), r.kind.clone()))
                            .or_default()
                            .push((r.uid.clone(), qkey(j, &key_of(&o.metadata))));
                    }
                }
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let kinds = self.custom_kinds().await?;
        for (kind, dependents) in wanted {
            let Some(res) = kinds.get(&kind) else {
                continue;
            };
            let mut live = HashSet::new();
            let mut req = ApiRequest::new(Verb::List, res);
            req.params.limit = 500;
            let listed = self
                .ctx
                .client
                .list_each(req, &mut |item| {
                    if let Some(uid) = item["metadata"]["uid"].as_str() {
                        live.insert(uid.to_owned());
                    }
                })
                .await;
            if listed.is_err() {
                continue;
            }
            for (uid, key) in dependents {
                if !live.contains(&uid) {
                    q.add(key, EventClass::Update);
                }
            }
        }
        Ok(())
    }

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

    /// All dependents of `uid` as the API has them now: every kind in the owner's namespace
    /// (every namespace for a cluster-scoped owner), in pages. Only the orphan step uses it,
    /// once per orphaning deletion.
    async fn live_dependents(
        &self,
        ns: Option<&str>,
        uid: &str,
    ) -> Result<Vec<(usize, Arc<PartialObject>)>, ReconcileError> {
        let mut out = Vec::new();
        for (j, (res, _)) in self.kinds.iter().enumerate() {
            if ns.is_some() && !res.namespaced {
                continue;
            }
            let mut req = ApiRequest::new(Verb::List, res);
            req.namespace = ns.map(str::to_string);
            req.params.limit = 500;
            let mut each = |item: serde_json::Value| {
                let owned = item["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid));
                if owned && let Ok(d) = serde_json::from_value::<PartialObject>(item) {
                    out.push((j, Arc::new(d)));
                }
            };
            match self.ctx.client.list_each(req, &mut each).await {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Deletes (in the foreground) the dependents of a foreground deletion not being deleted
    /// yet; true if any of them blocks its owner's deletion.
    async fn cascade(
        &self,
        dependents: Vec<(usize, Arc<PartialObject>)>,
        uid: &str,
    ) -> Result<bool, ReconcileError> {
        let mut blocking = false;
        for (j, d) in dependents {
            blocking |= d
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.uid == uid && r.block_owner_deletion == Some(true));
            if d.metadata.deletion_timestamp.is_none() {
                self.delete(j, &d, Some(Propagation::Foreground)).await?;
            }
        }
        Ok(blocking)
    }

    /// Whether the owner named by `r` exists (with that UID), asking the API when the cache
    /// has not seen it.
    async fn owner_exists(
        &self,
        ns: Option<&str>,
        r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Result<Option<Arc<PartialObject>>, ReconcileError> {
        let Some(i) = self.resource_of(&r.api_version, &r.kind) else {
            return self.custom_owner_exists(ns, r).await;
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

    /// [`Gc::owner_exists`] for an owner of a kind that is not built in: read from the API
    /// if a CRD defines the kind; one no CRD defines is taken to exist (never a reason to
    /// delete), and so is one the API answers for with anything but the object's own
    /// NotFound (a kind not served yet answers NotFound without naming an object).
    async fn custom_owner_exists(
        &self,
        ns: Option<&str>,
        r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Result<Option<Arc<PartialObject>>, ReconcileError> {
        let exists = Ok(Some(Arc::new(PartialObject::default())));
        let kinds = self.custom_kinds().await?;
        let Some(res) = kinds.get(&(r.api_version.clone(), r.kind.clone())) else {
            return exists;
        };
        let ns = if res.namespaced { ns } else { None };
        match self.ctx.client.get(res, ns, &r.name).await {
            Ok(v) if v["metadata"]["uid"].as_str() == Some(r.uid.as_str()) => {
                let o: PartialObject = serde_json::from_value(v).unwrap_or_default();
                Ok(Some(Arc::new(o)))
            }
            Ok(_) => Ok(None),
            Err(e)
                if e.code == 404 && e.details.as_ref().is_some_and(|d| d["name"].is_string()) =>
            {
                Ok(None)
            }
            Err(e) if e.code == 404 => exists,
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(
        &self,
        i: usize,
        o: &PartialObject,
        propagation: Option<Propagation>,
    ) -> Result<(), ReconcileError> {
        match self.delete_if(i, o, propagation, false).await? {
            Deleted::Yes | Deleted::Changed => Ok(()),
        }
    }

    /// Deletes `o` if it is still the object (uid) — and, with `unchanged`, still the version
    /// (resourceVersion) — the decision was made on. A decision taken on a cached copy uses
    /// `unchanged`: a dependent whose reference was just removed (an orphaning delete of its
    /// owner) must not be collected on the strength of a cache that has not seen the removal.
    async fn delete_if(
        &self,
        i: usize,
        o: &PartialObject,
        propagation: Option<Propagation>,
        unchanged: bool,
    ) -> Result<Deleted, ReconcileError> {
        let (res, _) = &self.kinds[i];
        let mut req = ApiRequest::new(Verb::Delete, res);
        req.namespace = o.metadata.namespace.clone();
        req.name = o.metadata.name.clone();
        req.params.propagation = propagation;
        let mut pre = json!({"uid": o.metadata.uid});
        if unchanged {
            pre["resourceVersion"] = json!(o.metadata.resource_version);
        }
        req.body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": pre})
            .to_string()
            .into();
        match self.ctx.client.call(req).await {
            Ok(_) => Ok(Deleted::Yes),
            Err(e) if e.code == 404 || e.code == 409 => Ok(Deleted::Changed),
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
            // Read from the API, not the caches: a dependent created just before the owner's
            // deletion may not be in a cache yet, and one left holding its reference would be
            // collected as soon as the owner is gone.
            for (j, d) in self
                .live_dependents(o.metadata.namespace.as_deref(), &uid)
                .await?
            {
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
            let mut blocking = self.cascade(self.dependents(&uid), &uid).await?;
            if !blocking {
                // The caches say none is left: make sure with the API before the owner goes
                // (one created just before the deletion may not be cached yet).
                let live = self
                    .live_dependents(o.metadata.namespace.as_deref(), &uid)
                    .await?;
                blocking = self.cascade(live, &uid).await?;
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
        let propagation = if alive.is_empty() {
            tracing::debug!(object = %key, "every owner is gone; deleting");
            Some(Propagation::Background)
        } else if foreground_owner && alive.len() == 1 {
            Some(Propagation::Foreground)
        } else {
            None
        };
        if let Some(p) = propagation {
            if self.delete_if(i, &o, Some(p), true).await? == Deleted::Changed {
                // Changed since the cache saw it (or gone): decide again on the newer copy,
                // which the watch is bringing (an update that changed no reference would not
                // queue it by itself).
                return Ok(Action::RequeueAfter(std::time::Duration::from_millis(200)));
            }
        } else if alive.len() < refs.len() {
            self.patch_meta(i, &o, json!({"ownerReferences": alive}))
                .await?;
        }
        Ok(Action::Done)
    }
}
