//! Coscheduling against scheduler-plugins' documented behaviour, on a real cache: the quorum
//! at Permit, one binding for the batch, the shared timeout, release when a member cannot be
//! placed.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::client::Client;
use tessera_client::request::ApiRequest;
use tessera_client::response::ApiResponse;
use tessera_client::status::ApiError;

use super::*;
use crate::cache::Cache;
use crate::framework::{Handle, WaitingPods};

/// Records every request; answers with `fail` if set.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<ApiRequest>>,
    fail: Option<ApiError>,
}

#[async_trait]
impl Client for Recorder {
    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        self.calls.lock().push(req);
        // Let concurrent binders meet at the batch.
        tokio::time::sleep(Duration::from_millis(20)).await;
        match &self.fail {
            Some(e) => Err(e.clone()),
            None => Ok(ApiResponse::Object {
                code: 201,
                body: json!({"kind": "Status", "status": "Success"}),
                warnings: Vec::new(),
            }),
        }
    }
}

struct World {
    cache: Cache,
    plugin: Arc<Coscheduling>,
    waiting: Arc<WaitingPods>,
    gangs: Arc<Gangs>,
    client: Arc<Recorder>,
    metrics: SchedulerMetrics,
}

fn world(fail: Option<ApiError>) -> World {
    let cache = Cache::with_topology(Default::default());
    let waiting = Arc::new(WaitingPods::default());
    let gangs = Arc::new(Gangs::default());
    let client = Arc::new(Recorder {
        calls: Mutex::new(Vec::new()),
        fail,
    });
    let metrics = SchedulerMetrics::unregistered().expect("metrics");
    let handle = Handle {
        waiting: waiting.clone(),
        client: client.clone(),
        topology: cache.topology().clone(),
        gangs: gangs.clone(),
        budgets: Default::default(),
        metrics: Some(metrics.clone()),
    };
    World {
        plugin: Arc::new(Coscheduling::new(&handle)),
        cache,
        waiting,
        gangs,
        client,
        metrics,
    }
}

fn member(name: &str, gang: Option<&str>) -> Arc<PodInfo> {
    let mut labels = json!({"app": "x"});
    if let Some(g) = gang {
        labels[POD_GROUP_LABEL] = json!(g);
    }
    Arc::new(PodInfo::new(Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns",
            "uid": format!("uid-{name}"), "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]}}))
        .expect("pod"),
    )))
}

/// What PostFilter is given (Coscheduling reads none of it).
fn no_input() -> PostFilterInput<'static> {
    PostFilterInput {
        nodes: &[],
        codes: &[],
        filter: &|_| Status::success(),
    }
}

fn spec(min_member: u32, timeout: Duration) -> Option<GangSpec> {
    Some(GangSpec {
        min_member,
        timeout,
        hold: None,
    })
}

/// The `status` bodies written to PodGroups so far.
fn reservations(w: &World) -> Vec<Value> {
    w.client
        .calls
        .lock()
        .iter()
        .filter(|r| r.subresource.as_deref() == Some("status"))
        .map(|r| serde_json::from_slice::<Value>(&r.body).expect("json")["status"].clone())
        .collect()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(60)).await;
}

