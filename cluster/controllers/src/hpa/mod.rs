//! The HorizontalPodAutoscaler controller (`autoscaling/v2`), as kube-controller-manager's:
//! every sync period each HPA reads its target's `scale` subresource, the pods its selector
//! picks and their usage from `metrics.k8s.io` (which the API server serves from the node
//! agents' reports, or simulates for simulated nodes), computes the replicas each metric asks
//! for ([`replicas`]), takes the largest, normalizes it ([`behavior`]: stabilization windows,
//! rate policies, bounds) and writes the target's scale and the HPA's status — current and
//! desired replicas, current metrics, `AbleToScale`, `ScalingActive` and `ScalingLimited`
//! conditions — with an Event for each rescale.
//!
//! Metrics of type Pods, Object and External need a custom or external metrics API, which
//! this server does not serve: such a metric is reported invalid (as Kubernetes reports one
//! whose API is missing) and the others still count.

pub mod behavior;
pub mod replicas;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::autoscaling::v2::{
    HPAScalingRules, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use parking_lot::Mutex;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use serde_json::{Value, json};
use tessera_client::catalog::{self, Resource};
use tessera_client::request::{ApiRequest, PatchType, Verb};
use tessera_core::quantity::Quantity;
use tessera_core::selector::label::LabelSelector;
use tessera_core::time::rfc3339;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, Change, key_of};

use crate::context::{Context, res};
use behavior::{Bounds, History, Limit, Normalized, Policy, Rules, Select, Stabilized};
use replicas::{PodState, Proposal, Sample, Target};

/// The controller's name.
pub const NAME: &str = "horizontal-pod-autoscaler";

/// The controller's settings, as kube-controller-manager's `--horizontal-pod-autoscaler-*`
/// flags.
#[derive(Clone, Debug)]
pub struct HpaConfig {
    /// How often each HPA is looked at (15 s).
    pub sync_period: Duration,
    /// The ratio of usage to target within which nothing changes (0.1).
    pub tolerance: f64,
    /// How far back a scale-down looks for higher recommendations, when the HPA's behavior
    /// does not say (5 min).
    pub downscale_stabilization: Duration,
    /// How long after a pod starts its CPU samples may be skipped while it is not ready (5 min).
    pub cpu_initialization_period: Duration,
    /// How long after a pod starts a not-ready pod that was never ready is left out (30 s).
    pub initial_readiness_delay: Duration,
}

impl Default for HpaConfig {
    fn default() -> Self {
        HpaConfig {
            sync_period: Duration::from_secs(15),
            tolerance: 0.1,
            downscale_stabilization: Duration::from_secs(300),
            cpu_initialization_period: Duration::from_secs(300),
            initial_readiness_delay: Duration::from_secs(30),
        }
    }
}

/// The controller's own metrics.
#[derive(Clone)]
pub struct HpaMetrics {
    reconciliations: IntCounterVec,
    duration: HistogramVec,
    computations: IntCounterVec,
}

impl std::fmt::Debug for HpaMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HpaMetrics")
    }
}

impl HpaMetrics {
    /// Creates and registers the metrics in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<HpaMetrics> {
        let m = HpaMetrics {
            reconciliations: IntCounterVec::new(
                Opts::new(
                    "tessera_hpa_reconciliations_total",
                    "HPA syncs, by what they did (scale_up, scale_down, none) and the error (none, spec, internal).",
                ),
                &["action", "error"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_hpa_reconciliation_duration_seconds",
                    "Time of one HPA sync, by its action.",
                )
                .buckets(prometheus::exponential_buckets(0.0005, 2.0, 14)?),
                &["action"],
            )?,
            computations: IntCounterVec::new(
                Opts::new(
                    "tessera_hpa_metric_computations_total",
                    "Replica proposals computed from one metric, by metric type and error (none, spec, internal).",
                ),
                &["metric_type", "error"],
            )?,
        };
        registry.register(Box::new(m.reconciliations.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.computations.clone()))?;
        Ok(m)
    }
}

