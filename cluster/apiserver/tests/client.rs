//! The client trait both ways — in process and over HTTPS — against one API on a real
//! embedded store: the semantics controllers, the scheduler and agents will rely on
//! (binding once, status vs. main resource, paging, resourceVersion, watch resume and 410,
//! bookmarks, finalizers, quota charging under concurrency).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::{Tokens, User};
use tessera_apiserver::client::{Client, HttpClient, InProcess};
use tessera_apiserver::pki::Credentials;
use tessera_apiserver::request::{ApiRequest, PatchType, Verb, find_resource};
use tessera_apiserver::{http, serve};
use tessera_store::{EmbeddedOptions, EmbeddedStore, Revision, Store, StoreMetrics};

struct Setup {
    store: Arc<dyn Store>,
    clients: Vec<(&'static str, Arc<dyn Client>)>,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let api = Api::new(store.clone(), None);
    let creds = Credentials::generate().expect("credentials");
    let router = http::router(api.clone(), Tokens::new(&creds.admin_token));
    let addr = serve::serve_tls("127.0.0.1:0".parse().expect("addr"), &creds, router)
        .await
        .expect("serve");
    let remote = HttpClient::new(
        &format!("https://{addr}"),
        &creds.ca_pem,
        &creds.admin_token,
    )
    .expect("client");
    Setup {
        store,
        clients: vec![
            ("in-process", Arc::new(InProcess::new(api, User::Admin))),
            ("https", Arc::new(remote)),
        ],
        _dir: dir,
    }
}

fn res(group: &str, plural: &str) -> &'static tessera_apiserver::catalog::Resource {
    let version = if group == "tessera.io" {
        "v1alpha1"
    } else {
        "v1"
    };
    find_resource(group, version, plural).expect("served")
}

fn pod(name: &str, cpu: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}})
}

/// A pod of PodGroup `g` asking 100m.
fn member(name: &str) -> Value {
    let mut body = pod(name, "100m");
    body["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("g");
    body
}

/// Namespace `ns` with PodGroup `g` of `min_member`.
/// Namespace `ns`.
async fn namespace(c: &Arc<dyn Client>, ns: &str) {
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": ns}}),
    )
    .await
    .expect("namespace");
}

async fn gang_namespace(c: &Arc<dyn Client>, ns: &str, min_member: i32) {
    namespace(c, ns).await;
    c.create(
        res("tessera.io", "podgroups"),
        Some(ns),
        &json!({"metadata": {"name": "g"}, "spec": {"minMember": min_member}}),
    )
    .await
    .expect("podgroup");
}

/// `pods/binding` of `ns/pod` to `node`.
fn pod_binding(ns: &str, pod: &str, node: &str) -> ApiRequest {
    let mut r = ApiRequest::new(Verb::Create, res("", "pods"));
    r.namespace = Some(ns.to_owned());
    r.name = Some(pod.to_owned());
    r.subresource = Some("binding".into());
    r.body = Bytes::from(
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"kind": "Node", "name": node}})
        .to_string(),
    );
    r
}

