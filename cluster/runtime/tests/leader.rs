//! Leader election with tokio's paused clock: leases of a second run in microseconds of real
//! time, and the hand-over happens at exactly the instant the rules say. The API is a fake
//! that keeps Leases in memory with Kubernetes' optimistic concurrency (resourceVersion
//! preconditions, 404, 409): the embedded store commits on a thread of its own, which paused
//! time cannot wait for, so the real one would let timeouts fire early.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_apiserver::api::ApiResponse;
use tessera_apiserver::client::Client;
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_apiserver::status::ApiError;
use tessera_runtime::leader::{LeaderConfig, LeaderElector};
use tokio::time::Instant;

/// Leases by namespace/name, with a revision counter.
#[derive(Default)]
struct FakeLeases {
    objects: Mutex<(i64, HashMap<String, Value>)>,
    writes: AtomicUsize,
}

#[async_trait]
impl Client for FakeLeases {
    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        assert_eq!(req.resource.kind, "Lease", "only Leases are faked");
        let body: Value = if req.body.is_empty() && req.object.is_none() {
            Value::Null
        } else {
            req.body_value().expect("JSON body")
        };
        let name = req
            .name
            .clone()
            .or_else(|| body["metadata"]["name"].as_str().map(str::to_owned))
            .expect("a name");
        let key = format!("{}/{name}", req.namespace.clone().unwrap_or_default());
        let mut guard = self.objects.lock();
        let (rev, objects) = &mut *guard;
        let not_found = || ApiError::not_found("coordination.k8s.io", "leases", &name);
        let answer = |code, body| ApiResponse::Object {
            code,
            body,
            warnings: vec![],
        };
        match req.verb {
            Verb::Get => objects
                .get(&key)
                .cloned()
                .map(|o| answer(200, o))
                .ok_or_else(not_found),
            Verb::Create | Verb::Update => {
                let current = objects.get(&key);
                match (req.verb, current) {
                    (Verb::Create, Some(_)) => {
                        return Err(ApiError::already_exists(
                            "coordination.k8s.io",
                            "leases",
                            &name,
                        ));
                    }
                    (Verb::Update, None) => return Err(not_found()),
                    (Verb::Update, Some(c))
                        if c["metadata"]["resourceVersion"]
                            != body["metadata"]["resourceVersion"] =>
                    {
                        return Err(ApiError::conflict("coordination.k8s.io", "leases", &name));
                    }
                    _ => {}
                }
                *rev += 1;
                let mut stored = body;
                stored["metadata"]["resourceVersion"] = json!(rev.to_string());
                objects.insert(key, stored.clone());
                self.writes.fetch_add(1, Ordering::SeqCst);
                Ok(answer(200, stored))
            }
            other => panic!("{other:?} is not faked"),
        }
    }
}

fn config(name: &str, id: &str) -> LeaderConfig {
    LeaderConfig {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(100),
        ..LeaderConfig::new(name, id.into())
    }
}

fn lease_res() -> &'static tessera_apiserver::catalog::Resource {
    find_resource("coordination.k8s.io", "v1", "leases").expect("served")
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_exactly_when_the_lease_has_lapsed_on_its_clock() {
    let api = Arc::new(FakeLeases::default());
    let client: Arc<dyn Client> = api.clone();
    let mut a = LeaderElector::new(client.clone(), config("l", "a"), None);
    let mut b = LeaderElector::new(client.clone(), config("l", "b"), None);
    assert!(a.try_acquire_or_renew().await.expect("a"));
    assert!(!b.try_acquire_or_renew().await.expect("b"), "held by a");
    // a renews a few times, each within the lease: b may never take it.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(a.try_acquire_or_renew().await.expect("a renews"));
        assert!(!b.try_acquire_or_renew().await.expect("b"));
    }
    // a dies (stops renewing) now; b saw its last renewal just above.
    let last_renewal = Instant::now();
    let b = tokio::spawn(async move {
        b.acquire().await;
        (b, Instant::now())
    });
    let (_b, took_over) = b.await.expect("b took over");
    let waited = took_over - last_renewal;
    // Not before a whole lease duration on b's clock, and within one retry (with jitter).
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert!(waited <= Duration::from_millis(1_120), "{waited:?}");
    let lease = client
        .get(lease_res(), Some("kube-system"), "l")
        .await
        .expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    // a comes back: it is deposed and must not think it leads.
    assert!(!a.try_acquire_or_renew().await.expect("a"));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_is_deposed_stops_its_work_at_once() {
    let api = Arc::new(FakeLeases::default());
    let client: Arc<dyn Client> = api.clone();
    let a = LeaderElector::new(client.clone(), config("w", "a"), None);
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = ticks.clone();
    let work = async move {
        loop {
            t.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let lead = tokio::spawn(a.lead(work));
    while ticks.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Someone else takes the lease over (as an operator would by editing it).
    let mut lease = client
        .get(lease_res(), Some("kube-system"), "w")
        .await
        .expect("lease");
    lease["spec"]["holderIdentity"] = json!("intruder");
    client
        .update(lease_res(), Some("kube-system"), &lease)
        .await
        .expect("take over");
    let taken = Instant::now();
    let out = lead.await.expect("task");
    assert!(out.is_err(), "deposed: the work was stopped");
    // It noticed at its next renewal, one retry period later.
    assert!(
        taken.elapsed() <= Duration::from_millis(100),
        "{:?}",
        taken.elapsed()
    );
    let after = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        after,
        "no work after losing the lease"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_reach_the_api_stops_after_its_renew_deadline() {
    /// Answers Gets and writes while `up`, then fails every call as an unreachable server.
    struct Flaky {
        inner: FakeLeases,
        up: std::sync::atomic::AtomicBool,
    }
    #[async_trait]
    impl Client for Flaky {
        async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
            if self.up.load(Ordering::SeqCst) {
                self.inner.call(req).await
            } else {
                Err(ApiError::new(503, "ServiceUnavailable", "unreachable"))
            }
        }
    }
    let api = Arc::new(Flaky {
        inner: FakeLeases::default(),
        up: true.into(),
    });
    let a = LeaderElector::new(api.clone(), config("n", "a"), None);
    let lead = tokio::spawn(a.lead(std::future::pending::<()>()));
    while api.inner.writes.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last_ok = Instant::now();
    api.up.store(false, Ordering::SeqCst);
    let out = lead.await.expect("task");
    assert!(out.is_err(), "stopped without its lease");
    let stopped = last_ok.elapsed();
    // Between the renew deadline and the deadline plus one retry period: never later than
    // the lease a standby waits for (1 s), so the two never both work.
    assert!(stopped >= Duration::from_millis(500), "{stopped:?}");
    assert!(stopped < Duration::from_secs(1), "{stopped:?}");
}
