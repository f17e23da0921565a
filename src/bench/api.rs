//! `tessera bench api`: the API server over HTTPS on loopback, on a fresh embedded store,
//! driven by the same HTTP client the components use. Measures creates, gets and lists at
//! each concurrency, a paced mix at a fixed request rate (latency under a steady load, timed
//! from when each request was due so that queueing counts), and watch fan-out (every
//! watcher must receive every event).
//!
//! Client and server share the machine's cores: the numbers are for both together.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::Tokens;
use tessera_apiserver::catalog::Resource;
use tessera_apiserver::client::{Client, HttpClient};
use tessera_apiserver::pki::Credentials;
use tessera_apiserver::request::{ApiRequest, Verb, find_resource};
use tessera_apiserver::{http, serve};

use super::latency::Latencies;
use super::target::{BenchBackend, Target};

/// Flags of `bench api`.
#[derive(Args, Debug)]
pub struct ApiBenchArgs {
    /// Concurrency levels (requests in flight), comma-separated.
    #[arg(long, default_value = "1,16,64", value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Creates (and as many gets) per level.
    #[arg(long, default_value_t = 10_000)]
    pub requests: usize,
    /// Lists per level (of a namespace of `--list-size` objects).
    #[arg(long, default_value_t = 200)]
    pub lists: usize,
    /// Objects in the listed namespace.
    #[arg(long, default_value_t = 500)]
    pub list_size: usize,
    /// Requests per second of the paced mix (half creates, half gets).
    #[arg(long, default_value_t = 1000)]
    pub rate: usize,
    /// Seconds the paced mix runs.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Watchers of the fan-out phase.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Objects created while they watch.
    #[arg(long, default_value_t = 1000)]
    pub events: usize,
    /// Print one JSON object per measurement instead of text.
    #[arg(long)]
    pub json: bool,
    /// Store behind the API.
    #[arg(long, value_enum, default_value = "embedded")]
    pub backend: BenchBackend,
    /// etcd to use with `--backend etcd`; without it an etcd process is started for the run.
    #[arg(long)]
    pub etcd_servers: Option<String>,
    /// Serve watches through the watch cache (`false`: each watch reads the store itself).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_cache: bool,
    /// RoleBindings of other users in the store during the `rbac` phase (its gets are made
    /// by a user RBAC governs, bound through a group, against this many other bindings).
    #[arg(long, default_value_t = 10_000)]
    pub bindings: usize,
    /// Only these phases (create, get, list, paced, watch, rbac, crd, webhook, policy,
    /// aggregated), comma-separated; all by default.
    #[arg(long, value_delimiter = ',')]
    pub phases: Vec<String>,
}

#[derive(Serialize)]
struct Measurement {
    phase: &'static str,
    concurrency: usize,
    requests: usize,
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    complete: Option<bool>,
}

impl Measurement {
    /// A closed-loop measurement: `requests` at `concurrency`, their rate and latencies.
    fn of(
        phase: &'static str,
        concurrency: usize,
        requests: usize,
        rate: f64,
        lat: &mut Latencies,
    ) -> Measurement {
        Measurement {
            phase,
            concurrency,
            requests,
            per_sec: rate.round(),
            p50_ms: lat.percentile_ms(50.0),
            p99_ms: lat.percentile_ms(99.0),
            complete: None,
        }
    }
}

fn report(m: &Measurement, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(m)?);
    } else {
        println!(
            "{:<12} c={:<5} {:>8} requests {:>10.0}/s  p50 {:>7.3} ms  p99 {:>7.3} ms{}",
            m.phase,
            m.concurrency,
            m.requests,
            m.per_sec,
            m.p50_ms,
            m.p99_ms,
            match m.complete {
                Some(true) => "  every event to every watcher",
                Some(false) => "  EVENTS MISSING",
                None => "",
            }
        );
    }
    Ok(())
}

fn configmap(name: &str, stamp: u128) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"bench": "api"}, "annotations": {"t": stamp.to_string()}},
            "data": {"k": "v".repeat(64)}})
        .to_string(),
    )
}

struct Bench {
    client: Arc<HttpClient>,
    cm: &'static Resource,
    ns: &'static Resource,
    clock: Instant,
}

