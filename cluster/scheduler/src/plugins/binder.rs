//! DefaultBinder: binds through the API's `pods/binding` subresource, which assigns a pod
//! once (a second binding is refused with a conflict).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Binding, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Decoded, Verb, find_resource};
use tessera_client::status::ApiError;

use crate::framework::{BindPlugin, CycleState, Plugin, Status};
use crate::resources::PodInfo;

/// The Binding of `pod` to `node`, handed to the API decoded (no JSON text in-process).
fn binding_body(ns: &str, pod: &str, uid: &str, node: &str) -> Result<Decoded, ApiError> {
    Decoded::typed(&Binding {
        metadata: ObjectMeta {
            name: Some(pod.to_owned()),
            namespace: Some(ns.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(node.to_owned()),
            ..ObjectReference::default()
        },
    })
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
        req.object = match binding_body(&ns, pod.name(), pod.uid(), node) {
            Ok(body) => Some(body),
            Err(e) => return Status::error(e.message),
        };
        match self.client.call(req).await {
            Ok(_) => Status::success(),
            Err(e) => Status::error(format!("binding rejected: {} ({})", e.message, e.reason)),
        }
    }
}
