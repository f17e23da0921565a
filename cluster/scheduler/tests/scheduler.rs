//! The scheduler against a real API on a real embedded store: pods are bound through
//! `pods/binding`, never beyond a node's allocatable; a pod that fits nowhere gets
//! `PodScheduled=False` with kube-scheduler's summary of why, and is placed as soon as a node
//! that fits it joins.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::catalog::Resource;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_scheduler::config::{self, SchedulerConfig};
use tessera_scheduler::{Scheduler, SchedulerOptions};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

fn res(plural: &str) -> &'static Resource {
    find_resource("", "v1", plural).expect("resource")
}

async fn client(dir: &std::path::Path) -> Arc<dyn Client> {
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(dir, EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    // Retrying 429s as every client of the API does (client-go too): the test's own reads
    // share the admin's seats with the scheduler's bindings and events.
    let c = tessera_runtime::client::Retrying::wrap(Arc::new(InProcess::new(
        Api::new(store, None),
        User::Admin,
    )));
    c.create(
        res("namespaces"),
        None,
        &json!({"metadata": {"name": "default"}}),
    )
    .await
    .expect("ns");
    c
}

async fn node(c: &Arc<dyn Client>, name: &str, cpu: &str, extra: Value) {
    let mut n = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                   "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}});
    if let (Some(n), Some(extra)) = (n.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            n.insert(k.clone(), v.clone());
        }
    }
    c.create(res("nodes"), None, &n).await.expect("node");
}

async fn pod(c: &Arc<dyn Client>, name: &str, cpu: &str, spec_extra: Value) {
    pod_with(c, name, cpu, json!({}), spec_extra).await;
}

/// A pod of `default` asking `cpu`, with `labels`, and `spec_extra` merged into its spec.
async fn pod_with(c: &Arc<dyn Client>, name: &str, cpu: &str, labels: Value, spec_extra: Value) {
    let mut spec = json!({"containers": [{"name": "c", "image": "x",
        "resources": {"requests": {"cpu": cpu}}}]});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    c.create(
        res("pods"),
        Some("default"),
        &json!({"metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": spec}),
    )
    .await
    .expect("pod");
}

async fn pods(c: &Arc<dyn Client>) -> Vec<Value> {
    let mut req = ApiRequest::new(Verb::List, res("pods"));
    req.namespace = Some("default".into());
    c.list(req).await.expect("list")["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    for _ in 0..500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

fn start(c: &Arc<dyn Client>, config: SchedulerConfig) -> tokio::task::JoinHandle<()> {
    let s = Scheduler::new(
        c.clone(),
        SchedulerOptions {
            config,
            metrics: None,
            runtime_metrics: None,
            informers: None,
        },
    )
    .expect("scheduler");
    tokio::spawn(s.run())
}

#[tokio::test]
async fn places_pods_within_allocatable_and_explains_what_does_not_fit() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = client(dir.path()).await;
    node(&c, "small-1", "1", json!({})).await;
    node(&c, "small-2", "1", json!({})).await;
    node(
        &c,
        "tainted",
        "8",
        json!({"spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
    )
    .await;
    let sched = start(&c, SchedulerConfig::default());
    for i in 0..8 {
        pod(&c, &format!("p{i}"), "300m", json!({})).await;
    }
    pod(&c, "huge", "4", json!({})).await;
    pod(
        &c,
        "pinned",
        "100m",
        json!({"nodeSelector": {"kubernetes.io/hostname": "small-2"}}),
    )
    .await;
    pod(
        &c,
        "tolerant",
        "2",
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}),
    )
    .await;
    // 6 of the 300m pods fit on the two small nodes (3 each); the other 2 and "huge" do not.
    wait_until("the scheduler to settle", || {
        let c = c.clone();
        async move {
            let ps = pods(&c).await;
            let bound = ps
                .iter()
                .filter(|p| p["spec"]["nodeName"].is_string())
                .count();
            let reported = ps
                .iter()
                .filter(|p| {
                    p["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "PodScheduled" && c["status"] == "False")
                    })
                })
                .count();
            bound == 8 && reported == 3
        }
    })
    .await;
    let ps = pods(&c).await;
    let mut used: HashMap<String, i64> = HashMap::new();
    for p in &ps {
        if let Some(n) = p["spec"]["nodeName"].as_str() {
            let cpu = p["spec"]["containers"][0]["resources"]["requests"]["cpu"]
                .as_str()
                .unwrap_or("0");
            let milli = cpu.strip_suffix('m').map_or_else(
                || cpu.parse::<i64>().unwrap_or(0) * 1000,
                |m| m.parse().unwrap_or(0),
            );
            *used.entry(n.to_owned()).or_default() += milli;
        }
    }
    assert!(
        used["small-1"] <= 1000 && used["small-2"] <= 1000,
        "no node over allocatable: {used:?}"
    );
    let by_name = |n: &str| {
        ps.iter()
            .find(|p| p["metadata"]["name"] == n)
            .cloned()
            .expect("pod")
    };
    assert_eq!(by_name("pinned")["spec"]["nodeName"], "small-2");
    assert_eq!(by_name("tolerant")["spec"]["nodeName"], "tainted");
    let huge = by_name("huge");
    let cond = huge["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled").cloned())
        .expect("condition");
    assert_eq!(cond["reason"], "Unschedulable");
    assert_eq!(
        cond["message"],
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 Insufficient cpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    );
    // A FailedScheduling event tells the same story (what `kubectl describe` shows).
    wait_until("a FailedScheduling event", || {
        let c = c.clone();
        async move {
            let mut req = ApiRequest::new(Verb::List, res("events"));
            req.namespace = Some("default".into());
            let evs = c.list(req).await.expect("events");
            evs["items"].as_array().into_iter().flatten().any(|e| {
                e["reason"] == "FailedScheduling"
                    && e["involvedObject"]["name"] == "huge"
                    && e["type"] == "Warning"
            })
        }
    })
    .await;
    // A big node joins: the parked pods are retried on that event (not only on a timer).
    node(&c, "big", "16", json!({})).await;
    wait_until("every pod bound", || {
        let c = c.clone();
        async move {
            pods(&c)
                .await
                .iter()
                .all(|p| p["spec"]["nodeName"].is_string())
        }
    })
    .await;
    assert_eq!(
        by_name_in(&pods(&c).await, "huge")["spec"]["nodeName"],
        "big"
    );
    sched.abort();
}

