//! Fuzzing the request path (property tests): arbitrary bytes, arbitrary URLs and mutated
//! valid objects thrown at the in-process API over a real embedded store. Nothing panics;
//! every rejection is a 4xx `Status`; a rejected request changes nothing (the store's
//! revision does not move).
//!
//! `TESSERA_FUZZ_CASES=N` sets the number of inputs per property (256 by default, as CI runs).

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Value, json};
use tessera_apiserver::api::{Api, ApiResponse};
use tessera_apiserver::auth::User;
use tessera_apiserver::catalog::RESOURCES;
use tessera_apiserver::request::{self, ApiRequest, PatchType, Verb};
use tessera_store::{EmbeddedOptions, EmbeddedStore, Store, StoreMetrics};

fn cases() -> u32 {
    std::env::var("TESSERA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

struct Harness {
    rt: tokio::runtime::Runtime,
    api: Api,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

fn harness() -> Harness {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = rt.block_on(async {
        let metrics = StoreMetrics::register(&prometheus::Registry::new()).expect("metrics");
        Arc::new(
            EmbeddedStore::open(dir.path(), EmbeddedOptions::small(), metrics)
                .await
                .expect("store"),
        )
    });
    let api = Api::new(store.clone(), None);
    let h = Harness {
        rt,
        api,
        store,
        _dir: dir,
    };
    for obj in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fz"}}),
        valid("ConfigMap"),
        valid("Deployment"),
        valid("Pod"),
        valid("Role"),
        valid("RoleBinding"),
        valid("CustomResourceDefinition"),
        valid("Widget"),
        valid("HorizontalPodAutoscaler"),
        valid("HorizontalPodAutoscaler/v1"),
        valid("CertificateSigningRequest"),
    ] {
        let kind = obj["kind"].as_str().expect("kind");
        let res = if obj["apiVersion"] == "autoscaling/v1" {
            resource_of("HorizontalPodAutoscaler/v1")
        } else {
            resource_of(kind)
        };
        let mut req = ApiRequest::new(Verb::Create, res);
        if res.namespaced {
            req.namespace = Some("fz".into());
        }
        req.body = Bytes::from(obj.to_string());
        h.rt.block_on(h.api.handle(&User::Admin, req))
            .expect("seed object");
    }
    h
}

/// The resource of `kind`: built in, or the Widget the harness's CRD defines (as the CRD
/// was created: a mutated CRD may no longer serve it, which its requests then find out).
fn resource_of(kind: &str) -> &'static tessera_apiserver::catalog::Resource {
    if kind == "HorizontalPodAutoscaler/v1" {
        return tessera_apiserver::catalog::find("autoscaling", "v1", "horizontalpodautoscalers")
            .expect("the v1 view");
    }
    RESOURCES
        .iter()
        .find(|r| r.kind == kind)
        .unwrap_or_else(|| {
            tessera_apiserver::catalog::custom_resource(&valid("CustomResourceDefinition"), "v1")
                .expect("the CRD defines v1")
        })
}

fn valid(kind: &str) -> Value {
    match kind {
        // A CRD whose schema has each kind of check the server makes.
        "CustomResourceDefinition" => {
            let spec = json!({"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                "replicas": {"type": "integer", "default": 1},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                "port": {"x-kubernetes-int-or-string": true},
                "tags": {"type": "array", "x-kubernetes-list-type": "set",
                    "items": {"type": "string"}},
                "ports": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "required": ["name"], "properties": {
                        "name": {"type": "string"}, "port": {"type": "integer", "default": 80}}}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
                "x-kubernetes-validations": [
                    {"rule": "self.size >= self.replicas", "message": "size below replicas"},
                    {"rule": "self.replicas >= oldSelf.replicas", "reason": "FieldValueForbidden",
                     "fieldPath": ".replicas"},
                    {"rule": "!has(self.tags) || self.tags.all(t, t.size() < 8)",
                     "messageExpression": "'bad tags: ' + self.tags.join(',')"}]});
            let schema = json!({"type": "object", "properties": {"spec": spec,
                "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}});
            let version = json!({"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas"}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                "schema": {"openAPIV3Schema": schema}});
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "widgets.example.com"},
                "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "kind": "Widget"}, "versions": [version]}})
        }
        "Widget" => json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w"}, "spec": {"size": 3, "name": "abc", "port": "http",
                "tags": ["a", "b"], "ports": [{"name": "http", "port": 8080}],
                "extra": {"anything": [1, {"x": null}]}, "labels": {"a": "b"}}}),
        "Deployment" => json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"app": "d"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
                "template": {"metadata": {"labels": {"app": "d"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx",
                        "resources": {"requests": {"cpu": "100m"}}, "ports": [{"containerPort": 80}]}]}}}}),
        "HorizontalPodAutoscaler" => json!({"apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"},
                "minReplicas": 1, "maxReplicas": 5,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": 60}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"},
                    "target": {"type": "AverageValue", "averageValue": "10"}}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 30}]}}}}),
        // The v1 view: converted on the way in and out.
        "HorizontalPodAutoscaler/v1" => json!({"apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h1",
                "annotations": {"autoscaling.alpha.kubernetes.io/behavior":
                    "{\"scaleUp\":{\"policies\":[{\"type\":\"Pods\",\"value\":2,\"periodSeconds\":60}]}}"}},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"},
                "minReplicas": 1, "maxReplicas": 5, "targetCPUUtilizationPercentage": 50}}),
        "Pod" => json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "1"}]}]}}),
        "Service" => json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"selector": {"app": "d"}, "ports": [{"port": 80}]}}),
        // Webhooks of every option, unreachable (nothing listens on port 1).
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": "hooks"}, "webhooks": [{"name": "a.example.com",
                "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
                "timeoutSeconds": 5, "matchPolicy": "Exact",
                "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]},
                "objectSelector": {"matchLabels": {"c": "d"}},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                    "resources": ["configmaps", "pods/status"], "scope": "Namespaced"}],
                "matchConditions": [{"name": "named", "expression": "object.metadata.name != 'x'"}],
                "clientConfig": {"url": "https://127.0.0.1:1/x"}},
                {"name": "b.example.com", "sideEffects": "NoneOnDryRun", "admissionReviewVersions": ["v1"],
                "rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"]}],
                "clientConfig": {"service": {"namespace": "fz", "name": "hook", "port": 8443, "path": "/v"}}}]})
        }
        // A policy of every option, and a binding of it with a parameter.
        "ValidatingAdmissionPolicy" => json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind, "metadata": {"name": "limits"}, "spec": {"failurePolicy": "Ignore",
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["deployments"],
                    "resourceNames": ["d"]}],
                    "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                        "operations": ["*"], "resources": ["pods"]}],
                    "namespaceSelector": {"matchLabels": {"a": "b"}}, "matchPolicy": "Exact"},
                "matchConditions": [{"name": "named", "expression": "object.metadata.name != 'x'"}],
                "variables": [{"name": "limit", "expression": "int(params.data.max)"}],
                "validations": [{"expression": "object.spec.replicas <= variables.limit",
                    "messageExpression": "'over ' + string(variables.limit)", "reason": "Forbidden"}],
                "auditAnnotations": [{"key": "replicas", "valueExpression": "string(object.spec.replicas)"}]}}),
        "ValidatingAdmissionPolicyBinding" => {
            json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind, "metadata": {"name": "limits"}, "spec": {"policyName": "limits",
                "validationActions": ["Warn", "Audit"],
                "paramRef": {"name": "cm", "namespace": "fz", "parameterNotFoundAction": "Allow"},
                "matchResources": {"objectSelector": {"matchLabels": {"app": "d"}}}}})
        }
        "Role" => json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"],
                "verbs": ["get", "list"], "resourceNames": ["p"]}]}),
        "RoleBinding" => {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "rb"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role", "name": "r"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "u"},
                {"kind": "ServiceAccount", "name": "default", "namespace": "fz"}]})
        }
        "CertificateSigningRequest" => json!({"apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest", "metadata": {"name": "csr"},
            "spec": {"request": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0KTUlJQlZqQ0IvUUlCQURBYk1Sa3dGd1lEVlFRRERCQnRlUzExYzJWeUxtVjRZVzF3YkdVdwotLS0tLUVORCBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K",
                "signerName": "example.com/users", "usages": ["client auth"],
                "expirationSeconds": 3600},
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "R"}]}}),
        "Tenant" => json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": "t"}, "spec": {"namespaces": ["fz"], "weight": 1}}),
        _ => json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
            "data": {"k": "v"}}),
    }
}

