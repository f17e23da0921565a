//! The process runtime: a node whose containers are real local processes. Each container's
//! `command` + `args` runs with its `env` (literal values) and `workingDir`; the image name
//! is recorded, not pulled. Output goes to a log file per container and restart; exits are
//! reported with their codes, restarts follow `restartPolicy` with back-off
//! (`CrashLoopBackOff` while waiting); a deleted pod's processes get SIGTERM, then SIGKILL
//! after the grace period, and the pod object is removed.
//!
//! Output is kept in the CRI log format and served to the API server for `kubectl logs`
//! ([`crate::logs`]): the node publishes its endpoint in `status.daemonEndpoints`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_apiserver::pki::AGENT_CA_ANNOTATION;
use tessera_client::auth::Tokens;
use tessera_client::catalog::Resource;
use tessera_client::client::Client;
use tessera_client::request::{PatchType, find_resource};
use tessera_client::status::ApiError;
use tessera_client::types::{FEDERATION_LEASE, LentMark, PROCESS_TAINT_KEY, PROCESS_TAINT_VALUE};
use tessera_core::time::{now_secs, rfc3339};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Change, Informer, Scope, Tasks};
use tokio::sync::{mpsc, watch};

use crate::cgroups::{Cgroups, Limits};
use crate::isolation::{IdLease, Isolation};
use crate::logs::{AgentServer, Live, LogFile, pod_dir};
use crate::probe::{Kind, Tally, Timing, Where, attempt};
use crate::sandbox::{Launcher, Spec};
use crate::sim::LEASE_NAMESPACE;

fn res(group: &str, plural: &str) -> &'static Resource {
    find_resource(group, "v1", plural).expect("served resource")
}

/// A process node's settings.
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// The Node's name.
    pub node: String,
    /// Where container logs are kept.
    pub log_dir: PathBuf,
    /// First restart back-off (Kubernetes: 10 s), doubling up to `max_backoff`.
    pub backoff: Duration,
    /// Longest restart back-off (Kubernetes: 5 min).
    pub max_backoff: Duration,
    /// How often the node's Lease is renewed.
    pub renew_interval: Duration,
    /// A container run's log rotates past this size (the kubelet's containerLogMaxSize).
    pub max_log_bytes: u64,
    /// Where the node serves logs to the API server (its InternalIP and port go in the Node).
    pub serve_addr: SocketAddr,
    /// How often container usage is sampled for `kubectl top` (the kubelet's resource
    /// metrics resolution is 15 s; a new container is reported from its first sample).
    pub usage_window: Duration,
    /// Whose credentials the log endpoint accepts (the admin token's node tokens); `None`
    /// serves no logs.
    pub tokens: Option<Tokens>,
    /// How containers are isolated from the host and each other.
    pub isolation: Isolation,
    /// Where pods' sandboxes (roots, volumes) and the host's id claims are kept: private to
    /// the agent (0700).
    pub state_dir: PathBuf,
    /// Where the cgroup hierarchy is mounted.
    pub cgroup_mount: PathBuf,
    /// Most processes (and threads) one container may have (`pids.max`); `None`: no limit.
    pub pids_limit: Option<u64>,
    /// The node is lent by another shard: labelled with its loan and tainted
    /// `tessera.io/borrowed=<lender>:NoSchedule` besides the process taint.
    pub lent: Option<LentMark>,
}

impl ProcessConfig {
    /// Kubernetes' timings for node `node`, logs under `log_dir`.
    pub fn new(node: &str, log_dir: PathBuf) -> Self {
        ProcessConfig {
            node: node.into(),
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(300),
            renew_interval: Duration::from_secs(10),
            max_log_bytes: 10 << 20,
            usage_window: Duration::from_secs(5),
            serve_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tokens: None,
            isolation: Isolation::Sandbox(Launcher {
                exe: std::env::current_exe().unwrap_or_else(|_| "tessera".into()),
                prefix: vec!["sandbox".into()],
            }),
            state_dir: log_dir.with_file_name("pods"),
            cgroup_mount: PathBuf::from("/sys/fs/cgroup"),
            pids_limit: Some(4096),
            lent: None,
            log_dir,
        }
    }
}

/// A node running pods as local processes.
pub struct ProcessAgent {
    client: Arc<dyn Client>,
    config: ProcessConfig,
    /// Per pod UID: a sender that asks its task to stop (with the grace period).
    running: Mutex<HashMap<String, watch::Sender<Option<i64>>>>,
    done: Mutex<HashSet<String>>,
    live: Live,
    /// Running containers by the process (group) id: namespace, pod, container.
    usage: crate::usage::Running,
    stats: crate::usage::Stats,
    /// Running containers, for exec and port-forward.
    targets: crate::streams::Targets,
    events: Recorder,
    cgroups: Cgroups,
    /// The node's own federation fence (see [`crate::fence`]).
    fence: Mutex<crate::fence::NodeFence>,
    /// The running pods of federated `AtMostOnce` workloads, by UID: their grace period.
    at_most_once: Mutex<HashMap<String, i64>>,
    /// Pods stopped by the node's fence.
    fenced_pods: prometheus::IntCounter,
    /// Processes a previous run of this node left running (it was killed outright), killed
    /// when it started again.
    leftovers_killed: prometheus::IntCounter,
}

fn host_memory() -> String {
    let kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
        })
        .unwrap_or(1 << 20);
    format!("{kb}Ki")
}

