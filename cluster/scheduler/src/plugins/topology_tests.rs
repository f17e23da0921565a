//! PodTopologySpread and InterPodAffinity against Kubernetes' documented behaviour, on a
//! real cache whose topology counters follow every pod and node change.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::cache::Cache;
use crate::framework::{Code, CycleState, Plugin};
use crate::plugins::interpod::{self, InterPodAffinity};
use crate::plugins::spread::{self, PodTopologySpread};
use crate::resources::PodInfo;

/// A shard of nodes `(name, zone)` (zone `None`: no zone label).
fn cluster(nodes: &[(&str, Option<&str>)]) -> Cache {
    let mut c = Cache::with_topology(Default::default());
    for (name, zone) in nodes {
        c.upsert_node(node(name, *zone));
    }
    c
}

fn node(name: &str, zone: Option<&str>) -> Arc<k8s_openapi::api::core::v1::Node> {
    let mut labels = json!({"kubernetes.io/hostname": name});
    if let Some(z) = zone {
        labels["topology.kubernetes.io/zone"] = json!(z);
    }
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"}}}))
        .expect("node"),
    )
}

fn pod_in(ns: &str, name: &str, labels: Value, spec: Value) -> Arc<PodInfo> {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "c", "image": "x"}]);
    Arc::new(PodInfo::new(Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns,
            "uid": format!("uid-{ns}-{name}"), "labels": labels}, "spec": spec}))
        .expect("pod"),
    )))
}

fn pod(name: &str, labels: Value, spec: Value) -> Arc<PodInfo> {
    pod_in("ns", name, labels, spec)
}

/// Places pods `(name, labels, node)` as bound.
fn place(c: &mut Cache, pods: &[(&str, Value, &str)]) {
    for (name, labels, node) in pods {
        c.confirm_pod(pod(name, labels.clone(), json!({})), node);
    }
}

/// Runs PreFilter and Filter of `p` for `incoming` on every node: node → (code, reason).
fn filter_all(
    c: &mut Cache,
    make: Make,
    incoming: &Arc<PodInfo>,
) -> HashMap<String, (Code, String)> {
    let p = make(c);
    let needs = p.counters(incoming, &c.topology().read());
    c.ensure_counters(&needs);
    let mut state = CycleState::new();
    let pre = p
        .pre_filter()
        .expect("pre_filter")
        .pre_filter(&mut state, incoming);
    let mut out = HashMap::new();
    for n in c.nodes() {
        let s = if pre.code == Code::Skip {
            crate::framework::Status::success()
        } else {
            assert_eq!(pre.code, Code::Success, "{}", pre.message());
            p.filter().expect("filter").filter(&state, incoming, n)
        };
        out.insert(n.name.clone(), (s.code, s.message()));
    }
    out
}

fn fitting(r: &HashMap<String, (Code, String)>) -> Vec<String> {
    let mut v: Vec<String> = r
        .iter()
        .filter(|(_, (c, _))| *c == Code::Success)
        .map(|(n, _)| n.clone())
        .collect();
    v.sort();
    v
}

/// Normalized scores of `p` for `incoming` over every node, by node.
fn scores(c: &mut Cache, make: Make, incoming: &Arc<PodInfo>) -> HashMap<String, i64> {
    let p = make(c);
    let needs = p.counters(incoming, &c.topology().read());
    c.ensure_counters(&needs);
    let mut state = CycleState::new();
    let nodes: Vec<_> = c.nodes().iter().collect();
    let pre = p
        .pre_score()
        .expect("pre_score")
        .pre_score(&mut state, incoming, &nodes);
    if pre.code == Code::Skip {
        return nodes.iter().map(|n| (n.name.clone(), 0)).collect();
    }
    let sc = p.score().expect("score");
    let mut raw: Vec<i64> = nodes
        .iter()
        .map(|n| sc.score(&state, incoming, n).expect("score"))
        .collect();
    assert!(sc.normalize(&state, incoming, &mut raw).is_success());
    nodes.iter().map(|n| n.name.clone()).zip(raw).collect()
}

