//! The HorizontalPodAutoscaler controller in a working shard with simulated nodes, whose pods
//! use a set fraction of their CPU requests (the API server's simulated metrics): load scales
//! a Deployment up within the rate limit and `maxReplicas`; once the load drops, the
//! scale-down waits for the stabilization window — passed on the controllers' clock, not in
//! wall-clock minutes — and then follows the HPA's policies.

mod support;

use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use support::{Events, shard, wait_until_else};
use tessera_apiserver::client::Client;
use tessera_apiserver::request::{ApiRequest, PatchType, Verb};
use tessera_controllers::context::res;

const FRACTION: &str = "tessera.io/simulated-usage-fraction";

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                    "resources": {"requests": {"cpu": "100m"}}}]}}}})
}

fn hpa(name: &str, max: i64, behavior: Value) -> Value {
    let mut h = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1, "maxReplicas": max,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 50}}}]}});
    if !behavior.is_null() {
        h["spec"]["behavior"] = behavior;
    }
    h
}

/// Every simulated node's pods use `fraction` of their requests.
async fn load(c: &Arc<dyn Client>, fraction: &str) {
    let nodes = c
        .list(ApiRequest::new(Verb::List, res("", "nodes")))
        .await
        .expect("nodes");
    assert!(nodes["items"].as_array().is_some_and(|n| !n.is_empty()));
    for n in nodes["items"].as_array().into_iter().flatten() {
        let name = n["metadata"]["name"].as_str().expect("name");
        c.patch(
            res("", "nodes"),
            None,
            name,
            None,
            PatchType::Merge,
            &json!({"metadata": {"annotations": {FRACTION: fraction}}}),
        )
        .await
        .expect("annotate node");
    }
}

async fn replicas(c: &Arc<dyn Client>, name: &str) -> i64 {
    c.get(res("apps", "deployments"), Some("default"), name)
        .await
        .expect("deployment")["spec"]["replicas"]
        .as_i64()
        .unwrap_or(-1)
}

async fn hpa_of(c: &Arc<dyn Client>, name: &str) -> Value {
    c.get(
        res("autoscaling", "horizontalpodautoscalers"),
        Some("default"),
        name,
    )
    .await
    .expect("hpa")
}

fn condition<'a>(h: &'a Value, ty: &str) -> &'a Value {
    h["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
        .unwrap_or(&Value::Null)
}

/// Moves the controllers' clock `secs` seconds ahead of where it reads now.
fn advance(clock: &tessera_controllers::clock::OffsetClock, secs: i64) {
    use tessera_controllers::clock::Clock;
    let now: Timestamp = clock.now();
    clock.set(now + SignedDuration::from_secs(secs));
}