/// Every key and value in the store.
fn contents(h: &Harness) -> Vec<(Bytes, Bytes)> {
    let page =
        h.rt.block_on(h.store.list(tessera_store::ListRequest {
            prefix: Bytes::from_static(b"/"),
            ..Default::default()
        }))
        .expect("list");
    page.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect()
}

/// Sends `req`; checks the outcome is a success or a 4xx that changed nothing. ("Nothing" is
/// the store's contents: a create that took a Service address and gave it back when it
/// failed moved the revision, but left every key as it was.)
fn check(h: &Harness, req: ApiRequest) -> Result<(), TestCaseError> {
    let before = contents(h);
    let result = h.rt.block_on(h.api.handle(&User::Admin, req.clone()));
    match result {
        Ok(ApiResponse::Object { code, .. }) => {
            prop_assert!((200..300).contains(&code), "{code} for {req:?}");
        }
        Ok(ApiResponse::Encoded { code, body }) => {
            prop_assert!((200..300).contains(&code), "{code} for {req:?}");
            prop_assert!(
                serde_json::from_slice::<Value>(&body).is_ok(),
                "the answer is JSON"
            );
        }
        Ok(ApiResponse::Watch(_) | ApiResponse::Stream { .. }) => {}
        Err(e) => {
            prop_assert!(
                (400..500).contains(&e.code),
                "{} {}: {} for {:?} body {:?}",
                e.code,
                e.reason,
                e.message,
                req.verb,
                String::from_utf8_lossy(&req.body)
            );
            prop_assert!(!e.message.is_empty());
            let status = e.to_status();
            prop_assert_eq!(&status["kind"], "Status");
            let after = contents(h);
            prop_assert!(before == after, "a rejected request changed the store");
        }
    }
    Ok(())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-zA-Z0-9 ./:_-]{0,12}".prop_map(Value::from),
        "\\PC{0,40}".prop_map(Value::from),
        Just(Value::from("x".repeat(300))),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z$/.]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A change to a JSON document: set a path to a value, remove it, or add an unknown field.