/// The directory of a pod's logs.
fn logs_of(dir: &Path, pod: &Pod) -> PathBuf {
    let m = &pod.metadata;
    pod_dir(
        dir,
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or(""),
        m.uid.as_deref().unwrap_or(""),
    )
}

/// A container's exit code: its own, or 128 + the signal that ended it.
fn exit_code(status: Option<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.map_or(137, |s| {
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
    })
}

/// A pod's `restartPolicy` (`Always` when unset).
fn restart_policy(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into())
}

/// How often container `name` of `pod` had restarted, as its status last said.
fn prior_restarts(pod: &Pod, name: &str) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name))
        .map_or(0, |c| c.restart_count)
}

/// Signals a container as a container runtime does: SIGTERM to its main process only (as
/// to PID 1 of a container), SIGKILL to its whole process group.
async fn signal_container(pid: u32, signal: &str) {
    if pid > 1 {
        let target = if signal == "KILL" {
            format!("-{pid}")
        } else {
            pid.to_string()
        };
        let _ = tokio::process::Command::new("kill")
            .args([&format!("-{signal}"), "--", &target])
            .stderr(Stdio::null())
            .status()
            .await;
    }
}

/// Kills a container's process group when dropped while it may still run (the agent
/// stopping mid-run), so no process outlives the agent that started it.
struct GroupGuard(u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.0 > 1 {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.0)])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// What a probe is about: the pod (for events), the container, its environment and where
/// it runs.
#[derive(Clone, Copy)]
struct Probed<'a> {
    obj: &'a ObjectRef,
    c: &'a Container,
    env: &'a [(String, String)],
    at: &'a Where,
}

/// A pod's sandbox on this node: its id range, its directory and volumes.
struct PodSandbox {
    launcher: Launcher,
    lease: IdLease,
    volumes: std::collections::BTreeMap<String, PathBuf>,
}

/// What a container may use: its `limits` (CPU, memory) and the node's process cap.
fn limits_of(c: &Container, pids: Option<u64>) -> Limits {
    let limit = |name: &str| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(name))
            .and_then(|q| q.0.parse::<tessera_core::quantity::Quantity>().ok())
    };
    Limits {
        cpu_milli: limit("cpu").map(|q| q.milli_ceil().max(1) as u64),
        memory: limit("memory").map(|q| q.units_ceil().max(1) as u64),
        pids,
    }
}

/// A probe the runtime runs (`grpc` ones are not).
fn runnable(p: Option<&Probe>) -> Option<&Probe> {
    p.filter(|p| p.exec.is_some() || p.tcp_socket.is_some() || p.http_get.is_some())
}

impl ProcessAgent {
    /// A process node.
    pub fn new(client: Arc<dyn Client>, config: ProcessConfig) -> Arc<ProcessAgent> {
        Arc::new(ProcessAgent {
            running: Mutex::new(HashMap::new()),
            done: Mutex::new(HashSet::new()),
            live: Live::default(),
            usage: crate::usage::Running::default(),
            stats: crate::usage::Stats::default(),
            targets: crate::streams::Targets::new(&config.node),
            events: Recorder::new(client.clone(), "kubelet", None),
            cgroups: Cgroups::detect(&config.cgroup_mount),
            fence: Mutex::default(),
            at_most_once: Mutex::default(),
            // Labelled with the node: every process node of a process registers its own.
            fenced_pods: prometheus::IntCounter::with_opts(
                prometheus::Opts::new(
                    "tessera_agent_fenced_pods_total",
                    "Pods of federated AtMostOnce workloads a process node stopped itself because its shard's federation lease ended without a renewal it could read (the shard's control plane frozen or unreachable).",
                )
                .const_label("node", &config.node),
            )
            .expect("a valid metric"),
            leftovers_killed: prometheus::IntCounter::with_opts(
                prometheus::Opts::new(
                    "tessera_agent_leftover_processes_killed_total",
                    "Container processes a previous run of a process node left running (its agent was killed outright), killed before their id ranges were handed out again.",
                )
                .const_label("node", &config.node),
            )
            .expect("a valid metric"),
            config,
            client,
        })
    }

