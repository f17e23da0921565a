//! The API server's Prometheus metrics: requests by verb, resource and code, their latency,
//! seats in flight per caller, requests refused for fairness, and open watches.

use std::time::Duration;

use futures::{Stream, StreamExt};
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::catalog::Resource;
use crate::request::Verb;

/// The metrics, registered once and cloned into every handler.
#[derive(Clone)]
pub struct ApiMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    inflight: IntGaugeVec,
    rejected: IntCounterVec,
    watches: IntGaugeVec,
    watch_events: IntCounterVec,
    pub(crate) binding_batch: prometheus::Histogram,
    pub(crate) binding_batches: IntCounterVec,
    pub(crate) write_batch: prometheus::Histogram,
    pub(crate) write_batches: IntCounterVec,
    /// Authorization decisions, by authorizer (`isolation`, `rbac`) and decision.
    pub(crate) decisions: IntCounterVec,
    /// RBAC objects in the authorizer's index, by kind.
    pub(crate) rbac_objects: IntGaugeVec,
    /// Custom resource versions served (from CustomResourceDefinitions).
    pub(crate) custom_resources: prometheus::IntGauge,
    /// Custom objects deleted with their CRD.
    pub(crate) crd_cleanup_deleted: prometheus::IntCounter,
    /// Admission webhook calls, by webhook, type, operation and outcome.
    pub(crate) webhook_calls: IntCounterVec,
    /// Admission webhook call latency, by webhook and type.
    pub(crate) webhook_duration: HistogramVec,
    /// ValidatingAdmissionPolicy checks, by policy, binding and result.
    pub(crate) policy_checks: IntCounterVec,
    /// CEL rules of CustomResourceDefinitions evaluated, by result.
    pub(crate) crd_rules: IntCounterVec,
    /// TokenReviews answered, by result.
    pub(crate) token_reviews: IntCounterVec,
    /// CRD conversion webhook calls, by CRD and result.
    pub(crate) conversion_calls: IntCounterVec,
    /// Duration of CRD conversion webhook calls, by CRD.
    pub(crate) conversion_duration: HistogramVec,
    /// Custom objects converted by conversion webhooks, by CRD.
    pub(crate) conversion_objects: IntCounterVec,
    /// Requests proxied to extension API servers, by APIService and code.
    pub(crate) aggregated_requests: IntCounterVec,
    /// Time until an extension server's answer started, by APIService.
    pub(crate) aggregated_duration: HistogramVec,
    /// 1 for each APIService whose extension server failed its last check.
    pub(crate) unavailable_apiservices: IntGaugeVec,
}