impl Bench {
    async fn namespace(&self, name: &str) -> anyhow::Result<()> {
        let mut req = ApiRequest::new(Verb::Create, self.ns);
        req.body = Bytes::from(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
                .to_string(),
        );
        self.client.call(req).await?;
        Ok(())
    }

    fn create_req(&self, ns: &str, name: &str) -> ApiRequest {
        let mut req = ApiRequest::new(Verb::Create, self.cm);
        req.namespace = Some(ns.to_owned());
        req.body = configmap(name, self.clock.elapsed().as_micros());
        req
    }

    fn get_req(&self, ns: &str, name: &str) -> ApiRequest {
        let mut req = ApiRequest::new(Verb::Get, self.cm);
        req.namespace = Some(ns.to_owned());
        req.name = Some(name.to_owned());
        req
    }

    /// [`Self::closed_loop`] of `args.requests` requests with `c` in flight, reported as
    /// `phase`.
    async fn measure(
        &self,
        phase: &'static str,
        c: usize,
        args: &ApiBenchArgs,
        make: impl Fn(usize) -> ApiRequest + Send + Sync + 'static,
    ) -> anyhow::Result<()> {
        let (rate, mut lat) = self
            .closed_loop(format!("{phase} c={c}"), args.requests, c, make)
            .await?;
        report(
            &Measurement::of(phase, c, args.requests, rate, &mut lat),
            args.json,
        )
    }

    /// `n` requests from `make(i)` with `c` in flight; throughput and latencies.
    async fn closed_loop(
        &self,
        label: String,
        n: usize,
        c: usize,
        make: impl Fn(usize) -> ApiRequest + Send + Sync + 'static,
    ) -> anyhow::Result<(f64, Latencies)> {
        let bar = super::progress_bar(n as u64, label);
        let next = Arc::new(AtomicUsize::new(0));
        let make = Arc::new(make);
        let started = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..c {
            let (client, next, make, bar) =
                (self.client.clone(), next.clone(), make.clone(), bar.clone());
            workers.push(tokio::spawn(async move {
                let mut lat = Latencies::with_capacity(n / c + 1);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<_, anyhow::Error>(lat);
                    }
                    let t = Instant::now();
                    client.call(make(i)).await?;
                    lat.record(t.elapsed());
                    bar.inc(1);
                }
            }));
        }
        let mut all = Latencies::with_capacity(n);
        for w in workers {
            all.extend(w.await??);
        }
        bar.finish_and_clear();
        Ok((n as f64 / started.elapsed().as_secs_f64(), all))
    }
}

