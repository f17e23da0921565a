//! Hollow nodes: simulated nodes that register, renew their Leases and run the pods bound to
//! them — a pod becomes Running after a configurable delay, and finishes after the seconds
//! its `tessera.io/sim-run-seconds` annotation says (with the exit code of
//! `tessera.io/sim-exit-code`, default 0), following its restartPolicy. A node can be made to
//! fail: its Lease is no longer renewed and its pods are no longer touched, as a dead
//! machine's. By default the agent's nodes share one Lease (`tessera.io/node-lease` names it
//! on each node), so an idle fleet costs one write per agent per renewal interval.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::catalog::Resource;
use tessera_client::client::{Client, resource_version_of};
use tessera_client::request::{Decoded, PatchType, find_resource};
use tessera_client::status::ApiError;
use tessera_client::types::{LentMark, NODE_LEASE_ANNOTATION};
use tessera_core::time::{now_secs, rfc3339, rfc3339_micro_now};
use tessera_runtime::Informers;
use tessera_runtime::informer::{Change, Tasks};
use tessera_runtime::metrics::RuntimeMetrics;
use tokio::sync::{Semaphore, mpsc};

use crate::metrics::AgentMetrics;

/// How long a pod runs before its containers exit (seconds).
pub const RUN_SECONDS_ANNOTATION: &str = "tessera.io/sim-run-seconds";
/// How long its containers take to stop once it is deleted (seconds; at most its grace
/// period): a process that finishes its work on SIGTERM. Without it they stop at once.
pub const STOP_SECONDS_ANNOTATION: &str = "tessera.io/sim-stop-seconds";
/// The exit code its containers exit with.
pub const EXIT_CODE_ANNOTATION: &str = "tessera.io/sim-exit-code";
/// The namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The shape of the simulated nodes.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Node names are `{prefix}-{i}`.
    pub prefix: String,
    /// How many nodes.
    pub nodes: usize,
    /// Each node's cpu.
    pub cpu: String,
    /// Each node's memory.
    pub memory: String,
    /// Each node's pod slots.
    pub pods: u32,
    /// Extra labels of every node.
    pub labels: BTreeMap<String, String>,
    /// Zones the nodes are spread over round robin (`topology.kubernetes.io/zone` =
    /// `zone-{i % zones}`); 0 for no zone label. A zone in `labels` wins.
    pub zones: usize,
    /// The first this many nodes get no zone label from `zones` (a fleet only partly in
    /// zones).
    pub unzoned: usize,
    /// From binding to Running.
    pub startup_delay: Duration,
    /// Lease duration written on the node Leases (seconds).
    pub lease_duration_seconds: i64,
    /// How often each Lease is renewed.
    pub renew_interval: Duration,
    /// One Lease for all of this agent's nodes (`tessera-sim.{prefix}` in `kube-node-lease`,
    /// each node annotated with it), renewed once per `renew_interval`, instead of one Lease
    /// per node as a kubelet keeps. The agent is one process, so its nodes live and die
    /// together; a node failed on purpose ([`SimAgent::fail_node`]) is first moved to a Lease
    /// of its own that is never renewed again. At rest the fleet then costs one write per
    /// agent per interval, not one per node: 100,000 hollow nodes at 10 s were 10,000 writes
    /// a second.
    pub shared_lease: bool,
    /// The nodes are lent by another shard ([`SimAgent::lent`]): labelled with their loan
    /// and tainted `tessera.io/borrowed=<lender>:NoSchedule`.
    pub lent: Option<LentMark>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            prefix: "sim-node".into(),
            nodes: 100,
            cpu: "8".into(),
            memory: "32Gi".into(),
            pods: 110,
            labels: BTreeMap::new(),
            zones: 0,
            unzoned: 0,
            startup_delay: Duration::from_millis(500),
            lease_duration_seconds: 40,
            renew_interval: Duration::from_secs(10),
            shared_lease: true,
            lent: None,
        }
    }
}

