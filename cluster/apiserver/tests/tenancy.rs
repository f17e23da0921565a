//! What a tenant may not do even inside its own namespaces, and what a Tenant may not own —
//! tried as an attacking tenant (or a careless admin) would, each refusal checked to change
//! nothing.

use std::sync::Arc;

use serde_json::{Value, json};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{PatchType, find_resource};
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
        EmbeddedStore::open(dir.path(), EmbeddedOptions::default(), metrics)
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