/// Runs the benchmark.
pub async fn run(args: ApiBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.requests > 0 && args.rate > 0 && args.watchers > 0 && args.events > 0,
        "--requests, --rate, --watchers and --events must be positive"
    );
    let target = Target::new(args.backend, args.etcd_servers.as_deref(), None).await?;
    let bench_store = target.open().await?;
    let credentials = Credentials::generate()?;
    let mut api = Api::new(bench_store.store.clone(), None);
    if !args.watch_cache {
        api = api.without_watch_cache();
    }
    let phase = |p: &str| args.phases.is_empty() || args.phases.iter().any(|x| x == p);
    let tokens = Tokens::new(&credentials.admin_token);
    let pki = tempfile::tempdir()?;
    let front_proxy = tessera_apiserver::pki::FrontProxy::load_or_create(pki.path())?
        .ok_or_else(|| anyhow::anyhow!("no front-proxy CA could be made"))?;
    api.aggregator()
        .set_front_proxy(&front_proxy)
        .map_err(|e| anyhow::anyhow!(e))?;
    let router = http::router(api, tokens.clone());
    let addr = serve::serve_tls("127.0.0.1:0".parse()?, &credentials, router).await?;
    let client = Arc::new(HttpClient::new(
        &format!("https://{addr}"),
        &credentials.ca_pem,
        &credentials.admin_token,
    )?);
    let bench = Arc::new(Bench {
        client,
        cm: find_resource("", "v1", "configmaps")?,
        ns: find_resource("", "v1", "namespaces")?,
        clock: Instant::now(),
    });

    for &c in args
        .concurrency
        .iter()
        .filter(|_| phase("create") || phase("get"))
    {
        anyhow::ensure!(c > 0, "--concurrency levels must be positive");
        let ns = format!("c{c}");
        bench.namespace(&ns).await?;
        let (b, n2) = (bench.clone(), ns.clone());
        let (rate, mut lat) = bench
            .closed_loop(format!("create c={c}"), args.requests, c, move |i| {
                b.create_req(&n2, &format!("cm-{i}"))
            })
            .await?;
        report(
            &Measurement::of("create", c, args.requests, rate, &mut lat),
            args.json,
        )?;
        let (b, n2) = (bench.clone(), ns.clone());
        let total = args.requests;
        let (rate, mut lat) = bench
            .closed_loop(format!("get c={c}"), args.requests, c, move |i| {
                b.get_req(&n2, &format!("cm-{}", (i * 7919) % total))
            })
            .await?;
        report(
            &Measurement::of("get", c, args.requests, rate, &mut lat),
            args.json,
        )?;
    }

    if phase("list") {
        list_phase(&bench, &args).await?;
    }
    if phase("paced") {
        paced(&bench, &args).await?;
    }
    if phase("watch") {
        fan_out(&bench, &args).await?;
    }
    if phase("rbac") {
        let user = tokens.mint_user(&tessera_apiserver::auth::UserClaims {
            name: "bench-user".into(),
            groups: vec!["bench-team".into()],
            tenant: None,
            expires: tessera_apiserver::api::now_secs() + 3600,
        });
        let as_user = Arc::new(Bench {
            client: Arc::new(HttpClient::new(
                &format!("https://{addr}"),
                &credentials.ca_pem,
                &user,
            )?),
            cm: bench.cm,
            ns: bench.ns,
            clock: bench.clock,
        });
        rbac_phase(&bench, &as_user, &args).await?;
    }
    if phase("crd") {
        crd_phase(&bench, &args).await?;
    }
    if phase("webhook") {
        webhook_phase(&bench, &args).await?;
    }
    if phase("policy") {
        policy_phase(&bench, &args).await?;
    }
    if phase("aggregated") {
        aggregated_phase(&bench, &args, &front_proxy.ca_pem).await?;
    }
    drop(bench_store);
    Ok(())
}

