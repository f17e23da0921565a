//! What a workload takes along to every shard it lands in: the ConfigMaps and Secrets its
//! pods mount or read (volumes, projected volumes, `env` and `envFrom`, image pull
//! secrets), its ServiceAccount, and the Services whose selector picks its pods. Each goes
//! as a manifest — identity, labels, annotations and content, not the federation's
//! bookkeeping — that the shard's agent server-side applies before the workload, so a change
//! at the federation reaches the shards too.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodSpec, Service};
use serde_json::{Value, json};
use tessera_client::types::FEDERATED_LABEL;

/// The objects a pod template names, by kind.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Refs {
    /// ConfigMaps by name.
    pub config_maps: BTreeSet<String>,
    /// Secrets by name.
    pub secrets: BTreeSet<String>,
    /// The ServiceAccount, unless it is `default` (every namespace of a shard has its own).
    pub service_account: Option<String>,
}

/// What `spec` names.
pub fn referenced(spec: &PodSpec) -> Refs {
    let mut r = Refs::default();
    for v in spec.volumes.iter().flatten() {
        if let Some(n) = v.config_map.as_ref().map(|c| c.name.clone()) {
            r.config_maps.insert(n);
        }
        if let Some(n) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            r.secrets.insert(n);
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &s.config_map {
                r.config_maps.insert(c.name.clone());
            }
            if let Some(c) = &s.secret {
                r.secrets.insert(c.name.clone());
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(k) = &from.config_map_key_ref {
                    r.config_maps.insert(k.name.clone());
                }
                if let Some(k) = &from.secret_key_ref {
                    r.secrets.insert(k.name.clone());
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(k) = &f.config_map_ref {
                r.config_maps.insert(k.name.clone());
            }
            if let Some(k) = &f.secret_ref {
                r.secrets.insert(k.name.clone());
            }
        }
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        r.secrets.insert(s.name.clone());
    }
    r.service_account = spec
        .service_account_name
        .clone()
        .filter(|n| !n.is_empty() && n != "default");
    r.config_maps.retain(|n| !n.is_empty());
    r.secrets.retain(|n| !n.is_empty());
    r
}

/// Whether `svc` selects pods labelled `labels` (a Service without a selector selects none).
pub fn selects(svc: &Service, labels: &BTreeMap<String, String>) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// `obj` as a shard should hold it: apiVersion, kind, name, namespace, labels (with
/// `tessera.io/federated`), annotations (without kubectl's last-applied copy) and the
/// top-level `fields` it has.
pub fn carry(obj: &Value, fields: &[&str]) -> Value {
    let meta = &obj["metadata"];
    let mut labels = meta["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(FEDERATED_LABEL.into(), json!("true"));
    let mut annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let mut m = json!({
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                     "labels": labels, "annotations": annotations},
    });
    for f in fields {
        if !obj[*f].is_null() {
            m[*f] = obj[*f].clone();
        }
    }
    m
}

/// A Service as a shard should hold it: its own cluster IPs and node ports are the shard's
/// to allocate.
pub fn service_manifest(svc: &Value) -> Value {
    let mut m = carry(svc, &["spec"]);
    if let Some(spec) = m["spec"].as_object_mut() {
        for f in ["clusterIP", "clusterIPs", "healthCheckNodePort"] {
            spec.remove(f);
        }
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                if let Some(p) = p.as_object_mut() {
                    p.remove("nodePort");
                }
            }
        }
    }
    m
}

/// The top-level fields carried for each kind taken along.
pub fn fields_of(kind: &str) -> &'static [&'static str] {
    match kind {
        "ConfigMap" => &["data", "binaryData", "immutable"],
        "Secret" => &["data", "type", "immutable"],
        "ServiceAccount" => &["imagePullSecrets", "automountServiceAccountToken"],
        "PodGroup" => &["spec"],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_reference_is_found() {
        let spec: PodSpec = serde_json::from_value(json!({
            "serviceAccountName": "builder",
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [
                {"name": "a", "configMap": {"name": "settings"}},
                {"name": "b", "secret": {"secretName": "tls"}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "extra"}}, {"secret": {"name": "token"}}]}},
                {"name": "d", "emptyDir": {}}
            ],
            "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
            "containers": [{"name": "c", "env": [
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "flags", "key": "x"}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "password", "key": "y"}}},
                {"name": "Z", "value": "plain"}],
                "envFrom": [{"configMapRef": {"name": "env"}}]}]
        }))
        .expect("a pod spec");
        let r = referenced(&spec);
        let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(r.config_maps, set(&["env", "extra", "flags", "settings"]));
        assert_eq!(
            r.secrets,
            set(&["init-env", "password", "registry", "tls", "token"])
        );
        assert_eq!(r.service_account.as_deref(), Some("builder"));
        let plain: PodSpec =
            serde_json::from_value(json!({"serviceAccountName": "default", "containers": []}))
                .expect("a pod spec");
        assert_eq!(referenced(&plain), Refs::default());
    }

    #[test]
    fn services_go_without_the_federations_addresses_and_only_when_they_select_the_pods() {
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "t", "uid": "u", "resourceVersion": "9",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"}},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.9", "clusterIPs": ["10.0.0.9"],
                "type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {}}});
        let m = service_manifest(&svc);
        assert!(m["spec"]["clusterIP"].is_null() && m["spec"]["clusterIPs"].is_null());
        assert!(m["spec"]["ports"][0]["nodePort"].is_null());
        assert_eq!(m["spec"]["ports"][0]["port"], 80);
        assert!(m["status"].is_null() && m["metadata"]["uid"].is_null());
        assert_eq!(m["metadata"]["labels"][FEDERATED_LABEL], "true");
        assert_eq!(m["metadata"]["annotations"], json!({"team": "a"}));
        let typed: Service = serde_json::from_value(svc).expect("a service");
        let labels = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(selects(&typed, &labels(&[("app", "web"), ("tier", "f")])));
        assert!(!selects(&typed, &labels(&[("app", "api")])));
        let headless: Service = serde_json::from_value(json!({"spec": {}})).expect("a service");
        assert!(!selects(&headless, &labels(&[("app", "web")])));
    }

    #[test]
    fn config_maps_and_secrets_carry_their_content_only() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "s", "namespace": "t", "uid": "u", "managedFields": []},
            "data": {"a": "1"}, "immutable": true});
        let m = carry(&cm, fields_of("ConfigMap"));
        assert_eq!(m["data"], json!({"a": "1"}));
        assert_eq!(m["immutable"], true);
        assert!(m["metadata"]["uid"].is_null() && m["metadata"]["managedFields"].is_null());
        assert_eq!(m["metadata"]["namespace"], "t");
    }
}
