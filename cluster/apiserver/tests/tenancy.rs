//! What a tenant may not do even inside its own namespaces, and what a Tenant may not own —
//! tried as an attacking tenant (or a careless admin) would, each refusal checked to change
//! nothing.

use std::sync::Arc;

use serde_json::{Value, json};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, PatchType, Verb, find_resource};
use tessera_apiserver::status::ApiError;
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

fn res(group: &str, plural: &str) -> &'static tessera_apiserver::catalog::Resource {
    let version = if group == "tessera.io" {
        "v1alpha1"
    } else {
        "v1"
    };
    find_resource(group, version, plural).expect("served")
}

async fn setup() -> (Arc<dyn Client>, Arc<dyn Client>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let api = Api::new(store, None);
    let admin: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));
    let tenant: Arc<dyn Client> = Arc::new(InProcess::new(api, User::Tenant("acme".into())));
    for ns in ["default", "kube-system", "acme-dev", "zeta-dev"] {
        admin
            .create(
                res("", "namespaces"),
                None,
                &json!({"metadata": {"name": ns}}),
            )
            .await
            .expect("namespace");
    }
    admin
        .create(
            res("tessera.io", "tenants"),
            None,
            &json!({"metadata": {"name": "acme"}, "spec": {"namespaces": ["acme-dev"]}}),
        )
        .await
        .expect("tenant");
    (admin, tenant, dir)
}

fn tenant(name: &str, namespaces: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": {"namespaces": namespaces}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_own_system_shared_or_duplicate_namespaces() {
    let (admin, _, _dir) = setup().await;
    let tenants = res("tessera.io", "tenants");
    for (namespaces, field, why) in [
        (
            json!(["kube-system"]),
            "spec.namespaces[0]",
            "system namespace",
        ),
        (
            json!(["ok-ns", "default"]),
            "spec.namespaces[1]",
            "system namespace",
        ),
        (json!(["z1", "z1"]), "spec.namespaces[1]", "listed twice"),
        (
            json!(["zeta-dev", "acme-dev"]),
            "spec.namespaces[1]",
            "already owned by tenant \"acme\"",
        ),
    ] {
        let err = admin
            .create(tenants, None, &tenant("zeta", namespaces.clone()))
            .await
            .expect_err("refused");
        assert_eq!(err.code, 422, "{namespaces}: {}", err.message);
        assert!(
            err.message.contains(field) && err.message.contains(why),
            "{}",
            err.message
        );
        assert_eq!(
            admin
                .get(tenants, None, "zeta")
                .await
                .map_err(|e| e.code)
                .err(),
            Some(404),
            "nothing created"
        );
    }
    // An update may not take another tenant's namespace either.
    admin
        .create(tenants, None, &tenant("zeta", json!(["zeta-dev"])))
        .await
        .expect("zeta");
    let err = admin
        .patch(
            tenants,
            None,
            "zeta",
            None,
            PatchType::Merge,
            &json!({"spec": {"namespaces": ["zeta-dev", "acme-dev"]}}),
        )
        .await
        .expect_err("refused");
    assert_eq!(err.code, 422, "{}", err.message);
    let zeta = admin.get(tenants, None, "zeta").await.expect("zeta");
    assert_eq!(zeta["spec"]["namespaces"], json!(["zeta-dev"]), "unchanged");
    // Its own list may change freely.
    admin
        .patch(
            tenants,
            None,
            "zeta",
            None,
            PatchType::Merge,
            &json!({"spec": {"namespaces": ["zeta-dev", "zeta-prod"]}}),
        )
        .await
        .expect("own namespaces");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_lift_its_quota_or_report_its_pods_finished() {
    let (admin, acme, _dir) = setup().await;
    let (quotas, limits, pods) = (
        res("", "resourcequotas"),
        res("", "limitranges"),
        res("", "pods"),
    );
    let ns = Some("acme-dev");
    admin
        .create(
            quotas,
            ns,
            &json!({"metadata": {"name": "rq"}, "spec": {"hard": {"pods": "2"}}}),
        )
        .await
        .expect("quota");
    admin
        .create(
            limits,
            ns,
            &json!({"metadata": {"name": "lr"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "1"}}]}}),
        )
        .await
        .expect("limits");
    // Reading is fine; changing or deleting them is the admin's.
    acme.get(quotas, ns, "rq").await.expect("read quota");
    acme.get(limits, ns, "lr").await.expect("read limits");
    let attempts = [
        acme.delete(quotas, ns, "rq", None).await,
        acme.patch(
            quotas,
            ns,
            "rq",
            None,
            PatchType::Merge,
            &json!({"spec": {"hard": {"pods": "100"}}}),
        )
        .await,
        acme.create(
            quotas,
            ns,
            &json!({"metadata": {"name": "mine"}, "spec": {"hard": {"pods": "9"}}}),
        )
        .await,
        acme.delete(limits, ns, "lr", None).await,
    ];
    for a in attempts {
        let e = a.expect_err("refused");
        assert_eq!(e.code, 403, "{}", e.message);
        assert!(
            e.message.contains("only an admin may change it"),
            "{}",
            e.message
        );
    }
    let rq = admin.get(quotas, ns, "rq").await.expect("quota");
    assert_eq!(rq["spec"]["hard"]["pods"], "2", "unchanged");
    assert!(admin.get(limits, ns, "lr").await.is_ok(), "still there");

    // A running pod reported Succeeded by its tenant would give its quota back.
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1",
        "containers": [{"name": "c", "image": "x"}]}});
    acme.create(pods, ns, &pod).await.expect("pod");
    let e = acme
        .patch(
            pods,
            ns,
            "p",
            Some("status"),
            PatchType::Merge,
            &json!({"status": {"phase": "Succeeded"}}),
        )
        .await
        .expect_err("refused");
    assert_eq!(e.code, 403, "{}", e.message);
    assert!(e.message.contains("write a pod's status"), "{}", e.message);
    assert_eq!(
        admin.get(pods, ns, "p").await.expect("pod")["status"]["phase"],
        "Pending"
    );
    let rq = admin.get(quotas, ns, "rq").await.expect("quota");
    assert_eq!(rq["status"]["used"]["pods"], "1", "still charged");
    // The pod itself is the tenant's: reading its status and deleting it work.
    acme.get(pods, ns, "p").await.expect("read");
    acme.delete(pods, ns, "p", None).await.expect("delete");
}

