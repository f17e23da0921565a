//! The shard's federation agent: one bidirectional gRPC stream to the federation (opened by
//! the shard, so a shard behind NAT can join). It registers, renews its lease, pushes
//! capacity summaries when they change (at most every `summary_interval`, and every
//! `summary_period` regardless), applies the objects it is assigned with server-side apply
//! (field manager `tessera-federation`), deletes what is unassigned, removes leftovers once
//! the federation says it has sent everything, reverts changes made behind the federation's
//! back, and reports the status of every federated object it runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use parking_lot::Mutex;
use serde_json::Value;
use tessera_client::client::Client;
use tessera_client::request::find_resource;
use tessera_client::types::{
    FEDERATED_LABEL, FEDERATION_LEASE, FEDERATION_MANAGER, GANG_JOB_ANNOTATION,
    GANG_PHASE_ANNOTATION, POD_GROUP_LABEL, PodGroup, Tenant,
};
use tessera_client::workloads::WorkloadKind;
use tessera_core::LabelSelector;
use tessera_placement::Request;
use tessera_proto::federation::v1 as pb;
use tessera_proto::federation::v1::federation_client::FederationClient;
use tessera_runtime::Informers;
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, Change, Informer, Scope, SpecObject, Tasks, key_of};
use tessera_runtime::metrics::RuntimeMetrics;
use tokio::sync::{Notify, mpsc};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::summary;

mod lending;
mod offers;

/// The annotation on a copy: the federation generation it was made from.
const GENERATION_ANNOTATION: &str = "tessera.io/federation-generation";

/// How the agent reaches the federation and names its shard.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The federation's gRPC endpoint (`https://127.0.0.1:9465`), or several, comma
    /// separated (processes of a leader-elected federation: the one that leads listens).
    pub federation: String,
    /// The CA (PEM) that signs the federation's certificate.
    pub ca_pem: String,
    /// The join token.
    pub token: String,
    /// The shard's name.
    pub name: String,
    /// The shard's labels.
    pub labels: BTreeMap<String, String>,
    /// The shard's API, as the federation should show it.
    pub api_url: String,
    /// Least time between two summaries.
    pub summary_interval: Duration,
    /// Most time between two summaries.
    pub summary_period: Duration,
    /// The node label keys summaries group nodes by (see [`DEFAULT_GROUP_KEYS`]).
    pub group_keys: Vec<String>,
    /// The local address to connect to the federation from (a host with several; the
    /// kernel's choice if unset).
    pub bind_address: Option<std::net::IpAddr>,
    /// Where its lease and fence series go (none: not served).
    pub metrics: Option<crate::AgentMetrics>,
    /// The CA (PEM) of the shard's API, for nodes lent here to trust it.
    pub api_ca: String,
    /// The key the shard checks lent nodes' credentials with (`Tokens::loan_key_hex`);
    /// empty: the shard takes no part in lending.
    pub loan_key: String,
    /// Where the offers this shard makes to frameworks of the fleet are counted (none: not
    /// served).
    pub offer_metrics: Option<tessera_offers::OfferMetrics>,
}

/// The node labels a summary groups nodes by unless told otherwise: zones and instance types,
/// what workloads most often pin their pods to.
pub const DEFAULT_GROUP_KEYS: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "node.kubernetes.io/instance-type",
];

impl AgentConfig {
    /// Summaries at most every 250 ms and at least every 10 s.
    pub fn new(federation: &str, ca_pem: &str, token: &str, name: &str) -> AgentConfig {
        AgentConfig {
            federation: federation.into(),
            ca_pem: ca_pem.into(),
            token: token.into(),
            name: name.into(),
            labels: BTreeMap::new(),
            api_url: String::new(),
            summary_interval: Duration::from_millis(250),
            summary_period: Duration::from_secs(10),
            group_keys: DEFAULT_GROUP_KEYS.iter().map(|k| (*k).to_owned()).collect(),
            bind_address: None,
            metrics: None,
            api_ca: String::new(),
            loan_key: String::new(),
            offer_metrics: None,
        }
    }
}

/// Why the agent stopped trying: a refusal that retrying cannot fix.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The federation refused the shard (bad token, invalid name or labels).
    #[error("the federation refused shard {name:?}: {message}")]
    Refused {
        /// The shard.
        name: String,
        /// The federation's reason.
        message: String,
    },
    /// The federation's address is not a URL.
    #[error("--federation {0:?} is not a URL: {1}")]
    Url(String, String),
}

/// What this shard holds for the federation: key → (generation, replicas, the shard's
/// generation of the copy after our last apply, the manifest).
#[derive(Clone, Debug)]
struct Held {
    resource: &'static tessera_client::catalog::Resource,
    generation: i64,
    replicas: i64,
    /// 0 until an apply succeeded: retried until it does.
    applied_generation: i64,
    object: Arc<Value>,
    dependencies: Arc<[Value]>,
    request: Request,
    /// Stopped by the agent itself when the shard's lease lapses.
    at_most_once: bool,
}

/// How often what failed to apply is tried again, and leftovers looked for.
const RETRY: Duration = Duration::from_secs(2);

/// The agent's shared state.
struct State {
    client: Arc<dyn Client>,
    config: AgentConfig,
    held: Mutex<BTreeMap<(String, String, String), Held>>,
    /// The federated copies of each placed kind.
    workloads: Vec<(WorkloadKind, Arc<Cache<SpecObject>>)>,
    tenants: Arc<Cache<Tenant>>,
    /// The parts of federation-scope gangs this shard holds (their PodGroups).
    gangs: Arc<Cache<PodGroup>>,
    /// The nodes and pods as the capacity summary counts them, kept change by change.
    ledger: Mutex<summary::Ledger>,
    changed: Notify,
    recorder: Recorder,
    outbox: Mutex<Option<mpsc::UnboundedSender<pb::ShardMessage>>>,
    /// The shard's lease with the federation, by the agent's own clock.
    lease: Mutex<LeaseClock>,
    /// Woken when the lease lapses: the session in progress ends, to register again.
    lapsed: Notify,
    /// Woken when a renewal is acknowledged: the in-shard Lease is written.
    lease_renewed: Notify,
    /// `AtMostOnce` copies stopped because the lease lapsed: not reverted as drift, and
    /// resumed only by the federation assigning them again.
    fenced: Mutex<std::collections::BTreeSet<(String, String, String)>>,
    /// The shard's nodes and pods (the informers the summary's ledger is fed from).
    nodes: Arc<Cache<Node>>,
    pods: Arc<Cache<Pod>>,
    /// The loans it takes part in.
    loans: lending::Loans,
    /// The shard's allocator for frameworks subscribed at the federation.
    offers: tessera_offers::Offers,
}

