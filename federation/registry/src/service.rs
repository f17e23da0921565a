//! The gRPC endpoint shards' agents connect to (`tessera.federation.v1.Federation`): one
//! bidirectional stream per shard. The first message must register the shard; after that
//! the agent's summaries, statuses and renewals go into the [`Registry`] and the registry's
//! assignments go out. A refusal ends the stream with a status that says what to fix; the
//! federation keeps serving every other shard.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tessera_proto::federation::v1 as pb;
use tessera_proto::federation::v1::federation_server::{Federation, FederationServer};
use tonic::{Request, Response, Status, Streaming};

use crate::registry::{RegisterError, Registry};

/// How long an agent has to send its registration after connecting.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// The service.
pub struct FederationService {
    registry: Arc<Registry>,
}

impl FederationService {
    /// The service over `registry`, ready for a tonic server.
    pub fn server(registry: Arc<Registry>) -> FederationServer<FederationService> {
        FederationServer::new(FederationService { registry })
            // Summaries of shards of many node shapes and big objects fit; more is refused.
            .max_decoding_message_size(16 << 20)
    }
}

fn refuse(registry: &Registry, reason: &str) {
    if let Some(m) = registry.metrics() {
        m.refused.with_label_values(&[reason]).inc();
    }
}

#[tonic::async_trait]
impl Federation for FederationService {
    type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::FederationMessage, Status>> + Send>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::ShardMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer = request.remote_addr();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded("no Register message within 10 s of connecting")
            })??;
        let Some(pb::ShardMessage {
            message: Some(pb::shard_message::Message::Register(reg)),
        }) = first
        else {
            refuse(&self.registry, "not_registered");
            return Err(Status::failed_precondition(
                "the first message on the stream must be Register (name, token, labels)",
            ));
        };
        let (session, rx) = self.registry.register(&reg).map_err(|e| {
            tracing::warn!(shard = %reg.name, peer = ?peer, error = %e, "registration refused");
            match e {
                RegisterError::BadToken => {
                    refuse(&self.registry, "bad_token");
                    Status::unauthenticated(e.to_string())
                }
                RegisterError::Duplicate(_) => {
                    refuse(&self.registry, "duplicate");
                    Status::already_exists(e.to_string())
                }
                RegisterError::BadName { .. } | RegisterError::BadLabel { .. } => {
                    refuse(&self.registry, "invalid");
                    Status::invalid_argument(e.to_string())
                }
            }
        })?;
        let name = reg.name.clone();
        let registry = self.registry.clone();
        // Errors found in what the agent sends end its stream through this channel.
        let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<Status>();
        tokio::spawn(async move {
            let mut fail_tx = Some(fail_tx);
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(shard = %name, error = %e, "stream from shard ended");
                        break;
                    }
                };
                let result = match msg.message {
                    Some(pb::shard_message::Message::Summary(s)) => {
                        registry.summary(&name, session, &s).map_err(|why| {
                            refuse(&registry, "bad_summary");
                            format!("malformed capacity summary: {why}")
                        })
                    }
                    Some(pb::shard_message::Message::Status(s)) => registry
                        .status(&name, session, &s)
                        .map_err(|why| format!("malformed object status: {why}")),
                    Some(pb::shard_message::Message::Renew(r)) => {
                        if !registry.renew(&name, session, r.seq) {
                            // Not a malformed message: the lease lapsed (or another session
                            // took it). The agent registers again, on a new stream, and is
                            // sent everything it holds from scratch.
                            tracing::warn!(shard = %name, session, "the shard's lease lapsed; ending its stream");
                            if let Some(tx) = fail_tx.take() {
                                let _ = tx.send(Status::aborted(
                                    "this session no longer holds the shard's lease (it lapsed): register again",
                                ));
                            }
                            break;
                        }
                        Ok(())
                    }
                    Some(pb::shard_message::Message::Reply(r)) => registry.reply(&name, session, r),
                    Some(
                        m @ (pb::shard_message::Message::Offers(_)
                        | pb::shard_message::Message::Ledger(_)),
                    ) => {
                        registry.offers_message(&name, session, m);
                        Ok(())
                    }
                    Some(pb::shard_message::Message::Register(_)) => {
                        Err("Register may be sent only once per stream".into())
                    }
                    None => Err("an empty message".into()),
                };
                if let Err(why) = result {
                    tracing::warn!(shard = %name, session, why, "refusing the shard's stream");
                    if let Some(tx) = fail_tx.take() {
                        let _ = tx.send(Status::invalid_argument(why));
                    }
                    break;
                }
            }
            registry.disconnect(&name, session);
        });
        let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(Ok);
        let failure = futures::stream::once(async move {
            match fail_rx.await {
                Ok(status) => Some(Err(status)),
                Err(_) => None,
            }
        })
        .filter_map(|x| async move { x });
        // Whichever ends first: the assignments, or a refusal of what the agent sent.
        let stream = futures::stream::select(outbound, failure);
        Ok(Response::new(Box::pin(stream)))
    }
}