async fn wait_replicas(c: &Arc<dyn Client>, name: &str, want: i64) {
    wait_until_else(
        &format!("{name} at {want} replicas"),
        || async { replicas(c, name).await == want },
        || async {
            format!(
                "replicas {}, hpa {}",
                replicas(c, name).await,
                hpa_of(c, name).await["status"]
            )
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_scales_up_within_limits_and_the_window_holds_the_scale_down() {
    let s = shard(2).await;
    let c = &s.client;
    // Past every pod's CPU initialization period, so each sample counts at once.
    advance(&s.clock, 600);
    load(c, "3").await;
    let seen = Events::start(c, "apps", "deployments", "default").await;
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("web"),
    )
    .await
    .expect("deployment");
    c.create(
        res("autoscaling", "horizontalpodautoscalers"),
        Some("default"),
        &hpa("web", 6, Value::Null),
    )
    .await
    .expect("hpa");

    // 300% of requests against 50%: 1 pod asks for 6, the first step is at most 4; then 4
    // pods ask for 24: held at maxReplicas.
    wait_replicas(c, "web", 6).await;
    let mut steps: Vec<i64> = seen
        .seen()
        .iter()
        .filter_map(|(_, d)| d["spec"]["replicas"].as_i64())
        .collect();
    steps.dedup();
    assert_eq!(steps, vec![1, 4, 6], "each step within the rate limit");
    wait_until_else(
        "the HPA reports its metric and the limit",
        || async {
            let h = hpa_of(c, "web").await;
            h["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"] == 300
                && condition(&h, "ScalingLimited")["reason"] == "TooManyReplicas"
                && condition(&h, "ScalingActive")["status"] == "True"
                && h["status"]["desiredReplicas"] == 6
                && h["status"]["currentReplicas"] == 6
        },
        || async { hpa_of(c, "web").await.to_string() },
    )
    .await;

    // The load drops to 10% of requests: the window keeps 6 for five minutes.
    load(c, "0.1").await;
    wait_until_else(
        "the scale-down is held by the window",
        || async {
            let h = hpa_of(c, "web").await;
            condition(&h, "AbleToScale")["reason"] == "ScaleDownStabilized"
        },
        || async { hpa_of(c, "web").await.to_string() },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(replicas(c, "web").await, 6, "held within the window");

    // Past the window: 6 pods at 10% against 50% ask for 2.
    advance(&s.clock, 301);
    wait_replicas(c, "web", 2).await;
    advance(&s.clock, 301);
    wait_replicas(c, "web", 1).await;
    let h = hpa_of(c, "web").await;
    assert!(h["status"]["lastScaleTime"].is_string(), "{}", h["status"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behavior_policies_pace_the_scale_down_on_the_controllers_clock() {
    let s = shard(2).await;
    let c = &s.client;
    advance(&s.clock, 600);
    load(c, "3").await;
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("api"),
    )
    .await
    .expect("deployment");
    // Up by at most 2 pods per 60 s; down with no window, 1 pod per 60 s.
    let behavior = json!({
        "scaleUp": {"policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
        "scaleDown": {"stabilizationWindowSeconds": 0,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}});
    let created = c
        .create(
            res("autoscaling", "horizontalpodautoscalers"),
            Some("default"),
            &hpa("api", 5, behavior),
        )
        .await
        .expect("hpa");
    // The server filled in what the behavior left out.
    assert_eq!(
        created["spec"]["behavior"]["scaleUp"]["selectPolicy"],
        "Max"
    );
    assert_eq!(
        created["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"],
        0
    );

    wait_replicas(c, "api", 3).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(replicas(c, "api").await, 3, "2 pods per 60 s of the clock");
    let h = hpa_of(c, "api").await;
    assert_eq!(
        condition(&h, "ScalingLimited")["reason"],
        "ScaleUpLimit",
        "{h}"
    );
    advance(&s.clock, 61);
    wait_replicas(c, "api", 5).await;

    load(c, "0.1").await;
    wait_replicas(c, "api", 4).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(replicas(c, "api").await, 4, "1 pod per 60 s of the clock");
    advance(&s.clock, 61);
    wait_replicas(c, "api", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_requests_or_scale_is_reported_not_guessed() {
    let s = shard(1).await;
    let c = &s.client;
    let mut d = deployment("bare");
    d["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({});
    c.create(res("apps", "deployments"), Some("default"), &d)
        .await
        .expect("deployment");
    c.create(
        res("autoscaling", "horizontalpodautoscalers"),
        Some("default"),
        &hpa("bare", 4, Value::Null),
    )
    .await
    .expect("hpa");
    wait_until_else(
        "the missing request is reported",
        || async {
            let h = hpa_of(c, "bare").await;
            let active = condition(&h, "ScalingActive");
            active["status"] == "False"
                && active["reason"] == "FailedGetResourceMetric"
                && active["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("missing request for cpu"))
        },
        || async { hpa_of(c, "bare").await.to_string() },
    )
    .await;
    assert_eq!(replicas(c, "bare").await, 1);

    let mut gone = hpa("nothing", 4, Value::Null);
    gone["spec"]["scaleTargetRef"]["name"] = json!("missing");
    c.create(
        res("autoscaling", "horizontalpodautoscalers"),
        Some("default"),
        &gone,
    )
    .await
    .expect("hpa");
    wait_until_else(
        "a missing target is reported",
        || async {
            let h = hpa_of(c, "nothing").await;
            condition(&h, "AbleToScale")["reason"] == "FailedGetScale"
        },
        || async { hpa_of(c, "nothing").await.to_string() },
    )
    .await;
}

/// The target may be any resource with a `scale` subresource: here a custom resource whose
/// CRD maps `spec.replicas`, `status.replicas` and a label selector in its status, over pods
/// a Deployment runs (as an operator's own kind would run them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_with_a_scale_subresource_is_scaled() {
    let s = shard(2).await;
    let c = &s.client;
    advance(&s.clock, 600);
    load(c, "3").await;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "pools.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "pools", "singular": "pool", "kind": "Pool"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas",
                    "labelSelectorPath": ".status.selector"}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                    "status": {"type": "object", "properties": {
                        "replicas": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}});
    c.create(
        res(
            tessera_client::catalog::APIEXTENSIONS,
            "customresourcedefinitions",
        ),
        None,
        &crd,
    )
    .await
    .expect("crd");
    let pools = loop {
        // Served once the API server has seen the CRD.
        if let Some(r) = tessera_client::catalog::custom_resource(&crd, "v1") {
            let probe = c
                .list({
                    let mut req = ApiRequest::new(Verb::List, r);
                    req.namespace = Some("default".into());
                    req
                })
                .await;
            if probe.is_ok() {
                break r;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    c.create(
        pools,
        Some("default"),
        &json!({"apiVersion": "example.com/v1", "kind": "Pool",
            "metadata": {"name": "pool", "namespace": "default"}, "spec": {"replicas": 1}}),
    )
    .await
    .expect("pool");
    c.patch(
        pools,
        Some("default"),
        "pool",
        Some("status"),
        PatchType::Merge,
        &json!({"status": {"replicas": 1, "selector": "app=pool"}}),
    )
    .await
    .expect("pool status");
    // The pool's pods: one, at 300% of its request.
    c.create(
        res("apps", "deployments"),
        Some("default"),
        &deployment("pool"),
    )
    .await
    .expect("pods");
    let mut h = hpa("pool", 3, Value::Null);
    h["spec"]["scaleTargetRef"] =
        json!({"apiVersion": "example.com/v1", "kind": "Pool", "name": "pool"});
    c.create(
        res("autoscaling", "horizontalpodautoscalers"),
        Some("default"),
        &h,
    )
    .await
    .expect("hpa");
    wait_until_else(
        "the pool is scaled through its scale subresource",
        || async {
            c.get(pools, Some("default"), "pool").await.expect("pool")["spec"]["replicas"] == 3
        },
        || async { hpa_of(c, "pool").await.to_string() },
    )
    .await;
}
