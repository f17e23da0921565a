//! `tessera status`: the fleet at a glance, from the federation's API — its shards (ready,
//! nodes, cpu and memory used and free, pods running and pending, pods placed per second),
//! its tenants (their share of the fleet against their weight, replicas not yet running)
//! and the latest failovers; as tables, or as JSON (`-o json`), once or every few seconds
//! (`--watch`).
//!
//! What it reads grows with shards, tenants and federated workloads, never with pods or
//! nodes: the shards' figures come from their Shard objects (the summaries their agents
//! send), a tenant's from the federated workloads of its namespaces.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::Value;
use tessera_apiserver::client::{Client, HttpClient};
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_apiserver::types::TenantSpec;
use tessera_client::workloads::WorkloadKind;
use tessera_core::quantity::Quantity;

/// Flags of `tessera status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The federation's kubeconfig (its current context is used).
    #[arg(long, env = "KUBECONFIG", default_value = "./data/kubeconfig")]
    pub kubeconfig: PathBuf,
    /// Show it again every `--interval-seconds` until interrupted.
    #[arg(long, short)]
    pub watch: bool,
    /// Seconds between two looks with `--watch`.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval_seconds: u64,
    /// `table`, or `json` (one object per look).
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// How many of the latest failovers to show.
    #[arg(long, default_value_t = 5)]
    pub failovers: usize,
}

/// How `tessera status` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Tables, as kubectl prints them.
    Table,
    /// One JSON object per look.
    Json,
}

/// The fleet at one look.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fleet {
    /// Where it was read.
    pub federation: String,
    pub shards: Vec<ShardRow>,
    pub tenants: Vec<TenantRow>,
    pub failovers: Vec<FailoverRow>,
}

/// One shard.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardRow {
    pub name: String,
    pub ready: bool,
    /// Cordoned at the federation (takes no new work).
    pub cordoned: bool,
    pub nodes: i64,
    pub cpu_allocatable_milli: i64,
    pub cpu_free_milli: i64,
    pub memory_allocatable_bytes: i64,
    pub memory_free_bytes: i64,
    /// Pod slots of its nodes.
    pub pods_allocatable: i64,
    pub pods_running: i64,
    pub pods_pending: i64,
    /// Pods its scheduler placed per second, over about the last minute.
    pub pods_placed_per_second: f64,
}

/// One tenant.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantRow {
    pub name: String,
    pub weight: u32,
    /// Its weight over the weights of every tenant with work: the share of a full fleet
    /// weighted fairness gives it.
    pub fair_share: f64,
    /// Its pods' largest fraction of the fleet's cpu, memory or pod slots.
    pub dominant_share: f64,
    pub cpu_requested_milli: i64,
    pub memory_requested_bytes: i64,
    pub pods: u64,
    /// Replicas its workloads want that do not run yet.
    pub pending: u64,
}

/// One failover: a workload's replicas moved off a lost shard.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRow {
    pub time: String,
    pub workload: String,
    pub message: String,
}