fn res(group: &str, plural: &str) -> &'static Resource {
    find_resource(group, "v1", plural).expect("served resource")
}

/// A set of hollow nodes.
pub struct SimAgent {
    client: Arc<dyn Client>,
    config: SimConfig,
    names: Vec<String>,
    /// The Lease all healthy nodes share, if they do.
    shared: Option<String>,
    failed: Mutex<HashSet<String>>,
    /// Each node's Lease as last written (its resourceVersion the stored one's).
    leases: Mutex<HashMap<String, Lease>>,
    started: Mutex<HashSet<String>>,
    deleting: Mutex<HashSet<String>>,
    next_ip: AtomicU32,
    /// Pod status writes in flight at once (a burst of bindings becomes a steady stream).
    writes: Semaphore,
    metrics: Option<AgentMetrics>,
    runtime_metrics: Option<RuntimeMetrics>,
}

impl SimAgent {
    /// Hollow nodes of `config`, talking to the API through `client`.
    pub fn new(
        client: Arc<dyn Client>,
        config: SimConfig,
        metrics: Option<AgentMetrics>,
        runtime_metrics: Option<RuntimeMetrics>,
    ) -> Arc<SimAgent> {
        let names = (0..config.nodes)
            .map(|i| format!("{}-{i}", config.prefix))
            .collect();
        let shared = config
            .shared_lease
            .then(|| format!("tessera-sim.{}", config.prefix));
        Arc::new(SimAgent {
            client,
            config,
            names,
            shared,
            failed: Mutex::new(HashSet::new()),
            leases: Mutex::new(HashMap::new()),
            started: Mutex::new(HashSet::new()),
            deleting: Mutex::new(HashSet::new()),
            next_ip: AtomicU32::new(0),
            writes: Semaphore::new(64),
            metrics,
            runtime_metrics,
        })
    }

    /// Node `name` of `template`'s shape, lent by another shard and joining the borrower
    /// through `client` (the loan's credential): one node, a Lease of its own.
    pub fn lent(
        client: Arc<dyn Client>,
        template: &SimConfig,
        name: &str,
        mark: LentMark,
    ) -> Arc<SimAgent> {
        let config = SimConfig {
            nodes: 1,
            shared_lease: false,
            lent: Some(mark),
            ..template.clone()
        };
        let agent = SimAgent::new(client, config, None, None);
        // One node, named as it is at home (the agent's names are otherwise `{prefix}-{i}`).
        let mut agent = Arc::into_inner(agent).expect("just made");
        agent.names = vec![name.to_owned()];
        Arc::new(agent)
    }

    /// The node names.
    pub fn node_names(&self) -> &[String] {
        &self.names
    }

    /// The Lease this agent's healthy nodes share, if they share one.
    pub fn shared_lease(&self) -> Option<&str> {
        self.shared.as_deref()
    }

    /// Makes a node fail (no more Lease renewals, its pods left as they are); false if it is
    /// not one of this agent's nodes. With a shared Lease the node first gets a Lease of its
    /// own, renewed this once, and its annotation naming the shared one goes: from then on it
    /// lapses as a dead kubelet's node does, one lease duration after its last renewal, while
    /// its mates go on.
    pub async fn fail_node(&self, name: &str) -> Result<bool, ApiError> {
        if !self.names.iter().any(|n| n == name) {
            return Ok(false);
        }
        if self.shared.is_some() {
            self.renew(name).await?;
            let patch = json!({"metadata": {"annotations": {NODE_LEASE_ANNOTATION: null}}});
            self.client
                .patch(res("", "nodes"), None, name, None, PatchType::Merge, &patch)
                .await?;
        }
        self.failed.lock().insert(name.to_owned());
        if let Some(m) = &self.metrics {
            m.nodes.dec();
        }
        Ok(true)
    }

    fn healthy(&self, node: &str) -> bool {
        !self.failed.lock().contains(node)
    }

