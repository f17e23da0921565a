//! The real kubectl discovers the API: `api-resources`, `api-versions` and `version` against
//! the discovery routes served on loopback.

use std::process::Command;

fn kubectl(kubeconfig: &std::path::Path, cache: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .output()
        .expect("run kubectl (it is installed on every machine here)");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_discovers_the_served_kinds() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics =
        tessera_store::StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store: std::sync::Arc<dyn tessera_store::Store> = std::sync::Arc::new(
        tessera_store::EmbeddedStore::open(
            &dir.path().join("store"),
            tessera_store::EmbeddedOptions::small(),
            metrics,
        )
        .await
        .expect("store"),
    );
    let api = tessera_apiserver::api::Api::new(store, None);
    let routes = tessera_apiserver::discovery::router().with_state(api);
    tokio::spawn(async move {
        let _ = axum::serve(listener, routes).await;
    });
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: t\n  context:\n    cluster: t\n    user: u\ncurrent-context: t\n\
             users:\n- name: u\n  user: {{}}\n"
        ),
    )
    .expect("kubeconfig");
    let cache = dir.path().join("cache");
    let (kc, cache2) = (kubeconfig.clone(), cache.clone());
    let out = tokio::task::spawn_blocking(move || {
        (
            kubectl(&kc, &cache2, &["api-resources"]),
            kubectl(&kc, &cache2, &["api-versions"]),
            kubectl(&kc, &cache2, &["version", "-o", "json"]),
            kubectl(
                &kc,
                &cache2,
                &["api-resources", "--namespaced=false", "-o", "name"],
            ),
        )
    })
    .await
    .expect("kubectl");
    let (resources, versions, version, cluster_scoped) = out;
    let row = |name: &str| {
        resources
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("{name} missing from:\n{resources}"))
    };
    assert_eq!(row("pods"), ["pods", "po", "v1", "true", "Pod"]);
    assert_eq!(
        row("deployments"),
        ["deployments", "deploy", "apps/v1", "true", "Deployment"]
    );
    assert_eq!(
        row("namespaces"),
        ["namespaces", "ns", "v1", "false", "Namespace"]
    );
    assert_eq!(
        row("podgroups"),
        ["podgroups", "pg", "tessera.io/v1alpha1", "true", "PodGroup"]
    );
    assert_eq!(row("secrets"), ["secrets", "v1", "true", "Secret"]);
    for v in [
        "v1",
        "apps/v1",
        "batch/v1",
        "tessera.io/v1alpha1",
        "policy/v1",
    ] {
        assert!(
            versions.lines().any(|l| l == v),
            "{v} missing from {versions}"
        );
    }
    assert!(
        version.contains("\"gitVersion\": \"v1.32.0-tessera"),
        "{version}"
    );
    assert!(
        cluster_scoped.lines().any(|l| l == "nodes"),
        "{cluster_scoped}"
    );
    assert!(
        cluster_scoped.lines().any(|l| l == "tenants.tessera.io"),
        "{cluster_scoped}"
    );
    assert!(
        !cluster_scoped.lines().any(|l| l == "pods"),
        "{cluster_scoped}"
    );
}