fn by_name_in(ps: &[Value], n: &str) -> Value {
    ps.iter()
        .find(|p| p["metadata"]["name"] == n)
        .cloned()
        .expect("pod")
}

#[tokio::test]
async fn profiles_come_from_a_configuration_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = client(dir.path()).await;
    for n in ["a", "b", "c"] {
        node(&c, n, "4", json!({})).await;
    }
    // A packing profile: MostAllocated puts every pod on the node already most used.
    let cfg = config::parse(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: packer\n  plugins:\n    score:\n      disabled: [{name: NodeResourcesBalancedAllocation}]\n  pluginConfig:\n  - name: NodeResourcesFit\n    args: {scoringStrategy: {type: MostAllocated}}\n",
    )
    .expect("config");
    let sched = start(&c, cfg);
    for i in 0..6 {
        pod(
            &c,
            &format!("p{i}"),
            "500m",
            json!({"schedulerName": "packer"}),
        )
        .await;
        // One at a time, so each sees the previous one's node as the most used.
        wait_until("bound", || {
            let c = c.clone();
            let name = format!("p{i}");
            async move { by_name_in(&pods(&c).await, &name)["spec"]["nodeName"].is_string() }
        })
        .await;
    }
    pod(
        &c,
        "other",
        "500m",
        json!({"schedulerName": "someone-else"}),
    )
    .await;
    // A barrier instead of a sleep: a pod of this scheduler created after "other" is bound,
    // so the scheduler has seen "other" (watch order) and had its chance to take it.
    pod(&c, "after", "500m", json!({"schedulerName": "packer"})).await;
    wait_until("the pod after it bound", || {
        let c = c.clone();
        async move { by_name_in(&pods(&c).await, "after")["spec"]["nodeName"].is_string() }
    })
    .await;
    let ps = pods(&c).await;
    let nodes: std::collections::HashSet<&str> = ps
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    assert_eq!(nodes.len(), 1, "packed onto one node: {nodes:?}");
    assert!(
        by_name_in(&ps, "other")["spec"]["nodeName"].is_null(),
        "not this scheduler's pod"
    );
    sched.abort();
}

