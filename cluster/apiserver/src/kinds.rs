//! The Rust type behind each served kind: decoding a body into it checks every field's type
//! (and, by comparing what comes back out, finds the fields it does not know), and its
//! `JsonSchema` is what `/openapi/v3` publishes.

use k8s_openapi::api::{
    apps, authentication, batch, coordination, core, networking, policy, rbac, scheduling, storage,
};
use std::collections::HashMap;
use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::catalog::Resource;
use crate::types;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition as Crd;

/// A body that is not the kind's type: where, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeError {
    /// The field path (`spec.replicas`), empty for the whole body.
    pub path: String,
    /// What the decoder said.
    pub message: String,
}

/// Hooks for one kind.
#[derive(Clone, Copy)]
pub struct Typed {
    /// Decodes `value` as the kind's type and encodes it again: the result is the object as
    /// the server keeps it (unknown fields dropped, types checked).
    pub normalize: fn(&Value) -> Result<Value, TypeError>,
    /// Adds the kind's schema (and those it refers to) to the generator; returns the `$ref`.
    pub schema: fn(&mut SchemaGenerator) -> Schema,
    /// The schema's name in `components/schemas`.
    pub schema_name: fn() -> String,
}

fn normalize<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, TypeError> {
    let typed: T = serde_path_to_error::deserialize(value).map_err(|e| TypeError {
        path: e.path().to_string().trim_start_matches('.').to_owned(),
        message: e.inner().to_string(),
    })?;
    serde_json::to_value(&typed).map_err(|e| TypeError {
        path: String::new(),
        message: e.to_string(),
    })
}

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

fn schema_name<T: JsonSchema>() -> String {
    T::schema_name().into_owned()
}

const fn typed<T: DeserializeOwned + Serialize + JsonSchema>() -> Typed {
    Typed {
        normalize: normalize::<T>,
        schema: schema::<T>,
        schema_name: schema_name::<T>,
    }
}

/// The type of a served kind, by group, version and kind.
pub fn of(res: &Resource) -> Typed {
    if crate::catalog::stored_version_of(res).is_some() {
        // A view of an older version: its own type, for its OpenAPI document.
        if let ("autoscaling", "v1", "HorizontalPodAutoscaler") = (res.group, res.version, res.kind)
        {
            return typed::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>();
        }
    }
    of_kind(res.group, res.kind).unwrap_or_else(|| {
        // The catalog test below makes this unreachable for served kinds.
        typed::<Value>()
    })
}