#[derive(Clone, Debug)]
enum Mutation {
    Set(Vec<usize>, Value),
    Remove(Vec<usize>),
    Insert(Vec<usize>, String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(0usize..8, 0..6);
    prop_oneof![
        (path.clone(), json_value()).prop_map(|(p, v)| Mutation::Set(p, v)),
        path.clone().prop_map(Mutation::Remove),
        (path, "[a-zA-Z]{1,8}", json_value()).prop_map(|(p, k, v)| Mutation::Insert(p, k, v)),
    ]
}

/// Follows `path` (child indices, modulo the number of children) as deep as it goes.
fn target<'a>(doc: &'a mut Value, path: &[usize]) -> &'a mut Value {
    let mut cur = doc;
    for i in path {
        let n = match cur {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if n == 0 {
            break;
        }
        cur = match cur {
            Value::Object(m) => m.values_mut().nth(i % n).expect("in range"),
            Value::Array(a) => &mut a[i % n],
            _ => unreachable!("n > 0 only for containers"),
        };
    }
    cur
}

fn mutate(mut doc: Value, muts: &[Mutation]) -> Value {
    for m in muts {
        match m {
            Mutation::Set(p, v) => *target(&mut doc, p) = v.clone(),
            Mutation::Remove(p) => {
                if let Some((last, parent)) = p.split_last() {
                    match target(&mut doc, parent) {
                        Value::Object(map) if !map.is_empty() => {
                            let k = map.keys().nth(last % map.len()).cloned();
                            if let Some(k) = k {
                                map.remove(&k);
                            }
                        }
                        Value::Array(a) if !a.is_empty() => {
                            let n = a.len();
                            a.remove(last % n);
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Insert(p, k, v) => {
                if let Value::Object(map) = target(&mut doc, p) {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
    }
    doc
}

fn resource_index() -> impl Strategy<Value = usize> {
    0..RESOURCES.len()
}

fn verb() -> impl Strategy<Value = Verb> {
    prop_oneof![
        Just(Verb::Create),
        Just(Verb::Update),
        Just(Verb::Patch(PatchType::Json)),
        Just(Verb::Patch(PatchType::Merge)),
        Just(Verb::Patch(PatchType::StrategicMerge)),
        Just(Verb::Patch(PatchType::Apply)),
        Just(Verb::Delete),
        Just(Verb::Get),
        Just(Verb::List),
    ]
}

fn request_for(
    res: &'static tessera_apiserver::catalog::Resource,
    verb: Verb,
    name: &str,
    body: Vec<u8>,
) -> ApiRequest {
    let mut req = ApiRequest::new(verb, res);
    if res.namespaced {
        req.namespace = Some("fz".into());
    }
    if !matches!(verb, Verb::Create | Verb::List) {
        req.name = Some(name.to_owned());
    }
    if matches!(verb, Verb::Patch(PatchType::Apply)) {
        req.params.field_manager = Some("fuzz".into());
    }
    req.body = Bytes::from(body);
    req
}

#[test]
fn arbitrary_bodies_are_refused_cleanly() {
    let h = harness();
    let n = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(cases()), |(
        res_i in resource_index(),
        verb in verb(),
        name in prop_oneof![Just("cm".to_owned()), Just("d".to_owned()), "[a-z]{1,5}", "\\PC{0,10}"],
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..512),
            json_value().prop_map(|v| v.to_string().into_bytes()),
        ],
    )| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = if name.is_empty() { "x".to_owned() } else { name };
        check(&h, request_for(&RESOURCES[res_i], verb, &name, body))?;
    });
    println!("arbitrary bodies: {} inputs", n.into_inner());
}

#[test]
fn mutated_objects_are_accepted_or_refused_cleanly() {
    let h = harness();
    let n = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(cases()), |(
        kind in prop_oneof![Just("Deployment"), Just("Pod"), Just("ConfigMap"), Just("Service"),
            Just("Tenant"), Just("Role"), Just("RoleBinding"), Just("CustomResourceDefinition"),
            Just("Widget"), Just("HorizontalPodAutoscaler"), Just("HorizontalPodAutoscaler/v1"),
            Just("CertificateSigningRequest")],
        muts in prop::collection::vec(mutation(), 1..5),
        verb in verb(),
    )| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = valid(kind);
        let doc = mutate(base.clone(), &muts);
        let name = base["metadata"]["name"].as_str().expect("name").to_owned();
        // Deleting the CRD would delete its objects in the background, under the checks of
        // the requests that follow: it is read instead.
        let verb = if kind == "CustomResourceDefinition" && verb == Verb::Delete { Verb::Get } else { verb };
        check(&h, request_for(resource_of(kind), verb, &name, doc.to_string().into_bytes()))?;
    });
    println!("mutated objects: {} inputs", n.into_inner());
}

/// Webhook configurations and admission policies with their bindings, mutated, in a harness
/// of their own: one that a mutation left failing closed on every request would rightly
/// fail the other tests' requests (requests on them never go to webhooks or policies).
#[test]
fn mutated_webhook_configurations_are_accepted_or_refused_cleanly() {
    let h = harness();
    let n = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(cases()), |(
        kind in prop_oneof![Just("ValidatingWebhookConfiguration"), Just("MutatingWebhookConfiguration"),
            Just("ValidatingAdmissionPolicy"), Just("ValidatingAdmissionPolicyBinding")],
        muts in prop::collection::vec(mutation(), 1..5),
        verb in verb(),
    )| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = valid(kind);
        let doc = mutate(base.clone(), &muts);
        let name = base["metadata"]["name"].as_str().expect("name").to_owned();
        check(&h, request_for(resource_of(kind), verb, &name, doc.to_string().into_bytes()))?;
    });
    println!("mutated webhook configurations: {} inputs", n.into_inner());
}