/// The escape pod's shapes: host namespaces, privileged, hostPath, added capabilities.
fn risky(name: &str) -> Vec<(&'static str, Value)> {
    let c = |sc: Value| json!({"name": "c", "image": "x", "securityContext": sc});
    let spec = |extra: Value| {
        let mut s = json!({"containers": [c(json!({}))]});
        for (k, v) in extra.as_object().expect("object") {
            s[k] = v.clone();
        }
        json!({"metadata": {"name": name}, "spec": s})
    };
    vec![
        (
            "host namespaces (hostNetwork=true)",
            spec(json!({"hostNetwork": true})),
        ),
        (
            "host namespaces (hostPID=true)",
            spec(json!({"hostPID": true})),
        ),
        (
            "privileged (container \"c\" must not set securityContext.privileged=true)",
            spec(json!({"containers": [c(json!({"privileged": true}))]})),
        ),
        (
            "hostPath volumes (volume \"root\")",
            spec(json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})),
        ),
        (
            "non-default capabilities (container \"c\" must not include \"SYS_ADMIN\"",
            spec(json!({"containers": [c(json!({"capabilities": {"add": ["SYS_ADMIN"]}}))]})),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_security_holds_a_tenant_to_baseline() {
    let (admin, acme, _dir) = setup().await;
    let (pods, namespaces) = (res("", "pods"), res("", "namespaces"));
    let ns = Some("acme-dev");
    // A tenant's namespace is baseline without any label: each risky shape is refused,
    // saying which rule, and nothing is created.
    for (why, pod) in risky("p") {
        let e = acme.create(pods, ns, &pod).await.expect_err(why);
        assert_eq!(e.code, 403, "{}", e.message);
        assert!(
            e.message
                .starts_with("pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": "),
            "{}",
            e.message
        );
        assert!(e.message.contains(why), "{why}: {}", e.message);
        assert!(admin.get(pods, ns, "p").await.is_err(), "nothing created");
    }
    // Through a controller it is the same: the pod is checked whoever creates it.
    let e = admin
        .create(pods, ns, &risky("ctl")[0].1)
        .await
        .expect_err("an admin's pod in the tenant's namespace too");
    assert_eq!(e.code, 403);
    // A plain pod is fine; a restricted warning is returned when the namespace asks for it.
    let plain = json!({"metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}});
    acme.create(pods, ns, &plain).await.expect("baseline pod");
    admin
        .patch(
            namespaces,
            None,
            "acme-dev",
            None,
            PatchType::Merge,
            &json!({"metadata": {"labels": {"pod-security.kubernetes.io/warn": "restricted"}}}),
        )
        .await
        .expect("warn label");
    let req = tessera_apiserver::request::ApiRequest {
        namespace: Some("acme-dev".into()),
        body: json!({"metadata": {"name": "warned"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}})
        .to_string()
        .into(),
        ..tessera_apiserver::request::ApiRequest::new(
            tessera_apiserver::request::Verb::Create,
            pods,
        )
    };
    match acme.call(req).await.expect("created with a warning") {
        tessera_apiserver::api::ApiResponse::Object { warnings, .. } => assert!(
            warnings
                .iter()
                .any(|w| w.starts_with("would violate PodSecurity \"restricted:latest\"")),
            "{warnings:?}"
        ),
        other => panic!("{other:?}"),
    }
    // The tenant cannot loosen its namespace; an admin's looser label does not take effect.
    let loosen =
        json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
    let e = acme
        .patch(
            namespaces,
            None,
            "acme-dev",
            None,
            PatchType::Merge,
            &loosen,
        )
        .await
        .expect_err("looser than the Tenant allows");
    assert_eq!(e.code, 403, "{}", e.message);
    assert!(
        e.message
            .contains("looser than tenant \"acme\" allows (baseline)"),
        "{}",
        e.message
    );
    admin
        .patch(
            namespaces,
            None,
            "acme-dev",
            None,
            PatchType::Merge,
            &loosen,
        )
        .await
        .expect("an admin may label");
    let e = acme
        .create(pods, ns, &risky("still")[0].1)
        .await
        .expect_err("still baseline");
    assert_eq!(e.code, 403);
    // A Tenant allowed `privileged` gets what its namespace labels say; a stricter label
    // holds even then.
    admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"podSecurity": "privileged"}}),
        )
        .await
        .expect("allow privileged");
    acme.create(pods, ns, &risky("now")[0].1)
        .await
        .expect("privileged allowed now");
    acme.patch(
        namespaces,
        None,
        "acme-dev",
        None,
        PatchType::Merge,
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}),
    )
    .await
    .expect("stricter is always fine");
    let e = acme
        .create(pods, ns, &plain.clone())
        .await
        .expect_err("restricted");
    assert!(e.message.contains("\"restricted:latest\""), "{}", e.message);
    // A bad level is refused on the Tenant.
    let e = admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"podSecurity": "lenient"}}),
        )
        .await
        .expect_err("invalid level");
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.podSecurity"), "{}", e.message);
    // So is a lender that is not a shard's name; a good list is kept.
    let e = admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"borrowFrom": ["shard-1", "Not_A_Shard"]}}),
        )
        .await
        .expect_err("invalid lender");
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.borrowFrom[1]"), "{}", e.message);
    let t = admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"borrowFrom": ["shard-1"]}}),
        )
        .await
        .expect("a valid list");
    assert_eq!(t["spec"]["borrowFrom"], json!(["shard-1"]));
    // Namespaces no Tenant owns are privileged by default, as in Kubernetes.
    admin
        .create(pods, Some("default"), &risky("admin-pod")[0].1)
        .await
        .expect("privileged by default outside tenants");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_nodes_are_opt_in_for_tenants() {
    let (admin, acme, _dir) = setup().await;
    let (pods, nodes) = (res("", "pods"), res("", "nodes"));
    let ns = Some("acme-dev");
    admin
        .create(
            nodes,
            None,
            &json!({"metadata": {"name": "proc-0", "labels": {"tessera.io/runtime": "process"}},
                "spec": {"taints": [{"key": "tessera.io/runtime", "value": "process", "effect": "NoSchedule"}]}}),
        )
        .await
        .expect("node");
    let pod = |name: &str, spec: Value| {
        let mut s = json!({"containers": [{"name": "c", "image": "x"}]});
        for (k, v) in spec.as_object().expect("object") {
            s[k] = v.clone();
        }
        json!({"metadata": {"name": name}, "spec": s})
    };
    let attempts = [
        (
            "named",
            json!({"nodeName": "proc-0"}),
            "spec.nodeName \"proc-0\" is a process node",
        ),
        (
            "tolerant",
            json!({"tolerations": [{"key": "tessera.io/runtime", "operator": "Exists"}]}),
            "spec.tolerations[0] tolerates",
        ),
        (
            "tolerates-all",
            json!({"tolerations": [{"operator": "Exists"}]}),
            "spec.tolerations[0] tolerates",
        ),
    ];
    for (name, spec, why) in &attempts {
        let e = acme
            .create(pods, ns, &pod(name, spec.clone()))
            .await
            .expect_err(name);
        assert_eq!(e.code, 403, "{}", e.message);
        assert!(e.message.contains(why), "{}", e.message);
        assert!(
            e.message.contains("spec.processNodes: true"),
            "{}",
            e.message
        );
    }
    // Nor through a binding: a pod admitted without a node, then bound to the process node
    // by the tenant itself (alone, or as a gang), is refused and stays unbound.
    acme.create(pods, ns, &pod("sneaky", json!({})))
        .await
        .expect("a plain pod");
    let mut labelled = pod("sneaky-gang", json!({}));
    labelled["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": "g"});
    acme.create(pods, ns, &labelled).await.expect("a member");
    acme.create(
        res("tessera.io", "podgroups"),
        ns,
        &json!({"metadata": {"name": "g"}, "spec": {"minMember": 1}}),
    )
    .await
    .expect("its group");
    let mut bind = ApiRequest::new(Verb::Create, pods);
    bind.namespace = Some("acme-dev".into());
    bind.name = Some("sneaky".into());
    bind.subresource = Some("binding".into());
    bind.body = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "sneaky"},
        "target": {"kind": "Node", "name": "proc-0"}})
    .to_string()
    .into();
    let mut gang = ApiRequest::new(Verb::Create, res("tessera.io", "podgroups"));
    gang.namespace = Some("acme-dev".into());
    gang.name = Some("g".into());
    gang.subresource = Some("binding".into());
    gang.body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "PodGroupBinding",
        "metadata": {"name": "g"}, "members": [{"pod": "sneaky-gang", "node": "proc-0"}]})
    .to_string()
    .into();
    for req in [bind, gang] {
        let e = acme.call(req).await.expect_err("a tenant binds nothing");
        assert_eq!(e.code, 403, "{}", e.message);
        assert!(
            e.message
                .contains("only the shard's scheduler binds pods to nodes"),
            "{}",
            e.message
        );
    }
    for name in ["sneaky", "sneaky-gang"] {
        let p = admin.get(pods, ns, name).await.expect("pod");
        assert!(
            p["spec"]["nodeName"].is_null(),
            "{name} stayed unbound: {p}"
        );
    }
    // Other tolerations and nodes are the tenant's business.
    acme.create(
        pods,
        ns,
        &pod(
            "other",
            json!({"tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeName": "n1"}),
        ),
    )
    .await
    .expect("not a process node");
    // Allowed by its Tenant, it may.
    admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"processNodes": true}}),
        )
        .await
        .expect("allow");
    for (name, spec, _) in attempts {
        acme.create(pods, ns, &pod(name, spec))
            .await
            .expect("allowed now");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_quota_counts_objects_of_any_kind() {
    let (admin, acme, _dir) = setup().await;
    admin
        .create(
            res("", "namespaces"),
            None,
            &json!({"metadata": {"name": "acme-prod"}}),
        )
        .await
        .expect("ns");
    admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"namespaces": ["acme-dev", "acme-prod"],
                "quota": {"count/configmaps": "3", "count/secrets": "1"}}}),
        )
        .await
        .expect("quota");
    let (cms, secrets) = (res("", "configmaps"), res("", "secrets"));
    let cm = |name: &str| json!({"metadata": {"name": name}, "data": {"k": "v"}});
    // Three ConfigMaps across both namespaces, then the fourth is refused.
    acme.create(cms, Some("acme-dev"), &cm("a"))
        .await
        .expect("1");
    acme.create(cms, Some("acme-dev"), &cm("b"))
        .await
        .expect("2");
    acme.create(cms, Some("acme-prod"), &cm("c"))
        .await
        .expect("3");
    let e = acme
        .create(cms, Some("acme-prod"), &cm("d"))
        .await
        .expect_err("over the tenant's count");
    assert_eq!(e.code, 403, "{}", e.message);
    assert!(
        e.message
            .starts_with("configmaps \"d\" is forbidden: exceeded tenant quota: acme")
            && e.message.contains("count/configmaps"),
        "{}",
        e.message
    );
    assert!(
        admin.get(cms, Some("acme-prod"), "d").await.is_err(),
        "nothing created"
    );
    // Deleting one gives its count back.
    acme.delete(cms, Some("acme-dev"), "a", None)
        .await
        .expect("delete");
    acme.create(cms, Some("acme-prod"), &cm("d"))
        .await
        .expect("room again");
    let t = admin
        .get(res("tessera.io", "tenants"), None, "acme")
        .await
        .expect("tenant");
    assert_eq!(t["status"]["used"]["count/configmaps"], "3", "{t}");
    // Another kind counts on its own.
    let secret = |name: &str| json!({"metadata": {"name": name}, "data": {"k": "dg=="}});
    acme.create(secrets, Some("acme-dev"), &secret("s1"))
        .await
        .expect("secret");
    let e = acme
        .create(secrets, Some("acme-dev"), &secret("s2"))
        .await
        .expect_err("one secret only");
    assert!(e.message.contains("count/secrets"), "{}", e.message);
}

