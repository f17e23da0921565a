//! The ReplicaSet controller: keeps `spec.replicas` pods of the template running, adopting
//! matching orphans and releasing pods that stopped matching, and reports replicas, ready,
//! available and fully-labeled counts in `status`. The same controller, over a
//! [`SetKind`], runs ReplicationControllers (core/v1: a selector that is a map of labels),
//! as Kubernetes runs them through the ReplicaSet controller.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec, ReplicationController};
use serde_json::json;
use tessera_client::catalog::Resource;
use tessera_client::request::PatchType;
use tessera_core::selector::label::LabelSelector;
use tessera_core::time::now_secs;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::expectations::Expectations;
use tessera_runtime::informer::{Cache, Change, Object, controller_of, key_of, owner_key};
use tessera_runtime::selector::from_metav1;
use tessera_runtime::{EventClass, WorkQueue};

use crate::context::{Context, res};
use crate::pods::{self, BURST, uid_of};

/// The controller's name (queue, metrics, events).
pub const NAME: &str = "replicaset-controller";

/// A kind that keeps a number of pods of a template running (its `apiVersion` and `kind`
/// are its `k8s_openapi::Resource`'s).
pub trait SetKind: Object {
    /// The controller's name.
    const CONTROLLER: &'static str;
    /// The served resource.
    fn resource() -> &'static Resource;
    /// Its selector (an empty one selects nothing here).
    fn selector(&self) -> Result<LabelSelector, String>;
    /// `spec.replicas`.
    fn replicas(&self) -> i32;
    /// `spec.template`.
    fn template(&self) -> Option<&PodTemplateSpec>;
    /// `spec.minReadySeconds`.
    fn min_ready_seconds(&self) -> i32;
    /// (replicas, ready, available, fully labeled, observed generation) of its status.
    fn counts(&self) -> (i32, i32, i32, i32, i64);
}

/// The accessors ReplicaSets and ReplicationControllers share field for field.
macro_rules! same_shape_accessors {
    () => {
        fn replicas(&self) -> i32 {
            self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
        }
        fn template(&self) -> Option<&PodTemplateSpec> {
            self.spec.as_ref()?.template.as_ref()
        }
        fn min_ready_seconds(&self) -> i32 {
            self.spec
                .as_ref()
                .and_then(|s| s.min_ready_seconds)
                .unwrap_or(0)
        }
        fn counts(&self) -> (i32, i32, i32, i32, i64) {
            let s = self.status.clone().unwrap_or_default();
            (
                s.replicas,
                s.ready_replicas.unwrap_or(0),
                s.available_replicas.unwrap_or(0),
                s.fully_labeled_replicas.unwrap_or(0),
                s.observed_generation.unwrap_or(0),
            )
        }
    };
}

impl SetKind for ReplicaSet {
    const CONTROLLER: &'static str = NAME;
    fn resource() -> &'static Resource {
        res("apps", "replicasets")
    }
    fn selector(&self) -> Result<LabelSelector, String> {
        from_metav1(
            &self
                .spec
                .as_ref()
                .map(|s| s.selector.clone())
                .unwrap_or_default(),
        )
    }
    same_shape_accessors!();
}

impl SetKind for ReplicationController {
    const CONTROLLER: &'static str = "replicationcontroller-controller";
    fn resource() -> &'static Resource {
        res("", "replicationcontrollers")
    }
    fn selector(&self) -> Result<LabelSelector, String> {
        let labels = self
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        from_metav1(
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(labels),
                match_expressions: None,
            },
        )
    }
    same_shape_accessors!();
}

struct Rs<T: SetKind> {
    ctx: Context,
    sets: Arc<Cache<T>>,
    pods: Arc<Cache<Pod>>,
    expectations: Arc<Expectations>,
    recorder: Recorder,
}

/// Runs the controller until the future is dropped.
pub async fn run(ctx: Context) {
    run_kind::<ReplicaSet>(ctx).await;
}