/// The type of `group`/`kind`, if the server knows it.
pub fn of_kind(group: &str, kind: &str) -> Option<Typed> {
    Some(match (group, kind) {
        ("", "Namespace") => typed::<core::v1::Namespace>(),
        ("", "Pod") => typed::<core::v1::Pod>(),
        ("", "Node") => typed::<core::v1::Node>(),
        ("", "Service") => typed::<core::v1::Service>(),
        ("", "Endpoints") => typed::<core::v1::Endpoints>(),
        ("", "Event") => typed::<core::v1::Event>(),
        ("", "ConfigMap") => typed::<core::v1::ConfigMap>(),
        ("", "Secret") => typed::<core::v1::Secret>(),
        ("", "ResourceQuota") => typed::<core::v1::ResourceQuota>(),
        ("", "LimitRange") => typed::<core::v1::LimitRange>(),
        ("", "ServiceAccount") => typed::<core::v1::ServiceAccount>(),
        ("", "Binding") => typed::<core::v1::Binding>(),
        ("", "PersistentVolumeClaim") => typed::<core::v1::PersistentVolumeClaim>(),
        ("", "PersistentVolume") => typed::<core::v1::PersistentVolume>(),
        ("", "PodTemplate") => typed::<core::v1::PodTemplate>(),
        ("", "ReplicationController") => typed::<core::v1::ReplicationController>(),
        ("networking.k8s.io", "Ingress") => typed::<networking::v1::Ingress>(),
        ("networking.k8s.io", "IngressClass") => typed::<networking::v1::IngressClass>(),
        ("networking.k8s.io", "NetworkPolicy") => typed::<networking::v1::NetworkPolicy>(),
        ("storage.k8s.io", "StorageClass") => typed::<storage::v1::StorageClass>(),
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            typed::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>()
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => typed::<Crd>(),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            typed::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>()
        }
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            typed::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>()
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            typed::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>()
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            typed::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>()
        }
        ("apiregistration.k8s.io", "APIService") => {
            typed::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>()
        }
        ("apps", "Deployment") => typed::<apps::v1::Deployment>(),
        ("apps", "ReplicaSet") => typed::<apps::v1::ReplicaSet>(),
        ("apps", "DaemonSet") => typed::<apps::v1::DaemonSet>(),
        ("apps", "StatefulSet") => typed::<apps::v1::StatefulSet>(),
        ("apps", "ControllerRevision") => typed::<apps::v1::ControllerRevision>(),
        ("autoscaling", "Scale") => typed::<k8s_openapi::api::autoscaling::v1::Scale>(),
        ("autoscaling", "HorizontalPodAutoscaler") => {
            typed::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>()
        }
        ("batch", "Job") => typed::<batch::v1::Job>(),
        ("batch", "CronJob") => typed::<batch::v1::CronJob>(),
        ("coordination.k8s.io", "Lease") => typed::<coordination::v1::Lease>(),
        ("scheduling.k8s.io", "PriorityClass") => typed::<scheduling::v1::PriorityClass>(),
        ("policy", "PodDisruptionBudget") => typed::<policy::v1::PodDisruptionBudget>(),
        ("policy", "Eviction") => typed::<policy::v1::Eviction>(),
        ("rbac.authorization.k8s.io", "Role") => typed::<rbac::v1::Role>(),
        ("rbac.authorization.k8s.io", "RoleBinding") => typed::<rbac::v1::RoleBinding>(),
        ("rbac.authorization.k8s.io", "ClusterRole") => typed::<rbac::v1::ClusterRole>(),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            typed::<rbac::v1::ClusterRoleBinding>()
        }
        ("authentication.k8s.io", "TokenRequest") => typed::<authentication::v1::TokenRequest>(),
        ("tessera.io", "Tenant") => typed::<types::Tenant>(),
        ("tessera.io", "PodGroup") => typed::<types::PodGroup>(),
        ("tessera.io", "PodGroupBinding") => typed::<types::PodGroupBinding>(),
        ("tessera.io", "Shard") => typed::<types::Shard>(),
        ("tessera.io", "ShardMap") => typed::<types::ShardMapObject>(),
        ("tessera.io", "Placement") => typed::<types::Placement>(),
        _ => return None,
    })
}

/// One schema, compiled for walking: `$ref`s resolved to node indices once, so the walk of a
/// body does no lookups by definition name.
#[derive(Default)]
struct FieldNode {
    /// The declared fields, sorted by name, each with its node.
    properties: Vec<(String, usize)>,
    /// The node of a map's values (labels, data: every key allowed).
    additional: Option<usize>,
    /// The node of a list's items.
    items: Option<usize>,
}

/// The schemas of every served kind, compiled once: what `unknown_fields` walks.
struct FieldSchemas {
    nodes: Vec<FieldNode>,
    /// Each kind's root node, by (group, kind).
    roots: HashMap<(&'static str, &'static str), usize>,
}