struct Hpas {
    ctx: Context,
    config: HpaConfig,
    hpas: Arc<Cache<HorizontalPodAutoscaler>>,
    pods: Arc<Cache<Pod>>,
    crds: Arc<Cache<CustomResourceDefinition>>,
    /// Per HPA (by uid): recommendations and scale events.
    history: Mutex<HashMap<String, History>>,
    recorder: Recorder,
    metrics: Option<HpaMetrics>,
}

/// The controller's informers and reconciler, for running it or syncing HPAs one at a time
/// (`tessera bench hpa`).
pub struct Autoscaler {
    hpas: Arc<tessera_runtime::informer::Informer<HorizontalPodAutoscaler>>,
    pods: Arc<tessera_runtime::informer::Informer<Pod>>,
    crds: Arc<tessera_runtime::informer::Informer<CustomResourceDefinition>>,
    inner: Arc<Hpas>,
}

impl Autoscaler {
    /// The autoscaler of `ctx`'s shard (its shared informers start if they were not running).
    pub fn new(ctx: &Context, config: HpaConfig, metrics: Option<HpaMetrics>) -> Autoscaler {
        let hpas =
            ctx.informer::<HorizontalPodAutoscaler>(res("autoscaling", "horizontalpodautoscalers"));
        let pods = ctx.informer::<Pod>(res("", "pods"));
        let crds = ctx.informer::<CustomResourceDefinition>(res(
            catalog::APIEXTENSIONS,
            "customresourcedefinitions",
        ));
        let inner = Arc::new(Hpas {
            recorder: ctx.recorder(NAME),
            hpas: hpas.cache().clone(),
            pods: pods.cache().clone(),
            crds: crds.cache().clone(),
            history: Mutex::new(HashMap::new()),
            ctx: ctx.clone(),
            config,
            metrics,
        });
        Autoscaler {
            hpas,
            pods,
            crds,
            inner,
        }
    }

    /// Waits until the informers have listed everything.
    pub async fn synced(&self) {
        self.hpas.synced().await;
        self.pods.synced().await;
        self.crds.synced().await;
    }

    /// The keys (`namespace/name`) of the HPAs there are.
    pub fn keys(&self) -> Vec<String> {
        self.inner
            .hpas
            .list()
            .iter()
            .map(|h| key_of(&h.metadata))
            .collect()
    }

    /// One sync of the HPA at `key`.
    pub async fn sync(&self, key: &str) -> Result<(), ReconcileError> {
        self.inner.reconcile(key).await.map(|_| ())
    }
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context, config: HpaConfig, metrics: Option<HpaMetrics>) {
    let Autoscaler {
        hpas,
        pods,
        crds,
        inner: r,
    } = Autoscaler::new(&ctx, config, metrics);
    // Pods are read, not watched: each HPA is looked at every sync period, as in Kubernetes.
    // A new HPA or a change of its spec is looked at at once; its own status writes are not
    // a reason to look again before the period ends.
    ctx.controller(NAME)
        .watches_with(&hpas, |c, q| {
            if let Change::Updated { old, new } = c
                && old.metadata.generation == new.metadata.generation
                && old.metadata.labels == new.metadata.labels
            {
                return;
            }
            if !matches!(c, Change::Deleted(_)) {
                q.add(key_of(&c.object().metadata), c.class());
            }
        })
        .reads(&pods)
        .reads(&crds)
        .run(r)
        .await;
}

/// One metric's outcome: its proposal and its `currentMetrics` entry, or why it failed.
type MetricOutcome = Result<(Proposal, Value, String), String>;

/// The status conditions being built, each (type, status, reason, message).
#[derive(Default)]
struct Conditions(Vec<(&'static str, &'static str, String, String)>);

impl Conditions {
    fn set(&mut self, ty: &'static str, status: &'static str, reason: &str, message: String) {
        self.0.retain(|c| c.0 != ty);
        self.0.push((ty, status, reason.to_owned(), message));
    }
}

fn milli_of(q: &str) -> Option<i64> {
    q.parse::<Quantity>().ok().map(|q| q.milli_ceil())
}

/// A Kubernetes quantity for `milli` thousandths.
fn quantity(milli: i64) -> String {
    Quantity::from_milli(milli).to_string()
}

