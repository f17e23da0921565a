//! The client trait and the HTTPS client live in `tessera-client`; the in-process client —
//! a function call into this server's request layer — is the trait's second implementation,
//! here beside the server it calls.

use async_trait::async_trait;

pub use tessera_client::client::*;

use crate::api::{Api, ApiResponse};
use crate::auth::User;
use crate::request::ApiRequest;
use crate::status::ApiError;

/// Calls the request layer of an API in this process, as `user`.
#[derive(Clone)]
pub struct InProcess {
    api: Api,
    user: User,
}

impl InProcess {
    /// A client of `api` acting as `user`.
    pub fn new(api: Api, user: User) -> Self {
        InProcess { api, user }
    }
}

#[async_trait]
impl Client for InProcess {
    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        self.api.handle(&self.user, req).await
    }

    async fn pod_stream(
        &self,
        req: &tessera_client::client::PodStreamRequest,
    ) -> Result<tessera_client::client::Switched, ApiError> {
        self.api.pod_stream(&self.user, req).await
    }

    async fn pod_metrics(
        &self,
        namespace: &str,
        label_selector: &str,
    ) -> Result<serde_json::Value, ApiError> {
        let query = if label_selector.is_empty() {
            String::new()
        } else {
            format!("labelSelector={}", percent_encode(label_selector))
        };
        self.api
            .resource_metrics(&self.user, &format!("namespaces/{namespace}/pods"), &query)
            .await
    }
}
