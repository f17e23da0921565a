//! DefaultPreemption against kube-scheduler's documented behaviour (the fewest and least
//! important victims, PodDisruptionBudgets preferred intact, nodes where preemption cannot
//! help), plus the fair-share rule across tenants.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::cache::Cache;
use crate::framework::{Code, CycleState, FilterPlugin, Plugin, PostFilterInput};
use crate::plugins::fit::{Fit, FitArgs};

fn node(name: &str, cpu: &str) -> Arc<k8s_openapi::api::core::v1::Node> {
    Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}}),
        )
        .expect("node"),
    )
}

fn pod_in(ns: &str, name: &str, cpu: &str, priority: i32, extra: Value) -> Arc<PodInfo> {
    let mut p = json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
            "labels": {"app": name}},
        "spec": {"priority": priority, "containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": cpu}}}]}});
    if let (Some(m), Some(e)) = (p.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match (k.as_str(), m.get_mut(k)) {
                ("spec" | "metadata", Some(Value::Object(o))) => {
                    for (k2, v2) in v.as_object().into_iter().flatten() {
                        o.insert(k2.clone(), v2.clone());
                    }
                }
                _ => {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Arc::new(PodInfo::new(Arc::new(
        serde_json::from_value(p).expect("pod"),
    )))
}

fn pod(name: &str, cpu: &str, priority: i32) -> Arc<PodInfo> {
    pod_in("ns", name, cpu, priority, json!({}))
}

/// A shard: nodes `(name, cpu)` and bound pods `(pod, node)`.
fn shard(nodes: &[(&str, &str)], pods: &[(Arc<PodInfo>, &str)]) -> Cache {
    let mut c = Cache::with_topology(Default::default());
    for (n, cpu) in nodes {
        c.upsert_node(node(n, cpu));
    }
    for (p, n) in pods {
        c.confirm_pod(p.clone(), n);
    }
    c
}

struct Run {
    nomination: Option<(String, Vec<String>)>,
    status: Status,
}

/// Runs Filter (NodeResourcesFit) on every node, then DefaultPreemption, as the cycle does.
fn preempt(
    c: &Cache,
    budgets: Vec<Budget>,
    fair: Option<FairView>,
    incoming: &Arc<PodInfo>,
    unresolvable: &[&str],
) -> Run {
    let fit = Fit::new(FitArgs::default()).expect("fit");
    let mut state = CycleState::new();
    if let Some(f) = fair {
        state.write(FAIR_VIEW, f);
    }
    let nodes = c.nodes();
    let codes: Vec<Code> = nodes
        .iter()
        .map(|n| {
            if unresolvable.contains(&n.name.as_str()) {
                Code::UnschedulableAndUnresolvable
            } else {
                let s = FilterPlugin::filter(&fit, &state, incoming, n);
                assert!(!s.is_success(), "{} fits on {}", incoming.key, n.name);
                s.code
            }
        })
        .collect();
    let filter = |n: &NodeInfo| FilterPlugin::filter(&fit, &state, incoming, n);
    post_filter(budgets, &state, incoming, nodes, &codes, &filter)
}

/// Runs DefaultPreemption over `nodes` as Filter left them (`codes`, `filter`).
fn post_filter(
    budgets: Vec<Budget>,
    state: &CycleState,
    incoming: &Arc<PodInfo>,
    nodes: &[NodeInfo],
    codes: &[Code],
    filter: &dyn Fn(&NodeInfo) -> Status,
) -> Run {
    let store = Arc::new(Budgets::default());
    store.set(budgets);
    let plugin = DefaultPreemption::new(store);
    let (nom, status) = PostFilterPlugin::post_filter(
        &plugin,
        state,
        incoming,
        &PostFilterInput {
            nodes,
            codes,
            filter,
        },
    );
    Run {
        nomination: nom.map(|n| {
            let mut v: Vec<String> = n.victims.iter().map(|v| v.name().to_owned()).collect();
            v.sort();
            (n.node, v)
        }),
        status,
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn victims_are_the_fewest_and_least_important_that_make_room() {
    // 4 cpu full: after evicting all lower pods, the most important are put back first.
    let c = shard(
        &[("n1", "4")],
        &[
            (pod("low1", "2", 1), "n1"),
            (pod("low2", "1", 2), "n1"),
            (pod("low3", "1", 3), "n1"),
        ],
    );
    let r = preempt(&c, vec![], None, &pod("vip", "2", 10), &[]);
    assert!(r.status.is_success(), "{}", r.status.message());
    assert_eq!(r.nomination, Some(("n1".into(), names(&["low1"]))));
}

#[test]
fn the_node_with_the_least_important_victims_is_chosen() {
    // (nodes' pods, incoming, expected node and victims)
    // (pods on nodes, the incoming pod, the node and victims chosen)
    type Case<'a> = (
        Vec<(Arc<PodInfo>, &'a str)>,
        Arc<PodInfo>,
        (&'a str, Vec<&'a str>),
    );
    let cases: Vec<Case> = vec![
        // Lowest highest-priority victim wins.
        (
            vec![(pod("a5", "2", 5), "n1"), (pod("b1", "2", 1), "n2")],
            pod("p", "2", 10),
            ("n2", vec!["b1"]),
        ),
        // Same highest priority: the smaller sum of priorities (fewer victims here).
        (
            vec![
                (pod("a1", "1", 1), "n1"),
                (pod("a2", "1", 1), "n1"),
                (pod("b1", "2", 1), "n2"),
            ],
            pod("p", "2", 10),
            ("n2", vec!["b1"]),
        ),
        // Pods of equal or higher priority are never victims.
        (
            vec![(pod("eq", "2", 10), "n1"), (pod("lo", "2", 9), "n2")],
            pod("p", "2", 10),
            ("n2", vec!["lo"]),
        ),
    ];
    for (pods, incoming, (node, victims)) in cases {
        let c = shard(&[("n1", "2"), ("n2", "2")], &pods);
        let r = preempt(&c, vec![], None, &incoming, &[]);
        assert_eq!(
            r.nomination,
            Some((node.to_owned(), names(&victims))),
            "{}",
            r.status.message()
        );
    }
}

fn budget(app: &str, allowed: i32) -> Budget {
    Budget {
        namespace: "ns".into(),
        selector: tessera_runtime::selector::from_metav1(
            &serde_json::from_value(json!({"matchLabels": {"app": app}})).expect("selector"),
        )
        .expect("selector"),
        allowed,
    }
}

#[test]
fn pod_disruption_budgets_are_kept_when_another_node_can_help() {
    let pods = vec![(pod("guarded", "2", 1), "n1"), (pod("free", "2", 5), "n2")];
    let c = shard(&[("n1", "2"), ("n2", "2")], &pods);
    // The budget allows no disruption: the other node wins, though its victim matters more.
    let r = preempt(
        &c,
        vec![budget("guarded", 0)],
        None,
        &pod("p", "2", 10),
        &[],
    );
    assert_eq!(r.nomination, Some(("n2".into(), names(&["free"]))));
    // A budget that allows one: the least important victim again.
    let r = preempt(
        &c,
        vec![budget("guarded", 1)],
        None,
        &pod("p", "2", 10),
        &[],
    );
    assert_eq!(r.nomination, Some(("n1".into(), names(&["guarded"]))));
    // Only a guarded victim can make room: it is preempted anyway (as Kubernetes does).
    let c = shard(&[("n1", "2")], &[(pod("guarded", "2", 1), "n1")]);
    let r = preempt(
        &c,
        vec![budget("guarded", 0)],
        None,
        &pod("p", "2", 10),
        &[],
    );
    assert_eq!(r.nomination, Some(("n1".into(), names(&["guarded"]))));
}

#[test]
fn when_preemption_cannot_help_it_says_why_in_kubernetes_words() {
    let c = shard(
        &[("n1", "2"), ("n2", "2"), ("n3", "2")],
        &[
            (pod("same", "2", 10), "n1"),
            (pod("higher", "2", 20), "n2"),
            (pod("low", "1", 1), "n3"),
        ],
    );
    // n3's low pod frees 1 cpu of the 2 asked; n1 and n2 hold nothing of lower priority.
    let r = preempt(&c, vec![], None, &pod("p", "3", 10), &[]);
    assert!(r.nomination.is_none());
    assert_eq!(
        r.status.message(),
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    );
    let r = preempt(&c, vec![], None, &pod("p", "3", 10), &["n1"]);
    assert_eq!(
        r.status.message(),
        "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    );
    let never = pod_in(
        "ns",
        "polite",
        "2",
        100,
        json!({"spec": {"preemptionPolicy": "Never"}}),
    );
    let r = preempt(&c, vec![], None, &never, &[]);
    assert_eq!(
        r.status.message(),
        "preemption: not eligible due to preemptionPolicy=Never."
    );
}

#[test]
fn terminating_pods_are_not_victims() {
    let going = pod_in(
        "ns",
        "going",
        "2",
        1,
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    );
    let c = shard(&[("n1", "2")], &[(going, "n1")]);
    let r = preempt(&c, vec![], None, &pod("p", "2", 10), &[]);
    assert!(r.nomination.is_none(), "{:?}", r.nomination);
}

#[test]
fn across_tenants_only_a_tenant_under_its_share_preempts_one_over_it() {
    // Tenant a (namespace ta, share 0.2) and b (tb, share 0.6); one node, full of a pod of
    // priority 1. (running pod, incoming pod, the victims or why there are none)
    let cases = [
        (
            ("tb", "bees"),
            ("ta", "ay", 10),
            Ok(vec!["bees"]),
            "under its share, a preempts b",
        ),
        (
            ("ta", "ay"),
            ("tb", "bees", 1000),
            Err(
                "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.",
            ),
            "over its share, b cannot preempt a whatever its priority",
        ),
        (
            ("tb", "b-low"),
            ("tb", "b-high", 10),
            Ok(vec!["b-low"]),
            "within a tenant, priority alone decides",
        ),
    ];
    for ((ns, running), (ins, incoming, priority), want, why) in cases {
        let fair = FairView::of(&[0.0, 0.2, 0.6], &[("ta", 1), ("tb", 2)]);
        let c = shard(
            &[("n1", "2")],
            &[(pod_in(ns, running, "2", 1, json!({})), "n1")],
        );
        let incoming = pod_in(ins, incoming, "2", priority, json!({}));
        let r = preempt(&c, vec![], Some(fair), &incoming, &[]);
        match want {
            Ok(victims) => assert_eq!(r.nomination, Some(("n1".into(), names(&victims))), "{why}"),
            Err(message) => {
                assert!(r.nomination.is_none(), "{why}: {:?}", r.nomination);
                assert_eq!(r.status.message(), message, "{why}");
            }
        }
    }
}

#[test]
fn a_nominated_pod_keeps_its_room_from_pods_of_lower_priority() {
    let mut c = shard(&[("n1", "2")], &[]);
    let vip = pod("vip", "2", 10);
    c.nominate(vip.clone(), "n1", Vec::new());
    let fit = Fit::new(FitArgs::default()).expect("fit");
    let state = CycleState::new();
    let n = &c.nodes()[0];
    let low = pod("low", "1", 5);
    let s = FilterPlugin::filter(&fit, &state, &low, n);
    assert_eq!(s.message(), "Insufficient cpu", "the room is held for vip");
    assert!(FilterPlugin::filter(&fit, &state, &pod("higher", "1", 50), n).is_success());
    assert!(
        FilterPlugin::filter(&fit, &state, &vip, n).is_success(),
        "vip itself fits"
    );
    c.clear_nomination(&vip.key);
    assert!(FilterPlugin::filter(&fit, &state, &low, &c.nodes()[0]).is_success());
}

/// A pod whose victims are still on their node (the eviction may not even be seen yet)
/// waits for them instead of preempting again: one victim per preemption, never two.
#[test]
fn a_preemption_under_way_is_not_repeated() {
    let low = pod("low", "2", 1);
    let mut c = shard(
        &[("n1", "2"), ("n2", "2")],
        &[(low.clone(), "n1"), (pod("low2", "2", 1), "n2")],
    );
    let vip = pod("vip", "2", 10);
    c.nominate(vip.clone(), "n1", vec![low.key.clone()]);
    assert!(
        c.preemption_underway(&vip.key),
        "its victim is still counted"
    );
    let fit = Fit::new(FitArgs::default()).expect("fit");
    let mut state = CycleState::new();
    state.write(UNDERWAY, c.preemption_underway(&vip.key));
    let nodes = c.nodes();
    let codes = vec![Code::Unschedulable; nodes.len()];
    let filter = |n: &NodeInfo| FilterPlugin::filter(&fit, &state, &vip, n);
    let plugin = DefaultPreemption::new(Arc::default());
    let (nom, s) = PostFilterPlugin::post_filter(
        &plugin,
        &state,
        &vip,
        &PostFilterInput {
            nodes,
            codes: &codes,
            filter: &filter,
        },
    );
    assert!(nom.is_none(), "no second victim");
    assert_eq!(
        s.message(),
        "preemption: not eligible due to a terminating pod on the nominated node."
    );
    c.remove_pod(&low.key);
    assert!(!c.preemption_underway(&vip.key), "its victim is gone");
}

/// A node of 4 cpu in `zone`.
fn zoned(name: &str, zone: &str, cpu: &str) -> Arc<k8s_openapi::api::core::v1::Node> {
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}}))
        .expect("node"),
    )
}

