//! The federation's metrics (`tessera_federation_*`): shards by state, placements and
//! spill-overs, map changes, summary age, propagation latency.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Every federation metric of a process.
#[derive(Clone)]
pub struct FederationMetrics {
    /// Shards by state (`ready`, `not_ready`).
    pub shards: IntGaugeVec,
    /// Per shard: 1 while it is ready (its lease held and its summary fresh), else 0.
    pub shard_ready: IntGaugeVec,
    /// Placement decisions by mode and outcome (`placed`, `partial`, `pending`).
    pub placements: IntCounterVec,
    /// Replicas placed beyond a workload's first-choice shard.
    pub spilled_replicas: IntCounter,
    /// Replicas a placement held back because the tenant's fleet-wide quota was used up
    /// (counted at each decision that holds them).
    pub quota_held_replicas: IntCounter,
    /// Changes of the shard map.
    pub map_changes: IntCounter,
    /// Tenants whose home shard changed with the map.
    pub tenants_moved: IntCounter,
    /// Age of each shard's last capacity summary.
    pub summary_age: IntGaugeVec,
    /// Summaries and other messages refused from shards, by reason.
    pub refused: IntCounterVec,
    /// Time from an assignment sent to a shard to the shard reporting the object applied.
    pub propagation: Histogram,
    /// Time to decide one placement.
    pub decision: HistogramVec,
    /// Assignments sent, by operation.
    pub assignments: IntCounterVec,
    /// Reads sent to shards through their agents' streams.
    pub shard_reads: IntCounter,
    /// Pod streams (exec, attach, port-forward) tunnelled to shards.
    pub shard_tunnels: IntCounter,
    /// Shares of workloads moved off a lost shard, by failover mode.
    pub failovers: IntCounterVec,
    /// From a lost shard's lease ending to its share of a workload being released for
    /// placement elsewhere, by failover mode.
    pub failover_wait: HistogramVec,
    /// Moves of workloads between live shards begun, by why (rebalance, drain, decision).
    pub moves: IntCounterVec,
    /// Moves under way.
    pub moves_in_progress: IntGauge,
    /// From a move's start to its leaving shares being gone, by failover mode.
    pub move_duration: HistogramVec,
    /// Moves held back by `--max-moving`.
    pub moves_deferred: IntCounter,
    /// Moves that ran past `--move-timeout-seconds` and gave their slot up.
    pub moves_stalled: IntCounter,
    /// Federation-scope gangs' steps, by outcome (committed, bound, aborted).
    pub gangs: IntCounterVec,
    /// From a gang's parts being assigned to every part reporting its reservation.
    pub gang_reserve_seconds: Histogram,
    /// Loans of nodes between shards now, by phase (lending, active, returning).
    pub loans: IntGaugeVec,
    /// Loans' steps, by outcome (lent: the node joined its borrower; returning; returned).
    pub loan_outcomes: IntCounterVec,
    /// From a loan starting to return to its node being back home.
    pub loan_duration: Histogram,
}