type Make = fn(&Cache) -> Box<dyn Plugin>;

fn spread_plugin(c: &Cache) -> Box<dyn Plugin> {
    Box::new(PodTopologySpread::new(c.topology().clone()))
}

fn affinity_plugin(c: &Cache) -> Box<dyn Plugin> {
    Box::new(InterPodAffinity::new(c.topology().clone()))
}

const ZONE: &str = "topology.kubernetes.io/zone";
const HOST: &str = "kubernetes.io/hostname";

/// The four-node, two-zone cluster of Kubernetes' topology spread documentation, with pods
/// `foo=bar` on node1, node2 (zoneA) and node3 (zoneB).
fn documented() -> Cache {
    let mut c = cluster(&[
        ("node1", Some("zoneA")),
        ("node2", Some("zoneA")),
        ("node3", Some("zoneB")),
        ("node4", Some("zoneB")),
    ]);
    let foo = json!({"foo": "bar"});
    place(
        &mut c,
        &[
            ("a", foo.clone(), "node1"),
            ("b", foo.clone(), "node2"),
            ("c", foo, "node3"),
        ],
    );
    c
}

fn spread_pod(constraints: Value, spec_extra: Value) -> Arc<PodInfo> {
    let mut spec = spec_extra;
    spec["topologySpreadConstraints"] = constraints;
    pod("incoming", json!({"foo": "bar"}), spec)
}

fn constraint(key: &str, skew: i64, when: &str) -> Value {
    json!({"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": {"foo": "bar"}}})
}

#[test]
fn spread_one_constraint_goes_to_the_emptier_zone() {
    let mut c = documented();
    let p = spread_pod(json!([constraint(ZONE, 1, "DoNotSchedule")]), json!({}));
    let r = filter_all(&mut c, spread_plugin, &p);
    assert_eq!(fitting(&r), ["node3", "node4"]);
    assert_eq!(r["node1"], (Code::Unschedulable, spread::SKEW.to_owned()));
    // maxSkew 2 lets zoneA take one more (2 + 1 - 1 = 2).
    let p = spread_pod(json!([constraint(ZONE, 2, "DoNotSchedule")]), json!({}));
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)).len(), 4);
}

#[test]
fn spread_two_constraints_both_hold() {
    let mut c = documented();
    let p = spread_pod(
        json!([
            constraint(ZONE, 1, "DoNotSchedule"),
            constraint(HOST, 1, "DoNotSchedule")
        ]),
        json!({}),
    );
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)), ["node4"]);
}

#[test]
fn spread_counts_follow_binds_deletes_terminations_and_relabels() {
    let mut c = documented();
    let p = spread_pod(json!([constraint(ZONE, 1, "DoNotSchedule")]), json!({}));
    // zoneB takes a pod: 2 / 2, every node fits.
    c.assume(pod("d", json!({"foo": "bar"}), json!({})), "node4");
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)).len(), 4);
    // Gone again: back to zoneB only.
    c.forget("ns/d");
    assert_eq!(
        fitting(&filter_all(&mut c, spread_plugin, &p)),
        ["node3", "node4"]
    );
    // A terminating pod no longer counts: zoneA 1 / zoneB 1.
    let mut dying = (*c.pod("ns/a").expect("a").pod).clone();
    dying.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Default::default(),
    ));
    c.remove_pod("ns/a");
    c.confirm_pod(Arc::new(PodInfo::new(Arc::new(dying))), "node1");
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)).len(), 4);
    // node2 moves to zoneB: zoneA 0, zoneB 2 — only zoneA (node1) fits.
    c.upsert_node(node("node2", Some("zoneB")));
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)), ["node1"]);
}