/// A pod labelled `app` (not its name), with `spec` merged in.
fn app_pod(name: &str, app: &str, cpu: &str, priority: i32, spec: Value) -> Arc<PodInfo> {
    pod_in(
        "ns",
        name,
        cpu,
        priority,
        json!({"metadata": {"labels": {"app": app}}, "spec": spec}),
    )
}

fn required(kind: &str, app: &str, key: &str) -> Value {
    json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}})
}

/// Runs the whole filter chain — NodeResourcesFit, PodTopologySpread, InterPodAffinity, each
/// after its PreFilter, on the cache's live counters — then DefaultPreemption.
fn preempt_wide(c: &mut Cache, incoming: &Arc<PodInfo>) -> Run {
    use crate::plugins::interpod::InterPodAffinity;
    use crate::plugins::spread::PodTopologySpread;
    let plugins: Vec<Box<dyn Plugin>> = vec![
        Box::new(Fit::new(FitArgs::default()).expect("fit")),
        Box::new(PodTopologySpread::new(c.topology().clone())),
        Box::new(InterPodAffinity::new(c.topology().clone())),
    ];
    for p in &plugins {
        let needs = p.counters(incoming, &c.topology().read());
        c.ensure_counters(&needs);
    }
    let mut state = CycleState::new();
    let mut run = Vec::new();
    for p in &plugins {
        let s = p
            .pre_filter()
            .map_or_else(Status::success, |pf| pf.pre_filter(&mut state, incoming));
        match s.code {
            Code::Skip => {}
            Code::Success => run.push(p.filter().expect("filter")),
            _ => panic!("{}: {}", p.name(), s.message()),
        }
    }
    let filter = |n: &NodeInfo| {
        run.iter()
            .map(|f| f.filter(&state, incoming, n))
            .find(|s| !s.is_success())
            .unwrap_or_else(Status::success)
    };
    let nodes = c.nodes();
    let codes: Vec<Code> = nodes
        .iter()
        .map(|n| {
            let s = filter(n);
            assert!(!s.is_success(), "{} fits on {}", incoming.key, n.name);
            s.code
        })
        .collect();
    post_filter(Vec::new(), &state, incoming, nodes, &codes, &filter)
}