#[tokio::test]
async fn a_held_gang_reserves_its_quorum_and_binds_only_when_committed() {
    let mut w = world(None);
    let pods = w.gang(2, 2, Duration::from_secs(30));
    let held = Some(GangSpec {
        min_member: 2,
        timeout: Duration::from_secs(30),
        hold: Some(7),
    });
    w.gangs.set_spec("ns/g", held);
    let (s0, _, rx0) = w.place(&pods[0], "n0");
    assert_eq!(s0.code, Code::Wait);
    let (s1, d1, rx1) = w.place(&pods[1], "n1");
    assert_eq!(s1.code, Code::Wait, "a held quorum does not bind");
    assert_eq!(
        s1.message(),
        "gang ns/g is reserved; waiting for the federation to commit it"
    );
    assert!(
        d1 <= Duration::from_secs(30),
        "held until the reservation's TTL"
    );
    settle().await;
    assert_eq!(
        reservations(&w),
        vec![json!({"reserved": 2, "reservedFor": 7})],
        "the reservation is reported once, with its attempt"
    );
    assert!(w.bindings().iter().all(|b| b.get("members").is_none()));
    // The same spec seen again changes nothing; the commit lets both go as one batch.
    w.gangs.set_spec("ns/g", held);
    w.gangs.set_spec("ns/g", spec(2, Duration::from_secs(30)));
    for rx in [rx0, rx1] {
        let verdict = rx.expect("waiting").await.expect("verdict");
        assert!(verdict.is_success(), "committed members are let go");
    }
    let state = CycleState::new();
    let (a, b) = tokio::join!(
        BindPlugin::bind(&*w.plugin, &state, &pods[0], "n0"),
        BindPlugin::bind(&*w.plugin, &state, &pods[1], "n1"),
    );
    assert!(a.is_success() && b.is_success());
    let batches: Vec<Value> = w
        .bindings()
        .into_iter()
        .filter(|b| b.get("members").is_some())
        .collect();
    assert_eq!(batches.len(), 1, "one binding for the committed gang");
    assert_eq!(batches[0]["members"].as_array().map(Vec::len), Some(2));
    assert_eq!(w.metrics.gang_outcomes("reserved"), 1);
}

#[tokio::test]
async fn a_held_gang_not_committed_by_its_ttl_is_let_go_and_says_so() {
    let mut w = world(None);
    let pods = w.gang(2, 2, Duration::from_millis(50));
    w.gangs.set_spec(
        "ns/g",
        Some(GangSpec {
            min_member: 2,
            timeout: Duration::from_millis(50),
            hold: Some(1),
        }),
    );
    let (_, d0, rx0) = w.place(&pods[0], "n0");
    let (_, _, rx1) = w.place(&pods[1], "n1");
    tokio::time::sleep(d0).await;
    w.waiting.remove(pods[0].uid());
    drop(rx0);
    w.plugin.unreserve(&CycleState::new(), &pods[0], "n0");
    let verdict = rx1.expect("waiting").await.expect("verdict");
    assert_eq!(verdict.code, Code::Unschedulable);
    settle().await;
    assert_eq!(
        reservations(&w),
        vec![
            json!({"reserved": 2, "reservedFor": 1}),
            json!({"reserved": 0, "reservedFor": null})
        ],
        "the lapsed reservation is withdrawn"
    );
    assert!(
        w.bindings().iter().all(|b| b.get("members").is_none()),
        "nothing bound"
    );
}

impl World {
    /// Adds the gang `ns/g` with `members` pods of which the names are returned.
    fn gang(&self, min: u32, members: usize, timeout: Duration) -> Vec<Arc<PodInfo>> {
        self.gangs.set_spec("ns/g", spec(min, timeout));
        (0..members)
            .map(|i| {
                let p = member(&format!("p{i}"), Some("g"));
                self.gangs.set_member(&p.key, Some("ns/g"), false);
                p
            })
            .collect()
    }

    /// What the scheduling cycle does from Reserve on: assume, then Permit. A waiting pod is
    /// registered with the framework as the cycle does.
    fn place(
        &mut self,
        pod: &Arc<PodInfo>,
        node: &str,
    ) -> (
        Status,
        Duration,
        Option<tokio::sync::oneshot::Receiver<Status>>,
    ) {
        self.cache.assume(pod.clone(), node);
        let mut state = CycleState::new();
        assert!(ReservePlugin::reserve(&*self.plugin, &mut state, pod, node).is_success());
        let (s, d) = PermitPlugin::permit(&*self.plugin, &state, pod, node);
        let rx = (s.code == Code::Wait).then(|| self.waiting.add(pod.uid()));
        (s, d, rx)
    }

    fn bindings(&self) -> Vec<Value> {
        self.client
            .calls
            .lock()
            .iter()
            .map(|r| serde_json::from_slice(&r.body).expect("json"))
            .collect()
    }
}