/// The agent's view of its lease: it runs from when the agent SENT the registration or the
/// renewal the federation acknowledged — never later than the federation counts it from —
/// so the agent's lease always ends first.
#[derive(Debug, Default)]
struct LeaseClock {
    /// When the lease ends (`None`: never held since the agent started).
    until: Option<tokio::time::Instant>,
    /// The lease's length, as the federation said at registration.
    length: Duration,
    /// Renewals sent and not yet acknowledged: (seq, when sent).
    sent: std::collections::VecDeque<(u64, tokio::time::Instant)>,
    /// The at-most-once work was stopped for this lapse.
    fenced: bool,
}

impl LeaseClock {
    /// The federation granted the lease at registration (the Register was sent at `sent`).
    fn registered(&mut self, sent: tokio::time::Instant, length: Duration) {
        self.length = length;
        self.sent.clear();
        self.until = Some(sent + length);
        self.fenced = false;
    }

    /// Renewal `seq` is being sent now.
    fn sending(&mut self, seq: u64, now: tokio::time::Instant) {
        self.sent.push_back((seq, now));
        // Unacknowledged renewals beyond a lease's worth are of no use.
        while self.sent.len() > 64 {
            self.sent.pop_front();
        }
    }

    /// The federation acknowledged renewal `seq`.
    fn renewed(&mut self, seq: u64) {
        while let Some(&(s, at)) = self.sent.front() {
            if s > seq {
                break;
            }
            self.sent.pop_front();
            if s == seq && !self.fenced {
                let until = at + self.length;
                self.until = Some(self.until.map_or(until, |u| u.max(until)));
            }
        }
    }

    /// Whether the lease has lapsed at `now` (and the work is not yet stopped).
    fn lapsed(&self, now: tokio::time::Instant) -> bool {
        !self.fenced && self.until.is_some_and(|u| now >= u)
    }

    /// Whether the shard's at-most-once work is to stay stopped at `now`: stopped already,
    /// or the lease has ended (the fence may not have run yet).
    fn stopping(&self, now: tokio::time::Instant) -> bool {
        self.fenced || self.until.is_some_and(|u| now >= u)
    }

    /// The in-shard Lease that says the same: renewed when this lease was, for as long.
    fn shard_lease(&self, holder: &str) -> Option<Value> {
        let until = self.until?;
        let renewed = until.checked_sub(self.length)?;
        // The monotonic instant as wall-clock time, for the shard's fence to compare with.
        let ago = tokio::time::Instant::now().saturating_duration_since(renewed);
        let wall = std::time::SystemTime::now().checked_sub(ago)?;
        Some(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": FEDERATION_LEASE, "namespace": "kube-system"},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": self.length.as_secs(),
                "renewTime": tessera_core::time::rfc3339_micro(wall),
            },
        }))
    }
}

/// Whether the shard's API answers a read within `limit` (its `kube-system` namespace).
async fn shard_answers(state: &State, limit: Duration) -> bool {
    let Ok(namespaces) = find_resource("", "v1", "namespaces") else {
        return false;
    };
    matches!(
        tokio::time::timeout(limit, state.client.get(namespaces, None, "kube-system")).await,
        Ok(Ok(_))
    )
}

/// Writes the in-shard Lease `kube-system/tessera-federation` as the agent's lease stands:
/// the shard's own fence (`tessera_controllers::fence`) stops the at-most-once work when it
/// ends, even if this agent is stopped or gone.
async fn write_shard_lease(state: &State) {
    let Some(obj) = state.lease.lock().shard_lease(&state.config.name) else {
        return;
    };
    let Ok(leases) = find_resource("coordination.k8s.io", "v1", "leases") else {
        return;
    };
    if let Err(e) = state
        .client
        .apply(
            leases,
            Some("kube-system"),
            FEDERATION_LEASE,
            "tessera-federation-agent",
            &obj,
        )
        .await
    {
        tracing::warn!(error = %e.message, "renewing the shard's federation Lease");
    }
}

/// Keeps the in-shard Lease renewed: written when woken (a renewal acknowledged).
async fn shard_lease_writer(state: Arc<State>) {
    loop {
        state.lease_renewed.notified().await;
        write_shard_lease(&state).await;
    }
}

fn send(state: &State, m: pb::shard_message::Message) {
    if let Some(tx) = state.outbox.lock().as_ref() {
        let _ = tx.send(pb::ShardMessage { message: Some(m) });
    }
}

fn tenants_res() -> &'static tessera_client::catalog::Resource {
    find_resource("tessera.io", "v1alpha1", "tenants").expect("served")
}

/// Where the PodGroup of Job `w` stands, if the Job is a shard's part of a federation-scope
/// gang.
fn gang_status(w: &SpecObject, gangs: &Cache<PodGroup>) -> Option<pb::GangStatus> {
    let group =
        WorkloadKind::Job.template(&w.spec)["metadata"]["labels"][POD_GROUP_LABEL].as_str()?;
    let g = gangs.get(&format!(
        "{}/{group}",
        w.metadata.namespace.as_deref().unwrap_or_default()
    ))?;
    g.metadata
        .annotations
        .as_ref()?
        .get(GANG_PHASE_ANNOTATION)?;
    let st = g.status.clone().unwrap_or_default();
    Some(pb::GangStatus {
        reserved: st.reserved.unwrap_or(0).into(),
        reserved_for: st.reserved_for.unwrap_or(0),
        scheduled: st.scheduled.unwrap_or(0).into(),
    })
}

fn status_of(kind: WorkloadKind, w: &SpecObject, gangs: &Cache<PodGroup>) -> pb::ObjectStatus {
    let meta = &w.metadata;
    let fed_gen = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(GENERATION_ANNOTATION))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    // Jobs and CronJobs have no observed generation: their controllers act on the spec
    // as it is.
    let observed = match w.status["observedGeneration"].as_i64() {
        Some(g) => g >= meta.generation.unwrap_or(0),
        None => !kind.has_replicas(),
    };
    pb::ObjectStatus {
        key: Some(pb::ObjectKey {
            group: kind.group().into(),
            version: "v1".into(),
            resource: kind.plural().into(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }),
        present: true,
        federation_generation: fed_gen,
        observed,
        status_json: if w.status.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(&w.status).unwrap_or_default()
        },
        // What its spec lets run: a suspended Job or CronJob runs nothing (the federation
        // waits for that before it starts a copy that is moving elsewhere).
        replicas: match kind {
            WorkloadKind::Job | WorkloadKind::CronJob if w.spec["suspend"] == true => 0,
            _ => kind.replicas(&w.spec) as i64,
        },
        gang: (kind == WorkloadKind::Job)
            .then(|| gang_status(w, gangs))
            .flatten(),
    }
}

