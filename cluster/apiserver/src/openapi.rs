//! `/openapi/v3`: an index of group-versions and one OpenAPI 3.0 document per group-version,
//! with the kinds' real schemas (from `k8s-openapi`'s `JsonSchema` implementations).
//!
//! Two clients depend on the exact shape: kubectl's strict validation looks, in the
//! group-version's document, for a PATCH operation tagged with the kind's
//! `x-kubernetes-group-version-kind` that accepts a `fieldValidation` query parameter — if
//! it finds one it leaves validation to the server; `kubectl explain` finds a kind's schema in
//! `components/schemas` by the same extension (a list there) and follows `$ref`s (wrapped in
//! `allOf` when the reference carries its own description).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::catalog::{self, Resource};
use crate::crd::{Snapshot, Version};
use crate::kinds;
use std::sync::Arc;

/// A group-version's document and its content hash.
#[derive(Debug)]
pub struct Document {
    /// The JSON body.
    pub body: String,
    /// Hex digest of the body: clients cache by it.
    pub hash: String,
}

/// The index path of a group-version (`api/v1`, `apis/apps/v1`).
pub fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn documents() -> &'static BTreeMap<String, Document> {
    static DOCS: OnceLock<BTreeMap<String, Document>> = OnceLock::new();
    DOCS.get_or_init(|| {
        catalog::groups()
            .into_iter()
            .map(|(g, v)| {
                let body = document(g, v).to_string();
                let digest = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
                let hash = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
                (gv_path(g, v), Document { body, hash })
            })
            .collect()
    })
}

/// The index (`/openapi/v3`): the built-in group-versions and those of `crds`.
pub fn index(crds: &Snapshot) -> Value {
    let paths: Map<String, Value> = documents()
        .iter()
        .chain(crds.documents().iter())
        .map(|(path, doc)| {
            (
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", doc.hash)}),
            )
        })
        .collect();
    json!({ "paths": paths })
}

/// The document at `path` (`api/v1`, `apis/apps/v1`), if served.
pub fn document_at<'a>(crds: &'a Snapshot, path: &str) -> Option<&'a Document> {
    let path = path.trim_matches('/');
    documents().get(path).or_else(|| crds.documents().get(path))
}

fn document_of(body: &Value) -> Document {
    let body = body.to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
    let hash = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    Document { body, hash }
}

/// The documents of the custom group-versions of `versions` (one CRD version each), by
/// index path.
pub fn custom_documents(versions: &[Arc<Version>]) -> BTreeMap<String, Document> {
    let mut by_gv: BTreeMap<String, Vec<&Version>> = BTreeMap::new();
    for v in versions {
        by_gv
            .entry(gv_path(v.resource.group, v.resource.version))
            .or_default()
            .push(v);
    }
    by_gv
        .into_iter()
        .map(|(path, vs)| (path, document_of(&custom_document(&vs))))
        .collect()
}

/// The schema name Kubernetes publishes a custom kind under (`com.example.v1.Widget`).
fn custom_schema_name(res: &Resource) -> String {
    let reversed: Vec<&str> = res.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), res.version, res.kind)
}

