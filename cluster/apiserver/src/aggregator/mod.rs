//! API aggregation, kube-aggregator's part of kube-apiserver: an APIService naming a
//! Service (`spec.service`) hands its group-version to an extension API server —
//! metrics-server, prometheus-adapter, KEDA's metrics server, KubeVirt's subresources,
//! the sample wardle server.
//!
//! - **Routing.** APIServices are followed in memory ([`crate::follow::Followed`]); a request
//!   under `/apis/<group>/<version>` of one that names a Service is authenticated and
//!   authorized here, then proxied ([`proxy`]) to an address of the Service's Endpoints
//!   (kube-apiserver's `--enable-aggregator-routing`), over TLS checked against the
//!   APIService's `caBundle` (or not, with `insecureSkipTLSVerify`).
//! - **Who is asking.** The proxy presents the front proxy's client certificate
//!   ([`crate::pki::FrontProxy`]) and names the caller in `X-Remote-User`,
//!   `X-Remote-Group` and `X-Remote-Extra-*`, dropping any such header the caller sent. An
//!   extension server learns which CA to trust for those headers, and which for client
//!   certificates, from the ConfigMap `kube-system/extension-apiserver-authentication`
//!   ([`authentication_config_map`]), and asks this server what the caller may do with
//!   SubjectAccessReviews — which enforce tenant isolation as every request here does.
//! - **Availability and discovery** ([`available`]): every API server checks each such
//!   APIService (its Service, Endpoints, and a GET of `/apis/<group>/<version>` at the
//!   extension server) every [`available::PERIOD`] and on every change, writes the
//!   `Available` condition as Kubernetes words it, and keeps the extension's resource list
//!   for `/apis` (both the aggregated and the legacy discovery documents).

pub mod available;
pub mod proxy;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tessera_store::Store;

use crate::catalog::APIREGISTRATION;
use crate::follow::Followed;
use crate::status::ApiError;

/// The ConfigMap in `kube-system` where extension API servers read how to authenticate
/// requests (kube-apiserver's name).
pub const AUTHENTICATION_CONFIG_MAP: &str = "extension-apiserver-authentication";

/// The headers the proxy names the caller in (Kubernetes' defaults).
pub const USER_HEADER: &str = "X-Remote-User";
/// See [`USER_HEADER`].
pub const GROUP_HEADER: &str = "X-Remote-Group";
/// See [`USER_HEADER`]; one header per key of the caller's extra fields.
pub const EXTRA_HEADER_PREFIX: &str = "X-Remote-Extra-";

/// One APIService served by an extension API server.
#[derive(Debug)]
pub struct Remote {
    /// The APIService's name (`v1beta1.metrics.k8s.io`).
    pub name: String,
    /// The group.
    pub group: String,
    /// The version.
    pub version: String,
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The Service's port (443 unless set).
    pub port: u16,
    /// The CA (PEM) the extension server's certificate must chain to; `None` with
    /// `insecureSkipTLSVerify`.
    pub ca_pem: Option<Arc<str>>,
    /// `spec.groupPriorityMinimum`.
    pub group_priority: i64,
    /// `spec.versionPriority`.
    pub version_priority: i64,
}

