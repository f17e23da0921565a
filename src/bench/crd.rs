//! `tessera bench crd`: what a CRD's conversion webhook costs. One API server in this
//! process (embedded store) and, beside it, a conversion webhook over HTTPS on loopback
//! (its own CA given as `caBundle`), serving a CRD whose `v1` has `spec.size` and whose
//! `v2` (the storage version) has `spec.parts.count`. The same work is done in both
//! versions: creates (`--objects`, `--concurrency` at a time), a get of each, and lists of
//! them all (`--lists`). In `v2` nothing goes to the webhook; in `v1` a create converts
//! twice (the object to v2 before it is stored, the stored object back to v1 for the
//! answer), a get once, and a list in reviews of up to 500 objects.
//!
//! What it tells an operator: how much a conversion webhook adds to each request of a
//! non-storage version — the price of keeping clients on an older version.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use clap::Args;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tessera_apiserver::auth::User;
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::request::{ApiRequest, Verb};

use super::latency::Latencies;

/// Flags of `bench crd`.
#[derive(Args, Debug)]
pub struct CrdBenchArgs {
    /// Custom objects created in each version.
    #[arg(long, default_value_t = 2000)]
    pub objects: usize,
    /// Requests at a time.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Lists of every object, in each version.
    #[arg(long, default_value_t = 10)]
    pub lists: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One version's numbers.
#[derive(Serialize)]
struct Phase {
    version: &'static str,
    creates_per_sec: f64,
    create_p50_ms: f64,
    create_p99_ms: f64,
    gets_per_sec: f64,
    get_p50_ms: f64,
    get_p99_ms: f64,
    list_p50_ms: f64,
    reviews: u64,
}

#[derive(Serialize)]
struct Result {
    objects: usize,
    concurrency: usize,
    phases: Vec<Phase>,
}

fn err(e: tessera_apiserver::status::ApiError) -> anyhow::Error {
    anyhow::anyhow!("{}", e.message)
}

/// The conversion webhook: `spec.size` (v1) and `spec.parts.count` (v2), counting reviews.
async fn convert(State(reviews): State<Arc<AtomicU64>>, body: Bytes) -> String {
    reviews.fetch_add(1, Ordering::Relaxed);
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let req = &review["request"];
    let desired = req["desiredAPIVersion"].as_str().unwrap_or_default();
    let converted: Vec<Value> = req["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let mut o = o.clone();
            o["spec"] = if desired.ends_with("/v2") {
                json!({"parts": {"count": o["spec"]["size"]}})
            } else {
                json!({"size": o["spec"]["parts"]["count"]})
            };
            o["apiVersion"] = json!(desired);
            o
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": req["uid"], "result": {"status": "Success"}, "convertedObjects": converted},
    })
    .to_string()
}

/// The CRD, its webhook at `port` trusting `ca_pem`.
fn crd(port: u16, ca_pem: &str) -> Value {
    use base64::Engine;
    let schema =
        |spec: Value| json!({"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gizmos.bench.example.com"},
        "spec": {
            "group": "bench.example.com",
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "kind": "Gizmo"},
            "conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}/convert"),
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
                },
            }},
            "versions": [
                {"name": "v1", "served": true, "storage": false, "schema": schema(
                    json!({"type": "object", "properties": {"size": {"type": "integer"}}}))},
                {"name": "v2", "served": true, "storage": true, "schema": schema(
                    json!({"type": "object", "properties": {"parts": {"type": "object",
                        "properties": {"count": {"type": "integer"}}}}}))},
            ],
        },
    })
}

