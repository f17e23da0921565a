//! Resource usage of a process node's containers, read from `/proc` when Prometheus scrapes:
//! each container runs in its own process group, and its usage is the sum over the group
//! (the container's process and whatever it started).
//!
//! - `tessera_container_cpu_usage_seconds_total{node,namespace,pod,container}`: CPU time,
//!   user and system, of the group's live processes and the children they have reaped;
//! - `tessera_container_memory_rss_bytes{...}`: resident memory of the group;
//! - `tessera_container_processes{...}`: processes in the group.
//!
//! The same samples, as rates over a window, are what the agent serves on `/stats/usage`
//! for the API server's `metrics.k8s.io` (`kubectl top`).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, GaugeVec, Opts};

/// Running containers by their process group id: namespace, pod, container, and when it
/// started.
pub type Running = Arc<Mutex<HashMap<u32, (String, String, String, std::time::Instant)>>>;

/// Clock ticks per second of `/proc/*/stat` times (Linux's USER_HZ, 100 on every
/// architecture Tessera builds for).
const TICKS_PER_SECOND: f64 = 100.0;

/// One process group's usage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// CPU seconds.
    pub cpu_seconds: f64,
    /// Resident bytes.
    pub rss_bytes: u64,
    /// Processes.
    pub processes: u64,
}

/// The process group and CPU ticks (own and reaped children's) in a `/proc/PID/stat` line.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    // The command name is in parentheses and may hold anything: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let pgrp = f.get(2)?.parse().ok()?;
    let ticks = f
        .get(11..15)?
        .iter()
        .map(|v| v.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some((pgrp, ticks))
}

fn rss_kib(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The usage of each of `groups`, from one pass over `/proc`.
pub fn sample(groups: &[u32]) -> HashMap<u32, Usage> {
    let mut out: HashMap<u32, Usage> = groups.iter().map(|g| (*g, Usage::default())).collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue; // gone meanwhile
        };
        let Some((pgrp, ticks)) = parse_stat(&stat) else {
            continue;
        };
        if let Some(u) = out.get_mut(&pgrp) {
            u.cpu_seconds += ticks as f64 / TICKS_PER_SECOND;
            u.processes += 1;
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                u.rss_bytes += rss_kib(&status) * 1024;
            }
        }
    }
    out
}

/// The newest usage report of a node's containers, as its agent serves it on
/// `/stats/usage`: `{"timestamp", "window", "pods": [{"namespace", "name",
/// "containers": [{"name", "usage": {"cpu": "<n>n", "memory": "<n>Ki"}}]}]}` (CPU as the
/// rate over the window, in nanocores, as metrics-server reports it).
pub type Stats = Arc<Mutex<serde_json::Value>>;

/// Samples the running containers every `window` and keeps the newest report in `stats`.
pub async fn report_every(running: Running, stats: Stats, window: std::time::Duration) {
    let mut previous: HashMap<u32, (f64, std::time::Instant)> = HashMap::new();
    let mut tick = tokio::time::interval(window);
    loop {
        tick.tick().await;
        let containers = running.lock().clone();
        let groups: Vec<u32> = containers.keys().copied().collect();
        let now = std::time::Instant::now();
        let usage = tokio::task::spawn_blocking(move || sample(&groups))
            .await
            .unwrap_or_default();
        let mut pods: std::collections::BTreeMap<(String, String), Vec<serde_json::Value>> =
            std::collections::BTreeMap::new();
        let mut next = HashMap::new();
        for (pid, (ns, pod, container, started)) in &containers {
            let u = usage.get(pid).copied().unwrap_or_default();
            next.insert(*pid, (u.cpu_seconds, now));
            // The rate since the last sample; for a new container, since it started.
            let (cpu_before, at) = previous.get(pid).copied().unwrap_or((0.0, *started));
            let secs = now.duration_since(at).as_secs_f64().max(1e-3);
            let nanocores = ((u.cpu_seconds - cpu_before).max(0.0) / secs * 1e9).round() as u64;
            pods.entry((ns.clone(), pod.clone())).or_default().push(
                serde_json::json!({"name": container, "usage": {
                    "cpu": format!("{nanocores}n"),
                    "memory": format!("{}Ki", u.rss_bytes / 1024)}}),
            );
        }
        previous = next;
        let pods: Vec<serde_json::Value> = pods
            .into_iter()
            .map(|((ns, name), containers)| {
                serde_json::json!({"namespace": ns, "name": name, "containers": containers})
            })
            .collect();
        *stats.lock() = serde_json::json!({
            "timestamp": format!("{:.0}", jiff::Timestamp::now()),
            "window": format!("{}s", window.as_secs().max(1)),
            "pods": pods,
        });
    }
}

