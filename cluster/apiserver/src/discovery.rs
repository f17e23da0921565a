//! API discovery as kubectl 1.32 reads it: `/version`, aggregated discovery
//! (`apidiscovery.k8s.io/v2` on `/api` and `/apis`) and the legacy per-group documents.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use std::sync::Arc;

use crate::aggregator::{Discovered, Remote};
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

/// The group-versions extension API servers serve ([`crate::aggregator`]), in discovery
/// order, with what each last said of its resources (None: never reached).
#[derive(Default)]
pub struct Extensions(pub Vec<(Arc<Remote>, Option<Discovered>)>);

impl Extensions {
    /// What `api`'s aggregator knows now.
    pub fn of(api: &Api) -> Extensions {
        let aggregator = api.aggregator();
        Extensions(
            aggregator
                .current_routes()
                .in_order()
                .into_iter()
                .map(|r| {
                    let d = aggregator.discovered(&r.name);
                    (r, d)
                })
                .collect(),
        )
    }

    /// Whether an extension server serves `group`/`version` (in place of this server).
    fn serves(&self, group: &str, version: &str) -> bool {
        self.0
            .iter()
            .any(|(r, _)| r.group == group && r.version == version)
    }

    /// The group-versions served here, then the extensions', without those an extension
    /// took over (`metrics.k8s.io/v1beta1` when metrics-server is installed).
    fn with_local<'a>(&'a self, local: Vec<(&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
        let mut out: Vec<(&str, &str)> = local
            .into_iter()
            .filter(|(g, v)| !self.serves(g, v))
            .collect();
        out.extend(
            self.0
                .iter()
                .map(|(r, _)| (r.group.as_str(), r.version.as_str())),
        );
        out
    }
}