/// `podgroups/binding` of PodGroup `ns/g` with `members`.
fn gang_binding(ns: &str, members: Value) -> ApiRequest {
    let mut r = ApiRequest::new(Verb::Create, res("tessera.io", "podgroups"));
    r.namespace = Some(ns.to_owned());
    r.name = Some("g".into());
    r.subresource = Some("binding".into());
    r.body = Bytes::from(
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "PodGroupBinding",
            "metadata": {"name": "g"}, "members": members})
        .to_string(),
    );
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_see_the_same_api() {
    let s = setup().await;
    let (pods, nss) = (res("", "pods"), res("", "namespaces"));
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns_name = format!("ns{i}");
        c.create(nss, None, &json!({"metadata": {"name": ns_name}}))
            .await
            .expect("namespace");
        let ns = Some(ns_name.as_str());

        // Binding: once; the second is a Conflict naming the node.
        c.create(pods, ns, &pod("p", "100m")).await.expect(how);
        let bind = pod_binding(&ns_name, "p", "n1");
        c.call(bind.clone()).await.expect("first binding");
        let err = c.call(bind).await.expect_err("second binding");
        assert_eq!((err.code, err.reason), (409, "Conflict"), "{how}");
        assert!(
            err.message.contains("already assigned to node \"n1\""),
            "{how}: {}",
            err.message
        );
        let p = c.get(pods, ns, "p").await.expect("get");
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled");

        // The status subresource changes only status; the main resource never changes it.
        let st = c
            .patch(
                pods,
                ns,
                "p",
                Some("status"),
                PatchType::Merge,
                &json!({"status": {"phase": "Running"}, "spec": {"nodeName": "elsewhere"}}),
            )
            .await
            .expect("status patch");
        assert_eq!(st["status"]["phase"], "Running");
        assert_eq!(st["spec"]["nodeName"], "n1");
        let mut upd = c.get(pods, ns, "p").await.expect("get");
        upd["status"]["phase"] = json!("Failed");
        upd["metadata"]["labels"]["extra"] = json!("y");
        let after = c.update(pods, ns, &upd).await.expect("update");
        assert_eq!(after["status"]["phase"], "Running", "{how}");
        assert_eq!(after["metadata"]["labels"]["extra"], "y");
        // A stale resourceVersion is a Conflict.
        let err = c.update(pods, ns, &upd).await.expect_err("stale");
        assert_eq!(err.reason, "Conflict");

        // Paging: limit + continue, all at one revision, every object once.
        for k in 0..7 {
            c.create(pods, ns, &pod(&format!("q{k}"), "10m"))
                .await
                .expect("create");
        }
        let mut seen = Vec::new();
        let mut req = ApiRequest::new(Verb::List, pods);
        req.namespace = ns.map(str::to_owned);
        req.params.limit = 3;
        req.params.label_selector = Some("app=x".parse().expect("selector"));
        let mut revisions = Vec::new();
        loop {
            let page = c.list(req.clone()).await.expect("page");
            revisions.push(page["metadata"]["resourceVersion"].clone());
            for item in page["items"].as_array().expect("items") {
                seen.push(item["metadata"]["name"].as_str().expect("name").to_owned());
            }
            match page["metadata"]["continue"].as_str() {
                Some(t) => req.params.continue_token = Some(t.to_owned()),
                None => break,
            }
        }
        assert_eq!(seen.len(), 8, "{how}: {seen:?}");
        assert_eq!(revisions.len(), 3);
        assert!(
            revisions.windows(2).all(|w| w[0] == w[1]),
            "one revision: {revisions:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_bookmark_and_expire() {
    let s = setup().await;
    let cms = res("", "configmaps");
    let (_, c) = &s.clients[1];
    let ns_obj = c
        .create(
            res("", "namespaces"),
            None,
            &json!({"metadata": {"name": "w"}}),
        )
        .await
        .expect("ns");
    // Older than anything the watch cache holds (it starts with the first watch).
    let rv_before_cache = ns_obj["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    let ns = Some("w");
    let first = c
        .create(
            cms,
            ns,
            &json!({"metadata": {"name": "a"}, "data": {"v": "1"}}),
        )
        .await
        .expect("create");
    let rv_a = first["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();

    // No resourceVersion: the existing objects come first as ADDED.
    let mut req = ApiRequest::new(Verb::Watch, cms);
    req.namespace = ns.map(str::to_owned);
    let mut from_now = c.watch(req.clone()).await.expect("watch");
    let ev = from_now.next().await.expect("event").into_value();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("a"))
    );

    // From a resourceVersion: only what came after, in order.
    c.create(cms, ns, &json!({"metadata": {"name": "b"}}))
        .await
        .expect("b");
    c.patch(
        cms,
        ns,
        "a",
        None,
        PatchType::Merge,
        &json!({"data": {"v": "2"}}),
    )
    .await
    .expect("patch");
    c.delete(cms, ns, "b", None).await.expect("delete");
    let mut resumed_req = req.clone();
    resumed_req.params.resource_version = Some(rv_a.clone());
    let mut resumed = c.watch(resumed_req).await.expect("resume");
    let mut got = Vec::new();
    for _ in 0..3 {
        let ev = tokio::time::timeout(Duration::from_secs(10), resumed.next())
            .await
            .expect("in time")
            .expect("event")
            .into_value();
        got.push(format!(
            "{} {}",
            ev["type"].as_str().unwrap_or(""),
            ev["object"]["metadata"]["name"].as_str().unwrap_or("")
        ));
    }
    assert_eq!(got, ["ADDED b", "MODIFIED a", "DELETED b"]);
    // The first watch saw the same, after its initial event.
    for want in ["ADDED b", "MODIFIED a", "DELETED b"] {
        let ev = from_now.next().await.expect("event").into_value();
        assert_eq!(
            format!(
                "{} {}",
                ev["type"].as_str().unwrap_or(""),
                ev["object"]["metadata"]["name"].as_str().unwrap_or("")
            ),
            want
        );
    }

    // A label selector: an object that starts matching joins as ADDED, one that stops leaves
    // as DELETED.
    let mut sel = req.clone();
    sel.params.resource_version = Some(rv_a.clone());
    sel.params.label_selector = Some("team=blue".parse().expect("selector"));
    c.patch(
        cms,
        ns,
        "a",
        None,
        PatchType::Merge,
        &json!({"metadata": {"labels": {"team": "blue"}}}),
    )
    .await
    .expect("label");
    c.patch(
        cms,
        ns,
        "a",
        None,
        PatchType::Merge,
        &json!({"metadata": {"labels": {"team": "red"}}}),
    )
    .await
    .expect("relabel");
    let mut selected = c.watch(sel).await.expect("selected watch");
    let types: Vec<String> = (0..2).map(|_| String::new()).collect::<Vec<_>>();
    let mut types = types;
    for t in types.iter_mut() {
        let ev = tokio::time::timeout(Duration::from_secs(10), selected.next())
            .await
            .expect("in time")
            .expect("event")
            .into_value();
        *t = ev["type"].as_str().unwrap_or("").to_owned();
    }
    assert_eq!(types, ["ADDED", "DELETED"]);

    // Bookmarks on an idle watch, carrying a resourceVersion to resume from.
    let mut bm = req.clone();
    bm.params.allow_bookmarks = true;
    bm.params.resource_version = Some(rv_a.clone());
    let mut bookmarked = c.watch(bm).await.expect("bookmarks");
    let bookmark = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let ev = bookmarked.next().await.expect("event").into_value();
            if ev["type"] == "BOOKMARK" {
                return ev;
            }
        }
    })
    .await
    .expect("a bookmark within 20 s");
    assert!(bookmark["object"]["metadata"]["resourceVersion"].is_string());

    // After compaction, an old resourceVersion is gone: 410 for a list at it, an ERROR
    // event with a 410 Status for a watch from before the watch cache's window. (Within the
    // window a watch is still served from memory, as Kubernetes' watch cache does.)
    let now = s.store.current_revision().await.expect("revision");
    s.store.compact(&now).await.expect("compact");
    let mut old_list = ApiRequest::new(Verb::List, cms);
    old_list.namespace = ns.map(str::to_owned);
    old_list.params.resource_version = Some(rv_a.clone());
    old_list.params.resource_version_match = Some("Exact".into());
    let err = c.list(old_list).await.expect_err("compacted");
    assert_eq!(err.code, 410, "{}", err.message);
    let mut old_watch = req.clone();
    old_watch.params.resource_version = Some(rv_before_cache);
    let mut expired = c
        .watch(old_watch)
        .await
        .expect("watch answers with an event");
    let ev = expired.next().await.expect("event").into_value();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    let _: Revision = now;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_overshoot_a_quota() {
    let s = setup().await;
    let (_, c) = &s.clients[0];
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": "q"}}),
    )
    .await
    .expect("ns");
    c.create(
        res("", "resourcequotas"),
        Some("q"),
        &json!({"metadata": {"name": "rq"}, "spec": {"hard": {"pods": "10", "requests.cpu": "2"}}}),
    )
    .await
    .expect("quota");
    // 40 pods of 100m at once: exactly 10 fit the pod count (1 CPU of 2).
    let mut tasks = Vec::new();
    for i in 0..40 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.create(res("", "pods"), Some("q"), &pod(&format!("p{i}"), "100m"))
                .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!((e.code, e.reason), (403, "Forbidden"), "{}", e.message),
        }
    }
    assert_eq!(ok, 10);
    let q = c
        .get(res("", "resourcequotas"), Some("q"), "rq")
        .await
        .expect("quota");
    assert_eq!(q["status"]["used"]["pods"], "10");
    assert_eq!(q["status"]["used"]["requests.cpu"], "1");

    // Finished pods use nothing: the status write that says so gives their charge back.
    let used = |q: &Value, k: &str| q["status"]["used"][k].as_str().unwrap_or("").to_owned();
    let quota = || async {
        c.get(res("", "resourcequotas"), Some("q"), "rq")
            .await
            .expect("quota")
    };
    let done: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    let mut finished = Vec::new();
    for name in &done {
        if finished.len() == 3 {
            break;
        }
        if c.get(res("", "pods"), Some("q"), name).await.is_ok() {
            c.patch(
                res("", "pods"),
                Some("q"),
                name,
                Some("status"),
                PatchType::Merge,
                &json!({"status": {"phase": "Succeeded"}}),
            )
            .await
            .expect("finish");
            finished.push(name.clone());
        }
    }
    let q = quota().await;
    assert_eq!(
        (used(&q, "pods"), used(&q, "requests.cpu")),
        ("7".into(), "700m".into())
    );
    // Writing the finished phase again gives back nothing more.
    c.patch(
        res("", "pods"),
        Some("q"),
        &finished[0],
        Some("status"),
        PatchType::Merge,
        &json!({"status": {"phase": "Succeeded", "message": "again"}}),
    )
    .await
    .expect("rewrite");
    assert_eq!(used(&quota().await, "pods"), "7");
    // The room is usable again; deleting a finished pod refunds nothing twice.
    for i in 0..3 {
        c.create(res("", "pods"), Some("q"), &pod(&format!("n{i}"), "100m"))
            .await
            .expect("fits again");
    }
    c.delete(res("", "pods"), Some("q"), &finished[0], None)
        .await
        .expect("delete finished");
    let q = quota().await;
    assert_eq!(
        (used(&q, "pods"), used(&q, "requests.cpu")),
        ("10".into(), "1".into())
    );
    // A pod held by a finalizer is refunded when the last finalizer goes and it with it.
    c.patch(
        res("", "pods"),
        Some("q"),
        "n0",
        None,
        PatchType::Merge,
        &json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    )
    .await
    .expect("hold");
    let mut del = ApiRequest::new(Verb::Delete, res("", "pods"));
    del.namespace = Some("q".into());
    del.name = Some("n0".into());
    del.params.grace_period_seconds = Some(0);
    c.call(del).await.expect("delete held");
    assert_eq!(
        used(&quota().await, "pods"),
        "10",
        "still there, still counted"
    );
    c.patch(
        res("", "pods"),
        Some("q"),
        "n0",
        None,
        PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
    )
    .await
    .expect("release");
    assert!(
        c.get(res("", "pods"), Some("q"), "n0").await.is_err(),
        "gone"
    );
    let q = quota().await;
    assert_eq!(
        (used(&q, "pods"), used(&q, "requests.cpu")),
        ("9".into(), "900m".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_quotas_count_only_their_pods() {
    let s = setup().await;
    let (_, c) = &s.clients[0];
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": "sq"}}),
    )
    .await
    .expect("ns");
    c.create(
        res("", "resourcequotas"),
        Some("sq"),
        &json!({"metadata": {"name": "best-effort"},
            "spec": {"hard": {"pods": "1"}, "scopes": ["BestEffort"]}}),
    )
    .await
    .expect("quota");
    let best_effort = |name: &str| {
        json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    };
    c.create(res("", "pods"), Some("sq"), &best_effort("be-1"))
        .await
        .expect("the first best-effort pod fits");
    let err = c
        .create(res("", "pods"), Some("sq"), &best_effort("be-2"))
        .await
        .expect_err("the second does not");
    assert_eq!(err.code, 403, "{}", err.message);
    assert!(
        err.message.contains("exceeded quota: best-effort"),
        "{}",
        err.message
    );
    // Pods with requests are outside the scope: not counted, not refused.
    for i in 0..3 {
        c.create(
            res("", "pods"),
            Some("sq"),
            &pod(&format!("burst-{i}"), "100m"),
        )
        .await
        .expect("burstable pods are not in the BestEffort scope");
    }
    let q = c
        .get(res("", "resourcequotas"), Some("sq"), "best-effort")
        .await
        .expect("quota");
    assert_eq!(q["status"]["used"]["pods"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_quota_holds_across_its_namespaces() {
    let s = setup().await;
    let (_, c) = &s.clients[0];
    for ns in ["t1", "t2"] {
        c.create(
            res("", "namespaces"),
            None,
            &json!({"metadata": {"name": ns}}),
        )
        .await
        .expect("ns");
    }
    // One pod exists before the quota: the tenant's usage starts from it.
    c.create(res("", "pods"), Some("t1"), &pod("before", "100m"))
        .await
        .expect("pod");
    c.create(
        res("tessera.io", "tenants"),
        None,
        &json!({"metadata": {"name": "team"}, "spec": {"namespaces": ["t1", "t2"],
            "quota": {"pods": "4", "requests.cpu": "1"}}}),
    )
    .await
    .expect("tenant");
    // 20 creates at once over both namespaces: exactly 3 more fit.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let c = c.clone();
        let ns = if i % 2 == 0 { "t1" } else { "t2" };
        tasks.push(tokio::spawn(async move {
            c.create(res("", "pods"), Some(ns), &pod(&format!("p{i}"), "100m"))
                .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.code, 403, "{}", e.message);
                assert!(
                    e.message.contains("exceeded tenant quota: team"),
                    "{}",
                    e.message
                );
            }
        }
    }
    assert_eq!(ok, 3);
    let t = c
        .get(res("tessera.io", "tenants"), None, "team")
        .await
        .expect("tenant");
    assert_eq!(t["status"]["used"]["pods"], "4");
    assert_eq!(t["status"]["used"]["requests.cpu"], "400m");
    // A delete gives back its share; the next create fits again.
    c.delete(res("", "pods"), Some("t1"), "before", None)
        .await
        .expect("delete");
    c.create(res("", "pods"), Some("t2"), &pod("after", "100m"))
        .await
        .expect("fits again");
}

/// A store whose lists under one prefix wait until released: a request that holds its seat
/// for as long as the test wants (the fake sits at the `Store` seam; everything above it is
/// the real API and HTTP server).
struct GatedStore {
    inner: Arc<dyn Store>,
    prefix: Vec<u8>,
    gate: Arc<tokio::sync::Semaphore>,
    waiting: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl Store for GatedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn txn_group(&self, key: &[u8]) -> usize {
        self.inner.txn_group(key)
    }
    async fn get(&self, key: &[u8]) -> tessera_store::Result<Option<tessera_store::KeyValue>> {
        self.inner.get(key).await
    }
    async fn list(
        &self,
        req: tessera_store::ListRequest,
    ) -> tessera_store::Result<tessera_store::ListResponse> {
        if req.prefix.starts_with(&self.prefix) {
            self.waiting.notify_one();
            let _permit = self.gate.acquire().await.expect("gate");
        }
        self.inner.list(req).await
    }
    async fn txn(
        &self,
        ops: Vec<tessera_store::Op>,
    ) -> tessera_store::Result<tessera_store::TxnResponse> {
        self.inner.txn(ops).await
    }
    async fn watch(
        &self,
        prefix: &[u8],
        after: Option<Revision>,
    ) -> tessera_store::Result<tessera_store::WatchStream> {
        self.inner.watch(prefix, after).await
    }
    async fn lease_grant(&self, ttl: i64) -> tessera_store::Result<i64> {
        self.inner.lease_grant(ttl).await
    }
    async fn lease_keep_alive(&self, id: i64) -> tessera_store::Result<i64> {
        self.inner.lease_keep_alive(id).await
    }
    async fn lease_revoke(&self, id: i64) -> tessera_store::Result<()> {
        self.inner.lease_revoke(id).await
    }
    async fn compact(&self, revision: &Revision) -> tessera_store::Result<()> {
        self.inner.compact(revision).await
    }
    async fn current_revision(&self) -> tessera_store::Result<Revision> {
        self.inner.current_revision().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_flood_gets_429_while_another_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let inner: Arc<dyn Store> = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let waiting = Arc::new(tokio::sync::Notify::new());
    let store: Arc<dyn Store> = Arc::new(GatedStore {
        inner,
        prefix: b"/registry/configmaps/f/".to_vec(),
        gate: gate.clone(),
        waiting: waiting.clone(),
    });
    let api = Api::new(store, None);
    let creds = Credentials::generate().expect("credentials");
    let tokens = Tokens::new(&creds.admin_token);
    let router = http::router(api.clone(), Tokens::new(&creds.admin_token));
    let addr = serve::serve_tls("127.0.0.1:0".parse().expect("addr"), &creds, router)
        .await
        .expect("serve");
    let server = format!("https://{addr}");
    let admin = InProcess::new(api, User::Admin);
    for (tenant, ns, seats) in [("flood", "f", 2), ("calm", "c", 2)] {
        admin
            .create(
                res("", "namespaces"),
                None,
                &json!({"metadata": {"name": ns}}),
            )
            .await
            .expect("ns");
        admin
            .create(
                res("tessera.io", "tenants"),
                None,
                &json!({"metadata": {"name": tenant}, "spec": {"namespaces": [ns], "maxInflightRequests": seats}}),
            )
            .await
            .expect("tenant");
    }
    let mut minted = std::collections::BTreeMap::new();
    for t in ["flood", "calm"] {
        let obj = admin
            .get(res("tessera.io", "tenants"), None, t)
            .await
            .expect("tenant");
        let claims = tessera_apiserver::auth::TenantClaims::of(
            &obj,
            tessera_apiserver::api::now_secs() + 3600,
        );
        minted.insert(t, tokens.mint(&claims));
    }
    let as_tenant =
        |t: &str| Arc::new(HttpClient::new(&server, &creds.ca_pem, &minted[t]).expect("client"));
    let (flood, calm) = (as_tenant("flood"), as_tenant("calm"));
    let list_in = |ns: &str| {
        let mut req = ApiRequest::new(Verb::List, res("", "configmaps"));
        req.namespace = Some(ns.into());
        req
    };
    // The flooding tenant's two seats are taken by lists held at the store.
    let mut held = Vec::new();
    for _ in 0..2 {
        let notified = waiting.notified();
        let (f, req) = (flood.clone(), list_in("f"));
        held.push(tokio::spawn(async move { f.call(req).await }));
        notified.await;
    }
    // Its next requests are refused at once, with Retry-After; nothing waits behind them.
    for _ in 0..5 {
        let err = flood.call(list_in("f")).await.expect_err("no seat");
        assert_eq!(
            (err.code, err.reason),
            (429, "TooManyRequests"),
            "{}",
            err.message
        );
        assert_eq!(
            err.details
                .as_ref()
                .and_then(|d| d["retryAfterSeconds"].as_u64()),
            Some(1)
        );
        assert!(err.message.contains("tenant:flood"), "{}", err.message);
    }
    // Another tenant is served meanwhile.
    for _ in 0..5 {
        calm.call(list_in("c"))
            .await
            .expect("the calm tenant is served");
    }
    // Released, the held requests finish and the flooding tenant has its seats again.
    gate.add_permits(1000);
    for h in held {
        h.await.expect("task").expect("held request finishes");
    }
    flood.call(list_in("f")).await.expect("seats are back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_addresses_once() {
    let s = setup().await;
    let (_, c) = &s.clients[0];
    let svcs = res("", "services");
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": "net"}}),
    )
    .await
    .expect("ns");
    let svc = |name: &str, extra: Value| {
        let mut v = json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}});
        if let (Some(spec), Some(more)) = (v["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(more.clone());
        }
        v
    };
    let a = c
        .create(svcs, Some("net"), &svc("a", json!({})))
        .await
        .expect("a");
    let b = c
        .create(svcs, Some("net"), &svc("b", json!({"type": "NodePort"})))
        .await
        .expect("b");
    let ip_a = a["spec"]["clusterIP"]
        .as_str()
        .expect("an address")
        .to_owned();
    let ip_b = b["spec"]["clusterIP"]
        .as_str()
        .expect("an address")
        .to_owned();
    assert_ne!(ip_a, ip_b);
    for ip in [&ip_a, &ip_b] {
        let o: Vec<u8> = ip.split('.').map(|p| p.parse().expect("octet")).collect();
        assert!(
            o[0] == 10 && (96..112).contains(&o[1]),
            "{ip} in 10.96.0.0/12"
        );
    }
    assert_eq!(a["spec"]["clusterIPs"], json!([ip_a]));
    let np = b["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .expect("a node port");
    assert!((30000..=32767).contains(&np));
    let headless = c
        .create(svcs, Some("net"), &svc("h", json!({"clusterIP": "None"})))
        .await
        .expect("headless");
    assert_eq!(headless["spec"]["clusterIP"], "None");

    // Asking for a held address or port is Invalid; nothing is created.
    let err = c
        .create(svcs, Some("net"), &svc("dup", json!({"clusterIP": ip_a})))
        .await
        .expect_err("held");
    assert_eq!(err.code, 422);
    assert!(err.message.contains("already allocated"), "{}", err.message);
    let err = c
        .create(
            svcs,
            Some("net"),
            &svc("dup", json!({"clusterIP": "192.168.1.1"})),
        )
        .await
        .expect_err("out of range");
    assert!(err.message.contains("10.96.0.0/12"), "{}", err.message);
    assert!(c.get(svcs, Some("net"), "dup").await.is_err());

    // An update that leaves the address out keeps it; one that changes it is refused.
    let mut upd = c.get(svcs, Some("net"), "a").await.expect("get");
    upd["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("clusterIP");
    upd["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("clusterIPs");
    let kept = c.update(svcs, Some("net"), &upd).await.expect("update");
    assert_eq!(kept["spec"]["clusterIP"], ip_a.as_str());
    let mut moved = kept.clone();
    moved["spec"]["clusterIP"] = json!("10.96.0.9");
    let err = c
        .update(svcs, Some("net"), &moved)
        .await
        .expect_err("immutable");
    assert!(
        err.message.contains("field is immutable"),
        "{}",
        err.message
    );

    // Deleted, its address is free again.
    c.delete(svcs, Some("net"), "a", None)
        .await
        .expect("delete");
    let again = c
        .create(svcs, Some("net"), &svc("a2", json!({"clusterIP": ip_a})))
        .await
        .expect("the address is free again");
    assert_eq!(again["spec"]["clusterIP"], ip_a.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_respect_disruption_budgets() {
    let s = setup().await;
    let (_, c) = &s.clients[1];
    let (pods, pdbs) = (res("", "pods"), res("policy", "poddisruptionbudgets"));
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": "ev"}}),
    )
    .await
    .expect("ns");
    for name in ["free", "w1", "w2"] {
        let mut p = pod(name, "10m");
        p["metadata"]["labels"] = json!({"app": if name == "free" { "other" } else { "web" }});
        c.create(pods, Some("ev"), &p).await.expect("pod");
    }
    c.create(
        pdbs,
        Some("ev"),
        &json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}}),
    )
    .await
    .expect("pdb");
    let evict = |name: &str| {
        let mut req = ApiRequest::new(Verb::Create, pods);
        req.namespace = Some("ev".into());
        req.name = Some(name.into());
        req.subresource = Some("eviction".into());
        req.body = Bytes::from(
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "ev"}})
                .to_string(),
        );
        req
    };
    // No budget covers it: evicted.
    c.call(evict("free")).await.expect("evicted");
    assert_eq!(
        c.get(pods, Some("ev"), "free")
            .await
            .expect_err("gone")
            .code,
        404
    );
    // A budget with no disruptions allowed (its controller has not counted yet): 429.
    let err = c.call(evict("w1")).await.expect_err("budget");
    assert_eq!(
        (err.code, err.reason),
        (429, "TooManyRequests"),
        "{}",
        err.message
    );
    assert!(err.message.contains("disruption budget"), "{}", err.message);
    // One disruption allowed: one eviction spends it, the next is refused.
    c.patch(pdbs, Some("ev"), "web", Some("status"), PatchType::Merge,
        &json!({"status": {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}}))
        .await
        .expect("status");
    c.call(evict("w1")).await.expect("evicted within budget");
    let pdb = c.get(pdbs, Some("ev"), "web").await.expect("pdb");
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    assert!(pdb["status"]["disruptedPods"]["w1"].is_string());
    assert_eq!(c.call(evict("w2")).await.expect_err("spent").code, 429);
    assert!(
        c.get(pods, Some("ev"), "w2").await.is_ok(),
        "refused evictions delete nothing"
    );
}

