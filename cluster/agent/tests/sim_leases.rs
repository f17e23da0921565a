//! Simulated nodes' Leases, through a real API on an embedded store. A Lease per node: each
//! is created, renewed (its renewTime and resourceVersion move, the holder stays), taken over
//! when one is already in place from an earlier agent, and left to lapse for a failed node.
//! One shared Lease (the default): the nodes name it, no node has its own, and a failed node
//! is moved to a Lease of its own that is not renewed while the shared one goes on.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Fixture, until};
use tessera_agent::sim::{LEASE_NAMESPACE, SimAgent, SimConfig};
use tessera_client::types::NODE_LEASE_ANNOTATION;

fn leases() -> &'static tessera_apiserver::catalog::Resource {
    tessera_apiserver::request::find_resource("coordination.k8s.io", "v1", "leases")
        .expect("leases are served")
}

async fn lease(f: &Fixture, name: &str) -> Option<Value> {
    f.client
        .get(leases(), Some(LEASE_NAMESPACE), name)
        .await
        .ok()
}

fn renew_time(l: &Value) -> String {
    l["spec"]["renewTime"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_created_renewed_taken_over_and_left_to_lapse() {
    let f = Fixture::start(|_| {}).await;
    // An earlier agent's Lease for node sim-1, held by someone else.
    let stale = f
        .client
        .create(
            leases(),
            Some(LEASE_NAMESPACE),
            &json!({"metadata": {"name": "sim-1"},
                "spec": {"holderIdentity": "an-earlier-agent", "leaseDurationSeconds": 40,
                         "renewTime": "2026-01-01T00:00:00.000000Z"}}),
        )
        .await
        .expect("stale lease");
    let agent = SimAgent::new(
        f.client.clone(),
        SimConfig {
            prefix: "sim".into(),
            nodes: 2,
            renew_interval: Duration::from_secs(1),
            shared_lease: false,
            ..SimConfig::default()
        },
        None,
        None,
    );
    agent.register(|| {}).await.expect("register");
    let task = tokio::spawn(Arc::clone(&agent).run());
    until("both Leases held by their nodes", || async {
        let mut held = 0;
        for n in ["sim-0", "sim-1"] {
            if lease(&f, n)
                .await
                .is_some_and(|l| l["spec"]["holderIdentity"] == n)
            {
                held += 1;
            }
        }
        held == 2
    })
    .await;
    let taken = lease(&f, "sim-1").await.expect("sim-1");
    assert_ne!(
        renew_time(&taken),
        renew_time(&stale),
        "renewed when taken over"
    );
    assert_eq!(taken["spec"]["leaseDurationSeconds"], 40);
    // Renewals move renewTime and the resourceVersion, as an update does.
    let first = lease(&f, "sim-0").await.expect("sim-0");
    until("sim-0 renewed", || async {
        lease(&f, "sim-0").await.is_some_and(|l| {
            renew_time(&l) > renew_time(&first)
                && l["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
        })
    })
    .await;
    let renewed = lease(&f, "sim-0").await.expect("sim-0");
    assert!(
        renew_time(&renewed).len() == "2026-01-01T00:00:00.000000Z".len()
            && renew_time(&renewed).ends_with('Z'),
        "a MicroTime: {}",
        renew_time(&renewed)
    );
    // A failed node stops renewing; the other goes on.
    assert!(agent.fail_node("sim-1").await.expect("fail"));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = lease(&f, "sim-1").await.expect("sim-1");
    let b = lease(&f, "sim-0").await.expect("sim-0");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        renew_time(&lease(&f, "sim-1").await.expect("sim-1")),
        renew_time(&a),
        "a failed node's Lease is not renewed"
    );
    assert!(renew_time(&lease(&f, "sim-0").await.expect("sim-0")) > renew_time(&b));
    task.abort();
}

async fn node(f: &Fixture, name: &str) -> Value {
    let nodes = tessera_apiserver::request::find_resource("", "v1", "nodes").expect("nodes");
    f.client.get(nodes, None, name).await.expect("node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hollow_nodes_share_one_lease_and_a_failed_node_leaves_it() {
    let f = Fixture::start(|_| {}).await;
    let agent = SimAgent::new(
        f.client.clone(),
        SimConfig {
            prefix: "pool".into(),
            nodes: 3,
            renew_interval: Duration::from_secs(1),
            ..SimConfig::default()
        },
        None,
        None,
    );
    let shared = agent.shared_lease().expect("shared by default").to_owned();
    assert_eq!(shared, "tessera-sim.pool");
    agent.register(|| {}).await.expect("register");
    let task = tokio::spawn(Arc::clone(&agent).run());
    let first = lease(&f, &shared).await.expect("the shared Lease");
    assert_eq!(first["spec"]["holderIdentity"], shared.as_str());
    for n in ["pool-0", "pool-1", "pool-2"] {
        assert_eq!(
            node(&f, n).await["metadata"]["annotations"][NODE_LEASE_ANNOTATION],
            shared.as_str()
        );
        assert!(lease(&f, n).await.is_none(), "no Lease of its own: {n}");
    }
    until("the shared Lease renewed", || async {
        lease(&f, &shared)
            .await
            .is_some_and(|l| renew_time(&l) > renew_time(&first))
    })
    .await;
    // A failed node gets a Lease of its own, renewed this once, and stops naming the shared one.
    assert!(agent.fail_node("pool-1").await.expect("fail"));
    assert!(!agent.fail_node("elsewhere-0").await.expect("not ours"));
    let own = lease(&f, "pool-1")
        .await
        .expect("the failed node's own Lease");
    assert_eq!(own["spec"]["holderIdentity"], "pool-1");
    assert!(node(&f, "pool-1").await["metadata"]["annotations"][NODE_LEASE_ANNOTATION].is_null());
    let before = lease(&f, &shared).await.expect("shared");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        renew_time(&lease(&f, "pool-1").await.expect("own")),
        renew_time(&own),
        "a failed node's Lease is not renewed"
    );
    assert!(renew_time(&lease(&f, &shared).await.expect("shared")) > renew_time(&before));
    assert_eq!(
        node(&f, "pool-0").await["metadata"]["annotations"][NODE_LEASE_ANNOTATION],
        shared.as_str()
    );
    task.abort();
}