#[test]
fn pre_filter_needs_the_group_and_min_member_pods() {
    let w = world(None);
    let pre = |p: &Arc<PodInfo>| PreFilterPlugin::pre_filter(&*w.plugin, &mut CycleState::new(), p);
    let loner = member("solo", None);
    assert_eq!(
        pre(&loner).code,
        Code::Skip,
        "a pod of no gang is not the plugin's"
    );
    let orphan = member("o", Some("missing"));
    let s = pre(&orphan);
    assert_eq!(s.code, Code::Unschedulable);
    assert_eq!(s.message(), "PodGroup ns/missing not found");
    let cases = [
        (
            3u32,
            2usize,
            Some("PodGroup ns/g has 2 of its minMember 3 pods"),
        ),
        (3, 3, None),
        (1, 1, None),
        (0, 1, None),
    ];
    for (min, members, want) in cases {
        let w = world(None);
        let pods = w.gang(min, members, DEFAULT_TIMEOUT);
        let s = PreFilterPlugin::pre_filter(&*w.plugin, &mut CycleState::new(), &pods[0]);
        match want {
            Some(msg) => {
                assert_eq!(s.code, Code::Unschedulable, "min {min} members {members}");
                assert_eq!(s.message(), msg);
            }
            None => assert_eq!(s.code, Code::Success, "min {min} members {members}"),
        }
    }
    assert!(
        PreFilterPlugin::pre_filter_events(&*w.plugin).contains(&ClusterEvent::PodGroupChange),
        "a member kept back waits for its gang to change"
    );
}

fn asking(name: &str, cpu: &str) -> Arc<PodInfo> {
    Arc::new(PodInfo::new(Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns",
            "uid": format!("uid-{name}"), "labels": {POD_GROUP_LABEL: "g"}},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": cpu}}}]}}))
        .expect("pod"),
    )))
}

#[test]
fn a_gang_larger_than_the_free_shard_is_kept_back_before_it_reserves() {
    let free = |cpu: i64| Usage {
        milli_cpu: cpu,
        memory: 1 << 40,
        pods: 1000,
    };
    // (free cpu, members already placed, verdict)
    let cases = [
        (
            2_000,
            0,
            Some(
                "PodGroup ns/g needs 3 more member(s) placed (cpu 3000m); the shard has cpu 2000m free",
            ),
        ),
        (3_000, 0, None),
        (2_000, 1, None),
        (0, 3, None),
        (
            -500,
            1,
            Some(
                "PodGroup ns/g needs 2 more member(s) placed (cpu 2000m); the shard has cpu 0m free",
            ),
        ),
    ];
    for (cpu, placed, want) in cases {
        let w = world(None);
        w.gangs.set_spec("ns/g", spec(3, DEFAULT_TIMEOUT));
        let pods: Vec<_> = (0..4).map(|i| asking(&format!("p{i}"), "1")).collect();
        for (i, p) in pods.iter().enumerate() {
            w.gangs.set_member(&p.key, Some("ns/g"), i < placed);
        }
        w.gangs.set_free(free(cpu));
        let s = PreFilterPlugin::pre_filter(&*w.plugin, &mut CycleState::new(), &pods[3]);
        match want {
            Some(msg) => {
                assert_eq!(s.code, Code::Unschedulable, "free {cpu} placed {placed}");
                assert_eq!(s.message(), msg);
            }
            None => assert_eq!(
                s.code,
                Code::Success,
                "free {cpu} placed {placed}: {}",
                s.message()
            ),
        }
    }
}

