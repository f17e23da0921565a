//! What a client of Kubernetes sees, byte for byte where clients compare bytes: strict field
//! validation reports unknown fields whatever their value and before validation; objects of
//! every kind come back without null members, with the status stanza Kubernetes always
//! returns, in Kubernetes' field order; `Status` errors are written as Kubernetes writes them.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tessera_apiserver::api::Api;
use tessera_apiserver::auth::User;
use tessera_apiserver::catalog::{RESOURCES, Resource};
use tessera_apiserver::client::{Client, InProcess};
use tessera_apiserver::http;
use tessera_apiserver::request::{ApiRequest, FieldValidation, Verb};
use tessera_store::{EmbeddedOptions, EmbeddedStore, StoreMetrics};

struct Setup {
    client: InProcess,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let store = Arc::new(
        EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
            .await
            .expect("store"),
    );
    let client = InProcess::new(Api::new(store, None), User::Admin);
    let ns = resource("Namespace");
    client
        .create(ns, None, &json!({"metadata": {"name": "t"}}))
        .await
        .expect("namespace");
    Setup { client, _dir: dir }
}

fn resource(kind: &str) -> &'static Resource {
    RESOURCES.iter().find(|r| r.kind == kind).expect("served")
}

/// The bytes an HTTP client receives for this request.
async fn raw(c: &InProcess, req: ApiRequest) -> (u16, Bytes) {
    let resp = http::encode(c.call(req).await);
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, body)
}

fn create(kind: &str, body: &Value, validation: FieldValidation) -> ApiRequest {
    let res = resource(kind);
    let mut req = ApiRequest::new(Verb::Create, res);
    if res.namespaced {
        req.namespace = Some("t".into());
    }
    req.params.field_validation = validation;
    req.body = Bytes::from(body.to_string());
    req
}

fn get(kind: &str, name: &str) -> ApiRequest {
    let res = resource(kind);
    let mut req = ApiRequest::new(Verb::Get, res);
    if res.namespaced {
        req.namespace = Some("t".into());
    }
    req.name = Some(name.into());
    req
}

fn container() -> Value {
    json!({"name": "c", "image": "busybox:1.36"})
}

fn template(app: &str) -> Value {
    json!({"metadata": {"labels": {"app": app}}, "spec": {"containers": [container()]}})
}