/// Server-side applies of one new object racing each other all succeed (the ones that lose
/// the create apply to what the winner made), as Kubernetes' apply does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_applies_of_a_new_object_all_succeed() {
    let s = setup().await;
    let cms = res("", "configmaps");
    s.clients[0]
        .1
        .create(
            res("", "namespaces"),
            None,
            &json!({"metadata": {"name": "default"}}),
        )
        .await
        .expect("namespace");
    for (label, client) in &s.clients {
        for round in 0..5 {
            let name = format!("raced-{label}-{round}");
            let applies = (0..8).map(|i| {
                let client = client.clone();
                let name = name.clone();
                async move {
                    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "default"},
                        "data": {format!("k{i}"): "v"}});
                    client
                        .apply(cms, Some("default"), &name, &format!("m{i}"), &obj)
                        .await
                }
            });
            for r in futures::future::join_all(applies).await {
                let v = r.unwrap_or_else(|e| {
                    panic!("{label}: an apply failed: {} {}", e.code, e.message)
                });
                assert_eq!(v["metadata"]["name"], json!(name));
            }
            let got = client
                .get(cms, Some("default"), &name)
                .await
                .expect("created");
            let keys = got["data"].as_object().map_or(0, |d| d.len());
            assert_eq!(keys, 8, "{label}: every manager's field is there: {got}");
        }
    }
}