const HOST: &str = "kubernetes.io/hostname";

#[test]
fn a_victim_whose_anti_affinity_repels_the_pod_is_evicted_for_it() {
    // Both nodes have room; each holds a pod whose required anti-affinity repels `vip`. Only
    // the one of lower priority can go, and with it gone its anti-affinity no longer counts.
    let mut c = shard(
        &[("n1", "4"), ("n2", "4")],
        &[
            (
                app_pod(
                    "guard-low",
                    "guard",
                    "1",
                    1,
                    required("podAntiAffinity", "vip", HOST),
                ),
                "n1",
            ),
            (app_pod("bystander", "other", "1", 1, json!({})), "n1"),
            (
                app_pod(
                    "guard-high",
                    "guard",
                    "1",
                    100,
                    required("podAntiAffinity", "vip", HOST),
                ),
                "n2",
            ),
        ],
    );
    let r = preempt_wide(&mut c, &app_pod("vip", "vip", "1", 10, json!({})));
    assert_eq!(
        r.nomination,
        Some(("n1".into(), names(&["guard-low"]))),
        "{}",
        r.status.message()
    );
}

#[test]
fn the_pods_own_anti_affinity_evicts_only_what_it_repels() {
    let mut c = shard(
        &[("n1", "4"), ("n2", "4")],
        &[
            (app_pod("noisy-low", "noisy", "1", 1, json!({})), "n1"),
            (app_pod("bystander", "other", "1", 1, json!({})), "n1"),
            (app_pod("noisy-high", "noisy", "1", 100, json!({})), "n2"),
        ],
    );
    let vip = app_pod(
        "vip",
        "vip",
        "1",
        10,
        required("podAntiAffinity", "noisy", HOST),
    );
    let r = preempt_wide(&mut c, &vip);
    assert_eq!(
        r.nomination,
        Some(("n1".into(), names(&["noisy-low"]))),
        "{}",
        r.status.message()
    );
}