/// Creates a CRD with a schema of a dozen fields (bounds, an enum, a pattern, defaults, a
/// map-keyed list), times how long until its kind takes a create, then creates and gets its
/// objects at each concurrency: what pruning, defaulting and validating by schema cost next
/// to the `create` phase's ConfigMaps.
async fn crd_phase(bench: &Arc<Bench>, args: &ApiBenchArgs) -> anyhow::Result<()> {
    const NS: &str = "crd";
    let crds = find_resource(
        tessera_apiserver::catalog::APIEXTENSIONS,
        "v1",
        "customresourcedefinitions",
    )?;
    bench.namespace(NS).await?;
    let mut spec = json!({"type": "object", "required": ["size"], "properties": {
        "size": {"type": "integer", "minimum": 1, "maximum": 100},
        "colour": {"type": "string", "enum": ["red", "green", "blue"], "default": "red"},
        "owner": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$", "maxLength": 63},
        "replicas": {"type": "integer", "default": 1},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object",
            "required": ["name"], "properties": {"name": {"type": "string"},
                "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 80}}}}}});
    let started = Instant::now();
    let widgets = bench_crd(bench, crds, "widgets", "Widget", &spec).await?;
    let widget = custom_object(widgets, NS, "Widget");
    let tries = first_create(bench, &widget).await?;
    println!(
        "crd served   the first create of the new kind succeeded {:.1} ms after the CRD's create was sent ({tries} tries)",
        started.elapsed().as_secs_f64() * 1000.0
    );
    for &c in &args.concurrency {
        let w = widget;
        let (rate, mut lat) = bench
            .closed_loop(format!("create-custom c={c}"), args.requests, c, move |i| {
                w(format!("c{c}-{i}"))
            })
            .await?;
        report(
            &Measurement::of("create-custom", c, args.requests, rate, &mut lat),
            args.json,
        )?;
        let total = args.requests;
        let (rate, mut lat) = bench
            .closed_loop(format!("get-custom c={c}"), args.requests, c, move |i| {
                let mut req = ApiRequest::new(Verb::Get, widgets);
                req.namespace = Some(NS.into());
                req.name = Some(format!("c{c}-{}", (i * 7919) % total));
                req
            })
            .await?;
        report(
            &Measurement::of("get-custom", c, args.requests, rate, &mut lat),
            args.json,
        )?;
    }
    // The same schema with three CEL rules (one on the object, one per list item, one with
    // a regular expression): what evaluating x-kubernetes-validations adds to a create.
    spec["x-kubernetes-validations"] = json!([
        {"rule": "self.replicas <= self.size", "message": "replicas may not exceed size"},
        {"rule": "self.owner.matches('^team-[a-z]+$')", "message": "owners are teams"}]);
    spec["properties"]["ports"]["items"]["x-kubernetes-validations"] =
        json!([{"rule": "self.port > 0 && self.name.size() <= 15"}]);
    let gadgets = bench_crd(bench, crds, "gadgets", "Gadget", &spec).await?;
    let gadget = custom_object(gadgets, NS, "Gadget");
    first_create(bench, &gadget).await?;
    for &c in &args.concurrency {
        bench
            .measure("create-custom-rules", c, args, move |i| {
                gadget(format!("c{c}-{i}"))
            })
            .await?;
    }
    Ok(())
}

/// Creates the CRD of `plural`/`kind` in `bench.example.com` (one version, `spec`'s schema)
/// and returns the resource it serves.
async fn bench_crd(
    bench: &Arc<Bench>,
    crds: &'static tessera_apiserver::catalog::Resource,
    plural: &str,
    kind: &str,
    spec: &serde_json::Value,
) -> anyhow::Result<&'static tessera_apiserver::catalog::Resource> {
    let crd = json!({"metadata": {"name": format!("{plural}.bench.example.com")},
        "spec": {"group": "bench.example.com", "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}}]}});
    let mut req = ApiRequest::new(Verb::Create, crds);
    req.body = Bytes::from(crd.to_string());
    let created = bench
        .client
        .call(req)
        .await?
        .into_value()
        .unwrap_or_default();
    tessera_apiserver::catalog::custom_resource(&created, "v1")
        .ok_or_else(|| anyhow::anyhow!("the created CRD defines no v1"))
}

/// A create of a `kind` object of the `crd` phase's schema in `ns`, by name.
fn custom_object(
    res: &'static tessera_apiserver::catalog::Resource,
    ns: &'static str,
    kind: &'static str,
) -> impl Fn(String) -> ApiRequest + Copy + Send + Sync + 'static {
    move |name: String| {
        let mut req = ApiRequest::new(Verb::Create, res);
        req.namespace = Some(ns.into());
        req.body = Bytes::from(
            json!({"apiVersion": "bench.example.com/v1", "kind": kind,
                "metadata": {"name": name, "labels": {"app": "bench"}},
                "spec": {"size": 7, "owner": "team-a", "labels": {"tier": "web"},
                    "ports": [{"name": "http"}, {"name": "metrics", "port": 9090}]}})
            .to_string(),
        );
        req
    }
}

/// Creates `first` with `make` until its new kind is served (404 until then): the tries.
async fn first_create(
    bench: &Arc<Bench>,
    make: &impl Fn(String) -> ApiRequest,
) -> anyhow::Result<u32> {
    let mut tries = 0;
    loop {
        tries += 1;
        match bench.client.call(make("first".into())).await {
            Ok(_) => return Ok(tries),
            Err(e) if tries < 100 && e.code == 404 => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => anyhow::bail!("a create of the new kind failed: {}", e.message),
        }
    }
}

/// ConfigMap creates judged by a ValidatingAdmissionPolicy at each concurrency: a policy
/// with a match condition, a variable read from a ConfigMap parameter and three
/// validations, bound to objects labelled `policy=checked` (`create-policy`), next to
/// creates it does not select (`create-policy-unselected`: the matching alone).
async fn policy_phase(bench: &Arc<Bench>, args: &ApiBenchArgs) -> anyhow::Result<()> {
    const NS: &str = "policies";
    bench.namespace(NS).await?;
    let admission = |plural| {
        find_resource(
            tessera_apiserver::catalog::ADMISSIONREGISTRATION,
            "v1",
            plural,
        )
    };
    let mut param = ApiRequest::new(Verb::Create, bench.cm);
    param.namespace = Some(NS.into());
    param.body =
        Bytes::from(json!({"metadata": {"name": "limits"}, "data": {"maxKeys": "8"}}).to_string());
    bench.client.call(param).await?;
    for (plural, body) in [
        (
            "validatingadmissionpolicies",
            json!({"metadata": {"name": "bench"}, "spec": {
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]},
                "matchConditions": [{"name": "not-system",
                    "expression": "!request.userInfo.username.startsWith('system:node:')"}],
                "variables": [{"name": "limit", "expression": "int(params.data.maxKeys)"}],
                "validations": [
                    {"expression": "!has(object.data) || size(object.data) <= variables.limit",
                     "messageExpression": "'at most ' + string(variables.limit) + ' keys'"},
                    {"expression": "object.metadata.name.matches('^[a-z0-9-]+$')"},
                    {"expression": "!has(object.data) || object.data.all(k, k.size() < 64)"}]}}),
        ),
        (
            "validatingadmissionpolicybindings",
            json!({"metadata": {"name": "bench"}, "spec": {"policyName": "bench",
                "validationActions": ["Deny"],
                "paramRef": {"name": "limits", "namespace": NS, "parameterNotFoundAction": "Deny"},
                "matchResources": {"objectSelector": {"matchLabels": {"policy": "checked"}}}}}),
        ),
    ] {
        let mut req = ApiRequest::new(Verb::Create, admission(plural)?);
        req.body = Bytes::from(body.to_string());
        bench.client.call(req).await?;
    }
    let cm = bench.cm;
    for &c in &args.concurrency {
        for (phase, label) in [
            ("create-policy-unselected", "other"),
            ("create-policy", "checked"),
        ] {
            bench
                .measure(phase, c, args, move |i| {
                    let mut req = ApiRequest::new(Verb::Create, cm);
                    req.namespace = Some(NS.into());
                    req.body = Bytes::from(
                        json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": format!("{label}-c{c}-{i}"),
                                "labels": {"policy": label}},
                            "data": {"k": "v"}})
                        .to_string(),
                    );
                    req
                })
                .await?;
        }
    }
    Ok(())
}

