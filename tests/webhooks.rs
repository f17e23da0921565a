//! Admission webhooks end to end with the real kubectl against `tessera up`: a webhook
//! server run by the test over HTTPS (its own CA, given to the API server as `caBundle`)
//! refuses objects through a ValidatingWebhookConfiguration called by URL and adds a label
//! through a MutatingWebhookConfiguration called through a Service; namespace selectors,
//! dry runs, updates, deletes, failure policies, metrics and what a tenant may not do.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use serde_json::{Value, json};
use support::Cluster;

/// An AdmissionReview answer as the server sends it.
type Reply = ([(axum::http::header::HeaderName, &'static str); 1], String);

fn parse(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// Every AdmissionReview request the server received, by path.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

fn answer(review: &Value, allowed: bool, extra: Value) -> Reply {
    let mut response = json!({"uid": review["request"]["uid"], "allowed": allowed});
    if let (Some(r), Some(e)) = (response.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        review.to_string(),
    )
}

/// Refuses objects named `bad-*` or labelled `verdict=deny` (and their deletion when
/// labelled `protected=true`), with a warning on what it allows.
async fn validate(State(seen): State<Seen>, body: Bytes) -> Reply {
    let review = parse(&body);
    seen.lock()
        .expect("lock")
        .push(("validate".into(), review.clone()));
    let req = &review["request"];
    let obj = if req["operation"] == "DELETE" {
        &req["oldObject"]
    } else {
        &req["object"]
    };
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let labels = &obj["metadata"]["labels"];
    let refusal = if req["operation"] == "DELETE" {
        (labels["protected"] == "true").then_some("protected objects stay")
    } else if name.starts_with("bad-") {
        Some("names starting with bad- are refused")
    } else if labels["verdict"] == "deny" {
        Some("verdict=deny is refused")
    } else {
        None
    };
    match refusal {
        Some(message) => answer(
            &review,
            false,
            json!({"status": {"code": 403, "reason": "Forbidden", "message": message}}),
        ),
        None => answer(
            &review,
            true,
            json!({"warnings": ["checked by names.example.com"]}),
        ),
    }
}

/// Adds the label `mutated=yes`.
async fn mutate(State(seen): State<Seen>, body: Bytes) -> Reply {
    let review = parse(&body);
    seen.lock()
        .expect("lock")
        .push(("mutate".into(), review.clone()));
    let has_labels = review["request"]["object"]["metadata"]["labels"].is_object();
    let patch = if has_labels {
        json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}])
    } else {
        json!([{"op": "add", "path": "/metadata/labels", "value": {"mutated": "yes"}}])
    };
    let patch = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
    answer(
        &review,
        true,
        json!({"patchType": "JSONPatch", "patch": patch}),
    )
}

/// Allows everything, changing nothing (records what it saw).
async fn observe(State(seen): State<Seen>, body: Bytes) -> Reply {
    let review = parse(&body);
    seen.lock()
        .expect("lock")
        .push(("observe".into(), review.clone()));
    answer(&review, true, json!({}))
}

/// Refuses an exec whose command starts with `rm` (a CONNECT's object is its options).
async fn guard_exec(State(seen): State<Seen>, body: Bytes) -> Reply {
    let review = parse(&body);
    seen.lock()
        .expect("lock")
        .push(("exec".into(), review.clone()));
    if review["request"]["object"]["command"][0] == "rm" {
        answer(
            &review,
            false,
            json!({"status": {"code": 403, "reason": "Forbidden", "message": "rm is not run in pods here"}}),
        )
    } else {
        answer(&review, true, json!({}))
    }
}

/// Answers after 3 s (longer than the 1 s timeout its configuration gives it).
async fn slow(body: Bytes) -> Reply {
    let review = parse(&body);
    tokio::time::sleep(Duration::from_secs(3)).await;
    answer(&review, true, json!({}))
}

/// The webhook server: its address, the CA (PEM) that signed its certificate (for
/// 127.0.0.1 and `webhook.hooks.svc`), what it saw, and the runtime serving it.
fn webhook_server() -> (std::net::SocketAddr, String, Seen, tokio::runtime::Runtime) {
    let seen: Seen = Arc::default();
    let router = axum::Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        .route("/slow", post(slow))
        .route("/observe", post(observe))
        .route("/exec", post(guard_exec))
        .with_state(seen.clone());
    let (addr, ca, rt) = support::https_server(router, "webhook.hooks.svc");
    (addr, ca, seen, rt)
}

const VALIDATING: &str = "ValidatingWebhookConfiguration";
const MUTATING: &str = "MutatingWebhookConfiguration";

/// A webhook configuration of `kind` named `name` with one webhook,
/// `<name>.example.com`, called at `client` (a `clientConfig` in flow style), selecting
/// `operations` on core/v1 `resources`, with more of its fields in `more` (lines indented
/// by two spaces).
fn configuration(
    kind: &str,
    name: &str,
    client: &str,
    operations: &str,
    resources: &str,
    more: &str,
) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata: {{name: {name}}}\n\
         webhooks:\n- name: {name}.example.com\n  sideEffects: None\n  admissionReviewVersions: [v1]\n\
         \x20 clientConfig: {client}\n\
         \x20 rules: [{{operations: [{operations}], apiGroups: ['*'], apiVersions: [v1], resources: [{resources}]}}]\n\
         {more}"
    )
}