#[test]
fn spread_min_domains_counts_missing_domains_as_empty() {
    let mut c = documented();
    place(&mut c, &[("d", json!({"foo": "bar"}), "node4")]);
    // 2 / 2 across two zones: with maxSkew 1 any node fits...
    let mut one = constraint(ZONE, 1, "DoNotSchedule");
    assert_eq!(
        fitting(&filter_all(
            &mut c,
            spread_plugin,
            &spread_pod(json!([one.clone()]), json!({}))
        ))
        .len(),
        4
    );
    // ...but minDomains 3 treats the global minimum as 0, so 2 + 1 - 0 > 1 everywhere.
    one["minDomains"] = json!(3);
    let r = filter_all(&mut c, spread_plugin, &spread_pod(json!([one]), json!({})));
    assert!(fitting(&r).is_empty(), "{r:?}");
}

#[test]
fn spread_a_node_without_the_key_is_out() {
    let mut c = documented();
    c.upsert_node(node("bare", None));
    let p = spread_pod(json!([constraint(ZONE, 1, "DoNotSchedule")]), json!({}));
    let r = filter_all(&mut c, spread_plugin, &p);
    assert_eq!(
        r["bare"],
        (
            Code::UnschedulableAndUnresolvable,
            spread::MISSING_LABEL.to_owned()
        )
    );
    assert_eq!(fitting(&r), ["node3", "node4"]);
}

#[test]
fn spread_pods_on_nodes_without_a_key_count_in_no_domain() {
    // Two zone-less nodes, one holding two matching pods; every zoned node holds one. The
    // bare nodes' pods count for no zone, and for hostnames only when the pod's constraints
    // do not also need a zone (a node must carry every key of them to count, as in
    // Kubernetes).
    let mut c = documented();
    c.upsert_node(node("bare1", None));
    c.upsert_node(node("bare2", None));
    let foo = json!({"foo": "bar"});
    place(
        &mut c,
        &[
            ("w", foo.clone(), "node4"),
            ("x", foo.clone(), "bare1"),
            ("y", foo, "bare1"),
        ],
    );
    // Zones 2 / 2: every zoned node fits.
    let zone = spread_pod(json!([constraint(ZONE, 1, "DoNotSchedule")]), json!({}));
    assert_eq!(
        fitting(&filter_all(&mut c, spread_plugin, &zone)),
        ["node1", "node2", "node3", "node4"]
    );
    // Hostnames alone: the empty bare2 is the minimum (0), so only it fits.
    let host = spread_pod(json!([constraint(HOST, 1, "DoNotSchedule")]), json!({}));
    assert_eq!(
        fitting(&filter_all(&mut c, spread_plugin, &host)),
        ["bare2"]
    );
    // Both: the bare nodes are out, their hostnames are no domains, the minimum is 1, and
    // every zoned node fits (1 + 1 - 1 for hostnames, 2 + 1 - 2 for zones).
    let both = spread_pod(
        json!([
            constraint(ZONE, 1, "DoNotSchedule"),
            constraint(HOST, 1, "DoNotSchedule")
        ]),
        json!({}),
    );
    let r = filter_all(&mut c, spread_plugin, &both);
    assert_eq!(fitting(&r), ["node1", "node2", "node3", "node4"]);
    assert_eq!(
        r["bare2"],
        (
            Code::UnschedulableAndUnresolvable,
            spread::MISSING_LABEL.to_owned()
        )
    );
    // A zone-less node's pod going away changes nothing for the zones.
    assert!(c.remove_pod("ns/x"));
    assert_eq!(
        fitting(&filter_all(&mut c, spread_plugin, &zone)),
        ["node1", "node2", "node3", "node4"]
    );
}

#[test]
fn spread_node_affinity_policy_decides_which_domains_count() {
    let mut c = documented();
    c.upsert_node(node("node5", Some("zoneC")));
    let not_c = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["zoneC"]}]}]}}}});
    // Honor (default): zoneC is not the pod's, so the minimum is zoneB's 1: zoneB fits.
    let p = spread_pod(json!([constraint(ZONE, 1, "DoNotSchedule")]), not_c.clone());
    assert_eq!(
        fitting(&filter_all(&mut c, spread_plugin, &p)),
        ["node3", "node4", "node5"]
    );
    // Ignore: the empty zoneC is the minimum, and zoneB (1 + 1 - 0) is too many.
    let mut ignore = constraint(ZONE, 1, "DoNotSchedule");
    ignore["nodeAffinityPolicy"] = json!("Ignore");
    let p = spread_pod(json!([ignore]), not_c);
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)), ["node5"]);
}