impl ApiMetrics {
    /// Creates and registers the metrics in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<ApiMetrics> {
        let m = ApiMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_requests_total",
                    "API requests by verb, resource, subresource and HTTP code.",
                ),
                &["verb", "group", "resource", "subresource", "code"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_apiserver_request_duration_seconds",
                    "Time to answer an API request (to the start of the stream for watches).",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
                &["verb", "resource"],
            )?,
            inflight: IntGaugeVec::new(
                Opts::new(
                    "tessera_apiserver_inflight_requests",
                    "Requests holding a seat now, per caller (admin or tenant:<name>).",
                ),
                &["user"],
            )?,
            rejected: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_rejected_requests_total",
                    "Requests answered 429 because the caller had no free seat.",
                ),
                &["user"],
            )?,
            watches: IntGaugeVec::new(
                Opts::new(
                    "tessera_apiserver_watches",
                    "Open watch streams per resource.",
                ),
                &["resource"],
            )?,
            watch_events: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_watch_events_total",
                    "Watch events sent, per resource.",
                ),
                &["resource"],
            )?,
            binding_batch: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_apiserver_binding_batch_size",
                    "pods/binding requests written in one store transaction.",
                )
                .buckets(vec![
                    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0,
                ]),
            )?,
            decisions: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_authorization_decisions_total",
                    "Authorization decisions for callers tenant isolation or RBAC governs (not \
                     the admin and the shard's components), by authorizer (isolation: a \
                     tenant's reach; rbac: roles and bindings) and decision (allow, deny).",
                ),
                &["authorizer", "decision"],
            )?,
            rbac_objects: IntGaugeVec::new(
                Opts::new(
                    "tessera_apiserver_rbac_objects",
                    "Roles, ClusterRoles, RoleBindings and ClusterRoleBindings in the RBAC \
                     authorizer's in-memory index, by kind.",
                ),
                &["kind"],
            )?,
            custom_resources: prometheus::IntGauge::new(
                "tessera_apiserver_custom_resources",
                "Custom resource versions this API server serves from CustomResourceDefinitions.",
            )?,
            crd_cleanup_deleted: prometheus::IntCounter::new(
                "tessera_apiserver_crd_cleanup_deleted_objects_total",
                "Custom objects deleted because their CustomResourceDefinition was deleted.",
            )?,
            webhook_calls: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_admission_webhook_calls_total",
                    "Admission webhook calls, by webhook name, type (admit: mutating, \
                     validating), operation and outcome (allowed, denied, failed: the request \
                     was refused because the webhook could not be called, ignored: it could \
                     not be called and its failurePolicy is Ignore).",
                ),
                &["name", "type", "operation", "outcome"],
            )?,
            webhook_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_apiserver_admission_webhook_duration_seconds",
                    "Time of one admission webhook call (connect, TLS, the webhook's work).",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
                &["name", "type"],
            )?,
            policy_checks: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_admission_policy_checks_total",
                    "ValidatingAdmissionPolicy checks of a request (one per policy, binding and \
                     parameter), by policy, binding and result (allowed; denied, warned, \
                     audited: a validation failed and the binding's action was taken; \
                     error: an expression or the binding's parameters failed and the \
                     failurePolicy refused the request; ignored: the same, let through by \
                     failurePolicy Ignore; skipped: a match condition did not hold).",
                ),
                &["policy", "binding", "result"],
            )?,
            crd_rules: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_crd_validation_rules_total",
                    "x-kubernetes-validations rules of custom objects evaluated, by result \
                     (passed, failed, error).",
                ),
                &["result"],
            )?,
            token_reviews: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_token_reviews_total",
                    "TokenReviews answered, by result (authenticated, unauthenticated).",
                ),
                &["result"],
            )?,
            conversion_calls: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_crd_conversion_webhook_calls_total",
                    "ConversionReviews sent to CRD conversion webhooks, by CRD and result \
                     (success; failure: the webhook answered Failure; error: it could not be \
                     called or its answer was unusable).",
                ),
                &["crd", "result"],
            )?,
            conversion_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_apiserver_crd_conversion_webhook_duration_seconds",
                    "Time of one ConversionReview (connect, TLS, the webhook's work, checking \
                     the answer).",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
                &["crd"],
            )?,
            conversion_objects: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_crd_conversion_objects_total",
                    "Custom objects converted by CRD conversion webhooks, by CRD.",
                ),
                &["crd"],
            )?,
            aggregated_requests: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_aggregator_requests_total",
                    "Requests proxied to extension API servers (API aggregation), by APIService \
                     and the HTTP code answered (503: the Service could not be reached).",
                ),
                &["apiservice", "code"],
            )?,
            aggregated_duration: HistogramVec::new(
                HistogramOpts::new(
                    "tessera_apiserver_aggregator_request_duration_seconds",
                    "Time from a proxied request's arrival until the extension server's answer \
                     started (authorization, connection, the extension's work).",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
                ]),
                &["apiservice"],
            )?,
            unavailable_apiservices: IntGaugeVec::new(
                Opts::new(
                    "tessera_apiserver_aggregator_unavailable_apiservice",
                    "1 for an APIService whose extension server failed its last availability \
                     check, 0 once it passes (kube-aggregator's aggregator_unavailable_apiservice).",
                ),
                &["name"],
            )?,
            binding_batches: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_binding_batches_total",
                    "Batched pods/binding transactions, by result: written, or alone (not \
                     written — a pod changed meanwhile or the batch was refused whole — so each \
                     binding in it was done again on its own).",
                ),
                &["result"],
            )?,
            write_batch: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "tessera_apiserver_write_batch_size",
                    "Single conditional writes (creates, updates, deletes of any resource, \
                     where no ResourceQuota is charged or refunded) written in one store \
                     transaction.",
                )
                .buckets(vec![
                    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0,
                ]),
            )?,
            write_batches: IntCounterVec::new(
                Opts::new(
                    "tessera_apiserver_write_batches_total",
                    "Batched write transactions, by result: written, retried (a write whose \
                     condition failed — a name taken, an object changed — was answered so and \
                     the rest written without it), or alone (the batch could not be written, \
                     so each write in it was written on its own).",
                ),
                &["result"],
            )?,
        };
        registry.register(Box::new(m.decisions.clone()))?;
        registry.register(Box::new(m.rbac_objects.clone()))?;
        registry.register(Box::new(m.custom_resources.clone()))?;
        registry.register(Box::new(m.crd_cleanup_deleted.clone()))?;
        registry.register(Box::new(m.webhook_calls.clone()))?;
        registry.register(Box::new(m.webhook_duration.clone()))?;
        registry.register(Box::new(m.policy_checks.clone()))?;
        registry.register(Box::new(m.crd_rules.clone()))?;
        registry.register(Box::new(m.token_reviews.clone()))?;
        registry.register(Box::new(m.conversion_calls.clone()))?;
        registry.register(Box::new(m.conversion_duration.clone()))?;
        registry.register(Box::new(m.conversion_objects.clone()))?;
        registry.register(Box::new(m.aggregated_requests.clone()))?;
        registry.register(Box::new(m.aggregated_duration.clone()))?;
        registry.register(Box::new(m.unavailable_apiservices.clone()))?;
        registry.register(Box::new(m.write_batch.clone()))?;
        registry.register(Box::new(m.write_batches.clone()))?;
        registry.register(Box::new(m.binding_batch.clone()))?;
        registry.register(Box::new(m.binding_batches.clone()))?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.inflight.clone()))?;
        registry.register(Box::new(m.rejected.clone()))?;
        registry.register(Box::new(m.watches.clone()))?;
        registry.register(Box::new(m.watch_events.clone()))?;
        Ok(m)
    }

    /// Counts one answered request.
    pub fn observe(
        &self,
        verb: Verb,
        res: &Resource,
        sub: Option<&str>,
        code: u16,
        took: Duration,
    ) {
        self.requests
            .with_label_values(&[
                verb.as_str(),
                res.group,
                res.plural,
                sub.unwrap_or(""),
                &code.to_string(),
            ])
            .inc();
        self.duration
            .with_label_values(&[verb.as_str(), res.plural])
            .observe(took.as_secs_f64());
    }

    /// The in-flight gauge of one caller.
    pub fn inflight(&self, user: &str) -> IntGauge {
        self.inflight.with_label_values(&[user])
    }

    /// Counts a request refused for fairness.
    pub fn rejected(&self, user: &str) {
        self.rejected.with_label_values(&[user]).inc();
    }

    /// Wraps a watch stream: counted open while it lives, its events counted.
    pub fn count_watch<S, T>(&self, res: &Resource, stream: S) -> impl Stream<Item = T> + use<S, T>
    where
        S: Stream<Item = T> + Send,
    {
        struct Open(IntGauge);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.dec();
            }
        }
        let gauge = self.watches.with_label_values(&[res.plural]);
        gauge.inc();
        let open = Open(gauge);
        let events = self.watch_events.with_label_values(&[res.plural]);
        stream.map(move |ev| {
            let _ = &open;
            events.inc();
            ev
        })
    }
}