/// Reports every federated copy this shard runs.
fn report_all(state: &State) {
    for (kind, cache) in &state.workloads {
        for w in cache.list() {
            send(
                state,
                pb::shard_message::Message::Status(status_of(*kind, &w, &state.gangs)),
            );
        }
    }
}

/// Runs the agent against the shard's API (`client`) until a refusal that retrying cannot
/// fix; reconnects with backoff after any other failure.
pub async fn run(
    config: AgentConfig,
    client: Arc<dyn Client>,
    metrics: Option<RuntimeMetrics>,
) -> Result<(), AgentError> {
    let informers = Informers::new(client.clone(), metrics.clone());
    run_with(config, client, metrics, informers).await
}

/// [`run`], reading the shard's nodes and pods from `informers` (the shard's shared ones
/// when the agent runs in the shard's process).
pub async fn run_with(
    config: AgentConfig,
    client: Arc<dyn Client>,
    metrics: Option<RuntimeMetrics>,
    informers: Arc<Informers>,
) -> Result<(), AgentError> {
    // Several URLs: the federation's processes (one leads and listens); tried in turn.
    let mut endpoints = Vec::new();
    for url in config
        .federation
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
    {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| AgentError::Url(url.to_owned(), e.to_string()))?;
        let endpoint = if url.starts_with("https://") {
            endpoint
                .tls_config(
                    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&config.ca_pem)),
                )
                .map_err(|e| AgentError::Url(url.to_owned(), e.to_string()))?
        } else {
            endpoint
        }
        .local_address(config.bind_address)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
        endpoints.push(endpoint);
    }
    if endpoints.is_empty() {
        return Err(AgentError::Url(
            config.federation.clone(),
            "no URL given".into(),
        ));
    }
    let federated = Scope {
        label_selector: Some(
            format!("{FEDERATED_LABEL}=true")
                .parse::<LabelSelector>()
                .expect("a valid selector"),
        ),
        ..Default::default()
    };
    let workload_infs: Vec<(WorkloadKind, Arc<Informer<SpecObject>>)> = WorkloadKind::ALL
        .into_iter()
        .map(|k| {
            let inf = Informer::<SpecObject>::new(
                client.clone(),
                k.resource(),
                federated.clone(),
                metrics.clone(),
            );
            (k, inf)
        })
        .collect();
    let gang_inf = Informer::<PodGroup>::new(
        client.clone(),
        find_resource("tessera.io", "v1alpha1", "podgroups").expect("served"),
        federated.clone(),
        metrics.clone(),
    );
    let ten_inf =
        Informer::<Tenant>::new(client.clone(), tenants_res(), federated, metrics.clone());
    let node_inf = informers.get::<Node>(find_resource("", "v1", "nodes").expect("served"));
    let pod_inf = informers.get::<Pod>(find_resource("", "v1", "pods").expect("served"));
    let state = Arc::new(State {
        client: client.clone(),
        config: config.clone(),
        held: Mutex::new(BTreeMap::new()),
        workloads: workload_infs
            .iter()
            .map(|(k, i)| (*k, i.cache().clone()))
            .collect(),
        tenants: ten_inf.cache().clone(),
        gangs: gang_inf.cache().clone(),
        ledger: Mutex::new(summary::Ledger::default()),
        changed: Notify::new(),
        recorder: Recorder::new(client.clone(), "tessera-federation-agent", metrics.clone()),
        outbox: Mutex::new(None),
        lease: Mutex::new(LeaseClock::default()),
        lapsed: Notify::new(),
        lease_renewed: Notify::new(),
        fenced: Mutex::new(Default::default()),
        nodes: node_inf.cache().clone(),
        pods: pod_inf.cache().clone(),
        loans: lending::Loans::default(),
        offers: tessera_offers::Offers::new(
            tessera_offers::OffersConfig::default(),
            informers.clone(),
            // Frameworks come only through the federation here, never with a token.
            Arc::new(|_| Box::pin(async { None })),
            config.offer_metrics.clone(),
        ),
    });
    let mut subscriptions = Vec::new();
    {
        let s = Arc::downgrade(&state);
        subscriptions.push(node_inf.on_change(move |c| {
            if let Some(s) = s.upgrade() {
                match c {
                    Change::Deleted(n) => s
                        .ledger
                        .lock()
                        .remove_node(n.metadata.name.as_deref().unwrap_or_default()),
                    Change::Added(n) | Change::Updated { new: n, .. } => {
                        s.ledger.lock().set_node(n)
                    }
                }
                s.changed.notify_one();
            }
        }));
        let s = Arc::downgrade(&state);
        subscriptions.push(pod_inf.on_change(move |c| {
            if let Some(s) = s.upgrade() {
                let key = key_of(&c.object().metadata);
                match c {
                    Change::Deleted(_) => s.ledger.lock().remove_pod(&key),
                    Change::Added(p) | Change::Updated { new: p, .. } => {
                        s.ledger.lock().set_pod(&key, p)
                    }
                }
                s.changed.notify_one();
            }
        }));
        // A gang part's PodGroup changed (reserved, bound): the federation hears it as its
        // Job's status.
        let s = Arc::downgrade(&state);
        subscriptions.push(gang_inf.on_change(move |c| {
            let Some(s) = s.upgrade() else { return };
            let g = c.object();
            let Some(job) = g
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(GANG_JOB_ANNOTATION))
            else {
                return;
            };
            let key = format!(
                "{}/{job}",
                g.metadata.namespace.as_deref().unwrap_or_default()
            );
            let jobs = s
                .workloads
                .iter()
                .find(|(k, _)| *k == WorkloadKind::Job)
                .map(|(_, c)| c.clone());
            if let Some(w) = jobs.and_then(|c| c.get(&key)) {
                send(
                    &s,
                    pb::shard_message::Message::Status(status_of(WorkloadKind::Job, &w, &s.gangs)),
                );
            }
        }));
        for (kind, inf) in &workload_infs {
            let (s, kind) = (Arc::downgrade(&state), *kind);
            subscriptions.push(inf.on_change(move |c| {
                let Some(s) = s.upgrade() else { return };
                let w = c.object();
                if matches!(c, tessera_runtime::informer::Change::Deleted(_)) {
                    let mut st = status_of(kind, w, &s.gangs);
                    st.present = false;
                    st.status_json.clear();
                    send(&s, pb::shard_message::Message::Status(st));
                } else {
                    send(
                        &s,
                        pb::shard_message::Message::Status(status_of(kind, w, &s.gangs)),
                    );
                    drift(&s, kind, w);
                }
                s.changed.notify_one();
            }));
        }
    }
    let mut tasks: Vec<_> = workload_infs
        .iter()
        .map(|(_, i)| tokio::spawn(i.clone().run()))
        .collect();
    tasks.push(tokio::spawn(ten_inf.clone().run()));
    tasks.push(tokio::spawn(gang_inf.clone().run()));
    tasks.push(tokio::spawn(watch_lease(state.clone())));
    tasks.push(tokio::spawn(shard_lease_writer(state.clone())));
    tasks.push(tokio::spawn(state.offers.clone().run()));
    let _tasks = Tasks(tasks);
    for (_, i) in &workload_infs {
        i.synced().await;
    }
    ten_inf.synced().await;
    gang_inf.synced().await;
    node_inf.synced().await;
    pod_inf.synced().await;
    if !state.config.loan_key.is_empty() {
        lending::load(&state).await;
    }
    let mut backoff = Duration::from_millis(200);
    let mut at = 0;
    loop {
        // A shard whose API does not answer is not registered: registering would hand it a
        // lease (and work) it cannot hold.
        if !shard_answers(&state, Duration::from_secs(2)).await {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        match session(&state, &endpoints[at]).await {
            Ok(()) => backoff = Duration::from_millis(200),
            Err(status) => {
                let refused = matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                );
                if refused {
                    return Err(AgentError::Refused {
                        name: config.name.clone(),
                        message: status.message().to_owned(),
                    });
                }
                tracing::warn!(shard = %config.name, code = ?status.code(), error = %status.message(), "federation stream ended; reconnecting");
                // The next of the federation's processes (it may lead now).
                at = (at + 1) % endpoints.len();
            }
        }
        *state.outbox.lock() = None;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One connection: register, then serve the stream until it ends.
async fn session(state: &Arc<State>, endpoint: &Endpoint) -> Result<(), tonic::Status> {
    let channel: Channel = endpoint
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connecting to the federation: {e}")))?;
    let mut grpc = FederationClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::unbounded_channel::<pb::ShardMessage>();
    let cfg = &state.config;
    let register_sent = tokio::time::Instant::now();
    let _ = tx.send(pb::ShardMessage {
        message: Some(pb::shard_message::Message::Register(pb::Register {
            name: cfg.name.clone(),
            token: cfg.token.clone(),
            labels: cfg.labels.clone().into_iter().collect(),
            api_url: cfg.api_url.clone(),
            api_ca: cfg.api_ca.clone(),
            loan_key: cfg.loan_key.clone(),
        })),
    });
    let response = grpc
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await?;
    let mut inbound = response.into_inner();
    let Some(first) = inbound.message().await? else {
        return Err(tonic::Status::unavailable(
            "the federation closed the stream",
        ));
    };
    let Some(pb::federation_message::Message::Registered(reg)) = first.message else {
        return Err(tonic::Status::internal(
            "the federation did not answer Registered",
        ));
    };
    tracing::info!(shard = %cfg.name, lease = reg.lease_seconds, "registered with the federation");
    state.lease.lock().registered(
        register_sent,
        Duration::from_secs(u64::from(reg.lease_seconds.max(1))),
    );
    // The shard's fence sees the lease held again before anything is applied.
    write_shard_lease(state).await;
    *state.outbox.lock() = Some(tx.clone());
    // What was assigned since this stream began (for the leftovers check at Synced).
    let mut assigned: std::collections::BTreeSet<(String, String, String)> = Default::default();
    report_all(state);
    let renew = Duration::from_secs(u64::from(reg.renew_seconds.max(1)));
    // Stopped with this stream — also when the agent itself is cancelled (an in-process
    // shard killed): a renewer left behind would hold a dead shard's lease.
    let renewer = {
        let tx = tx.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let mut seq = 0;
            let mut tick = tokio::time::interval(renew);
            let mut down = false;
            loop {
                tick.tick().await;
                // The lease says the shard runs its work: renewed only while the shard's API
                // answers. A shard whose control plane died (kill -9) then loses its lease
                // like a cut-off one, and its work fails over.
                if !shard_answers(&state, renew / 2).await {
                    if let Some(m) = &state.config.metrics {
                        m.renewals_withheld.inc();
                    }
                    if !down {
                        tracing::warn!(shard = %state.config.name, "the shard's API does not answer: not renewing its federation lease");
                    }
                    down = true;
                    continue;
                }
                if down {
                    tracing::info!(shard = %state.config.name, "the shard's API answers again: renewing its federation lease");
                    down = false;
                }
                seq += 1;
                state.lease.lock().sending(seq, tokio::time::Instant::now());
                if tx
                    .send(pb::ShardMessage {
                        message: Some(pb::shard_message::Message::Renew(pb::Renew { seq })),
                    })
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let summarizer = tokio::spawn(summaries(state.clone(), seen.clone()));
    let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let retrier = tokio::spawn(retries(state.clone(), synced.clone()));
    let ledger = tokio::spawn(offers::ledger(state.clone(), state.offers.clone()));
    let _stream_tasks = Tasks(vec![renewer, summarizer, retrier, ledger]);
    // Reads the federation makes here; they stop with the stream.
    let calls = crate::reads::Calls::default();
    let result = loop {
        let msg = tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(m)) => m,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            },
            // The lease lapsed (the federation is unreachable or stopped answering): the
            // at-most-once work is stopped; register again for a fresh start.
            () = state.lapsed.notified() => {
                break Err(tonic::Status::unavailable("the shard's lease lapsed"));
            }
        };
        if state.lease.lock().stopping(tokio::time::Instant::now()) {
            // The lease ended (by this agent's clock) before the message was handled: a
            // message that waited in the stream while the agent was frozen or cut off (a
            // gang's commit, an assignment) is never applied late; the federation sends
            // what still holds when the agent registers again.
            break Err(tonic::Status::unavailable("the shard's lease lapsed"));
        }
        match msg.message {
            Some(pb::federation_message::Message::Assignment(a)) => {
                if let Some(k) = &a.key {
                    assigned.insert((k.resource.clone(), k.namespace.clone(), k.name.clone()));
                }
                assignment(state, &a).await;
                seen.store(a.seq, std::sync::atomic::Ordering::Release);
                state.changed.notify_one();
            }
            Some(pb::federation_message::Message::Synced(s)) => {
                // What was held before this stream and not assigned again is no longer ours.
                state.held.lock().retain(|k, _| assigned.contains(k));
                state.fenced.lock().retain(|k| assigned.contains(k));
                leftovers(state, &assigned).await;
                synced.store(true, std::sync::atomic::Ordering::Release);
                // The federation now knows all it assigned here: report every copy again
                // (a restarted federation ignores reports of what it has not assigned yet).
                report_all(state);
                seen.store(s.seq, std::sync::atomic::Ordering::Release);
            }
            Some(pb::federation_message::Message::Call(c)) => {
                calls.start(state.client.clone(), c, tx.clone());
            }
            Some(pb::federation_message::Message::Cancel(c)) => calls.cancel(c.id),
            Some(pb::federation_message::Message::Tunnel(t)) => calls.tunnel_data(t),
            Some(pb::federation_message::Message::Renewed(r)) => {
                state.lease.lock().renewed(r.seq);
                state.lease_renewed.notify_one();
            }
            Some(pb::federation_message::Message::Loan(l)) => {
                let state = state.clone();
                tokio::spawn(async move { lending::handle(&state, l).await });
            }
            Some(pb::federation_message::Message::Offers(m)) => {
                let state = state.clone();
                let offers = state.offers.clone();
                tokio::spawn(async move { offers::handle(&state, &offers, m).await });
            }
            Some(pb::federation_message::Message::Fleet(f)) => offers::fleet(&state.offers, f),
            Some(pb::federation_message::Message::Registered(_)) | None => {}
        }
    };
    drop(calls);
    // Frameworks of the fleet lost their way here: their tasks wait out their failover
    // timeout, and are theirs again if the federation attaches them in time.
    state.offers.detach_fleet();
    result
}

