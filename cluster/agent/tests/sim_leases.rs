//! Simulated nodes' Leases, through a real API on an embedded store: each node's Lease is
//! created, renewed (its renewTime and resourceVersion move, the holder stays), taken over
//! when one is already in place from an earlier agent, and left to lapse for a failed node.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Fixture, until};
use tessera_agent::sim::{LEASE_NAMESPACE, SimAgent, SimConfig};

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
    assert!(agent.fail_node("sim-1"));
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
