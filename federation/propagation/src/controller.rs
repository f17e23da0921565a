//! The propagation controller: every workload applied at the federation is placed (which
//! shards, how many replicas each), its decision recorded on it, and each chosen shard told
//! to hold its share; statuses coming back are aggregated onto the federation's object.
//! Tenants are held by every shard (their namespaces' security and quotas hold there too).
//!
//! Deletion is fenced by a finalizer: the federation's object goes only once every
//! connected shard has removed its copy (a disconnected shard removes its copy when it
//! comes back, because it is no longer assigned it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PodSpec, PodTemplateSpec, Secret, Service, ServiceAccount,
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::catalog::{ADMISSIONREGISTRATION, APIEXTENSIONS, RBAC, Resource};
use tessera_client::client::Client;
use tessera_client::request::{PatchType, find_resource};
use tessera_client::types::{FAILOVER_ANNOTATION, FEDERATED_LABEL, Placement, PodGroup, Tenant};
use tessera_client::workloads::WorkloadKind;
use tessera_core::quantity::Quantity;
use tessera_core::time::{now_secs, rfc3339};
use tessera_placement::{Decision, Failover, Request, Workload};
use tessera_registry::{Held, ObjectKey, Registry, RegistryEvent, Standing};
use tessera_runtime::controller::{self, Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, Change, Informer, Scope, SpecObject, Tasks, key_of};
use tessera_runtime::metrics::{QueueMetrics, RuntimeMetrics};
use tessera_runtime::{EventClass, QueueConfig, WorkQueue};
use tessera_scheduler::resources::pod_spec_requests;

use crate::dependencies;
use crate::gang;
use crate::moves;
use crate::policy;
use crate::quota;
use crate::status::{self, Placed};

/// The controller's name.
pub const NAME: &str = "federation-propagation";
/// The finalizer that holds a federated object until its shards' copies are gone.
pub const FINALIZER: &str = "tessera.io/federation";
/// The annotation recording a workload's placement decision.
pub const PLACEMENT_ANNOTATION: &str = "tessera.io/placement";
/// The annotation on a shard's copy: the federation generation it was made from.
pub const GENERATION_ANNOTATION: &str = "tessera.io/federation-generation";

/// Namespaces whose objects are the federation's own, never propagated. (`default` is not
/// one: `kubectl create deployment` without `-n` lands there, and is placed like any
/// namespace no Tenant owns — a tenant of its own.)
const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// What a decision annotation holds.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    /// The generation decided for.
    pub generation: i64,
    /// The Placement it was decided under (`name@resourceVersion`, empty for the default).
    #[serde(default)]
    pub policy: String,
    /// Replicas per shard.
    pub shares: BTreeMap<String, u64>,
    /// Replicas that fit nowhere.
    #[serde(default)]
    pub unplaced: u64,
    /// Why they wait.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
    /// What one replica requests, as decided on: replicas already running count as room in
    /// their shard only while it stays the same.
    #[serde(default)]
    pub request: String,
    /// Shares on live shards kept until the workload's move off them finishes (see
    /// [`crate::moves`]): after a restart the move goes on from here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leaving: BTreeMap<String, u64>,
    /// A federation-scope gang's two-phase commit (see [`crate::gang`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<gang::Record>,
}

/// What a queue key names: a workload (placed by policy, status aggregated), a Tenant, or an
/// RBAC object or CustomResourceDefinition (held by every shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A workload of one of the placed kinds.
    Workload(WorkloadKind),
    /// A Tenant.
    Tenant,
    /// One of [`HELD_KINDS`], by plural.
    Held(&'static str),
    /// A custom object, of the storage version of a CRD the federation holds.
    Custom(&'static Resource),
}

pub use tessera_client::types::HELD_KINDS;

/// The group of a held kind's plural.
fn held_group(plural: &str) -> &'static str {
    HELD_KINDS
        .iter()
        .find(|(_, p, _)| *p == plural)
        .map_or(RBAC, |(g, _, _)| *g)
}

impl Kind {
    fn resource(self) -> &'static Resource {
        match self {
            Kind::Workload(k) => k.resource(),
            Kind::Tenant => find_resource("tessera.io", "v1alpha1", "tenants").expect("served"),
            Kind::Held(plural) => find_resource(held_group(plural), "v1", plural).expect("served"),
            Kind::Custom(res) => res,
        }
    }

    fn prefix(self) -> std::borrow::Cow<'static, str> {
        match self {
            Kind::Workload(k) => k.plural().into(),
            Kind::Tenant => "tenants".into(),
            Kind::Held(plural) => plural.into(),
            Kind::Custom(res) => crate::custom::prefix_of(res).into(),
        }
    }

    /// The kind of a registry key's resource.
    fn of_resource(plural: &str) -> Option<Kind> {
        if plural == "tenants" {
            return Some(Kind::Tenant);
        }
        if let Some((_, p, _)) = HELD_KINDS.iter().find(|(_, p, _)| *p == plural) {
            return Some(Kind::Held(p));
        }
        WorkloadKind::from_plural(plural).map(Kind::Workload)
    }

    fn parse(key: &str) -> Option<(Kind, &str)> {
        let (p, rest) = key.split_once(':')?;
        Some((Kind::of_resource(p)?, rest))
    }

    fn object_key(self, key: &str) -> ObjectKey {
        let r = self.resource();
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        ObjectKey {
            group: r.group.into(),
            // A custom object's key names no version: a CRD's storage version may change,
            // its objects stay the same (the agent reads the version from the object).
            version: if matches!(self, Kind::Custom(_)) {
                String::new()
            } else {
                r.version.into()
            },
            resource: r.plural.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }
}

/// The caches of the placed kinds, one per kind.
#[derive(Clone, Default)]
struct Workloads(Vec<(WorkloadKind, Arc<Cache<SpecObject>>)>);

impl Workloads {
    fn cache(&self, kind: WorkloadKind) -> &Arc<Cache<SpecObject>> {
        &self
            .0
            .iter()
            .find(|(k, _)| *k == kind)
            .expect("a cache per placed kind")
            .1
    }

    /// The queue key of every workload in `ns`.
    fn keys_in(&self, ns: &str) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|(k, c)| {
                c.in_namespace(ns)
                    .into_iter()
                    .map(move |o| format!("{}:{}", k.plural(), key_of(&o.metadata)))
            })
            .collect()
    }

    /// The queue key of every workload.
    fn all_keys(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|(k, c)| {
                c.list()
                    .into_iter()
                    .map(move |o| format!("{}:{}", k.plural(), key_of(&o.metadata)))
            })
            .collect()
    }
}

