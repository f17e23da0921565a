//! What every namespace holds, as in Kubernetes: a ServiceAccount `default` and the ConfigMap
//! `kube-root-ca.crt` with the cluster's CA — made for new namespaces, made again when
//! deleted, put back when changed, and not made in a namespace being deleted.

mod support;

use serde_json::json;
use support::{TEST_CA, shard, wait_until};
use tessera_apiserver::request::PatchType;
use tessera_controllers::context::res;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_namespace_gets_a_default_account_and_the_root_ca() {
    let s = shard(1).await;
    let c = &s.client;
    let sa = res("", "serviceaccounts");
    let cms = res("", "configmaps");
    c.create(
        res("", "namespaces"),
        None,
        &json!({"metadata": {"name": "team"}}),
    )
    .await
    .expect("namespace");
    for ns in ["default", "team"] {
        wait_until("the default account", || async {
            c.get(sa, Some(ns), "default").await.is_ok()
        })
        .await;
        wait_until("the root CA", || async {
            c.get(cms, Some(ns), "kube-root-ca.crt")
                .await
                .is_ok_and(|cm| cm["data"]["ca.crt"] == TEST_CA)
        })
        .await;
    }

    // Deleted, both come back (as new objects).
    let old = c.get(sa, Some("team"), "default").await.expect("sa");
    c.delete(sa, Some("team"), "default", None)
        .await
        .expect("delete sa");
    c.delete(cms, Some("team"), "kube-root-ca.crt", None)
        .await
        .expect("delete cm");
    wait_until("a new default account", || async {
        c.get(sa, Some("team"), "default")
            .await
            .is_ok_and(|now| now["metadata"]["uid"] != old["metadata"]["uid"])
    })
    .await;
    wait_until("the root CA again", || async {
        c.get(cms, Some("team"), "kube-root-ca.crt").await.is_ok()
    })
    .await;

    // Changed, the bundle is put back.
    c.patch(
        cms,
        Some("team"),
        "kube-root-ca.crt",
        None,
        PatchType::Merge,
        &json!({"data": {"ca.crt": "forged"}}),
    )
    .await
    .expect("patch");
    wait_until("the bundle restored", || async {
        c.get(cms, Some("team"), "kube-root-ca.crt")
            .await
            .is_ok_and(|cm| cm["data"]["ca.crt"] == TEST_CA)
    })
    .await;

    // A namespace being deleted is emptied and goes away; neither controller fills it again.
    c.delete(res("", "namespaces"), None, "team", None)
        .await
        .expect("delete namespace");
    wait_until("the namespace gone", || async {
        c.get(res("", "namespaces"), None, "team")
            .await
            .is_err_and(|e| e.code == 404)
    })
    .await;
    assert!(
        c.get(sa, Some("team"), "default")
            .await
            .is_err_and(|e| e.code == 404),
        "no account left behind in a deleted namespace"
    );
}
