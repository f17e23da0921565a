//! Table-driven tests of each built-in plugin against hand-built pods and nodes.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::framework::{Code, CycleState, Plugin, QueuedPod};
use crate::plugins::affinity::NodeAffinity;
use crate::plugins::basic::{NodeName, NodePorts, NodeUnschedulable, PrioritySort};
use crate::plugins::fit::{Balanced, Fit, FitArgs};
use crate::plugins::taints::TaintToleration;
use crate::resources::{NodeInfo, PodInfo};

fn pod(spec: Value) -> PodInfo {
    let mut spec = spec;
    if spec["containers"].is_null() {
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
    }
    PodInfo::new(Arc::new(
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}))
            .expect("pod"),
    ))
}

fn node(name: &str, labels: Value, spec: Value, cpu: &str) -> NodeInfo {
    let mut n = NodeInfo::empty(name);
    n.set_node(Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "3"}}}),
        )
        .expect("node"),
    ));
    n
}

fn plain(name: &str) -> NodeInfo {
    node(name, json!({}), json!({}), "2")
}

fn filter(p: &dyn Plugin, pod: &PodInfo, node: &NodeInfo) -> (Code, String) {
    let s = p
        .filter()
        .expect("a filter")
        .filter(&CycleState::new(), pod, node);
    (s.code, s.message())
}

#[test]
fn node_name() {
    let on_a = pod(json!({"nodeName": "a"}));
    assert_eq!(filter(&NodeName, &on_a, &plain("a")).0, Code::Success);
    assert_eq!(
        filter(&NodeName, &on_a, &plain("b")),
        (
            Code::UnschedulableAndUnresolvable,
            "node(s) didn't match the requested node name".into()
        )
    );
    assert_eq!(
        filter(&NodeName, &pod(json!({})), &plain("b")).0,
        Code::Success
    );
}

#[test]
fn node_unschedulable() {
    let cordoned = node("a", json!({}), json!({"unschedulable": true}), "2");
    assert_eq!(
        filter(&NodeUnschedulable, &pod(json!({})), &cordoned),
        (
            Code::UnschedulableAndUnresolvable,
            "node(s) were unschedulable".into()
        )
    );
    let tolerant = pod(
        json!({"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}),
    );
    assert_eq!(
        filter(&NodeUnschedulable, &tolerant, &cordoned).0,
        Code::Success
    );
    assert_eq!(
        filter(&NodeUnschedulable, &pod(json!({})), &plain("b")).0,
        Code::Success
    );
}

#[test]
fn node_ports() {
    let wants = |port: i32, ip: &str| {
        pod(
            json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip}]}]}),
        )
    };
    let mut n = plain("a");
    n.add_pod(&Arc::new(wants(8080, "0.0.0.0")));
    let cases = [
        (8080, "0.0.0.0", false),
        (8080, "10.0.0.1", false),
        (8081, "0.0.0.0", true),
    ];
    for (port, ip, fits) in cases {
        let p = wants(port, ip);
        let mut state = CycleState::new();
        assert_eq!(
            NodePorts
                .pre_filter()
                .expect("pf")
                .pre_filter(&mut state, &p)
                .code,
            Code::Success
        );
        assert_eq!(
            filter(&NodePorts, &p, &n).0 == Code::Success,
            fits,
            "{port} {ip}"
        );
    }
    let mut state = CycleState::new();
    assert_eq!(
        NodePorts
            .pre_filter()
            .expect("pf")
            .pre_filter(&mut state, &pod(json!({})))
            .code,
        Code::Skip,
        "no host ports: the filter is skipped"
    );
}

#[test]
fn node_affinity() {
    let zone_a = node("a", json!({"zone": "a", "gen": "3"}), json!({}), "2");
    let zone_b = node("b", json!({"zone": "b", "gen": "5"}), json!({}), "2");
    let required = |exprs: Value| {
        pod(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}}),
        )
    };
    let cases = [
        (pod(json!({"nodeSelector": {"zone": "a"}})), true, false),
        (
            required(json!([{"key": "zone", "operator": "In", "values": ["b"]}])),
            false,
            true,
        ),
        (
            required(json!([{"key": "zone", "operator": "NotIn", "values": ["b"]}])),
            true,
            false,
        ),
        (
            required(json!([{"key": "gen", "operator": "Gt", "values": ["4"]}])),
            false,
            true,
        ),
        (
            required(json!([{"key": "gpu", "operator": "DoesNotExist"}])),
            true,
            true,
        ),
        (
            required(json!([{"key": "zone", "operator": "Exists"}])),
            true,
            true,
        ),
    ];
    for (i, (p, on_a, on_b)) in cases.iter().enumerate() {
        assert_eq!(
            filter(&NodeAffinity, p, &zone_a).0 == Code::Success,
            *on_a,
            "case {i} on a"
        );
        assert_eq!(
            filter(&NodeAffinity, p, &zone_b).0 == Code::Success,
            *on_b,
            "case {i} on b"
        );
    }
    let by_field = pod(
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}}),
    );
    assert_ne!(filter(&NodeAffinity, &by_field, &zone_a).0, Code::Success);
    assert_eq!(filter(&NodeAffinity, &by_field, &zone_b).0, Code::Success);
    // Preferred terms: weights summed, normalized to 0..=100.
    let prefers = pod(
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 30, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}},
        {"weight": 10, "preference": {"matchExpressions": [{"key": "gen", "operator": "Exists"}]}}]}}}),
    );
    let sc = NodeAffinity.score().expect("score");
    let state = CycleState::new();
    let mut scores = vec![
        sc.score(&state, &prefers, &zone_a).expect("a"),
        sc.score(&state, &prefers, &zone_b).expect("b"),
    ];
    assert_eq!(scores, vec![10, 40]);
    sc.normalize(&state, &prefers, &mut scores);
    assert_eq!(scores, vec![25, 100]);
}