/// Sends a summary when nodes or pods change (at most every `summary_interval`) and every
/// `summary_period`.
async fn summaries(state: Arc<State>, seen: Arc<std::sync::atomic::AtomicU64>) {
    let mut version = 0u64;
    loop {
        version += 1;
        // Taken before building: what the summary accounts for.
        let seen_now = seen.load(std::sync::atomic::Ordering::Acquire);
        let promised: Vec<(Request, u64)> = {
            let held = state.held.lock();
            held.iter()
                .filter_map(|((res, ns, name), h)| {
                    let kind = WorkloadKind::from_plural(res)?;
                    let copy = state
                        .workloads
                        .iter()
                        .find(|(k, _)| *k == kind)?
                        .1
                        .get(&format!("{ns}/{name}"));
                    let status = copy.as_ref().map_or(&Value::Null, |w| &w.status);
                    if kind.needs_no_room(status) {
                        return None;
                    }
                    let missing = (h.replicas.max(0) as u64).saturating_sub(kind.pods_now(status));
                    (missing > 0).then(|| (h.request.clone(), missing))
                })
                .collect()
        };
        let (s, running, pending, view, bound) = {
            let ledger = state.ledger.lock();
            let (s, running, pending, view) =
                ledger.summary_with_lending(&promised, &state.config.group_keys, version);
            (s, running, pending, view, ledger.pods_bound())
        };
        let lending =
            (!state.config.loan_key.is_empty()).then(|| lending::to_pb(view, &state.loans));
        send(
            &state,
            pb::shard_message::Message::Summary(pb::CapacitySummary {
                assignments_seen: seen_now,
                pods_running: running,
                pods_pending: pending,
                pods_bound: bound,
                lending,
                ..summary::to_pb(&s)
            }),
        );
        tokio::time::sleep(state.config.summary_interval).await;
        let _ = tokio::time::timeout(state.config.summary_period, state.changed.notified()).await;
    }
}