fn field_schemas() -> &'static FieldSchemas {
    static SCHEMAS: OnceLock<FieldSchemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut generator = SchemaSettings::openapi3().into_generator();
        let roots: Vec<((&'static str, &'static str), Value)> = crate::catalog::RESOURCES
            .iter()
            .flat_map(|res| {
                let subs = res
                    .subresources
                    .iter()
                    .map(|s| (s.response.0, s.response.2));
                std::iter::once((res.group, res.kind)).chain(subs)
            })
            .filter_map(|(group, kind)| {
                let typed = of_kind(group, kind)?;
                let root = serde_json::to_value((typed.schema)(&mut generator)).ok()?;
                Some(((group, kind), root))
            })
            .collect();
        let definitions = generator
            .take_definitions(true)
            .into_iter()
            .collect::<Map<String, Value>>();
        let mut compiler = Compiler {
            definitions: &definitions,
            named: HashMap::new(),
            nodes: Vec::new(),
        };
        let roots = roots
            .iter()
            .map(|(kind, schema)| (*kind, compiler.compile(schema)))
            .collect();
        FieldSchemas {
            nodes: compiler.nodes,
            roots,
        }
    })
}

/// Turns schemas into [`FieldNode`]s; a named definition is compiled once (which also ends
/// recursion through references).
struct Compiler<'a> {
    definitions: &'a Map<String, Value>,
    named: HashMap<String, usize>,
    nodes: Vec<FieldNode>,
}

impl Compiler<'_> {
    fn compile(&mut self, schema: &Value) -> usize {
        if let Some(name) = reference(schema) {
            if let Some(id) = self.named.get(name) {
                return *id;
            }
            let id = self.nodes.len();
            self.nodes.push(FieldNode::default());
            self.named.insert(name.to_owned(), id);
            let definitions = self.definitions;
            if let Some(target) = definitions.get(name) {
                self.nodes[id] = self.node(target);
            }
            return id;
        }
        let node = self.node(schema);
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn node(&mut self, schema: &Value) -> FieldNode {
        if reference(schema).is_some() {
            // A reference to a reference: its node stands for this one.
            let id = self.compile(schema);
            return FieldNode {
                properties: self.nodes[id].properties.clone(),
                additional: self.nodes[id].additional,
                items: self.nodes[id].items,
            };
        }
        let mut properties: Vec<(String, usize)> = schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, s)| (k.clone(), self.compile(s)))
            .collect();
        properties.sort_by(|a, b| a.0.cmp(&b.0));
        let additional = schema
            .get("additionalProperties")
            .filter(|a| a.is_object())
            .map(|a| self.compile(a));
        let items = schema.get("items").map(|i| self.compile(i));
        FieldNode {
            properties,
            additional,
            items,
        }
    }
}

/// The definition a schema stands for: a bare `$ref`, one wrapped in a one-element `allOf`
/// (when the reference carries a description of its own), or in an `anyOf` with `null` (an
/// `Option`).
fn reference(schema: &Value) -> Option<&str> {
    let r = schema.get("$ref").or_else(|| {
        ["allOf", "anyOf"]
            .iter()
            .find_map(|k| match schema.get(*k) {
                Some(Value::Array(all)) => all.iter().find_map(|s| s.get("$ref")),
                _ => None,
            })
    })?;
    r.as_str()?.rsplit('/').next()
}

/// Paths of the fields in `input` that the kind `group`/`kind` does not have, found by walking
/// the kind's schema (so an unknown field is found whatever its value, an empty list
/// included). Keys of map-typed fields (labels, data) are all allowed; a field whose schema
/// is free-form (`RawExtension`, `FieldsV1`) is not looked into; null values are skipped, as
/// a null means "not set".
pub fn unknown_fields(group: &'static str, kind: &'static str, input: &Value) -> Vec<String> {
    let schemas = field_schemas();
    let mut out = Vec::new();
    if let Some(root) = schemas.roots.get(&(group, kind)) {
        walk(&schemas.nodes, *root, input, &mut Vec::new(), &mut out);
    }
    out
}

/// One step of the path to a field; the path is spelled out only for an unknown field, so a
/// write with none allocates nothing for it.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn spell(path: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => {
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
    out
}