/// Labels whose values say which tenant did what: kept off metrics served without a token.
const TENANT_LABELS: &[&str] = &["namespace", "pod", "tenant"];

/// `families` without the samples that identify a tenant (a `user` of `tenant:…`, or any
/// `namespace`, `pod` or `tenant` label): what an unauthenticated `/metrics` may show. The
/// whole set is served on the API port to the admin token, as kube-apiserver serves
/// `/metrics`.
pub fn without_tenants(
    families: Vec<prometheus::proto::MetricFamily>,
) -> Vec<prometheus::proto::MetricFamily> {
    families
        .into_iter()
        .filter_map(|mut f| {
            let kept: Vec<_> = f
                .take_metric()
                .into_iter()
                .filter(|m| {
                    !m.get_label().iter().any(|l| {
                        TENANT_LABELS.contains(&l.name())
                            || (l.name() == "user" && l.value().starts_with("tenant:"))
                    })
                })
                .collect();
            if kept.is_empty() {
                return None;
            }
            f.set_metric(kept);
            Some(f)
        })
        .collect()
}

/// `families` in Prometheus' text format.
pub fn render(families: &[prometheus::proto::MetricFamily]) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    prometheus::Encoder::encode(&prometheus::TextEncoder::new(), families, &mut buf)
        .map_err(|e| e.to_string())?;
    Ok(buf)
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn tenant_samples_stay_off_the_open_port() {
        let registry = Registry::new();
        let m = ApiMetrics::register(&registry).expect("metrics");
        m.inflight("tenant:alpha").inc();
        m.inflight("admin").inc();
        let c = prometheus::IntGaugeVec::new(
            Opts::new("tessera_container_processes", "p"),
            &["namespace", "pod", "container"],
        )
        .expect("vec");
        registry.register(Box::new(c.clone())).expect("register");
        c.with_label_values(&["t1", "p", "c"]).set(1);
        let full = String::from_utf8(render(&registry.gather()).expect("render")).expect("utf8");
        assert!(full.contains("tenant:alpha") && full.contains("namespace=\"t1\""));
        let open = String::from_utf8(render(&without_tenants(registry.gather())).expect("render"))
            .expect("utf8");
        assert!(!open.contains("tenant:alpha"), "{open}");
        assert!(!open.contains("t1"), "{open}");
        assert!(
            open.contains("user=\"admin\""),
            "other samples stay: {open}"
        );
    }
}
