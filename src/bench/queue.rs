//! `tessera bench queue`: what cluster events cost the scheduling queue while many pods wait
//! in it — a flood of active pods, and pods parked as unschedulable for other events. The
//! queue alone, in memory: no API, no store.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::json;
use tessera_scheduler::framework::ClusterEvent;
use tessera_scheduler::plugins::basic::PrioritySort;
use tessera_scheduler::queue::SchedulingQueue;
use tessera_scheduler::resources::PodInfo;

/// Flags of `tessera bench queue`.
#[derive(Args, Debug)]
pub struct QueueBenchArgs {
    /// Pods waiting in the queue (half active, half parked as unschedulable).
    #[arg(long, default_value_t = 100_000)]
    pub pending: usize,
    /// Cluster events delivered (node label changes, which no parked pod waits for).
    #[arg(long, default_value_t = 10_000)]
    pub events: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    pending: usize,
    events: usize,
    events_per_sec: f64,
    ns_per_event: f64,
    woken: usize,
}

fn pod(i: usize) -> anyhow::Result<Arc<PodInfo>> {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("p{i}"), "namespace": "bench", "uid": format!("u{i}")},
        "spec": {"containers": [{"name": "c", "image": "pause",
            "resources": {"requests": {"cpu": "100m"}}}]}}))?;
    Ok(Arc::new(PodInfo::new(Arc::new(p))))
}

/// Runs the benchmark.
pub async fn run(args: QueueBenchArgs) -> anyhow::Result<()> {
    let mut q = SchedulingQueue::new(
        Arc::new(PrioritySort),
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(10),
    );
    let bar = super::progress_bar(args.pending as u64, "queueing pods".into());
    for i in 0..args.pending {
        q.add_or_update(pod(i)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    // Half of them tried and parked until a node joins or a pod goes.
    let now = tokio::time::Instant::now();
    for _ in 0..args.pending / 2 {
        if let Some(p) = q.pop(now) {
            let _ = q.unschedulable(
                &p.info.key,
                vec![ClusterEvent::NodeAdd, ClusterEvent::AssignedPodDelete],
                now,
            );
        }
    }
    let bar = super::progress_bar(args.events as u64, "cluster events".into());
    let started = Instant::now();
    let mut woken = 0;
    for _ in 0..args.events {
        woken += q.on_event(ClusterEvent::NodeLabel, now);
        bar.inc(1);
    }
    let secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let r = Report {
        pending: args.pending,
        events: args.events,
        events_per_sec: args.events as f64 / secs.max(1e-9),
        ns_per_event: secs * 1e9 / args.events.max(1) as f64,
        woken,
    };
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} pending pods: {} events in {:.3} s, {:.0} events/s, {:.0} ns each; {} pods woken",
            r.pending, r.events, secs, r.events_per_sec, r.ns_per_event, r.woken
        );
    }
    Ok(())
}