/// An extension's `APIResourceList` as aggregated discovery's resources.
fn extension_resources(list: &Value, group: &str, version: &str) -> Vec<Value> {
    let all = list["resources"].as_array().map_or(&[][..], Vec::as_slice);
    let kind_of = |r: &Value| {
        json!({"group": r["group"].as_str().unwrap_or(group),
            "version": r["version"].as_str().unwrap_or(version),
            "kind": r["kind"]})
    };
    let mut out: Vec<Value> = all
        .iter()
        .filter(|r| r["name"].as_str().is_some_and(|n| !n.contains('/')))
        .map(|r| {
            let mut entry = json!({
                "resource": r["name"],
                "responseKind": kind_of(r),
                "scope": if r["namespaced"] == json!(true) { "Namespaced" } else { "Cluster" },
                "singularResource": r["singularName"].as_str().unwrap_or_default(),
                "verbs": r["verbs"].as_array().cloned().unwrap_or_default(),
                "subresources": [],
            });
            for f in ["shortNames", "categories"] {
                if r[f].is_array() {
                    entry[f] = r[f].clone();
                }
            }
            entry
        })
        .collect();
    for r in all {
        let Some((parent, sub)) = r["name"].as_str().and_then(|n| n.split_once('/')) else {
            continue;
        };
        if let Some(p) = out.iter_mut().find(|e| e["resource"] == parent)
            && let Some(subs) = p["subresources"].as_array_mut()
        {
            subs.push(json!({"subresource": sub, "responseKind": kind_of(r),
                "verbs": r["verbs"].as_array().cloned().unwrap_or_default()}));
        }
    }
    out
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

fn api_group(resources: &[&'static Resource], ext: &Extensions, group: &str) -> Option<Value> {
    let mut local = groups(resources);
    local.push((METRICS_GROUP, METRICS_VERSION));
    let versions: Vec<Value> = ext
        .with_local(local)
        .into_iter()
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
pub fn api_group_list(resources: &[&'static Resource], ext: &Extensions) -> Value {
    let mut names: Vec<&str> = Vec::new();
    let mut local = groups(resources);
    local.push((METRICS_GROUP, METRICS_VERSION));
    for (g, _) in ext.with_local(local) {
        if !g.is_empty() && !names.contains(&g) {
            names.push(g);
        }
    }
    let groups: Vec<Value> = names
        .into_iter()
        .filter_map(|g| api_group(resources, ext, g))
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

/// Adds a version `entry` to `group`'s item of an aggregated discovery list (made if new).
fn add_version(items: &mut Vec<Value>, group: &str, entry: Value) {
    match items.iter_mut().find(|i| i["metadata"]["name"] == group) {
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

/// The aggregated `APIGroupDiscoveryList`: the core group (for `/api`) or every named group
/// (for `/apis`), with the extensions' groups after the built-in ones.
pub fn aggregated(served: &[&'static Resource], ext: &Extensions, core: bool) -> Value {
    let mut items: Vec<Value> = Vec::new();
    for (group, version) in groups(served) {
        if group.is_empty() != core || ext.serves(group, version) {
            continue;
        }
        let resources: Vec<Value> = served
            .iter()
            .copied()
            .filter(|r| r.group == group && r.version == version)
            .map(discovery_resource)
            .collect();
        let entry = json!({"version": version, "resources": resources, "freshness": "Current"});
        add_version(&mut items, group, entry);
    }
    if !core && !ext.serves(METRICS_GROUP, METRICS_VERSION) {
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
    // An extension that was never reached is left out (its resources are unknown); one
    // that stopped answering keeps what it last said, marked Stale.
    for (remote, found) in ext.0.iter().filter(|_| !core) {
        let Some(found) = found else {
            continue;
        };
        let entry = json!({"version": remote.version,
            "resources": extension_resources(&found.resources, &remote.group, &remote.version),
            "freshness": if found.current { "Current" } else { "Stale" }});
        add_version(&mut items, &remote.group, entry);
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
        let ext = Extensions::default();
        json_response(AGGREGATED_CONTENT_TYPE, &aggregated(&served, &ext, true))
    } else {
        json_response("application/json", &api_versions())
    }
}

async fn root_apis(State(api): State<Api>, headers: HeaderMap) -> Response {
    let served = match served(&api).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let ext = Extensions::of(&api);
    if wants_aggregated(&headers) {
        json_response(AGGREGATED_CONTENT_TYPE, &aggregated(&served, &ext, false))
    } else {
        json_response("application/json", &api_group_list(&served, &ext))
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
    match api_group(&served, &Extensions::of(&api), &group) {
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
        let none = Extensions::default();
        let agg = aggregated(&served, &none, false);
        assert!(
            agg["items"]
                .as_array()
                .expect("items")
                .iter()
                .all(|i| i["metadata"]["name"] != "")
        );
        assert_eq!(
            aggregated(&served, &none, true)["items"][0]["metadata"]["name"],
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

    fn remote(group: &str, version: &str) -> Arc<Remote> {
        Arc::new(Remote {
            name: format!("{version}.{group}"),
            group: group.into(),
            version: version.into(),
            namespace: "ns".into(),
            service: "svc".into(),
            port: 443,
            ca_pem: None,
            group_priority: 100,
            version_priority: 10,
        })
    }

    #[test]
    fn extensions_join_and_replace_local_groups() {
        let served: Vec<&'static Resource> = crate::catalog::RESOURCES.iter().collect();
        let list = json!({"kind": "APIResourceList", "groupVersion": "metrics.k8s.io/v1beta1",
            "resources": [
                {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics",
                    "verbs": ["get", "list"]},
                {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
                    "verbs": ["get", "list"], "shortNames": ["nm"]},
                {"name": "nodes/status", "singularName": "", "namespaced": false,
                    "kind": "NodeMetrics", "verbs": ["get"]}]});
        // metrics-server took over metrics.k8s.io; wardle was never reached.
        let ext = Extensions(vec![
            (
                remote("metrics.k8s.io", "v1beta1"),
                Some(Discovered {
                    resources: Arc::new(list),
                    current: false,
                }),
            ),
            (remote("wardle.example.com", "v1alpha1"), None),
        ]);
        let agg = aggregated(&served, &ext, false);
        let items = agg["items"].as_array().expect("items");
        let metrics: Vec<&Value> = items
            .iter()
            .filter(|i| i["metadata"]["name"] == "metrics.k8s.io")
            .collect();
        assert_eq!(metrics.len(), 1, "the local entry is replaced, not doubled");
        let v = &metrics[0]["versions"][0];
        assert_eq!(v["freshness"], "Stale");
        let nodes = v["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["resource"] == "nodes")
            .expect("nodes");
        assert_eq!(nodes["scope"], "Cluster");
        assert_eq!(nodes["shortNames"], json!(["nm"]));
        assert_eq!(nodes["subresources"][0]["subresource"], "status");
        assert!(
            items
                .iter()
                .all(|i| i["metadata"]["name"] != "wardle.example.com"),
            "an extension never reached has no resources to show"
        );
        // The legacy documents list both groups, whether reached or not.
        let list = api_group_list(&served, &ext);
        let names: Vec<&str> = list["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .filter_map(|g| g["name"].as_str())
            .collect();
        assert_eq!(
            names.iter().filter(|n| **n == "metrics.k8s.io").count(),
            1,
            "{names:?}"
        );
        assert!(names.contains(&"wardle.example.com"), "{names:?}");
        let group = api_group(&served, &ext, "wardle.example.com").expect("group");
        assert_eq!(
            group["preferredVersion"]["groupVersion"],
            "wardle.example.com/v1alpha1"
        );
    }
}
