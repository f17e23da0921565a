//! Custom objects at the federation: for each CustomResourceDefinition the federation holds,
//! an informer of its storage version's objects, started when the CRD appears and stopped
//! when it goes. A custom object is held by its tenant's home shard (the first shard of the
//! tenant's preference on the current shard map), which serves the kind because every shard
//! holds the federation's CRDs; an operator running there sees it as one applied in the
//! shard.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tessera_client::catalog::Resource;
use tessera_client::client::Client;
use tessera_runtime::WorkQueue;
use tessera_runtime::informer::{Cache, Informer, Scope, WholeObject, key_of};
use tessera_runtime::metrics::RuntimeMetrics;

/// One custom kind followed at the federation.
struct Followed {
    resource: &'static Resource,
    informer: Arc<Informer<WholeObject>>,
    cache: Arc<Cache<WholeObject>>,
    _task: tessera_runtime::informer::Tasks,
}

/// The custom kinds followed, by queue prefix (`plural.group`).
pub(crate) struct CustomKinds {
    client: Arc<dyn Client>,
    metrics: Option<RuntimeMetrics>,
    followed: Mutex<HashMap<String, Followed>>,
}

/// The queue prefix of a custom kind (`widgets.example.com`): a plural with a dot, which no
/// built-in kind's prefix has.
pub(crate) fn prefix_of(res: &Resource) -> String {
    format!("{}.{}", res.plural, res.group)
}

impl CustomKinds {
    pub(crate) fn new(client: Arc<dyn Client>, metrics: Option<RuntimeMetrics>) -> CustomKinds {
        CustomKinds {
            client,
            metrics,
            followed: Mutex::new(HashMap::new()),
        }
    }

    /// Follows the objects of `crd` (its storage version), or stops following them when the
    /// CRD is gone or going (`crd` None or terminating: its objects go with it). Returns the
    /// objects no longer followed (their kind and key), for their copies to be let go.
    pub(crate) fn crd_changed(
        &self,
        name: &str,
        crd: Option<&Value>,
        queue: &WorkQueue<String>,
    ) -> Vec<(&'static Resource, String)> {
        let live = crd.filter(|c| c["metadata"]["deletionTimestamp"].is_null());
        let res = live.and_then(tessera_client::catalog::custom_storage_resource);
        let mut followed = self.followed.lock();
        if let (Some(res), Some(f)) = (res, followed.get(name))
            && std::ptr::eq(f.resource, res)
        {
            return Vec::new();
        }
        // A new storage version is followed in place of the old (the objects' keys do not
        // name a version, so their copies stay); a CRD gone lets its objects' copies go.
        let dropped: Vec<(&'static Resource, String)> = followed
            .remove(name)
            .filter(|_| res.is_none())
            .map(|f| {
                f.cache
                    .list()
                    .iter()
                    .map(|o| (f.resource, key_of(&o.metadata)))
                    .collect()
            })
            .unwrap_or_default();
        let Some(res) = res else {
            return dropped;
        };
        let inf = Informer::<WholeObject>::new(
            self.client.clone(),
            res,
            Scope::default(),
            self.metrics.clone(),
        );
        let (q, prefix) = (queue.clone(), prefix_of(res));
        inf.on_change(move |c| {
            q.add(
                format!("{prefix}:{}", key_of(&c.object().metadata)),
                c.class(),
            )
        })
        .detach();
        let cache = inf.cache().clone();
        let task = tokio::spawn(inf.clone().run());
        followed.insert(
            name.to_owned(),
            Followed {
                resource: res,
                informer: inf,
                cache,
                _task: tessera_runtime::informer::Tasks(vec![task]),
            },
        );
        dropped
    }

    /// The resource and object at `key` of the kind with queue prefix `prefix`.
    pub(crate) fn get(&self, prefix: &str, key: &str) -> Option<(&'static Resource, Value)> {
        let followed = self.followed.lock();
        let f = followed
            .values()
            .find(|f| prefix_of(f.resource) == prefix)?;
        let o = f.cache.get(key)?;
        Some((f.resource, serde_json::to_value(o.as_ref()).ok()?))
    }

    /// The resource of the kind with queue prefix `prefix`, if followed.
    pub(crate) fn resource(&self, prefix: &str) -> Option<&'static Resource> {
        self.followed
            .lock()
            .values()
            .find(|f| prefix_of(f.resource) == prefix)
            .map(|f| f.resource)
    }

    /// Once every kind followed has listed its objects (at start, before the agents are told
    /// they hold all they should: a copy not assigned again by then would be removed).
    pub(crate) async fn listed(&self) {
        let informers: Vec<Arc<Informer<WholeObject>>> = self
            .followed
            .lock()
            .values()
            .map(|f| f.informer.clone())
            .collect();
        for i in informers {
            i.synced().await;
        }
    }

    /// The queue key of every custom object followed.
    pub(crate) fn all_keys(&self) -> Vec<String> {
        self.followed
            .lock()
            .values()
            .flat_map(|f| {
                let prefix = prefix_of(f.resource);
                f.cache
                    .list()
                    .into_iter()
                    .map(move |o| format!("{prefix}:{}", key_of(&o.metadata)))
            })
            .collect()
    }
}

/// A custom object as a shard should hold it: what `carry` keeps of any object, and every
/// top-level field but `status` (the shard's, as for built-in kinds).
pub(crate) fn manifest(obj: &Value) -> Value {
    let fields: Vec<&str> = obj
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .filter(|k| !matches!(*k, "apiVersion" | "kind" | "metadata" | "status"))
        .collect();
    let mut m = crate::dependencies::carry(obj, &fields);
    if let Some(meta) = m["metadata"].as_object_mut() {
        meta.retain(|_, v| !v.is_null());
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_shard_gets_the_object_without_its_status() {
        let obj = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "shop", "uid": "u", "resourceVersion": "9",
                "labels": {"a": "b"}},
            "spec": {"size": 3}, "data": {"k": "v"}, "status": {"ready": true}});
        let m = manifest(&obj);
        assert_eq!(m["spec"], json!({"size": 3}));
        assert_eq!(m["data"], json!({"k": "v"}));
        assert!(m.get("status").is_none());
        assert!(
            m["metadata"].get("uid").is_none() && m["metadata"].get("resourceVersion").is_none()
        );
        assert_eq!(m["metadata"]["labels"]["tessera.io/federated"], "true");
        assert_eq!(m["metadata"]["labels"]["a"], "b");
    }
}
