//! Scheduler metrics (`tessera_scheduler_*`), named after kube-scheduler's.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// The scheduler's metrics.
#[derive(Clone)]
pub struct SchedulerMetrics {
    pub(crate) attempts: IntCounterVec,
    pub(crate) attempt_duration: HistogramVec,
    pub(crate) pending: IntGaugeVec,
    pub(crate) binding_duration: HistogramVec,
    pub(crate) e2e: HistogramVec,
    pub(crate) tenant_pending: IntGaugeVec,
    pub(crate) tenant_share: GaugeVec,
    pub(crate) tenant_wait: HistogramVec,
    pub(crate) cache_nodes: IntGauge,
    pub(crate) cache_pods: IntGauge,
    pub(crate) topology_entries: IntGaugeVec,
    pub(crate) cycle_cpu: prometheus::Counter,
    pub(crate) gangs: IntCounterVec,
    pub(crate) preemption_attempts: prometheus::IntCounter,
    pub(crate) preemption_victims: prometheus::Histogram,
    pub(crate) conflicts: IntCounterVec,
    pub(crate) workers: IntGauge,
    pub(crate) memo_nodes: IntCounterVec,
}

fn buckets() -> Vec<f64> {
    vec![
        0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0,
    ]
}

impl SchedulerMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<SchedulerMetrics> {
        let m = SchedulerMetrics::unregistered()?;
        registry.register(Box::new(m.attempts.clone()))?;
        registry.register(Box::new(m.attempt_duration.clone()))?;
        registry.register(Box::new(m.pending.clone()))?;
        registry.register(Box::new(m.binding_duration.clone()))?;
        registry.register(Box::new(m.e2e.clone()))?;
        registry.register(Box::new(m.tenant_pending.clone()))?;
        registry.register(Box::new(m.tenant_share.clone()))?;
        registry.register(Box::new(m.tenant_wait.clone()))?;
        registry.register(Box::new(m.cache_nodes.clone()))?;
        registry.register(Box::new(m.cache_pods.clone()))?;
        registry.register(Box::new(m.topology_entries.clone()))?;
        registry.register(Box::new(m.cycle_cpu.clone()))?;
        registry.register(Box::new(m.gangs.clone()))?;
        registry.register(Box::new(m.preemption_attempts.clone()))?;
        registry.register(Box::new(m.preemption_victims.clone()))?;
        registry.register(Box::new(m.conflicts.clone()))?;
        registry.register(Box::new(m.workers.clone()))?;
        registry.register(Box::new(m.memo_nodes.clone()))?;
        Ok(m)
    }

    /// Bindings that failed so far (the API refused them, or a PreBind/Permit stopped them).
    pub fn binding_failures(&self) -> u64 {
        self.binding_duration
            .with_label_values(&["error"])
            .get_sample_count()
    }

    /// Scheduling attempts that placed a pod so far, and the seconds they took in all.
    pub fn scheduled_attempts(&self) -> (u64, f64) {
        let h = self.attempt_duration.with_label_values(&["scheduled"]);
        (h.get_sample_count(), h.get_sample_sum())
    }

    /// CPU seconds the scheduling workers spent in scheduling cycles so far (all
    /// results).
    pub fn cycle_cpu_seconds(&self) -> f64 {
        self.cycle_cpu.get()
    }

    /// Gangs that ended with `result` so far (`bound`, `failed`, `timeout`, `released`).
    pub fn gang_outcomes(&self, result: &str) -> u64 {
        self.gangs.with_label_values(&[result]).get()
    }

    /// Preemptions so far (a node chosen and its victims evicted), and the victims.
    pub fn preemptions(&self) -> (u64, u64) {
        (
            self.preemption_attempts.get(),
            self.preemption_victims.get_sample_sum() as u64,
        )
    }

    /// Decisions made again so far because what they read moved before they were
    /// committed: placements (`placement`, Omega's conflicts) and rejections (`rejection`).
    pub fn conflicts(&self, decision: &str) -> u64 {
        self.conflicts.with_label_values(&[decision]).get()
    }

    /// Nodes whose local filters' result for a pod was taken from its class's memo
    /// (`reused`) or computed and remembered (`judged`) so far.
    pub fn memo_nodes(&self, result: &str) -> u64 {
        self.memo_nodes.with_label_values(&[result]).get()
    }

    /// Counts what a decision's filter walk took from the memo and added to it.
    pub(crate) fn count_memo(&self, reused: usize, judged: usize) {
        for (result, n) in [("reused", reused), ("judged", judged)] {
            self.memo_nodes
                .with_label_values(&[result])
                .inc_by(n as u64);
        }
    }

    /// Metrics no registry reads.
    pub fn unregistered() -> prometheus::Result<SchedulerMetrics> {
        Ok(SchedulerMetrics {
            attempts: IntCounterVec::new(
                Opts::new(
                    "tessera_scheduler_schedule_attempts_total",
                    "Scheduling attempts by result (scheduled, unschedulable, error) and profile.",
                ),
                &["result", "profile"],
            )?,
            attempt_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_scheduler_scheduling_attempt_duration_seconds",
                    "Time of the scheduling cycle (filter, score, reserve, permit), by result.",
                )
                .buckets(buckets()),
                &["result"],
            )?,
            pending: IntGaugeVec::new(
                Opts::new(
                    "tessera_scheduler_pending_pods",
                    "Pods waiting, by queue (active, backoff, unschedulable).",
                ),
                &["queue"],
            )?,
            binding_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_scheduler_binding_duration_seconds",
                    "Time of the binding cycle (permit wait, prebind, bind), by result.",
                )
                .buckets(buckets()),
                &["result"],
            )?,
            e2e: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_scheduler_pod_scheduling_duration_seconds",
                    "From a pod entering the queue to its binding, by attempts needed.",
                )
                .buckets(buckets()),
                &["attempts"],
            )?,
            tenant_pending: IntGaugeVec::new(
                Opts::new(
                    "tessera_scheduler_tenant_pending_pods",
                    "Pods waiting, by tenant (<none> for namespaces no Tenant owns) and queue.",
                ),
                &["tenant", "queue"],
            )?,
            tenant_share: GaugeVec::new(
                Opts::new(
                    "tessera_scheduler_tenant_dominant_share",
                    "Each tenant's weighted dominant share of the shard (what its pods request \
                     of cpu, memory or pod slots, the largest fraction, over its weight): the \
                     lowest is served first.",
                ),
                &["tenant"],
            )?,
            tenant_wait: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_scheduler_tenant_queue_wait_seconds",
                    "From a pod entering the queue to its binding, by tenant.",
                )
                .buckets(buckets()),
                &["tenant"],
            )?,
            cache_nodes: IntGauge::new(
                "tessera_scheduler_cache_nodes",
                "Nodes in the scheduler's cache.",
            )?,
            cache_pods: IntGauge::new(
                "tessera_scheduler_cache_pods",
                "Pods counted on nodes in the scheduler's cache (bound and assumed).",
            )?,
            topology_entries: IntGaugeVec::new(
                Opts::new(
                    "tessera_scheduler_topology_entries",
                    "Incremental pod counts kept for spreading and pod affinity: counters (one \
                     per selector a pending pod's constraint or term uses) and groups (one per \
                     distinct affinity term of placed pods).",
                ),
                &["kind"],
            )?,
            cycle_cpu: prometheus::Counter::new(
                "tessera_scheduler_cycle_cpu_seconds_total",
                "CPU time of the scheduling threads in scheduling cycles (preparing counters, \
                 filter, score on every worker; reserve, permit): the scheduler's own cost, \
                 without waiting or time lost to other threads.",
            )?,
            gangs: IntCounterVec::new(
                Opts::new(
                    "tessera_scheduler_gang_outcomes_total",
                    "Gangs (PodGroups) placed by the Coscheduling plugin, by outcome: bound \
                     (minMember reached, members bound in one transaction), failed (the API \
                     refused the group binding), timeout (scheduleTimeoutSeconds passed with \
                     too few members placed), released (a member could not be placed, or left, \
                     and the waiting members were let go), reserved (a part of a federation-scope \
                     gang placed and held for the federation's commit).",
                ),
                &["result"],
            )?,
            preemption_attempts: prometheus::IntCounter::new(
                "tessera_scheduler_preemption_attempts_total",
                "Preemptions made: a pod that fit nowhere was nominated to a node and that \
                 node's victims were evicted.",
            )?,
            preemption_victims: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_scheduler_preemption_victims",
                    "Pods evicted by one preemption.",
                )
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
            )?,
            conflicts: IntCounterVec::new(
                Opts::new(
                    "tessera_scheduler_conflicts_total",
                    "Decisions made in parallel against one snapshot and made again because \
                     what they read moved before their turn to commit, by decision: placement \
                     (their node took another pod, or a pod was placed anywhere while their \
                     spreading or pod affinity counted pods) and rejection (a pod that fit \
                     nowhere, looked at again once others were placed).",
                ),
                &["decision"],
            )?,
            workers: IntGauge::new(
                "tessera_scheduler_workers",
                "Scheduling workers: pods decided at once against one snapshot.",
            )?,
            memo_nodes: IntCounterVec::new(
                Opts::new(
                    "tessera_scheduler_filter_memo_nodes_total",
                    "Nodes a pod's filter walk judged by its class of alike pods' remembered \
                     result of the filters that read the node alone (reused), or judged by \
                     running them and remembered for the next alike pod (judged).",
                ),
                &["result"],
            )?,
        })
    }
}