impl Remote {
    /// The name the extension server's certificate is checked for (and the `Host`):
    /// `<service>.<namespace>.svc`, as kube-aggregator checks it.
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// An APIService as the proxy uses it: `None` for a local one (or one validation would
/// have refused).
fn compile(name: &str, obj: &Value) -> Option<Arc<Remote>> {
    let spec = &obj["spec"];
    let service = &spec["service"];
    if !service.is_object() {
        return None;
    }
    let ca_pem = crate::webhooks::ca_bundle(&spec["caBundle"]);
    if ca_pem.is_none() && spec["insecureSkipTLSVerify"] != json!(true) {
        return None;
    }
    Some(Arc::new(Remote {
        name: name.to_owned(),
        group: spec["group"].as_str()?.to_owned(),
        version: spec["version"].as_str()?.to_owned(),
        namespace: service["namespace"].as_str()?.to_owned(),
        service: service["name"].as_str()?.to_owned(),
        port: service["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(443),
        ca_pem,
        group_priority: spec["groupPriorityMinimum"].as_i64().unwrap_or(0),
        version_priority: spec["versionPriority"].as_i64().unwrap_or(0),
    }))
}

/// The APIServices served by extension servers, by (group, version).
#[derive(Debug, Default)]
pub struct Routes {
    by_gv: HashMap<(String, String), Arc<Remote>>,
}

impl Routes {
    /// Whether no group-version is proxied (the common case: one check per request).
    pub fn is_empty(&self) -> bool {
        self.by_gv.is_empty()
    }

    /// The extension server of `group`/`version`, if one serves it.
    pub fn get(&self, group: &str, version: &str) -> Option<&Arc<Remote>> {
        if self.by_gv.is_empty() {
            return None;
        }
        self.by_gv.get(&(group.to_owned(), version.to_owned()))
    }

    /// Whether an extension server serves some version of `group`.
    pub fn serves_group(&self, group: &str) -> bool {
        self.by_gv.keys().any(|(g, _)| g == group)
    }

    /// Every proxied APIService, in discovery order: groups by `groupPriorityMinimum`
    /// (highest first) then name, versions by `versionPriority` (highest first).
    pub fn in_order(&self) -> Vec<Arc<Remote>> {
        let mut all: Vec<Arc<Remote>> = self.by_gv.values().cloned().collect();
        let group_priority = |g: &str| {
            all.iter()
                .filter(|r| r.group == g)
                .map(|r| r.group_priority)
                .max()
                .unwrap_or(0)
        };
        let priorities: HashMap<String, i64> = all
            .iter()
            .map(|r| (r.group.clone(), group_priority(&r.group)))
            .collect();
        all.sort_by(|a, b| {
            priorities[&b.group]
                .cmp(&priorities[&a.group])
                .then_with(|| a.group.cmp(&b.group))
                .then_with(|| b.version_priority.cmp(&a.version_priority))
                .then_with(|| {
                    crate::crd::version_priority(&a.version)
                        .cmp(&crate::crd::version_priority(&b.version))
                })
        });
        all
    }
}

/// What an extension server said of its group-version at the last check.
#[derive(Clone, Debug)]
pub struct Discovered {
    /// Its `APIResourceList`.
    pub resources: Arc<Value>,
    /// Whether the last check reached it (else the list is the last one seen: `Stale`).
    pub current: bool,
}

/// The APIServices followed: each compiled to its extension server, if it names one.
type Services = Followed<Option<Arc<Remote>>>;

/// The aggregation layer of one API server.
#[derive(Clone)]
pub struct Aggregator {
    services: Arc<Services>,
    routes: Arc<parking_lot::RwLock<Arc<Routes>>>,
    discovered: Arc<parking_lot::Mutex<HashMap<String, Discovered>>>,
    transport: Arc<parking_lot::RwLock<Option<Arc<proxy::Transport>>>>,
    /// Woken on every change of the APIServices (the availability checker waits on it).
    changed: Arc<tokio::sync::Notify>,
    /// Each APIService's Service address as last resolved, and when.
    resolved: Arc<parking_lot::Mutex<HashMap<String, (std::time::Instant, std::net::SocketAddr)>>>,
}

/// How long the proxy reuses a Service's resolved address (its Service and Endpoints are
/// read again after it, or at once after a failed connection): a Service's move reaches
/// the proxy within this, as it reaches kube-proxy within its sync period.
pub const RESOLVED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl Aggregator {
    /// The APIServices in `store`, read on first use.
    pub fn new(store: Arc<dyn Store>) -> Aggregator {
        let routes: Arc<parking_lot::RwLock<Arc<Routes>>> = Arc::default();
        let changed = Arc::new(tokio::sync::Notify::new());
        let holder: Arc<parking_lot::Mutex<std::sync::Weak<Services>>> = Arc::default();
        let on_change: Arc<dyn Fn() + Send + Sync> = {
            let routes = routes.clone();
            let holder = holder.clone();
            let changed = changed.clone();
            Arc::new(move || {
                let Some(services) = holder.lock().upgrade() else {
                    return;
                };
                let by_gv = services
                    .current()
                    .into_iter()
                    .filter_map(|(_, r)| r)
                    .map(|r| ((r.group.clone(), r.version.clone()), r))
                    .collect();
                *routes.write() = Arc::new(Routes { by_gv });
                changed.notify_waiters();
            })
        };
        let services = Followed::new(
            store,
            APIREGISTRATION,
            "apiservices",
            "APIServices",
            compile,
            on_change,
        );
        *holder.lock() = Arc::downgrade(&services);
        Aggregator {
            services,
            routes,
            discovered: Arc::default(),
            transport: Arc::default(),
            changed,
            resolved: Arc::default(),
        }
    }

    /// Proxies with `front_proxy`'s client certificate from now on.
    pub fn set_front_proxy(&self, front_proxy: &crate::pki::FrontProxy) -> Result<(), String> {
        *self.transport.write() = Some(Arc::new(proxy::Transport::new(front_proxy)?));
        Ok(())
    }

    /// The transport to extension servers, if the server has a front-proxy certificate.
    pub fn transport(&self) -> Option<Arc<proxy::Transport>> {
        self.transport.read().clone()
    }

    /// The proxied group-versions: the APIServices listed (on first use) and followed since.
    pub async fn routes(&self) -> Result<Arc<Routes>, ApiError> {
        self.services.start().await?;
        Ok(self.routes.read().clone())
    }

    /// [`Self::routes`] as they are, without waiting for the first list (empty before it).
    pub fn current_routes(&self) -> Arc<Routes> {
        self.routes.read().clone()
    }

    /// Records a write of an APIService through this server (`obj` None: deleted), so the
    /// next request is routed by it before the watch delivers it.
    pub fn applied(
        &self,
        res: &crate::catalog::Resource,
        key: &[u8],
        obj: Option<&Value>,
        rev: i64,
    ) {
        if crate::apiservices::is_apiservice(res) {
            self.services.applied(key, obj, rev);
        }
    }

    /// Where `remote`'s Service is reached: resolved at most once per [`RESOLVED_FOR`].
    pub(crate) async fn address(
        &self,
        api: &crate::api::Api,
        remote: &Remote,
    ) -> Result<std::net::SocketAddr, String> {
        if let Some((at, addr)) = self.resolved.lock().get(&remote.name)
            && at.elapsed() < RESOLVED_FOR
        {
            return Ok(*addr);
        }
        let addr = api
            .service_address(&remote.namespace, &remote.service, remote.port)
            .await
            .map_err(|t| t.message)?;
        let mut resolved = self.resolved.lock();
        if resolved.len() > 4096 {
            resolved.clear();
        }
        resolved.insert(remote.name.clone(), (std::time::Instant::now(), addr));
        Ok(addr)
    }

    /// After a write of `res` at `key` through this server: a Service or Endpoints behind
    /// an APIService has its cached address dropped and the APIService checked again now,
    /// not at the next period (writes through other API servers are seen at the period).
    pub fn service_written(&self, res: &crate::catalog::Resource, key: &[u8]) {
        if !res.group.is_empty() || !matches!(res.plural, "services" | "endpoints") {
            return;
        }
        let routes = self.current_routes();
        if routes.is_empty() {
            return;
        }
        let Ok(key) = std::str::from_utf8(key) else {
            return;
        };
        let mut parts = key.rsplitn(3, '/');
        let (Some(name), Some(ns)) = (parts.next(), parts.next()) else {
            return;
        };
        let behind: Vec<&Arc<Remote>> = routes
            .by_gv
            .values()
            .filter(|r| r.namespace == ns && r.service == name)
            .collect();
        if behind.is_empty() {
            return;
        }
        for r in behind {
            self.forget_address(&r.name);
        }
        self.changed.notify_waiters();
    }

    /// Forgets `name`'s resolved address (its connection failed).
    pub(crate) fn forget_address(&self, name: &str) {
        self.resolved.lock().remove(name);
    }

    /// What the extension server of APIService `name` last said of its resources.
    pub fn discovered(&self, name: &str) -> Option<Discovered> {
        self.discovered.lock().get(name).cloned()
    }

    fn set_discovered(&self, name: &str, found: Option<Value>) {
        let mut d = self.discovered.lock();
        match found {
            Some(list) => {
                d.insert(
                    name.to_owned(),
                    Discovered {
                        resources: Arc::new(list),
                        current: true,
                    },
                );
            }
            None => {
                if let Some(old) = d.get_mut(name) {
                    old.current = false;
                }
            }
        }
    }

    fn forget_others(&self, keep: &[Arc<Remote>]) {
        self.discovered
            .lock()
            .retain(|name, _| keep.iter().any(|r| &r.name == name));
    }
}

/// The ConfigMap `kube-system/extension-apiserver-authentication`: the client CA
/// (`client-ca-file`), the front proxy's CA and name, and the headers it names callers in.
pub fn authentication_config_map(client_ca_pem: &str, front_proxy_ca_pem: &str) -> Value {
    let list = |v: &[&str]| serde_json::to_string(v).unwrap_or_default();
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": AUTHENTICATION_CONFIG_MAP, "namespace": "kube-system"},
        "data": {
            "client-ca-file": client_ca_pem,
            "requestheader-client-ca-file": front_proxy_ca_pem,
            "requestheader-allowed-names": list(&[crate::pki::FRONT_PROXY_CLIENT]),
            "requestheader-username-headers": list(&[USER_HEADER]),
            "requestheader-group-headers": list(&[GROUP_HEADER]),
            "requestheader-extra-headers-prefix": list(&[EXTRA_HEADER_PREFIX]),
        },
    })
}