/// `podgroups/binding`: a gang's members are bound in one transaction — all or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_is_bound_all_or_none() {
    let s = setup().await;
    let (pods, nss, groups) = (
        res("", "pods"),
        res("", "namespaces"),
        res("tessera.io", "podgroups"),
    );
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns_name = format!("gang{i}");
        c.create(nss, None, &json!({"metadata": {"name": ns_name}}))
            .await
            .expect("namespace");
        let ns = Some(ns_name.as_str());
        c.create(
            groups,
            ns,
            &json!({"metadata": {"name": "g"}, "spec": {"minMember": 3}}),
        )
        .await
        .expect(how);
        for p in ["a", "b", "c", "d"] {
            let mut body = pod(p, "100m");
            body["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("g");
            c.create(pods, ns, &body).await.expect(how);
        }
        let mut outsider = pod("x", "100m");
        outsider["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("other");
        c.create(pods, ns, &outsider).await.expect(how);
        let bind = |members: Value| gang_binding(&ns_name, members);
        let node_of = |name: &'static str| {
            let c = c.clone();
            let ns = ns_name.clone();
            async move {
                let p = c.get(pods, Some(&ns), name).await.expect("pod");
                p["spec"]["nodeName"].as_str().map(str::to_owned)
            }
        };
        // Pin b to a node first: a gang binding that includes it fails whole.
        c.call(pod_binding(&ns_name, "b", "n9"))
            .await
            .expect("b bound alone");
        let err = c
            .call(bind(json!([
                {"pod": "a", "node": "n1"}, {"pod": "b", "node": "n2"}, {"pod": "c", "node": "n3"}
            ])))
            .await
            .expect_err("b is already assigned");
        assert_eq!(err.code, 409, "{how}: {err:?}");
        assert!(
            err.message.contains("already assigned"),
            "{how}: {}",
            err.message
        );
        assert_eq!(
            node_of("a").await,
            None,
            "{how}: nothing of a failed gang binds"
        );
        assert_eq!(node_of("c").await, None, "{how}");

        // A pod of another group, a missing pod, a stale UID, bad shapes: refused, nothing bound.
        let err = c
            .call(bind(
                json!([{"pod": "a", "node": "n1"}, {"pod": "x", "node": "n2"}]),
            ))
            .await
            .expect_err("x is not a member");
        assert_eq!((err.code, err.reason), (422, "Invalid"), "{how}");
        assert!(
            err.message.contains("not a member of PodGroup g"),
            "{how}: {}",
            err.message
        );
        let err = c
            .call(bind(
                json!([{"pod": "a", "node": "n1"}, {"pod": "zz", "node": "n2"}]),
            ))
            .await
            .expect_err("zz does not exist");
        assert_eq!(err.code, 404, "{how}");
        let err = c
            .call(bind(
                json!([{"pod": "a", "uid": "not-its-uid", "node": "n1"}]),
            ))
            .await
            .expect_err("stale uid");
        assert_eq!(err.code, 409, "{how}");
        let err = c
            .call(bind(
                json!([{"pod": "a", "node": ""}, {"pod": "a", "node": "n2"}]),
            ))
            .await
            .expect_err("bad shape");
        assert_eq!(err.code, 422, "{how}");
        assert!(
            err.message.contains("members[0].node"),
            "{how}: {}",
            err.message
        );
        assert!(
            err.message.contains("members[1].pod"),
            "{how}: {}",
            err.message
        );
        let err = c.call(bind(json!([]))).await.expect_err("empty");
        assert_eq!(err.code, 422, "{how}");
        assert_eq!(node_of("a").await, None, "{how}");

        // The good one: all three bound, each with PodScheduled=True.
        let ok = c
            .call(bind(json!([
                {"pod": "a", "node": "n1"}, {"pod": "c", "node": "n3"}, {"pod": "d", "node": "n4"}
            ])))
            .await
            .expect(how);
        let _ = ok;
        for (p, n) in [("a", "n1"), ("c", "n3"), ("d", "n4"), ("b", "n9")] {
            assert_eq!(node_of(p).await.as_deref(), Some(n), "{how}: {p}");
        }
        let a = c.get(pods, ns, "a").await.expect("a");
        let scheduled = a["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "True");
        assert!(scheduled, "{how}: {a}");
        // A missing PodGroup is a 404.
        let mut r = bind(json!([{"pod": "a", "node": "n1"}]));
        r.name = Some("nope".into());
        assert_eq!(c.call(r).await.expect_err("no group").code, 404, "{how}");
    }
}