/// The collector of one node's container usage.
pub struct ContainerUsage {
    running: Running,
    cpu: CounterVec,
    rss: GaugeVec,
    processes: GaugeVec,
    scrape: Mutex<()>,
}

impl ContainerUsage {
    /// Usage of the containers in `running`, labelled with node `node`.
    pub fn new(node: &str, running: Running) -> prometheus::Result<ContainerUsage> {
        let labels = ["namespace", "pod", "container"];
        let opts = |name: &str, help: &str| Opts::new(name, help).const_label("node", node);
        Ok(ContainerUsage {
            running,
            cpu: CounterVec::new(
                opts(
                    "tessera_container_cpu_usage_seconds_total",
                    "CPU time of a process-node container's processes",
                ),
                &labels,
            )?,
            rss: GaugeVec::new(
                opts(
                    "tessera_container_memory_rss_bytes",
                    "Resident memory of a process-node container's processes",
                ),
                &labels,
            )?,
            processes: GaugeVec::new(
                opts(
                    "tessera_container_processes",
                    "Processes in a process-node container's group",
                ),
                &labels,
            )?,
            scrape: Mutex::new(()),
        })
    }
}

impl Collector for ContainerUsage {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.cpu.desc();
        d.extend(self.rss.desc());
        d.extend(self.processes.desc());
        d
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one_at_a_time = self.scrape.lock();
        let running = self.running.lock().clone();
        let groups: Vec<u32> = running.keys().copied().collect();
        let usage = sample(&groups);
        self.cpu.reset();
        self.rss.reset();
        self.processes.reset();
        for (pid, (ns, pod, container, _)) in &running {
            let u = usage.get(pid).copied().unwrap_or_default();
            let l = [ns.as_str(), pod.as_str(), container.as_str()];
            self.cpu.with_label_values(&l).inc_by(u.cpu_seconds);
            self.rss.with_label_values(&l).set(u.rss_bytes as f64);
            self.processes.with_label_values(&l).set(u.processes as f64);
        }
        let mut out = self.cpu.collect();
        out.extend(self.rss.collect());
        out.extend(self.processes.collect());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let line =
            "4242 (a (weird) name) S 1 4240 4240 0 -1 4194560 100 0 0 0 150 50 7 3 20 0 1 0 1 2 3";
        assert_eq!(parse_stat(line), Some((4240, 210)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(rss_kib("Name:\tsh\nVmRSS:\t  1234 kB\n"), 1234);
    }

    #[test]
    fn a_busy_group_uses_cpu_and_memory() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 3000000 ]; do i=$((i+1)); done"])
            .process_group(0)
            .spawn()
            .expect("sh");
        let pid = child.id();
        let mut seen = Usage::default();
        for _ in 0..100 {
            seen = sample(&[pid])[&pid];
            if seen.cpu_seconds > 0.0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen.cpu_seconds > 0.0, "{seen:?}");
        assert!(seen.rss_bytes > 0, "{seen:?}");
        assert_eq!(seen.processes, 1);
        assert_eq!(
            sample(&[pid])[&pid],
            Usage::default(),
            "gone after it ended"
        );
    }
}