/// One custom group-version's document: each kind's structural schema with `apiVersion`,
/// `kind` and `metadata` added (as Kubernetes publishes them), and its operations.
fn custom_document(versions: &[&Version]) -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let meta_ref = serde_json::to_value(
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(),
    )
    .unwrap_or_default();
    let scale_ref = kinds::of_kind("autoscaling", "Scale")
        .map(|t| serde_json::to_value((t.schema)(&mut generator)).unwrap_or_default());
    let mut paths = Map::new();
    let mut custom_schemas = Map::new();
    for v in versions {
        let res = v.resource;
        let name = custom_schema_name(res);
        let mut schema = v.raw_schema.clone();
        if let Some(props) = schema
            .as_object_mut()
            .map(|o| o.entry("properties").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut)
        {
            props.insert("apiVersion".into(), json!({"type": "string",
                "description": "APIVersion defines the versioned schema of this representation of an object."}));
            props.insert("kind".into(), json!({"type": "string",
                "description": "Kind is a string value representing the REST resource this object represents."}));
            props.insert(
                "metadata".into(),
                json!({"allOf": [meta_ref.clone()],
                "description": "Standard object's metadata."}),
            );
        }
        schema["x-kubernetes-group-version-kind"] = json!([gvk(res.group, res.version, res.kind)]);
        custom_schemas.insert(name.clone(), schema);
        let schema_ref = json!({"$ref": format!("#/components/schemas/{name}")});
        add_paths(&mut paths, res, &schema_ref, |sub| match sub {
            "scale" => scale_ref.clone(),
            _ => Some(schema_ref.clone()),
        });
    }
    let mut schemas = generator.take_definitions(true);
    crate::patch::annotate_schemas(&mut schemas);
    schemas.extend(custom_schemas);
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Tessera", "version": crate::discovery::version_info()["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// The collection, item and subresource paths of `res`.
fn add_paths(
    paths: &mut Map<String, Value>,
    res: &Resource,
    schema_ref: &Value,
    mut sub_ref: impl FnMut(&str) -> Option<Value>,
) {
    let base = format!("/{}", gv_path(res.group, res.version));
    let (coll_path, item_path) = if res.namespaced {
        (
            format!("{base}/namespaces/{{namespace}}/{}", res.plural),
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", res.plural),
        )
    } else {
        (
            format!("{base}/{}", res.plural),
            format!("{base}/{}/{{name}}", res.plural),
        )
    };
    let mut params = vec![path_param("name")];
    if res.namespaced {
        params.push(path_param("namespace"));
    }
    let (mut item, mut collection) = operations(res, schema_ref, None);
    item["parameters"] = json!(params);
    if res.namespaced {
        collection["parameters"] = json!([path_param("namespace")]);
    }
    paths.insert(item_path.clone(), item);
    paths.insert(coll_path, collection);
    for sub in res.subresources {
        if sub.name != "status" && sub.name != "scale" {
            continue;
        }
        let sub_ref = sub_ref(sub.name).unwrap_or_else(|| schema_ref.clone());
        let (mut ops, _) = operations(res, &sub_ref, Some(sub.name));
        ops["parameters"] = json!(params);
        paths.insert(format!("{item_path}/{}", sub.name), ops);
    }
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn path_param(name: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
}

fn response(schema_ref: &Value) -> Value {
    json!({"200": {"description": "OK", "content": {"application/json": {"schema": schema_ref}}}})
}

/// Write operations take these; PATCH's `fieldValidation` is what kubectl checks for.
fn write_params() -> Vec<Value> {
    vec![
        query_param(
            "dryRun",
            "When present (All), the request is processed without being persisted.",
        ),
        query_param(
            "fieldManager",
            "The name of the actor making the change, recorded in managedFields.",
        ),
        query_param(
            "fieldValidation",
            "What to do with unknown or duplicate fields: Ignore, Warn or Strict.",
        ),
    ]
}

fn operations(res: &Resource, schema_ref: &Value, sub: Option<&str>) -> (Value, Value) {
    let id_kind = format!("{}{}", res.kind, sub.map(capitalize).unwrap_or_default());
    let gvk = gvk(res.group, res.version, res.kind);
    let op = |verb: &str, action: &str, params: Vec<Value>, body: bool| -> Value {
        let mut o = json!({
            "operationId": format!("{verb}{id_kind}"),
            "parameters": params,
            "responses": response(schema_ref),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        });
        if body {
            // kubectl's client-side apply sends a strategic merge patch only where the PATCH
            // operation lists it: never for a custom resource (it has no Go type).
            let types = if verb == "patch" && res.custom {
                vec![
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                ]
            } else if verb == "patch" {
                vec![
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/strategic-merge-patch+json",
                    "application/apply-patch+yaml",
                ]
            } else {
                vec!["application/json"]
            };
            let content: Map<String, Value> = types
                .into_iter()
                .map(|t| {
                    (
                        t.to_owned(),
                        json!({"schema": if verb == "patch" { json!({"type": "object"}) } else { schema_ref.clone() }}),
                    )
                })
                .collect();
            o["requestBody"] = json!({"content": content, "required": true});
        }
        o
    };
    let mut patch_params = write_params();
    patch_params.push(query_param(
        "force",
        "Force is going to \"force\" Apply requests: the changes are applied even if other managers own the fields.",
    ));
    let mut item = json!({
        "get": op("read", "get", vec![], false),
        "put": op("replace", "put", write_params(), true),
        "patch": op("patch", "patch", patch_params, true),
    });
    if sub.is_none() {
        item["delete"] = op(
            "delete",
            "delete",
            vec![
                query_param("dryRun", "When present (All), nothing is deleted."),
                query_param(
                    "gracePeriodSeconds",
                    "Seconds before the object is deleted.",
                ),
                query_param(
                    "propagationPolicy",
                    "Orphan, Background or Foreground: what happens to dependents.",
                ),
            ],
            false,
        );
    }
    let collection = json!({
        "get": op("list", "list", vec![
            query_param("labelSelector", "Only objects whose labels match."),
            query_param("fieldSelector", "Only objects whose fields match."),
            query_param("limit", "Most objects per page."),
            query_param("continue", "The token of the next page."),
            query_param("resourceVersion", "Which state to read."),
            query_param("resourceVersionMatch", "Exact or NotOlderThan."),
            query_param("watch", "Stream changes instead of a list."),
            query_param("allowWatchBookmarks", "Send BOOKMARK events on a watch."),
        ], false),
        "post": op("create", "post", write_params(), true),
        "delete": op("deleteCollection", "deletecollection", vec![
            query_param("labelSelector", "Only objects whose labels match."),
            query_param("fieldSelector", "Only objects whose fields match."),
        ], false),
    });
    (item, collection)
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// One group-version's OpenAPI 3.0 document.
pub fn document(group: &str, version: &str) -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut paths = Map::new();
    let mut kinds_here = Vec::new();
    for res in catalog::resources_of(group, version) {
        let typed = kinds::of(res);
        let schema_ref = serde_json::to_value((typed.schema)(&mut generator)).unwrap_or_default();
        kinds_here.push(((typed.schema_name)(), gvk(res.group, res.version, res.kind)));
        add_paths(&mut paths, res, &schema_ref, |sub| {
            let response = res.subresources.iter().find(|s| s.name == sub)?.response;
            kinds::of_kind(response.0, response.2)
                .map(|t| serde_json::to_value((t.schema)(&mut generator)).unwrap_or_default())
        });
    }
    let mut schemas = generator.take_definitions(true);
    crate::patch::annotate_schemas(&mut schemas);
    for (name, gvk) in kinds_here {
        if let Some(Value::Object(s)) = schemas.get_mut(&name) {
            s.insert("x-kubernetes-group-version-kind".into(), json!([gvk]));
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Tessera", "version": crate::discovery::version_info()["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_lists_every_group_version_with_a_hash() {
        let idx = index(&Snapshot::default());
        let apps = idx["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .expect("apps/v1 is listed");
        assert!(apps.starts_with("/openapi/v3/apis/apps/v1?hash="), "{apps}");
        assert!(idx["paths"]["api/v1"].is_object());
        assert!(idx["paths"]["apis/tessera.io/v1alpha1"].is_object());
    }

    /// What kubectl's strict validation looks for before it leaves validation to us.
    #[test]
    fn patch_operations_accept_field_validation_for_each_kind() {
        let doc = document("apps", "v1");
        let paths = doc["paths"].as_object().expect("paths");
        let patch = paths
            .values()
            .filter_map(|p| p.get("patch"))
            .find(|op| op["x-kubernetes-group-version-kind"]["kind"] == "Deployment")
            .expect("a PATCH for Deployment");
        assert!(
            patch["parameters"]
                .as_array()
                .expect("params")
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
    }

    /// What `kubectl explain deployment.spec.strategy` walks.
    #[test]
    fn schemas_carry_kinds_and_resolve_references() {
        let doc = document("apps", "v1");
        let schemas = &doc["components"]["schemas"];
        let deploy = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            deploy["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
        let spec = &deploy["properties"]["spec"];
        let reference = spec["allOf"][0]["$ref"]
            .as_str()
            .or(spec["$ref"].as_str())
            .expect("spec is a reference");
        let name = reference
            .strip_prefix("#/components/schemas/")
            .expect("openapi3 path");
        assert!(schemas[name]["properties"]["strategy"].is_object());
        let containers = &schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
    }
}