/// A webhook server in this process over HTTPS on loopback: `/validate` allows, `/mutate`
/// allows with a patch adding a label. Its address and CA (PEM).
async fn webhook_server() -> anyhow::Result<(std::net::SocketAddr, String)> {
    use axum::body::Bytes as Body;
    fn reply(body: &Body, extra: serde_json::Value) -> String {
        let review: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let mut response = json!({"uid": review["request"]["uid"], "allowed": true});
        if let (Some(r), Some(e)) = (response.as_object_mut(), extra.as_object()) {
            r.extend(e.clone());
        }
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
            .to_string()
    }
    let patch = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]).to_string(),
    );
    let router = axum::Router::new()
        .route(
            "/validate",
            axum::routing::post(|body: Body| async move { reply(&body, json!({})) }),
        )
        .route(
            "/mutate",
            axum::routing::post(move |body: Body| async move {
                reply(&body, json!({"patchType": "JSONPatch", "patch": patch}))
            }),
        );
    let tls = tessera_apiserver::pki::agent_tls("127.0.0.1", "bench-webhook")?;
    let addr = serve::serve_tls_pem(
        "127.0.0.1:0".parse()?,
        &tls.cert_pem,
        &tls.key_pem,
        router,
        serve::ConnectionLimits::default(),
    )
    .await?;
    Ok((addr, tls.ca_pem))
}