/// The HPA's rules in one direction, with its defaults and the controller's scale-down
/// window where the HPA gives none.
fn rules_of(r: Option<&HPAScalingRules>, up: bool, default_down_window: Duration) -> Rules {
    let window_s = r
        .and_then(|r| r.stabilization_window_seconds)
        .map(i64::from);
    let window_ms = match (window_s, up) {
        (Some(s), _) => s * 1_000,
        (None, true) => 0,
        (None, false) => default_down_window.as_millis() as i64,
    };
    let select = match r.and_then(|r| r.select_policy.as_deref()) {
        Some("Min") => Select::Min,
        Some("Disabled") => Select::Disabled,
        _ => Select::Max,
    };
    let mut policies: Vec<Policy> = r
        .and_then(|r| r.policies.as_ref())
        .into_iter()
        .flatten()
        .map(|p| Policy {
            pods: p.type_ == "Pods",
            value: i64::from(p.value),
            period_ms: i64::from(p.period_seconds) * 1_000,
        })
        .collect();
    if policies.is_empty() {
        let per_15s = |pods, value| Policy {
            pods,
            value,
            period_ms: 15_000,
        };
        policies = if up {
            vec![per_15s(true, 4), per_15s(false, 100)]
        } else {
            vec![per_15s(false, 100)]
        };
    }
    Rules {
        window_ms,
        select,
        policies,
    }
}

impl Hpas {
    /// The served resource of a scale target reference, if it has a `scale` subresource.
    fn target_resource(&self, api_version: &str, kind: &str) -> Result<&'static Resource, String> {
        let with_scale = |r: &&'static Resource| r.subresources.iter().any(|s| s.name == "scale");
        if let Some(r) = catalog::find_kind(api_version, kind).filter(with_scale) {
            return Ok(r);
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        for crd in self.crds.list() {
            let Ok(v) = serde_json::to_value(&*crd) else {
                continue;
            };
            if v["spec"]["group"] == group
                && v["spec"]["names"]["kind"] == kind
                && let Some(r) = catalog::custom_resource(&v, version).filter(with_scale)
            {
                return Ok(r);
            }
        }
        Err(format!(
            "the HPA controller was unable to get the target's current scale: no scalable resource of kind {kind:?} in {api_version:?} (the scale subresource of a Deployment, StatefulSet, ReplicaSet or a custom resource that serves one)"
        ))
    }

