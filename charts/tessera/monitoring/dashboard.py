"""Generates dashboard.json, the Grafana dashboard of a Tessera fleet.

    .tools/venv/bin/python charts/tessera/monitoring/dashboard.py > charts/tessera/monitoring/dashboard.json

Built with the Grafana foundation SDK (Grafana's typed builders), so every field is one Grafana
knows. tests/monitoring.rs checks that the committed JSON is what this prints, and runs every
query of it against a real Prometheus scraping `tessera up --shards 3`: each must return data.

Queries use the `shard` target label (see rules.yml) and the `$datasource` and `$shard`
variables; `$__rate_interval` is Grafana's own.
"""

import json
import sys

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SHARD = 'shard=~"$shard"'


def query(expr: str, legend: str = "__auto") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).range()


def series(title: str, unit: str, description: str, *queries: prometheus.Dataquery, width: int = 8):
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(width)
        .legend(
            common.VizLegendOptions()
            .show_legend(True)
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
        )
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def single(title: str, unit: str, description: str, expr: str) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(4)
        .span(4)
        .with_target(prometheus.Dataquery().expr(expr).instant())
    )


def build() -> dashboard.Dashboard:
    d = (
        dashboard.Dashboard("Tessera fleet")
        .uid("tessera-fleet")
        .description("A Tessera federation and its shards: placement, scheduling, tenants, API and store.")
        .tags(["tessera", "kubernetes", "scheduler"])
        .refresh("10s")
        .time("now-1h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("shard")
            .label("Shard")
            .datasource(DATASOURCE)
            .query("label_values(tessera_scheduler_pending_pods, shard)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
        )
    )

    d = (
        d.with_row(dashboard.Row("Fleet"))
        .with_panel(single("Shards ready", "none", "Shards whose agent holds its lease and whose summary is fresh.", "sum(tessera_federation_shard_ready)"))
        .with_panel(single("Shards known", "none", "Shards that ever joined the federation.", "count(tessera_federation_shard_ready)"))
        .with_panel(single("Pods placed /s", "ops", "Pods bound by every shard's scheduler, per second.", "sum(shard:tessera_scheduler_scheduled_pods:rate5m)"))
        .with_panel(single("Pods pending", "none", "Pods waiting for a scheduler, over the fleet.", "sum(tessera_scheduler_pending_pods)"))
        .with_panel(single("Nodes", "none", "Nodes in the shards' schedulers.", "sum(tessera_scheduler_cache_nodes)"))
        .with_panel(single("Worst summary age", "s", "The oldest capacity summary the federation places with (a shard is taken out at 60 s).", "max(tessera_federation_shard_report_age_seconds)"))
        .with_panel(series(
            "Placement decisions", "ops", "The federation's placement decisions per second, by mode and outcome.",
            query("sum by (mode, outcome) (rate(tessera_federation_placements_total[$__rate_interval]))", "{{mode}} {{outcome}}"),
        ))
        .with_panel(series(
            "Shard summary age", "s", "Seconds since each shard's last capacity summary reached the federation.",
            query("max by (shard) (tessera_federation_shard_report_age_seconds)", "{{shard}}"),
        ))
        .with_panel(series(
            "Propagation p99", "s", "From an assignment sent to a shard to the shard reporting the copy applied.",
            query("histogram_quantile(0.99, sum by (le) (rate(tessera_federation_propagation_seconds_bucket[$__rate_interval])))", "p99"),
        ))
        .with_panel(series(
            "Shard leases", "s", "Seconds left on each shard's federation lease, as its agent sees it (renewed every lease/3).",
            query(f"min by (shard) (tessera_federation_agent_lease_remaining_seconds{{{SHARD}}})", "{{shard}}"),
        ))
        .with_panel(series(
            "Moves in progress", "none", "Workloads moving between shards (rebalancing, drains), and failovers of lost shards.",
            query("sum(tessera_federation_moves_in_progress)", "moving"),
            query("sum by (mode) (increase(tessera_federation_failovers_total[$__rate_interval]))", "failovers {{mode}}"),
        ))
    )

    shard_row = (
        dashboard.Row("Shard $shard")
        .repeat("shard")
        .with_panel(series(
            "Pods placed /s", "ops", "Pods the shard's scheduler bound, per second.",
            query(f'sum by (shard) (rate(tessera_scheduler_schedule_attempts_total{{{SHARD}, result="scheduled"}}[$__rate_interval]))', "{{shard}}"),
        ))
        .with_panel(series(
            "Pods pending by queue", "none", "Pods waiting in the scheduler's active, backoff and unschedulable queues.",
            query(f"sum by (queue) (tessera_scheduler_pending_pods{{{SHARD}}})", "{{queue}}"),
        ))
        .with_panel(series(
            "Pods on nodes", "none", "Pods counted on the shard's nodes (bound and assumed), and nodes.",
            query(f"sum(tessera_scheduler_cache_pods{{{SHARD}}})", "pods"),
            query(f"sum(tessera_scheduler_cache_nodes{{{SHARD}}})", "nodes"),
        ))
    )
    d = d.with_row(shard_row)

    d = (
        d.with_row(dashboard.Row("Tenants"))
        .with_panel(series(
            "Pending pods by tenant", "none", "Pods waiting for the scheduler, per tenant (<none>: namespaces no Tenant owns).",
            query(f"sum by (tenant) (tessera_scheduler_tenant_pending_pods{{{SHARD}}})", "{{tenant}}"),
        ))
        .with_panel(series(
            "Dominant share by tenant", "percentunit", "Each tenant's weighted dominant share of its shards: the scheduler serves the lowest first.",
            query(f"max by (tenant) (tessera_scheduler_tenant_dominant_share{{{SHARD}}})", "{{tenant}}"),
        ))
        .with_panel(series(
            "Queue wait p99 by tenant", "s", "From a pod entering the queue to its binding, per tenant.",
            query(f"histogram_quantile(0.99, sum by (tenant, le) (rate(tessera_scheduler_tenant_queue_wait_seconds_bucket{{{SHARD}}}[$__rate_interval])))", "{{tenant}}"),
        ))
    )

    d = (
        d.with_row(dashboard.Row("Scheduler"))
        .with_panel(series(
            "Attempts by result", "ops", "Scheduling attempts per second: scheduled, unschedulable, error.",
            query(f"sum by (result) (rate(tessera_scheduler_schedule_attempts_total{{{SHARD}}}[$__rate_interval]))", "{{result}}"),
        ))
        .with_panel(series(
            "Scheduling cycle p99", "s", "The scheduling cycle (filter, score, reserve, permit) and the binding cycle.",
            query(f"histogram_quantile(0.99, sum by (le) (rate(tessera_scheduler_scheduling_attempt_duration_seconds_bucket{{{SHARD}}}[$__rate_interval])))", "scheduling"),
            query(f"histogram_quantile(0.99, sum by (le) (rate(tessera_scheduler_binding_duration_seconds_bucket{{{SHARD}}}[$__rate_interval])))", "binding"),
        ))
        .with_panel(series(
            "Work queues by event class", "none", "Keys waiting in the controllers' work queues, by event class.",
            query(f"sum by (class) (tessera_workqueue_depth{{{SHARD}}})", "{{class}}"),
        ))
    )

    d = (
        d.with_row(dashboard.Row("API"))
        .with_panel(series(
            "Requests by code", "reqps", "API requests per second, by HTTP status code.",
            query(f"sum by (code) (rate(tessera_apiserver_requests_total{{{SHARD}}}[$__rate_interval]))", "{{code}}"),
        ))
        .with_panel(series(
            "Latency p99 by verb", "s", "API request latency, 99th percentile by verb (watches left out: long by design).",
            query(f'histogram_quantile(0.99, sum by (verb, le) (rate(tessera_apiserver_request_duration_seconds_bucket{{{SHARD}, verb!~"watch|connect"}}[$__rate_interval])))', "{{verb}}"),
        ))
        .with_panel(series(
            "Watches and requests in flight", "none", "Open watches and requests being served.",
            query(f"sum(tessera_apiserver_watches{{{SHARD}}})", "watches"),
            query(f"sum(tessera_apiserver_inflight_requests{{{SHARD}}})", "in flight"),
        ))
    )

    d = (
        d.with_row(dashboard.Row("Store"))
        .with_panel(series(
            "Commit p99", "s", "Store transactions, 99th percentile, by backend; and the embedded store's log flush.",
            query(f'histogram_quantile(0.99, sum by (backend, le) (rate(tessera_store_request_duration_seconds_bucket{{{SHARD}, op="txn"}}[$__rate_interval])))', "txn {{backend}}"),
            query(f"histogram_quantile(0.99, sum by (le) (rate(tessera_store_embedded_fsync_duration_seconds_bucket{{{SHARD}}}[$__rate_interval])))", "fsync"),
        ))
        .with_panel(series(
            "Requests by operation", "ops", "Store requests per second, by operation.",
            query(f"sum by (op) (rate(tessera_store_requests_total{{{SHARD}}}[$__rate_interval]))", "{{op}}"),
        ))
        .with_panel(series(
            "Log written", "Bps", "Bytes appended to the embedded store's log, per second.",
            query(f"sum by (shard) (rate(tessera_store_embedded_wal_bytes_total{{{SHARD}}}[$__rate_interval]))", "{{shard}}"),
        ))
    )
    return d


if __name__ == "__main__":
    json.dump(build().build(), sys.stdout, cls=JSONEncoder, indent=2, sort_keys=True)
    sys.stdout.write("\n")