/// A minimal valid object of every kind a client can create, as a user would write it.
fn minimal(kind: &str) -> Option<Value> {
    let meta = json!({"name": "x"});
    let selector = json!({"matchLabels": {"app": "x"}});
    Some(match kind {
        "Namespace" => json!({"metadata": {"name": "x"}}),
        "Pod" => json!({"metadata": meta, "spec": {"containers": [container()]}}),
        "Node" => json!({"metadata": meta}),
        "Service" => {
            json!({"metadata": meta, "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}})
        }
        "Endpoints" => json!({"metadata": meta, "subsets": []}),
        "Event" => {
            json!({"metadata": meta, "involvedObject": {"kind": "Pod", "name": "x", "namespace": "t"}, "reason": "R", "message": "m"})
        }
        "ConfigMap" => json!({"metadata": meta, "data": {"k": "v"}}),
        "Secret" => json!({"metadata": meta, "stringData": {"k": "v"}}),
        "ResourceQuota" => json!({"metadata": meta, "spec": {"hard": {"pods": "10"}}}),
        "LimitRange" => {
            json!({"metadata": meta, "spec": {"limits": [{"type": "Container", "default": {"cpu": "1"}}]}})
        }
        "ServiceAccount" => json!({"metadata": meta}),
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" => {
            json!({"metadata": meta, "spec": {"selector": selector, "template": template("x")}})
        }
        "ControllerRevision" => json!({"metadata": meta, "revision": 1}),
        "Job" => {
            json!({"metadata": meta, "spec": {"template": {"spec": {"containers": [container()], "restartPolicy": "Never"}}}})
        }
        "CronJob" => {
            json!({"metadata": meta, "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": {"containers": [container()], "restartPolicy": "Never"}}}}}})
        }
        "Lease" => json!({"metadata": meta, "spec": {"holderIdentity": "h"}}),
        "PriorityClass" => json!({"metadata": meta, "value": 1000}),
        "PodDisruptionBudget" => {
            json!({"metadata": meta, "spec": {"minAvailable": 1, "selector": selector}})
        }
        "PersistentVolumeClaim" => json!({"metadata": meta, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        "PersistentVolume" => json!({"metadata": meta, "spec": {"capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/pv"}}}),
        "PodTemplate" => {
            json!({"metadata": meta, "template": {"spec": {"containers": [container()]}}})
        }
        "Ingress" => json!({"metadata": meta, "spec": {"rules": [{"host": "a.example",
            "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
        "IngressClass" => json!({"metadata": meta, "spec": {"controller": "example.com/ingress"}}),
        "NetworkPolicy" => {
            json!({"metadata": meta, "spec": {"podSelector": {"matchLabels": {"app": "x"}}}})
        }
        "StorageClass" => json!({"metadata": meta, "provisioner": "tessera.io/hostpath"}),
        // A webhook with nothing to reach: it selects no request (no rules).
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => json!({
            "metadata": meta, "webhooks": [{"name": "x.example.com", "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": "https://127.0.0.1:1/x"}}]}),
        // A policy that selects nothing the test writes, and a binding of it.
        "ValidatingAdmissionPolicy" => json!({"metadata": meta, "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["example.com"],
                "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["nothings"]}]},
            "validations": [{"expression": "true"}]}}),
        "ValidatingAdmissionPolicyBinding" => json!({"metadata": meta, "spec": {
            "policyName": "x", "validationActions": ["Deny"]}}),
        // A certificate request: PEM text, base64 in JSON.
        "CertificateSigningRequest" => json!({"metadata": meta, "spec": {
            "request": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0KTUlJQlZqQ0IvUUlCQURBYk1Sa3dGd1lEVlFRRERCQnRlUzExYzJWeUxtVjRZVzF3YkdVdwotLS0tLUVORCBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K",
            "signerName": "example.com/users", "usages": ["client auth"]}}),
        // An APIService's name is its version and group.
        "APIService" => json!({"metadata": {"name": "v1.example.com"}, "spec": {
            "group": "example.com", "version": "v1", "groupPriorityMinimum": 100,
            "versionPriority": 10}}),
        // A CRD's name is its plural and group.
        "CustomResourceDefinition" => json!({"metadata": {"name": "xs.example.com"}, "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"plural": "xs", "kind": "X"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object"}}}]}}),
        "Role" | "ClusterRole" => json!({"metadata": meta, "rules": [{"apiGroups": [""],
            "resources": ["pods"], "verbs": ["get"]}]}),
        "RoleBinding" | "ClusterRoleBinding" => json!({"metadata": meta, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "x-ns"}]}),
        "Tenant" => json!({"metadata": meta, "spec": {"namespaces": ["x-ns"]}}),
        "PodGroup" => json!({"metadata": meta, "spec": {"minMember": 2}}),
        "ReplicationController" => json!({"metadata": meta, "spec": {"replicas": 0,
            "template": {"metadata": {"labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
        "HorizontalPodAutoscaler" => json!({"metadata": meta, "spec": {"maxReplicas": 3,
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"}}}),
        "Shard" => json!({"metadata": meta, "spec": {"unschedulable": false}}),
        "ShardMap" => json!({"metadata": meta, "spec": {"version": 1,
            "shards": [{"name": "shard-0", "weight": 160}]}}),
        "Placement" => json!({"metadata": meta, "spec": {
            "resourceSelectors": [{"kind": "Deployment"}],
            "replicas": {"scheduling": "Divided", "division": "Capacity"}}}),
        _ => return None,
    })
}

/// The status stanza Kubernetes returns for a new object of `kind` (Go serializes status
/// structs even when empty, and their fields that are not `omitempty`).
fn expected_status(kind: &str) -> Option<Value> {
    Some(match kind {
        "Namespace" => json!({"phase": "Active"}),
        "Pod" => json!({"phase": "Pending", "qosClass": "BestEffort"}),
        "Service" | "Ingress" => json!({"loadBalancer": {}}),
        "PersistentVolumeClaim" | "PersistentVolume" => json!({"phase": "Pending"}),
        "Deployment" | "Job" | "CronJob" => json!({}),
        "ReplicaSet" | "ReplicationController" => json!({"replicas": 0}),
        "HorizontalPodAutoscaler" => json!({"desiredReplicas": 0}),
        "StatefulSet" => json!({"replicas": 0, "availableReplicas": 0}),
        "DaemonSet" => json!({"currentNumberScheduled": 0, "numberMisscheduled": 0,
            "desiredNumberScheduled": 0, "numberReady": 0}),
        "PodDisruptionBudget" => json!({"disruptionsAllowed": 0, "currentHealthy": 0,
            "desiredHealthy": 0, "expectedPods": 0}),
        _ => return None,
    })
}

fn nulls(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Null => out.push(path.to_owned()),
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| nulls(v, &format!("{path}.{k}"), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| nulls(v, &format!("{path}[{i}]"), out)),
        _ => {}
    }
}

/// Every kind's create and read: no nulls (its defaulting once added `ports: null` and
/// `initContainers: null`), the status stanza, and the envelope's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_is_served_without_nulls_with_its_status_in_kubernetes_order() {
    let s = setup().await;
    let subresource_kinds = ["Binding", "Scale", "Eviction"];
    for res in RESOURCES {
        if subresource_kinds.contains(&res.kind) {
            continue;
        }
        let body =
            minimal(res.kind).unwrap_or_else(|| panic!("add a minimal {} to this test", res.kind));
        let (code, created) =
            raw(&s.client, create(res.kind, &body, FieldValidation::Strict)).await;
        assert!(
            code == 201 || code == 200,
            "{}: {code} {}",
            res.kind,
            String::from_utf8_lossy(&created)
        );
        let name = body["metadata"]["name"].as_str().expect("a name");
        let (code, read) = raw(&s.client, get(res.kind, name)).await;
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&read));
        for (how, bytes) in [("create", &created), ("get", &read)] {
            let text = String::from_utf8_lossy(bytes);
            let want_prefix = format!(
                r#"{{"kind":"{}","apiVersion":"{}","metadata":{{"name":"{name}","#,
                res.kind,
                if res.group.is_empty() {
                    res.version.to_owned()
                } else {
                    format!("{}/{}", res.group, res.version)
                }
            );
            assert!(
                text.starts_with(&want_prefix),
                "{} {how}: Kubernetes' order, got {text}",
                res.kind
            );
            let v: Value = serde_json::from_slice(bytes).expect("JSON");
            let mut found = Vec::new();
            nulls(&v, "", &mut found);
            assert!(found.is_empty(), "{} {how}: nulls at {found:?}", res.kind);
            if let Some(status) = expected_status(res.kind) {
                assert_eq!(v["status"], status, "{} {how}: status stanza", res.kind);
            }
            if res.kind != "Namespace" && res.namespaced {
                let meta_order = [
                    "\"name\":",
                    "\"namespace\":",
                    "\"uid\":",
                    "\"resourceVersion\":",
                    "\"creationTimestamp\":",
                ];
                let at: Vec<usize> = meta_order
                    .iter()
                    .map(|k| {
                        text.find(k)
                            .unwrap_or_else(|| panic!("{} has {k}", res.kind))
                    })
                    .collect();
                assert!(
                    at.windows(2).all(|w| w[0] < w[1]),
                    "{} {how}: ObjectMeta's order in {text}",
                    res.kind
                );
            }
            if v.get("spec").is_some() && v.get("status").is_some() {
                assert!(
                    text.find(r#","spec":"#) < text.find(r#","status":"#),
                    "{} {how}: spec before status",
                    res.kind
                );
            }
        }
    }
}

/// kubectl sends `fieldValidation=Strict`: a misspelt field is refused whatever its value,
/// and reported before the validation error it causes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_whatever_their_value_and_first() {
    let s = setup().await;
    for (body, unknown) in [
        (
            json!({"metadata": {"name": "a"}, "spec": {"containerz": [], "containers": [container()]}}),
            r#"unknown field \"spec.containerz\""#,
        ),
        (
            json!({"metadata": {"name": "b"}, "spec": {"containerz": []}}),
            r#"unknown field \"spec.containerz\""#,
        ),
        (
            json!({"metadata": {"name": "c", "labelz": {}}, "spec": {"containers": [container()]}}),
            r#"unknown field \"metadata.labelz\""#,
        ),
    ] {
        let (code, answer) = raw(&s.client, create("Pod", &body, FieldValidation::Strict)).await;
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(code, 400, "{text}");
        assert!(text.contains("strict decoding error"), "{text}");
        assert!(text.contains(unknown), "{text}");
        assert!(!text.contains("Required value"), "{text}");
        // Nothing was written.
        let name = body["metadata"]["name"].as_str().expect("name");
        assert_eq!(raw(&s.client, get("Pod", name)).await.0, 404);
    }
    // Warn: created, with a warning naming the field; Ignore: created quietly.
    let body =
        json!({"metadata": {"name": "w"}, "spec": {"containerz": [], "containers": [container()]}});
    match s
        .client
        .call(create("Pod", &body, FieldValidation::Warn))
        .await
    {
        Ok(tessera_apiserver::api::ApiResponse::Object { warnings, .. }) => {
            assert_eq!(
                warnings,
                vec![r#"unknown field "spec.containerz""#.to_owned()]
            );
        }
        _ => panic!("created with a warning"),
    }
    let body =
        json!({"metadata": {"name": "i"}, "spec": {"containerz": [], "containers": [container()]}});
    assert_eq!(
        raw(&s.client, create("Pod", &body, FieldValidation::Ignore))
            .await
            .0,
        201
    );
}

/// A Status is written in Kubernetes' field order: clients compare error bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_written_as_kubernetes_writes_them() {
    let s = setup().await;
    let (code, body) = raw(&s.client, get("Pod", "nope")).await;
    assert_eq!(code, 404);
    assert_eq!(
        String::from_utf8_lossy(&body),
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"nope\" not found","reason":"NotFound","details":{"name":"nope","kind":"pods"},"code":404}"#
    );
    let invalid = json!({"metadata": {"name": "Bad_Name"}, "data": {}});
    let (code, body) = raw(
        &s.client,
        create("ConfigMap", &invalid, FieldValidation::Strict),
    )
    .await;
    assert_eq!(code, 422);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": "#),
        "{text}"
    );
    assert!(
        text.contains(r#""reason":"Invalid","details":{"name":"Bad_Name","kind":"ConfigMap","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"Bad_Name\": "#),
        "{text}"
    );
    assert!(text.ends_with(r#"}]},"code":422}"#), "{text}");
}