#[test]
fn invalid_configurations_are_refused_with_the_reason() {
    let cases = [
        (
            "profiles:\n- plugins: {filter: {enabled: [{name: Nope}]}}\n",
            "unknown plugin \"Nope\"",
        ),
        (
            "profiles:\n- plugins: {filter: {enabled: [{name: PrioritySort}]}}\n",
            "does not implement the Filter",
        ),
        (
            "profiles:\n- plugins: {score: {enabled: [{name: NodeAffinity, weight: 0}]}}\n",
            "between 1 and 100",
        ),
        (
            "profiles:\n- plugins: {bind: {disabled: [{name: '*'}]}}\n",
            "at least one bind plugin",
        ),
        ("profiles:\n- {}\n- {}\n", "unique"),
        ("percentageOfNodesToScore: 150\n", "between 0 and 100"),
        (
            "profiles:\n- pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {type: Random}}}]\n",
            "NodeResourcesFit args",
        ),
        ("bogus: 1\n", "unknown field"),
    ];
    let dir = tempfile::tempdir().expect("tmp");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let c = rt.block_on(client(dir.path()));
    for (text, want) in cases {
        let err = config::parse(text).and_then(|cfg| {
            Scheduler::new(
                c.clone(),
                SchedulerOptions {
                    config: cfg,
                    metrics: None,
                    runtime_metrics: None,
                    informers: None,
                },
            )
            .map(|_| ())
        });
        match err {
            Ok(()) => panic!("{text:?} was accepted"),
            Err(e) => assert!(e.contains(want), "{text:?}: {e}"),
        }
    }
}

/// A Tenant `name` of `weight` owning the namespace `name` (created too).
async fn tenant(c: &Arc<dyn Client>, name: &str, weight: i32) {
    c.create(
        res("namespaces"),
        None,
        &json!({"metadata": {"name": name}}),
    )
    .await
    .expect("ns");
    let tenants = find_resource("tessera.io", "v1alpha1", "tenants").expect("tenants");
    c.create(
        tenants,
        None,
        &json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": name},
            "spec": {"namespaces": [name], "weight": weight}}),
    )
    .await
    .expect("tenant");
}

/// Pod `p{i}` of 100m in namespace `ns`.
async fn small_pod(c: &Arc<dyn Client>, ns: &str, i: usize) {
    c.create(
        res("pods"),
        Some(ns),
        &json!({"metadata": {"name": format!("p{i}"), "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": "100m"}}}]}}),
    )
    .await
    .expect("pod");
}

/// How many pods of namespace `ns` are bound.
async fn bound_in(c: &Arc<dyn Client>, ns: &str) -> usize {
    let mut req = ApiRequest::new(Verb::List, res("pods"));
    req.namespace = Some(ns.into());
    c.list(req).await.expect("list")["items"]
        .as_array()
        .map_or(0, |items| {
            items
                .iter()
                .filter(|p| p["spec"]["nodeName"].is_string())
                .count()
        })
}

/// Whether `got` is within 5% of `want`.
fn near(got: usize, want: f64) -> bool {
    (got as f64 - want).abs() <= 0.05 * want
}

/// Per-tenant queues through the real API: tenants of weight 1 and 3 each queue more pods
/// than the shard holds, and a third tenant queues one pod after all of them; then the
/// scheduler starts. The late tenant's pod is placed (a FIFO queue would fill the shard
/// with the earlier pods first and leave it waiting), and the rest of the shard is split
/// 1:3, each within 5% of its weight's part.
#[tokio::test]
async fn a_full_shard_is_split_between_tenants_by_weight() {
    let dir = tempfile::tempdir().expect("dir");
    let c = client(dir.path()).await;
    // 10 nodes × 4 cpu / 100m = 400 pods fit.
    for i in 0..10 {
        node(&c, &format!("n{i}"), "4", json!({})).await;
    }
    for (name, weight) in [("light", 1), ("heavy", 3), ("late", 1)] {
        tenant(&c, name, weight).await;
    }
    for i in 0..400 {
        small_pod(&c, "light", i).await;
        small_pod(&c, "heavy", i).await;
    }
    small_pod(&c, "late", 0).await;
    let _s = start(&c, SchedulerConfig::default());
    wait_until("the shard to fill", || async {
        bound_in(&c, "light").await + bound_in(&c, "heavy").await + bound_in(&c, "late").await
            == 400
    })
    .await;
    assert_eq!(
        bound_in(&c, "late").await,
        1,
        "the late tenant's pod is placed"
    );
    let (light, heavy) = (bound_in(&c, "light").await, bound_in(&c, "heavy").await);
    assert!(
        near(light, 399.0 / 4.0) && near(heavy, 399.0 * 3.0 / 4.0),
        "light {light}, heavy {heavy}: not 1:3 within 5%"
    );
}