    /// Serves the resource usage of this node's containers ([`crate::usage`]) and its
    /// streaming sessions ([`crate::streams`]) in `registry`.
    pub fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.fenced_pods.clone()))?;
        registry.register(Box::new(self.leftovers_killed.clone()))?;
        self.targets.metrics().register(registry)?;
        registry.register(Box::new(crate::usage::ContainerUsage::new(
            &self.config.node,
            self.usage.clone(),
        )?))
    }

    /// Reads the shard's federation Lease every [`crate::fence::PERIOD`] (each read bounded
    /// by it: a frozen API never holds the fence up) and stops the node's `AtMostOnce` pods
    /// once the lease it last read has ended.
    async fn fence_loop(self: Arc<Self>) {
        let leases = res("coordination.k8s.io", "leases");
        let mut tick = tokio::time::interval(crate::fence::PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let read = tokio::time::timeout(
                crate::fence::PERIOD,
                self.client
                    .get(leases, Some("kube-system"), FEDERATION_LEASE),
            )
            .await;
            let (wall, now) = (std::time::SystemTime::now(), std::time::Instant::now());
            match read {
                Ok(Ok(lease)) => self.fence.lock().observe(Some(&lease), wall, now),
                Ok(Err(e)) if e.code == 404 => self.fence.lock().observe(None, wall, now),
                // No answer: what was read last stands.
                _ => {}
            }
            if !self.fence.lock().lapsed(std::time::Instant::now()) {
                continue;
            }
            let targets: Vec<(String, i64)> = self
                .at_most_once
                .lock()
                .iter()
                .map(|(u, g)| (u.clone(), *g))
                .collect();
            for (uid, grace) in targets {
                let stop = self.running.lock().get(&uid).cloned();
                if let Some(stop) = stop {
                    let _ = stop.send(Some(grace));
                    self.fenced_pods.inc();
                    tracing::warn!(node = %self.config.node, pod_uid = %uid, "stopped an at-most-once pod: the shard's federation lease ended and no renewal could be read");
                }
            }
        }
    }

    /// Whether `pod` belongs to a federated `AtMostOnce` workload: its owner (or the owner's
    /// owner: a CronJob's Job, a Deployment's ReplicaSet) says so. Asked only in a shard that
    /// is in a federation, once per pod start.
    async fn is_at_most_once(&self, pod: &Pod) -> bool {
        let ns = pod.metadata.namespace.as_deref();
        let mut owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| (o.kind.clone(), o.name.clone()));
        for _ in 0..2 {
            let Some((kind, name)) = owner.take() else {
                return false;
            };
            let res = match kind.as_str() {
                "Job" => res("batch", "jobs"),
                "CronJob" => res("batch", "cronjobs"),
                "ReplicaSet" => res("apps", "replicasets"),
                "Deployment" => res("apps", "deployments"),
                "StatefulSet" => res("apps", "statefulsets"),
                _ => return false,
            };
            let Ok(obj) = self.client.get(res, ns, &name).await else {
                return false;
            };
            if let Some(amo) = crate::fence::at_most_once(&obj) {
                return amo;
            }
            owner = obj["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|o| o["controller"] == true)
                .and_then(|o| {
                    Some((
                        o["kind"].as_str()?.to_owned(),
                        o["name"].as_str()?.to_owned(),
                    ))
                });
        }
        false
    }

    /// Where the host's pods claim their id ranges (shared by every node using `state_dir`).
    fn uid_dir(&self) -> PathBuf {
        self.config.state_dir.join("uids")
    }

    /// Patches this node's object (or its `subresource`).
    async fn patch_node(
        &self,
        subresource: Option<&str>,
        kind: PatchType,
        patch: &Value,
    ) -> Result<(), ApiError> {
        self.client
            .patch(
                res("", "nodes"),
                None,
                &self.config.node,
                subresource,
                kind,
                patch,
            )
            .await
            .map(drop)
    }

    /// The address the API server reaches this node at (its `InternalIP`).
    fn address(&self) -> String {
        match self.config.serve_addr.ip() {
            ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
            ip => ip.to_string(),
        }
    }

    /// Starts the endpoint (logs, usage) over TLS, if the node has credentials for it: the
    /// port it serves on and the CA of its certificate, for the Node to publish.
    async fn serve_logs(&self) -> Result<Option<(u16, String)>, ApiError> {
        let Some(tokens) = self.config.tokens.clone() else {
            return Ok(None);
        };
        let tls =
            tessera_apiserver::pki::agent_tls(&self.address(), &self.config.node).map_err(|e| {
                ApiError::internal(format!(
                    "node {}: the endpoint's certificate: {e}",
                    self.config.node
                ))
            })?;
        let router = AgentServer::new(
            &self.config.node,
            self.config.log_dir.clone(),
            tokens,
            self.live.clone(),
            self.stats.clone(),
            self.targets.clone(),
        )
        .router();
        let addr = tessera_apiserver::serve::serve_tls_pem(
            self.config.serve_addr,
            &tls.cert_pem,
            &tls.key_pem,
            router,
            tessera_apiserver::serve::ConnectionLimits::default(),
        )
        .await
        .map_err(|e| {
            ApiError::internal(format!(
                "node {}: serving its endpoint on {}: {e}",
                self.config.node, self.config.serve_addr
            ))
        })?;
        tracing::info!(node = %self.config.node, %addr, "serving container logs and usage over TLS");
        Ok(Some((addr.port(), tls.ca_pem)))
    }

    /// Registers the Node (this machine's cpus and memory, its log endpoint) and its Lease.
    /// Refuses to, if containers are to be sandboxed and the agent is not root (only root may
    /// map a range of host ids into a user namespace).
    pub async fn register(&self) -> Result<(), ApiError> {
        if matches!(self.config.isolation, Isolation::Sandbox(_)) {
            if !rustix::process::geteuid().is_root() {
                return Err(ApiError::internal(format!(
                    "process node {}: sandboxing containers needs root (user namespaces with a \
                     range of host ids per pod); run the agent as root, or pass \
                     --process-isolation=off for trusted code on a developer machine",
                    self.config.node
                )));
            }
            crate::data_dir_private(&self.config.state_dir).map_err(|e| {
                ApiError::internal(format!("{}: {e}", self.config.state_dir.display()))
            })?;
            let (dir, node) = (self.uid_dir(), self.config.node.clone());
            let killed = tokio::task::spawn_blocking(move || IdLease::release_stale(&dir, &node))
                .await
                .unwrap_or(0);
            self.leftovers_killed.inc_by(killed as u64);
            match self.cgroups.unavailable() {
                Some(why) => tracing::warn!(node = %self.config.node, %why,
                    "container resource limits are NOT enforced"),
                None => tracing::info!(node = %self.config.node, cgroups = ?self.cgroups,
                    "container resource limits enforced through cgroups"),
            }
        } else {
            tracing::warn!(node = %self.config.node,
                "process isolation is off: containers run with the agent's rights");
        }
        let (port, agent_ca) = self.serve_logs().await?.unwrap_or_default();
        let ip = self.address();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let now = rfc3339(now_secs());
        let resources = json!({"cpu": cpus.to_string(), "memory": host_memory(), "pods": "110"});
        // Scheduling here is opt-in: the taint keeps pods off unless they tolerate it (and a
        // tenant's pods may tolerate it only if its Tenant allows process nodes).
        let mut node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.config.node, "labels": {"kubernetes.io/hostname": self.config.node,
                "kubernetes.io/os": "linux", PROCESS_TAINT_KEY: PROCESS_TAINT_VALUE},
                "annotations": {AGENT_CA_ANNOTATION: agent_ca}},
            "spec": {"taints": [{"key": PROCESS_TAINT_KEY, "value": PROCESS_TAINT_VALUE, "effect": "NoSchedule"}]},
            "status": {"capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "process agent is posting ready status",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "addresses": [{"type": "InternalIP", "address": ip},
                              {"type": "Hostname", "address": self.config.node}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                "nodeInfo": {"kubeletVersion": "v1.32.0-tessera-process", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
                    "containerRuntimeVersion": "process://1", "kernelVersion": "", "osImage": "",
                    "machineID": "", "systemUUID": "", "bootID": ""}}});
        if let Some(mark) = &self.config.lent {
            for (k, v) in mark.labels() {
                node["metadata"]["labels"][k] = json!(v);
            }
            node["spec"]["taints"]
                .as_array_mut()
                .expect("taints")
                .push(mark.taint());
        }
        match self.client.create(res("", "nodes"), None, &node).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {
                // Registered before: the endpoint moved with this start. Its new CA first,
                // then its new port (the API server reaches the old port, gone, meanwhile;
                // never the new port with the old CA).
                let patch = json!({"metadata": {"annotations": {AGENT_CA_ANNOTATION: agent_ca}}});
                self.patch_node(None, PatchType::Merge, &patch).await?;
                let st = &node["status"];
                let patch = json!({"status": {"conditions": st["conditions"],
                    "addresses": st["addresses"], "daemonEndpoints": st["daemonEndpoints"]}});
                self.patch_node(Some("status"), PatchType::StrategicMerge, &patch)
                    .await?;
                // A node registered before it carried the taint gets it (added to whatever
                // taints an administrator set since).
                let now = self
                    .client
                    .get(res("", "nodes"), None, &self.config.node)
                    .await?;
                let mut taints = now["spec"]["taints"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !taints.iter().any(|t| t["key"] == PROCESS_TAINT_KEY) {
                    taints.push(node["spec"]["taints"][0].clone());
                    let patch = json!({"metadata": {"resourceVersion": now["metadata"]["resourceVersion"]},
                        "spec": {"taints": taints}});
                    self.patch_node(None, PatchType::Merge, &patch).await?;
                }
            }
            Err(e) => return Err(e),
        }
        let _ = self
            .client
            .create(
                res("", "namespaces"),
                None,
                &json!({"metadata": {"name": LEASE_NAMESPACE}}),
            )
            .await;
        self.renew().await;
        Ok(())
    }

    async fn renew(&self) {
        let leases = res("coordination.k8s.io", "leases");
        let now = rfc3339(now_secs());
        let l = json!({"metadata": {"name": self.config.node, "namespace": LEASE_NAMESPACE},
            "spec": {"holderIdentity": self.config.node, "leaseDurationSeconds": 40, "renewTime": now}});
        if let Err(e) = self.client.create(leases, Some(LEASE_NAMESPACE), &l).await
            && e.code == 409
        {
            let patch = json!({"spec": {"renewTime": now, "holderIdentity": self.config.node}});
            let _ = self
                .client
                .patch(
                    leases,
                    Some(LEASE_NAMESPACE),
                    &self.config.node,
                    None,
                    PatchType::Merge,
                    &patch,
                )
                .await;
        }
    }

    /// Renews the Lease and runs the node's pods until dropped.
    pub async fn run(self: Arc<Self>) {
        let reporter = tokio::spawn(crate::usage::report_every(
            self.usage.clone(),
            self.stats.clone(),
            self.config.usage_window,
        ));
        let this = self.clone();
        let renewer = tokio::spawn(async move {
            let mut tick = tokio::time::interval(this.config.renew_interval);
            loop {
                tick.tick().await;
                this.renew().await;
            }
        });
        let (tx, mut rx) = mpsc::unbounded_channel::<(Arc<Pod>, bool)>();
        // Only this node's pods, as the kubelet watches (`spec.nodeName=<node>`): the
        // agent's work does not grow with the shard.
        let scope = Scope {
            field_selector: format!("spec.nodeName={}", self.config.node).parse().ok(),
            ..Scope::default()
        };
        let informer = Informer::<Pod>::new(self.client.clone(), res("", "pods"), scope, None);
        let node = self.config.node.clone();
        let _subscription = informer.on_change(move |c| {
            let (p, gone) = match c {
                Change::Added(p) | Change::Updated { new: p, .. } => (p, false),
                Change::Deleted(p) => (p, true),
            };
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()) {
                let _ = tx.send((p.clone(), gone));
            }
        });
        // The Lease renewals, usage reports and the watch stop with the agent.
        let fence = tokio::spawn(self.clone().fence_loop());
        let _tasks = Tasks(vec![reporter, renewer, fence, tokio::spawn(informer.run())]);
        // The pods' tasks live as long as this one: when the agent stops, so do its
        // containers (their process groups are killed as the tasks are dropped).
        let mut pods = tokio::task::JoinSet::new();
        while let Some((pod, gone)) = rx.recv().await {
            self.handle(pod, gone, &mut pods);
            while pods.try_join_next().is_some() {}
        }
    }

    fn handle(self: &Arc<Self>, pod: Arc<Pod>, gone: bool, pods: &mut tokio::task::JoinSet<()>) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if gone {
            if let Some(stop) = self.running.lock().remove(&uid) {
                let _ = stop.send(Some(0));
            }
            self.done.lock().remove(&uid);
            // The kubelet keeps a pod's logs until the pod object is gone.
            let dir = logs_of(&self.config.log_dir, &pod);
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(error = %e, dir = %dir.display(), "removing a pod's logs");
            }
            return;
        }
        if pod.metadata.deletion_timestamp.is_some() {
            let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
            let stop = self.running.lock().get(&uid).cloned();
            match stop {
                Some(s) => {
                    let _ = s.send(Some(grace));
                }
                None => {
                    // Nothing runs (finished, or never started): the object can go.
                    let this = self.clone();
                    pods.spawn(async move { this.remove(&pod).await });
                }
            }
            return;
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        let known = self.running.lock().contains_key(&uid) || self.done.lock().contains(&uid);
        // A pod Running here that this run of the agent does not know ran under a previous
        // run, killed outright: its containers were killed when this run started
        // (`IdLease::release_stale`). As a kubelet after a reboot: they start again, counted
        // as restarts — or, under `restartPolicy: Never`, the pod fails.
        let resumed = phase == "Running" && !known;
        if resumed && restart_policy(&pod) == "Never" {
            self.done.lock().insert(uid);
            let this = self.clone();
            pods.spawn(async move { this.lost(&pod).await });
            return;
        }
        if (phase == "Pending" || resumed) && !known {
            let (tx, rx) = watch::channel(None);
            self.running.lock().insert(uid.clone(), tx);
            let this = self.clone();
            pods.spawn(async move {
                // In a federated shard, which pods the node's own fence must stop.
                let federated = this.fence.lock().knows_federation();
                if federated && this.is_at_most_once(&pod).await {
                    let grace = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                        .unwrap_or(30);
                    this.at_most_once.lock().insert(uid.clone(), grace);
                }
                if resumed {
                    tracing::info!(node = %this.config.node, pod = ?pod.metadata.name,
                        "starting again the containers of a pod a previous run of this node ran");
                }
                let deleted = this.run_pod(&pod, rx, resumed).await;
                this.at_most_once.lock().remove(&uid);
                this.running.lock().remove(&uid);
                this.done.lock().insert(uid);
                if deleted {
                    this.remove(&pod).await;
                }
            });
        }
    }

    /// The pod object goes (grace 0, this very pod only): its processes are stopped.
    async fn remove(&self, pod: &Pod) {
        let _ = crate::remove_stopped(&self.client, pod).await;
    }

    async fn patch_status(&self, pod: &Pod, status: Value) {
        let mut wait = Duration::from_millis(50);
        for _ in 0..10 {
            match self
                .client
                .patch(
                    res("", "pods"),
                    pod.metadata.namespace.as_deref(),
                    pod.metadata.name.as_deref().unwrap_or(""),
                    Some("status"),
                    PatchType::Merge,
                    &json!({"status": status}),
                )
                .await
            {
                Ok(_) => return,
                Err(e) if e.code == 404 => return,
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        }
    }

    /// A pod whose containers a previous run of this node ran and that may not restart
    /// (`restartPolicy: Never`): they are gone, so it fails, as a kubelet reports containers
    /// it can no longer find.
    async fn lost(&self, pod: &Pod) {
        let spec = pod.spec.clone().unwrap_or_default();
        let statuses: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| json!({"name": c.name, "image": c.image, "imageID": "", "ready": false,
                "started": false, "restartCount": prior_restarts(pod, &c.name),
                "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                    "message": "The container could not be located when the pod was terminated: its node's agent was killed and started again"}}}))
            .collect();
        self.patch_status(
            pod,
            json!({"phase": "Failed", "containerStatuses": statuses,
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": rfc3339(now_secs())}]}),
        )
        .await;
    }

    /// Runs every container of the pod until the pod is finished or deleted; true if it was
    /// deleted. `resumed`: a previous run of this node ran it (its restart counts go on).
    async fn run_pod(&self, pod: &Pod, stop: watch::Receiver<Option<i64>>, resumed: bool) -> bool {
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = restart_policy(pod);
        let started = rfc3339(now_secs());
        let statuses: Arc<Mutex<Vec<Value>>> = Arc::new(Mutex::new(
            spec.containers
                .iter()
                .map(|c| {
                    let restarts = if resumed { prior_restarts(pod, &c.name) + 1 } else { 0 };
                    json!({"name": c.name, "image": c.image, "imageID": "", "ready": false,
                    "started": false, "restartCount": restarts, "state": {"waiting": {"reason": "ContainerCreating"}}})
                })
                .collect(),
        ));
        let report = |phase: &str, statuses: &Arc<Mutex<Vec<Value>>>| {
            let list = statuses.lock().clone();
            let ready = list.iter().all(|s| s["ready"] == true);
            let now = rfc3339(now_secs());
            let cond = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now});
            json!({"phase": phase, "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                "startTime": started, "containerStatuses": list,
                "conditions": [cond("PodScheduled", true), cond("Initialized", true),
                    cond("Ready", ready && phase == "Running"), cond("ContainersReady", ready && phase == "Running")]})
        };
        let first = if resumed { "Running" } else { "Pending" };
        self.patch_status(pod, report(first, &statuses)).await;
        let sandbox = match self.sandbox(pod, &statuses, stop.clone()).await {
            Ok(s) => s,
            Err(()) => {
                // Deleted while its sandbox could not be made.
                self.cleanup(pod);
                return stop.borrow().is_some();
            }
        };
        let runs = spec.containers.iter().enumerate().map(|(i, c)| {
            let statuses = statuses.clone();
            let stop = stop.clone();
            let policy = policy.clone();
            let sandbox = sandbox.as_ref();
            async move {
                self.run_container(pod, i, c, &policy, statuses, stop, sandbox)
                    .await
            }
        });
        // Each container reports its own transitions through the shared list.
        let tick = async {
            let mut last = Value::Null;
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let now = statuses.lock().clone();
                if Value::Array(now.clone()) != last {
                    last = Value::Array(now);
                    self.patch_status(pod, report("Running", &statuses)).await;
                }
            }
        };
        let results = tokio::select! {
            r = join_all(runs) => r,
            () = tick => unreachable!("the status loop never ends"),
        };
        drop(sandbox);
        self.cleanup(pod);
        let deleted = stop.borrow().is_some();
        if !deleted {
            let failed = results.iter().any(|code| *code != 0);
            let phase = if failed { "Failed" } else { "Succeeded" };
            self.patch_status(pod, report(phase, &statuses)).await;
        }
        deleted
    }

    /// The pod's sandbox (none when isolation is off or the pod is privileged): an id range
    /// and its volumes. What cannot be made is reported in every container's status and
    /// tried again with back-off, as the kubelet retries mounts; `Err` if the pod was deleted
    /// meanwhile.
    async fn sandbox(
        &self,
        pod: &Pod,
        statuses: &Arc<Mutex<Vec<Value>>>,
        mut stop: watch::Receiver<Option<i64>>,
    ) -> Result<Option<PodSandbox>, ()> {
        let Isolation::Sandbox(launcher) = &self.config.isolation else {
            return Ok(None);
        };
        if crate::isolation::privileged(pod) {
            return Ok(None);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = self.config.state_dir.join(&uid);
        let mut backoff = self.config.backoff;
        loop {
            let made = async {
                let lease = IdLease::take(&self.uid_dir(), &self.config.node, &uid)?;
                let volumes = crate::isolation::prepare_volumes(
                    &self.client,
                    pod,
                    &dir.join("volumes"),
                    Some(crate::isolation::Owner::of(pod, lease.ids)),
                )
                .await?;
                Ok::<_, String>(PodSandbox {
                    launcher: launcher.clone(),
                    lease,
                    volumes,
                })
            };
            match made.await {
                Ok(s) => return Ok(Some(s)),
                Err(why) => {
                    for s in statuses.lock().iter_mut() {
                        s["state"] = json!({"waiting": {"reason": "CreateContainerConfigError", "message": why.clone()}});
                    }
                    self.events.event(
                        &ObjectRef::new("v1", "Pod", &pod.metadata),
                        EventType::Warning,
                        "FailedMount",
                        &why,
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(Option::is_some) => return Err(()),
                    }
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        }
    }

    /// Removes what the pod's sandbox left on the host: cgroups, roots, volumes.
    fn cleanup(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.cgroups.remove_pod(&self.config.node, &uid);
        let dir = self.config.state_dir.join(&uid);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, dir = %dir.display(), "removing a pod's sandbox");
        }
    }

    /// Runs a container's probes; returns (with the grace period to kill it in) once its
    /// startup or liveness probe has failed `failureThreshold` times in a row.
    async fn supervise(
        &self,
        pod: &Pod,
        c: &Container,
        env: &[(String, String)],
        i: usize,
        statuses: &Arc<Mutex<Vec<Value>>>,
        at: &Where,
    ) -> u64 {
        let obj = ObjectRef::new("v1", "Pod", &pod.metadata);
        let who = Probed {
            obj: &obj,
            c,
            env,
            at,
        };
        for (kind, p) in [
            (Kind::Startup, &c.startup_probe),
            (Kind::Liveness, &c.liveness_probe),
            (Kind::Readiness, &c.readiness_probe),
        ] {
            if p.is_some() && runnable(p.as_ref()).is_none() {
                self.events.event(&obj, EventType::Warning, "ProbeNotSupported",
                    &format!("{} probe of container {} is not run: the process runtime runs exec, tcpSocket and httpGet probes", kind.as_str(), c.name));
            }
        }
        let grace = |p: &Probe| {
            p.termination_grace_period_seconds
                .or(pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds))
                .unwrap_or(30)
                .max(0) as u64
        };
        let killing = |p: &Probe, kind: Kind| {
            self.events.event(
                &obj,
                EventType::Normal,
                "Killing",
                &format!(
                    "Container {} failed {} probe, will be restarted",
                    c.name,
                    kind.as_str().to_lowercase()
                ),
            );
            grace(p)
        };
        if let Some(p) = runnable(c.startup_probe.as_ref()) {
            let mut passed = false;
            self.probe_loop(&who, Kind::Startup, p, |ok| {
                passed = ok;
                true
            })
            .await;
            if !passed {
                return killing(p, Kind::Startup);
            }
            let mut s = statuses.lock();
            s[i]["started"] = json!(true);
            s[i]["ready"] = json!(runnable(c.readiness_probe.as_ref()).is_none());
        }
        let readiness = async {
            match runnable(c.readiness_probe.as_ref()) {
                Some(p) => {
                    self.probe_loop(&who, Kind::Readiness, p, |ok| {
                        statuses.lock()[i]["ready"] = json!(ok);
                        false
                    })
                    .await
                }
                None => std::future::pending().await,
            }
        };
        let liveness = async {
            match runnable(c.liveness_probe.as_ref()) {
                Some(p) => {
                    self.probe_loop(&who, Kind::Liveness, p, |ok| !ok).await;
                    killing(p, Kind::Liveness)
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            grace = liveness => grace,
            () = readiness => unreachable!("readiness probing never stops"),
        }
    }

    /// Runs probe `p` every period; `decide` hears each threshold reached (true: passed)
    /// and says whether to stop.
    async fn probe_loop(
        &self,
        who: &Probed<'_>,
        kind: Kind,
        p: &Probe,
        mut decide: impl FnMut(bool) -> bool,
    ) {
        let Probed { obj, c, env, at } = *who;
        let t = Timing::of(p);
        tokio::time::sleep(t.initial_delay).await;
        let mut tally = Tally::default();
        loop {
            let result = attempt(p, c, env, "127.0.0.1", t.timeout, at).await;
            if let Err(why) = &result {
                self.events.event(
                    obj,
                    EventType::Warning,
                    "Unhealthy",
                    &format!("{} probe failed: {why}", kind.as_str()),
                );
            }
            if let Some(passed) = tally.record(result.is_ok(), &t)
                && decide(passed)
            {
                return;
            }
            tokio::time::sleep(t.period).await;
        }
    }

    /// The sandbox spec of container `c`, and its cgroups made with its limits.
    fn container_spec(&self, pod: &Pod, c: &Container, sb: &PodSandbox) -> Result<Spec, String> {
        let spec = pod.spec.clone().unwrap_or_default();
        if spec.host_pid.unwrap_or(false) {
            return Err("hostPID is not offered by the process runtime's sandbox".into());
        }
        let identity = crate::isolation::identity(pod, c)?;
        let binds = crate::isolation::binds(c, &sb.volumes)?;
        let cgroups = self.cgroups.create(
            &self.config.node,
            pod.metadata.uid.as_deref().unwrap_or(""),
            &c.name,
            limits_of(c, self.config.pids_limit),
        )?;
        Ok(Spec {
            prefix: sb.launcher.prefix.clone(),
            ids: sb.lease.ids,
            identity,
            hostname: spec
                .hostname
                .clone()
                .or_else(|| pod.metadata.name.clone())
                .unwrap_or_default(),
            binds,
            host_network: spec.host_network.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
            cgroups,
        })
    }

    /// Runs one container, restarting per policy; its final exit code.
    #[allow(clippy::too_many_arguments)]
    async fn run_container(
        &self,
        pod: &Pod,
        i: usize,
        c: &Container,
        policy: &str,
        statuses: Arc<Mutex<Vec<Value>>>,
        mut stop: watch::Receiver<Option<i64>>,
        sandbox: Option<&PodSandbox>,
    ) -> i32 {
        let mut restarts = statuses.lock()[i]["restartCount"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        let mut backoff = self.config.backoff;
        loop {
            let env = match crate::env::resolve(&self.client, pod, c).await {
                Ok(env) => env,
                Err(why) => {
                    statuses.lock()[i]["state"] = json!({"waiting": {"reason": "CreateContainerConfigError", "message": why}});
                    // As the kubelet: try again later (the ConfigMap may yet be created).
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(Option::is_some) => return 1,
                    }
                    backoff = (backoff * 2).min(self.config.max_backoff);
                    continue;
                }
            };
            let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
            argv.extend(c.args.clone().unwrap_or_default());
            let argv: Vec<String> = argv.iter().map(|a| crate::env::expand(a, &env)).collect();
            if argv.is_empty() {
                statuses.lock()[i]["state"] = json!({"waiting": {"reason": "CreateContainerConfigError",
                    "message": "the process runtime runs a container's command and args; this one has none (images are not pulled)"}});
                return 1;
            }
            let path =
                crate::logs::log_path(&logs_of(&self.config.log_dir, pod), &c.name, restarts);
            let log = match LogFile::create(&path, self.config.max_log_bytes) {
                Ok(f) => Arc::new(Mutex::new(f)),
                Err(e) => {
                    statuses.lock()[i]["state"] = json!({"waiting": {"reason": "RunContainerError",
                        "message": format!("cannot create the log {}: {e}", path.display())}});
                    return 1;
                }
            };
            let (mut command, spec) = match sandbox {
                None => (
                    crate::env::in_container(c, &env, &argv[0], &argv[1..]),
                    None,
                ),
                Some(sb) => match self.container_spec(pod, c, sb) {
                    Ok(spec) => {
                        let mut command = sb.launcher.exec(&spec, &argv);
                        crate::env::with_env(&mut command, &env);
                        (command, Some(spec))
                    }
                    Err(why) => {
                        statuses.lock()[i]["state"] = json!({"waiting": {"reason": "CreateContainerConfigError", "message": why}});
                        return 1;
                    }
                },
            };
            let ooms = spec
                .as_ref()
                .map_or(0, |s| self.cgroups.oom_kills(&s.cgroups));
            // `stdin: true`: the container reads what `kubectl attach -i` sends.
            if c.stdin == Some(true) {
                command.stdin(Stdio::piped());
            }
            let child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                // Its own process group: what the container starts is killed with it.
                .process_group(0)
                .spawn();
            let mut child = match child {
                Ok(ch) => ch,
                Err(e) => {
                    statuses.lock()[i]["state"] = json!({"waiting": {"reason": "RunContainerError",
                        "message": format!("cannot start {:?}: {e}", argv[0])}});
                    return 127;
                }
            };
            self.live.lock().insert(path.clone());
            let mut pumps = Vec::new();
            let (output, _) = tokio::sync::broadcast::channel(256);
            if let Some(out) = child.stdout.take() {
                pumps.push(tokio::spawn(crate::logs::pump(
                    out,
                    "stdout",
                    log.clone(),
                    Some(output.clone()),
                )));
            }
            if let Some(err) = child.stderr.take() {
                pumps.push(tokio::spawn(crate::logs::pump(
                    err,
                    "stderr",
                    log.clone(),
                    Some(output.clone()),
                )));
            }
            let stdin = child.stdin.take().map(crate::streams::attach::stdin_writer);
            let started_at = rfc3339(now_secs());
            {
                let mut s = statuses.lock();
                s[i]["state"] = json!({"running": {"startedAt": started_at}});
                // Probes decide these when there are any.
                s[i]["started"] = json!(runnable(c.startup_probe.as_ref()).is_none());
                s[i]["ready"] = json!(
                    s[i]["started"] == true && runnable(c.readiness_probe.as_ref()).is_none()
                );
                s[i]["restartCount"] = json!(restarts);
                s[i]["containerID"] = json!(format!("process://{}", child.id().unwrap_or(0)));
            }
            let pid = child.id().unwrap_or(0);
            let at = match (sandbox, &spec) {
                (Some(sb), Some(spec)) => Where::Sandbox {
                    launcher: sb.launcher.clone(),
                    supervisor: pid,
                    identity: spec.identity.clone(),
                    cgroups: spec.cgroups.clone(),
                },
                _ => Where::Host,
            };
            // Exec and port-forward reach it while it runs (and not once this task is gone).
            let _target = self.targets.running(
                pod.metadata.uid.as_deref().unwrap_or_default(),
                crate::streams::Target {
                    at: at.clone(),
                    env: env.clone(),
                    container: c.clone(),
                    output,
                    stdin,
                },
            );
            // If this task is dropped (the agent stops), the container's whole group goes too.
            let mut group = GroupGuard(pid);
            self.usage.lock().insert(
                pid,
                (
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    pod.metadata.name.clone().unwrap_or_default(),
                    c.name.clone(),
                    std::time::Instant::now(),
                ),
            );
            // The process ends; or the pod is deleted (with its grace period); or a startup
            // or liveness probe fails for good (the container is killed and restarted).
            let ended = tokio::select! {
                status = child.wait() => Ok(exit_code(status.ok())),
                g = stop.wait_for(Option::is_some) => Err(g.map_or(30, |r| r.unwrap_or(30)).max(0) as u64),
                grace = self.supervise(pod, c, &env, i, &statuses, &at) => Err(grace),
            };
            let code = match ended {
                Ok(code) => code,
                Err(grace) => {
                    signal_container(pid, "TERM").await;
                    match tokio::time::timeout(Duration::from_secs(grace), child.wait()).await {
                        Ok(s) => exit_code(s.ok()),
                        Err(_) => {
                            signal_container(pid, "KILL").await;
                            let _ = child.wait().await;
                            137
                        }
                    }
                }
            };
            // What the container left running in its group goes with it.
            signal_container(pid, "KILL").await;
            group.0 = 0;
            self.usage.lock().remove(&pid);
            drop(_target);
            // The output is complete once the pipes close (a child the container left
            // running may hold them: its output is cut off after a second).
            for p in pumps {
                if tokio::time::timeout(Duration::from_secs(1), p)
                    .await
                    .is_err()
                {
                    tracing::debug!(container = %c.name, "output still open after exit");
                }
            }
            self.live.lock().remove(&path);
            let oom_killed = spec
                .as_ref()
                .is_some_and(|s| self.cgroups.oom_kills(&s.cgroups) > ooms);
            let reason = match code {
                0 => "Completed",
                _ if oom_killed => "OOMKilled",
                _ => "Error",
            };
            let finished = json!({"terminated": {"exitCode": code, "reason": reason,
                "startedAt": started_at, "finishedAt": rfc3339(now_secs())}});
            {
                let mut s = statuses.lock();
                s[i]["state"] = finished.clone();
                s[i]["ready"] = json!(false);
            }
            if stop.borrow().is_some() {
                return code;
            }
            let again = match policy {
                "Never" => false,
                "OnFailure" => code != 0,
                _ => true,
            };
            if !again {
                return code;
            }
            {
                let mut s = statuses.lock();
                s[i]["lastState"] = finished;
                s[i]["state"] = json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off {}s restarting failed container={} pod={}",
                        backoff.as_secs(), c.name, pod.metadata.name.as_deref().unwrap_or(""))}});
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.wait_for(Option::is_some) => return code,
            }
            backoff = (backoff * 2).min(self.config.max_backoff);
            restarts += 1;
        }
    }
}