/// Priority admission: a pod's PriorityClass becomes its `spec.priority` and
/// `preemptionPolicy`; the global default applies when none is named; a missing class or a
/// contradicting priority is refused, nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_classes_set_a_pods_priority() {
    let s = setup().await;
    let (pods, nss) = (res("", "pods"), res("", "namespaces"));
    let classes = find_resource("scheduling.k8s.io", "v1", "priorityclasses").expect("served");
    let (_, c) = &s.clients[1];
    c.create(nss, None, &json!({"metadata": {"name": "prio"}}))
        .await
        .expect("namespace");
    let ns = Some("prio");
    let mut plain = pod("before-default", "100m");
    let created = c.create(pods, ns, &plain).await.expect("pod");
    assert_eq!(created["spec"]["priority"], 0, "no class, no default: 0");
    assert_eq!(created["spec"]["preemptionPolicy"], "PreemptLowerPriority");
    for (name, value, default, policy) in [
        ("high", 1000, false, None),
        ("batch", 10, true, None),
        ("polite", 500, false, Some("Never")),
    ] {
        let mut pc = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "globalDefault": default});
        if let Some(p) = policy {
            pc["preemptionPolicy"] = json!(p);
        }
        c.create(classes, None, &pc).await.expect("class");
    }
    let with_class = |name: &str, class: &str| {
        let mut p = pod(name, "100m");
        p["spec"]["priorityClassName"] = json!(class);
        p
    };
    let got = c
        .create(pods, ns, &with_class("hi", "high"))
        .await
        .expect("hi");
    assert_eq!(got["spec"]["priority"], 1000);
    let got = c
        .create(pods, ns, &with_class("po", "polite"))
        .await
        .expect("po");
    assert_eq!(
        (
            got["spec"]["priority"].clone(),
            got["spec"]["preemptionPolicy"].clone()
        ),
        (json!(500), json!("Never"))
    );
    let got = c
        .create(pods, ns, &with_class("crit", "system-node-critical"))
        .await
        .expect("crit");
    assert_eq!(got["spec"]["priority"], 2_000_001_000);
    plain["metadata"]["name"] = json!("after-default");
    let got = c.create(pods, ns, &plain).await.expect("default");
    assert_eq!(got["spec"]["priority"], 10, "the global default's value");
    assert_eq!(got["spec"]["priorityClassName"], "batch");

    let err = c
        .create(pods, ns, &with_class("nope", "missing"))
        .await
        .expect_err("no such class");
    assert_eq!(err.code, 403);
    assert_eq!(
        err.message,
        "pods \"nope\" is forbidden: no PriorityClass with name missing was found"
    );
    let mut forged = with_class("forged", "high");
    forged["spec"]["priority"] = json!(5);
    let err = c.create(pods, ns, &forged).await.expect_err("forged");
    assert_eq!(err.code, 403);
    assert!(err.message.contains("the integer value of priority (5) must not be provided in pod spec; priority admission controller computed 1000"), "{}", err.message);
    for name in ["nope", "forged"] {
        assert!(
            c.get(pods, ns, name).await.is_err(),
            "{name} was not created"
        );
    }
}

/// `pods/binding` requests that arrive together are written together: each gets its own
/// answer (a missing pod fails alone), many share one store transaction (one revision), and
/// a pod bound by many requests at once is bound exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_bindings_share_transactions_and_bind_each_pod_once() {
    let s = setup().await;
    let (pods, nss) = (res("", "pods"), res("", "namespaces"));
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns_name = format!("batch{i}");
        c.create(nss, None, &json!({"metadata": {"name": ns_name}}))
            .await
            .expect("namespace");
        let ns = Some(ns_name.as_str());
        const N: usize = 200;
        for p in 0..N {
            c.create(pods, ns, &pod(&format!("p{p}"), "100m"))
                .await
                .expect(how);
        }
        let binding = |pod: String, node: String| pod_binding(&ns_name, &pod, &node);
        // All at once, with one pod that does not exist among them.
        let mut calls: Vec<_> = (0..N)
            .map(|p| {
                let c = c.clone();
                let r = binding(format!("p{p}"), format!("n{}", p % 7));
                tokio::spawn(async move { c.call(r).await })
            })
            .collect();
        let missing = {
            let c = c.clone();
            let r = binding("ghost".into(), "n1".into());
            tokio::spawn(async move { c.call(r).await })
        };
        for call in calls.drain(..) {
            call.await.expect("task").expect(how);
        }
        let err = missing.await.expect("task").expect_err("no such pod");
        assert_eq!(err.code, 404, "{how}: {err:?}");
        let mut all = ApiRequest::new(Verb::List, pods);
        all.namespace = Some(ns_name.clone());
        let list = c.list(all).await.expect(how);
        let items = list["items"].as_array().expect("items");
        let mut revisions = std::collections::HashSet::new();
        for item in items {
            let name = item["metadata"]["name"].as_str().expect("name");
            let p: usize = name[1..].parse().expect("p<N>");
            assert_eq!(
                item["spec"]["nodeName"],
                json!(format!("n{}", p % 7)),
                "{how}: {name}"
            );
            revisions.insert(item["metadata"]["resourceVersion"].clone());
        }
        assert_eq!(items.len(), N);
        assert!(
            revisions.len() < N,
            "{how}: {N} bindings were written in {} transactions: none shared one",
            revisions.len()
        );
        // One pod, twenty bindings to different nodes at once: one wins, the rest conflict.
        c.create(pods, ns, &pod("contested", "100m"))
            .await
            .expect(how);
        let racers: Vec<_> = (0..20)
            .map(|i| {
                let c = c.clone();
                let r = binding("contested".into(), format!("n{i}"));
                tokio::spawn(async move { c.call(r).await })
            })
            .collect();
        let mut won = Vec::new();
        for (i, r) in racers.into_iter().enumerate() {
            match r.await.expect("task") {
                Ok(_) => won.push(format!("n{i}")),
                Err(e) => assert_eq!(e.code, 409, "{how}: {e:?}"),
            }
        }
        assert_eq!(won.len(), 1, "{how}: bound by {won:?}");
        let p = c.get(pods, ns, "contested").await.expect(how);
        assert_eq!(p["spec"]["nodeName"], json!(won[0]), "{how}");
    }
}