/// What the Tenant's `status.used` says of stored bytes, and what the objects named should
/// be charged (their charged length in whole blocks), read back from the API.
async fn stored_used(admin: &Arc<dyn Client>, objects: &[&str]) -> (i64, i64) {
    use tessera_apiserver::quota::{STORED_BYTES, charged_len, stored_charge};
    let t = admin
        .get(res("tessera.io", "tenants"), None, "acme")
        .await
        .expect("tenant");
    let used: i64 = t["status"]["used"][STORED_BYTES]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1);
    let mut want = 0i64;
    for name in objects {
        let o = admin
            .get(res("", "configmaps"), Some("acme-dev"), name)
            .await
            .expect("configmap");
        want += stored_charge(charged_len(&o))
            .to_string()
            .parse::<i64>()
            .expect("units");
    }
    (used, want)
}

/// Sets ConfigMap `big`'s data to `bytes` of `fill`.
async fn set_big(c: &Arc<dyn Client>, fill: &str, bytes: usize) -> Result<Value, ApiError> {
    c.patch(
        res("", "configmaps"),
        Some("acme-dev"),
        "big",
        None,
        PatchType::Merge,
        &json!({"data": {"k": fill.repeat(bytes)}}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_quota_limits_stored_bytes() {
    let (admin, acme, _dir) = setup().await;
    admin
        .patch(
            res("tessera.io", "tenants"),
            None,
            "acme",
            None,
            PatchType::Merge,
            &json!({"spec": {"quota": {"tessera.io/stored-bytes": "40Ki"}}}),
        )
        .await
        .expect("quota");
    let cms = res("", "configmaps");
    let cm = |name: &str, bytes: usize| json!({"metadata": {"name": name}, "data": {"k": "x".repeat(bytes)}});
    acme.create(cms, Some("acme-dev"), &cm("big", 20_000))
        .await
        .expect("20 KB fits");
    let (used, want) = stored_used(&admin, &["big"]).await;
    assert_eq!(used, want);
    assert_eq!(used, 20_480, "five blocks of 4 KiB");
    // 30 KB more would pass 40 KiB: refused, nothing written.
    let e = acme
        .create(cms, Some("acme-dev"), &cm("huge", 30_000))
        .await
        .expect_err("over the stored bytes");
    assert_eq!(e.code, 403, "{}", e.message);
    assert!(
        e.message.contains("exceeded tenant quota: acme")
            && e.message.contains("tessera.io/stored-bytes"),
        "{}",
        e.message
    );
    assert!(admin.get(cms, Some("acme-dev"), "huge").await.is_err());
    acme.create(cms, Some("acme-dev"), &cm("small", 10))
        .await
        .expect("a small one fits");
    // Growing an object by an update is charged too: refused past the quota, unchanged.
    let e = set_big(&acme, "y", 40_000)
        .await
        .expect_err("growing past the quota");
    assert_eq!(e.code, 403, "{}", e.message);
    let big = admin.get(cms, Some("acme-dev"), "big").await.expect("big");
    assert_eq!(big["data"]["k"].as_str().map(str::len), Some(20_000));
    let (used, want) = stored_used(&admin, &["big", "small"]).await;
    assert_eq!(used, want, "a refused update charges nothing");
    // Shrinking gives bytes back; so does a delete.
    set_big(&acme, "z", 5_000).await.expect("shrink");
    let (used, want) = stored_used(&admin, &["big", "small"]).await;
    assert_eq!(used, want);
    assert_eq!(used, 12_288, "two blocks and one");
    acme.delete(cms, Some("acme-dev"), "small", None)
        .await
        .expect("delete");
    let (used, want) = stored_used(&admin, &["big"]).await;
    assert_eq!(used, want);
    // Status-like writes by the system are counted but never refused: the admin grows the
    // object past the quota; the tenant's next write that needs room is refused.
    set_big(&admin, "w", 45_000)
        .await
        .expect("not refused to the system");
    let (used, want) = stored_used(&admin, &["big"]).await;
    assert_eq!(used, want);
    assert!(used > 40 * 1024);
    let e = acme
        .create(cms, Some("acme-dev"), &cm("more", 10))
        .await
        .expect_err("no room left");
    assert_eq!(e.code, 403, "{}", e.message);
}

/// A body handed over decoded in-process — even one serialized from its own type, which
/// skips only the re-typing — is authorized, admitted and validated exactly as JSON text:
/// a tenant cannot create a namespace that is not theirs or a pod that breaks its pod
/// security with one, and a request carrying a body both ways is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoded_body_is_checked_as_text_is() {
    use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tessera_apiserver::request::Decoded;
    let (admin, acme, _dir) = setup().await;
    let (pods, namespaces) = (res("", "pods"), res("", "namespaces"));
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    let ns = Namespace {
        metadata: meta("zeta-new"),
        ..Namespace::default()
    };
    let e = acme
        .create_decoded(namespaces, None, Decoded::typed(&ns).expect("typed"))
        .await
        .expect_err("not the tenant's namespace");
    assert_eq!(e.code, 403, "{}", e.message);
    assert!(admin.get(namespaces, None, "zeta-new").await.is_err());

    let risky = Pod {
        metadata: meta("sneaky"),
        spec: Some(PodSpec {
            host_pid: Some(true),
            containers: vec![Container {
                name: "c".into(),
                image: Some("x".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    };
    let mut invalid = risky.clone();
    invalid.spec = Some(PodSpec::default());
    for (pod, ns, code, says) in [
        (&risky, "acme-dev", 403, "hostPID=true"),
        (&risky, "zeta-dev", 403, "zeta-dev"),
        (&invalid, "acme-dev", 422, "spec.containers"),
    ] {
        let e = acme
            .create_decoded(pods, Some(ns), Decoded::typed(pod).expect("typed"))
            .await
            .expect_err(says);
        assert_eq!(e.code, code, "{says}: {}", e.message);
        assert!(e.message.contains(says), "{says}: {}", e.message);
    }
    for name in ["sneaky"] {
        for ns in ["acme-dev", "zeta-dev"] {
            assert!(
                admin.get(pods, Some(ns), name).await.is_err(),
                "nothing created"
            );
        }
    }

    let mut both = ApiRequest::new(Verb::Create, pods);
    both.namespace = Some("acme-dev".into());
    both.object = Some(Decoded::value(json!({"metadata": {"name": "a"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})));
    both.body = json!({"metadata": {"name": "b"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    .to_string()
    .into();
    let e = acme.call(both).await.expect_err("two bodies");
    assert_eq!(e.code, 400, "{}", e.message);
    for name in ["a", "b"] {
        assert!(admin.get(pods, Some("acme-dev"), name).await.is_err());
    }
}