#[test]
fn members_leaving_or_finishing_do_not_count() {
    let w = world(None);
    let pods = w.gang(3, 3, DEFAULT_TIMEOUT);
    assert_eq!(w.gangs.members("ns/g"), 3);
    assert!(
        !w.gangs.set_member(&pods[0].key, Some("ns/g"), true),
        "already counted"
    );
    assert_eq!(w.gangs.placed("ns/g"), 1, "seen bound");
    w.gangs.set_standing(&pods[0].key, MemberState::Pending);
    assert_eq!(w.gangs.committed("ns/g"), 1, "a bound member stays bound");
    w.gangs.set_standing(&pods[1].key, MemberState::Reserved);
    assert_eq!((w.gangs.placed("ns/g"), w.gangs.committed("ns/g")), (2, 1));
    w.gangs.set_standing(&pods[1].key, MemberState::Pending);
    w.gangs.set_member(&pods[2].key, None, false);
    assert_eq!(w.gangs.members("ns/g"), 2);
    let s = PreFilterPlugin::pre_filter(&*w.plugin, &mut CycleState::new(), &pods[0]);
    assert_eq!(s.code, Code::Unschedulable);
    // A relabelled pod moves to its new gang.
    assert!(w.gangs.set_member(&pods[1].key, Some("ns/h"), true));
    assert_eq!((w.gangs.members("ns/g"), w.gangs.members("ns/h")), (1, 1));
    assert_eq!((w.gangs.placed("ns/g"), w.gangs.placed("ns/h")), (1, 1));
    w.gangs.set_member(&pods[1].key, None, false);
    assert_eq!((w.gangs.members("ns/h"), w.gangs.placed("ns/h")), (0, 0));
}