/// Creates that arrive together are written together: many share one store transaction
/// (one revision), each gets its own answer — a name already taken, a name created twice at
/// once and an invalid object each fail alone, and never fail the others — and creates a
/// ResourceQuota counts still go one by one, so concurrent ones never overshoot it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_share_transactions_and_each_gets_its_own_answer() {
    let s = setup().await;
    let (pods, nss, quotas) = (
        res("", "pods"),
        res("", "namespaces"),
        res("", "resourcequotas"),
    );
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns_name = format!("creates{i}");
        c.create(nss, None, &json!({"metadata": {"name": ns_name}}))
            .await
            .expect("namespace");
        let ns = Some(ns_name.as_str());
        for t in 0..5 {
            c.create(pods, ns, &pod(&format!("taken-{t}"), "100m"))
                .await
                .expect(how);
        }
        const N: usize = 200;
        let spawn = |body: Value| {
            let c = c.clone();
            let ns = ns_name.clone();
            tokio::spawn(async move { c.create(pods, Some(&ns), &body).await })
        };
        let fresh: Vec<_> = (0..N)
            .map(|p| spawn(pod(&format!("p{p}"), "100m")))
            .collect();
        let taken: Vec<_> = (0..5)
            .map(|t| spawn(pod(&format!("taken-{t}"), "1")))
            .collect();
        let twins: Vec<_> = (0..10).map(|_| spawn(pod("twin", "100m"))).collect();
        let invalid: Vec<_> = (0..3)
            .map(|k| {
                spawn(json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("bad-{k}")}, "spec": {"containers": []}}))
            })
            .collect();
        let mut answered = std::collections::HashMap::new();
        for (p, call) in fresh.into_iter().enumerate() {
            let created = call.await.expect("task").expect(how);
            answered.insert(
                format!("p{p}"),
                created["metadata"]["resourceVersion"].clone(),
            );
        }
        for call in taken {
            let err = call.await.expect("task").expect_err("the name is taken");
            assert_eq!((err.code, err.reason), (409, "AlreadyExists"), "{how}");
        }
        let mut won = 0;
        for call in twins {
            match call.await.expect("task") {
                Ok(_) => won += 1,
                Err(e) => assert_eq!((e.code, e.reason), (409, "AlreadyExists"), "{how}"),
            }
        }
        assert_eq!(won, 1, "{how}: one of ten creates of one name wins");
        for call in invalid {
            let err = call.await.expect("task").expect_err("no containers");
            assert_eq!(err.code, 422, "{how}: {err:?}");
        }
        let mut all = ApiRequest::new(Verb::List, pods);
        all.namespace = Some(ns_name.clone());
        let list = c.list(all).await.expect(how);
        let items = list["items"].as_array().expect("items");
        assert_eq!(items.len(), N + 5 + 1, "{how}: every create written once");
        let mut revisions = std::collections::HashSet::new();
        for item in items {
            let name = item["metadata"]["name"].as_str().expect("name");
            if let Some(rv) = answered.get(name) {
                assert_eq!(
                    &item["metadata"]["resourceVersion"], rv,
                    "{how}: {name}'s answer carries its write's revision"
                );
                revisions.insert(rv.clone());
            }
            if name.starts_with("taken-") {
                assert_eq!(
                    item["spec"]["containers"][0]["resources"]["requests"]["cpu"],
                    json!("100m"),
                    "{how}: the first {name} is kept"
                );
            }
        }
        assert!(
            revisions.len() < N,
            "{how}: {N} creates were written in {} transactions: none shared one",
            revisions.len()
        );

        // Under a quota of 5 pods, 20 creates at once: 5 are written, 15 refused.
        let quota_ns = format!("quota{i}");
        c.create(nss, None, &json!({"metadata": {"name": quota_ns}}))
            .await
            .expect("namespace");
        c.create(
            quotas,
            Some(&quota_ns),
            &json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "5"}}}),
        )
        .await
        .expect(how);
        let calls: Vec<_> = (0..20)
            .map(|p| {
                let c = c.clone();
                let ns = quota_ns.clone();
                tokio::spawn(async move {
                    c.create(pods, Some(&ns), &pod(&format!("q{p}"), "100m"))
                        .await
                })
            })
            .collect();
        let mut written = 0;
        for call in calls {
            match call.await.expect("task") {
                Ok(_) => written += 1,
                Err(e) => assert_eq!(e.code, 403, "{how}: {e:?}"),
            }
        }
        assert_eq!(
            written, 5,
            "{how}: the quota holds under concurrent creates"
        );
    }
}

/// On a store sharded by tenant, writes batched together are split per backend (a
/// transaction may not span two): creates in twenty namespaces at once, over two tenant
/// backends, are all written in batches, none refused for crossing backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_writes_are_split_per_store_backend() {
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let registry = prometheus::Registry::new();
    let mut parts: Vec<Arc<dyn Store>> = Vec::new();
    for d in &dirs {
        let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
        parts.push(Arc::new(
            EmbeddedStore::open(d.path(), EmbeddedOptions::small(), metrics)
                .await
                .expect("store"),
        ));
    }
    let default = parts.remove(0);
    let store: Arc<dyn Store> = Arc::new(tessera_store::ShardedStore::new(
        "/registry/",
        default,
        Vec::new(),
        parts,
    ));
    let metrics = tessera_apiserver::metrics::ApiMetrics::register(&registry).expect("metrics");
    let c: Arc<dyn Client> = Arc::new(InProcess::new(Api::new(store, Some(metrics)), User::Admin));
    let (pods, nss) = (res("", "pods"), res("", "namespaces"));
    for n in 0..20 {
        c.create(nss, None, &json!({"metadata": {"name": format!("t{n}")}}))
            .await
            .expect("namespace");
    }
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                c.create(
                    pods,
                    Some(&format!("t{}", i % 20)),
                    &pod(&format!("p{i}"), "100m"),
                )
                .await
            })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("created");
    }
    let count = |result: &str| -> f64 {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "tessera_apiserver_write_batches_total")
            .flat_map(|f| f.get_metric())
            .filter(|m| m.get_label().iter().any(|l| l.value() == result))
            .map(|m| m.get_counter().get_value())
            .sum()
    };
    let mut one = ApiRequest::new(Verb::List, pods);
    one.namespace = Some("t3".into());
    let list = c.list(one).await.expect("list");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(10), "{list}");
    let list = c
        .list(ApiRequest::new(Verb::List, pods))
        .await
        .expect("list");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(200), "{list}");
    assert!(count("written") > 0.0, "creates were batched");
    assert_eq!(
        count("alone"),
        0.0,
        "no batch was refused for spanning backends"
    );
}