#[test]
fn arbitrary_protobuf_bodies_never_panic() {
    let n = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(cases() * 4), |(
        kind in prop_oneof![Just("Namespace".to_owned()), Just("ConfigMap".to_owned()), Just("Secret".to_owned()), Just("Deployment".to_owned()), Just("Pod".to_owned()), Just("Service".to_owned()), "[A-Z][a-z]{0,8}"],
        api_version in prop_oneof![Just("v1".to_owned()), Just("apps/v1".to_owned()), Just("batch/v1".to_owned()), "[a-z/0-9.]{0,12}"],
        raw in prop::collection::vec(any::<u8>(), 0..256),
    )| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tm = Vec::new();
        for (tag, s) in [(1u8, api_version.as_bytes()), (2u8, kind.as_bytes())] {
            tm.push(tag << 3 | 2);
            tm.push(s.len() as u8);
            tm.extend_from_slice(s);
        }
        let mut body = b"k8s\0".to_vec();
        body.push(1 << 3 | 2);
        body.push(tm.len() as u8);
        body.extend_from_slice(&tm);
        body.push(2 << 3 | 2);
        body.extend_from_slice(&[(raw.len() as u8 & 0x7f) | 0x80, (raw.len() >> 7) as u8]);
        body.extend_from_slice(&raw);
        // Ok or a reason; never a panic.
        let _ = tessera_apiserver::protobuf::decode_body(&body);
        let _ = tessera_apiserver::protobuf::decode_body(&raw);
    });
    println!("protobuf bodies: {} inputs", n.into_inner());
}