#[test]
fn taint_toleration() {
    let tainted = node(
        "a",
        json!({}),
        json!({"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}),
        "2",
    );
    let soft = node(
        "b",
        json!({}),
        json!({"taints": [{"key": "spot", "effect": "PreferNoSchedule"}]}),
        "2",
    );
    assert_eq!(
        filter(&TaintToleration, &pod(json!({})), &tainted),
        (
            Code::UnschedulableAndUnresolvable,
            "node(s) had untolerated taint {gpu: yes}".into()
        )
    );
    let tolerant = pod(
        json!({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]}),
    );
    assert_eq!(
        filter(&TaintToleration, &tolerant, &tainted).0,
        Code::Success
    );
    assert_eq!(
        filter(&TaintToleration, &pod(json!({})), &soft).0,
        Code::Success,
        "PreferNoSchedule only scores"
    );
    let sc = TaintToleration.score().expect("score");
    let state = CycleState::new();
    let p = pod(json!({}));
    let mut scores = vec![
        sc.score(&state, &p, &soft).expect("soft"),
        sc.score(&state, &p, &plain("c")).expect("plain"),
    ];
    sc.normalize(&state, &p, &mut scores);
    assert_eq!(scores, vec![0, 100], "the untainted node is preferred");
}

#[test]
fn resources_fit_and_scoring() {
    let fit = Fit::new(FitArgs::default()).expect("fit");
    let asks = |cpu: &str, mem: &str| {
        pod(
            json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}),
        )
    };
    let mut n = plain("a");
    let cases = [
        (asks("1", "1Gi"), ""),
        (asks("3", "1Gi"), "Insufficient cpu"),
        (asks("1", "5Gi"), "Insufficient memory"),
        (asks("3", "5Gi"), "Insufficient cpu, Insufficient memory"),
    ];
    for (p, want) in &cases {
        assert_eq!(filter(&fit, p, &n).1, *want);
    }
    for _ in 0..3 {
        n.add_pod(&Arc::new(asks("10m", "1Mi")));
    }
    assert_eq!(filter(&fit, &asks("10m", "1Mi"), &n).1, "Too many pods");
    // LeastAllocated prefers the emptier node, MostAllocated the fuller one.
    let mut busy = plain("busy");
    busy.add_pod(&Arc::new(asks("1", "2Gi")));
    let idle = plain("idle");
    let p = asks("100m", "100Mi");
    let state = CycleState::new();
    let least = fit.score().expect("score");
    assert!(
        least.score(&state, &p, &idle).expect("s") > least.score(&state, &p, &busy).expect("s")
    );
    let most = Fit::new(
        serde_json::from_value(json!({"scoringStrategy": {"type": "MostAllocated"}}))
            .expect("args"),
    )
    .expect("fit");
    let most = most.score().expect("score");
    assert!(most.score(&state, &p, &busy).expect("s") > most.score(&state, &p, &idle).expect("s"));
    // Balanced: even cpu and memory use beats lopsided.
    let mut lopsided = plain("l");
    lopsided.add_pod(&Arc::new(asks("1900m", "10Mi")));
    let b = Balanced.score().expect("score");
    assert!(b.score(&state, &p, &idle).expect("s") > b.score(&state, &p, &lopsided).expect("s"));
    assert!(
        Fit::new(
            serde_json::from_value(
                json!({"scoringStrategy": {"resources": [{"name": "gpu", "weight": 1}]}})
            )
            .expect("args")
        )
        .is_err()
    );
}

#[test]
fn priority_sort() {
    let q = |priority: i32, enqueued: u64| QueuedPod {
        info: Arc::new(pod(json!({"priority": priority}))),
        enqueued,
        order: enqueued,
        attempts: 0,
    };
    let s = PrioritySort.queue_sort().expect("sort");
    assert!(s.less(&q(10, 5), &q(0, 1)), "higher priority first");
    assert!(s.less(&q(0, 1), &q(0, 2)), "then earlier");
    assert!(!s.less(&q(0, 2), &q(0, 1)));
    // A gang member queued late takes its gang's place (its first member's), ahead of a
    // pod queued between them; within the gang, the order of queueing.
    let member = |enqueued: u64, first: u64| QueuedPod {
        order: first,
        ..q(0, enqueued)
    };
    assert!(s.less(&member(9, 1), &q(0, 5)), "the gang's place");
    assert!(s.less(&q(0, 5), &member(10, 7)), "a later gang's place");
    assert!(
        s.less(&member(3, 1), &member(9, 1)),
        "within a gang, queueing order"
    );
    // Retries still come after new pods of the same priority.
    let retried = QueuedPod {
        attempts: 1,
        ..member(2, 1)
    };
    assert!(s.less(&q(0, 5), &retried));
}