/// Objects written in one transaction share a resourceVersion, and a client resumes a cut
/// watch from the last resourceVersion it saw: so a watch must never end between two events
/// of one revision. A watch whose `timeoutSeconds` passes while its reader is inside a
/// revision (here three gang members bound at once, read slowly) ends only after the rest of
/// that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_times_out_never_ends_inside_a_revision() {
    let s = setup().await;
    let pods = res("", "pods");
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("cut{i}");
        gang_namespace(c, &ns, 3).await;
        let mut rv = String::new();
        for p in ["a", "b", "c"] {
            let made = c.create(pods, Some(&ns), &member(p)).await.expect(how);
            rv = made["metadata"]["resourceVersion"]
                .as_str()
                .expect("rv")
                .to_owned();
        }
        let mut watch = ApiRequest::new(Verb::Watch, pods);
        watch.namespace = Some(ns.clone());
        watch.params.resource_version = Some(rv);
        watch.params.timeout_seconds = Some(1);
        let mut events = c.watch(watch).await.expect(how);
        let members = json!([
            {"pod": "a", "node": "n1"}, {"pod": "b", "node": "n2"}, {"pod": "c", "node": "n3"}]);
        c.call(gang_binding(&ns, members)).await.expect(how);
        let first = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("in time")
            .expect("the first member's event")
            .into_value();
        // The reader dawdles past the watch's timeout in the middle of the revision.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let mut seen = vec![first];
        while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the watch ends by itself")
        {
            seen.push(ev.into_value());
        }
        let rvs: Vec<&str> = seen
            .iter()
            .map(|e| {
                e["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
            })
            .collect();
        assert_eq!(seen.len(), 3, "{how}: every member's event: {seen:?}");
        assert!(
            rvs.iter().all(|r| *r == rvs[0]),
            "{how}: one revision: {rvs:?}"
        );
    }
}

/// As in Kubernetes, binding a pod (alone, in a batch, or as a gang) sets `spec.nodeName` and
/// the PodScheduled condition without a managedFields entry for them: the creator's entry is
/// what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_leaves_managed_fields_as_they_were() {
    let s = setup().await;
    let pods = res("", "pods");
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("mf{i}");
        gang_namespace(c, &ns, 1).await;
        let alone = c
            .create(pods, Some(&ns), &pod("alone", "100m"))
            .await
            .expect(how);
        let member = c
            .create(pods, Some(&ns), &member("member"))
            .await
            .expect(how);
        c.call(pod_binding(&ns, "alone", "n1")).await.expect(how);
        c.call(gang_binding(&ns, json!([{"pod": "member", "node": "n2"}])))
            .await
            .expect(how);
        for (name, created, node) in [("alone", &alone, "n1"), ("member", &member, "n2")] {
            let now = c.get(pods, Some(&ns), name).await.expect(how);
            assert_eq!(now["spec"]["nodeName"], node, "{how}: {name} bound");
            assert_eq!(
                now["metadata"]["managedFields"], created["metadata"]["managedFields"],
                "{how}: {name}'s managedFields untouched by its binding"
            );
        }
    }
}

/// A binding is not decoded into the Pod type again, so the node name it sets is checked by
/// the pod's validation: one that is not a DNS subdomain is refused (422, naming
/// `spec.nodeName`) and the pod stays unbound; a good one binds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_to_a_malformed_node_name_is_refused() {
    let s = setup().await;
    let pods = res("", "pods");
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("bn{i}");
        namespace(c, &ns).await;
        c.create(pods, Some(&ns), &pod("p", "100m"))
            .await
            .expect(how);
        for bad in ["Node_1", "../n1", "n1/"] {
            let err = c
                .call(pod_binding(&ns, "p", bad))
                .await
                .expect_err("a malformed node name");
            assert_eq!(err.code, 422, "{how}: {bad}: {err:?}");
            assert!(
                err.message.contains("spec.nodeName"),
                "{how}: {bad}: {err:?}"
            );
        }
        let now = c.get(pods, Some(&ns), "p").await.expect(how);
        assert!(
            now["spec"]["nodeName"].is_null(),
            "{how}: still unbound: {now}"
        );
        c.call(pod_binding(&ns, "p", "n1.zone-a")).await.expect(how);
        let now = c.get(pods, Some(&ns), "p").await.expect(how);
        assert_eq!(now["spec"]["nodeName"], "n1.zone-a", "{how}");
        let scheduled = now["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "PodScheduled")
            .cloned()
            .unwrap_or_default();
        assert_eq!(scheduled["status"], "True", "{how}: {now}");
        assert!(scheduled["lastTransitionTime"].is_string(), "{how}: {now}");
    }
}

/// A Pod handed over decoded from its type is stored as the same Pod sent as JSON text is
/// (defaults, server fields, Kubernetes' field order), both in-process (where it skips the
/// parse and the re-typing) and over HTTPS (where it is sent as text). A decoded value that
/// is not from the type is checked as text is: unknown fields, wrong types, another kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoded_pod_is_stored_as_the_same_pod_sent_as_text() {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use tessera_apiserver::request::{Decoded, FieldValidation};
    let s = setup().await;
    let pods = res("", "pods");
    let text = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "x"}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}}}],
                "tolerations": [{"key": "k", "operator": "Exists"}]}})
    };
    let comparable = |mut v: Value| {
        for f in [
            "name",
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "managedFields",
        ] {
            v["metadata"].as_object_mut().expect("metadata").remove(f);
        }
        v
    };
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("dec{i}");
        namespace(c, &ns).await;
        let mut req = ApiRequest::new(Verb::Create, pods);
        req.namespace = Some(ns.clone());
        req.body = Bytes::from(text("as-text").to_string());
        c.call(req).await.expect(how);
        let typed: Pod = serde_json::from_value(text("as-type")).expect("a Pod");
        c.create_decoded(pods, Some(&ns), Decoded::typed(&typed).expect("typed"))
            .await
            .expect(how);
        let a = c.get(pods, Some(&ns), "as-text").await.expect(how);
        let b = c.get(pods, Some(&ns), "as-type").await.expect(how);
        assert_eq!(b["metadata"]["name"], "as-type");
        assert_eq!(b["spec"]["dnsPolicy"], "ClusterFirst", "{how}: defaulted");
        assert_eq!(comparable(a), comparable(b), "{how}");

        // Not from the type: checked as text is.
        let mut strict = ApiRequest::new(Verb::Create, pods);
        strict.namespace = Some(ns.clone());
        strict.params.field_validation = FieldValidation::Strict;
        let mut unknown = text("unknown");
        unknown["spec"]["colour"] = json!("blue");
        strict.object = Some(Decoded::value(unknown));
        let e = c.call(strict).await.expect_err("unknown field");
        assert_eq!(e.code, 400, "{how}: {}", e.message);
        assert!(
            e.message.contains("unknown field \"spec.colour\""),
            "{how}: {}",
            e.message
        );
        let mut wrong = text("wrong");
        wrong["spec"]["containers"] = json!("c");
        let e = c
            .create_decoded(pods, Some(&ns), Decoded::value(wrong))
            .await
            .expect_err("wrong type");
        assert_eq!(e.code, 400, "{how}: {}", e.message);
        assert!(
            e.message.contains("spec.containers"),
            "{how}: {}",
            e.message
        );
        let cm = ConfigMap::default();
        let e = c
            .create_decoded(pods, Some(&ns), Decoded::typed(&cm).expect("typed"))
            .await
            .expect_err("a ConfigMap is not a Pod");
        assert_eq!(e.code, 400, "{how}: {}", e.message);
        assert!(
            e.message.contains("does not match the expected kind"),
            "{how}: {}",
            e.message
        );
        for name in ["unknown", "wrong"] {
            assert!(c.get(pods, Some(&ns), name).await.is_err(), "{how}: {name}");
        }
    }
}