/// ConfigMap creates through admission webhooks at each concurrency, next to creates the
/// same webhooks do not select: `create-unselected` (two configurations present, neither
/// selecting the object: the matching alone), `create-validated` (one validating webhook)
/// and `create-mutated` (one mutating and one validating webhook, the patch applied and the
/// object decoded and validated again). Each call opens its own TLS connection.
async fn webhook_phase(bench: &Arc<Bench>, args: &ApiBenchArgs) -> anyhow::Result<()> {
    const NS: &str = "webhooks";
    let (addr, ca) = webhook_server().await?;
    let bundle = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca);
    bench.namespace(NS).await?;
    for (kind, plural, path, selected) in [
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            "/validate",
            json!(["validated", "mutated"]),
        ),
        (
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            "/mutate",
            json!(["mutated"]),
        ),
    ] {
        let res = find_resource(
            tessera_apiserver::catalog::ADMISSIONREGISTRATION,
            "v1",
            plural,
        )?;
        let mut req = ApiRequest::new(Verb::Create, res);
        req.body = Bytes::from(
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": "bench"}, "webhooks": [{"name": "bench.tessera.example.com",
                    "sideEffects": "None", "admissionReviewVersions": ["v1"],
                    "objectSelector": {"matchExpressions": [{"key": "hook", "operator": "In",
                        "values": selected}]},
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                        "resources": ["configmaps"]}],
                    "clientConfig": {"url": format!("https://{addr}{path}"), "caBundle": bundle}}]})
            .to_string(),
        );
        bench.client.call(req).await?;
    }
    let cm = bench.cm;
    for &c in &args.concurrency {
        for (phase, hook) in [
            ("create-unselected", "none"),
            ("create-validated", "validated"),
            ("create-mutated", "mutated"),
        ] {
            bench.measure(phase, c, args, move |i| {
                    let mut req = ApiRequest::new(Verb::Create, cm);
                    req.namespace = Some(NS.into());
                    req.body = Bytes::from(
                        json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": format!("{hook}-c{c}-{i}"), "labels": {"hook": hook}},
                            "data": {"k": "v"}})
                        .to_string(),
                    );
                    req
                }).await?;
        }
    }
    Ok(())
}

/// An extension API server in this process over HTTPS on loopback, trusting the front
/// proxy's CA: it answers the discovery of `bench.example.com/v1` and a get of any Thing
/// from memory. Its address and CA (PEM).
async fn extension_server(front_proxy_ca: &str) -> anyhow::Result<(std::net::SocketAddr, String)> {
    let router = axum::Router::new()
        .route(
            "/apis/bench.example.com/v1",
            axum::routing::get(|| async {
                json!({"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": "bench.example.com/v1", "resources": [{"name": "things",
                    "singularName": "thing", "namespaced": true, "kind": "Thing",
                    "verbs": ["get"]}]})
                .to_string()
            }),
        )
        .route(
            "/apis/bench.example.com/v1/namespaces/{ns}/things/{name}",
            axum::routing::get(
                |axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>| async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        json!({"apiVersion": "bench.example.com/v1", "kind": "Thing",
                            "metadata": {"name": name, "namespace": ns}})
                        .to_string(),
                    )
                },
            ),
        );
    let tls = tessera_apiserver::pki::agent_tls("127.0.0.1", "things.aggregated.svc")?;
    let addr = serve::serve_tls_pem_verifying(
        "127.0.0.1:0".parse()?,
        &tls.cert_pem,
        &tls.key_pem,
        front_proxy_ca,
        router,
        serve::ConnectionLimits::default(),
    )
    .await?;
    Ok((addr, tls.ca_pem))
}

/// Gets through the aggregator at each concurrency (`get-aggregated`: authorized here,
/// proxied to an extension server that answers from memory) next to gets of ConfigMaps
/// stored here (`get-local`): what the proxy adds to a request.
async fn aggregated_phase(
    bench: &Arc<Bench>,
    args: &ApiBenchArgs,
    front_proxy_ca: &str,
) -> anyhow::Result<()> {
    const NS: &str = "aggregated";
    let (addr, ca) = extension_server(front_proxy_ca).await?;
    let bundle = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca);
    bench.namespace(NS).await?;
    let port = addr.port();
    for (group, plural, obj) in [
        (
            "",
            "services",
            json!({"metadata": {"name": "things", "namespace": NS},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}}),
        ),
        (
            "",
            "endpoints",
            json!({"metadata": {"name": "things", "namespace": NS},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                "ports": [{"name": "https", "port": port}]}]}),
        ),
        (
            "apiregistration.k8s.io",
            "apiservices",
            json!({"metadata": {"name": "v1.bench.example.com"},
            "spec": {"group": "bench.example.com", "version": "v1", "groupPriorityMinimum": 1000,
                "versionPriority": 15, "caBundle": bundle,
                "service": {"namespace": NS, "name": "things"}}}),
        ),
    ] {
        let res = find_resource(group, "v1", plural)?;
        let mut req = ApiRequest::new(Verb::Create, res);
        req.namespace = res.namespaced.then(|| NS.to_owned());
        req.body = Bytes::from(obj.to_string());
        bench.client.call(req).await?;
    }
    // The client builds the extension's URLs as for a custom resource of that group.
    let things = tessera_apiserver::catalog::custom_resource(
        &json!({"spec": {"group": "bench.example.com", "scope": "Namespaced",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "versions": [{"name": "v1", "served": true, "storage": true}]}}),
        "v1",
    )
    .ok_or_else(|| anyhow::anyhow!("the Thing resource"))?;
    const OBJECTS: usize = 100;
    let b = bench.clone();
    bench
        .closed_loop("fill objects".into(), OBJECTS, 16, move |i| {
            b.create_req(NS, &format!("o-{i}"))
        })
        .await?;
    for &c in &args.concurrency {
        let b = bench.clone();
        bench
            .measure("get-local", c, args, move |i| {
                b.get_req(NS, &format!("o-{}", i % OBJECTS))
            })
            .await?;
        bench
            .measure("get-aggregated", c, args, move |i| {
                let mut req = ApiRequest::new(Verb::Get, things);
                req.namespace = Some(NS.into());
                req.name = Some(format!("t-{}", i % OBJECTS));
                req
            })
            .await?;
    }
    Ok(())
}

