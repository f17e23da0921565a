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
use crate::kinds;

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

/// The index (`/openapi/v3`).
pub fn index() -> Value {
    let paths: Map<String, Value> = documents()
        .iter()
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
pub fn document_at(path: &str) -> Option<&'static Document> {
    documents().get(path.trim_matches('/'))
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
            let types = if verb == "patch" {
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
        let base = format!("/{}", gv_path(group, version));
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
        let (mut item, mut collection) = operations(res, &schema_ref, None);
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
            let sub_ref = match kinds::of_kind(sub.response.0, sub.response.2) {
                Some(t) => serde_json::to_value((t.schema)(&mut generator)).unwrap_or_default(),
                None => schema_ref.clone(),
            };
            let (mut ops, _) = operations(res, &sub_ref, Some(sub.name));
            ops["parameters"] = json!(params);
            paths.insert(format!("{item_path}/{}", sub.name), ops);
        }
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
        let idx = index();
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