/// Puts [`authentication_config_map`] in place (created, or its data replaced when it
/// differs: a rotated CA reaches extension servers).
pub async fn ensure_authentication_config_map(
    client: &dyn crate::client::Client,
    client_ca_pem: &str,
    front_proxy_ca_pem: &str,
) -> Result<(), ApiError> {
    let res = crate::request::find_resource("", "v1", "configmaps")?;
    let want = authentication_config_map(client_ca_pem, front_proxy_ca_pem);
    match client
        .get(res, Some("kube-system"), AUTHENTICATION_CONFIG_MAP)
        .await
    {
        Err(e) if e.code == 404 => client
            .create_if_absent(res, Some("kube-system"), &want)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
        Ok(cur) if cur["data"] == want["data"] => Ok(()),
        Ok(mut cur) => {
            cur["data"] = want["data"].clone();
            client
                .update(res, Some("kube-system"), &cur)
                .await
                .map(|_| ())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(group: &str, version: &str, group_priority: i64, version_priority: i64) -> Value {
        json!({"spec": {"group": group, "version": version, "groupPriorityMinimum": group_priority,
            "versionPriority": version_priority, "insecureSkipTLSVerify": true,
            "service": {"namespace": "ns", "name": "svc"}}})
    }

    #[test]
    fn only_apiservices_naming_a_service_are_proxied() {
        let local = json!({"spec": {"group": "apps", "version": "v1",
            "groupPriorityMinimum": 100, "versionPriority": 15}});
        assert!(compile("v1.apps", &local).is_none());
        let mut unverifiable = service("x.io", "v1", 100, 10);
        unverifiable["spec"]["insecureSkipTLSVerify"] = json!(false);
        assert!(compile("v1.x.io", &unverifiable).is_none());
        let r = compile("v1.x.io", &service("x.io", "v1", 100, 10)).expect("remote");
        assert_eq!((r.port, r.server_name().as_str()), (443, "svc.ns.svc"));
        assert!(r.ca_pem.is_none());
    }

    #[test]
    fn routes_come_in_discovery_order() {
        let remotes = [
            ("v1.b.io", service("b.io", "v1", 100, 10)),
            ("v2.b.io", service("b.io", "v2", 100, 20)),
            ("v1.a.io", service("a.io", "v1", 50, 10)),
            ("v1.c.io", service("c.io", "v1", 1000, 10)),
        ];
        let by_gv = remotes
            .iter()
            .filter_map(|(n, o)| compile(n, o))
            .map(|r| ((r.group.clone(), r.version.clone()), r))
            .collect();
        let routes = Routes { by_gv };
        let order: Vec<String> = routes.in_order().iter().map(|r| r.name.clone()).collect();
        assert_eq!(order, ["v1.c.io", "v2.b.io", "v1.b.io", "v1.a.io"]);
        assert!(routes.get("b.io", "v2").is_some() && routes.get("b.io", "v3").is_none());
        assert!(routes.serves_group("a.io") && !routes.serves_group("apps"));
    }
}