#[tokio::test]
async fn the_member_completing_the_quorum_binds_the_gang_in_one_request() {
    let mut w = world(None);
    let pods = w.gang(3, 4, Duration::from_secs(30));
    let (s0, d0, rx0) = w.place(&pods[0], "n0");
    assert_eq!(s0.code, Code::Wait, "{}", s0.message());
    assert_eq!(s0.message(), "waiting for 2 more member(s) of gang ns/g");
    assert!(d0 <= Duration::from_secs(30) && d0 > Duration::from_secs(29));
    let (s1, d1, rx1) = w.place(&pods[1], "n1");
    assert_eq!(s1.code, Code::Wait);
    assert!(d1 <= d0, "members share one deadline");
    let (s2, _, rx2) = w.place(&pods[2], "n2");
    assert_eq!(
        s2.code,
        Code::Success,
        "the third member completes the quorum"
    );
    assert!(rx2.is_none());
    for rx in [rx0, rx1] {
        let verdict = rx.expect("waiting").await.expect("verdict");
        assert!(verdict.is_success(), "the waiting members are let go");
    }
    // The three bind at once: one request between them.
    let state = CycleState::new();
    let (a, b, c) = tokio::join!(
        BindPlugin::bind(&*w.plugin, &state, &pods[0], "n0"),
        BindPlugin::bind(&*w.plugin, &state, &pods[1], "n1"),
        BindPlugin::bind(&*w.plugin, &state, &pods[2], "n2"),
    );
    let results = [a, b, c];
    assert!(results.iter().all(Status::is_success), "{results:?}");
    let calls = w.bindings();
    assert_eq!(calls.len(), 1, "{calls:?}");
    {
        let calls = w.client.calls.lock();
        let req = &calls[0];
        assert_eq!(
            (
                req.resource.plural,
                req.subresource.as_deref(),
                req.name.as_deref()
            ),
            ("podgroups", Some("binding"), Some("g"))
        );
    }
    let mut members: Vec<(String, String)> = calls[0]["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            assert!(m["uid"].as_str().is_some_and(|u| u.starts_with("uid-p")));
            (
                m["pod"].as_str().unwrap_or_default().to_owned(),
                m["node"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    members.sort();
    assert_eq!(
        members,
        [("p0", "n0"), ("p1", "n1"), ("p2", "n2")]
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .to_vec()
    );
    assert_eq!(w.metrics.gang_outcomes("bound"), 1);
    // A member placed after the quorum binds alone, through the next binder.
    let (s3, _, _) = w.place(&pods[3], "n3");
    assert_eq!(s3.code, Code::Success);
    assert_eq!(
        BindPlugin::bind(&*w.plugin, &state, &pods[3], "n3")
            .await
            .code,
        Code::Skip
    );
    assert_eq!(w.bindings().len(), 1);
}

#[tokio::test]
async fn a_refused_gang_binding_fails_every_member() {
    let conflict = ApiError::conflict_because("", "pods", "p1", "already assigned");
    let mut w = world(Some(conflict));
    let pods = w.gang(2, 2, DEFAULT_TIMEOUT);
    let (_, _, rx) = w.place(&pods[0], "n0");
    let (s, _, _) = w.place(&pods[1], "n1");
    assert!(s.is_success());
    assert!(rx.expect("waiting").await.expect("verdict").is_success());
    let state = CycleState::new();
    let (a, b) = tokio::join!(
        BindPlugin::bind(&*w.plugin, &state, &pods[0], "n0"),
        BindPlugin::bind(&*w.plugin, &state, &pods[1], "n1")
    );
    for s in [&a, &b] {
        assert_eq!(s.code, Code::Error);
        assert!(
            s.message()
                .contains("the binding of gang ns/g (2 members) was rejected")
        );
    }
    assert_eq!(w.bindings().len(), 1, "one request, refused for all");
    assert_eq!(w.metrics.gang_outcomes("failed"), 1);
}

#[tokio::test]
async fn a_gang_short_of_its_quorum_is_let_go_at_its_deadline() {
    let mut w = world(None);
    let pods = w.gang(3, 3, Duration::from_millis(50));
    let (_, d0, rx0) = w.place(&pods[0], "n0");
    let (_, d1, rx1) = w.place(&pods[1], "n1");
    assert!(d0 <= Duration::from_millis(50) && d1 <= d0);
    // The binding cycle's timer: the first to expire is unreserved by the framework.
    tokio::time::sleep(d0).await;
    w.waiting.remove(pods[0].uid());
    drop(rx0);
    w.plugin.unreserve(&CycleState::new(), &pods[0], "n0");
    w.cache.forget(&pods[0].key);
    let verdict = rx1.expect("waiting").await.expect("verdict");
    assert_eq!(verdict.code, Code::Unschedulable);
    assert_eq!(
        verdict.message(),
        "gang ns/g did not reach its minMember before its timeout"
    );
    assert_eq!(w.metrics.gang_outcomes("timeout"), 1);
    // The next attempt gathers anew, with a fresh deadline.
    w.plugin.unreserve(&CycleState::new(), &pods[1], "n1");
    w.cache.forget(&pods[1].key);
    let (s, d, _) = w.place(&pods[0], "n0");
    assert_eq!(s.code, Code::Wait);
    assert!(d > Duration::from_millis(10), "{d:?}");
    assert_eq!(w.metrics.gang_outcomes("timeout"), 1, "counted once");
}

#[tokio::test]
async fn a_member_that_cannot_be_placed_releases_the_waiting_ones() {
    let mut w = world(None);
    let pods = w.gang(3, 3, DEFAULT_TIMEOUT);
    let (_, _, rx0) = w.place(&pods[0], "n0");
    let (_, _, rx1) = w.place(&pods[1], "n1");
    let (nominated, s) =
        PostFilterPlugin::post_filter(&*w.plugin, &CycleState::new(), &pods[2], &no_input());
    assert!(nominated.is_none());
    assert_eq!(s.code, Code::Unschedulable);
    for rx in [rx0, rx1] {
        let v = rx.expect("waiting").await.expect("verdict");
        assert_eq!(v.code, Code::Unschedulable);
        assert_eq!(
            v.message(),
            "member p2 of gang ns/g cannot be placed; the gang's reservations are released"
        );
    }
    assert_eq!(w.metrics.gang_outcomes("released"), 1);
    // A pod of no gang: PostFilter has nothing to say.
    let (_, s) = PostFilterPlugin::post_filter(
        &*w.plugin,
        &CycleState::new(),
        &member("x", None),
        &no_input(),
    );
    assert_eq!(s.code, Code::Skip);
}

#[tokio::test]
async fn a_deleted_waiting_member_releases_the_gang() {
    let mut w = world(None);
    let pods = w.gang(3, 3, DEFAULT_TIMEOUT);
    let (_, _, _rx0) = w.place(&pods[0], "n0");
    let (_, _, rx1) = w.place(&pods[1], "n1");
    // p0 deleted while it waits: the framework rejects it, then unreserves it.
    w.waiting.reject(pods[0].uid(), "", "the pod was deleted");
    w.plugin.unreserve(&CycleState::new(), &pods[0], "n0");
    let v = rx1.expect("waiting").await.expect("verdict");
    assert_eq!(
        v.message(),
        "member p0 of gang ns/g left; the gang's reservations are released"
    );
}

/// A race the registry's standings close: members let go (PostFilter released them) are
/// still reserved until the framework unreserves them; a member placed in between must not
/// count them towards a quorum — it would be bound alone, a partial gang.
#[tokio::test]
async fn members_being_let_go_never_count_towards_a_quorum() {
    let mut w = world(None);
    let pods = w.gang(3, 3, DEFAULT_TIMEOUT);
    let (_, _, rx0) = w.place(&pods[0], "n0");
    let (_, _, rx1) = w.place(&pods[1], "n1");
    let _ = PostFilterPlugin::post_filter(&*w.plugin, &CycleState::new(), &pods[2], &no_input());
    for rx in [rx0, rx1] {
        assert!(rx.expect("waiting").await.expect("verdict").is_rejection());
    }
    // p0 and p1 are still reserved (their unreserve has not run): p2 now fits.
    assert_eq!(w.gangs.placed("ns/g"), 2);
    let (s, _, _) = w.place(&pods[2], "n2");
    assert_eq!(s.code, Code::Wait, "p2 must wait: {}", s.message());
    assert_eq!(s.message(), "waiting for 2 more member(s) of gang ns/g");
    let state = CycleState::new();
    assert_eq!(
        BindPlugin::bind(&*w.plugin, &state, &pods[2], "n2")
            .await
            .code,
        Code::Skip,
        "nothing to bind for p2"
    );
    assert!(w.bindings().is_empty());
}

/// A member placed while its gang's batch is on its way waits for it: bound alone only once
/// the batch is bound — if the batch failed, it would otherwise be a gang of one.
#[tokio::test]
async fn a_member_placed_during_the_gang_binding_waits_for_it() {
    for fails in [false, true] {
        let refusal = ApiError::conflict_because("", "pods", "p0", "already assigned");
        let mut w = world(fails.then_some(refusal));
        let pods = w.gang(2, 3, DEFAULT_TIMEOUT);
        let (_, _, rx0) = w.place(&pods[0], "n0");
        let (s1, _, _) = w.place(&pods[1], "n1");
        assert!(s1.is_success(), "p1 completes the quorum");
        assert!(rx0.expect("waiting").await.expect("verdict").is_success());
        let (s2, _, rx2) = w.place(&pods[2], "n2");
        assert_eq!(s2.code, Code::Wait, "{}", s2.message());
        assert_eq!(s2.message(), "waiting for the binding of gang ns/g");
        let state = CycleState::new();
        let (a, b) = tokio::join!(
            BindPlugin::bind(&*w.plugin, &state, &pods[0], "n0"),
            BindPlugin::bind(&*w.plugin, &state, &pods[1], "n1")
        );
        let mut rx2 = rx2.expect("waiting");
        if fails {
            assert!(!a.is_success() && !b.is_success());
            assert!(
                rx2.try_recv().is_err(),
                "p2 is not let go by a failed batch"
            );
        } else {
            assert!(a.is_success() && b.is_success());
            assert_eq!(w.gangs.bound("ns/g"), 2);
            assert!(rx2.await.expect("verdict").is_success(), "p2 is let go");
            assert_eq!(
                BindPlugin::bind(&*w.plugin, &state, &pods[2], "n2")
                    .await
                    .code,
                Code::Skip,
                "p2 binds alone, through the next binder"
            );
        }
        assert_eq!(w.bindings().len(), 1);
    }
}
