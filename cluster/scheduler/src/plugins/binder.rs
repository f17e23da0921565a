//! DefaultBinder: binds through the API's `pods/binding` subresource, which assigns a pod
//! once (a second binding is refused with a conflict).

use std::sync::Arc;

use async_trait::async_trait;
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Verb, find_resource};

use crate::framework::{BindPlugin, CycleState, Plugin, Status};
use crate::resources::PodInfo;

/// The Binding object for `pod` to `node`.
fn binding_body(ns: &str, pod: &str, uid: &str, node: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod, "namespace": ns, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    })
    .to_string()
}

/// DefaultBinder.
pub struct DefaultBinder {
    client: Arc<dyn Client>,
}

impl DefaultBinder {
    /// A binder writing through `client`.
    pub fn new(client: Arc<dyn Client>) -> Self {
        DefaultBinder { client }
    }
}

impl Plugin for DefaultBinder {
    fn name(&self) -> &'static str {
        "DefaultBinder"
    }
    fn bind(&self) -> Option<&dyn BindPlugin> {
        Some(self)
    }
}

#[async_trait]
impl BindPlugin for DefaultBinder {
    async fn bind(&self, _: &CycleState, pod: &PodInfo, node: &str) -> Status {
        let Ok(pods) = find_resource("", "v1", "pods") else {
            return Status::error("the API serves no pods");
        };
        let ns = pod.pod.metadata.namespace.clone().unwrap_or_default();
        let mut req = ApiRequest::new(Verb::Create, pods);
        req.namespace = Some(ns.clone());
        req.name = Some(pod.name().to_owned());
        req.subresource = Some("binding".into());
        req.body = binding_body(&ns, pod.name(), pod.uid(), node).into();
        match self.client.call(req).await {
            Ok(_) => Status::success(),
            Err(e) => Status::error(format!("binding rejected: {} ({})", e.message, e.reason)),
        }
    }
}