/// The controller.
pub struct Propagation {
    client: Arc<dyn Client>,
    registry: Arc<Registry>,
    workloads: Workloads,
    tenants: Arc<Cache<Tenant>>,
    /// RBAC objects and CRDs, by plural (as JSON: held in every shard as they are).
    held: Vec<(&'static str, Arc<dyn HeldCache>)>,
    /// The objects of the CRDs' kinds.
    custom: crate::custom::CustomKinds,
    placements: Arc<Cache<Placement>>,
    namespaces: Arc<Cache<Namespace>>,
    /// What workloads take along to their shards.
    config_maps: Arc<Cache<ConfigMap>>,
    secrets: Arc<Cache<Secret>>,
    service_accounts: Arc<Cache<ServiceAccount>>,
    services: Arc<Cache<Service>>,
    /// PodGroups: a gang's is carried to its shard, or divided over shards.
    pod_groups: Arc<Cache<PodGroup>>,
    recorder: Recorder,
    /// Workloads with replicas waiting for room: placed again when a shard changes.
    pending: Mutex<BTreeSet<String>>,
    /// Namespace → owning Tenant.
    tenant_index: Arc<Mutex<policy::TenantIndex>>,
    /// What each tenant's placed workloads hold, against its fleet-wide quota.
    ledger: Mutex<quota::Ledger>,
    /// The queue, to wake workloads a freed quota lets in.
    queue: WorkQueue<String>,
    /// Moves allowed under way at once (`--max-moving`).
    max_moving: usize,
    /// See [`Options::gang_commit_delay`].
    gang_commit_delay: Duration,
    /// Workloads moving between live shards (or holding a slot to): when each move began,
    /// and whether its beginning was announced (Events, metrics).
    moving: Mutex<BTreeMap<String, (Instant, bool)>>,
    /// Moves that ran past `move_timeout`: they go on (the old copy stays until the new one
    /// is available) but no longer hold a slot, so one stuck move does not hold up the rest.
    stalled: Mutex<BTreeMap<String, Instant>>,
    /// See [`Options::move_timeout`].
    move_timeout: Duration,
    /// Workloads to look at again when a shard becomes usable (ready, with a summary): a
    /// shard ahead of where they run was passed over when they were last looked at.
    rehome: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// Workloads whose move waits for a free slot.
    waiting_to_move: Mutex<moves::Waiting>,
    /// The map version each workload was last looked at under (a newer map may move it).
    checked_map: Mutex<std::collections::HashMap<String, u64>>,
    /// The last map version every workload was queued for.
    last_map: std::sync::atomic::AtomicU64,
}

/// What the controller runs with.
pub struct Options {
    /// The federation's API, acting as the federation.
    pub client: Arc<dyn Client>,
    /// The registry of shards.
    pub registry: Arc<Registry>,
    /// Workers.
    pub workers: usize,
    /// Workloads allowed to move between live shards at once (rebalancing after a shard
    /// joins, drains): at least 1.
    pub max_moving: usize,
    /// A federation-scope gang is committed no sooner than this after its attempt began (a
    /// fault-injection seam for tests; zero in production).
    pub gang_commit_delay: Duration,
    /// How long a move may hold its `max_moving` slot: one still unfinished then (a new copy
    /// that never becomes available) is reported stalled and gives its slot up.
    pub move_timeout: Duration,
    /// Queue metrics.
    pub queue_metrics: Option<QueueMetrics>,
    /// Informer and reconcile metrics.
    pub runtime_metrics: Option<RuntimeMetrics>,
    /// The least time between two reconciles of a workload that only follow its shards'
    /// status reports (and its own status writes): reports within it are aggregated
    /// together ([`tessera_runtime::queue::DEFAULT_STATUS_BATCH`] unless configured).
    pub status_batch: std::time::Duration,
}

/// Runs the controller until dropped.
pub async fn run(o: Options) {
    if let Some(m) = o.registry.metrics() {
        // Every mode and outcome from the start, at 0: the first decisions then count in
        // `rate()` (a counter first seen at 1 shows no increase).
        for mode in policy::MODE_NAMES {
            for outcome in ["placed", "partial", "pending"] {
                m.placements.with_label_values(&[mode, outcome]);
            }
        }
    }
    let workload_informers: Vec<(WorkloadKind, Arc<Informer<SpecObject>>)> = WorkloadKind::ALL
        .into_iter()
        .map(|k| {
            let inf = Informer::<SpecObject>::new(
                o.client.clone(),
                k.resource(),
                Scope::default(),
                o.runtime_metrics.clone(),
            );
            (k, inf)
        })
        .collect();
    let workloads = Workloads(
        workload_informers
            .iter()
            .map(|(k, i)| (*k, i.cache().clone()))
            .collect(),
    );
    let tenants = informer::<Tenant>(&o, "tessera.io", "v1alpha1", "tenants");
    let placements = informer::<Placement>(&o, "tessera.io", "v1alpha1", "placements");
    let namespaces = informer::<Namespace>(&o, "", "v1", "namespaces");
    let config_maps = informer::<ConfigMap>(&o, "", "v1", "configmaps");
    let secrets = informer::<Secret>(&o, "", "v1", "secrets");
    let service_accounts = informer::<ServiceAccount>(&o, "", "v1", "serviceaccounts");
    let services = informer::<Service>(&o, "", "v1", "services");
    let pod_groups = informer::<PodGroup>(&o, "tessera.io", "v1alpha1", "podgroups");
    let held_caches = held_informers(&o);
    let tenant_index = Arc::new(Mutex::new(policy::TenantIndex::default()));
    let queue: WorkQueue<String> = WorkQueue::new(
        QueueConfig::new(NAME).with_throttle(o.status_batch),
        None,
        o.queue_metrics.clone(),
    );
    {
        for (k, inf) in &workload_informers {
            let (q, prefix) = (queue.clone(), k.plural());
            inf.on_change(move |c| {
                let key = format!("{prefix}:{}", key_of(&c.object().metadata));
                match c {
                    // Only what this controller writes moved (its status, its record, its
                    // finalizer): nothing new to decide, and the status follows in a batch.
                    Change::Updated { old, new } if only_ours_moved(old, new) => {
                        q.add_throttled(key, c.class())
                    }
                    _ => q.add(key, c.class()),
                }
            })
            .detach();
        }
        let index = tenant_index.clone();
        tenants
            .on_change(move |c| {
                let (old, new) = match c {
                    Change::Added(t) => (None, Some(t.as_ref())),
                    Change::Updated { old, new } => (Some(old.as_ref()), Some(new.as_ref())),
                    Change::Deleted(t) => (Some(t.as_ref()), None),
                };
                index.lock().update(old, new);
            })
            .detach();
        let q = queue.clone();
        tenants
            .on_change(move |c| {
                q.add(
                    format!("tenants:{}", key_of(&c.object().metadata)),
                    c.class(),
                )
            })
            .detach();
        // A Placement's change re-places every workload of its namespace.
        requeue_namespace_on(&placements, &queue, &workloads);
        // So does a change of what workloads take along (a ConfigMap, a Secret, ...): their
        // copies in the shards follow.
        requeue_namespace_on(&config_maps, &queue, &workloads);
        requeue_namespace_on(&secrets, &queue, &workloads);
        requeue_namespace_on(&service_accounts, &queue, &workloads);
        requeue_namespace_on(&services, &queue, &workloads);
        requeue_namespace_on(&pod_groups, &queue, &workloads);
        for (plural, c) in &held_caches {
            c.queue_changes(queue.clone(), plural);
        }
    }
    let p = Arc::new(Propagation {
        client: o.client.clone(),
        registry: o.registry.clone(),
        workloads: workloads.clone(),
        tenants: tenants.cache().clone(),
        held: held_caches,
        custom: crate::custom::CustomKinds::new(o.client.clone(), o.runtime_metrics.clone()),
        placements: placements.cache().clone(),
        namespaces: namespaces.cache().clone(),
        config_maps: config_maps.cache().clone(),
        secrets: secrets.cache().clone(),
        service_accounts: service_accounts.cache().clone(),
        services: services.cache().clone(),
        pod_groups: pod_groups.cache().clone(),
        recorder: Recorder::new(o.client.clone(), NAME, o.runtime_metrics.clone()),
        pending: Mutex::new(BTreeSet::new()),
        tenant_index,
        ledger: Mutex::new(quota::Ledger::default()),
        queue: queue.clone(),
        max_moving: o.max_moving.max(1),
        gang_commit_delay: o.gang_commit_delay,
        moving: Mutex::new(BTreeMap::new()),
        stalled: Mutex::new(BTreeMap::new()),
        move_timeout: o.move_timeout,
        rehome: Mutex::new(BTreeMap::new()),
        waiting_to_move: Mutex::new(moves::Waiting::default()),
        checked_map: Mutex::new(std::collections::HashMap::new()),
        last_map: std::sync::atomic::AtomicU64::new(o.registry.map_version()),
    });
    {
        let q = queue.clone();
        let weak = Arc::downgrade(&p);
        o.registry.on_event(move |e| {
            let Some(p) = weak.upgrade() else { return };
            // A new map may give tenants another home: every workload is looked at again
            // (maps change only when shards join, leave or are re-weighted).
            if matches!(
                e,
                RegistryEvent::Shard(_) | RegistryEvent::Joined(_) | RegistryEvent::Spec(_)
            ) {
                let v = p.registry.map_version();
                if p.last_map.swap(v, std::sync::atomic::Ordering::AcqRel) != v {
                    for key in p.workloads.all_keys() {
                        q.add(key, EventClass::Resync);
                    }
                    // A custom object follows its tenant's home.
                    for key in p.custom.all_keys() {
                        q.add(key, EventClass::Resync);
                    }
                }
            }
            // A shard that is usable now may be the home of workloads placed while it was
            // not: they are looked at again.
            if let RegistryEvent::Shard(name) | RegistryEvent::Joined(name) = e
                && p.registry.is_usable(name)
                && let Some(keys) = p.rehome.lock().remove(name)
            {
                let mut checked = p.checked_map.lock();
                for key in keys {
                    checked.remove(&key);
                    q.add(key, EventClass::Update);
                }
            }
            match e {
                RegistryEvent::Status(k) => {
                    if let Some(kind) = Kind::of_resource(&k.resource) {
                        q.add_throttled(
                            format!("{}:{}", kind.prefix(), k.object_key()),
                            EventClass::Update,
                        );
                    }
                }
                RegistryEvent::Shard(name) => {
                    for key in p.pending.lock().iter() {
                        q.add(key.clone(), EventClass::Update);
                    }
                    // A shard lost: what it holds is looked at, to fail over when due.
                    if !p.registry.is_ready(name) {
                        for k in p.registry.held_on(name) {
                            if let Some(kind) = Kind::of_resource(&k.resource) {
                                q.add(
                                    format!("{}:{}", kind.prefix(), k.object_key()),
                                    EventClass::Update,
                                );
                            }
                        }
                    }
                }
                // A cordon lifted or a taint changed: what waits for room may fit; a drain
                // (a NoExecute taint) moves what the shard holds.
                RegistryEvent::Spec(name) => {
                    for key in p.pending.lock().iter() {
                        q.add(key.clone(), EventClass::Update);
                    }
                    for k in p.registry.held_on(name) {
                        if let Some(kind) = Kind::of_resource(&k.resource) {
                            q.add(
                                format!("{}:{}", kind.prefix(), k.object_key()),
                                EventClass::Update,
                            );
                        }
                    }
                }
                RegistryEvent::Joined(_) => {
                    for key in p.pending.lock().iter() {
                        q.add(key.clone(), EventClass::Update);
                    }
                    // A shard that joins holds every Tenant, RBAC object and CRD.
                    for t in p.tenants.list() {
                        q.add(
                            format!("tenants:{}", key_of(&t.metadata)),
                            EventClass::Resync,
                        );
                    }
                    for (plural, c) in &p.held {
                        for key in c.held_keys() {
                            q.add(format!("{plural}:{key}"), EventClass::Resync);
                        }
                    }
                }
            }
        });
    }
    let mut tasks: Vec<_> = workload_informers
        .iter()
        .map(|(_, i)| tokio::spawn(i.clone().run()))
        .collect();
    tasks.extend([
        tokio::spawn(tenants.clone().run()),
        tokio::spawn(placements.clone().run()),
        tokio::spawn(namespaces.clone().run()),
        tokio::spawn(config_maps.clone().run()),
        tokio::spawn(secrets.clone().run()),
        tokio::spawn(service_accounts.clone().run()),
        tokio::spawn(services.clone().run()),
        tokio::spawn(pod_groups.clone().run()),
    ]);
    tasks.extend(p.held.iter().map(|(_, c)| c.start()));
    let _tasks = Tasks(tasks);
    for (_, i) in &workload_informers {
        i.synced().await;
    }
    tenants.synced().await;
    placements.synced().await;
    namespaces.synced().await;
    config_maps.synced().await;
    secrets.synced().await;
    service_accounts.synced().await;
    services.synced().await;
    pod_groups.synced().await;
    for (_, c) in &p.held {
        c.listed().await;
    }
    wait_for_known_shards(&o.client, &o.registry).await;
    // What every workload placed before holds is counted before anything new is admitted
    // against a tenant's quota.
    p.seed_ledger();
    // Every object is assigned once before agents are told they hold all they should: an
    // agent removes what it was not assigned since it connected.
    for t in p.tenants.list() {
        let _ = p
            .reconcile(&format!("tenants:{}", key_of(&t.metadata)))
            .await;
    }
    for key in p.workloads.all_keys() {
        let _ = p.reconcile(&key).await;
    }
    let held_keys: Vec<String> = p
        .held
        .iter()
        .flat_map(|(plural, c)| {
            c.held_keys()
                .into_iter()
                .map(move |k| format!("{plural}:{k}"))
        })
        .collect();
    for key in held_keys {
        let _ = p.reconcile(&key).await;
    }
    // The CRDs' reconciles started following their objects: those are assigned too.
    p.custom.listed().await;
    for key in p.custom.all_keys() {
        let _ = p.reconcile(&key).await;
    }
    o.registry.mark_synced();
    tracing::info!("federation propagation synced");
    controller::run(p, queue, o.workers, o.runtime_metrics).await;
}

/// An informer of `group/version/plural` on the controller's client, across namespaces.
fn informer<T: tessera_runtime::informer::Object>(
    o: &Options,
    group: &str,
    version: &str,
    plural: &str,
) -> Arc<Informer<T>> {
    let r = find_resource(group, version, plural).expect("served");
    Informer::<T>::new(
        o.client.clone(),
        r,
        Scope::default(),
        o.runtime_metrics.clone(),
    )
}

/// One held kind's objects at the federation, read as JSON.
#[async_trait]
trait HeldCache: Send + Sync {
    /// The object at `key`.
    fn object(&self, key: &str) -> Option<Value>;
    /// Every object's key.
    fn held_keys(&self) -> Vec<String>;
    /// Runs the informer.
    fn start(&self) -> tokio::task::JoinHandle<()>;
    /// Once the informer has listed.
    async fn listed(&self);
    /// Every change queues the object, as `plural:key`.
    fn queue_changes(&self, q: WorkQueue<String>, plural: &'static str);
}

#[async_trait]
impl<T: tessera_runtime::informer::Object + serde::Serialize> HeldCache for Arc<Informer<T>> {
    fn object(&self, key: &str) -> Option<Value> {
        self.cache()
            .get(key)
            .and_then(|o| serde_json::to_value(o.as_ref()).ok())
    }

