//! API discovery as kubectl 1.32 reads it: `/version`, aggregated discovery
//! (`apidiscovery.k8s.io/v2` on `/api` and `/apis`) and the legacy per-group documents.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::api::Api;
use crate::catalog::{Resource, VERBS};

/// The content type of an aggregated discovery answer; kubectl asks for it in `Accept`.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The Kubernetes version this server speaks. kubectl's dispatcher picks its own version from
/// `gitVersion`, so it must be a 1.32 release.
pub const KUBERNETES_VERSION: (&str, &str) = ("1", "32");

/// `/version`.
pub fn version_info() -> Value {
    json!({
        "major": KUBERNETES_VERSION.0,
        "minor": KUBERNETES_VERSION.1,
        "gitVersion": format!("v{}.{}.0-tessera.{}", KUBERNETES_VERSION.0, KUBERNETES_VERSION.1, env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "none (Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if cfg!(target_arch = "x86_64") { "amd64" } else { std::env::consts::ARCH }),
    })
}

/// The resource metrics API (`kubectl top`), served by the API server beside the catalog:
/// (plural, singular, kind, namespaced).
const METRICS_GROUP: &str = "metrics.k8s.io";
const METRICS_VERSION: &str = "v1beta1";
const METRICS: [(&str, &str, &str, bool); 2] = [
    ("nodes", "", "NodeMetrics", false),
    ("pods", "", "PodMetrics", true),
];

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// The served group-versions of `resources`, in discovery order: built-in groups as the
/// catalog lists them, then each custom group with its versions in Kubernetes' priority
/// order (the first is the preferred one).
fn groups(resources: &[&'static Resource]) -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for res in resources {
        if !out.contains(&(res.group, res.version)) {
            out.push((res.group, res.version));
        }
    }
    let builtin = out
        .iter()
        .take_while(|(g, v)| crate::catalog::find_group_version(g, v))
        .count();
    out[builtin..].sort_by(|a, b| {
        a.0.cmp(b.0)
            .then_with(|| crate::crd::version_priority(a.1).cmp(&crate::crd::version_priority(b.1)))
    });
    out
}

/// The legacy `APIResourceList` of one group-version, or `None` if it is not served.
pub fn api_resource_list(
    resources: &[&'static Resource],
    group: &str,
    version: &str,
) -> Option<Value> {
    if (group, version) == (METRICS_GROUP, METRICS_VERSION) {
        let resources: Vec<Value> = METRICS
            .iter()
            .map(|(plural, singular, kind, namespaced)| {
                json!({"name": plural, "singularName": singular, "namespaced": namespaced,
                    "kind": kind, "verbs": ["get", "list"]})
            })
            .collect();
        return Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": group_version(group, version), "resources": resources}));
    }
    let served = resources;
    let mut resources = Vec::new();
    for res in served
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": res.plural,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": VERBS,
            "shortNames": res.short_names,
            "categories": res.categories,
        }));
        for sub in res.subresources {
            let (g, v, kind) = sub.response;
            let mut entry = json!({
                "name": format!("{}/{}", res.plural, sub.name),
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": kind,
                "verbs": sub.verbs,
            });
            if (g, v) != (res.group, res.version) {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": resources,
    }))
}

fn api_group(resources: &[&'static Resource], group: &str) -> Option<Value> {
    let versions: Vec<Value> = groups(resources)
        .into_iter()
        .chain([(METRICS_GROUP, METRICS_VERSION)])
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": group_version(g, v), "version": v}))
        .collect();
    let preferred = versions.first()?.clone();
    Some(json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": preferred,
    }))
}