/// Applies (or deletes) one assignment.
async fn assignment(state: &Arc<State>, a: &pb::Assignment) {
    let Some(k) = &a.key else { return };
    let id = (k.resource.clone(), k.namespace.clone(), k.name.clone());
    let res = match find_resource(&k.group, &k.version, &k.resource) {
        Ok(res) => res,
        // A custom kind: the shard serves it once the federation's CRD is here, which it
        // holds too (an apply before then fails, and the retry pass tries again). Its key
        // names no version: an apply takes the object's, a delete the one it was applied in.
        Err(_) if k.version.is_empty() => {
            let held = state.held.lock().get(&id).map(|h| h.resource);
            match (custom_resource_of(k, &a.object_json), held) {
                (Some(res), _) | (None, Some(res)) => res,
                (None, None) => return,
            }
        }
        Err(_) => {
            tracing::warn!(resource = %k.resource, "assigned a kind this shard does not serve");
            return;
        }
    };
    let ns = (!k.namespace.is_empty()).then_some(k.namespace.as_str());
    if a.op == pb::assignment::Op::Delete as i32 {
        state.held.lock().remove(&id);
        remove_gang_part(state, &k.namespace, &k.name).await;
        match state.client.delete(res, ns, &k.name, None).await {
            Ok(_) => {
                tracing::info!(object = %k.name, namespace = %k.namespace, "removed a federated object")
            }
            Err(e) if e.code == 404 => {}
            Err(e) => {
                tracing::warn!(object = %k.name, error = %e.message, "removing a federated object")
            }
        }
        return;
    }
    let Ok(object) = serde_json::from_slice::<Value>(&a.object_json) else {
        tracing::warn!(object = %k.name, "an assignment whose object is not JSON");
        return;
    };
    let dependencies: Arc<[Value]> = a
        .dependencies_json
        .iter()
        .filter_map(|d| serde_json::from_slice::<Value>(d).ok())
        .collect();
    let template: Option<k8s_openapi::api::core::v1::PodSpec> =
        WorkloadKind::from_plural(&k.resource).and_then(|kind| {
            serde_json::from_value(kind.template(&object["spec"])["spec"].clone()).ok()
        });
    let request = Request {
        amounts: tessera_scheduler::resources::pod_spec_requests(template.as_ref()).amounts(),
        on: tessera_scheduler::plugins::affinity::required_node_labels(template.as_ref()),
    };
    // Held before it is applied: the copy is never a leftover, even while the apply runs.
    let h = Held {
        resource: res,
        generation: a.generation,
        replicas: a.replicas,
        applied_generation: 0,
        object: Arc::new(object),
        dependencies,
        request,
        at_most_once: a.failover == tessera_placement::FailoverMode::AtMostOnce.as_str(),
    };
    state.held.lock().insert(id.clone(), h.clone());
    apply_held(state, &id, &h).await;
}