/// The same split when the room comes from completions: a full shard, both tenants queue
/// more than it holds, then the pods filling it (of a namespace no tenant owns) finish.
/// The freed room goes by fair share, not by whose backoff ends first.
#[tokio::test]
async fn room_freed_by_completions_is_split_by_weight() {
    let dir = tempfile::tempdir().expect("dir");
    let c = client(dir.path()).await;
    for i in 0..10 {
        node(&c, &format!("n{i}"), "4", json!({})).await;
    }
    tenant(&c, "light", 1).await;
    tenant(&c, "heavy", 3).await;
    let _s = start(&c, SchedulerConfig::default());
    for i in 0..400 {
        small_pod(&c, "default", i).await;
    }
    wait_until("the shard to fill", || async {
        bound_in(&c, "default").await == 400
    })
    .await;
    for i in 0..400 {
        small_pod(&c, "light", i).await;
        small_pod(&c, "heavy", i).await;
    }
    let mut req = ApiRequest::new(Verb::DeleteCollection, res("pods"));
    req.namespace = Some("default".into());
    req.params.grace_period_seconds = Some(0);
    c.call(req).await.expect("delete the filling pods");
    wait_until("the shard to refill", || async {
        bound_in(&c, "light").await + bound_in(&c, "heavy").await == 400
    })
    .await;
    let (light, heavy) = (bound_in(&c, "light").await, bound_in(&c, "heavy").await);
    assert!(
        near(light, 100.0) && near(heavy, 300.0),
        "light {light}, heavy {heavy}: not 1:3 within 5%"
    );
}

fn node_of(p: &Value) -> Option<String> {
    p["spec"]["nodeName"].as_str().map(str::to_owned)
}

/// Through the real API: six pods spread over three zones with maxSkew 1 land two per
/// zone; pods that must not share a host take one node each, and the one too many waits
/// with kube-scheduler's reason until a peer goes.
#[tokio::test]
async fn spread_and_anti_affinity_hold_through_the_api() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = client(dir.path()).await;
    for z in 0..3 {
        for i in 0..2 {
            let name = format!("n-{z}-{i}");
            node(
                &c,
                &name,
                "8",
                json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                    "topology.kubernetes.io/zone": format!("z{z}")}}}),
            )
            .await;
        }
    }
    let sched = start(&c, SchedulerConfig::default());
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "spread"}}}]});
    for i in 0..6 {
        let labels = json!({"app": "spread"});
        pod_with(&c, &format!("s-{i}"), "100m", labels, spread.clone()).await;
    }
    let solo = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        [{"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    for i in 0..7 {
        pod_with(
            &c,
            &format!("a-{i}"),
            "100m",
            json!({"app": "solo"}),
            solo.clone(),
        )
        .await;
    }
    let reason = "0/6 nodes are available: 6 node(s) didn't match pod anti-affinity rules. preemption: 0/6 nodes are available: 6 No preemption victims found for incoming pod.";
    wait_until("spread pods bound and one solo pod reported", || {
        let c = c.clone();
        async move {
            let ps = pods(&c).await;
            let bound = ps.iter().filter(|p| node_of(p).is_some()).count();
            let reported = ps.iter().any(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["message"] == reason))
            });
            bound == 12 && reported
        }
    })
    .await;
    let ps = pods(&c).await;
    let mut per_zone: HashMap<String, usize> = HashMap::new();
    let mut solo_nodes = Vec::new();
    for p in &ps {
        let Some(n) = node_of(p) else { continue };
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        if name.starts_with("s-") {
            *per_zone.entry(n[..3].to_owned()).or_insert(0) += 1;
        } else {
            solo_nodes.push(n);
        }
    }
    assert_eq!(
        per_zone,
        HashMap::from([("n-0".into(), 2), ("n-1".into(), 2), ("n-2".into(), 2)])
    );
    solo_nodes.sort();
    solo_nodes.dedup();
    assert_eq!(solo_nodes.len(), 6, "one solo pod per node: {solo_nodes:?}");
    // A solo pod is deleted: terminating (no agent runs it here, so it stays for its grace
    // period), it no longer counts, and the waiting one takes its node — as in Kubernetes.
    let gone = ps
        .iter()
        .find(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("a-"))
                && node_of(p).is_some()
        })
        .expect("a bound solo pod");
    let gone_name = gone["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let freed = node_of(gone).expect("bound");
    c.delete(res("pods"), Some("default"), &gone_name, None)
        .await
        .expect("delete");
    wait_until("the waiting solo pod placed on the freed node", || {
        let c = c.clone();
        let freed = freed.clone();
        async move {
            let ps = pods(&c).await;
            let solos: Vec<_> = ps
                .iter()
                .filter(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("a-"))
                })
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .collect();
            solos.len() == 6
                && solos.iter().all(|p| node_of(p).is_some())
                && solos
                    .iter()
                    .any(|p| node_of(p).as_deref() == Some(freed.as_str()))
        }
    })
    .await;
    sched.abort();
}

