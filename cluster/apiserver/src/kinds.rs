//! The Rust type behind each served kind: decoding a body into it checks every field's type
//! (and, by comparing what comes back out, finds the fields it does not know), and its
//! `JsonSchema` is what `/openapi/v3` publishes.

use k8s_openapi::api::{apps, batch, coordination, core, policy, scheduling};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::catalog::Resource;
use crate::types;

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

/// The type of a served kind, by group and kind.
pub fn of(res: &Resource) -> Typed {
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
        ("apps", "Deployment") => typed::<apps::v1::Deployment>(),
        ("apps", "ReplicaSet") => typed::<apps::v1::ReplicaSet>(),
        ("apps", "DaemonSet") => typed::<apps::v1::DaemonSet>(),
        ("apps", "StatefulSet") => typed::<apps::v1::StatefulSet>(),
        ("apps", "ControllerRevision") => typed::<apps::v1::ControllerRevision>(),
        ("autoscaling", "Scale") => typed::<k8s_openapi::api::autoscaling::v1::Scale>(),
        ("batch", "Job") => typed::<batch::v1::Job>(),
        ("batch", "CronJob") => typed::<batch::v1::CronJob>(),
        ("coordination.k8s.io", "Lease") => typed::<coordination::v1::Lease>(),
        ("scheduling.k8s.io", "PriorityClass") => typed::<scheduling::v1::PriorityClass>(),
        ("policy", "PodDisruptionBudget") => typed::<policy::v1::PodDisruptionBudget>(),
        ("policy", "Eviction") => typed::<policy::v1::Eviction>(),
        ("tessera.io", "Tenant") => typed::<types::Tenant>(),
        ("tessera.io", "PodGroup") => typed::<types::PodGroup>(),
        _ => return None,
    })
}

/// Paths of fields present (and not null) in `input` but missing from `normalized`: the
/// fields the kind does not have. Map-typed fields keep every key, so only struct fields
/// are reported.
pub fn unknown_fields(input: &Value, normalized: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(input, normalized, &mut String::new(), &mut out);
    out
}

fn walk(input: &Value, kept: &Value, path: &mut String, out: &mut Vec<String>) {
    match (input, kept) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                match b.get(k) {
                    Some(kept) => walk(v, kept, path, out),
                    None if v.is_null() => {}
                    // An empty object or list may be dropped as the default of an optional
                    // field; it is not an unknown field.
                    None if is_empty(v) => {}
                    None => out.push(path.clone()),
                }
                path.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(x, y, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
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
            unknown_fields(&input, &kept),
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

    #[test]
    fn tessera_kinds_round_trip() {
        let typed = of_kind("tessera.io", "Tenant").expect("tenant");
        let input = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": "t"}, "spec": {"namespaces": ["a"], "weight": 2, "quota": {"cpu": "10"}}});
        let kept = (typed.normalize)(&input).expect("valid");
        assert_eq!(kept, input);
    }
}