/// The resource of an assigned custom object, from its key and the kind it names: what the
/// requests to apply and delete it need (the subresources and short names are the CRD's
/// business, not the agent's).
fn custom_resource_of(
    k: &pb::ObjectKey,
    object_json: &[u8],
) -> Option<&'static tessera_client::catalog::Resource> {
    let obj = serde_json::from_slice::<Value>(object_json).ok()?;
    let kind = obj["kind"].as_str()?.to_owned();
    let version = obj["apiVersion"].as_str()?.rsplit_once('/')?.1.to_owned();
    Some(tessera_client::catalog::intern(
        &tessera_client::catalog::CustomNames {
            group: k.group.clone(),
            version,
            plural: k.resource.clone(),
            singular: kind.to_lowercase(),
            kind,
            namespaced: !k.namespace.is_empty(),
            short_names: Vec::new(),
            categories: Vec::new(),
            status: false,
            scale: false,
        },
    ))
}

/// Removes the PodGroup that made Job `ns/job` a part of a federation-scope gang: the next
/// attempt's part starts from a PodGroup made for it, never from this one's phase.
async fn remove_gang_part(state: &Arc<State>, ns: &str, job: &str) {
    let part = state.gangs.in_namespace(ns).into_iter().find(|g| {
        g.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GANG_JOB_ANNOTATION))
            .is_some_and(|j| j == job)
    });
    let Some(g) = part else { return };
    let name = g.metadata.name.clone().unwrap_or_default();
    let res = find_resource("tessera.io", "v1alpha1", "podgroups").expect("served");
    match state.client.delete(res, Some(ns), &name, None).await {
        Ok(_) => tracing::info!(gang = %name, namespace = ns, "removed a gang part's PodGroup"),
        Err(e) if e.code == 404 => {}
        Err(e) => {
            tracing::warn!(gang = %name, error = %e.message, "removing a gang part's PodGroup")
        }
    }
}

/// Applies a held object (its dependencies first) and notes the copy's generation, unless
/// the federation assigned something newer meanwhile.
async fn apply_held(state: &Arc<State>, id: &(String, String, String), h: &Held) {
    for d in h.dependencies.iter() {
        if !ensure(state, d).await {
            // Tried again with the object on the next retry pass.
            return;
        }
    }
    let ns = (!id.1.is_empty()).then_some(id.1.as_str());
    let Some(g) = apply(state, h.resource, ns, &id.2, &h.object).await else {
        return;
    };
    if state.fenced.lock().remove(id) {
        // Assigned again by the federation after a lapse: it runs here again.
        resume_cron_jobs(state, id).await;
        tracing::info!(resource = %id.0, namespace = %id.1, name = %id.2, "resumed a federated workload the federation assigned again");
    }
    if let Some(now) = state.held.lock().get_mut(id)
        && now.generation == h.generation
        && now.replicas == h.replicas
    {
        now.applied_generation = g;
    }
}

/// Watches the shard's lease by the agent's own clock: when it lapses (no renewal
/// acknowledged for a lease), every `AtMostOnce` copy is stopped — scaled to zero, or
/// suspended — without the federation, and the session ends so the agent registers again.
/// The federation starts them elsewhere only after lease + grace + margin.
async fn watch_lease(state: Arc<State>) {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_try = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let now = tokio::time::Instant::now();
        let (lapsed, stopping) = {
            let mut lease = state.lease.lock();
            let lapsed = lease.lapsed(now);
            if lapsed {
                lease.fenced = true;
            }
            if let (Some(m), Some(until)) = (&state.config.metrics, lease.until) {
                let left = if until >= now {
                    (until - now).as_secs_f64()
                } else {
                    -(now - until).as_secs_f64()
                };
                m.lease_remaining.set(left);
            }
            (lapsed, lease.fenced)
        };
        if lapsed {
            if let Some(m) = &state.config.metrics {
                m.lease_lapses.inc();
            }
            tracing::warn!(shard = %state.config.name, "the shard's federation lease lapsed: stopping its at-most-once workloads");
            state.lapsed.notify_waiters();
        }
        if stopping && (lapsed || last_try.elapsed() >= RETRY) {
            // What is not stopped yet (newly lapsed, or a stop that failed: tried again
            // every RETRY, not every tick, while the shard's API does not answer).
            last_try = tokio::time::Instant::now();
            fence(&state, lapsed).await;
        }
    }
}

/// Stops every held `AtMostOnce` copy: Deployments, ReplicaSets and StatefulSets scaled to
/// zero, Jobs and CronJobs (and a CronJob's running Jobs) suspended. The change is made
/// as the federation's field manager, so the federation's own copy, applied again when it
/// assigns the workload again, restores it.
async fn fence(state: &Arc<State>, first: bool) {
    let targets: Vec<((String, String, String), Held)> = {
        let fenced = state.fenced.lock();
        state
            .held
            .lock()
            .iter()
            .filter(|(k, h)| h.at_most_once && !fenced.contains(*k))
            .map(|(k, h)| (k.clone(), h.clone()))
            .collect()
    };
    for (id, h) in targets {
        let Some(kind) = WorkloadKind::from_plural(&id.0) else {
            continue;
        };
        state.fenced.lock().insert(id.clone());
        let mut stopped = (*h.object).clone();
        match kind {
            WorkloadKind::Job | WorkloadKind::CronJob => stopped["spec"]["suspend"] = true.into(),
            _ => stopped["spec"]["replicas"] = 0.into(),
        }
        let ns = (!id.1.is_empty()).then_some(id.1.as_str());
        if apply(state, h.resource, ns, &id.2, &stopped)
            .await
            .is_none()
        {
            // The shard's API does not answer (the shard is down: nothing runs there, or
            // its own fence stops it when it is back). Tried again on the next tick.
            if first {
                tracing::error!(resource = %id.0, namespace = %id.1, name = %id.2, "could not stop an at-most-once workload after the lease lapsed; retrying");
            }
            state.fenced.lock().remove(&id);
            continue;
        }
        if kind == WorkloadKind::CronJob {
            suspend_cron_jobs(state, &id, true).await;
        }
        tracing::warn!(resource = %id.0, namespace = %id.1, name = %id.2, "stopped an at-most-once workload: the shard's federation lease lapsed");
        if let Some(m) = &state.config.metrics {
            m.stopped.with_label_values(&[kind.kind()]).inc();
        }
        let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(id.2.clone()),
            namespace: ns.map(str::to_owned),
            ..Default::default()
        };
        state.recorder.event(
            &ObjectRef::new(kind.api_version(), kind.kind(), &meta),
            EventType::Warning,
            "FederationLeaseLost",
            &format!(
                "the shard lost the federation (its lease lapsed): this {kind} fails over AtMostOnce, so it was stopped here before the federation may start it elsewhere"
            ),
        );
    }
}