#[test]
fn spread_selector_details_self_match_and_match_label_keys() {
    let mut c = documented();
    // The incoming pod does not match its own selector: it adds nothing, so zoneA's 2 is
    // a skew of 1 over zoneB's 1 — every node fits.
    let p = pod(
        "other",
        json!({"app": "x"}),
        json!({"topologySpreadConstraints": [constraint(ZONE, 1, "DoNotSchedule")]}),
    );
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)).len(), 4);
    // matchLabelKeys: only pods of the same revision count. The three pods have no hash;
    // the incoming pod's revision has none placed: any node fits.
    let mut by_rev = constraint(ZONE, 1, "DoNotSchedule");
    by_rev["matchLabelKeys"] = json!(["pod-template-hash"]);
    let p = pod(
        "rev",
        json!({"foo": "bar", "pod-template-hash": "v2"}),
        json!({"topologySpreadConstraints": [by_rev]}),
    );
    assert_eq!(fitting(&filter_all(&mut c, spread_plugin, &p)).len(), 4);
}

#[test]
fn spread_schedule_anyway_prefers_fewer_matching_pods() {
    let mut c = documented();
    c.upsert_node(node("bare", None));
    let p = spread_pod(json!([constraint(HOST, 1, "ScheduleAnyway")]), json!({}));
    let s = scores(&mut c, spread_plugin, &p);
    // node4 and bare have no matching pod, the others one each.
    assert_eq!((s["node4"], s["bare"]), (100, 100), "{s:?}");
    assert!(s["node1"] < s["node4"], "{s:?}");
    assert_eq!(s["node1"], s["node3"]);
    // By zone: zoneB (1 pod) over zoneA (2); a node without a zone is ignored (0).
    let zone = spread_pod(json!([constraint(ZONE, 1, "ScheduleAnyway")]), json!({}));
    let s = scores(&mut c, spread_plugin, &zone);
    assert!(s["node3"] > s["node1"], "{s:?}");
    assert_eq!(s["bare"], 0, "{s:?}");
    // Hard constraints do not score, and a pod without soft ones skips scoring.
    let hard = spread_pod(json!([constraint(ZONE, 1, "DoNotSchedule")]), json!({}));
    let mut state = CycleState::new();
    let nodes: Vec<_> = c.nodes().iter().collect();
    let plugin = spread_plugin(&c);
    assert_eq!(
        plugin
            .pre_score()
            .expect("ps")
            .pre_score(&mut state, &hard, &nodes)
            .code,
        Code::Skip
    );
}

fn anti(selector: Value, key: &str) -> Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        [{"labelSelector": {"matchLabels": selector}, "topologyKey": key}]}}})
}

fn affinity(selector: Value, key: &str) -> Value {
    json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        [{"labelSelector": {"matchLabels": selector}, "topologyKey": key}]}}})
}

#[test]
fn anti_affinity_keeps_pods_apart_both_ways() {
    let mut c = documented();
    // The incoming pod's own anti-affinity: not next to foo=bar on the same host.
    let p = pod(
        "web",
        json!({"app": "web"}),
        anti(json!({"foo": "bar"}), HOST),
    );
    let r = filter_all(&mut c, affinity_plugin, &p);
    assert_eq!(fitting(&r), ["node4"]);
    assert_eq!(r["node1"], (Code::Unschedulable, interpod::ANTI.to_owned()));
    // Per zone: both zones hold one, nothing fits.
    let p = pod(
        "web",
        json!({"app": "web"}),
        anti(json!({"foo": "bar"}), ZONE),
    );
    assert!(fitting(&filter_all(&mut c, affinity_plugin, &p)).is_empty());
    // Symmetry: an existing pod's anti-affinity keeps a plain db pod out of its zone.
    c.confirm_pod(
        pod("guard", json!({}), anti(json!({"app": "db"}), ZONE)),
        "node1",
    );
    let db = pod("db", json!({"app": "db"}), json!({}));
    let r = filter_all(&mut c, affinity_plugin, &db);
    assert_eq!(fitting(&r), ["node3", "node4"]);
    assert_eq!(
        r["node2"],
        (Code::Unschedulable, interpod::EXISTING_ANTI.to_owned())
    );
    // Once the guard is gone, the db pod may go anywhere.
    c.remove_pod("ns/guard");
    assert_eq!(fitting(&filter_all(&mut c, affinity_plugin, &db)).len(), 4);
}