    fn held_keys(&self) -> Vec<String> {
        self.cache()
            .list()
            .iter()
            .map(|o| key_of(o.metadata()))
            .collect()
    }

    fn start(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(Arc::clone(self).run())
    }

    async fn listed(&self) {
        Informer::synced(self).await;
    }

    fn queue_changes(&self, q: WorkQueue<String>, plural: &'static str) {
        Informer::on_change(self, move |c| {
            q.add(
                format!("{plural}:{}", key_of(c.object().metadata())),
                c.class(),
            )
        })
        .detach();
    }
}

fn held_informers(o: &Options) -> Vec<(&'static str, Arc<dyn HeldCache>)> {
    use k8s_openapi::api::admissionregistration::v1 as admission;
    use k8s_openapi::api::rbac::v1 as rbac;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as ext;
    vec![
        (
            "roles",
            Arc::new(informer::<rbac::Role>(o, RBAC, "v1", "roles")),
        ),
        (
            "rolebindings",
            Arc::new(informer::<rbac::RoleBinding>(o, RBAC, "v1", "rolebindings")),
        ),
        (
            "clusterroles",
            Arc::new(informer::<rbac::ClusterRole>(o, RBAC, "v1", "clusterroles")),
        ),
        (
            "clusterrolebindings",
            Arc::new(informer::<rbac::ClusterRoleBinding>(
                o,
                RBAC,
                "v1",
                "clusterrolebindings",
            )),
        ),
        (
            "customresourcedefinitions",
            Arc::new(informer::<ext::CustomResourceDefinition>(
                o,
                APIEXTENSIONS,
                "v1",
                "customresourcedefinitions",
            )),
        ),
        (
            "mutatingwebhookconfigurations",
            Arc::new(informer::<admission::MutatingWebhookConfiguration>(
                o,
                ADMISSIONREGISTRATION,
                "v1",
                "mutatingwebhookconfigurations",
            )),
        ),
        (
            "validatingwebhookconfigurations",
            Arc::new(informer::<admission::ValidatingWebhookConfiguration>(
                o,
                ADMISSIONREGISTRATION,
                "v1",
                "validatingwebhookconfigurations",
            )),
        ),
        (
            "validatingadmissionpolicies",
            Arc::new(informer::<admission::ValidatingAdmissionPolicy>(
                o,
                ADMISSIONREGISTRATION,
                "v1",
                "validatingadmissionpolicies",
            )),
        ),
        (
            "validatingadmissionpolicybindings",
            Arc::new(informer::<admission::ValidatingAdmissionPolicyBinding>(
                o,
                ADMISSIONREGISTRATION,
                "v1",
                "validatingadmissionpolicybindings",
            )),
        ),
    ]
}

/// Whether an RBAC object is one of Kubernetes' defaults, which every API server makes.
fn is_bootstrap_default(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/bootstrapping"))
        .is_some_and(|v| v == "rbac-defaults")
}

/// A held object as the shards should hold it: an RBAC object (an aggregated ClusterRole
/// without rules: each shard's aggregation controller fills them), a CRD's spec (each
/// shard's API server keeps its status), a webhook configuration's webhooks or an admission
/// policy's or binding's spec.
pub fn held_manifest(obj: &Value, plural: &str) -> Value {
    let (group, _, kind) = HELD_KINDS
        .iter()
        .find(|(_, p, _)| *p == plural)
        .copied()
        .unwrap_or((RBAC, "", ""));
    let mut obj = obj.clone();
    obj["apiVersion"] = json!(format!("{group}/v1"));
    obj["kind"] = json!(kind);
    let fields: &[&str] = if group == APIEXTENSIONS || plural.starts_with("validatingadmission") {
        &["spec"]
    } else if group == ADMISSIONREGISTRATION {
        &["webhooks"]
    } else if obj["aggregationRule"].is_object() {
        &["aggregationRule"]
    } else {
        &["rules", "roleRef", "subjects"]
    };
    let mut m = dependencies::carry(&obj, fields);
    if let Some(meta) = m["metadata"].as_object_mut() {
        meta.retain(|_, v| !v.is_null());
    }
    m
}

/// Every change seen by `inf` queues the workloads of the changed object's namespace.
fn requeue_namespace_on<T: tessera_runtime::informer::Object>(
    inf: &Informer<T>,
    queue: &WorkQueue<String>,
    workloads: &Workloads,
) {
    let (q, w) = (queue.clone(), workloads.clone());
    inf.on_change(move |c| {
        let ns = c
            .object()
            .metadata()
            .namespace
            .as_deref()
            .unwrap_or_default();
        for key in w.keys_in(ns) {
            q.add(key, EventClass::Update);
        }
    })
    .detach();
}

/// Waits (at most one lease) for the shards the federation knows — its Shard objects — to
/// connect again, so that the first pass decides on a fleet, not on an empty registry after
/// a restart of the federation.
async fn wait_for_known_shards(client: &Arc<dyn Client>, registry: &Registry) {
    let shards = find_resource("tessera.io", "v1alpha1", "shards").expect("served");
    let mut names = Vec::new();
    let req = tessera_client::request::ApiRequest::new(tessera_client::request::Verb::List, shards);
    if let Err(e) = client
        .list_each(req, &mut |s| {
            if let Some(n) = s["metadata"]["name"].as_str() {
                names.push(n.to_owned());
            }
        })
        .await
    {
        tracing::warn!(error = %e.message, "listing the known shards");
    }
    let deadline = tokio::time::Instant::now() + registry.config().lease;
    while !names.iter().all(|n| registry.is_ready(n)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let missing: Vec<&String> = names.iter().filter(|n| !registry.is_ready(n)).collect();
    if !missing.is_empty() {
        tracing::warn!(
            ?missing,
            "starting without these shards: their assignments stand"
        );
    }
}

/// Whether tenant `name`'s Tenant says its pods may use no borrowed node (`borrowFrom: []`).
fn borrow_none(tenants: &Cache<Tenant>, name: &str) -> bool {
    tenants
        .get(name)
        .and_then(|t| t.spec.as_ref()?.borrow_from.as_ref().map(Vec::is_empty))
        .unwrap_or(false)
}

/// The object as a shard should hold it: its identity, labels, annotations and spec — not
/// the federation's bookkeeping (uid, resourceVersion, finalizers, status, decisions).
pub fn manifest(obj: &Value, generation: i64, replicas: Option<u64>) -> Value {
    let meta = &obj["metadata"];
    let mut labels = meta["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(FEDERATED_LABEL.into(), json!("true"));
    let mut annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    annotations.remove(PLACEMENT_ANNOTATION);
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    annotations.insert(GENERATION_ANNOTATION.into(), json!(generation.to_string()));
    let mut m = json!({
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {
            "name": meta["name"],
            "labels": labels,
            "annotations": annotations,
        },
    });
    if let Some(ns) = meta["namespace"].as_str() {
        m["metadata"]["namespace"] = json!(ns);
    }
    if !obj["spec"].is_null() {
        m["spec"] = obj["spec"].clone();
    }
    if let Some(n) = replicas {
        m["spec"]["replicas"] = json!(n);
    }
    m
}

impl Propagation {
    /// What a workload of namespace `ns` with pod `template` takes along to its shards,
    /// after its namespace: the ConfigMaps, Secrets and ServiceAccount its pods name that
    /// exist here, and the Services that select its pods.
    fn dependencies_of(&self, ns: &str, template: &Value) -> Vec<Arc<[u8]>> {
        let mut out = vec![Arc::from(
            self.namespace_manifest(ns).to_string().into_bytes(),
        )];
        let Ok(template) = serde_json::from_value::<PodTemplateSpec>(template.clone()) else {
            return out;
        };
        let mut push = |obj: Value, kind: &str| {
            let mut obj = obj;
            obj["apiVersion"] = json!(if kind == "PodGroup" {
                "tessera.io/v1alpha1"
            } else {
                "v1"
            });
            obj["kind"] = json!(kind);
            let m = if kind == "Service" {
                dependencies::service_manifest(&obj)
            } else {
                dependencies::carry(&obj, dependencies::fields_of(kind))
            };
            out.push(Arc::from(m.to_string().into_bytes()));
        };
        if let Some(spec) = &template.spec {
            let refs = dependencies::referenced(spec);
            for n in &refs.config_maps {
                if let Some(o) = self.config_maps.get(&format!("{ns}/{n}")) {
                    push(
                        serde_json::to_value(o.as_ref()).unwrap_or_default(),
                        "ConfigMap",
                    );
                }
            }
            for n in &refs.secrets {
                if let Some(o) = self.secrets.get(&format!("{ns}/{n}")) {
                    push(
                        serde_json::to_value(o.as_ref()).unwrap_or_default(),
                        "Secret",
                    );
                }
            }
            if let Some(n) = &refs.service_account
                && let Some(o) = self.service_accounts.get(&format!("{ns}/{n}"))
            {
                push(
                    serde_json::to_value(o.as_ref()).unwrap_or_default(),
                    "ServiceAccount",
                );
            }
        }
        let labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        // A gang's PodGroup goes along whole; a federation-scope one is divided, and each
        // shard gets its own part instead (see [`crate::gang`]).
        if let Some(g) = labels
            .get(tessera_client::types::POD_GROUP_LABEL)
            .and_then(|g| self.pod_groups.get(&format!("{ns}/{g}")))
            && g.spec.as_ref().and_then(|s| s.scope.as_deref())
                != Some(tessera_client::types::GANG_SCOPE_FEDERATION)
        {
            push(
                serde_json::to_value(g.as_ref()).unwrap_or_default(),
                "PodGroup",
            );
        }
        for svc in self.services.in_namespace(ns) {
            if dependencies::selects(&svc, &labels) {
                push(
                    serde_json::to_value(svc.as_ref()).unwrap_or_default(),
                    "Service",
                );
            }
        }
        out
    }

    fn namespace_manifest(&self, ns: &str) -> Value {
        let labels = self
            .namespaces
            .get(ns)
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})
    }

    /// Removes the copies of a federated object being deleted, then its finalizer.
    async fn finish_delete(
        &self,
        kind: Kind,
        key: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Result<Action, ReconcileError> {
        let okey = kind.object_key(key);
        self.pending
            .lock()
            .remove(&format!("{}:{key}", kind.prefix()));
        let reports = self.registry.reports(&okey);
        let mut waiting = Vec::new();
        for (shard, r) in &reports {
            self.registry.unassign(shard, &okey);
            if r.is_some() && self.registry.is_ready(shard) {
                waiting.push(shard.clone());
            }
        }
        if !waiting.is_empty() {
            tracing::debug!(key, ?waiting, "waiting for shards to remove their copies");
            return Ok(Action::RequeueAfter(Duration::from_secs(5)));
        }
        let finalizers = meta.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(Action::Done);
        }
        let rest: Vec<String> = finalizers.into_iter().filter(|f| f != FINALIZER).collect();
        match self.set_finalizers(kind, key, meta, rest).await {
            Ok(()) => Ok(Action::Done),
            Err(e) if e.code == 404 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }

    /// Adds the finalizer; true if it had to (the write's event brings the key back).
    async fn ensure_finalizer(
        &self,
        kind: Kind,
        key: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Result<bool, ReconcileError> {
        let Some(finalizers) = with_finalizer(meta) else {
            return Ok(false);
        };
        self.set_finalizers(kind, key, meta, finalizers).await?;
        Ok(true)
    }

    /// Writes the object's finalizers, if it is still the version `meta` read.
    async fn set_finalizers(
        &self,
        kind: Kind,
        key: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        finalizers: Vec<String>,
    ) -> Result<(), tessera_client::status::ApiError> {
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version}});
        let (ns, name) = key
            .split_once('/')
            .map_or((None, key), |(n, m)| (Some(n), m));
        self.client
            .patch(kind.resource(), ns, name, None, PatchType::Merge, &patch)
            .await
            .map(|_| ())
    }