/// Suspends (or resumes) the Jobs a fenced CronJob started in the shard.
async fn suspend_cron_jobs(state: &Arc<State>, id: &(String, String, String), suspend: bool) {
    let Ok(jobs) = find_resource("batch", "v1", "jobs") else {
        return;
    };
    let mut req =
        tessera_client::request::ApiRequest::new(tessera_client::request::Verb::List, jobs);
    req.namespace = Some(id.1.clone());
    let Ok(list) = state.client.list(req).await else {
        return;
    };
    for job in list["items"].as_array().into_iter().flatten() {
        let owned = job["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|o| o["kind"] == "CronJob" && o["name"] == id.2.as_str());
        let Some(name) = job["metadata"]["name"].as_str().filter(|_| owned) else {
            continue;
        };
        let patch = serde_json::json!({"spec": {"suspend": suspend}});
        if let Err(e) = state
            .client
            .patch(
                jobs,
                Some(&id.1),
                name,
                None,
                tessera_client::request::PatchType::Merge,
                &patch,
            )
            .await
        {
            tracing::warn!(job = name, error = %e.message, "suspending a CronJob's Job");
        }
    }
}

/// A CronJob assigned again resumes the Jobs its fence suspended.
async fn resume_cron_jobs(state: &Arc<State>, id: &(String, String, String)) {
    if id.0 == WorkloadKind::CronJob.plural() {
        suspend_cron_jobs(state, id, false).await;
    }
}

/// While a stream is up: applies again what failed to apply, and — once the federation has
/// said `Synced` — removes federated copies it no longer assigns (a delete that failed).
async fn retries(state: Arc<State>, synced: Arc<std::sync::atomic::AtomicBool>) {
    let mut tick = tokio::time::interval(RETRY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let failed: Vec<((String, String, String), Held)> = state
            .held
            .lock()
            .iter()
            .filter(|(_, h)| h.applied_generation == 0)
            .map(|(k, h)| (k.clone(), h.clone()))
            .collect();
        for (id, h) in failed {
            apply_held(&state, &id, &h).await;
        }
        if synced.load(std::sync::atomic::Ordering::Acquire) {
            let held: std::collections::BTreeSet<(String, String, String)> =
                state.held.lock().keys().cloned().collect();
            leftovers(&state, &held).await;
        }
    }
}

/// Puts a dependency in place: a namespace is created if missing (an existing one is the
/// shard's); what a workload takes along (ConfigMaps, Secrets, ServiceAccounts, Services) is
/// server-side applied as the federation, so changes made at the federation follow.
async fn ensure(state: &State, obj: &Value) -> bool {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let Some(res) =
        tessera_client::catalog::find_kind(obj["apiVersion"].as_str().unwrap_or("v1"), kind)
    else {
        tracing::warn!(kind, "a dependency of a kind this shard does not serve");
        return true;
    };
    let ns = obj["metadata"]["namespace"].as_str();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if kind != "Namespace" {
        if let Err(e) = state
            .client
            .apply(res, ns, name, FEDERATION_MANAGER, obj)
            .await
        {
            tracing::warn!(kind, name, error = %e.message, "applying what a workload takes along");
            return false;
        }
        return true;
    }
    if state.client.get(res, ns, name).await.is_ok() {
        return true;
    }
    match state.client.create(res, ns, obj).await {
        Ok(_) | Err(tessera_client::status::ApiError { code: 409, .. }) => true,
        Err(e) => {
            tracing::warn!(kind, name, error = %e.message, "creating a dependency");
            false
        }
    }
}

/// Server-side applies `obj`; returns the copy's generation after it.
async fn apply(
    state: &State,
    res: &'static tessera_client::catalog::Resource,
    ns: Option<&str>,
    name: &str,
    obj: &Value,
) -> Option<i64> {
    match state
        .client
        .apply(res, ns, name, FEDERATION_MANAGER, obj)
        .await
    {
        Ok(v) => v["metadata"]["generation"].as_i64(),
        Err(e) => {
            tracing::warn!(object = name, error = %e.message, "applying a federated object");
            None
        }
    }
}

/// A copy changed behind the federation's back (its spec moved past our last apply, or its
/// replicas differ from the share): apply the federation's version again and say so.
fn drift(state: &Arc<State>, kind: WorkloadKind, w: &SpecObject) {
    let ns = w.metadata.namespace.clone().unwrap_or_default();
    let name = w.metadata.name.clone().unwrap_or_default();
    let id = (kind.plural().to_owned(), ns.clone(), name.clone());
    if state.fenced.lock().contains(&id) || state.lease.lock().stopping(tokio::time::Instant::now())
    {
        // Stopped on purpose while the shard is cut off from the federation (by this agent
        // or by the shard's own fence).
        return;
    }
    let Some(h) = state.held.lock().get(&id).cloned() else {
        return;
    };
    let generation = w.metadata.generation.unwrap_or(0);
    let fed_gen: i64 = w
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GENERATION_ANNOTATION))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let replicas_moved =
        kind.has_replicas() && w.spec["replicas"].as_i64().unwrap_or(1) != h.replicas;
    let changed = fed_gen == h.generation
        && h.applied_generation > 0
        && (generation > h.applied_generation || replicas_moved);
    if !changed {
        return;
    }
    let state = state.clone();
    let obj_ref = ObjectRef::new(kind.api_version(), kind.kind(), &w.metadata);
    tokio::spawn(async move {
        apply_held(&state, &id, &h).await;
        tracing::info!(kind = kind.kind(), namespace = %ns, name = %name, "reverted a change made behind the federation's back");
        state.recorder.event(
            &obj_ref,
            EventType::Warning,
            "FederationReverted",
            &format!("this {kind} is managed by the federation: a change made in the shard was reverted; change it at the federation"),
        );
    });
}