#[test]
fn affinity_needs_a_matching_pod_in_the_domain_except_for_the_first() {
    let mut c = documented();
    place(&mut c, &[("cache", json!({"app": "cache"}), "node3")]);
    let p = pod(
        "web",
        json!({"app": "web"}),
        affinity(json!({"app": "cache"}), ZONE),
    );
    let r = filter_all(&mut c, affinity_plugin, &p);
    assert_eq!(fitting(&r), ["node3", "node4"]);
    assert_eq!(
        r["node1"],
        (
            Code::UnschedulableAndUnresolvable,
            interpod::AFFINITY.to_owned()
        )
    );
    // Nothing matches yet: a pod that matches its own term may start the group anywhere...
    let first = pod(
        "g0",
        json!({"group": "g"}),
        affinity(json!({"group": "g"}), ZONE),
    );
    assert_eq!(
        fitting(&filter_all(&mut c, affinity_plugin, &first)).len(),
        4
    );
    // ...one that does not, cannot.
    let lone = pod("x", json!({}), affinity(json!({"group": "g"}), ZONE));
    assert!(fitting(&filter_all(&mut c, affinity_plugin, &lone)).is_empty());
    // Once the group has a member in zoneA, followers go to zoneA only.
    c.confirm_pod(first.clone(), "node2");
    let next = pod(
        "g1",
        json!({"group": "g"}),
        affinity(json!({"group": "g"}), ZONE),
    );
    assert_eq!(
        fitting(&filter_all(&mut c, affinity_plugin, &next)),
        ["node1", "node2"]
    );
}

#[test]
fn preferred_terms_score_both_ways() {
    let mut c = documented();
    place(&mut c, &[("cache", json!({"app": "cache"}), "node3")]);
    let p = pod(
        "web",
        json!({"app": "web"}),
        json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
            [{"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "cache"}},
              "topologyKey": ZONE}}]}}}),
    );
    let s = scores(&mut c, affinity_plugin, &p);
    assert_eq!((s["node3"], s["node4"], s["node1"]), (100, 100, 0), "{s:?}");
    // An existing pod's preferred anti-affinity against web pushes web out of zoneB.
    c.confirm_pod(
        pod(
            "shy",
            json!({}),
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                [{"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}},
                  "topologyKey": ZONE}}]}}}),
        ),
        "node4",
    );
    let plain_web = pod("web2", json!({"app": "web"}), json!({}));
    let s = scores(&mut c, affinity_plugin, &plain_web);
    assert_eq!((s["node1"], s["node3"]), (100, 0), "{s:?}");
}