    async fn tenant(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(t) = self.tenants.get(key) else {
            return Ok(Action::Done);
        };
        if t.metadata.deletion_timestamp.is_some() {
            return self.finish_delete(Kind::Tenant, key, &t.metadata).await;
        }
        if self
            .ensure_finalizer(Kind::Tenant, key, &t.metadata)
            .await?
        {
            return Ok(Action::Done);
        }
        let obj =
            serde_json::to_value(t.as_ref()).map_err(|e| ReconcileError::new(e.to_string()))?;
        let mut m = manifest(&obj, t.metadata.generation.unwrap_or(1), None);
        m["apiVersion"] = json!("tessera.io/v1alpha1");
        m["kind"] = json!("Tenant");
        let held = Held {
            object: Arc::from(m.to_string().into_bytes()),
            generation: t.metadata.generation.unwrap_or(1),
            replicas: 0,
            request: Request::default(),
            dependencies: Vec::new(),
            failover: None,
            leaving: false,
        };
        let okey = Kind::Tenant.object_key(key);
        for shard in self.registry.shard_names() {
            self.registry.assign(&shard, &okey, held.clone());
        }
        // A quota raised (or any change) lets its waiting workloads try again.
        self.wake_waiting(key);
        self.write_fleet_usage(&t).await;
        Ok(Action::Done)
    }

    /// Holds RBAC object or CRD `key` (of `plural`) in every shard, or removes its copies
    /// when it is deleted. Kubernetes' defaults (`kubernetes.io/bootstrapping: rbac-defaults`)
    /// stay where they are: every shard has its own. An aggregated ClusterRole goes without
    /// its rules, which each shard's aggregation controller fills from the roles there.
    async fn held_object(&self, plural: &'static str, key: &str) -> Result<Action, ReconcileError> {
        let Some(cache) = self.held.iter().find(|(p, _)| *p == plural).map(|(_, c)| c) else {
            return Ok(Action::Done);
        };
        let obj = cache.object(key);
        if plural == "customresourcedefinitions" {
            // Objects of a kind no longer followed (its CRD going or changed): their copies
            // are let go — a CRD's deletion deletes its objects in the shards as here.
            for (res, key) in self.custom.crd_changed(key, obj.as_ref(), &self.queue) {
                let okey = Kind::Custom(res).object_key(&key);
                for shard in self.registry.shard_names() {
                    self.registry.unassign(&shard, &okey);
                }
            }
        }
        let Some(obj) = obj else {
            return Ok(Action::Done);
        };
        let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_json::from_value(obj["metadata"].clone())
                .map_err(|e| ReconcileError::new(e.to_string()))?;
        let kind = Kind::Held(plural);
        if is_bootstrap_default(&meta) {
            return Ok(Action::Done);
        }
        if meta.deletion_timestamp.is_some() {
            return self.finish_delete(kind, key, &meta).await;
        }
        if self.ensure_finalizer(kind, key, &meta).await? {
            return Ok(Action::Done);
        }
        let mut m = held_manifest(&obj, plural);
        let generation = meta.generation.unwrap_or(1);
        m["metadata"]["annotations"][GENERATION_ANNOTATION] = json!(generation.to_string());
        let held = self.held_whole(&m, generation, meta.namespace.as_deref());
        let okey = kind.object_key(key);
        for shard in self.registry.shard_names() {
            self.registry.assign(&shard, &okey, held.clone());
        }
        Ok(Action::Done)
    }

    /// What a shard holds of an object kept whole (no replicas, no room): `manifest`, after
    /// its namespace (`ns`) when it has one.
    fn held_whole(&self, manifest: &Value, generation: i64, ns: Option<&str>) -> Held {
        let dependencies = ns
            .map(|ns| {
                vec![Arc::from(
                    self.namespace_manifest(ns).to_string().into_bytes(),
                )]
            })
            .unwrap_or_default();
        Held {
            object: Arc::from(manifest.to_string().into_bytes()),
            generation,
            replicas: 0,
            request: Request::default(),
            dependencies,
            failover: None,
            leaving: false,
        }
    }

    /// Holds custom object `key` in its tenant's home shard (a cluster-scoped one in every
    /// shard), or removes its copies when it is deleted. Status is the shard's: an operator
    /// there writes it, and it is not brought back to the federation.
    async fn custom_object(
        &self,
        res: &'static Resource,
        prefix: &str,
        key: &str,
    ) -> Result<Action, ReconcileError> {
        let Some((_, obj)) = self.custom.get(prefix, key) else {
            return Ok(Action::Done);
        };
        let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_json::from_value(obj["metadata"].clone())
                .map_err(|e| ReconcileError::new(e.to_string()))?;
        let kind = Kind::Custom(res);
        if meta.deletion_timestamp.is_some() {
            return self.finish_delete(kind, key, &meta).await;
        }
        let ns = meta.namespace.clone().unwrap_or_default();
        if SYSTEM_NAMESPACES.contains(&ns.as_str()) {
            return Ok(Action::Done);
        }
        if self.ensure_finalizer(kind, key, &meta).await? {
            return Ok(Action::Done);
        }
        let mut m = crate::custom::manifest(&obj);
        let generation = meta.generation.unwrap_or(1);
        m["metadata"]["annotations"][GENERATION_ANNOTATION] = json!(generation.to_string());
        let shards = self.registry.shard_names();
        let targets: Vec<String> = if ns.is_empty() {
            shards.clone()
        } else {
            let tenant = self.tenant_index.lock().tenant_of(&ns).to_owned();
            let (version, weights) = self.registry.map();
            tessera_placement::ShardMap::new(version, &weights)
                .ok()
                .and_then(|map| map.home(&tenant).map(str::to_owned))
                .into_iter()
                .collect()
        };
        let held = self.held_whole(&m, generation, Some(ns.as_str()).filter(|n| !n.is_empty()));
        let okey = kind.object_key(key);
        for shard in shards {
            if targets.contains(&shard) {
                self.registry.assign(&shard, &okey, held.clone());
            } else {
                self.registry.unassign(&shard, &okey);
            }
        }
        if targets.is_empty() {
            // No shard yet: a map change (a shard joining) queues it again.
            return Ok(Action::RequeueAfter(Duration::from_secs(5)));
        }
        Ok(Action::Done)
    }

    /// Charges every workload what its recorded decision placed (after a restart, before
    /// the first pass admits anything new).
    fn seed_ledger(&self) {
        let mut ledger = self.ledger.lock();
        for (kind, cache) in &self.workloads.0 {
            for w in cache.list() {
                let Some(recorded) = w
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(PLACEMENT_ANNOTATION))
                    .and_then(|s| serde_json::from_str::<Recorded>(s).ok())
                else {
                    continue;
                };
                let ns = w.metadata.namespace.as_deref().unwrap_or_default();
                let tenant = self.tenant_index.lock().tenant_of(ns).to_owned();
                let finished = *kind == WorkloadKind::Job && kind.needs_no_room(&w.status);
                let placed = if finished {
                    0
                } else {
                    recorded.shares.values().sum()
                };
                let key = format!("{}:{}", kind.plural(), key_of(&w.metadata));
                let per_pod = quota::pod_charge(kind.template(&w.spec));
                ledger.set(&tenant, &key, per_pod, placed);
            }
        }
    }

    /// Queues the workloads `tenant`'s quota held back.
    fn wake_waiting(&self, tenant: &str) {
        for k in self.ledger.lock().waiting(tenant) {
            self.queue.add(k, EventClass::Update);
        }
    }