#[test]
fn evicting_pods_from_a_crowded_zone_lets_a_spread_pod_in() {
    // Zone a holds two `web` pods, zone b one (a high-priority pod filling its only node):
    // placing another in a skews 3:1. Evicting one of a's makes it 2:1, within maxSkew 1.
    let mut c = Cache::with_topology(Default::default());
    c.upsert_node(zoned("a1", "a", "4"));
    c.upsert_node(zoned("b1", "b", "1"));
    for (p, n) in [
        (app_pod("web-1", "web", "100m", 1, json!({})), "a1"),
        (app_pod("web-2", "web", "100m", 1, json!({})), "a1"),
        (app_pod("web-b", "web", "1", 100, json!({})), "b1"),
    ] {
        c.confirm_pod(p, n);
    }
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let r = preempt_wide(&mut c, &app_pod("web-vip", "web", "1", 10, spread));
    let (node, victims) = r.nomination.expect("a nomination");
    assert_eq!(node, "a1");
    assert_eq!(victims.len(), 1, "one victim is enough: {victims:?}");
}

#[test]
fn a_pod_its_required_affinity_needs_is_not_evicted_for_it() {
    // `vip` must share a node with a `db` pod. n1's db is the only pod there and of lower
    // priority: evicting it would make room but leave `vip` without its db, so n1 cannot
    // help; n2's db matters more and fills n2.
    let mut c = shard(
        &[("n1", "4"), ("n2", "2")],
        &[
            (app_pod("db-low", "db", "3", 1, json!({})), "n1"),
            (app_pod("db-high", "db", "2", 100, json!({})), "n2"),
        ],
    );
    let vip = app_pod("vip", "vip", "2", 10, required("podAffinity", "db", HOST));
    let r = preempt_wide(&mut c, &vip);
    assert_eq!(r.nomination, None, "{}", r.status.message());
    assert!(
        r.status.message().contains("No preemption victims found"),
        "{}",
        r.status.message()
    );
}