/// Runs the controller of `T` until the future is dropped.
pub async fn run_kind<T: SetKind>(ctx: Context) {
    let sets = ctx.informer::<T>(T::resource());
    let pods = ctx.informer::<Pod>(res("", "pods"));
    let expectations = Arc::new(Expectations::new());
    let r = Arc::new(Rs::<T> {
        recorder: ctx.recorder(T::CONTROLLER),
        sets: sets.cache().clone(),
        pods: pods.cache().clone(),
        expectations: expectations.clone(),
        ctx: ctx.clone(),
    });
    let exp = expectations.clone();
    let set_cache = sets.cache().clone();
    ctx.controller(T::CONTROLLER)
        .watches_with(&sets, move |c, q| {
            let key = key_of(c.object().metadata());
            if let Change::Deleted(_) = c {
                expectations.forget(&key);
            }
            q.add(key, c.class());
        })
        .watches_with(&pods, move |c, q| on_pod(c, q, &exp, &set_cache))
        .run(r)
        .await;
}

/// Queues the ReplicaSet a pod belongs to (or, for an orphan, the ones that could adopt it).
fn on_pod<T: SetKind>(c: &Change<Pod>, q: &WorkQueue<String>, exp: &Expectations, sets: &Cache<T>) {
    let owner_key = |p: &Pod| owner_key(&p.metadata, T::KIND);
    match c {
        Change::Added(p) => match owner_key(p) {
            Some(k) => {
                // Mostly the set's own creations coming back: they move its status, and the
                // pods that follow within the batch period are written with them.
                exp.observed_add(&k);
                q.add_throttled(k, EventClass::Add);
            }
            None => orphan(p, q, sets),
        },
        Change::Updated { old, new } => {
            let (a, b) = (owner_key(old), owner_key(new));
            let same_owner = a == b;
            if !same_owner && let Some(a) = a {
                q.add(a, EventClass::Update);
            }
            match b {
                // A pod that only moved on (bound, started, ready) changes the set's status
                // alone: such changes of one set are written together.
                Some(b) if same_owner && only_progressed(old, new) => {
                    q.add_throttled(b, EventClass::Update)
                }
                Some(b) => q.add(b, EventClass::Update),
                None => orphan(new, q, sets),
            }
            if new.metadata.deletion_timestamp.is_some()
                && old.metadata.deletion_timestamp.is_none()
                && let Some(k) = owner_key(new)
            {
                // A graceful deletion counts as the deletion it was expected to be.
                exp.observed_delete(&k, uid_of(new));
            }
        }
        Change::Deleted(p) => {
            if let Some(k) = owner_key(p) {
                exp.observed_delete(&k, uid_of(p));
                q.add(k, EventClass::Delete);
            }
        }
    }
}

/// Whether a pod's change can move its set's status but not what the set must do: still
/// active (or still not), with the same labels.
fn only_progressed(old: &Pod, new: &Pod) -> bool {
    pods::is_active(old) == pods::is_active(new)
        && old.metadata.deletion_timestamp == new.metadata.deletion_timestamp
        && old.metadata.labels == new.metadata.labels
}

fn orphan<T: SetKind>(p: &Pod, q: &WorkQueue<String>, sets: &Cache<T>) {
    if !pods::is_active(p) {
        return;
    }
    let ns = p.metadata.namespace.as_deref().unwrap_or("");
    let Some(labels) = p.metadata.labels.as_ref() else {
        return;
    };
    for rs in sets.in_namespace(ns) {
        let Ok(sel) = rs.selector() else {
            continue;
        };
        if !sel.is_empty() && sel.matches(labels) {
            q.add(key_of(rs.metadata()), EventClass::Update);
        }
    }
}