impl FederationMetrics {
    /// Creates and registers the metrics in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<FederationMetrics> {
        let m = FederationMetrics::unregistered()?;
        m.register_into(registry)?;
        Ok(m)
    }

    /// Registers metrics made with [`FederationMetrics::unregistered`] in `registry`.
    pub fn register_into(&self, registry: &Registry) -> prometheus::Result<()> {
        let m = self;
        registry.register(Box::new(m.shards.clone()))?;
        registry.register(Box::new(m.shard_ready.clone()))?;
        registry.register(Box::new(m.placements.clone()))?;
        registry.register(Box::new(m.spilled_replicas.clone()))?;
        registry.register(Box::new(m.quota_held_replicas.clone()))?;
        registry.register(Box::new(m.map_changes.clone()))?;
        registry.register(Box::new(m.tenants_moved.clone()))?;
        registry.register(Box::new(m.summary_age.clone()))?;
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.propagation.clone()))?;
        registry.register(Box::new(m.decision.clone()))?;
        registry.register(Box::new(m.assignments.clone()))?;
        registry.register(Box::new(m.shard_reads.clone()))?;
        registry.register(Box::new(m.shard_tunnels.clone()))?;
        registry.register(Box::new(m.failovers.clone()))?;
        // Both modes from the start, at 0: a dashboard or an alert on failovers then sees
        // "none yet" rather than no series at all.
        for mode in [
            tessera_placement::FailoverMode::Fast,
            tessera_placement::FailoverMode::AtMostOnce,
        ] {
            m.failovers.with_label_values(&[mode.as_str()]);
        }
        registry.register(Box::new(m.failover_wait.clone()))?;
        registry.register(Box::new(m.moves.clone()))?;
        registry.register(Box::new(m.moves_in_progress.clone()))?;
        registry.register(Box::new(m.move_duration.clone()))?;
        registry.register(Box::new(m.moves_deferred.clone()))?;
        registry.register(Box::new(m.moves_stalled.clone()))?;
        registry.register(Box::new(m.gangs.clone()))?;
        registry.register(Box::new(m.gang_reserve_seconds.clone()))?;
        registry.register(Box::new(m.loans.clone()))?;
        registry.register(Box::new(m.loan_outcomes.clone()))?;
        registry.register(Box::new(m.loan_duration.clone()))?;
        Ok(())
    }

    /// Metrics no registry reads (tests, benchmarks).
    pub fn unregistered() -> prometheus::Result<FederationMetrics> {
        let fast = vec![
            0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1,
        ];
        Ok(FederationMetrics {
            shards: IntGaugeVec::new(
                Opts::new(
                    "tessera_federation_shards",
                    "Shards known to the federation, by state.",
                ),
                &["state"],
            )?,
            shard_ready: IntGaugeVec::new(
                Opts::new(
                    "tessera_federation_shard_ready",
                    "1 while the shard is ready (its agent holds the lease and its summary is \
                     fresh), 0 while it is known but not ready.",
                ),
                &["shard"],
            )?,
            placements: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_placements_total",
                    "Placement decisions, by mode and outcome (placed, partial, pending).",
                ),
                &["mode", "outcome"],
            )?,
            spilled_replicas: IntCounter::new(
                "tessera_federation_spilled_replicas_total",
                "Replicas placed on a shard other than the workload's first choice.",
            )?,
            quota_held_replicas: IntCounter::new(
                "tessera_federation_quota_held_replicas_total",
                "Replicas held back at a placement decision by the tenant's fleet-wide quota.",
            )?,
            map_changes: IntCounter::new(
                "tessera_federation_map_changes_total",
                "New versions of the tenant to shard map.",
            )?,
            tenants_moved: IntCounter::new(
                "tessera_federation_tenants_moved_total",
                "Tenants with workloads whose home shard changed with a new map.",
            )?,
            // Not `..._summary_age_seconds`: Prometheus' conventions (and `promtool check
            // metrics`) keep the names of metric types out of metric names.
            summary_age: IntGaugeVec::new(
                Opts::new(
                    "tessera_federation_shard_report_age_seconds",
                    "Seconds since each shard's last capacity report (its summary of nodes, \
                     room and pending work).",
                ),
                &["shard"],
            )?,
            refused: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_refused_total",
                    "Registrations and messages refused from shards' agents, by reason.",
                ),
                &["reason"],
            )?,
            propagation: Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_federation_propagation_seconds",
                    "From an assignment sent to a shard to the shard reporting the object applied.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
                ]),
            )?,
            decision: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_federation_decision_duration_seconds",
                    "Time to decide one workload's placement, by mode.",
                )
                .buckets(fast),
                &["mode"],
            )?,
            assignments: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_assignments_total",
                    "Assignments sent to shards, by operation.",
                ),
                &["op"],
            )?,
            shard_reads: IntCounter::new(
                "tessera_federation_shard_reads_total",
                "Reads (get, list, watch, pod log) sent to shards over their agents' streams.",
            )?,
            shard_tunnels: IntCounter::new(
                "tessera_federation_pod_streams_total",
                "Pod streams (exec, attach, port-forward) opened in shards and tunnelled over their agents' streams.",
            )?,
            failovers: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_failovers_total",
                    "Shares of workloads moved off a shard whose lease lapsed, by failover mode (AtMostOnce, Fast).",
                ),
                &["mode"],
            )?,
            failover_wait: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_federation_failover_wait_seconds",
                    "From a lost shard's lease ending to its share of a workload being released for placement elsewhere, by failover mode.",
                )
                .buckets(vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0]),
                &["mode"],
            )?,
            moves: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_moves_total",
                    "Moves of workloads between live shards begun, by why: rebalance (the shard map gave the tenant another home), drain (a NoExecute taint on the shard), decision (a new placement decision).",
                ),
                &["reason"],
            )?,
            moves_in_progress: IntGauge::new(
                "tessera_federation_moves_in_progress",
                "Workloads moving between live shards now (make-before-break or stop-then-start).",
            )?,
            move_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_federation_move_duration_seconds",
                    "From a move's start to its leaving shares being released, by failover mode.",
                )
                .buckets(vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
                &["mode"],
            )?,
            moves_deferred: IntCounter::new(
                "tessera_federation_moves_deferred_total",
                "Moves held back because --max-moving were under way.",
            )?,
            moves_stalled: IntCounter::new(
                "tessera_federation_moves_stalled_total",
                "Moves not finished after --move-timeout-seconds (a new copy that does not become available): they go on, without holding a --max-moving slot.",
            )?,
            gangs: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_gangs_total",
                    "Steps of federation-scope gangs divided over shards, by outcome: committed (every part reserved), bound (every part bound), aborted (every part removed, placed again after a back-off).",
                ),
                &["outcome"],
            )?,
            gang_reserve_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_federation_gang_reserve_seconds",
                    "From a federation-scope gang's parts being assigned to every part reporting its members reserved (the commit).",
                )
                .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0]),
            )?,
            loans: IntGaugeVec::new(
                Opts::new(
                    "tessera_federation_loans",
                    "Nodes lent from one shard to another now, by phase: lending (handed over, not joined yet), active, returning.",
                ),
                &["phase"],
            )?,
            loan_outcomes: IntCounterVec::new(
                Opts::new(
                    "tessera_federation_loans_total",
                    "Steps of node loans between shards, by outcome: lent (the node joined its borrower), returning (asked back), returned (back home).",
                ),
                &["outcome"],
            )?,
            loan_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_federation_loan_return_seconds",
                    "From a loan being asked back to its node being schedulable at home again (the borrower's drain included).",
                )
                .buckets(vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0]),
            )?,
        })
    }
}
