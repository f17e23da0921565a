//! An example framework: a batch runner that takes tasks from a file and runs each once
//! through offers. It packs pending tasks into each offer first-fit, declines offers it has
//! nothing for, and finishes when every task has finished or failed. `tessera framework
//! batch` runs it; `tessera bench offers` runs several at once.
//!
//! The file has one task per line, `name cpu memory seconds` (`etl-1 500m 256Mi 3`);
//! `seconds` is how long the task runs on a simulated node. `#` starts a comment.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tessera_core::quantity::Quantity;
use tessera_proto::offers::v1 as pb;
use tessera_proto::offers::v1::scheduler_client::SchedulerClient;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// Times a task whose offered room went to a pod first is launched again.
const MAX_RETRIES: u32 = 5;

/// One task to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchTask {
    /// Its name (unique in the file).
    pub name: String,
    /// cpu, milli.
    pub cpu_milli: i64,
    /// Memory, bytes.
    pub memory: i64,
    /// How long it runs (on a simulated node).
    pub seconds: u64,
}

/// Parses a task file; errors name the line and what to fix.
pub fn parse_tasks(text: &str) -> Result<Vec<BatchTask>, String> {
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let at = |what: String| format!("line {}: {what}", i + 1);
        let [name, cpu, mem, secs] = f.as_slice() else {
            return Err(at(format!(
                "{line:?} is not `name cpu memory seconds` (e.g. `etl-1 500m 256Mi 3`)"
            )));
        };
        let cpu: Quantity = cpu.parse().map_err(|e| at(format!("cpu {cpu:?}: {e}")))?;
        let mem: Quantity = mem
            .parse()
            .map_err(|e| at(format!("memory {mem:?}: {e}")))?;
        let seconds = secs
            .parse()
            .map_err(|_| at(format!("seconds {secs:?} is not a whole number")))?;
        if !names.insert((*name).to_owned()) {
            return Err(at(format!("task {name:?} is listed twice")));
        }
        out.push(BatchTask {
            name: (*name).to_owned(),
            cpu_milli: cpu.milli_ceil(),
            memory: mem.units_ceil(),
            seconds,
        });
    }
    Ok(out)
}

/// Where and as whom the framework runs.
#[derive(Clone, Debug)]
pub struct BatchConfig {
    /// The offers endpoint (`https://127.0.0.1:9466`).
    pub endpoint: String,
    /// The CA (PEM) of the endpoint's certificate.
    pub ca_pem: String,
    /// A bearer token allowed to run pods in `namespace`.
    pub token: String,
    /// The framework's name, role and weight.
    pub name: String,
    /// Its role (empty: a role of its own).
    pub role: String,
    /// Its DRF weight.
    pub weight: f64,
    /// The namespace its tasks run in.
    pub namespace: String,
    /// The image its tasks run.
    pub image: String,
    /// Seconds its tasks outlive a disconnection.
    pub failover_timeout_seconds: i64,
    /// Only nodes with these labels will do (`tessera.io/shard` names a node's shard in
    /// offers from the federation); others are declined for a minute.
    pub node_selector: BTreeMap<String, String>,
}

/// How a run went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchReport {
    /// The framework's id.
    pub framework_id: String,
    /// Tasks that finished.
    pub finished: usize,
    /// Tasks that failed (with their messages).
    pub failed: Vec<(String, String)>,
    /// Offers received, accepted and declined.
    pub offers: usize,
    /// Offers accepted.
    pub accepted: usize,
    /// Offers declined.
    pub declined: usize,
    /// Offers rescinded before it answered.
    pub rescinded: usize,
    /// Tasks launched again because their offered room had gone to a pod.
    pub retried: usize,
    /// cpu (milli) of its tasks running, sampled at each offer round it saw.
    pub running_cpu_samples: Vec<i64>,
}

/// Something the runner saw, for a caller that shows progress.
#[derive(Clone, Debug)]
pub enum Progress {
    /// Subscribed with this id.
    Subscribed(String),
    /// A task's state changed.
    Task(pb::TaskStatus),
}