/// Gets by the admin (no RBAC) and by a user RBAC governs (bound to a Role through its
/// group), with `--bindings` RoleBindings of other users in the same namespace: what RBAC
/// adds to a request, and that it does not grow with the bindings a decision does not need.
async fn rbac_phase(
    admin: &Arc<Bench>,
    user: &Arc<Bench>,
    args: &ApiBenchArgs,
) -> anyhow::Result<()> {
    const NS: &str = "rbac";
    let rbac = |plural: &str| find_resource(tessera_apiserver::catalog::RBAC, "v1", plural);
    let (roles, bindings) = (rbac("roles")?, rbac("rolebindings")?);
    admin.namespace(NS).await?;
    let body = |v: serde_json::Value| Bytes::from(v.to_string());
    let mut role = ApiRequest::new(Verb::Create, roles);
    role.namespace = Some(NS.into());
    role.body = body(
        json!({"metadata": {"name": "reader"}, "rules": [{"apiGroups": [""],
        "resources": ["configmaps"], "verbs": ["get"]}]}),
    );
    admin.client.call(role).await?;
    let binding = move |name: String, kind: &str, subject: String| {
        let mut req = ApiRequest::new(Verb::Create, bindings);
        req.namespace = Some(NS.into());
        req.body = body(json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}]}));
        req
    };
    admin
        .closed_loop("fill bindings".into(), args.bindings, 16, move |i| {
            binding(format!("rb-{i}"), "User", format!("user-{i}"))
        })
        .await?;
    admin
        .client
        .call(binding("team".into(), "Group", "bench-team".into()))
        .await?;
    const OBJECTS: usize = 100;
    let b = admin.clone();
    admin
        .closed_loop("fill objects".into(), OBJECTS, 16, move |i| {
            b.create_req(NS, &format!("o-{i}"))
        })
        .await?;
    // The first request RBAC governs fills the authorizer's index (one list per kind):
    // timed on its own, so the gets below measure the steady state.
    let started = Instant::now();
    user.client.call(user.get_req(NS, "o-0")).await?;
    println!(
        "rbac index   {} RoleBindings listed and indexed by the first RBAC decision in {:.1} ms",
        args.bindings + 1,
        started.elapsed().as_secs_f64() * 1000.0
    );
    for &c in &args.concurrency {
        for (phase, who) in [("get-admin", admin), ("get-rbac", user)] {
            let b = who.clone();
            who.measure(phase, c, args, move |i| {
                b.get_req(NS, &format!("o-{}", i % OBJECTS))
            })
            .await?;
        }
    }
    Ok(())
}

/// Lists of a namespace of `--list-size` objects at each concurrency.
async fn list_phase(bench: &Arc<Bench>, args: &ApiBenchArgs) -> anyhow::Result<()> {
    bench.namespace("listed").await?;
    let b = bench.clone();
    bench
        .closed_loop("fill list".into(), args.list_size, 16, move |i| {
            b.create_req("listed", &format!("l-{i}"))
        })
        .await?;
    for &c in &args.concurrency {
        let b = bench.clone();
        let (rate, mut lat) = bench
            .closed_loop(format!("list c={c}"), args.lists, c, move |_| {
                let mut req = ApiRequest::new(Verb::List, b.cm);
                req.namespace = Some("listed".into());
                req
            })
            .await?;
        report(
            &Measurement::of("list", c, args.lists, rate, &mut lat),
            args.json,
        )?;
    }

    Ok(())
}