    /// The tenant's fleet-wide quota for pods, if its Tenant has one.
    fn pod_quota_of(&self, tenant: &str) -> Option<quota::Usage> {
        let t = self.tenants.get(tenant)?;
        let q: quota::Usage = t
            .spec
            .as_ref()?
            .quota
            .as_ref()?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.0.parse().ok()?)))
            .collect();
        let q = quota::pod_quota(&q);
        (!q.is_empty()).then_some(q)
    }

    /// Writes what the federation placed for `t` over every shard into the quota names of
    /// its `status.used` that pods are charged against (the rest the API server counts).
    async fn write_fleet_usage(&self, t: &Tenant) {
        let name = t.metadata.name.as_deref().unwrap_or_default();
        let Some(q) = self.pod_quota_of(name) else {
            return;
        };
        let used = self.ledger.lock().used(name);
        let have = t.status.as_ref().and_then(|s| s.used.as_ref());
        let mut want = serde_json::Map::new();
        let mut same = true;
        for k in q.keys() {
            let v = used.get(k).copied().unwrap_or(Quantity::ZERO);
            let h = have
                .and_then(|h| h.get(k))
                .and_then(|h| h.0.parse::<Quantity>().ok());
            same &= h == Some(v);
            want.insert(k.clone(), json!(v.to_string()));
        }
        if same {
            return;
        }
        let patch = json!({"status": {"used": want}});
        if let Err(e) = self
            .client
            .patch(
                Kind::Tenant.resource(),
                None,
                name,
                Some("status"),
                PatchType::Merge,
                &patch,
            )
            .await
        {
            tracing::warn!(tenant = name, error = %e.message, "writing the tenant's fleet-wide usage");
        }
    }

    /// Records what workload `queue_key` of `tenant` holds now.
    /// Nothing happens when it holds that already (a decision kept, most reconciles).
    fn charge(&self, tenant: &str, queue_key: &str, per_pod: quota::Usage, placed: u64) {
        let fell = {
            let mut ledger = self.ledger.lock();
            if ledger.holds(tenant, queue_key, &per_pod, placed) {
                return;
            }
            ledger.set(tenant, queue_key, per_pod, placed)
        };
        self.after_charge(tenant, fell);
    }

    /// After a tenant's usage changed: wakes what its quota held back if the usage fell,
    /// and has its fleet-wide usage written.
    fn after_charge(&self, tenant: &str, fell: bool) {
        if fell {
            self.wake_waiting(tenant);
        }
        if self.pod_quota_of(tenant).is_some() {
            self.queue
                .add(format!("tenants:{tenant}"), EventClass::Update);
        }
    }

    /// How many of `replicas` the tenant's fleet-wide quota lets `queue_key` place under
    /// `pol` (all of them without a quota), reserved in the ledger until settled, and why
    /// the rest are held back. A Duplicated workload is charged once per copy: how many
    /// copies it makes is previewed first, and each copy gets what fits of the quota shared
    /// evenly between them.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        tenant: &str,
        queue_key: &str,
        per_pod: &quota::Usage,
        replicas: u64,
        pol: &tessera_placement::Policy,
        request: &Request,
        credit: &BTreeMap<String, u64>,
    ) -> (u64, Option<quota::Held>) {
        let Some(limit) = self.pod_quota_of(tenant) else {
            return (replicas, None);
        };
        if !matches!(pol.mode, tessera_placement::Mode::Duplicated) {
            return self
                .ledger
                .lock()
                .admit(tenant, queue_key, per_pod, replicas, &limit);
        }
        let copies = self
            .registry
            .preview(
                &Workload {
                    tenant,
                    replicas,
                    request,
                    current: credit,
                },
                pol,
            )
            .shares
            .len()
            .max(1) as u64;
        let (all, held) =
            self.ledger
                .lock()
                .admit(tenant, queue_key, per_pod, replicas * copies, &limit);
        let each = all / copies;
        (
            each,
            held.map(|h| quota::Held {
                replicas: replicas - each,
                ..h
            }),
        )
    }

    /// Which of `shares` sit on lost shards, and whether each may fail over yet.
    fn lost_shares(
        &self,
        shares: &BTreeMap<String, u64>,
        failover: &Failover,
        template: &Value,
    ) -> LostShares {
        let mut lost = LostShares::default();
        // The pods' termination grace period (Kubernetes' default 30 s).
        let grace = Duration::from_secs(
            template["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30),
        );
        let margin = self.registry.config().failover_margin;
        let mut check = |d: Duration| {
            lost.next_check = Some(lost.next_check.map_or(d, |c: Duration| c.min(d)));
        };
        for (shard, n) in shares {
            let Standing::Lost {
                since_lease_end,
                until_lease_end,
            } = self.registry.standing(shard)
            else {
                continue;
            };
            match failover.due(since_lease_end, grace, margin) {
                Ok(()) => {
                    lost.due.push(shard.clone());
                    lost.waited
                        .insert(shard.clone(), since_lease_end.unwrap_or_default());
                }
                Err(left) => {
                    lost.held.insert(shard.clone(), *n);
                    // Looked at again when it is due (a little after, so that it is).
                    let left = left.unwrap_or(until_lease_end + failover.wait(grace, margin));
                    check(left + Duration::from_millis(50));
                }
            }
        }
        lost
    }

    async fn workload(&self, kind: WorkloadKind, key: &str) -> Result<Action, ReconcileError> {
        let queue_key = format!("{}:{key}", kind.plural());
        let Some(w) = self.workloads.cache(kind).get(key) else {
            self.pending.lock().remove(&queue_key);
            self.registry.set_waiting(&queue_key, None);
            self.checked_map.lock().remove(&queue_key);
            self.waiting_to_move.lock().remove(&queue_key);
            self.stalled.lock().remove(&queue_key);
            if self.moving.lock().remove(&queue_key).is_some() {
                self.move_slot_freed();
            }
            let freed = self.ledger.lock().remove(&queue_key);
            if let Some(tenant) = freed {
                self.after_charge(&tenant, true);
            }
            return Ok(Action::Done);
        };
        let ns = w.metadata.namespace.clone().unwrap_or_default();
        if SYSTEM_NAMESPACES.contains(&ns.as_str()) {
            return Ok(Action::Done);
        }
        let k = Kind::Workload(kind);
        if w.metadata.deletion_timestamp.is_some() {
            return self.finish_delete(k, key, &w.metadata).await;
        }
        // The finalizer is written with the first decision's record, before anything is
        // assigned: no shard holds a copy the federation could not clean up.
        let finalizers = with_finalizer(&w.metadata);
        let generation = w.metadata.generation.unwrap_or(1);
        let replicas = kind.replicas(&w.spec);
        let template = kind.template(&w.spec);
        let recorded: Recorded = w
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PLACEMENT_ANNOTATION))
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let placements = self.placements.in_namespace(&ns);
        let chosen = policy::choose(&placements, kind.api_version(), kind.kind(), &w.metadata);
        let policy_id = chosen.map_or(String::new(), |p| {
            format!(
                "{}@{}",
                p.metadata.name.as_deref().unwrap_or_default(),
                p.metadata.resource_version.as_deref().unwrap_or_default()
            )
        });
        let mut pol = policy::for_kind(policy::policy_of(chosen), kind, chosen);
        // A Job whose pods form a federation-scope gang is divided over shards when no one
        // shard holds it, and started in all of them or none (see [`crate::gang`]).
        let gang_spec = if kind == WorkloadKind::Job {
            let group = gang::group_named(template, &ns).and_then(|k| self.pod_groups.get(&k));
            match gang::of_job(&w.spec, group.as_deref()) {
                Ok(g) => g,
                Err(why) => {
                    pol = Err(why);
                    None
                }
            }
        } else {
            None
        };
        if gang_spec.is_some()
            && let Ok(p) = &mut pol
        {
            p.mode = tessera_placement::Mode::Home;
        }
        let pod_spec: Option<PodSpec> = serde_json::from_value(template["spec"].clone()).ok();
        let request = Request {
            amounts: pod_spec_requests(pod_spec.as_ref()).amounts(),
            on: tessera_scheduler::plugins::affinity::required_node_labels(pod_spec.as_ref()),
        };
        let tenant = self.tenant_index.lock().tenant_of(&ns).to_owned();
        let same_request = recorded.request == request.describe();
        let okey = k.object_key(key);
        // What the shards hold of it now is counted by their summaries (or reserved): a new
        // decision starts from that. The registry knows it as of the last assignment; the
        // recorded annotation is read only after a restart, before anything is assigned (the
        // cache may not show this controller's last record yet).
        let held_now = self.registry.credit(&okey, &request);
        let credit = match &held_now {
            Some(held) => held.clone(),
            None if same_request => recorded.shares.clone(),
            None => BTreeMap::new(),
        };
        // Failover: a share on a lost shard stays until this workload's failover mode lets
        // it move (Fast: at the lease's end plus its delay; AtMostOnce: also after its pods'
        // grace period and the margin, by when the shard has stopped it itself).
        let failover = match &pol {
            Ok(p) => policy::failover_of(p, kind),
            Err(_) => policy::failover_of(&policy::policy_of(chosen), kind),
        };
        let lost = self.lost_shares(&recorded.shares, &failover, template);
        // A decision stands while the workload, its policy and its request stand, and no
        // share is due to fail over.
        let mut still_good = recorded.generation == generation
            && recorded.policy == policy_id
            && recorded.unplaced == 0
            && recorded.why.is_empty()
            && same_request
            && lost.due.is_empty();
        let obj_ref = ObjectRef::new(kind.api_version(), kind.kind(), &w.metadata);
        let policy_ok = pol.is_ok();
        // What one pod is charged against the tenant's fleet-wide quota; a finished Job's
        // pods hold nothing.
        let per_pod = quota::pod_charge(template);
        let finished = kind == WorkloadKind::Job && kind.needs_no_room(&w.status);
        let holds = |shares: &BTreeMap<String, u64>| {
            if finished {
                0
            } else {
                shares.values().sum::<u64>()
            }
        };
        // A gang's two phases: what its parts report moves it on (commit, bound), or aborts
        // it; an aborted gang holds nothing until its back-off is over.
        let now_ms = gang::now_millis();
        let mut gang_record = recorded.gang.clone().filter(|_| gang_spec.is_some());
        let mut gang_check = None;
        if let (Some(g), Some(r)) = (&gang_spec, &recorded.gang)
            && !finished
            && recorded.generation == generation
        {
            gang_check = self.gang_step(
                g,
                r,
                pol.as_ref().ok(),
                &recorded.shares,
                &okey,
                &obj_ref,
                now_ms,
                lost.next_check,
                &mut gang_record,
            );
            if gang_record.is_none() {
                // The back-off is over: placed afresh, as a new attempt.
                still_good = false;
            }
        } else if gang_spec.is_some() && recorded.gang.is_none() {
            // Placed before its PodGroup said it is a federation-scope gang.
            still_good = false;
        }
        let gang_parked = gang_record
            .as_ref()
            .filter(|r| r.phase == gang::Phase::Backoff)
            .map(|r| {
                format!(
                    "attempt {} of the gang was aborted ({}); it is placed again after its back-off",
                    r.attempt, r.why
                )
            });
        // Rebalancing: a decision that stands is looked at again under a newer map (a shard
        // joined: the tenant may have a new home) and when a shard it uses evicts it (a
        // drain). It moves only if it can move whole, and only while fewer than
        // `max_moving` workloads move. A gang is not moved here: a drain aborts it whole
        // (`gang_step`) and it is placed again.
        let map_version = self.registry.map_version();
        let mut move_reason = "decision";
        if still_good
            && gang_spec.is_none()
            && recorded.leaving.is_empty()
            && !finished
            && let Ok(p) = &pol
        {
            let evicted = recorded
                .shares
                .keys()
                .find_map(|s| self.registry.evicts(s, p));
            let map_moved = self.checked_map.lock().get(&queue_key) != Some(&map_version);
            let wanted = if evicted.is_some()
                || (map_moved && failover.mode == tessera_placement::FailoverMode::Fast)
            {
                let preview = self.registry.preview(
                    &Workload {
                        tenant: &tenant,
                        replicas,
                        request: &request,
                        current: &credit,
                    },
                    p,
                );
                // A shard passed over for now (not ready, no summary yet: one that just
                // joined) is looked at again for it once usable.
                for (shard, skip) in &preview.skipped {
                    if matches!(
                        skip,
                        tessera_placement::Skip::NotReady | tessera_placement::Skip::NoSummary
                    ) {
                        self.rehome
                            .lock()
                            .entry(shard.clone())
                            .or_default()
                            .insert(queue_key.clone());
                    }
                }
                preview.unplaced == 0 && preview.shares != recorded.shares
            } else {
                false
            };
            // A slot is taken under the same lock it is counted under: moves decided at
            // once by several workers never exceed `max_moving`.
            let slot = wanted && {
                let mut moving = self.moving.lock();
                if moving.len() < self.max_moving || moving.contains_key(&queue_key) {
                    moving
                        .entry(queue_key.clone())
                        .or_insert((Instant::now(), false));
                    true
                } else {
                    false
                }
            };
            if !wanted {
                self.checked_map
                    .lock()
                    .insert(queue_key.clone(), map_version);
                // Woken for a slot it turned out not to need: the next in line gets it.
                self.wake_movers();
                if evicted.is_some() {
                    // Nowhere to go yet: it stays, and is looked at when a shard changes.
                    self.pending.lock().insert(queue_key.clone());
                }
            } else if !slot {
                if self.waiting_to_move.lock().push(&queue_key)
                    && let Some(m) = self.registry.metrics()
                {
                    m.moves_deferred.inc();
                }
            } else {
                still_good = false;
                move_reason = if evicted.is_some() {
                    "drain"
                } else {
                    "rebalance"
                };
            }
        }
        let mut quota_exceeded = false;
        let (decision, why) = match pol {
            _ if gang_parked.is_some() => {
                self.charge(&tenant, &queue_key, per_pod, 0);
                let parked = Decision {
                    unplaced: replicas,
                    ..Default::default()
                };
                (parked, gang_parked.clone().unwrap_or_default())
            }
            _ if still_good => {
                self.charge(&tenant, &queue_key, per_pod, holds(&recorded.shares));
                let kept = Decision {
                    shares: recorded.shares.clone(),
                    ..Default::default()
                };
                (kept, String::new())
            }
            // A policy this kind cannot follow keeps what runs (a mistaken Placement must not
            // delete a running Job) and says what to change.
            Err(why) => {
                let unplaced = if recorded.shares.is_empty() {
                    replicas
                } else {
                    0
                };
                self.charge(&tenant, &queue_key, per_pod, holds(&recorded.shares));
                let kept = Decision {
                    shares: recorded.shares.clone(),
                    unplaced,
                    ..Default::default()
                };
                if recorded.why != why {
                    self.recorder
                        .event(&obj_ref, EventType::Warning, "FailedPlacement", &why);
                }
                (kept, why)
            }
            Ok(pol) => {
                let started = Instant::now();
                let (allowed, held) = self.admit(
                    &tenant, &queue_key, &per_pod, replicas, &pol, &request, &credit,
                );
                // Shares on lost shards not yet due stay where they are; the rest is placed
                // (a duplicated workload places its full count on every shard anyway).
                let duplicated = pol.mode == tessera_placement::Mode::Duplicated;
                let kept: u64 = lost.held.values().sum();
                let free_credit: BTreeMap<String, u64> = credit
                    .iter()
                    .filter(|(s, _)| !lost.held.contains_key(*s))
                    .map(|(s, n)| (s.clone(), *n))
                    .collect();
                let wl = Workload {
                    tenant: &tenant,
                    replicas: if duplicated {
                        allowed
                    } else {
                        allowed.saturating_sub(kept)
                    },
                    request: &request,
                    current: &free_credit,
                };
                let (mut dec, total) = match &gang_spec {
                    None => self.registry.place(&wl, &pol),
                    // A gang the quota cuts short is not placed at all.
                    Some(_) if allowed < replicas => (
                        Decision {
                            unplaced: allowed,
                            ..Default::default()
                        },
                        0,
                    ),
                    Some(_) => self.registry.place_whole(&wl, &pol),
                };
                gang_record = match &gang_spec {
                    Some(_) if !dec.shares.is_empty() => Some(gang::Record::start(
                        recorded.gang.as_ref(),
                        now_ms,
                        dec.shares.len(),
                    )),
                    Some(_) => recorded.gang.clone(),
                    None => None,
                };
                self.checked_map
                    .lock()
                    .insert(queue_key.clone(), map_version);
                for (shard, n) in &lost.held {
                    dec.shares.insert(shard.clone(), *n);
                }
                let fell = self.ledger.lock().settle(&queue_key, holds(&dec.shares));
                self.after_charge(&tenant, fell);
                let mode = policy::mode_name(&pol.mode);
                if let Some(m) = self.registry.metrics() {
                    m.decision
                        .with_label_values(&[mode])
                        .observe(started.elapsed().as_secs_f64());
                    let outcome = if dec.unplaced == 0 {
                        "placed"
                    } else if dec.shares.is_empty() {
                        "pending"
                    } else {
                        "partial"
                    };
                    m.placements.with_label_values(&[mode, outcome]).inc();
                    m.spilled_replicas.inc_by(dec.spilled);
                }
                tracing::info!(
                    tenant = %tenant, kind = kind.kind(), key, mode,
                    shares = ?dec.shares, unplaced = dec.unplaced, spilled = dec.spilled,
                    "placed"
                );
                let mut why = if dec.unplaced > 0 {
                    dec.why_pending(total, &request)
                } else {
                    String::new()
                };
                quota_exceeded = held.is_some();
                if let Some(h) = held {
                    if let Some(m) = self.registry.metrics() {
                        m.quota_held_replicas.inc_by(h.replicas);
                    }
                    dec.unplaced += replicas.saturating_sub(allowed);
                    why = if why.is_empty() {
                        h.why
                    } else {
                        format!("{}; {why}", h.why)
                    };
                }
                if dec.unplaced > 0 {
                    self.recorder
                        .event(&obj_ref, EventType::Warning, "FailedPlacement", &why);
                }
                (dec, why)
            }
        };
        {
            // Only room can help a workload that waits for room; a policy it cannot follow
            // waits for the policy to change.
            let mut pending = self.pending.lock();
            if decision.unplaced > 0 && policy_ok {
                pending.insert(queue_key.clone());
            } else {
                pending.remove(&queue_key);
            }
        }
        // Replicas held back for room are demand the shard they would go to first may
        // borrow nodes for (elastic shards) — if the tenant may use borrowed nodes at all,
        // and not when its quota holds them back (room would not help).
        let first_full = decision
            .skipped
            .iter()
            .find(|(_, why)| matches!(why, tessera_placement::Skip::Full { .. }))
            .map(|(shard, _)| shard.clone());
        let waiting = match first_full {
            Some(shard)
                if decision.unplaced > 0
                    && policy_ok
                    && !quota_exceeded
                    && !borrow_none(&self.tenants, &tenant) =>
            {
                let amount = |name: &str| {
                    request
                        .amounts
                        .iter()
                        .find(|(r, _)| r == name)
                        .map_or(0, |(_, v)| *v)
                };
                Some(tessera_registry::lending::Waiting {
                    shard,
                    per_replica: [amount("cpu"), amount("memory"), amount("pods").max(1)],
                    replicas: decision.unplaced,
                    process: tessera_placement::summary::on_process_nodes(&request.on).is_some(),
                })
            }
            _ => None,
        };
        self.registry.set_waiting(&queue_key, waiting);
        // Shares due to fail over leave their lost shard before anything is assigned
        // elsewhere (break before make: the shard, cut off, has stopped an AtMostOnce one).
        // If the shard came back meanwhile nothing moves: the workload is decided again.
        for shard in &lost.due {
            if decision.shares.contains_key(shard) {
                continue;
            }
            if !self.registry.release_lost(shard, &okey) {
                return Ok(Action::RequeueAfter(Duration::ZERO));
            }
            let moved = recorded.shares.get(shard).copied().unwrap_or(0);
            let waited = lost.waited.get(shard).copied().unwrap_or_default();
            if let Some(m) = self.registry.metrics() {
                m.failovers
                    .with_label_values(&[failover.mode.as_str()])
                    .inc();
                m.failover_wait
                    .with_label_values(&[failover.mode.as_str()])
                    .observe(waited.as_secs_f64());
            }
            tracing::warn!(
                kind = kind.kind(), key, shard = %shard, replicas = moved,
                mode = failover.mode.as_str(), waited_s = waited.as_secs_f64(),
                "failing over off a lost shard"
            );
            self.recorder.event(
                &obj_ref,
                EventType::Warning,
                "FailedOver",
                &format!(
                    "moved {moved} replica(s) off shard {shard}: its lease ended {:.0}s ago ({} failover{})",
                    waited.as_secs_f64(),
                    failover.mode.as_str(),
                    match failover.mode {
                        tessera_placement::FailoverMode::AtMostOnce => ": waited for the shard to stop it, its pods' grace period and the margin",
                        tessera_placement::FailoverMode::Fast => "",
                    }
                ),
            );
        }
        // A move between live shards: what each shard is handed while shares leave.
        let (plan, leaving_check) = self.plan_move(
            kind,
            &okey,
            generation,
            &recorded,
            &decision.shares,
            held_now.as_ref(),
            &credit,
            &failover,
            template,
        )?;
        // Record the decision (and take the finalizer, if this is the first) before the
        // shards are told: after a restart the record is what is assigned again.
        let now_recorded = Recorded {
            generation,
            policy: policy_id,
            shares: decision.shares.clone(),
            unplaced: decision.unplaced,
            why: why.clone(),
            request: request.describe(),
            leaving: plan.leaving.clone(),
            gang: gang_record.clone(),
        };
        let (ns_s, name) = key.split_once('/').unwrap_or(("", key));
        if now_recorded != recorded || finalizers.is_some() {
            let text = serde_json::to_string(&now_recorded)
                .map_err(|e| ReconcileError::new(e.to_string()))?;
            let mut patch = json!({"metadata": {"annotations": {PLACEMENT_ANNOTATION: text}}});
            if let Some(finalizers) = finalizers {
                // Only onto the version read: a finalizer list is replaced whole.
                patch["metadata"]["finalizers"] = json!(finalizers);
                patch["metadata"]["resourceVersion"] = json!(w.metadata.resource_version);
            }
            self.client
                .patch(
                    kind.resource(),
                    Some(ns_s),
                    name,
                    None,
                    PatchType::Merge,
                    &patch,
                )
                .await?;
        }
        // Tell the shards.
        let mut obj =
            serde_json::to_value(w.as_ref()).map_err(|e| ReconcileError::new(e.to_string()))?;
        obj["apiVersion"] = json!(kind.api_version());
        obj["kind"] = json!(kind.kind());
        let deps = self.dependencies_of(&ns, template);
        // Its pods may use nodes other shards lend theirs, as its Tenant allows.
        let borrow = policy::borrow_tolerations(self.tenants.get(&tenant).as_deref());
        let mut sent = false;
        for (shard, copy) in &plan.assign {
            let (n, stop) = match copy {
                moves::Copy::Run(n) => (n, false),
                moves::Copy::Stop(n) => (n, true),
            };
            let mut m = manifest(&obj, generation, kind.has_replicas().then_some(*n));
            policy::add_tolerations(kind, &mut m["spec"], &borrow);
            let mut deps = deps.clone();
            if let (Some(g), Some(r)) = (&gang_spec, &gang_record) {
                // This shard's part of the gang: its share of the pods, and a PodGroup of
                // that many in the gang's phase.
                m["spec"]["parallelism"] = json!(n);
                m["spec"]["completions"] = json!(n);
                deps.push(Arc::from(
                    gang::part_manifest(g, &ns, name, *n, r)
                        .to_string()
                        .into_bytes(),
                ));
            }
            // How it fails over, for the shard's fence; and a suspend the federation owns
            // (false unless the user suspended it), so that applying this again resumes a
            // copy the fence suspended.
            m["metadata"]["annotations"][FAILOVER_ANNOTATION] = json!(failover.mode.as_str());
            if matches!(kind, WorkloadKind::Job | WorkloadKind::CronJob) {
                if stop {
                    // Stopped before it starts elsewhere (an AtMostOnce move).
                    m["spec"]["suspend"] = json!(true);
                } else if m["spec"]["suspend"].is_null() {
                    m["spec"]["suspend"] = json!(false);
                }
            }
            sent |= self.registry.assign(
                shard,
                &okey,
                Held {
                    object: Arc::from(m.to_string().into_bytes()),
                    generation,
                    replicas: *n as i64,
                    request: request.clone(),
                    dependencies: deps,
                    failover: Some(failover.mode),
                    leaving: plan.leaving.contains_key(shard),
                },
            );
        }
        let reports = self.registry.reports(&okey);
        for shard in reports.keys() {
            if !plan.assign.contains_key(shard) {
                self.registry.unassign(shard, &okey);
            }
        }
        self.track_move(
            &queue_key,
            &obj_ref,
            &plan,
            &decision.shares,
            move_reason,
            failover.mode,
        );
        let next_check = [
            lost.next_check,
            leaving_check,
            // A move is looked at again even if no report comes.
            (!plan.leaving.is_empty()).then_some(MOVE_CHECK),
            gang_check,
        ]
        .into_iter()
        .flatten()
        .min();
        // Aggregate the shards' statuses.
        let placed = Placed {
            generation,
            shares: decision
                .shares
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            unplaced: decision.unplaced,
            why,
            policy_refused: !policy_ok,
            quota_exceeded,
        };
        let reports: Vec<(String, Option<tessera_registry::Reported>)> =
            self.registry.reports(&okey).into_iter().collect();
        if sent && placed.unplaced == 0 && placed.why.is_empty() && policy_ok && !quota_exceeded {
            // The shards were just told: their reports, moments away, bring the status (one
            // write for the decision and the first progress). A shard that does not report
            // has it written without, a moment later.
            return Ok(Action::RequeueAfter(
                next_check.map_or(REPORT_WAIT, |c| c.min(REPORT_WAIT)),
            ));
        }
        let previous = &w.status;
        let status = status::aggregate(kind, &placed, &reports, previous, &rfc3339(now_secs()));
        if !same_status(&status, previous) {
            let patch = json!({"status": status});
            match self
                .client
                .patch(
                    kind.resource(),
                    Some(ns_s),
                    name,
                    Some("status"),
                    PatchType::Merge,
                    &patch,
                )
                .await
            {
                Ok(_) | Err(tessera_client::status::ApiError { code: 404, .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(next_check.map_or(Action::Done, Action::RequeueAfter))
    }

    /// Moves gang `record` on from what its parts on `shares` report: sets `record` to its
    /// next phase (`None`: place it afresh), with Events, and returns when to look again.
    /// `fence` is when the last lost shard's part is surely stopped by its own fence.
    #[allow(clippy::too_many_arguments)]
    fn gang_step(
        &self,
        spec: &gang::Gang,
        record: &gang::Record,
        policy: Option<&tessera_placement::Policy>,
        shares: &BTreeMap<String, u64>,
        okey: &ObjectKey,
        obj_ref: &ObjectRef,
        now_ms: u64,
        fence: Option<Duration>,
        out: &mut Option<gang::Record>,
    ) -> Option<Duration> {
        let reports = self.registry.reports(okey);
        // Lost once its lease has ended: a shard that only disconnected still holds its lease,
        // runs its part, and may be back before it ends.
        let lost = |s: &str| {
            matches!(
                self.registry.standing(s),
                Standing::Lost {
                    since_lease_end: Some(_),
                    ..
                }
            )
        };
        let parts: BTreeMap<String, gang::Part> = shares
            .iter()
            .map(|(s, n)| {
                let part = gang::Part {
                    share: *n,
                    lost: lost(s),
                    evicted: policy.and_then(|p| self.registry.taint_evicts(s, p)),
                    gang: reports.get(s).and_then(Option::as_ref).and_then(|r| r.gang),
                };
                (s.clone(), part)
            })
            .collect();
        let live_copies = reports
            .iter()
            .any(|(s, r)| r.as_ref().is_some_and(|r| r.present) && !lost(s));
        let describe = || {
            shares
                .iter()
                .map(|(s, n)| format!("{n} on {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let outcome = |o: &str| {
            if let Some(m) = self.registry.metrics() {
                m.gangs.with_label_values(&[o]).inc();
            }
        };
        let not_before = record.since + self.gang_commit_delay.as_millis() as u64;
        match gang::next(record, &parts, spec.ttl, now_ms, live_copies) {
            gang::Next::Stay(d) => d,
            gang::Next::Commit if now_ms < not_before => {
                Some(Duration::from_millis(not_before - now_ms))
            }
            gang::Next::Commit => {
                *out = Some(gang::Record {
                    phase: gang::Phase::Committed,
                    since: now_ms,
                    ..record.clone()
                });
                outcome("committed");
                if let Some(m) = self.registry.metrics() {
                    m.gang_reserve_seconds
                        .observe(now_ms.saturating_sub(record.since) as f64 / 1000.0);
                }
                tracing::info!(gang = %spec.group, attempt = record.attempt, parts = %describe(), "every part of the gang is reserved: committing");
                self.recorder.event(
                    obj_ref,
                    EventType::Normal,
                    "GangCommitted",
                    &format!(
                        "every part of gang {} is reserved ({}): attempt {} committed",
                        spec.group,
                        describe(),
                        record.attempt
                    ),
                );
                Some(spec.ttl + gang::SLACK)
            }
            gang::Next::Bound => {
                *out = Some(gang::Record {
                    phase: gang::Phase::Bound,
                    since: now_ms,
                    ..record.clone()
                });
                outcome("bound");
                self.recorder.event(
                    obj_ref,
                    EventType::Normal,
                    "GangBound",
                    &format!("gang {} is bound whole ({})", spec.group, describe()),
                );
                None
            }
            gang::Next::Abort(why) => {
                let wait = gang::BACKOFF.max(fence.unwrap_or_default());
                *out = Some(gang::Record {
                    phase: gang::Phase::Backoff,
                    since: now_ms,
                    until: now_ms + wait.as_millis() as u64,
                    why: why.clone(),
                    attempt: record.attempt,
                });
                outcome("aborted");
                tracing::warn!(gang = %spec.group, attempt = record.attempt, why = %why, "gang aborted: every part is removed");
                self.recorder.event(
                    obj_ref,
                    EventType::Warning,
                    "GangAborted",
                    &format!(
                        "attempt {} of gang {} aborted: {why}; every part ({}) is removed and the gang is placed again in {:.0}s",
                        record.attempt,
                        spec.group,
                        describe(),
                        wait.as_secs_f64()
                    ),
                );
                Some(wait)
            }
            gang::Next::Place => {
                *out = None;
                None
            }
        }
    }

    /// What each shard is handed now for `target`, with the shares leaving live shards
    /// kept (Fast) or stopped first (AtMostOnce) — see [`crate::moves`]. A leaving share on
    /// a shard that is lost meanwhile is released when its failover is due. Returns the
    /// plan and when a lost leaving shard is due to be looked at.
    #[allow(clippy::too_many_arguments)]
    fn plan_move(
        &self,
        kind: WorkloadKind,
        okey: &ObjectKey,
        generation: i64,
        recorded: &Recorded,
        target: &BTreeMap<String, u64>,
        held_now: Option<&BTreeMap<String, u64>>,
        credit: &BTreeMap<String, u64>,
        failover: &Failover,
        template: &Value,
    ) -> Result<(moves::Plan, Option<Duration>), ReconcileError> {
        let at_most_once = failover.mode == tessera_placement::FailoverMode::AtMostOnce;
        // What the shards hold now. After a restart the registry holds nothing yet: the
        // record stands for it, and while an AtMostOnce move had not started its new copy,
        // only the leaving shards held anything.
        let before: BTreeMap<String, u64> = match held_now {
            Some(h) => h.clone(),
            None => {
                let mut b = credit.clone();
                if at_most_once && !recorded.leaving.is_empty() {
                    b.retain(|s, _| recorded.leaving.contains_key(s));
                }
                for (s, n) in &recorded.leaving {
                    let e = b.entry(s.clone()).or_insert(0);
                    *e = (*e).max(*n);
                }
                b
            }
        };
        let mut leaving = if *target == recorded.shares {
            recorded.leaving.clone()
        } else {
            let mut l = moves::leaving_for(&before, target, |s| self.registry.is_ready(s));
            for (s, n) in &recorded.leaving {
                if target.get(s).copied().unwrap_or(0) < *n {
                    l.entry(s.clone()).or_insert(*n);
                }
            }
            l
        };
        let lost = self.lost_shares(&leaving, failover, template);
        for shard in &lost.due {
            if !self.registry.release_lost(shard, okey) {
                return Err(ReconcileError::new(format!(
                    "shard {shard} came back while its share was released; deciding again"
                )));
            }
            leaving.remove(shard);
        }
        let reports = self.registry.reports(okey);
        let plan = moves::plan(
            target,
            &leaving,
            &before,
            failover.mode,
            |s, n| {
                reports
                    .get(s)
                    .and_then(Option::as_ref)
                    .is_some_and(|r| moves::is_available(kind, r, generation, n))
            },
            |s, n| match reports.get(s) {
                None => true,
                Some(None) => false,
                Some(Some(r)) => moves::is_stopped(kind, r, n),
            },
        );
        Ok((plan, lost.next_check))
    }

    /// Counts a move that begins or ends, with its Events (on the workload, and on the shard
    /// it leaves), and lets a move waiting for a slot begin.
    fn track_move(
        &self,
        queue_key: &str,
        obj_ref: &ObjectRef,
        plan: &moves::Plan,
        target: &BTreeMap<String, u64>,
        reason: &'static str,
        mode: tessera_placement::FailoverMode,
    ) {
        let how = match mode {
            tessera_placement::FailoverMode::Fast => {
                "make-before-break: kept until the new copies are available"
            }
            tessera_placement::FailoverMode::AtMostOnce => {
                "stop-then-start: stopped before it starts elsewhere"
            }
        };
        if !plan.leaving.is_empty() {
            if self.stalled.lock().contains_key(queue_key) {
                return;
            }
            let (began, since) = {
                let mut moving = self.moving.lock();
                let e = moving
                    .entry(queue_key.to_owned())
                    .or_insert((Instant::now(), false));
                (!std::mem::replace(&mut e.1, true), e.0)
            };
            self.waiting_to_move.lock().remove(queue_key);
            if !began {
                if since.elapsed() >= self.move_timeout {
                    self.stall(queue_key, obj_ref, plan, target, since);
                }
                return;
            }
            if let Some(m) = self.registry.metrics() {
                m.moves.with_label_values(&[reason]).inc();
                m.moves_in_progress.set(self.moving.lock().len() as i64);
            }
            let from: Vec<String> = plan
                .leaving
                .iter()
                .map(|(s, n)| format!("{n} on {s}"))
                .collect();
            let to: Vec<String> = target.iter().map(|(s, n)| format!("{n} on {s}")).collect();
            let message = format!(
                "moving ({reason}) from {} to {} ({how})",
                from.join(", "),
                to.join(", ")
            );
            tracing::info!(workload = %queue_key, reason, from = ?plan.leaving, to = ?target, "move begins");
            self.recorder
                .event(obj_ref, EventType::Normal, "Moving", &message);
            for shard in plan.leaving.keys() {
                let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(shard.clone()),
                    ..Default::default()
                };
                let shard_ref = ObjectRef::new("tessera.io/v1alpha1", "Shard", &meta);
                self.recorder.event(
                    &shard_ref,
                    EventType::Normal,
                    "MovingOut",
                    &format!(
                        "{} {}/{}: {message}",
                        obj_ref.kind, obj_ref.namespace, obj_ref.name
                    ),
                );
            }
            return;
        }
        let stalled = self.stalled.lock().remove(queue_key);
        let Some((began, announced)) = self
            .moving
            .lock()
            .remove(queue_key)
            .or(stalled.map(|t| (t, true)))
        else {
            return;
        };
        if !announced {
            // A slot taken for a move that turned out to need no waiting.
            self.move_slot_freed();
            return;
        }
        let took = began.elapsed();
        if let Some(m) = self.registry.metrics() {
            m.move_duration
                .with_label_values(&[mode.as_str()])
                .observe(took.as_secs_f64());
            m.moves_in_progress.set(self.moving.lock().len() as i64);
        }
        let to: Vec<String> = target.iter().map(|(s, n)| format!("{n} on {s}")).collect();
        tracing::info!(workload = %queue_key, to = ?target, took_s = took.as_secs_f64(), "move done");
        self.recorder.event(
            obj_ref,
            EventType::Normal,
            "Moved",
            &format!(
                "moved to {} in {:.1}s; the old copies are removed",
                to.join(", "),
                took.as_secs_f64()
            ),
        );
        self.move_slot_freed();
    }

    /// A move past its timeout: it goes on without its slot, and says why it is stuck.
    fn stall(
        &self,
        queue_key: &str,
        obj_ref: &ObjectRef,
        plan: &moves::Plan,
        target: &BTreeMap<String, u64>,
        since: Instant,
    ) {
        if self.moving.lock().remove(queue_key).is_none() {
            return;
        }
        self.stalled.lock().insert(queue_key.to_owned(), since);
        if let Some(m) = self.registry.metrics() {
            m.moves_stalled.inc();
        }
        let waiting: Vec<String> = target
            .iter()
            .filter(|(s, _)| !plan.leaving.contains_key(*s))
            .map(|(s, n)| format!("{n} on {s}"))
            .collect();
        let message = format!(
            "the move has not finished after {:.0}s: the new copies ({}) are not available yet; the old ones stay until they are, and the move no longer holds one of the --max-moving slots",
            since.elapsed().as_secs_f64(),
            waiting.join(", ")
        );
        tracing::warn!(workload = %queue_key, "{message}");
        self.recorder
            .event(obj_ref, EventType::Warning, "MoveStalled", &message);
        self.move_slot_freed();
    }

    /// A move ended: as many moves waiting for a slot as there are free slots are looked
    /// at again, in the order they began waiting (not all of them: a drain of many
    /// workloads costs one wake-up per move, not one per waiting workload).
    fn move_slot_freed(&self) {
        if let Some(m) = self.registry.metrics() {
            m.moves_in_progress.set(self.moving.lock().len() as i64);
        }
        self.wake_movers();
    }

    fn wake_movers(&self) {
        let free = self.max_moving.saturating_sub(self.moving.lock().len());
        if free == 0 {
            return;
        }
        for key in self.waiting_to_move.lock().pop(free) {
            self.queue.add(key, EventClass::Update);
        }
    }
}

/// The object's finalizers with the federation's added, if it lacks it.
fn with_finalizer(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Vec<String>> {
    if meta.finalizers.iter().flatten().any(|f| f == FINALIZER) {
        return None;
    }
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    finalizers.push(FINALIZER.into());
    Some(finalizers)
}

/// How long a workload whose shards were just told waits for their reports before its
/// status is written without them.
const REPORT_WAIT: Duration = Duration::from_secs(1);
/// How often a move is looked at again when no report comes.
const MOVE_CHECK: Duration = Duration::from_secs(5);

/// A workload's shares on lost shards (see [`Propagation::lost_shares`]).
#[derive(Debug, Default)]
struct LostShares {
    /// Shards whose share may fail over now.
    due: Vec<String>,
    /// How long after its lease ended each due shard is being failed over.
    waited: BTreeMap<String, Duration>,
    /// Shares that stay where they are for now.
    held: BTreeMap<String, u64>,
    /// When to look again (the first held share falling due).
    next_check: Option<Duration>,
}

/// Whether only what this controller writes changed on a federated object: the same spec
/// (generation), labels, deletion, and annotations and finalizers but for its own.
fn only_ours_moved(old: &SpecObject, new: &SpecObject) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    fn others(a: &Option<BTreeMap<String, String>>) -> impl Iterator<Item = (&String, &String)> {
        a.iter()
            .flatten()
            .filter(|(k, _)| k.as_str() != PLACEMENT_ANNOTATION)
    }
    fn other_finalizers(f: &Option<Vec<String>>) -> impl Iterator<Item = &String> {
        f.iter().flatten().filter(|f| f.as_str() != FINALIZER)
    }
    o.generation == n.generation
        && o.labels == n.labels
        && o.deletion_timestamp == n.deletion_timestamp
        && other_finalizers(&o.finalizers).eq(other_finalizers(&n.finalizers))
        && others(&o.annotations).eq(others(&n.annotations))
}

/// Statuses equal but for the times conditions were written.
fn same_status(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        for c in v["conditions"].as_array_mut().into_iter().flatten() {
            c["lastUpdateTime"] = Value::Null;
            c["lastTransitionTime"] = Value::Null;
        }
        v
    };
    strip(a) == strip(b)
}

#[async_trait]
impl Reconciler for Propagation {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        if let Some((prefix, rest)) = key.split_once(':')
            && prefix.contains('.')
            && let Some(res) = self.custom.resource(prefix)
        {
            return self.custom_object(res, prefix, rest).await;
        }
        let Some((kind, rest)) = Kind::parse(key) else {
            return Ok(Action::Done);
        };
        match kind {
            Kind::Workload(k) => self.workload(k, rest).await,
            Kind::Tenant => self.tenant(rest).await,
            Kind::Held(plural) => self.held_object(plural, rest).await,
            Kind::Custom(res) => {
                let prefix = crate::custom::prefix_of(res);
                self.custom_object(res, &prefix, rest).await
            }
        }
    }
}