/// Runs `tasks` through offers at `cfg.endpoint` until each finished or failed (a failed
/// task is not retried, unless its offered room had gone to a pod); `progress` hears each
/// step.
pub async fn run(
    cfg: &BatchConfig,
    tasks: Vec<BatchTask>,
    mut progress: impl FnMut(Progress),
) -> Result<BatchReport, String> {
    let endpoint = Endpoint::from_shared(cfg.endpoint.clone())
        .map_err(|e| format!("{}: {e}", cfg.endpoint))?
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&cfg.ca_pem)))
        .map_err(|e| format!("TLS: {e}"))?
        .connect_timeout(Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connecting to {}: {e}", cfg.endpoint))?;
    let mut client = SchedulerClient::new(channel);
    let (tx, rx) = mpsc::unbounded_channel::<pb::Call>();
    let call = |c: pb::call::Call| pb::Call { call: Some(c) };
    let _ = tx.send(call(pb::call::Call::Subscribe(pb::call::Subscribe {
        framework: Some(pb::FrameworkInfo {
            name: cfg.name.clone(),
            role: cfg.role.clone(),
            weight: cfg.weight,
            namespace: cfg.namespace.clone(),
            id: String::new(),
            failover_timeout_seconds: cfg.failover_timeout_seconds,
        }),
    })));
    let mut request = tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    let auth = format!("Bearer {}", cfg.token)
        .parse()
        .map_err(|_| "the token is not valid in a header".to_owned())?;
    request.metadata_mut().insert("authorization", auth);
    let mut events = client
        .session(request)
        .await
        .map_err(|s| format!("subscribing: {}", s.message()))?
        .into_inner();
    let by_name: BTreeMap<String, BatchTask> =
        tasks.iter().map(|t| (t.name.clone(), t.clone())).collect();
    let mut pending: VecDeque<BatchTask> = tasks.into();
    let mut running: BTreeMap<String, i64> = BTreeMap::new();
    let mut report = BatchReport::default();
    let mut retries: BTreeMap<String, u32> = BTreeMap::new();
    let total = by_name.len();
    while report.finished + report.failed.len() < total {
        let Some(e) = events
            .message()
            .await
            .map_err(|s| format!("the offers stream failed: {}", s.message()))?
        else {
            return Err("the offers service closed the stream".into());
        };
        match e.event {
            Some(pb::event::Event::Subscribed(s)) => {
                report.framework_id = s.framework_id.clone();
                progress(Progress::Subscribed(s.framework_id));
            }
            Some(pb::event::Event::Offers(o)) => {
                report.running_cpu_samples.push(running.values().sum());
                for offer in o.offers {
                    report.offers += 1;
                    let fits = cfg
                        .node_selector
                        .iter()
                        .all(|(k, v)| offer.node_labels.get(k) == Some(v));
                    if !fits {
                        report.declined += 1;
                        let _ = tx.send(call(pb::call::Call::Decline(pb::call::Decline {
                            offer_id: offer.id,
                            refuse_seconds: 60.0,
                        })));
                        continue;
                    }
                    let r = offer.resources.unwrap_or_default();
                    let (mut cpu, mut mem) = (r.cpu_milli, r.memory_bytes);
                    let mut launch = Vec::new();
                    // First fit, in file order.
                    let mut rest = VecDeque::new();
                    while let Some(t) = pending.pop_front() {
                        if t.cpu_milli <= cpu && t.memory <= mem {
                            cpu -= t.cpu_milli;
                            mem -= t.memory;
                            launch.push(t);
                        } else {
                            rest.push_back(t);
                        }
                    }
                    pending = rest;
                    if launch.is_empty() {
                        report.declined += 1;
                        let _ = tx.send(call(pb::call::Call::Decline(pb::call::Decline {
                            offer_id: offer.id,
                            refuse_seconds: if pending.is_empty() { 30.0 } else { 1.0 },
                        })));
                        continue;
                    }
                    report.accepted += 1;
                    for t in &launch {
                        running.insert(t.name.clone(), t.cpu_milli);
                    }
                    let infos = launch
                        .iter()
                        .map(|t| pb::TaskInfo {
                            name: t.name.clone(),
                            resources: Some(pb::Resources {
                                cpu_milli: t.cpu_milli,
                                memory_bytes: t.memory,
                            }),
                            image: cfg.image.clone(),
                            command: Vec::new(),
                            labels: Default::default(),
                            annotations: [(
                                "tessera.io/sim-run-seconds".to_owned(),
                                t.seconds.to_string(),
                            )]
                            .into(),
                        })
                        .collect();
                    let _ = tx.send(call(pb::call::Call::Accept(pb::call::Accept {
                        offer_id: offer.id,
                        tasks: infos,
                    })));
                }
            }
            Some(pb::event::Event::Rescind(_)) => report.rescinded += 1,
            Some(pb::event::Event::Update(u)) => {
                let state = pb::TaskState::try_from(u.state).unwrap_or(pb::TaskState::TaskLost);
                match state {
                    pb::TaskState::TaskFinished => {
                        running.remove(&u.task);
                        report.finished += 1;
                    }
                    // The offered room went to a pod first (offers are optimistic towards
                    // Kubernetes' own pods): tried again on a later offer, a few times.
                    pb::TaskState::TaskFailed
                        if u.message.contains(crate::service::NO_ROOM)
                            && retries.get(&u.task).copied().unwrap_or(0) < MAX_RETRIES =>
                    {
                        running.remove(&u.task);
                        *retries.entry(u.task.clone()).or_default() += 1;
                        report.retried += 1;
                        if let Some(t) = by_name.get(&u.task) {
                            pending.push_back(t.clone());
                        }
                    }
                    pb::TaskState::TaskFailed
                    | pb::TaskState::TaskKilled
                    | pb::TaskState::TaskLost => {
                        running.remove(&u.task);
                        report.failed.push((u.task.clone(), u.message.clone()));
                    }
                    _ => {}
                }
                progress(Progress::Task(u));
            }
            Some(pb::event::Event::Error(e)) => {
                tracing::warn!(error = %e.message, "the offers service reported an error");
            }
            Some(pb::event::Event::Heartbeat(_)) | None => {}
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_file_is_read_and_its_mistakes_named() {
        let tasks = parse_tasks("# a comment\netl-1 500m 256Mi 3\n\netl-2 1 1Gi 0 # inline\n")
            .expect("valid");
        assert_eq!(
            tasks,
            [
                BatchTask {
                    name: "etl-1".into(),
                    cpu_milli: 500,
                    memory: 256 << 20,
                    seconds: 3
                },
                BatchTask {
                    name: "etl-2".into(),
                    cpu_milli: 1000,
                    memory: 1 << 30,
                    seconds: 0
                },
            ]
        );
        let e = parse_tasks("a 1 1Gi\n").expect_err("three fields");
        assert!(
            e.starts_with("line 1:") && e.contains("name cpu memory seconds"),
            "{e}"
        );
        let e = parse_tasks("a 1 1Gi 1\nb lots 1Gi 1\n").expect_err("bad cpu");
        assert!(e.starts_with("line 2: cpu \"lots\""), "{e}");
        let e = parse_tasks("a 1 1Gi 1\na 1 1Gi 1\n").expect_err("twice");
        assert!(e.contains("listed twice"), "{e}");
    }
}
