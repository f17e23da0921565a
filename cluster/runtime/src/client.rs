//! A client that waits and retries when the API server sheds load (`429 Too Many Requests`),
//! as client-go's does: a component's burst slows down instead of failing its work.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tessera_client::client::Client;
use tessera_client::request::ApiRequest;
use tessera_client::response::ApiResponse;
use tessera_client::status::ApiError;

/// Tries of one request before a 429 is returned to the caller.
pub const MAX_TRIES: u32 = 10;

/// Wraps a client with retries of 429 answers (10 ms doubling, at most the server's
/// `Retry-After`, at most 1 s per wait).
pub struct Retrying {
    inner: Arc<dyn Client>,
}

impl Retrying {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Client>) -> Arc<dyn Client> {
        Arc::new(Retrying { inner })
    }
}

#[async_trait]
impl Client for Retrying {
    async fn pod_metrics(
        &self,
        namespace: &str,
        label_selector: &str,
    ) -> Result<serde_json::Value, ApiError> {
        self.inner.pod_metrics(namespace, label_selector).await
    }

    async fn pod_stream(
        &self,
        req: &tessera_client::client::PodStreamRequest,
    ) -> Result<tessera_client::client::Switched, ApiError> {
        self.inner.pod_stream(req).await
    }

    async fn call(&self, req: ApiRequest) -> Result<ApiResponse, ApiError> {
        let mut wait = Duration::from_millis(10);
        let mut tries = 1;
        loop {
            match self.inner.call(req.clone()).await {
                Err(e) if e.code == 429 && tries < MAX_TRIES => {
                    let cap = e
                        .retry_after
                        .map_or(Duration::from_secs(1), Duration::from_secs)
                        .min(Duration::from_secs(1));
                    let jitter = 1.0 + rand::random::<f64>() * 0.5;
                    tokio::time::sleep(wait.mul_f64(jitter).min(cap)).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                    tries += 1;
                }
                other => return other,
            }
        }
    }
}