/// A create reads its namespace every time (what it decoded is remembered only for the
/// revision it was read at): once the namespace is terminating or gone, creates in it are
/// refused at once, and a label change reaches pod security at the next create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_see_their_namespace_as_it_is_now() {
    let s = setup().await;
    let (pods, namespaces) = (res("", "pods"), res("", "namespaces"));
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("now{i}");
        namespace(c, &ns).await;
        c.create(pods, Some(&ns), &pod("first", "100m"))
            .await
            .expect(how);
        // Enforcing `restricted` now: the next plain pod (no securityContext) is refused.
        c.patch(
            namespaces,
            None,
            &ns,
            None,
            PatchType::Merge,
            &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}),
        )
        .await
        .expect(how);
        let e = c
            .create(pods, Some(&ns), &pod("second", "100m"))
            .await
            .expect_err("restricted now");
        assert_eq!(e.code, 403, "{how}: {}", e.message);
        assert!(e.message.contains("restricted"), "{how}: {}", e.message);
        c.delete(namespaces, None, &ns, None).await.expect(how);
        let e = c
            .create(pods, Some(&ns), &pod("third", "100m"))
            .await
            .expect_err("the namespace is going");
        // No namespace controller runs here, so its `kubernetes` finalizer keeps it.
        let n = c.get(namespaces, None, &ns).await.expect(how);
        assert!(n["metadata"]["deletionTimestamp"].is_string(), "{how}: {n}");
        assert_eq!(e.code, 403, "{how}: {}", e.message);
        assert!(
            e.message.contains("being terminated"),
            "{how}: {}",
            e.message
        );
        assert!(c.get(pods, Some(&ns), "third").await.is_err(), "{how}");
    }
}

/// What the registry fills in on create — a pod's Pending phase and QoS class, a
/// namespace's phase and `kubernetes` finalizer — is nobody's field, as in kube-apiserver,
/// whose field manager runs before the strategy's PrepareForCreate. So the creator's
/// managedFields entry owns no `f:status`, and a kubelet's first status write owns the
/// status alone and leaves the creator's entry as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_registry_fills_in_on_create_is_nobodys_field() {
    let s = setup().await;
    let pods = res("", "pods");
    let owns = |entry: &Value, path: &[&str]| {
        path.iter()
            .try_fold(&entry["fieldsV1"], |v, step| v.get(*step))
            .is_some()
    };
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("rf{i}");
        namespace(c, &ns).await;
        let n = c.get(res("", "namespaces"), None, &ns).await.expect(how);
        assert_eq!(n["status"]["phase"], "Active", "{how}: {n}");
        assert_eq!(n["spec"]["finalizers"], json!(["kubernetes"]), "{how}: {n}");
        for e in n["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert!(!owns(e, &["f:status"]), "{how}: {e}");
            assert!(!owns(e, &["f:spec", "f:finalizers"]), "{how}: {e}");
        }
        let created = c
            .create(pods, Some(&ns), &pod("p", "100m"))
            .await
            .expect(how);
        assert_eq!(created["status"]["phase"], "Pending", "{how}");
        assert_eq!(created["status"]["qosClass"], "Burstable", "{how}");
        let entries = created["metadata"]["managedFields"].clone();
        assert_eq!(
            entries.as_array().map(Vec::len),
            Some(1),
            "{how}: {entries}"
        );
        assert!(
            owns(&entries[0], &["f:spec", "f:containers"]),
            "{how}: {entries}"
        );
        assert!(!owns(&entries[0], &["f:status"]), "{how}: {entries}");

        // A status merge patch of pod p by field manager `kubelet`; the pod's managedFields
        // after it.
        let kubelet_writes = |body: Value| {
            let (c, ns) = (c.clone(), ns.clone());
            async move {
                let mut req = ApiRequest::new(Verb::Patch(PatchType::Merge), pods);
                req.namespace = Some(ns.clone());
                req.name = Some("p".into());
                req.subresource = Some("status".into());
                req.params.field_manager = Some("kubelet".into());
                req.body = body.to_string().into();
                c.call(req).await.expect("a status write");
                let now = c.get(pods, Some(&ns), "p").await.expect("the pod");
                now["metadata"]["managedFields"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            }
        };
        let after = kubelet_writes(json!({"status": {"phase": "Running", "podIP": "10.0.0.9",
            "conditions": [{"type": "Ready", "status": "True"}]}}))
        .await;
        assert_eq!(after.len(), 2, "{how}: {after:?}");
        assert_eq!(after[0], entries[0], "{how}: the creator's entry as it was");
        assert_eq!(after[1]["manager"], "kubelet", "{how}: {after:?}");
        assert_eq!(after[1]["subresource"], "status", "{how}: {after:?}");
        for field in ["f:phase", "f:podIP", "f:conditions"] {
            assert!(
                owns(&after[1], &["f:status", field]),
                "{how}: {field}: {after:?}"
            );
        }
        assert!(
            !owns(&after[1], &["f:status", "f:qosClass"]),
            "{how}: {after:?}"
        );
        assert!(!owns(&after[1], &["f:spec"]), "{how}: {after:?}");
        // The kubelet's next status write goes to the same entry.
        let last = kubelet_writes(json!({"status": {"phase": "Succeeded"}})).await;
        assert_eq!(last.len(), 2, "{how}: {last:?}");
        assert_eq!(last[0], entries[0], "{how}: the creator's entry as it was");
        assert!(owns(&last[1], &["f:status", "f:phase"]), "{how}: {last:?}");
    }
}

/// A patch of `pods/status` that changes only the status has only the status decoded into
/// the Pod type (normalized: nulls dropped, wrong types refused); one that also touches
/// anything else is decoded whole, so a wrong type there is still refused. Nothing is
/// written by a refused patch, and a stale resourceVersion still conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_patches_are_typed_where_they_change_the_pod() {
    let s = setup().await;
    let pods = res("", "pods");
    for (i, (how, c)) in s.clients.iter().enumerate() {
        let ns = format!("st{i}");
        namespace(c, &ns).await;
        let created = c
            .create(pods, Some(&ns), &pod("p", "100m"))
            .await
            .expect(how);
        let patch = |body: Value| {
            let c = c.clone();
            let ns = ns.clone();
            async move {
                c.patch(
                    pods,
                    Some(&ns),
                    "p",
                    Some("status"),
                    PatchType::Merge,
                    &body,
                )
                .await
            }
        };
        let e = patch(json!({"status": {"phase": 5}}))
            .await
            .expect_err("phase is a string");
        assert_eq!(e.code, 400, "{how}: {}", e.message);
        assert!(e.message.contains("status.phase"), "{how}: {}", e.message);
        let e = patch(json!({"spec": {"containers": "x"}, "status": {"phase": "Running"}}))
            .await
            .expect_err("containers is a list");
        assert_eq!(e.code, 400, "{how}: {}", e.message);
        assert!(
            e.message.contains("spec.containers"),
            "{how}: {}",
            e.message
        );
        let e =
            patch(json!({"metadata": {"resourceVersion": "1"}, "status": {"phase": "Running"}}))
                .await
                .expect_err("stale");
        assert_eq!(e.code, 409, "{how}: {}", e.message);
        let now = c.get(pods, Some(&ns), "p").await.expect(how);
        assert_eq!(
            now["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
            "{how}: nothing written"
        );
        patch(json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastProbeTime": null}]}}))
        .await
        .expect(how);
        let now = c.get(pods, Some(&ns), "p").await.expect(how);
        assert_eq!(now["status"]["phase"], "Running", "{how}");
        let ready = &now["status"]["conditions"][0];
        assert_eq!(ready["type"], "Ready", "{how}: {now}");
        assert!(
            ready
                .as_object()
                .is_some_and(|c| !c.contains_key("lastProbeTime")),
            "{how}: normalized: {ready}"
        );
        assert_eq!(now["spec"], created["spec"], "{how}: the spec as it was");
    }
}
