//! The gRPC health service (`grpc.health.v1.Health`) for a process: SERVING while its store
//! answers, NOT_SERVING while it does not. Kubernetes' gRPC probes and grpc_health_probe
//! speak this protocol.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tessera_proto::health::v1::health_check_response::ServingStatus;
use tessera_proto::health::v1::health_server::{Health, HealthServer};
use tessera_proto::health::v1::{HealthCheckRequest, HealthCheckResponse};
use tessera_store::Store;
use tonic::{Request, Response, Status};

/// Services this process reports on; "" is the process as a whole.
const SERVICES: &[&str] = &["", "tessera.store"];

/// Answers health checks from the store's reachability.
pub struct StoreHealth {
    store: Arc<dyn Store>,
}

impl StoreHealth {
    async fn status(&self) -> ServingStatus {
        match self.store.current_revision().await {
            Ok(_) => ServingStatus::Serving,
            Err(e) => {
                tracing::warn!(error = %e, "health: store not answering");
                ServingStatus::NotServing
            }
        }
    }
}

fn known(service: &str) -> Result<(), Status> {
    if SERVICES.contains(&service) {
        Ok(())
    } else {
        Err(Status::not_found(format!(
            "unknown service {service:?}; this server reports on {SERVICES:?}"
        )))
    }
}

#[tonic::async_trait]
impl Health for StoreHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        known(&request.get_ref().service)?;
        Ok(Response::new(HealthCheckResponse {
            status: self.status().await as i32,
        }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let unknown = !SERVICES.contains(&service.as_str());
        let me = StoreHealth {
            store: self.store.clone(),
        };
        // Send the status now, then each change (checked every second).
        let stream =
            futures::stream::unfold((me, None::<ServingStatus>), move |(me, last)| async move {
                loop {
                    let now = if unknown {
                        ServingStatus::ServiceUnknown
                    } else {
                        me.status().await
                    };
                    if last != Some(now) {
                        let item = Ok(HealthCheckResponse { status: now as i32 });
                        return Some((item, (me, Some(now))));
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The health service of a process whose health is its store's, to serve beside others.
pub fn service(store: Arc<dyn Store>) -> HealthServer<StoreHealth> {
    HealthServer::new(StoreHealth { store })
}

/// The connections `listener` accepts, for a gRPC server, with Nagle's algorithm off: a
/// small message (a lease renewal's answer, a tunnel's credit) goes out at once instead of
/// waiting for the peer's delayed ACK — up to 40 ms a message on Linux, which capped a pod
/// stream tunnelled through the federation at ~35 MiB/s.
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        if let Ok(c) = &conn {
            let _ = c.set_nodelay(true);
        }
        conn
    })
}

/// Serves the health service on `addr` until the process ends; returns the bound address.
pub async fn serve(addr: SocketAddr, store: Arc<dyn Store>) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let incoming = incoming(listener);
    let service = HealthServer::new(StoreHealth { store });
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });
    Ok(bound)
}