fn walk<'a>(
    nodes: &[FieldNode],
    node: usize,
    input: &'a Value,
    path: &mut Vec<Step<'a>>,
    out: &mut Vec<String>,
) {
    let Some(schema) = nodes.get(node) else {
        return;
    };
    match input {
        Value::Object(fields) => {
            if schema.properties.is_empty() && schema.additional.is_none() {
                return; // free-form
            }
            for (key, value) in fields {
                path.push(Step::Key(key));
                let field = schema
                    .properties
                    .binary_search_by(|(k, _)| k.as_str().cmp(key))
                    .ok()
                    .map(|i| schema.properties[i].1)
                    .or(schema.additional);
                match field {
                    Some(field) => walk(nodes, field, value, path, out),
                    None if value.is_null() => {}
                    None => out.push(spell(path)),
                }
                path.pop();
            }
        }
        Value::Array(items) => {
            let Some(item) = schema.items else {
                return;
            };
            for (i, value) in items.iter().enumerate() {
                path.push(Step::Index(i));
                walk(nodes, item, value, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::catalog::RESOURCES;

    #[test]
    fn every_served_kind_has_a_type() {
        for res in RESOURCES {
            assert!(of_kind(res.group, res.kind).is_some(), "{}", res.kind);
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let typed = of_kind("apps", "Deployment").expect("deployment");
        let bad = json!({"metadata": {"name": "a"}, "spec": {"replicas": "three"}});
        let err = (typed.normalize)(&bad).expect_err("a string is not an int32");
        assert_eq!(err.path, "spec.replicas");
        assert!(err.message.contains("invalid type"), "{}", err.message);
    }

    #[test]
    fn unknown_fields_are_found_at_any_depth() {
        let typed = of_kind("", "Pod").expect("pod");
        let input = json!({
            "metadata": {"name": "p", "labels": {"any": "key"}, "bogus": 1},
            "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolcy": "x"}]},
            "extra": {"a": 1},
            "status": {},
        });
        let kept = (typed.normalize)(&input).expect("types are right");
        assert_eq!(
            unknown_fields("", "Pod", &input),
            vec![
                "extra",
                "metadata.bogus",
                "spec.containers[0].imagePullPolcy"
            ]
        );
        assert_eq!(
            kept["metadata"]["labels"]["any"], "key",
            "map keys are kept"
        );
    }

    /// An unknown field is unknown whatever its value: an empty list or object too (they
    /// were once dropped silently as if they were an optional field's default).
    #[test]
    fn unknown_fields_with_empty_values_are_found() {
        let input = json!({
            "metadata": {"name": "p", "annotations": {}, "finalizers": []},
            "spec": {"containerz": [], "containers": [{"name": "c", "image": "i", "portz": {},
                "ports": [], "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [], "matchFieldz": []}]}}}},
            "status": {"phase": null, "conditionz": {}},
        });
        assert_eq!(
            unknown_fields("", "Pod", &input),
            vec![
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFieldz",
                "spec.containers[0].portz",
                "spec.containerz",
                "status.conditionz",
            ]
        );
    }

    #[test]
    fn free_form_and_map_fields_take_any_key() {
        let cm = json!({"metadata": {"name": "c", "managedFields": [{"manager": "m",
            "fieldsV1": {"f:data": {"f:any": {}}}}]}, "data": {"whatever": "x"}});
        assert!(unknown_fields("", "ConfigMap", &cm).is_empty());
        let tenant = json!({"spec": {"quota": {"anything": "1"}, "namespacez": []}});
        assert_eq!(
            unknown_fields("tessera.io", "Tenant", &tenant),
            vec!["spec.namespacez"]
        );
        let scale = json!({"spec": {"replicas": 2, "replicaz": 3}});
        assert_eq!(
            unknown_fields("autoscaling", "Scale", &scale),
            vec!["spec.replicaz"]
        );
    }

    #[test]
    fn tessera_kinds_round_trip() {
        let typed = of_kind("tessera.io", "Tenant").expect("tenant");
        let input = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": "t"}, "spec": {"namespaces": ["a"], "weight": 2, "quota": {"cpu": "10"}}});
        let kept = (typed.normalize)(&input).expect("valid");
        assert_eq!(kept, input);
    }
}