/// Half creates, half gets, started on a fixed schedule of `--rate` per second; each
/// latency is measured from when the request was due.
async fn paced(bench: &Arc<Bench>, args: &ApiBenchArgs) -> anyhow::Result<()> {
    bench.namespace("paced").await?;
    bench.client.call(bench.create_req("paced", "p-0")).await?;
    let total = args.rate * args.seconds as usize;
    let bar = super::progress_bar(total as u64, format!("paced {}/s", args.rate));
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let due = started + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due).await;
        let (b, bar) = (bench.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            // Gets read objects created at least i/2 requests earlier.
            let req = if i % 2 == 0 {
                b.create_req("paced", &format!("p-{}", i + 2))
            } else {
                b.get_req("paced", &format!("p-{}", i / 4 * 2))
            };
            let r = b.client.call(req).await;
            bar.inc(1);
            r.map(|_| due.elapsed())
        }));
    }
    let mut lat = Latencies::with_capacity(total);
    let mut errors = Vec::new();
    for t in tasks {
        match t.await? {
            Ok(d) => lat.record(d),
            Err(e) => errors.push(e),
        }
    }
    bar.finish_and_clear();
    if let Some(first) = errors.first() {
        anyhow::bail!("{} paced requests failed, the first: {first}", errors.len());
    }
    report(
        &Measurement {
            phase: "paced-mix",
            concurrency: 0,
            requests: total,
            per_sec: (total as f64 / started.elapsed().as_secs_f64()).round(),
            p50_ms: lat.percentile_ms(50.0),
            p99_ms: lat.percentile_ms(99.0),
            complete: None,
        },
        args.json,
    )
}

/// `--watchers` HTTP watches on one namespace while `--events` objects are created in it.
async fn fan_out(bench: &Arc<Bench>, args: &ApiBenchArgs) -> anyhow::Result<()> {
    bench.namespace("watched").await?;
    let mut list = ApiRequest::new(Verb::List, bench.cm);
    list.namespace = Some("watched".into());
    let listed = bench.client.list(list.clone()).await?;
    let rv = listed["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let bar = super::progress_bar(
        (args.watchers * args.events) as u64,
        format!("deliveries w={}", args.watchers),
    );
    let mut readers = Vec::with_capacity(args.watchers);
    for _ in 0..args.watchers {
        let mut req = list.clone();
        req.params.resource_version = Some(rv.clone());
        let mut stream = bench.client.watch(req).await?;
        let (events, bar, clock) = (args.events, bar.clone(), bench.clock);
        readers.push(tokio::spawn(async move {
            let mut lat = Latencies::with_capacity(events);
            let mut seen = 0;
            while seen < events {
                let Ok(Some(ev)) =
                    tokio::time::timeout(Duration::from_secs(60), stream.next()).await
                else {
                    break;
                };
                let ev = ev.into_value();
                if ev["type"] != "ADDED" {
                    continue;
                }
                let at: u64 = ev["object"]["metadata"]["annotations"]["t"]
                    .as_str()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                lat.record(clock.elapsed().saturating_sub(Duration::from_micros(at)));
                seen += 1;
                bar.inc(1);
            }
            (seen, lat)
        }));
    }
    let started = Instant::now();
    let b = bench.clone();
    bench
        .closed_loop("watched creates".into(), args.events, 16, move |i| {
            b.create_req("watched", &format!("w-{i}"))
        })
        .await?;
    let mut all = Latencies::with_capacity(args.watchers * args.events);
    let mut complete = true;
    for r in readers {
        let (seen, lat) = r.await?;
        complete &= seen == args.events;
        all.extend(lat);
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    report(
        &Measurement {
            phase: "watch-fanout",
            concurrency: args.watchers,
            requests: args.watchers * args.events,
            per_sec: ((args.watchers * args.events) as f64 / secs).round(),
            p50_ms: all.percentile_ms(50.0),
            p99_ms: all.percentile_ms(99.0),
            complete: Some(complete),
        },
        args.json,
    )?;
    anyhow::ensure!(complete, "some watchers missed events");
    Ok(())
}
