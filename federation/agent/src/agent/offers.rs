//! Frameworks subscribed at the federation, offered this shard's nodes.
//!
//! The federation attaches each framework here over the stream (`OffersDown`); this shard's
//! own allocator ([`tessera_offers::Offers`]) offers it free nodes, launches its tasks as
//! pods and follows them, exactly as for a framework subscribed at the shard — except that
//! it ranks the framework by its share of the whole fleet, from the ledger the federation
//! keeps: the agent reports what each framework holds here every [`LEDGER_PERIOD`]
//! (`OffersLedger`) and is told what it holds elsewhere (`OffersFleet`). Its events go up
//! tagged with its id (`OffersUp`). When the stream ends, every framework of the fleet is
//! detached: its tasks here live on for its failover timeout, as if it had disconnected.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tessera_offers::{FleetView, Offers};
use tessera_proto::federation::v1 as pb;
use tessera_proto::offers::v1 as opb;
use tokio::sync::mpsc;

use super::{State, ensure, send};

/// How often the agent reports what frameworks of the fleet hold here.
pub(super) const LEDGER_PERIOD: Duration = Duration::from_millis(250);

fn amounts(r: Option<opb::Resources>) -> [i64; 2] {
    r.map_or([0, 0], |r| [r.cpu_milli, r.memory_bytes])
}

fn resources(a: [i64; 2]) -> opb::Resources {
    opb::Resources {
        cpu_milli: a[0],
        memory_bytes: a[1],
    }
}

/// Handles one message about a framework of the fleet.
pub(super) async fn handle(state: &Arc<State>, offers: &Offers, m: pb::OffersDown) {
    let id = m.framework;
    match m.op {
        Some(pb::offers_down::Op::Attach(a)) => {
            let Some(mut info) = a.framework else { return };
            info.id = id.clone();
            // The namespace the federation checked the framework may use: the shard may not
            // have it yet (a tenant with no workload here).
            let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": info.namespace}});
            if !ensure(state, &ns).await {
                tracing::warn!(framework = %id, namespace = %info.namespace, "the framework's namespace could not be made here; its tasks will fail");
            }
            let (tx, mut rx) = mpsc::unbounded_channel::<Result<opb::Event, tonic::Status>>();
            offers.attach(info, state.client.clone(), tx);
            let state = state.clone();
            // Ends when the framework is detached (its sender is dropped).
            tokio::spawn(async move {
                while let Some(Ok(event)) = rx.recv().await {
                    send(
                        &state,
                        pb::shard_message::Message::Offers(pb::OffersUp {
                            framework: id.clone(),
                            event: Some(event),
                        }),
                    );
                }
            });
        }
        Some(pb::offers_down::Op::Detach(_)) => offers.detach(&id),
        Some(pb::offers_down::Op::Call(c)) => {
            if let Some(call) = c.call {
                offers.call(&id, call).await;
            }
        }
        None => {}
    }
}

/// What the federation says of the fleet.
pub(super) fn fleet(offers: &Offers, f: pb::OffersFleet) {
    let each = |m: HashMap<String, opb::Resources>| {
        m.into_iter()
            .map(|(id, r)| (id, amounts(Some(r))))
            .collect()
    };
    offers.set_fleet(FleetView {
        total: amounts(f.total),
        elsewhere: each(f.elsewhere),
        usable: each(f.usable),
    });
}

/// Reports the ledger every [`LEDGER_PERIOD`] while frameworks of the fleet are attached.
pub(super) async fn ledger(state: Arc<State>, offers: Offers) {
    let mut tick = tokio::time::interval(LEDGER_PERIOD);
    loop {
        tick.tick().await;
        if let Some(l) = offers.ledger() {
            let (mut holds, mut usable) = (HashMap::new(), HashMap::new());
            for (id, h, u) in l.frameworks {
                holds.insert(id.clone(), resources(h));
                usable.insert(id, resources(u));
            }
            send(
                &state,
                pb::shard_message::Message::Ledger(pb::OffersLedger {
                    total: Some(resources(l.total)),
                    holds,
                    usable,
                }),
            );
        }
    }
}