/// A `clientConfig` calling `path` on the test's server at `port`, trusting `bundle`.
fn url(port: u16, path: &str, bundle: &str) -> String {
    format!("{{url: \"https://127.0.0.1:{port}{path}\", caBundle: {bundle}}}")
}

fn json_of(s: &str) -> Value {
    serde_json::from_str(s).expect("kubectl printed JSON")
}

#[test]
fn webhooks_refuse_and_mutate_objects_through_kubectl() {
    let c = Cluster::start();
    let (addr, ca, seen, _rt) = webhook_server();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let port = addr.port();
    for ns in ["hooks", "shop", "other"] {
        c.ok(&["create", "namespace", ns]);
    }
    c.ok(&["label", "namespace", "shop", "policy=enforced"]);
    // The mutating webhook is reached through a Service (no selector) and its Endpoints.
    let service = c.file(
        "service.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: webhook, namespace: hooks}}\n\
             spec: {{ports: [{{name: https, port: 443, targetPort: {port}}}]}}\n---\n\
             apiVersion: v1\nkind: Endpoints\nmetadata: {{name: webhook, namespace: hooks}}\n\
             subsets: [{{addresses: [{{ip: 127.0.0.1}}], ports: [{{name: https, port: {port}}}]}}]\n"
        ),
    );
    c.ok(&["apply", "-f", &service]);
    let configs = [
        configuration(
            VALIDATING,
            "names",
            &url(port, "/validate", &bundle),
            "CREATE, UPDATE, DELETE",
            "configmaps",
            "  namespaceSelector: {matchLabels: {policy: enforced}}\n",
        ),
        configuration(
            MUTATING,
            "labels",
            &format!(
                "{{service: {{namespace: hooks, name: webhook, path: /mutate}}, caBundle: {bundle}}}"
            ),
            "CREATE",
            "configmaps",
            "",
        ),
        configuration(
            MUTATING,
            "a-observer",
            &url(port, "/observe", &bundle),
            "CREATE",
            "configmaps",
            "  reinvocationPolicy: IfNeeded\n",
        ),
    ];
    let configs = c.file("webhooks.yaml", &configs.join("---\n"));
    c.ok(&["apply", "-f", &configs]);

    // kubectl lists them with their number of webhooks; defaults are filled in.
    let table = c.ok(&["get", "validatingwebhookconfigurations"]);
    assert!(
        table.starts_with("NAME") && table.contains("WEBHOOKS") && table.contains("names"),
        "{table}"
    );
    let stored = json_of(&c.ok(&[
        "get",
        "mutatingwebhookconfiguration",
        "labels",
        "-o",
        "json",
    ]));
    let hook = &stored["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail", "{stored}");
    assert_eq!(hook["timeoutSeconds"], 10);
    assert_eq!(hook["reinvocationPolicy"], "Never");
    assert_eq!(hook["clientConfig"]["service"]["port"], 443);

    // The validating webhook refuses, with its message after Kubernetes' words; nothing is
    // stored.
    let err = c.fails(&["create", "configmap", "bad-one", "-n", "shop"]);
    assert!(
        err.contains(
            "admission webhook \"names.example.com\" denied the request: names starting with bad- are refused"
        ),
        "{err}"
    );
    let missing = c.fails(&["get", "configmap", "bad-one", "-n", "shop"]);
    assert!(missing.contains("NotFound"), "{missing}");

    // An allowed object gets the mutating webhook's label, and the validating webhook's
    // warning reaches kubectl.
    let out = c.kubectl(&[
        "create",
        "configmap",
        "good",
        "-n",
        "shop",
        "--from-literal=a=b",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Warning: checked by names.example.com"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let good = json_of(&c.ok(&["get", "configmap", "good", "-n", "shop", "-o", "json"]));
    assert_eq!(good["metadata"]["labels"]["mutated"], "yes", "{good}");
    assert_eq!(good["data"]["a"], "b");

    // What the webhooks were sent: AdmissionReview v1 with the caller, the operation and
    // the object; the validating webhook saw the mutated object.
    {
        let seen = seen.lock().expect("lock");
        let (_, review) = seen
            .iter()
            .rev()
            .find(|(path, r)| path == "validate" && r["request"]["name"] == "good")
            .expect("the validating webhook saw good");
        let req = &review["request"];
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(req["operation"], "CREATE");
        assert_eq!(req["namespace"], "shop");
        assert_eq!(req["resource"]["resource"], "configmaps");
        assert_eq!(req["kind"]["kind"], "ConfigMap");
        assert_eq!(req["userInfo"]["username"], "admin");
        assert_eq!(req["options"]["kind"], "CreateOptions");
        assert_eq!(
            req["object"]["metadata"]["labels"]["mutated"], "yes",
            "{req}"
        );
        // Configurations run in name order: the observer first, then the labeller; the
        // labeller changed the object, so the observer (IfNeeded) was called once more and
        // saw the change.
        let observed: Vec<&Value> = seen
            .iter()
            .filter(|(path, r)| path == "observe" && r["request"]["name"] == "good")
            .map(|(_, r)| &r["request"]["object"]["metadata"]["labels"]["mutated"])
            .collect();
        assert_eq!(observed, vec![&Value::Null, &json!("yes")]);
    }

    // The namespace selector: `other` is not enforced, so a bad- name passes there (and is
    // still labelled: the mutating webhook selects every namespace).
    c.ok(&["create", "configmap", "bad-two", "-n", "other"]);
    let two = json_of(&c.ok(&["get", "configmap", "bad-two", "-n", "other", "-o", "json"]));
    assert_eq!(two["metadata"]["labels"]["mutated"], "yes");

    // A server-side dry run is judged too, and marked as one.
    let err = c.fails(&[
        "create",
        "configmap",
        "bad-three",
        "-n",
        "shop",
        "--dry-run=server",
    ]);
    assert!(err.contains("denied the request"), "{err}");
    assert!(
        seen.lock()
            .expect("lock")
            .iter()
            .any(|(_, r)| r["request"]["name"] == "bad-three" && r["request"]["dryRun"] == true),
        "the dry run reached the webhook as one"
    );

    // Updates: the old object comes along, and a refused change is not stored.
    let err = c.fails(&["label", "configmap", "good", "-n", "shop", "verdict=deny"]);
    assert!(err.contains("verdict=deny is refused"), "{err}");
    let good = json_of(&c.ok(&["get", "configmap", "good", "-n", "shop", "-o", "json"]));
    assert!(
        good["metadata"]["labels"].get("verdict").is_none(),
        "{good}"
    );
    c.ok(&["label", "configmap", "good", "-n", "shop", "protected=true"]);
    assert!(
        seen.lock().expect("lock").iter().any(|(_, r)| {
            r["request"]["operation"] == "UPDATE"
                && r["request"]["oldObject"]["metadata"]["name"] == "good"
                && r["request"]["object"]["metadata"]["labels"]["protected"] == "true"
        }),
        "the update was sent with its old object"
    );
    // Deletes: the webhook sees the old object and may refuse.
    let err = c.fails(&["delete", "configmap", "good", "-n", "shop"]);
    assert!(err.contains("protected objects stay"), "{err}");
    c.ok(&["get", "configmap", "good", "-n", "shop"]);

    // The calls are counted by webhook and outcome.
    let denied = support::sample(
        &c.metrics_addr,
        "tessera_apiserver_admission_webhook_calls_total{name=\"names.example.com\",operation=\"CREATE\",outcome=\"denied\",type=\"validating\"} ",
    );
    assert!(denied >= 2.0, "denied calls counted: {denied}");

    // Invalid configurations are refused naming the field, and nothing is stored.
    let bad = c.file(
        "bad.yaml",
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\n\
         metadata: {name: broken}\nwebhooks:\n\
         - name: broken.example.com\n  sideEffects: Some\n  admissionReviewVersions: [v1]\n\
         \x20 clientConfig: {url: \"http://127.0.0.1:1/x\"}\n",
    );
    let err = c.fails(&["create", "-f", &bad]);
    assert!(
        err.contains("webhooks[0].clientConfig.url") && err.contains("webhooks[0].sideEffects"),
        "{err}"
    );
    let missing = c.fails(&["get", "validatingwebhookconfiguration", "broken"]);
    assert!(missing.contains("NotFound"), "{missing}");

    // Deleting the configuration stops the refusals at once.
    c.ok(&["delete", "validatingwebhookconfiguration", "names"]);
    c.ok(&["create", "configmap", "bad-four", "-n", "shop"]);
}

/// `matchConditions`: CEL over the object, the old object and the request decide whether a
/// webhook is called; one that fails to evaluate refuses the request if the webhook fails
/// closed and skips it if it fails open.
#[test]
fn connections_to_pods_are_admitted_as_connect() {
    let c = Cluster::start();
    let (addr, ca, seen, _rt) = webhook_server();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    c.ok(&["create", "namespace", "ops"]);
    c.ok(&["run", "box", "-n", "ops", "--image=nginx"]);
    let running = support::wait_for(Duration::from_secs(30), || {
        (c.ok(&[
            "get",
            "pod",
            "box",
            "-n",
            "ops",
            "-o",
            "jsonpath={.status.phase}",
        ]) == "Running")
            .then_some(())
    });
    assert!(running.is_some());
    let config = configuration(
        VALIDATING,
        "execs",
        &url(addr.port(), "/exec", &bundle),
        "CONNECT",
        "pods/exec",
        "",
    );
    let file = c.file("execs.yaml", &config);
    c.ok(&["apply", "-f", &file]);
    let err = c.fails(&["exec", "-n", "ops", "box", "--", "rm", "-rf", "/"]);
    assert!(err.contains("rm is not run in pods here"), "{err}");
    // What the webhook saw: a CONNECT of pods/exec, the PodExecOptions as the object.
    let review = seen
        .lock()
        .expect("lock")
        .iter()
        .find(|(p, _)| p == "exec")
        .map(|(_, r)| r["request"].clone())
        .expect("the webhook was called");
    assert_eq!(review["operation"], "CONNECT");
    assert_eq!(review["subResource"], "exec");
    assert_eq!(review["kind"]["kind"], "PodExecOptions");
    assert_eq!(
        (review["name"].as_str(), review["namespace"].as_str()),
        (Some("box"), Some("ops"))
    );
    assert_eq!(review["object"]["kind"], "PodExecOptions");
    assert_eq!(review["object"]["command"], json!(["rm", "-rf", "/"]));
    assert_eq!(review["object"]["stdout"], true);
    assert!(review["options"].is_null(), "{review}");
    // Another command passes admission and reaches the pod's node (a simulated one, which
    // says it runs no processes).
    let err = c.fails(&["exec", "-n", "ops", "box", "--", "ls"]);
    assert!(err.contains("simulated nodes"), "{err}");
    // A ValidatingAdmissionPolicy judges connections too: attach is switched off.
    let policy = c.file(
        "no-attach.yaml",
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: no-attach}\nspec:\n  matchConstraints:\n    resourceRules: [{apiGroups: [''], apiVersions: [v1], operations: [CONNECT], resources: [pods/attach]}]\n  validations:\n  - {expression: \"object.kind != 'PodAttachOptions'\", message: attaching is switched off here}\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: no-attach}\nspec: {policyName: no-attach, validationActions: [Deny]}\n",
    );
    c.ok(&["apply", "-f", &policy]);
    let refused = support::wait_for(Duration::from_secs(10), || {
        let err = c.fails(&["attach", "-n", "ops", "box"]);
        err.contains("attaching is switched off here")
            .then_some(err)
    });
    assert!(
        refused.is_some(),
        "{}",
        c.fails(&["attach", "-n", "ops", "box"])
    );
}

#[test]
fn match_conditions_decide_which_requests_a_webhook_sees() {
    let c = Cluster::start();
    let (addr, ca, seen, _rt) = webhook_server();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let port = addr.port();
    c.ok(&["create", "namespace", "shop"]);
    let config = configuration(
        VALIDATING,
        "names",
        &url(port, "/validate", &bundle),
        "CREATE, UPDATE",
        "configmaps",
        concat!(
            "  matchConditions:\n",
            "  - {name: not-exempt, expression: \"!has(object.metadata.labels) || !('exempt' in object.metadata.labels)\"}\n",
            "  - {name: by-users, expression: \"request.userInfo.username != 'system:serviceaccount:shop:robot'\"}\n",
        ),
    );
    let file = c.file("conditions.yaml", &config);
    c.ok(&["apply", "-f", &file]);
    let err = c.fails(&["create", "configmap", "bad-one", "-n", "shop"]);
    assert!(
        err.contains("names starting with bad- are refused"),
        "{err}"
    );
    // The exempt label makes the first condition false: the webhook is not called.
    let exempt = c.file(
        "exempt.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad-exempt, namespace: shop, labels: {exempt: 'yes'}}\n",
    );
    c.ok(&["create", "-f", &exempt]);
    assert!(
        !seen
            .lock()
            .expect("lock")
            .iter()
            .any(|(_, r)| r["request"]["name"] == "bad-exempt"),
        "the webhook was not called for an exempt object"
    );
    // A condition that cannot be evaluated (a missing key) refuses the request while the
    // webhook fails closed, naming the condition, and skips the webhook once it fails open.
    let broken = configuration(
        VALIDATING,
        "names",
        &url(port, "/validate", &bundle),
        "CREATE, UPDATE",
        "configmaps",
        "  matchConditions: [{name: reads-data, expression: \"object.data.colour == 'red'\"}]\n",
    );
    let file = c.file("broken.yaml", &broken);
    c.ok(&["apply", "-f", &file]);
    let err = c.fails(&["create", "configmap", "plain", "-n", "shop"]);
    assert!(
        err.contains("names.example.com")
            && err.contains("reads-data")
            && err.contains("no such key"),
        "{err}"
    );
    let ignore = broken.replace(
        "  matchConditions:",
        "  failurePolicy: Ignore\n  matchConditions:",
    );
    let file = c.file("ignore.yaml", &ignore);
    c.ok(&["apply", "-f", &file]);
    c.ok(&["create", "configmap", "bad-ignored", "-n", "shop"]);
    // A condition that does not compile is refused when the configuration is written.
    let bad = configuration(
        VALIDATING,
        "names",
        &url(port, "/validate", &bundle),
        "CREATE",
        "configmaps",
        "  matchConditions: [{name: typo, expression: \"objct.metadata.name == 'x'\"}]\n",
    );
    let file = c.file("bad.yaml", &bad);
    let err = c.fails(&["apply", "-f", &file]);
    assert!(
        err.contains("webhooks[0].matchConditions[0].expression")
            && err.contains("undeclared reference to 'objct'"),
        "{err}"
    );
}

#[test]
fn failure_policies_decide_what_an_unreachable_webhook_means() {
    let c = Cluster::start();
    let (addr, ca, _seen, _rt) = webhook_server();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    c.ok(&["create", "namespace", "shop"]);
    let dead = support::free_addr();
    let config = |policy: &str, url: &str, timeout: u32| {
        c.file(
            "config.yaml",
            &configuration(
                VALIDATING,
                "gate",
                &format!("{{url: \"{url}\", caBundle: {bundle}}}"),
                "CREATE",
                "secrets",
                &format!("  failurePolicy: {policy}\n  timeoutSeconds: {timeout}\n"),
            ),
        )
    };
    // Fail: nothing reaches the store while the webhook cannot be called.
    c.ok(&[
        "apply",
        "-f",
        &config("Fail", &format!("https://{dead}/x"), 5),
    ]);
    let err = c.fails(&["create", "secret", "generic", "s1", "-n", "shop"]);
    assert!(
        err.contains("Internal error occurred: failed calling webhook \"gate.example.com\""),
        "{err}"
    );
    c.fails(&["get", "secret", "s1", "-n", "shop"]);
    // A webhook slower than its timeout fails too.
    let slow = format!("https://127.0.0.1:{}/slow", addr.port());
    c.ok(&["apply", "-f", &config("Fail", &slow, 1)]);
    let err = c.fails(&["create", "secret", "generic", "s2", "-n", "shop"]);
    assert!(err.contains("deadline exceeded"), "{err}");
    // A certificate that the caBundle did not sign is refused (the wrong CA here).
    let other_ca = tessera_apiserver::pki::agent_tls("127.0.0.1", "x")
        .expect("tls")
        .ca_pem;
    let wrong = c.file(
        "wrong.yaml",
        &std::fs::read_to_string(config(
            "Fail",
            &format!("https://127.0.0.1:{}/validate", addr.port()),
            5,
        ))
        .expect("read")
        .replace(
            &bundle,
            &base64::engine::general_purpose::STANDARD.encode(other_ca),
        ),
    );
    c.ok(&["apply", "-f", &wrong]);
    let err = c.fails(&["create", "secret", "generic", "s3", "-n", "shop"]);
    assert!(err.contains("tls"), "{err}");
    // Ignore: the request goes through, and the skipped call is counted.
    c.ok(&[
        "apply",
        "-f",
        &config("Ignore", &format!("https://{dead}/x"), 5),
    ]);
    c.ok(&["create", "secret", "generic", "s4", "-n", "shop"]);
    let ignored = support::sample(
        &c.metrics_addr,
        "tessera_apiserver_admission_webhook_calls_total{name=\"gate.example.com\",operation=\"CREATE\",outcome=\"ignored\",type=\"validating\"} ",
    );
    assert_eq!(ignored, 1.0);
    // Requests on webhook configurations never go to webhooks: a broken one can be fixed.
    c.ok(&["delete", "validatingwebhookconfiguration", "gate"]);
}

#[test]
fn tenants_cannot_register_webhooks_or_slip_out_of_their_selectors() {
    let c = Cluster::start();
    let (addr, ca, seen, _rt) = webhook_server();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let setup = c.file(
        "tenants.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev, acme-new]}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: acme-dev, labels: {policy: enforced}}\n",
    );
    c.ok(&["create", "-f", &setup]);
    let config = c.file(
        "config.yaml",
        &configuration(
            VALIDATING,
            "names",
            &url(addr.port(), "/validate", &bundle),
            "'*'",
            "'*'",
            "  namespaceSelector: {matchLabels: {policy: enforced}}\n",
        ),
    );
    let acme = support::tenant_token(&c, "acme");
    let as_acme = |args: &[&str]| c.kubectl_as(&acme, args);
    let allowed = |args: &[&str]| {
        let out = as_acme(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
    };
    let refused = |args: &[&str], words: &str| c.refused_as(&acme, args, words);
    // A tenant may not register a webhook: it would see (and could refuse) every tenant's
    // writes.
    refused(&["create", "-f", &config], "Forbidden");
    c.fails(&["get", "validatingwebhookconfiguration", "names"]);
    let spy = c.file(
        "spy.yaml",
        &std::fs::read_to_string(&config)
            .expect("read")
            .replace("name: names", "name: spy"),
    );
    refused(&["apply", "-f", &spy], "Forbidden");

    // The admin's webhook judges the tenant's writes too.
    c.ok(&["create", "-f", &config]);
    refused(
        &["create", "configmap", "bad-x", "-n", "acme-dev"],
        "denied the request",
    );
    allowed(&["create", "configmap", "fine", "-n", "acme-dev"]);
    assert!(
        seen.lock().expect("lock").iter().any(|(_, r)| {
            r["request"]["name"] == "fine" && r["request"]["userInfo"]["username"] == "tenant:acme"
        }),
        "the webhook saw who asked"
    );
    // The tenant cannot take its namespace out of the webhook's selector, nor add the label
    // to a new namespace of its own.
    refused(
        &["label", "namespace", "acme-dev", "policy-"],
        "selects namespaces by label policy",
    );
    refused(
        &[
            "label",
            "namespace",
            "acme-dev",
            "policy=relaxed",
            "--overwrite",
        ],
        "only a cluster admin may set",
    );
    let ns = c.ok(&[
        "get",
        "namespace",
        "acme-dev",
        "-o",
        "jsonpath={.metadata.labels.policy}",
    ]);
    assert_eq!(ns, "enforced");
    refused(
        &["create", "configmap", "bad-y", "-n", "acme-dev"],
        "denied the request",
    );
    // Other labels stay the tenant's to change.
    allowed(&["label", "namespace", "acme-dev", "team=web"]);
    // The common "everything but kube-system" selector reads the name label the server
    // sets on every namespace: it keeps kube-system out and does not stop the tenant from
    // making a namespace of its own.
    let everywhere_but_system = c.file(
        "system.yaml",
        &configuration(
            VALIDATING,
            "system",
            &url(addr.port(), "/validate", &bundle),
            "CREATE",
            "configmaps",
            "  namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system]}]}\n",
        ),
    );
    c.ok(&["create", "-f", &everywhere_but_system]);
    allowed(&["create", "namespace", "acme-new"]);
    let label = c.ok(&[
        "get",
        "namespace",
        "acme-new",
        "-o",
        "jsonpath={.metadata.labels.kubernetes\\.io/metadata\\.name}",
    ]);
    assert_eq!(label, "acme-new");
    refused(
        &["create", "configmap", "bad-z", "-n", "acme-new"],
        "denied the request",
    );
    c.ok(&["create", "configmap", "bad-system", "-n", "kube-system"]);
}

#[test]
fn a_federations_webhooks_judge_the_writes_of_every_shard() {
    let grpc = support::free_addr();
    let grpc_flag = format!("--grpc-addr={grpc}");
    let c = Cluster::start_with("up", &["--shards=2", "--nodes-per-shard=2", &grpc_flag]);
    let ready = support::wait_for(Duration::from_secs(60), || {
        let out = c.ok(&["get", "shards", "--no-headers"]);
        (out.lines().filter(|l| l.contains(" True ")).count() == 2).then_some(())
    });
    assert!(ready.is_some(), "{}", c.ok(&["get", "shards"]));
    let (addr, ca, _seen, _rt) = webhook_server();
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    let port = addr.port();
    let configs = [
        configuration(
            VALIDATING,
            "names",
            &url(port, "/validate", &bundle),
            "CREATE",
            "configmaps",
            "",
        ),
        configuration(
            MUTATING,
            "labels",
            &url(port, "/mutate", &bundle),
            "CREATE",
            "pods",
            "",
        ),
    ];
    // And a ValidatingAdmissionPolicy with its binding: CEL, no webhook to call.
    let policy = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n\
                  metadata: {name: no-nope}\nspec:\n  matchConstraints:\n    resourceRules:\n\
                  \x20   - {apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [secrets]}\n\
                  \x20 validations: [{expression: \"!object.metadata.name.startsWith('nope-')\", message: no nope secrets}]\n\
                  ---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\n\
                  metadata: {name: no-nope}\nspec: {policyName: no-nope, validationActions: [Deny]}\n";
    let configs = c.file("webhooks.yaml", &(configs.join("---\n") + "---\n" + policy));
    c.ok(&["apply", "-f", &configs]);
    c.ok(&["create", "namespace", "shop"]);
    let err = c.fails(&["create", "secret", "generic", "nope-fed", "-n", "shop"]);
    assert!(err.contains("no nope secrets"), "{err}");
    // The federation's own API judges what is written to it.
    let err = c.fails(&["create", "configmap", "bad-fed", "-n", "shop"]);
    assert!(err.contains("denied the request"), "{err}");
    // Every shard holds the configurations and judges its own writes with them.
    for shard in ["shard-0", "shard-1"] {
        let held = support::wait_for(Duration::from_secs(30), || {
            c.kubectl(&[
                "--context",
                shard,
                "get",
                "validatingwebhookconfiguration",
                "names",
            ])
            .status
            .success()
            .then_some(())
        });
        assert!(held.is_some(), "{shard} holds the federation's webhook");
        c.ok(&["--context", shard, "create", "namespace", "direct"]);
        let err = c.fails(&[
            "--context",
            shard,
            "create",
            "configmap",
            "bad-direct",
            "-n",
            "direct",
        ]);
        assert!(
            err.contains("names starting with bad- are refused"),
            "{shard}: {err}"
        );
        let held = support::wait_for(Duration::from_secs(30), || {
            c.kubectl(&[
                "--context",
                shard,
                "get",
                "validatingadmissionpolicy,validatingadmissionpolicybinding",
                "no-nope",
            ])
            .status
            .success()
            .then_some(())
        });
        assert!(
            held.is_some(),
            "{shard} holds the federation's policy and binding"
        );
        let err = c.fails(&[
            "--context",
            shard,
            "create",
            "secret",
            "generic",
            "nope-direct",
            "-n",
            "direct",
        ]);
        assert!(
            err.contains(
                "ValidatingAdmissionPolicy 'no-nope' with binding 'no-nope' denied request: no nope secrets"
            ),
            "{shard}: {err}"
        );
    }
    // Pods the shards' controllers create for a federated Deployment pass the mutating
    // webhook.
    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "-n",
        "shop",
        "--replicas=2",
    ]);
    let labelled = support::wait_for(Duration::from_secs(60), || {
        let found: usize = ["shard-0", "shard-1"]
            .iter()
            .map(|shard| {
                c.ok(&[
                    "--context",
                    shard,
                    "get",
                    "pods",
                    "-n",
                    "shop",
                    "-l",
                    "mutated=yes",
                    "--no-headers",
                ])
                .lines()
                .count()
            })
            .sum();
        (found == 2).then_some(())
    });
    assert!(labelled.is_some(), "both pods were labelled by the webhook");
}