async fn pod_group(c: &Arc<dyn Client>, name: &str, min: i32, timeout: i32) {
    c.create(
        find_resource("tessera.io", "v1alpha1", "podgroups").expect("podgroups"),
        Some("default"),
        &json!({"metadata": {"name": name}, "spec": {"minMember": min, "scheduleTimeoutSeconds": timeout}}),
    )
    .await
    .expect("podgroup");
}

async fn gang_pod(c: &Arc<dyn Client>, gang: &str, i: usize) {
    pod_with(
        c,
        &format!("{gang}-{i}"),
        "1",
        json!({"scheduling.x-k8s.io/pod-group": gang}),
        json!({}),
    )
    .await;
}

/// The members of `gang` bound, with their resourceVersions.
fn bound_members(ps: &[Value], gang: &str) -> Vec<String> {
    ps.iter()
        .filter(|p| p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == gang)
        .filter(|p| node_of(p).is_some())
        .map(|p| {
            p["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn gangs_bind_whole_or_not_at_all_through_the_api() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = client(dir.path()).await;
    // Room for 12 one-cpu pods.
    for i in 0..3 {
        node(&c, &format!("n{i}"), "4", json!({})).await;
    }
    let sched = start(&c, SchedulerConfig::default());
    // No gang is ever partly bound: checked at every poll below.
    let whole = |ps: &[Value], gang: &str, min: usize| {
        let n = bound_members(ps, gang).len();
        assert!(n == 0 || n >= min, "gang {gang} partly bound: {n} of {min}");
        n >= min
    };
    // A gang short of members waits, and says so; its last member completes it.
    pod_group(&c, "short", 3, 30).await;
    for i in 0..2 {
        gang_pod(&c, "short", i).await;
    }
    let short_reason =
        "0/3 nodes are available: PodGroup default/short has 2 of its minMember 3 pods.";
    wait_until("the short gang reported", || {
        let c = c.clone();
        async move {
            pods(&c).await.iter().any(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["message"] == short_reason))
            })
        }
    })
    .await;
    assert!(bound_members(&pods(&c).await, "short").is_empty());
    gang_pod(&c, "short", 2).await;
    wait_until("the completed gang bound", || {
        let c = c.clone();
        async move { whole(&pods(&c).await, "short", 3) }
    })
    .await;
    // 9 cpu left: "fits" (4 of 5) and "big" (8) each fit alone, not together. They
    // contend — members of each reserve nodes and are let go — and one ends bound whole.
    pod_group(&c, "fits", 4, 30).await;
    pod_group(&c, "big", 8, 2).await;
    for i in 0..8 {
        gang_pod(&c, "big", i).await;
        if i < 5 {
            gang_pod(&c, "fits", i).await;
        }
    }
    let mut winner = String::new();
    for _ in 0..500 {
        let ps = pods(&c).await;
        let (f, b) = (whole(&ps, "fits", 4), whole(&ps, "big", 8));
        assert!(!(f && b), "both gangs cannot fit");
        if f || b {
            winner = if f { "fits" } else { "big" }.to_owned();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!winner.is_empty(), "one of the contending gangs was bound");
    let loser = if winner == "fits" { "big" } else { "fits" };
    let loser_min = if loser == "fits" { 4 } else { 8 };
    let ps = pods(&c).await;
    let mut revisions = bound_members(&ps, &winner);
    revisions.sort();
    revisions.dedup();
    assert!(
        revisions.len() <= 2,
        "the quorum is written in one transaction (one revision; a member beyond it may bind alone): {revisions:?}"
    );
    // The winner goes: the loser is bound whole in the room it leaves.
    for p in ps
        .iter()
        .filter(|p| p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == winner.as_str())
    {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let mut req = ApiRequest::new(Verb::Delete, res("pods"));
        req.namespace = Some("default".into());
        req.name = Some(name.to_owned());
        req.body = json!({"gracePeriodSeconds": 0}).to_string().into();
        c.call(req).await.expect("delete");
    }
    wait_until("the losing gang bound once the room is free", || {
        let c = c.clone();
        async move { whole(&pods(&c).await, loser, loser_min) }
    })
    .await;
    assert!(whole(&pods(&c).await, "short", 3));
    sched.abort();
}

/// Preemption through the API: a high-priority pod that fits nowhere evicts the fewest,
/// least important pods of one node, is nominated there, and is bound once they are gone;
/// the victims get a `Preempted` event. (No agent runs here: the test deletes terminating
/// pods at once, as a node agent would once they stopped.)
#[tokio::test]
async fn a_high_priority_pod_preempts_lower_ones() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = client(dir.path()).await;
    let classes = find_resource("scheduling.k8s.io", "v1", "priorityclasses").expect("served");
    for (name, value) in [("low", 1), ("mid", 5), ("high", 1000)] {
        c.create(
            classes,
            None,
            &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value}),
        )
        .await
        .expect("class");
    }
    node(&c, "n0", "2", json!({})).await;
    node(&c, "n1", "2", json!({})).await;
    let sched = start(&c, SchedulerConfig::default());
    // n0 and n1 full: each holds a "low" and a "mid" pod of 1 cpu.
    for (name, class) in [
        ("low-a", "low"),
        ("mid-a", "mid"),
        ("low-b", "low"),
        ("mid-b", "mid"),
    ] {
        pod(&c, name, "1", json!({"priorityClassName": class})).await;
    }
    wait_until("the shard full", || {
        let c = c.clone();
        async move {
            pods(&c)
                .await
                .iter()
                .filter(|p| node_of(p).is_some())
                .count()
                == 4
        }
    })
    .await;
    // 1 cpu: evicting one low pod is enough; the mid ones stay.
    pod(&c, "vip", "1", json!({"priorityClassName": "high"})).await;
    wait_until("vip bound after its victim went", || {
        let c = c.clone();
        async move {
            let ps = pods(&c).await;
            for p in ps
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_string())
            {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                let mut req = ApiRequest::new(Verb::Delete, res("pods"));
                req.namespace = Some("default".into());
                req.name = Some(name.to_owned());
                req.body = json!({"gracePeriodSeconds": 0}).to_string().into();
                let _ = c.call(req).await;
            }
            node_of(&by_name_in(&ps, "vip")).is_some()
        }
    })
    .await;
    let ps = pods(&c).await;
    let names: Vec<&str> = ps
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    let lows = names.iter().filter(|n| n.starts_with("low-")).count();
    assert_eq!(lows, 1, "exactly one low pod was evicted: {names:?}");
    assert!(
        names.contains(&"mid-a") && names.contains(&"mid-b"),
        "{names:?}"
    );
    let vip = by_name_in(&ps, "vip");
    assert_eq!(vip["spec"]["priority"], 1000);
    assert_eq!(
        vip["status"]["nominatedNodeName"], vip["spec"]["nodeName"],
        "vip was nominated to the node it is bound to: {vip}"
    );
    let mut req = ApiRequest::new(Verb::List, res("events"));
    req.namespace = Some("default".into());
    let events = c.list(req).await.expect("events");
    let preempted: Vec<&Value> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "Preempted")
        .collect();
    assert_eq!(preempted.len(), 1, "{preempted:?}");
    let msg = preempted[0]["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("Preempted by default/vip on node n"),
        "{msg}"
    );
    // A pod of low priority now fits nowhere and cannot preempt: it says so.
    pod(&c, "late", "1", json!({"priorityClassName": "low"})).await;
    let reason = "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.";
    wait_until("the late pod reported", || {
        let c = c.clone();
        async move {
            let late = by_name_in(&pods(&c).await, "late");
            late["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["message"] == reason))
        }
    })
    .await;
    sched.abort();
}