#[test]
fn arbitrary_yaml_never_panics() {
    let n = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(cases() * 4), |(
        text in prop_oneof![
            "\\PC{0,200}",
            "[-:\\[\\]{}&*!|>'\"#? \n a-z0-9]{0,200}",
            json_value().prop_map(|v| v.to_string()),
        ],
    )| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Ok or a reason; never a panic, never a stack overflow.
        let _ = tessera_apiserver::yaml::to_json(text.as_bytes());
    });
    println!("yaml bodies: {} inputs", n.into_inner());
}

#[test]
fn arbitrary_urls_are_refused_cleanly() {
    let n = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig::with_cases(cases() * 4), |(
        method in prop_oneof![Just("GET".to_owned()), Just("POST".to_owned()), Just("PUT".to_owned()), Just("PATCH".to_owned()), Just("DELETE".to_owned()), "[A-Z]{1,7}"],
        segments in prop::collection::vec(prop_oneof![
            Just("api".to_owned()), Just("apis".to_owned()), Just("v1".to_owned()),
            Just("apps".to_owned()), Just("namespaces".to_owned()), Just("pods".to_owned()),
            Just("deployments".to_owned()), Just("status".to_owned()), Just("scale".to_owned()),
            "[a-z0-9.%-]{0,6}",
        ], 0..8),
        query in "[a-zA-Z=&%0-9,!()_.-]{0,40}",
        content_type in prop_oneof![Just(None), Just(Some("application/json")), Just(Some("application/merge-patch+json")), "\\PC{0,20}".prop_map(|_| Some("text/plain"))],
    )| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = format!("/{}", segments.join("/"));
        match request::from_http(&method, &path, &query, content_type, None, Bytes::new()) {
            Ok(_) => {}
            Err(e) => prop_assert!((400..500).contains(&e.code), "{} for {method} {path}?{query}", e.code),
        }
    });
    println!("urls: {} inputs", n.into_inner());
}