/// Runs `tessera status`.
pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let http = HttpClient::from_kubeconfig(&args.kubeconfig)
        .map_err(|e| anyhow::anyhow!("{} ({})", e.message, args.kubeconfig.display()))?;
    let server = http.server().to_owned();
    let client: &dyn Client = &http;
    let tty = std::io::stdout().is_terminal();
    loop {
        let fleet = look(client, &server, args.failovers).await?;
        let mut out = std::io::stdout().lock();
        match args.output {
            Output::Json => writeln!(out, "{}", serde_json::to_string(&fleet)?)?,
            Output::Table => {
                if args.watch && tty {
                    // Clear the screen and go home, as `watch` does.
                    write!(out, "\x1b[2J\x1b[H")?;
                }
                write!(out, "{}", render(&fleet))?;
            }
        }
        out.flush()?;
        drop(out);
        if !args.watch {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(args.interval_seconds)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn resource(
    group: &str,
    version: &str,
    plural: &str,
) -> &'static tessera_apiserver::catalog::Resource {
    find_resource(group, version, plural).expect("a served resource")
}

async fn list(client: &dyn Client, req: ApiRequest, what: &str) -> anyhow::Result<Vec<Value>> {
    let mut items = Vec::new();
    client
        .list_each(req, &mut |item| items.push(item))
        .await
        .map_err(|e| anyhow::anyhow!("listing {what}: {}", e.message))?;
    Ok(items)
}

/// Reads the fleet once.
pub async fn look(client: &dyn Client, server: &str, failovers: usize) -> anyhow::Result<Fleet> {
    let shards_res = resource("tessera.io", "v1alpha1", "shards");
    let shards = match client.list(ApiRequest::new(Verb::List, shards_res)).await {
        Ok(l) => l["items"].as_array().cloned().unwrap_or_default(),
        Err(e) if e.code == 404 => anyhow::bail!(
            "{server} serves no shards: point --kubeconfig at a federation (`tessera up` writes one to DATA/kubeconfig)"
        ),
        Err(e) => anyhow::bail!("listing shards at {server}: {}", e.message),
    };
    if shards.is_empty() {
        // A shard's own API serves the kind too, and lists none.
        anyhow::bail!(
            "{server} serves no shards: it is a shard's API rather than the federation's (use the federation's context: `kubectl config get-contexts`), or no shard has joined it yet (`tessera join`)"
        );
    }
    let tenants = list(
        client,
        ApiRequest::new(Verb::List, resource("tessera.io", "v1alpha1", "tenants")),
        "tenants",
    )
    .await?;
    let mut workloads = Vec::new();
    for kind in WorkloadKind::ALL {
        if kind == WorkloadKind::CronJob {
            // Its Jobs are listed as Jobs.
            continue;
        }
        for w in list(
            client,
            ApiRequest::new(Verb::List, kind.resource()),
            kind.plural(),
        )
        .await?
        {
            workloads.push((kind, w));
        }
    }
    let mut events = ApiRequest::new(Verb::List, resource("", "v1", "events"));
    events.params.field_selector = Some("reason=FailedOver".parse().expect("a field selector"));
    let events = list(client, events, "events").await?;

    let shards: Vec<ShardRow> = shards.iter().map(shard_row).collect();
    let tenants = tenant_rows(&shards, &tenants, &workloads);
    Ok(Fleet {
        federation: server.to_owned(),
        shards,
        tenants,
        failovers: failover_rows(&events, failovers),
    })
}

/// `list[name]` (a map of quantities), 0 when missing or malformed.
fn quantity(list: &Value, name: &str) -> Quantity {
    list[name]
        .as_str()
        .and_then(|q| q.parse().ok())
        .unwrap_or(Quantity::ZERO)
}

/// A shard's row, from its Shard object (read field by field: a field this version does
/// not know, or lacks, costs that field only).
fn shard_row(s: &Value) -> ShardRow {
    let status = &s["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let (alloc, free) = (&status["allocatable"], &status["free"]);
    let int = |f: &str| status[f].as_i64().unwrap_or(0);
    ShardRow {
        name: s["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        ready,
        cordoned: s["spec"]["unschedulable"].as_bool().unwrap_or(false),
        nodes: int("nodes"),
        cpu_allocatable_milli: quantity(alloc, "cpu").milli_ceil(),
        cpu_free_milli: quantity(free, "cpu").milli_ceil(),
        memory_allocatable_bytes: quantity(alloc, "memory").units_ceil(),
        memory_free_bytes: quantity(free, "memory").units_ceil(),
        pods_allocatable: quantity(alloc, "pods").units_ceil(),
        pods_running: int("podsRunning"),
        pods_pending: int("podsPending"),
        pods_placed_per_second: int("podsPlacedLastMinute") as f64 / 60.0,
    }
}

/// Each tenant's rows: what its namespaces' federated workloads run and still want, and
/// its dominant share of the fleet's `shards`.
fn tenant_rows(
    shards: &[ShardRow],
    tenants: &[Value],
    workloads: &[(WorkloadKind, Value)],
) -> Vec<TenantRow> {
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    let mut rows: Vec<TenantRow> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let spec: TenantSpec = serde_json::from_value(t["spec"].clone()).unwrap_or_default();
            for ns in spec.namespaces.iter().flatten() {
                owner.entry(ns.clone()).or_insert(i);
            }
            TenantRow {
                name: t["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                weight: spec.weight.unwrap_or(1).max(1) as u32,
                ..TenantRow::default()
            }
        })
        .collect();
    for (kind, w) in workloads {
        let Some(&i) = w["metadata"]["namespace"]
            .as_str()
            .and_then(|ns| owner.get(ns))
        else {
            continue;
        };
        let (spec, status) = (&w["spec"], &w["status"]);
        let wanted = if kind.needs_no_room(status) {
            0
        } else {
            kind.replicas(spec)
        };
        let running = kind.pods_now(status);
        let per_pod = tessera_apiserver::quota::pod_usage(kind.template(spec));
        let each = |k: &str| per_pod.get(k).copied().unwrap_or(Quantity::ZERO);
        let row = &mut rows[i];
        row.cpu_requested_milli += each("requests.cpu").times(running).milli_ceil();
        row.memory_requested_bytes += each("requests.memory").times(running).units_ceil();
        row.pods += running;
        row.pending += wanted.saturating_sub(running);
    }
    let total = |f: fn(&ShardRow) -> i64| shards.iter().map(f).sum::<i64>().max(0) as f64;
    let cpu = total(|s| s.cpu_allocatable_milli);
    let memory = total(|s| s.memory_allocatable_bytes);
    let pods = total(|s| s.pods_allocatable);
    let active_weight: u32 = rows
        .iter()
        .filter(|r| r.pods + r.pending > 0)
        .map(|r| r.weight)
        .sum();
    for r in &mut rows {
        let frac = |used: f64, of: f64| if of > 0.0 { used / of } else { 0.0 };
        let dominant = frac(r.cpu_requested_milli as f64, cpu)
            .max(frac(r.memory_requested_bytes as f64, memory))
            .max(frac(r.pods as f64, pods));
        r.dominant_share = dominant;
        r.fair_share = if r.pods + r.pending > 0 && active_weight > 0 {
            f64::from(r.weight) / f64::from(active_weight)
        } else {
            0.0
        };
    }
    rows
}

/// The latest `n` failovers, newest first.
fn failover_rows(events: &[Value], n: usize) -> Vec<FailoverRow> {
    let mut rows: Vec<FailoverRow> = events
        .iter()
        .map(|e| {
            let time = ["lastTimestamp", "eventTime", "firstTimestamp"]
                .iter()
                .find_map(|f| e[*f].as_str())
                .unwrap_or_default();
            let obj = &e["involvedObject"];
            FailoverRow {
                time: time.to_owned(),
                workload: format!(
                    "{}/{}/{}",
                    obj["kind"].as_str().unwrap_or_default().to_lowercase(),
                    obj["namespace"].as_str().unwrap_or_default(),
                    obj["name"].as_str().unwrap_or_default()
                ),
                message: e["message"].as_str().unwrap_or_default().to_owned(),
            }
        })
        .collect();
    // RFC 3339 times in UTC sort as text.
    rows.sort_by(|a, b| b.time.cmp(&a.time));
    rows.truncate(n);
    rows
}

fn cores(milli: i64) -> String {
    format!("{:.1}", milli as f64 / 1000.0)
}

fn gib(bytes: i64) -> String {
    format!("{:.1}Gi", bytes as f64 / f64::from(1u32 << 30))
}

fn percent(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

/// Left-aligned columns three spaces apart, as kubectl prints them.
fn table(rows: &[Vec<String>]) -> String {
    let mut widths = Vec::new();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The tables of `tessera status`.
pub fn render(f: &Fleet) -> String {
    let ready = f.shards.iter().filter(|s| s.ready).count();
    let sum = |g: fn(&ShardRow) -> i64| f.shards.iter().map(g).sum::<i64>();
    let rate = f
        .shards
        .iter()
        .fold(0.0, |a, s| a + s.pods_placed_per_second);
    let mut out = format!(
        "Federation {}: {} shards ({ready} ready), {} nodes, {} pods running, {} pending, {:.1} pods/s placed\n\n",
        f.federation,
        f.shards.len(),
        sum(|s| s.nodes),
        sum(|s| s.pods_running),
        sum(|s| s.pods_pending),
        rate
    );
    let mut rows = vec![
        [
            "SHARD",
            "READY",
            "NODES",
            "CPU USED/ALLOC",
            "MEMORY USED/ALLOC",
            "RUNNING",
            "PENDING",
            "PODS/S",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for s in &f.shards {
        let ready = match (s.ready, s.cordoned) {
            (true, false) => "True",
            (true, true) => "True,SchedulingDisabled",
            (false, _) => "False",
        };
        rows.push(vec![
            s.name.clone(),
            ready.to_owned(),
            s.nodes.to_string(),
            format!(
                "{}/{}",
                cores(s.cpu_allocatable_milli - s.cpu_free_milli),
                cores(s.cpu_allocatable_milli)
            ),
            format!(
                "{}/{}",
                gib(s.memory_allocatable_bytes - s.memory_free_bytes),
                gib(s.memory_allocatable_bytes)
            ),
            s.pods_running.to_string(),
            s.pods_pending.to_string(),
            format!("{:.1}", s.pods_placed_per_second),
        ]);
    }
    out.push_str(&table(&rows));
    out.push('\n');
    if f.tenants.is_empty() {
        out.push_str("No tenants.\n");
    } else {
        let mut rows = vec![
            [
                "TENANT", "WEIGHT", "FAIR", "SHARE", "CPU", "MEMORY", "PODS", "PENDING",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for t in &f.tenants {
            rows.push(vec![
                t.name.clone(),
                t.weight.to_string(),
                percent(t.fair_share),
                percent(t.dominant_share),
                cores(t.cpu_requested_milli),
                gib(t.memory_requested_bytes),
                t.pods.to_string(),
                t.pending.to_string(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    out.push('\n');
    if f.failovers.is_empty() {
        out.push_str("No failovers.\n");
    } else {
        let mut rows = vec![
            ["FAILED OVER", "WORKLOAD", "MESSAGE"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for e in &f.failovers {
            rows.push(vec![e.time.clone(), e.workload.clone(), e.message.clone()]);
        }
        out.push_str(&table(&rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shard(name: &str, cpu: &str, free_cpu: &str, pods: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodes": 2,
                "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": pods},
                "free": {"cpu": free_cpu, "memory": "6Gi", "pods": pods},
                "podsRunning": 3, "podsPending": 1, "podsPlacedLastMinute": 90}})
    }

    #[test]
    fn a_shard_row_reads_its_shard_object() {
        let r = shard_row(&shard("a", "8", "6500m", "110"));
        assert!(r.ready && !r.cordoned);
        assert_eq!((r.cpu_allocatable_milli, r.cpu_free_milli), (8000, 6500));
        assert_eq!(r.memory_allocatable_bytes - r.memory_free_bytes, 2 << 30);
        assert_eq!(
            (r.pods_running, r.pods_pending, r.pods_allocatable),
            (3, 1, 110)
        );
        assert_eq!(r.pods_placed_per_second, 1.5);
        let cordoned = shard_row(&json!({"metadata": {"name": "b"},
            "spec": {"unschedulable": true}, "status": {}}));
        assert!(
            !cordoned.ready && cordoned.cordoned,
            "no Ready condition: not ready"
        );
    }

    #[test]
    fn a_tenants_share_is_its_largest_fraction_of_the_fleet() {
        let shards =
            [shard("a", "8", "8", "10"), shard("b", "8", "8", "10")].map(|s| shard_row(&s));
        let tenants = [
            json!({"metadata": {"name": "heavy"}, "spec": {"namespaces": ["h"], "weight": 3}}),
            json!({"metadata": {"name": "many"}, "spec": {"namespaces": ["m"]}}),
            json!({"metadata": {"name": "idle"}, "spec": {"namespaces": ["i"]}}),
        ];
        let deploy = |ns: &str, replicas: i64, running: i64, cpu: &str| {
            (
                WorkloadKind::Deployment,
                json!({"metadata": {"namespace": ns},
                "spec": {"replicas": replicas, "template": {"spec": {"containers": [
                    {"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}},
                "status": {"replicas": running}}),
            )
        };
        let workloads = [
            deploy("h", 4, 4, "2"),     // 8 of 16 cpu: a half
            deploy("m", 6, 5, "100m"),  // 5 of 20 pod slots: a quarter; one still to run
            deploy("other", 9, 9, "1"), // no tenant owns it
            (
                WorkloadKind::Job,
                json!({"metadata": {"namespace": "m"},
                "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c"}]}}},
                "status": {"active": 0, "conditions": [{"type": "Complete", "status": "True"}]}}),
            ),
        ];
        let rows = tenant_rows(&shards, &tenants, &workloads);
        let by = |n: &str| rows.iter().find(|r| r.name == n).expect("row");
        assert_eq!(by("heavy").dominant_share, 0.5);
        assert_eq!(by("heavy").cpu_requested_milli, 8000);
        assert_eq!(by("many").dominant_share, 0.25);
        assert_eq!(
            (by("many").pods, by("many").pending),
            (5, 1),
            "a finished Job wants nothing"
        );
        // Fair shares split by weight between the tenants with work only.
        assert_eq!(by("heavy").fair_share, 0.75);
        assert_eq!(by("many").fair_share, 0.25);
        assert_eq!(
            (by("idle").fair_share, by("idle").dominant_share),
            (0.0, 0.0)
        );
    }

    #[test]
    fn failovers_are_the_latest_first() {
        let event = |t: &str, name: &str| {
            json!({"lastTimestamp": t, "message": "moved",
            "involvedObject": {"kind": "Deployment", "namespace": "n", "name": name}})
        };
        let rows = failover_rows(
            &[
                event("2026-12-05T10:00:00Z", "old"),
                event("2026-12-05T12:00:00Z", "new"),
                event("2026-12-05T11:00:00Z", "mid"),
            ],
            2,
        );
        let names: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
        assert_eq!(names, ["deployment/n/new", "deployment/n/mid"]);
    }

    #[test]
    fn columns_line_up() {
        let t = table(&[
            vec!["A".into(), "LONGER".into(), "Z".into()],
            vec!["wide-cell".into(), "x".into(), "last".into()],
        ]);
        assert_eq!(t, "A           LONGER   Z\nwide-cell   x        last\n");
    }
}