    fn count(&self, kind: &str, ok: bool) {
        if let Some(m) = &self.metrics {
            m.writes
                .with_label_values(&[kind, if ok { "ok" } else { "error" }])
                .inc();
        }
    }

    fn node_object(&self, name: &str, i: usize) -> Value {
        let mut labels = json!({
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "tessera.io/sim": "true",
        });
        if self.config.zones > 0 && i >= self.config.unzoned {
            labels["topology.kubernetes.io/zone"] =
                json!(format!("zone-{}", i % self.config.zones));
        }
        for (k, v) in &self.config.labels {
            labels[k] = json!(v);
        }
        let mut spec = json!({"podCIDR": format!("10.{}.{}.0/24", 64 + (i / 256) % 64, i % 256)});
        if let Some(mark) = &self.config.lent {
            for (k, v) in mark.labels() {
                labels[k] = json!(v);
            }
            spec["taints"] = json!([mark.taint()]);
        }
        let c = &self.config;
        let resources = json!({"cpu": c.cpu, "memory": c.memory, "pods": c.pods.to_string(),
            "ephemeral-storage": "100Gi"});
        let now = rfc3339(now_secs());
        let annotations = match &self.shared {
            Some(shared) => json!({ NODE_LEASE_ANNOTATION: shared }),
            None => json!({}),
        };
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec,
            "status": {
                "capacity": resources, "allocatable": resources,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "hollow node is posting ready status",
                     "lastHeartbeatTime": now, "lastTransitionTime": now},
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                     "lastHeartbeatTime": now, "lastTransitionTime": now},
                    {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
                     "lastHeartbeatTime": now, "lastTransitionTime": now},
                    {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
                     "lastHeartbeatTime": now, "lastTransitionTime": now},
                ],
                "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 250, i % 250 + 1)},
                              {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": "v1.32.0-tessera-sim", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64",
                    "containerRuntimeVersion": "sim://1", "kernelVersion": "", "osImage": "Tessera hollow node",
                    "machineID": "", "systemUUID": "", "bootID": ""},
            }
        })
    }

    /// The node annotations that say which Lease stands for the node: the shared one, or
    /// (a null in a merge patch) its own.
    fn lease_annotation(&self) -> Value {
        json!({ NODE_LEASE_ANNOTATION: self.shared })
    }

    /// Registers every node (creating it, or marking an existing one Ready again) and its
    /// Lease (the shared one first, before any node names it); `progress` is called after
    /// each node.
    pub async fn register(&self, progress: impl Fn() + Send + Sync) -> Result<(), ApiError> {
        let nodes = res("", "nodes");
        let _ = self
            .client
            .create(
                res("", "namespaces"),
                None,
                &json!({"metadata": {"name": LEASE_NAMESPACE}}),
            )
            .await;
        if let Some(shared) = &self.shared {
            self.renew(shared).await?;
        }
        let results: Vec<Result<(), ApiError>> = futures::stream::iter(
            self.names.clone().into_iter().enumerate(),
        )
        .map(|(i, name)| {
            let progress = &progress;
            async move {
                let obj = self.node_object(&name, i);
                match self.client.create(nodes, None, &obj).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {
                        // Known from an earlier run: name this run's Lease (the
                        // earlier may have kept Leases apart) and report Ready again.
                        // A lent node's own Lease is the default, and its Node is
                        // the borrower's to change (it may write its status only).
                        if self.config.lent.is_none() {
                            let meta =
                                json!({"metadata": {"annotations": self.lease_annotation()}});
                            self.client
                                .patch(nodes, None, &name, None, PatchType::Merge, &meta)
                                .await?;
                        }
                        let patch = json!({"status": {"conditions": obj["status"]["conditions"]}});
                        self.client
                            .patch(
                                nodes,
                                None,
                                &name,
                                Some("status"),
                                PatchType::StrategicMerge,
                                &patch,
                            )
                            .await?;
                    }
                    Err(e) => return Err(e),
                }
                self.count("node", true);
                if self.shared.is_none() {
                    // Its first renewal's failure is retried by the renewal loop.
                    let _ = self.renew(&name).await;
                }
                progress();
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
        results.into_iter().collect::<Result<(), ApiError>>()?;
        if let Some(m) = &self.metrics {
            m.nodes.set(self.names.len() as i64);
        }
        Ok(())
    }

    /// Renews (or creates) the Lease `name` (a node's, or the shared one), held by `name`.
    /// A renewal hands the API the Lease as its own type (in-process: neither parsed nor
    /// typed again) and keeps only the new resourceVersion of the answer: an idle Lease's
    /// whole cost is this write, every `renew_interval`.
    async fn renew(&self, name: &str) -> Result<(), ApiError> {
        let leases = res("coordination.k8s.io", "leases");
        let cached = self.leases.lock().get(name).cloned();
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let result = match cached {
            Some(mut l) => {
                l.spec.get_or_insert_default().renew_time = Some(now);
                self.replace_lease(leases, l).await
            }
            None => self.first_lease(leases, name, now).await,
        };
        match result {
            Ok(l) => {
                self.leases.lock().insert(name.to_owned(), l);
                self.count("lease", true);
                Ok(())
            }
            Err(e) => {
                // Read it fresh next time.
                self.leases.lock().remove(name);
                self.count("lease", false);
                tracing::debug!(lease = name, error = %e.message, "lease renewal failed");
                Err(e)
            }
        }
    }

    /// Creates the Lease of `node`, or takes over one in place (this agent restarted),
    /// renewed now.
    async fn first_lease(
        &self,
        leases: &'static Resource,
        node: &str,
        now: MicroTime,
    ) -> Result<Lease, ApiError> {
        let as_lease = |v: Value| {
            serde_json::from_value::<Lease>(v)
                .map_err(|e| ApiError::internal(format!("the API answered with no Lease: {e}")))
        };
        let l = json!({"metadata": {"name": node, "namespace": LEASE_NAMESPACE},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": self.config.lease_duration_seconds,
                     "renewTime": rfc3339_micro_now()}});
        match self.client.create(leases, Some(LEASE_NAMESPACE), &l).await {
            Err(e) if e.code == 409 => {}
            created => return as_lease(created?),
        }
        let mut found = as_lease(self.client.get(leases, Some(LEASE_NAMESPACE), node).await?)?;
        let spec = found.spec.get_or_insert_default();
        spec.holder_identity = Some(node.to_owned());
        spec.renew_time = Some(now);
        self.replace_lease(leases, found).await
    }

    /// Writes `lease` over the stored one (409 if another writer moved it); the Lease with
    /// the resourceVersion it now has.
    async fn replace_lease(
        &self,
        leases: &'static Resource,
        mut lease: Lease,
    ) -> Result<Lease, ApiError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let answer = self
            .client
            .update_decoded(
                leases,
                Some(LEASE_NAMESPACE),
                &name,
                Decoded::typed(&lease)?,
            )
            .await?;
        lease.metadata.resource_version = resource_version_of(&answer);
        if lease.metadata.resource_version.is_none() {
            return Err(ApiError::internal(
                "the API answered with no resourceVersion",
            ));
        }
        Ok(lease)
    }

    /// Renews Leases (spread evenly over the renew interval) and runs pods, until dropped.
    pub async fn run(self: Arc<Self>) {
        self.run_with(None).await;
    }

    /// [`SimAgent::run`], reading pods from the process's shared informers when given (the
    /// agent beside a shard's controllers and scheduler in `tessera up`).
    pub async fn run_with(self: Arc<Self>, informers: Option<Arc<Informers>>) {
        // Renewals stop with the agent (a dropped agent's nodes must lapse).
        let _renewer = Tasks(vec![tokio::spawn(self.clone().renew_loop())]);
        let (tx, mut rx) = mpsc::unbounded_channel::<(Arc<Pod>, bool)>();
        let informers = informers
            .unwrap_or_else(|| Informers::new(self.client.clone(), self.runtime_metrics.clone()));
        let informer = informers.get::<Pod>(res("", "pods"));
        let mine: HashSet<String> = self.names.iter().cloned().collect();
        let _subscription = informer.on_change(move |c| {
            let (pod, gone) = match c {
                Change::Added(p) | Change::Updated { new: p, .. } => (p, false),
                Change::Deleted(p) => (p, true),
            };
            let on_mine = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| mine.contains(n));
            if on_mine {
                let _ = tx.send((pod.clone(), gone));
            }
        });
        while let Some((pod, gone)) = rx.recv().await {
            self.handle(pod, gone);
        }
    }

    async fn renew_loop(self: Arc<Self>) {
        let slices = self.config.renew_interval.as_secs().max(1) as usize;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // A slice that took longer than its second delays the next, as a busy kubelet's
        // renewal comes late; missed ticks are not made up in a burst, which after a busy
        // spell renewed above the nominal rate (13,300/s for 100,000 nodes at a 10 s
        // interval, measured at rest after a 100,000-pod run).
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0usize;
        loop {
            tick.tick().await;
            if let Some(shared) = &self.shared {
                if n.is_multiple_of(slices) {
                    let _ = self.renew(shared).await;
                }
                n += 1;
                continue;
            }
            let slice: Vec<&String> = self
                .names
                .iter()
                .enumerate()
                .filter(|(i, name)| i % slices == n % slices && self.healthy(name))
                .map(|(_, name)| name)
                .collect();
            futures::stream::iter(slice)
                .for_each_concurrent(32, |name| {
                    let this = &self;
                    async move {
                        let _ = this.renew(name).await;
                    }
                })
                .await;
            n += 1;
        }
    }

    fn handle(self: &Arc<Self>, pod: Arc<Pod>, gone: bool) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if gone {
            self.started.lock().remove(&uid);
            self.deleting.lock().remove(&uid);
            if let Some(m) = &self.metrics {
                m.pods.dec();
            }
            return;
        }
        if !self.healthy(&node) {
            return;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            if self.deleting.lock().insert(uid.clone()) {
                let this = self.clone();
                tokio::spawn(async move { this.stop(&pod).await });
            }
            return;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if phase == "Pending" && self.started.lock().insert(uid) {
            if let Some(m) = &self.metrics {
                m.pods.inc();
            }
            let this = self.clone();
            tokio::spawn(async move { this.start(pod).await });
        }
    }

    /// Containers stopped: the pod object goes away (grace 0, only this very pod).
    async fn stop(&self, pod: &Pod) {
        let stop_seconds = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(STOP_SECONDS_ANNOTATION))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0) as u64;
        if stop_seconds > 0 {
            tokio::time::sleep(Duration::from_secs(stop_seconds.min(grace))).await;
        }
        let r = crate::remove_stopped(&self.client, pod).await;
        self.count(
            "pod_delete",
            r.is_ok() || r.as_ref().is_err_and(|e| e.code == 404),
        );
    }

    fn pod_ip(&self) -> String {
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (n % (1 << 22)) + 1).to_string()
    }

    async fn start(self: Arc<Self>, pod: Arc<Pod>) {
        tokio::time::sleep(self.config.startup_delay).await;
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let ip = self.pod_ip();
        let started = rfc3339(now_secs());
        let containers: Vec<(String, String)> = pod
            .spec
            .as_ref()
            .map(|s| {
                s.containers
                    .iter()
                    .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let run: Option<u64> = annotations
            .get(RUN_SECONDS_ANNOTATION)
            .and_then(|v| v.parse().ok());
        let exit: i32 = annotations
            .get(EXIT_CODE_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let mut restarts = 0;
        let mut last: Option<Value> = None;
        loop {
            if !self.healthy(&node) {
                return;
            }
            let statuses: Vec<Value> = containers
                .iter()
                .map(|(name, image)| {
                    json!({"name": name, "image": image, "imageID": format!("sim://{image}"),
                        "containerID": format!("sim://{}-{name}", pod.metadata.uid.as_deref().unwrap_or("")),
                        "ready": true, "started": true, "restartCount": restarts,
                        "state": {"running": {"startedAt": rfc3339(now_secs())}},
                        "lastState": last.clone().unwrap_or(json!({}))})
                })
                .collect();
            let status = json!({
                "phase": "Running", "hostIP": node_ip(&node), "podIP": ip, "podIPs": [{"ip": ip}],
                "startTime": started, "containerStatuses": statuses,
                "conditions": conditions(&pod, true),
            });
            if !self.patch_status(&pod, status).await {
                return;
            }
            let Some(secs) = run else { return };
            tokio::time::sleep(Duration::from_secs(secs)).await;
            if !self.healthy(&node)
                || self
                    .deleting
                    .lock()
                    .contains(pod.metadata.uid.as_deref().unwrap_or(""))
            {
                return;
            }
            let finished = rfc3339(now_secs());
            let terminated = json!({"terminated": {"exitCode": exit,
                "reason": if exit == 0 { "Completed" } else { "Error" },
                "startedAt": started, "finishedAt": finished}});
            let restart = match policy.as_str() {
                "Never" => false,
                "OnFailure" => exit != 0,
                _ => true,
            };
            if restart {
                restarts += 1;
                last = Some(terminated);
                continue;
            }
            let statuses: Vec<Value> = containers
                .iter()
                .map(|(name, image)| {
                    json!({"name": name, "image": image, "imageID": format!("sim://{image}"),
                        "ready": false, "started": false, "restartCount": restarts,
                        "state": terminated})
                })
                .collect();
            let status = json!({
                "phase": if exit == 0 { "Succeeded" } else { "Failed" },
                "hostIP": node_ip(&node), "podIP": ip, "podIPs": [{"ip": ip}], "startTime": started,
                "containerStatuses": statuses, "conditions": conditions(&pod, false),
            });
            self.patch_status(&pod, status).await;
            return;
        }
    }

    /// Writes a pod's status, retrying failures with backoff (as a kubelet's status manager
    /// keeps trying) until it is written, the pod is gone, or the node failed.
    async fn patch_status(&self, pod: &Pod, status: Value) -> bool {
        let ns = pod.metadata.namespace.as_deref();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        let body = json!({"status": status});
        let mut wait = Duration::from_millis(50);
        loop {
            let r = {
                let _permit = self.writes.acquire().await;
                self.client
                    .patch(
                        res("", "pods"),
                        ns,
                        name,
                        Some("status"),
                        PatchType::Merge,
                        &body,
                    )
                    .await
            };
            self.count("pod_status", r.is_ok());
            match r {
                Ok(_) => return true,
                Err(e) if e.code == 404 => return false,
                Err(e) => {
                    tracing::debug!(pod = name, error = %e.message, "pod status update failed; retrying");
                    if !self.healthy(node) {
                        return false;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

fn node_ip(node: &str) -> String {
    let i: usize = node
        .rsplit('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    format!("10.0.{}.{}", i / 250, i % 250 + 1)
}

fn conditions(pod: &Pod, ready: bool) -> Vec<Value> {
    let now = rfc3339(now_secs());
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| serde_json::to_value(c).ok())
        .unwrap_or_else(
            || json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now}),
        );
    let s = if ready { "True" } else { "False" };
    let mut out = vec![
        json!({"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now}),
        json!({"type": "Initialized", "status": "True", "lastTransitionTime": now}),
        json!({"type": "Ready", "status": s, "lastTransitionTime": now}),
        json!({"type": "ContainersReady", "status": s, "lastTransitionTime": now}),
        scheduled,
    ];
    if !ready {
        out[2]["reason"] = json!("PodCompleted");
        out[3]["reason"] = json!("PodCompleted");
    }
    out
}