/// The legacy `APIGroupList` of `/apis`.
pub fn api_group_list(resources: &[&'static Resource]) -> Value {
    let mut names: Vec<&str> = Vec::new();
    for (g, _) in groups(resources)
        .into_iter()
        .chain([(METRICS_GROUP, METRICS_VERSION)])
    {
        if !g.is_empty() && !names.contains(&g) {
            names.push(g);
        }
    }
    let groups: Vec<Value> = names
        .into_iter()
        .filter_map(|g| api_group(resources, g))
        .map(|mut g| {
            if let Some(o) = g.as_object_mut() {
                o.remove("kind");
                o.remove("apiVersion");
            }
            g
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The legacy `APIVersions` of `/api`.
pub fn api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    })
}

fn discovery_resource(res: &Resource) -> Value {
    let subresources: Vec<Value> = res
        .subresources
        .iter()
        .map(|s| {
            let (g, v, k) = s.response;
            json!({
                "subresource": s.name,
                "responseKind": {"group": g, "version": v, "kind": k},
                "verbs": s.verbs,
            })
        })
        .collect();
    json!({
        "resource": res.plural,
        "responseKind": {"group": res.group, "version": res.version, "kind": res.kind},
        "scope": if res.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": res.singular,
        "verbs": VERBS,
        "shortNames": res.short_names,
        "categories": res.categories,
        "subresources": subresources,
    })
}

/// The aggregated `APIGroupDiscoveryList`: the core group (for `/api`) or every named group
/// (for `/apis`).
pub fn aggregated(served: &[&'static Resource], core: bool) -> Value {
    let mut items: Vec<Value> = Vec::new();
    for (group, version) in groups(served) {
        if group.is_empty() != core {
            continue;
        }
        let resources: Vec<Value> = served
            .iter()
            .copied()
            .filter(|r| r.group == group && r.version == version)
            .map(discovery_resource)
            .collect();
        let entry = json!({"version": version, "resources": resources, "freshness": "Current"});
        match items
            .iter_mut()
            .find(|i| i["metadata"]["name"] == json!(group))
        {
            Some(item) => {
                if let Some(v) = item["versions"].as_array_mut() {
                    v.push(entry);
                }
            }
            None => items.push(json!({
                "metadata": {"name": group, "creationTimestamp": null},
                "versions": [entry],
            })),
        }
    }
    if !core {
        let resources: Vec<Value> = METRICS
            .iter()
            .map(|(plural, singular, kind, namespaced)| {
                json!({"resource": plural,
                    "responseKind": {"group": METRICS_GROUP, "version": METRICS_VERSION, "kind": kind},
                    "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                    "singularResource": singular, "verbs": ["get", "list"]})
            })
            .collect();
        items.push(json!({"metadata": {"name": METRICS_GROUP, "creationTimestamp": null},
            "versions": [{"version": METRICS_VERSION, "resources": resources, "freshness": "Current"}]}));
    }
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.replace(' ', "");
            t.contains("g=apidiscovery.k8s.io")
                && t.contains("v=v2;")
                && t.contains("as=APIGroupDiscoveryList")
                || t.ends_with("g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
        })
}

fn json_response(content_type: &'static str, body: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, content_type)],
        body.to_string(),
    )
        .into_response()
}

/// A Kubernetes `Status` for a discovery path that does not exist.
fn not_found(what: String) -> Response {
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("the server could not find the requested resource ({what})"),
        "reason": "NotFound",
        "details": {},
        "code": 404,
    });
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "application/json")],
        status.to_string(),
    )
        .into_response()
}

/// Every resource `api` serves, built-in and custom.
async fn served(api: &Api) -> Result<Vec<&'static Resource>, Response> {
    match api.served().await {
        Ok(s) => Ok(s.resources()),
        Err(e) => Err(crate::http::error_response(&e)),
    }
}

async fn root_api(State(api): State<Api>, headers: HeaderMap) -> Response {
    let served = match served(&api).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if wants_aggregated(&headers) {
        json_response(AGGREGATED_CONTENT_TYPE, &aggregated(&served, true))
    } else {
        json_response("application/json", &api_versions())
    }
}

async fn root_apis(State(api): State<Api>, headers: HeaderMap) -> Response {
    let served = match served(&api).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if wants_aggregated(&headers) {
        json_response(AGGREGATED_CONTENT_TYPE, &aggregated(&served, false))
    } else {
        json_response("application/json", &api_group_list(&served))
    }
}

async fn core_version(State(api): State<Api>, Path(version): Path<String>) -> Response {
    let served = match served(&api).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match api_resource_list(&served, "", &version) {
        Some(doc) => json_response("application/json", &doc),
        None => not_found(format!("get /api/{version}")),
    }
}

async fn group_doc(State(api): State<Api>, Path(group): Path<String>) -> Response {
    let served = match served(&api).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match api_group(&served, &group) {
        Some(doc) => json_response("application/json", &doc),
        None => not_found(format!("get /apis/{group}")),
    }
}

async fn group_version_doc(
    State(api): State<Api>,
    Path((group, version)): Path<(String, String)>,
) -> Response {
    let served = match served(&api).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match api_resource_list(&served, &group, &version) {
        Some(doc) => json_response("application/json", &doc),
        None => not_found(format!("get /apis/{group}/{version}")),
    }
}

/// The discovery routes.
pub fn router() -> Router<Api> {
    Router::new()
        .route(
            "/version",
            get(|| async { json_response("application/json", &version_info()) }),
        )
        .route("/api", get(root_api))
        .route("/api/{version}", get(core_version))
        .route("/apis", get(root_apis))
        .route("/apis/{group}", get(group_doc))
        .route("/apis/{group}/{version}", get(group_version_doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_describe_the_catalog() {
        let served: Vec<&'static Resource> = crate::catalog::RESOURCES.iter().collect();
        let core = api_resource_list(&served, "", "v1").expect("core");
        let names: Vec<&str> = core["resources"]
            .as_array()
            .expect("array")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(names.contains(&"pods") && names.contains(&"pods/status"));
        let apps = api_resource_list(&served, "apps", "v1").expect("apps");
        let scale = apps["resources"]
            .as_array()
            .expect("array")
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .expect("scale");
        assert_eq!(scale["group"], "autoscaling");
        assert!(api_resource_list(&served, "apps", "v2").is_none());
        let agg = aggregated(&served, false);
        assert!(
            agg["items"]
                .as_array()
                .expect("items")
                .iter()
                .all(|i| i["metadata"]["name"] != "")
        );
        assert_eq!(
            aggregated(&served, true)["items"][0]["metadata"]["name"],
            ""
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
                .parse()
                .expect("header"),
        );
        assert!(wants_aggregated(&headers));
        assert!(!wants_aggregated(&HeaderMap::new()));
    }
}