/// Tenancy: terms never reach another tenant's namespaces — a tenant can neither keep
/// another's pods off nodes nor learn where another's pods run.
#[test]
fn affinity_terms_stay_inside_the_tenant() {
    let mut c = cluster(&[("n1", Some("z1")), ("n2", Some("z2"))]);
    let owners = HashMap::from([
        ("a".to_owned(), "tenant-a".to_owned()),
        ("a2".to_owned(), "tenant-a".to_owned()),
        ("b".to_owned(), "tenant-b".to_owned()),
    ]);
    let namespaces = ["a", "a2", "b", "free"]
        .iter()
        .map(|n| (n.to_string(), Default::default()))
        .collect();
    c.set_namespaces(namespaces, owners);
    // Tenant b's pod on n1 wants every pod in every namespace out of its zone.
    let everything = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        [{"labelSelector": {}, "namespaceSelector": {}, "topologyKey": ZONE}]}}});
    c.confirm_pod(
        pod_in("b", "blocker", json!({"app": "db"}), everything),
        "n1",
    );
    // It keeps tenant b's own pods away...
    let own = pod_in("b", "mine", json!({}), json!({}));
    assert_eq!(fitting(&filter_all(&mut c, affinity_plugin, &own)), ["n2"]);
    // ...but not tenant a's, nor pods of namespaces no tenant owns.
    for ns in ["a", "free"] {
        let other = pod_in(ns, "theirs", json!({}), json!({}));
        assert_eq!(
            fitting(&filter_all(&mut c, affinity_plugin, &other)).len(),
            2,
            "{ns}"
        );
    }
    // Tenant a cannot probe b's pods: its anti-affinity naming namespace b sees nothing.
    let probe = pod_in(
        "a",
        "probe",
        json!({}),
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            [{"labelSelector": {"matchLabels": {"app": "db"}}, "namespaces": ["b"], "topologyKey": ZONE}]}}}),
    );
    assert_eq!(
        fitting(&filter_all(&mut c, affinity_plugin, &probe)).len(),
        2
    );
    // Within its own tenant, naming a sibling namespace works.
    c.confirm_pod(pod_in("a2", "db", json!({"app": "db"}), json!({})), "n2");
    let sibling = pod_in(
        "a",
        "near",
        json!({}),
        json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            [{"labelSelector": {"matchLabels": {"app": "db"}}, "namespaces": ["a2", "b"], "topologyKey": ZONE}]}}}),
    );
    assert_eq!(
        fitting(&filter_all(&mut c, affinity_plugin, &sibling)),
        ["n2"]
    );
}

/// Kubernetes' system default spreading: a pod without constraints of its own is spread
/// over hostnames and zones among the pods its Services and owner select; a node without a
/// zone is scored by hostname alone; a pod nothing selects is not spread.
#[test]
fn system_defaults_spread_what_selects_the_pod() {
    let mut c = documented();
    c.upsert_node(node("bare", None));
    place(
        &mut c,
        &[
            ("w1", json!({"app": "web"}), "node1"),
            ("w2", json!({"app": "web"}), "node1"),
            ("w3", json!({"app": "web"}), "node3"),
        ],
    );
    c.topology().write().set_default_selector(Arc::new(|p| {
        let labels = p.metadata.labels.as_ref()?;
        (labels.get("app").map(String::as_str) == Some("web")).then(|| {
            tessera_core::LabelSelector::from_requirements(vec![
                tessera_core::selector::label::Requirement {
                    key: "app".into(),
                    operator: tessera_core::selector::label::Operator::Equals,
                    values: vec!["web".into()],
                },
            ])
        })
    }));
    let web = pod("web", json!({"app": "web"}), json!({}));
    let s = scores(&mut c, spread_plugin, &web);
    // node4: no web pod, in the zone with fewer; node1: two, in the zone with more.
    assert!(s["node4"] > s["node2"] && s["node2"] > s["node1"], "{s:?}");
    assert!(s["node4"] > s["node3"], "{s:?}");
    assert!(s["bare"] > s["node1"], "scored by hostname alone: {s:?}");
    // A pod nothing selects is not spread.
    let lone = pod("lone", json!({"app": "other"}), json!({}));
    let plugin = spread_plugin(&c);
    let nodes: Vec<_> = c.nodes().iter().collect();
    assert_eq!(
        plugin
            .pre_score()
            .expect("ps")
            .pre_score(&mut CycleState::new(), &lone, &nodes)
            .code,
        Code::Skip
    );
    // `List` with no constraints turns defaults off; System with a list is refused.
    let off: spread::SpreadArgs =
        serde_json::from_value(json!({"defaultingType": "List"})).expect("args");
    let off = PodTopologySpread::with_args(c.topology().clone(), off).expect("valid");
    assert!(off.counters(&web, &c.topology().read()).is_empty());
    let bad: spread::SpreadArgs = serde_json::from_value(json!({"defaultConstraints":
        [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]}))
    .expect("args");
    assert!(PodTopologySpread::with_args(c.topology().clone(), bad).is_err());
}