    /// Samples of the pods `selector` picks in `ns` for `resource` (in `container`, or all).
    fn samples(
        &self,
        ns: &str,
        selector: &LabelSelector,
        usage: &HashMap<String, (Value, Timestamp, Duration)>,
        resource: &str,
        container: Option<&str>,
        now: Timestamp,
    ) -> Result<Vec<Sample>, String> {
        let mut out = Vec::new();
        for pod in self.pods.select(Some(ns), selector) {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            if pod.metadata.deletion_timestamp.is_some()
                || phase == "Failed"
                || phase == "Succeeded"
            {
                continue;
            }
            let mut request = 0i64;
            for c in pod
                .spec
                .as_ref()
                .map(|s| &s.containers)
                .into_iter()
                .flatten()
            {
                if container.is_some_and(|want| want != c.name) {
                    continue;
                }
                let r = c
                    .resources
                    .as_ref()
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get(resource))
                    .and_then(|q| milli_of(&q.0));
                match r {
                    Some(r) => request += r,
                    None => {
                        return Err(format!(
                            "missing request for {resource} in container {} of Pod {name}",
                            c.name
                        ));
                    }
                }
            }
            if phase == "Pending" {
                out.push(Sample {
                    state: PodState::Unready,
                    usage: 0,
                    request,
                });
                continue;
            }
            let Some((containers, at, window)) = usage.get(name) else {
                out.push(Sample {
                    state: PodState::Missing,
                    usage: 0,
                    request,
                });
                continue;
            };
            let used: i64 = containers
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| container.is_none_or(|want| c["name"] == want))
                .filter_map(|c| c["usage"][resource].as_str().and_then(milli_of))
                .sum();
            let unready = resource == "cpu" && self.unready_for_cpu(&pod, *at, *window, now);
            out.push(Sample {
                state: if unready {
                    PodState::Unready
                } else {
                    PodState::Ready
                },
                usage: used,
                request,
            });
        }
        Ok(out)
    }

    /// Kubernetes' rule for CPU samples of starting pods: within the initialization period a
    /// sample counts once the pod is ready and a whole window was measured since; after it,
    /// only a pod that never became ready within the readiness delay is left out.
    fn unready_for_cpu(&self, pod: &Pod, at: Timestamp, window: Duration, now: Timestamp) -> bool {
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        let started = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
        let (Some(ready), Some(started)) = (ready, started) else {
            return true;
        };
        let changed = ready.last_transition_time.as_ref().map_or(started, |t| t.0);
        let span = |d: Duration| jiff::SignedDuration::try_from(d).unwrap_or_default();
        if started + span(self.config.cpu_initialization_period) > now {
            ready.status == "False" || at < changed + span(window)
        } else {
            ready.status == "False" && started + span(self.config.initial_readiness_delay) > changed
        }
    }

    /// One metric's proposal at `current` replicas.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        m: &MetricSpec,
        ns: &str,
        selector: &LabelSelector,
        usage: &Result<HashMap<String, (Value, Timestamp, Duration)>, String>,
        current: i32,
        now: Timestamp,
    ) -> MetricOutcome {
        let (name, container, target) = match m.type_.as_str() {
            "Resource" => {
                let r = m
                    .resource
                    .as_ref()
                    .ok_or("a Resource metric without `resource`")?;
                (r.name.clone(), None, &r.target)
            }
            "ContainerResource" => {
                let r = m
                    .container_resource
                    .as_ref()
                    .ok_or("a ContainerResource metric without `containerResource`")?;
                (r.name.clone(), Some(r.container.clone()), &r.target)
            }
            other => {
                return Err(format!(
                    "unable to get {} metric: the {} metrics API is not served by this control plane (only metrics.k8s.io: Resource and ContainerResource metrics)",
                    other.to_lowercase(),
                    if other == "External" {
                        "external.metrics.k8s.io"
                    } else {
                        "custom.metrics.k8s.io"
                    }
                ));
            }
        };
        let usage = usage.as_ref().map_err(|e| {
            format!(
                "failed to get {name} utilization: unable to get metrics for resource {name}: {e}"
            )
        })?;
        let target_kind = match (
            target.type_.as_str(),
            target.average_utilization,
            &target.average_value,
        ) {
            ("Utilization", Some(u), _) => Target::Utilization(i64::from(u)),
            ("AverageValue", _, Some(v)) => {
                Target::AverageValue(milli_of(&v.0).unwrap_or(0).max(1))
            }
            _ => return Err(format!("invalid target for the {name} metric")),
        };
        let samples = self
            .samples(ns, selector, usage, &name, container.as_deref(), now)
            .map_err(|e| format!("failed to get {name} utilization: {e}"))?;
        let p = replicas::propose(current, &samples, target_kind, self.config.tolerance)
            .map_err(|e| format!("failed to get {name} utilization: {e}"))?;
        let mut current_value = json!({"averageValue": quantity(p.average)});
        if let Some(u) = p.utilization {
            current_value["averageUtilization"] = json!(u);
        }
        let (field, status, described) = match &container {
            None => (
                "resource",
                json!({"name": name, "current": current_value}),
                format!(
                    "{name} resource{}",
                    if p.utilization.is_some() {
                        " utilization (percentage of request)"
                    } else {
                        ""
                    }
                ),
            ),
            Some(c) => (
                "containerResource",
                json!({"name": name, "container": c, "current": current_value}),
                format!(
                    "{name} container resource{}",
                    if p.utilization.is_some() {
                        " utilization (percentage of request)"
                    } else {
                        ""
                    }
                ),
            ),
        };
        Ok((p, json!({"type": m.type_, field: status}), described))
    }

    fn count(&self, action: &str, error: &str, started: std::time::Instant) {
        if let Some(m) = &self.metrics {
            m.reconciliations.with_label_values(&[action, error]).inc();
            m.duration
                .with_label_values(&[action])
                .observe(started.elapsed().as_secs_f64());
        }
    }

    /// Writes `status` if it differs from what the HPA has; conditions keep their transition
    /// time while their status stays.
    async fn write_status(
        &self,
        hpa: &HorizontalPodAutoscaler,
        mut status: Value,
        conditions: Conditions,
        now: Timestamp,
    ) -> Result<(), ReconcileError> {
        let old = serde_json::to_value(hpa.status.clone().unwrap_or_default()).unwrap_or_default();
        let old_conditions = old["conditions"].as_array().cloned().unwrap_or_default();
        let conds: Vec<Value> = conditions
            .0
            .into_iter()
            .map(|(ty, st, reason, message)| {
                let since = old_conditions
                    .iter()
                    .find(|c| c["type"] == ty && c["status"] == st)
                    .map_or_else(
                        || json!(rfc3339(now.as_second())),
                        |c| c["lastTransitionTime"].clone(),
                    );
                json!({"type": ty, "status": st, "lastTransitionTime": since,
                    "reason": reason, "message": message})
            })
            .collect();
        status["conditions"] = json!(conds);
        if status["lastScaleTime"].is_null() && !old["lastScaleTime"].is_null() {
            status["lastScaleTime"] = old["lastScaleTime"].clone();
        }
        status["observedGeneration"] = json!(hpa.metadata.generation.unwrap_or(0));
        let same = |k: &str| status[k] == old[k] || (status[k].is_null() && old[k].is_null());
        if [
            "currentReplicas",
            "desiredReplicas",
            "currentMetrics",
            "conditions",
            "lastScaleTime",
            "observedGeneration",
        ]
        .iter()
        .all(|k| same(k))
        {
            return Ok(());
        }
        let ns = hpa.metadata.namespace.as_deref().unwrap_or_default();
        let name = hpa.metadata.name.as_deref().unwrap_or_default();
        let mut patch = json!({"status": status});
        for k in ["currentMetrics", "lastScaleTime"] {
            if patch["status"][k].is_null() {
                // A merge patch removes with null.
                patch["status"][k] = Value::Null;
            }
        }
        match self
            .ctx
            .client
            .patch(
                res("autoscaling", "horizontalpodautoscalers"),
                Some(ns),
                name,
                Some("status"),
                PatchType::Merge,
                &patch,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait]
impl Reconciler for Hpas {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let started = std::time::Instant::now();
        let Some(hpa) = self.hpas.get(key) else {
            return Ok(Action::Done);
        };
        let uid = hpa.metadata.uid.clone().unwrap_or_default();
        if hpa.metadata.deletion_timestamp.is_some() {
            self.history.lock().remove(&uid);
            return Ok(Action::Done);
        }
        // Forget HPAs that are gone (bounded by the HPAs there are).
        {
            let mut history = self.history.lock();
            if history.len() > self.hpas.len() {
                let live: std::collections::HashSet<String> = self
                    .hpas
                    .list()
                    .iter()
                    .filter_map(|h| h.metadata.uid.clone())
                    .collect();
                history.retain(|k, _| live.contains(k));
            }
        }
        let next = Action::RequeueAfter(self.config.sync_period);
        let ns = hpa.metadata.namespace.clone().unwrap_or_default();
        let spec: HorizontalPodAutoscalerSpec = hpa.spec.clone().unwrap_or_default();
        let r = ObjectRef::new("autoscaling/v2", "HorizontalPodAutoscaler", &hpa.metadata);
        let now = self.ctx.clock.now();
        let old = hpa.status.clone().unwrap_or_default();
        let mut conditions = Conditions::default();
        let mut status = json!({
            "currentReplicas": old.current_replicas.unwrap_or(0),
            "desiredReplicas": old.desired_replicas,
        });
        if let Some(m) = &old.current_metrics {
            status["currentMetrics"] = serde_json::to_value(m).unwrap_or_default();
        }
        let target_ref = &spec.scale_target_ref;
        let api_version = target_ref.api_version.clone().unwrap_or_default();
        // Reading the target's scale.
        let scale = match self.target_resource(&api_version, &target_ref.kind) {
            Err(e) => Err(e),
            Ok(target) => {
                let mut req = ApiRequest::new(Verb::Get, target);
                req.namespace = Some(ns.clone());
                req.name = Some(target_ref.name.clone());
                req.subresource = Some("scale".into());
                match self.ctx.client.call(req).await {
                    Ok(resp) => Ok((target, resp.into_value().unwrap_or_default())),
                    Err(e) if e.code >= 500 || e.code == 429 => return Err(e.into()),
                    Err(e) => Err(format!(
                        "the HPA controller was unable to get the target's current scale: {}",
                        e.message
                    )),
                }
            }
        };
        let (target, scale) = match scale {
            Ok(s) => s,
            Err(e) => {
                self.recorder
                    .event(&r, EventType::Warning, "FailedGetScale", &e);
                conditions.set("AbleToScale", "False", "FailedGetScale", e);
                self.write_status(&hpa, status, conditions, now).await?;
                self.count("none", "spec", started);
                return Ok(next);
            }
        };
        conditions.set(
            "AbleToScale",
            "True",
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale".into(),
        );
        let current = scale["spec"]["replicas"].as_i64().unwrap_or(0) as i32;
        status["currentReplicas"] = json!(scale["status"]["replicas"].as_i64().unwrap_or(0));
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;
        let (desired, reason) = if current == 0 && min != 0 {
            conditions.set(
                "ScalingActive",
                "False",
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero".into(),
            );
            (0, String::new())
        } else if current > max {
            (
                max,
                "Current number of replicas above Spec.MaxReplicas".to_owned(),
            )
        } else if current < min {
            (
                min,
                "Current number of replicas below Spec.MinReplicas".to_owned(),
            )
        } else {
            match self
                .recommend(
                    &hpa,
                    &spec,
                    &ns,
                    &scale,
                    current,
                    now,
                    &r,
                    &mut conditions,
                    &mut status,
                )
                .await
            {
                Ok(d) => d,
                Err(e) => {
                    self.write_status(&hpa, status, conditions, now).await?;
                    self.count("none", "internal", started);
                    return Err(e);
                }
            }
        };
        let desired = if desired < 0 { current } else { desired };
        status["desiredReplicas"] = json!(desired);
        let action = match desired.cmp(&current) {
            std::cmp::Ordering::Greater => "scale_up",
            std::cmp::Ordering::Less => "scale_down",
            std::cmp::Ordering::Equal => "none",
        };
        if desired != current {
            let mut patch = json!({"spec": {"replicas": desired}});
            if let Some(rv) = scale["metadata"]["resourceVersion"].as_str() {
                patch["metadata"] = json!({"resourceVersion": rv});
            }
            let written = self
                .ctx
                .client
                .patch(
                    target,
                    Some(&ns),
                    &target_ref.name,
                    Some("scale"),
                    PatchType::Merge,
                    &patch,
                )
                .await;
            match written {
                Ok(_) => {
                    conditions.set(
                        "AbleToScale",
                        "True",
                        "SucceededRescale",
                        format!(
                            "the HPA controller was able to update the target scale to {desired}"
                        ),
                    );
                    self.recorder.event(
                        &r,
                        EventType::Normal,
                        "SuccessfulRescale",
                        &format!("New size: {desired}; reason: {reason}"),
                    );
                    status["lastScaleTime"] = json!(rfc3339(now.as_second()));
                    if spec.behavior.is_some() {
                        let behavior = spec.behavior.as_ref();
                        let up = rules_of(
                            behavior.and_then(|b| b.scale_up.as_ref()),
                            true,
                            self.config.downscale_stabilization,
                        );
                        let down = rules_of(
                            behavior.and_then(|b| b.scale_down.as_ref()),
                            false,
                            self.config.downscale_stabilization,
                        );
                        self.history.lock().entry(uid).or_default().record_scale(
                            now.as_millisecond(),
                            current,
                            desired,
                            &up,
                            &down,
                        );
                    }
                    tracing::info!(hpa = %key, from = current, to = desired, %reason, "rescaled");
                }
                Err(e) => {
                    let message = format!(
                        "failed to rescale {}/{}: {}",
                        target_ref.kind, target_ref.name, e.message
                    );
                    self.recorder
                        .event(&r, EventType::Warning, "FailedRescale", &message);
                    conditions.set("AbleToScale", "False", "FailedUpdateScale", message);
                    self.write_status(&hpa, status, conditions, now).await?;
                    self.count(action, "internal", started);
                    return Err(e.into());
                }
            }
        }
        self.write_status(&hpa, status, conditions, now).await?;
        self.count(action, "none", started);
        Ok(next)
    }
}