/// Federated copies not in `assigned` are removed (after `Synced`, and on every retry pass
/// after it).
async fn leftovers(
    state: &Arc<State>,
    assigned: &std::collections::BTreeSet<(String, String, String)>,
) {
    let mut gone = Vec::new();
    for (kind, cache) in &state.workloads {
        for w in cache.list() {
            let id = (
                kind.plural().to_owned(),
                w.metadata.namespace.clone().unwrap_or_default(),
                w.metadata.name.clone().unwrap_or_default(),
            );
            if !assigned.contains(&id) {
                gone.push((kind.resource(), id));
            }
        }
    }
    for t in state.tenants.list() {
        let id = ("tenants".to_owned(), String::new(), key_of(&t.metadata));
        if !assigned.contains(&id) {
            gone.push((tenants_res(), id));
        }
    }
    // RBAC objects, CRDs and custom objects the federation put here (labelled so), read once
    // per stream: the custom kinds are those of the federation's CRDs here.
    let mut custom: Vec<&'static tessera_client::catalog::Resource> = Vec::new();
    if let Ok(crds) = find_resource(
        tessera_client::catalog::APIEXTENSIONS,
        "v1",
        "customresourcedefinitions",
    ) {
        let mut req =
            tessera_client::request::ApiRequest::new(tessera_client::request::Verb::List, crds);
        req.params.label_selector = format!("{FEDERATED_LABEL}=true").parse().ok();
        let _ = state
            .client
            .list_each(req, &mut |crd: Value| {
                custom.extend(tessera_client::catalog::custom_storage_resource(&crd));
            })
            .await;
    }
    let held_and_custom = tessera_client::types::HELD_KINDS
        .iter()
        .filter_map(|(g, p, _)| find_resource(g, "v1", p).ok())
        .chain(custom);
    for res in held_and_custom {
        let plural = res.plural;
        let mut req =
            tessera_client::request::ApiRequest::new(tessera_client::request::Verb::List, res);
        req.params.label_selector = format!("{FEDERATED_LABEL}=true").parse().ok();
        let mut found = Vec::new();
        let listed = state
            .client
            .list_each(req, &mut |o: Value| {
                let meta = &o["metadata"];
                found.push((
                    meta["namespace"].as_str().unwrap_or_default().to_owned(),
                    meta["name"].as_str().unwrap_or_default().to_owned(),
                ));
            })
            .await;
        if let Err(e) = listed {
            tracing::warn!(resource = plural, error = %e.message, "listing federated objects");
            continue;
        }
        for (ns, name) in found {
            let id = (plural.to_owned(), ns, name);
            if !assigned.contains(&id) {
                gone.push((res, id));
            }
        }
    }
    for (res, (plural, ns, name)) in gone {
        if plural == WorkloadKind::Job.plural() {
            remove_gang_part(state, &ns, &name).await;
        }
        let ns = (!ns.is_empty()).then_some(ns);
        tracing::info!(resource = res.plural, name = %name, "removing a federated object the federation no longer assigns");
        match state.client.delete(res, ns.as_deref(), &name, None).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => tracing::warn!(name = %name, error = %e.message, "removing a leftover"),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_agents_lease_runs_from_what_it_sent_and_lapses_before_the_federations() {
        let t0 = tokio::time::Instant::now();
        let s = Duration::from_secs;
        let mut lease = LeaseClock::default();
        assert!(!lease.lapsed(t0 + s(3600)), "never held: nothing to stop");
        // Registered: the lease runs from when Register was sent.
        lease.registered(t0, s(15));
        assert!(!lease.lapsed(t0 + s(14)));
        assert!(lease.lapsed(t0 + s(15)));
        // Renewal 1 sent at 5 s, acknowledged (whenever the ack comes): 20 s.
        lease.sending(1, t0 + s(5));
        lease.sending(2, t0 + s(10));
        lease.renewed(1);
        assert!(!lease.lapsed(t0 + s(19)));
        assert!(lease.lapsed(t0 + s(20)));
        // An ack for an older seq never shortens it; renewal 2 moves it to 25 s.
        lease.renewed(1);
        lease.renewed(2);
        assert!(!lease.lapsed(t0 + s(24)));
        assert!(lease.lapsed(t0 + s(25)));
        // Renewals sent but never acknowledged (the partition) do not extend it.
        lease.sending(3, t0 + s(15));
        lease.sending(4, t0 + s(20));
        assert!(lease.lapsed(t0 + s(25)));
        // Once the work is stopped it stays stopped: a late ack does not revive the lease,
        // only a new registration does.
        lease.fenced = true;
        lease.renewed(4);
        assert!(
            !lease.lapsed(t0 + s(40)),
            "already stopped: not stopped twice"
        );
        assert_eq!(lease.until, Some(t0 + s(25)));
        lease.registered(t0 + s(60), s(15));
        assert!(!lease.fenced);
        assert!(!lease.lapsed(t0 + s(74)));
        assert!(lease.lapsed(t0 + s(75)));
    }

    fn copy(generation: i64, status: Value, spec: Value) -> SpecObject {
        SpecObject {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("t1".into()),
                generation: Some(generation),
                annotations: Some([(GENERATION_ANNOTATION.into(), "7".into())].into()),
                ..Default::default()
            },
            spec,
            status,
        }
    }

    #[test]
    fn a_copys_status_names_its_federation_generation_and_whether_it_is_observed() {
        let d = copy(
            4,
            json!({"observedGeneration": 3, "replicas": 2}),
            json!({"replicas": 2}),
        );
        let s = status_of(WorkloadKind::Deployment, &d, &Cache::default());
        assert_eq!(s.federation_generation, 7);
        assert!(
            !s.observed,
            "the shard's controller has not seen generation 4"
        );
        let d = copy(
            4,
            json!({"observedGeneration": 4, "replicas": 2}),
            json!({"replicas": 2}),
        );
        let s = status_of(WorkloadKind::Deployment, &d, &Cache::default());
        assert!(s.observed);
        let st: Value = serde_json::from_slice(&s.status_json).expect("json");
        assert_eq!(st["replicas"], 2);
        let key = s.key.expect("key");
        assert_eq!(
            (key.namespace.as_str(), key.resource.as_str()),
            ("t1", "deployments")
        );
    }

    #[test]
    fn a_jobs_status_is_reported_under_its_kind_with_its_parallelism() {
        let j = copy(
            1,
            json!({"active": 3}),
            json!({"parallelism": 3, "completions": 6}),
        );
        let s = status_of(WorkloadKind::Job, &j, &Cache::default());
        let key = s.key.clone().expect("key");
        assert_eq!(
            (key.group.as_str(), key.resource.as_str()),
            ("batch", "jobs")
        );
        assert!(s.observed, "a Job has no observed generation to wait for");
        assert_eq!(s.replicas, 3);
        // A StatefulSet without an observed generation has not been seen by its controller.
        let sts = copy(1, Value::Null, json!({"replicas": 2}));
        let s = status_of(WorkloadKind::StatefulSet, &sts, &Cache::default());
        assert!(!s.observed);
        assert!(s.status_json.is_empty());
    }
}