#[async_trait]
impl<T: SetKind> Reconciler for Rs<T> {
    fn name(&self) -> &'static str {
        T::CONTROLLER
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(rs) = self.sets.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::Done);
        };
        let meta = rs.metadata();
        let ns = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let uid = meta.uid.clone().unwrap_or_default();
        let selector = rs
            .selector()
            .map_err(|e| ReconcileError::new(format!("{} {key}: {e}", T::KIND)))?;
        if selector.is_empty() {
            return Ok(Action::Done);
        }
        // Claim: adopt matching orphans, release owned pods that no longer match. Both come
        // from indexes (owner, label): a set's work does not grow with the namespace.
        let mut mine: Vec<Arc<Pod>> = Vec::new();
        let mut live = meta.deletion_timestamp.is_none();
        for p in self.pods.owned_by(&uid) {
            if controller_of(&p.metadata).is_none_or(|o| o.uid != uid) {
                continue;
            }
            let matches = p
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| selector.matches(l));
            if matches {
                mine.push(p);
            } else if live {
                self.release(&p).await?;
            }
        }
        if live {
            // Adoption is checked against the API once, as kube-controller-manager's
            // RecheckDeletionTimestamp does: the set's cached copy may not show a deletion the
            // pods' cache already reflects (an orphaning delete releases the pods first), and
            // a set being deleted must not take back the pods it just let go.
            let mut may_adopt = None;
            for p in self.pods.select(Some(&ns), &selector) {
                if controller_of(&p.metadata).is_none() && pods::is_active(&p) {
                    if may_adopt.is_none() {
                        may_adopt = Some(self.may_adopt(&rs).await?);
                    }
                    if may_adopt == Some(false) {
                        // Being deleted (or gone) after all: neither adopt nor scale.
                        live = false;
                        break;
                    }
                    let adopted = self.adopt(&rs, &p).await?;
                    if adopted {
                        mine.push(p);
                    }
                }
            }
        }
        let active: Vec<&Arc<Pod>> = mine.iter().filter(|p| pods::is_active(p)).collect();
        // A deletion asked for is seen once the cache shows its pod terminating or gone,
        // even if the event that showed it came first (someone else was deleting it too).
        if self.expectations.awaits_deletions(key) {
            let active_uids: HashSet<&str> = active.iter().map(|p| uid_of(p)).collect();
            self.expectations
                .retain_deletions(key, |u| active_uids.contains(u));
        }
        let want = rs.replicas().max(0) as usize;
        let mut error = None;
        // Pods created or deleted here: their events queue the set again.
        let mut acted = false;
        if live && self.expectations.satisfied(key) {
            if active.len() < want {
                let n = (want - active.len()).min(BURST);
                let owner = pods::owner_ref(T::API_VERSION, T::KIND, &name, &uid);
                let template = rs.template().cloned().unwrap_or_default();
                let new = pods::typed_pods((0..n).map(|_| {
                    pods::from_template(
                        &template,
                        &owner,
                        &format!("{name}-"),
                        None,
                        &BTreeMap::new(),
                    )
                }))?;
                let (created, err) =
                    pods::create_slow_start(&self.ctx.client, &ns, new, &self.expectations, key)
                        .await;
                let r = ObjectRef::new(T::API_VERSION, T::KIND, meta);
                acted |= created > 0;
                if created > 0 {
                    self.recorder.event(
                        &r,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("Created {created} pod(s)"),
                    );
                }
                if let Some(e) = err {
                    self.recorder.event(
                        &r,
                        EventType::Warning,
                        "FailedCreate",
                        &format!("Error creating: {}", e.message),
                    );
                    error = Some(ReconcileError::from(e));
                }
            } else if active.len() > want {
                let mut victims = active.clone();
                victims.sort_by_key(|p| pods::deletion_rank(p));
                victims.truncate((active.len() - want).min(BURST));
                self.expectations
                    .expect_deletions(key, victims.iter().map(|p| uid_of(p)));
                let mut deleted = 0;
                for p in victims {
                    match pods::delete_pod(&self.ctx.client, p).await {
                        Ok(()) => deleted += 1,
                        Err(e) => {
                            self.expectations.observed_delete(key, uid_of(p));
                            if e.code != 404 {
                                error.get_or_insert(ReconcileError::from(e));
                            }
                        }
                    }
                }
                acted |= deleted > 0;
                if deleted > 0 {
                    self.recorder.event(
                        &ObjectRef::new(T::API_VERSION, T::KIND, meta),
                        EventType::Normal,
                        "SuccessfulDelete",
                        &format!("Deleted {deleted} pod(s)"),
                    );
                }
            }
        }
        // Pods created or deleted here, or not seen yet, are about to change the counts: a
        // status that would only take the new generation waits for them (a set created
        // with its pods is written once, not first with zeros). Counts that moved are
        // written at once, so a set that keeps growing through a rollout still shows it.
        let settled = !acted && self.expectations.satisfied(key);
        let mut requeue = self.update_status(&rs, &active, settled).await?;
        // Waiting on creations or deletions not seen yet: look again when they are given up
        // on, even if no event comes (a lost one would otherwise stall the set).
        if let Some(wait) = self.expectations.pending_for(key) {
            requeue = Some(requeue.map_or(wait, |r| r.min(wait)));
        }
        match error {
            Some(e) => Err(e),
            None => Ok(requeue.map_or(Action::Done, Action::RequeueAfter)),
        }
    }
}