impl Hpas {
    /// The replicas the metrics ask for, normalized, and the reason to give for a rescale;
    /// fills in the conditions and current metrics.
    #[allow(clippy::too_many_arguments)]
    async fn recommend(
        &self,
        hpa: &HorizontalPodAutoscaler,
        spec: &HorizontalPodAutoscalerSpec,
        ns: &str,
        scale: &Value,
        current: i32,
        now: Timestamp,
        r: &ObjectRef,
        conditions: &mut Conditions,
        status: &mut Value,
    ) -> Result<(i32, String), ReconcileError> {
        let selector_text = scale["status"]["selector"].as_str().unwrap_or_default();
        let selector = match selector_text.parse::<LabelSelector>() {
            Ok(s) if !selector_text.is_empty() => s,
            _ => {
                let message = format!(
                    "the HPA target's scale is missing a selector{}",
                    if selector_text.is_empty() {
                        String::new()
                    } else {
                        format!(" (could not parse {selector_text:?})")
                    }
                );
                self.recorder
                    .event(r, EventType::Warning, "InvalidSelector", &message);
                conditions.set("ScalingActive", "False", "InvalidSelector", message);
                return Ok((-1, String::new()));
            }
        };
        let usage = self.usage(ns, selector_text).await;
        let metrics = spec.metrics.clone().unwrap_or_default();
        let mut best: Option<(i32, String)> = None;
        let mut current_metrics = Vec::new();
        let mut errors = Vec::new();
        for m in &metrics {
            let outcome = self.compute(m, ns, &selector, &usage, current, now);
            if let Some(mm) = &self.metrics {
                let error = match &outcome {
                    Ok(_) => "none",
                    Err(_) if matches!(m.type_.as_str(), "Resource" | "ContainerResource") => {
                        "internal"
                    }
                    Err(_) => "spec",
                };
                mm.computations
                    .with_label_values(&[m.type_.as_str(), error])
                    .inc();
            }
            match outcome {
                Ok((p, entry, described)) => {
                    current_metrics.push(entry);
                    if best.as_ref().is_none_or(|(b, _)| p.replicas > *b) {
                        best = Some((p.replicas, described));
                    }
                }
                Err(e) => {
                    // An empty entry keeps the TARGETS column aligned with the spec.
                    current_metrics.push(json!({"type": ""}));
                    errors.push(e);
                }
            }
        }
        if current_metrics.iter().any(|m| m["type"] != "") {
            status["currentMetrics"] = json!(current_metrics);
        } else {
            status["currentMetrics"] = Value::Null;
        }
        let invalid = errors.len();
        let (proposed, described) = match best {
            Some(b) if invalid == 0 || b.0 >= current => b,
            _ => {
                let first = errors
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "no metrics".into());
                let reason = if metrics
                    .iter()
                    .all(|m| matches!(m.type_.as_str(), "Resource" | "ContainerResource"))
                {
                    "FailedGetResourceMetric"
                } else {
                    "FailedGetExternalMetric"
                };
                self.recorder.event(r, EventType::Warning, reason, &first);
                self.recorder.event(
                    r,
                    EventType::Warning,
                    "FailedComputeMetricsReplicas",
                    &format!(
                        "invalid metrics ({invalid} invalid out of {}), first error is: {first}",
                        metrics.len()
                    ),
                );
                conditions.set(
                    "ScalingActive",
                    "False",
                    reason,
                    format!("the HPA was unable to compute the replica count: {first}"),
                );
                return Ok((-1, String::new()));
            }
        };
        conditions.set(
            "ScalingActive",
            "True",
            "ValidMetricFound",
            format!("the HPA was able to successfully calculate a replica count from {described}"),
        );
        let bounds = Bounds {
            min: spec.min_replicas.unwrap_or(1),
            max: spec.max_replicas,
        };
        let uid = hpa.metadata.uid.clone().unwrap_or_default();
        let n: Normalized = {
            let mut history = self.history.lock();
            let h = history.entry(uid).or_default();
            match &spec.behavior {
                None => h.normalize(
                    now.as_millisecond(),
                    current,
                    proposed,
                    bounds,
                    self.config.downscale_stabilization.as_millis() as i64,
                ),
                Some(b) => {
                    let up = rules_of(
                        b.scale_up.as_ref(),
                        true,
                        self.config.downscale_stabilization,
                    );
                    let down = rules_of(
                        b.scale_down.as_ref(),
                        false,
                        self.config.downscale_stabilization,
                    );
                    h.normalize_with(now.as_millisecond(), current, proposed, bounds, &up, &down)
                }
            }
        };
        match n.stabilized {
            Stabilized::Down => conditions.set(
                "AbleToScale",
                "True",
                "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation".into(),
            ),
            Stabilized::Up => conditions.set(
                "AbleToScale",
                "True",
                "ScaleUpStabilized",
                "recent recommendations were lower than current one, applying the lowest recent recommendation".into(),
            ),
            Stabilized::No => conditions.set(
                "AbleToScale",
                "True",
                "ReadyForNewScale",
                "recommended size matches current size".into(),
            ),
        }
        let (reason, message) = n.limit.reason();
        conditions.set(
            "ScalingLimited",
            if n.limit == Limit::WithinRange {
                "False"
            } else {
                "True"
            },
            reason,
            message.into(),
        );
        let why = if n.replicas > current {
            format!("{described} above target")
        } else {
            "All metrics below target".to_owned()
        };
        Ok((n.replicas, why))
    }

    /// The usage of the pods `selector` picks in `ns`, by pod: (containers, time, window).
    async fn usage(
        &self,
        ns: &str,
        selector: &str,
    ) -> Result<HashMap<String, (Value, Timestamp, Duration)>, String> {
        let list = self
            .ctx
            .client
            .pod_metrics(ns, selector)
            .await
            .map_err(|e| e.message)?;
        let mut out = HashMap::new();
        for item in list["items"].as_array().into_iter().flatten() {
            let Some(name) = item["metadata"]["name"].as_str() else {
                continue;
            };
            let at = item["timestamp"]
                .as_str()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .unwrap_or_else(Timestamp::now);
            let window = item["window"]
                .as_str()
                .and_then(|w| w.trim_end_matches('s').parse::<f64>().ok())
                .map_or(Duration::from_secs(30), Duration::from_secs_f64);
            out.insert(name.to_owned(), (item["containers"].clone(), at, window));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_default_as_kubernetes_and_take_the_controllers_window() {
        let down = rules_of(None, false, Duration::from_secs(300));
        assert_eq!(down.window_ms, 300_000);
        assert_eq!(down.policies.len(), 1);
        let up = rules_of(None, true, Duration::from_secs(300));
        assert_eq!((up.window_ms, up.select), (0, Select::Max));
        assert_eq!(up.policies.len(), 2);
        let given = HPAScalingRules {
            stabilization_window_seconds: Some(10),
            select_policy: Some("Disabled".into()),
            policies: Some(vec![k8s_openapi::api::autoscaling::v2::HPAScalingPolicy {
                type_: "Pods".into(),
                value: 1,
                period_seconds: 60,
            }]),
        };
        let r = rules_of(Some(&given), false, Duration::from_secs(300));
        assert_eq!((r.window_ms, r.select), (10_000, Select::Disabled));
        assert_eq!(
            r.policies,
            vec![Policy {
                pods: true,
                value: 1,
                period_ms: 60_000
            }]
        );
    }

    #[test]
    fn quantities_print_as_kubernetes_prints_them() {
        assert_eq!(quantity(250), "250m");
        assert_eq!(quantity(2_000), "2");
        assert_eq!(milli_of("100Mi"), Some(104_857_600_000));
    }
}
