//! A CRD conversion webhook for the tests: the Route kind, whose `v1` has `spec.host` and
//! `spec.port` and whose `v2` (the storage version) has `spec.address` = `host:port`, and
//! an HTTPS server that converts between them (and, on other paths, refuses, answers
//! wrongly, or records AdmissionReviews).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

/// Every review the webhook server received, by path.
pub type Seen = Arc<Mutex<Vec<(String, Value)>>>;

type Reply = ([(axum::http::header::HeaderName, &'static str); 1], String);

fn reply(review: Value) -> Reply {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        review.to_string(),
    )
}

/// One Route converted to `desired`; it also tries to rename the object (which the
/// server must undo) and notes the conversion in an annotation (which it keeps).
fn convert_route(mut o: Value, desired: &str) -> Value {
    let spec = o["spec"].clone();
    o["spec"] = if desired.ends_with("/v2") && o["apiVersion"] == "example.com/v1" {
        json!({"address": format!("{}:{}", spec["host"].as_str().unwrap_or_default(), spec["port"])})
    } else if desired.ends_with("/v1") && o["apiVersion"] == "example.com/v2" {
        let address = spec["address"].as_str().unwrap_or_default();
        let (host, port) = address.rsplit_once(':').unwrap_or((address, "0"));
        json!({"host": host, "port": port.parse::<u64>().unwrap_or(0)})
    } else {
        spec
    };
    let from = o["apiVersion"].as_str().unwrap_or_default().to_owned();
    o["apiVersion"] = json!(desired);
    o["metadata"]["name"] = json!("hijacked");
    if !o["metadata"]["annotations"].is_object() {
        o["metadata"]["annotations"] = json!({});
    }
    o["metadata"]["annotations"]["example.com/converted-from"] = json!(from);
    o
}

async fn convert(State(seen): State<Seen>, body: Bytes) -> Reply {
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock()
        .expect("lock")
        .push(("convert".into(), review.clone()));
    let req = &review["request"];
    let desired = req["desiredAPIVersion"].as_str().unwrap_or_default();
    let objects: Vec<Value> = req["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| convert_route(o.clone(), desired))
        .collect();
    reply(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": req["uid"], "result": {"status": "Success"}, "convertedObjects": objects},
    }))
}

/// Refuses every conversion.
async fn fail(body: Bytes) -> Reply {
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    reply(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": review["request"]["uid"], "result": {"status": "Failure", "message": "conversions are switched off"}},
    }))
}

/// Answers another review's uid.
async fn wrong_uid(body: Bytes) -> Reply {
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    reply(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": "not-yours", "result": {"status": "Success"}, "convertedObjects": review["request"]["objects"]},
    }))
}

/// Records an AdmissionReview and allows it.
async fn admit(State(seen): State<Seen>, body: Bytes) -> Reply {
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock()
        .expect("lock")
        .push(("admit".into(), review.clone()));
    reply(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": true},
    }))
}

/// The server: its address, the CA (PEM) of its certificate, what it saw, its runtime.
pub fn start() -> (std::net::SocketAddr, String, Seen, tokio::runtime::Runtime) {
    let seen: Seen = Arc::default();
    let router = axum::Router::new()
        .route("/convert", post(convert))
        .route("/fail", post(fail))
        .route("/wrong-uid", post(wrong_uid))
        .route("/admit", post(admit))
        .with_state(seen.clone());
    let (addr, ca, rt) = super::https_server(router, "convert.hooks.svc");
    (addr, ca, seen, rt)
}

/// A CRD whose versions differ in shape: v1 has `spec.host` and `spec.port`, v2 (the
/// storage version) `spec.address` = `host:port`; converted by the test's webhook at
/// `{url}` (a `clientConfig` in flow style).
pub fn route_crd(client: &str) -> String {
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: routes.example.com}}
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: routes, singular: route, kind: Route}}
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v9, v1]
      clientConfig: {client}
  versions:
  - name: v1
    served: true
    storage: false
    additionalPrinterColumns: [{{name: Host, type: string, jsonPath: .spec.host}}, {{name: Port, type: integer, jsonPath: .spec.port}}]
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [host]
            properties:
              host: {{type: string}}
              port: {{type: integer, minimum: 1, maximum: 65535, default: 80}}
  - name: v2
    served: true
    storage: true
    additionalPrinterColumns: [{{name: Address, type: string, jsonPath: .spec.address}}]
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              address: {{type: string, pattern: '^[a-z0-9.-]+:[0-9]+$'}}
"#
    )
}

/// A `clientConfig` (flow style) calling `path` on the server at `addr`, trusting `ca_pem`.
pub fn client_config(addr: std::net::SocketAddr, ca_pem: &str, path: &str) -> String {
    use base64::Engine;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "{{url: \"https://127.0.0.1:{}{path}\", caBundle: {bundle}}}",
        addr.port()
    )
}

/// Sets Route `name`'s port in namespace `shop` with a merge patch through v1.
pub fn set_port(c: &super::Cluster, name: &str, port: u16) {
    let patch = format!("{{\"spec\":{{\"port\":{port}}}}}");
    c.ok(&[
        "patch",
        "routes.v1.example.com",
        name,
        "-n",
        "shop",
        "--type=merge",
        "-p",
        &patch,
    ]);
}