impl<T: SetKind> Rs<T> {
    /// Whether the set, read fresh from the API, is still the same one and not being deleted.
    async fn may_adopt(&self, rs: &T) -> Result<bool, ReconcileError> {
        let meta = rs.metadata();
        match self
            .ctx
            .client
            .get(
                T::resource(),
                meta.namespace.as_deref(),
                meta.name.as_deref().unwrap_or(""),
            )
            .await
        {
            Ok(v) => Ok(v["metadata"]["uid"].as_str() == meta.uid.as_deref()
                && v["metadata"]["deletionTimestamp"].is_null()),
            Err(e) if e.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn adopt(&self, rs: &T, p: &Pod) -> Result<bool, ReconcileError> {
        let owner = pods::owner_ref(
            T::API_VERSION,
            T::KIND,
            rs.metadata().name.as_deref().unwrap_or(""),
            rs.metadata().uid.as_deref().unwrap_or(""),
        );
        let mut refs = p.metadata.owner_references.clone().unwrap_or_default();
        refs.push(owner);
        self.set_owner_refs(p, refs).await
    }

    async fn release(&self, p: &Pod) -> Result<(), ReconcileError> {
        let refs: Vec<_> = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|r| r.controller != Some(true))
            .cloned()
            .collect();
        self.set_owner_refs(p, refs).await.map(|_| ())
    }

    /// Writes a pod's owner references if it is still the version the cache showed; false
    /// if it changed or went meanwhile (the next event brings it back).
    async fn set_owner_refs(
        &self,
        p: &Pod,
        refs: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    ) -> Result<bool, ReconcileError> {
        let patch = json!({"metadata": {"ownerReferences": refs, "uid": p.metadata.uid,
            "resourceVersion": p.metadata.resource_version}});
        match self
            .ctx
            .client
            .patch(
                res("", "pods"),
                p.metadata.namespace.as_deref(),
                p.metadata.name.as_deref().unwrap_or(""),
                None,
                PatchType::Merge,
                &patch,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code == 409 || e.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the counts if they changed; returns when to look again for pods becoming
    /// available.
    async fn update_status(
        &self,
        rs: &T,
        active: &[&Arc<Pod>],
        settled: bool,
    ) -> Result<Option<Duration>, ReconcileError> {
        let min_ready = i64::from(rs.min_ready_seconds());
        let now = now_secs();
        let template_labels = rs
            .template()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let fully = active
            .iter()
            .filter(|p| {
                let l = p.metadata.labels.as_ref();
                template_labels
                    .iter()
                    .all(|(k, v)| l.and_then(|l| l.get(k)) == Some(v))
            })
            .count();
        let ready = active.iter().filter(|p| pods::is_ready(p)).count();
        let available = active
            .iter()
            .filter(|p| pods::is_available(p, min_ready, now))
            .count();
        let next = active
            .iter()
            .filter_map(|p| pods::until_available(p, min_ready, now))
            .min()
            .map(|s| Duration::from_secs(s as u64 + 1));
        let (replicas_now, ready_now, available_now, fully_now, observed) = rs.counts();
        let generation = rs.metadata().generation.unwrap_or(0);
        let counts_same = replicas_now == active.len() as i32
            && ready_now == ready as i32
            && available_now == available as i32;
        let same =
            counts_same && (!settled || (fully_now == fully as i32 && observed == generation));
        if same {
            return Ok(next);
        }
        let patch = json!({"status": {
            "replicas": active.len(), "fullyLabeledReplicas": fully, "readyReplicas": ready,
            "availableReplicas": available, "observedGeneration": generation}});
        match self
            .ctx
            .client
            .patch(
                T::resource(),
                rs.metadata().namespace.as_deref(),
                rs.metadata().name.as_deref().unwrap_or(""),
                Some("status"),
                PatchType::Merge,
                &patch,
            )
            .await
        {
            Ok(_) => Ok(next),
            Err(e) if e.code == 404 => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