/// Runs `n` calls of `one`, `concurrency` at a time, behind a progress bar: the rate and
/// the latencies.
async fn timed<F, Fut>(
    n: usize,
    concurrency: usize,
    label: String,
    one: F,
) -> anyhow::Result<(f64, Latencies)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let bar = super::progress_bar(n as u64, label);
    let started = Instant::now();
    let results: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..n)
        .map(|i| {
            let call = one(i);
            let bar = bar.clone();
            async move {
                let t = Instant::now();
                call.await?;
                bar.inc(1);
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = Latencies::with_capacity(n);
    for r in results {
        latencies.record(r?);
    }
    Ok((n as f64 / elapsed.max(1e-9), latencies))
}

/// Runs the benchmark.
pub async fn run(args: CrdBenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let api = super::in_process_api(dir.path()).await?;
    let client: Arc<dyn Client> = Arc::new(InProcess::new(api.clone(), User::Admin));

    let reviews = Arc::new(AtomicU64::new(0));
    let tls = tessera_apiserver::pki::agent_tls("127.0.0.1", "convert.bench.svc")?;
    let router = axum::Router::new()
        .route("/convert", post(convert))
        .with_state(reviews.clone());
    let addr = tessera_apiserver::serve::serve_tls_pem(
        "127.0.0.1:0".parse()?,
        &tls.cert_pem,
        &tls.key_pem,
        router,
        tessera_apiserver::serve::ConnectionLimits::default(),
    )
    .await?;

    let definition = crd(addr.port(), &tls.ca_pem);
    let crds = tessera_apiserver::request::find_resource(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    )
    .map_err(err)?;
    client.create(crds, None, &definition).await.map_err(err)?;
    let namespaces =
        tessera_apiserver::request::find_resource("", "v1", "namespaces").map_err(err)?;
    client
        .create(namespaces, None, &json!({"metadata": {"name": "bench"}}))
        .await
        .map_err(err)?;

    let mut phases = Vec::new();
    // The storage version first: its numbers are the baseline.
    for version in ["v2", "v1"] {
        let res = tessera_apiserver::catalog::custom_resource(&definition, version)
            .ok_or_else(|| anyhow::anyhow!("the CRD has no {version}"))?;
        let before = reviews.load(Ordering::Relaxed);
        let spec = |i: usize| match version {
            "v1" => json!({"size": i}),
            _ => json!({"parts": {"count": i}}),
        };
        let (creates_per_sec, mut create) = timed(
            args.objects,
            args.concurrency,
            format!("creates in {version}"),
            |i| {
                let client = client.clone();
                let obj = json!({
                    "apiVersion": format!("bench.example.com/{version}"),
                    "kind": "Gizmo",
                    "metadata": {"name": format!("{version}-{i}"), "namespace": "bench"},
                    "spec": spec(i),
                });
                async move {
                    client.create(res, Some("bench"), &obj).await.map_err(err)?;
                    Ok(())
                }
            },
        )
        .await?;
        let (gets_per_sec, mut get) = timed(
            args.objects,
            args.concurrency,
            format!("gets in {version}"),
            |i| {
                let client = client.clone();
                async move {
                    let name = format!("{version}-{i}");
                    let got = client.get(res, Some("bench"), &name).await.map_err(err)?;
                    anyhow::ensure!(
                        got["spec"] == spec(i),
                        "{name} read in {version} as {}",
                        got["spec"]
                    );
                    Ok(())
                }
            },
        )
        .await?;
        let (_, mut list) = timed(args.lists, 1, format!("lists in {version}"), |_| {
            let client = client.clone();
            async move {
                let mut req = ApiRequest::new(Verb::List, res);
                req.namespace = Some("bench".into());
                let listed = client.list(req).await.map_err(err)?;
                let items = listed["items"].as_array().map_or(0, Vec::len);
                anyhow::ensure!(items >= args.objects, "listed {items} objects");
                Ok(())
            }
        })
        .await?;
        phases.push(Phase {
            version,
            creates_per_sec,
            create_p50_ms: create.percentile_ms(50.0),
            create_p99_ms: create.percentile_ms(99.0),
            gets_per_sec,
            get_p50_ms: get.percentile_ms(50.0),
            get_p99_ms: get.percentile_ms(99.0),
            list_p50_ms: list.percentile_ms(50.0),
            reviews: reviews.load(Ordering::Relaxed) - before,
        });
    }
    let result = Result {
        objects: args.objects,
        concurrency: args.concurrency,
        phases,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    println!(
        "{} custom objects per version, {} requests at a time; v2 is the storage version\n",
        result.objects, result.concurrency
    );
    println!(
        "{:<8} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9}",
        "version",
        "creates/s",
        "p50 ms",
        "p99 ms",
        "gets/s",
        "p50 ms",
        "p99 ms",
        "list ms",
        "reviews"
    );
    for p in &result.phases {
        println!(
            "{:<8} {:>10.0} {:>9.2} {:>9.2} {:>10.0} {:>9.2} {:>9.2} {:>10.1} {:>9}",
            p.version,
            p.creates_per_sec,
            p.create_p50_ms,
            p.create_p99_ms,
            p.gets_per_sec,
            p.get_p50_ms,
            p.get_p99_ms,
            p.list_p50_ms,
            p.reviews
        );
    }
    Ok(())
}
