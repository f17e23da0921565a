//! The federation's offers endpoint (`tessera.offers.v1`, the protocol a shard serves): a
//! framework subscribes once, at the federation, and is offered the nodes of every shard.
//!
//! Node lists never leave their shards. The federation attaches each framework to every
//! connected shard's allocator over that shard's stream; each shard offers its own free
//! nodes, and ranks the frameworks by Dominant Resource Fairness over the **whole fleet**:
//! every half second each shard reports what each framework holds there and what it offers
//! in all (`OffersLedger`), and the federation answers with the fleet's total and what each
//! framework holds in the other shards (`OffersFleet`). The allocator is therefore one DRF
//! ledger for the fleet, applied in every shard at once — the work per offer stays in the
//! node's shard, and the federation's work grows with frameworks × shards, not with nodes.
//!
//! Offers reach the framework with ids `<shard>/<id>` and the node label
//! [`SHARD_LABEL`]; an accept, a decline and a kill go to the shard that holds the offer or
//! the task. A framework that disconnects is detached in every shard: each kills its tasks
//! there once the framework's failover timeout passes, unless it subscribes again (with its
//! id) in time. A shard that drops out takes its outstanding offers with it (rescinded).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::Stream;
use parking_lot::Mutex;
use tessera_offers::{Authenticate, EventTx, OfferMetrics};
use tessera_proto::federation::v1 as pb;
use tessera_proto::offers::v1 as opb;
use tessera_proto::offers::v1::scheduler_server::{Scheduler, SchedulerServer};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::registry::{Registry, RegistryEvent};

/// The node label on an offer the federation relays: the node's shard.
pub const SHARD_LABEL: &str = "tessera.io/shard";

/// Between heartbeats on each framework's stream.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// cpu (milli) and memory (bytes).
type Amounts = [i64; 2];

struct Framework {
    info: opb::FrameworkInfo,
    tx: Option<EventTx>,
    gone_since: Option<Instant>,
    /// Its tasks not yet finished, by name: the shard each runs in.
    tasks: HashMap<String, String>,
}

impl Framework {
    fn send(&self, e: opb::event::Event) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Ok(opb::Event { event: Some(e) }));
        }
    }

    fn error(&self, message: String) {
        self.send(opb::event::Event::Error(opb::event::Error { message }));
    }
}

/// An offer a framework holds: where it came from.
struct Outstanding {
    shard: String,
    /// The shard's own id of it.
    local: String,
    framework: String,
}

/// What a shard last reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// What it offers in all.
    pub total: Amounts,
    /// What each framework of the fleet holds there.
    pub holds: HashMap<String, Amounts>,
    /// What each could be offered there (the nodes it does not refuse).
    pub usable: HashMap<String, Amounts>,
}

/// The fleet as one shard is to see it ([`fleet_for`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetFor {
    /// What all shards offer in all.
    pub total: Amounts,
    /// What each framework holds in the other shards.
    pub elsewhere: HashMap<String, Amounts>,
    /// What each framework could be offered in the whole fleet.
    pub usable: HashMap<String, Amounts>,
}

#[derive(Default)]
struct State {
    frameworks: HashMap<String, Framework>,
    offers: HashMap<String, Outstanding>,
    ledgers: HashMap<String, Ledger>,
    next: u64,
}

/// The fleet as shard `shard` is to see it: what all shards with a ledger offer, what each
/// framework holds in the others, and what each could be offered anywhere.
pub fn fleet_for(ledgers: &HashMap<String, Ledger>, shard: &str) -> FleetFor {
    let mut out = FleetFor::default();
    let sum = |into: &mut HashMap<String, Amounts>, from: &HashMap<String, Amounts>| {
        for (f, a) in from {
            let e = into.entry(f.clone()).or_default();
            e[0] += a[0];
            e[1] += a[1];
        }
    };
    for (name, l) in ledgers {
        out.total[0] += l.total[0];
        out.total[1] += l.total[1];
        sum(&mut out.usable, &l.usable);
        if name != shard {
            sum(&mut out.elsewhere, &l.holds);
        }
    }
    out
}

fn resources(a: Amounts) -> opb::Resources {
    opb::Resources {
        cpu_milli: a[0],
        memory_bytes: a[1],
    }
}

fn live(state: i32) -> bool {
    state == opb::TaskState::TaskStaging as i32 || state == opb::TaskState::TaskRunning as i32
}

/// The federation's offers endpoint.
#[derive(Clone)]
pub struct FleetOffers {
    shared: Arc<Shared>,
}

struct Shared {
    registry: Arc<Registry>,
    authenticate: Authenticate,
    /// What a framework's token must be allowed to list in its namespace.
    probe: &'static tessera_client::catalog::Resource,
    metrics: Option<OfferMetrics>,
    state: Mutex<State>,
}

impl FleetOffers {
    /// The endpoint over `registry`'s shards; frameworks' tokens are checked with
    /// `authenticate` (the federation's API), which must let them list `probe` in their
    /// namespace. Call [`FleetOffers::run`] for heartbeats and failover timeouts.
    pub fn new(
        registry: Arc<Registry>,
        authenticate: Authenticate,
        probe: &'static tessera_client::catalog::Resource,
        metrics: Option<OfferMetrics>,
    ) -> FleetOffers {
        let shared = Arc::new(Shared {
            registry: registry.clone(),
            authenticate,
            probe,
            metrics,
            state: Mutex::new(State::default()),
        });
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        registry.set_offers_relay(Arc::new(move |shard, m| {
            if let Some(s) = weak.upgrade() {
                match m {
                    pb::shard_message::Message::Offers(up) => s.up(shard, up),
                    pb::shard_message::Message::Ledger(l) => s.ledger(shard, l),
                    _ => {}
                }
            }
        }));
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        registry.on_event(move |e| {
            let Some(s) = weak.upgrade() else { return };
            match e {
                RegistryEvent::Joined(shard) => s.joined(shard),
                RegistryEvent::Shard(shard) if !s.registry.is_connected(shard) => s.left(shard),
                _ => {}
            }
        });
        FleetOffers { shared }
    }

    /// The gRPC server of this endpoint.
    pub fn server(&self) -> SchedulerServer<FleetOffers> {
        SchedulerServer::new(self.clone())
    }

    /// Sends heartbeats and forgets frameworks gone past their failover timeout (each shard
    /// kills their tasks on its own clock), until dropped.
    pub async fn run(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut beat = Instant::now();
        loop {
            tick.tick().await;
            let now = Instant::now();
            let mut st = self.shared.state.lock();
            let before = st.frameworks.len();
            st.frameworks.retain(|id, f| {
                let keep = f.gone_since.is_none_or(|t| {
                    now.duration_since(t)
                        < Duration::from_secs(f.info.failover_timeout_seconds.max(0) as u64)
                });
                if !keep {
                    tracing::info!(framework = %id, "framework did not come back within its failover timeout; its shards kill its tasks");
                }
                keep
            });
            if let Some(m) = &self.shared.metrics {
                m.frameworks.sub((before - st.frameworks.len()) as i64);
            }
            if now.duration_since(beat) >= HEARTBEAT {
                beat = now;
                for f in st.frameworks.values() {
                    f.send(opb::event::Event::Heartbeat(opb::event::Heartbeat {}));
                }
            }
        }
    }
}

impl Shared {
    fn attach_message(id: &str, info: &opb::FrameworkInfo) -> pb::federation_message::Message {
        pb::federation_message::Message::Offers(pb::OffersDown {
            framework: id.to_owned(),
            op: Some(pb::offers_down::Op::Attach(pb::offers_down::Attach {
                framework: Some(info.clone()),
            })),
        })
    }

    fn down(&self, shard: &str, id: &str, op: pb::offers_down::Op) -> bool {
        self.registry.send_to(
            shard,
            pb::federation_message::Message::Offers(pb::OffersDown {
                framework: id.to_owned(),
                op: Some(op),
            }),
        )
    }

    /// A subscription: a new framework, or one coming back by its id.
    fn subscribe(&self, info: opb::FrameworkInfo, tx: &EventTx) -> Result<String, Status> {
        let mut st = self.state.lock();
        let mut info = info;
        let known = st
            .frameworks
            .get_mut(&info.id)
            .filter(|_| !info.id.is_empty());
        let id = if let Some(f) = known {
            let id = info.id.clone();
            tessera_offers::may_resubscribe(
                &id,
                f.tx.is_some(),
                &f.info.namespace,
                &info.namespace,
            )?;
            f.tx = Some(tx.clone());
            f.gone_since = None;
            f.info = info;
            tracing::info!(framework = %id, "framework subscribed at the federation again");
            id
        } else {
            if info.id.is_empty() {
                st.next += 1;
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                info.id = tessera_offers::framework_id(&info.name, st.next, stamp);
                tracing::info!(framework = %info.id, "framework subscribed at the federation");
            } else {
                // Not known here: the federation restarted since (it keeps frameworks in
                // memory; their tasks, and their records, live in the shards). Taken back
                // under its id: each shard that holds a framework of that id attaches it
                // again only in the namespace it ran in there, and says so otherwise.
                tracing::info!(framework = %info.id, "framework unknown here subscribed again by its id; attaching it in every shard");
            }
            let id = info.id.clone();
            st.frameworks.insert(
                id.clone(),
                Framework {
                    info,
                    tx: Some(tx.clone()),
                    gone_since: None,
                    tasks: HashMap::new(),
                },
            );
            if let Some(m) = &self.metrics {
                m.frameworks.inc();
            }
            id
        };
        let f = &st.frameworks[&id];
        f.send(opb::event::Event::Subscribed(opb::event::Subscribed {
            framework_id: id.clone(),
            heartbeat_seconds: HEARTBEAT.as_secs_f64(),
        }));
        for shard in self.registry.connected_shards() {
            self.registry
                .send_to(&shard, Self::attach_message(&id, &f.info));
        }
        Ok(id)
    }

    /// The framework's stream ended: its offers go back, and every shard detaches it.
    fn disconnected(&self, id: &str) {
        let mut st = self.state.lock();
        st.offers.retain(|_, o| o.framework != id);
        if let Some(f) = st.frameworks.get_mut(id) {
            f.tx = None;
            f.gone_since = Some(Instant::now());
        }
        drop(st);
        for shard in self.registry.connected_shards() {
            self.down(
                &shard,
                id,
                pb::offers_down::Op::Detach(pb::offers_down::Detach {}),
            );
        }
        tracing::info!(framework = %id, "framework disconnected from the federation");
    }

    /// A call of framework `id`, sent on to the shard it concerns.
    fn call(&self, id: &str, call: opb::call::Call) {
        let mut st = self.state.lock();
        let State {
            frameworks, offers, ..
        } = &mut *st;
        let Some(f) = frameworks.get_mut(id) else {
            return;
        };
        let (shard, call) = match call {
            opb::call::Call::Accept(mut a) => {
                let Some(o) = offers.get(&a.offer_id).filter(|o| o.framework == id) else {
                    f.error(format!(
                        "no offer {} for this framework: it was rescinded or answered already",
                        a.offer_id
                    ));
                    return;
                };
                let (shard, local) = (o.shard.clone(), o.local.clone());
                offers.remove(&a.offer_id);
                // Task names are the framework's across the fleet: one already running in
                // any shard is refused here (a shard sees only its own).
                if let Some((t, there)) = a
                    .tasks
                    .iter()
                    .find_map(|t| f.tasks.get(&t.name).map(|s| (t.name.clone(), s.clone())))
                {
                    let why = format!("task {t:?} exists already (in shard {there})");
                    for t in &a.tasks {
                        f.send(opb::event::Event::Update(opb::TaskStatus {
                            task: t.name.clone(),
                            state: opb::TaskState::TaskFailed as i32,
                            node: String::new(),
                            message: why.clone(),
                        }));
                    }
                    f.error(why);
                    // The offer's room goes back to the shard at once.
                    let decline = opb::call::Call::Decline(opb::call::Decline {
                        offer_id: local,
                        refuse_seconds: 0.001,
                    });
                    self.down(
                        &shard,
                        id,
                        pb::offers_down::Op::Call(opb::Call {
                            call: Some(decline),
                        }),
                    );
                    return;
                }
                for t in &a.tasks {
                    f.tasks.insert(t.name.clone(), shard.clone());
                }
                if let Some(m) = &self.metrics {
                    m.accepted.inc();
                    m.tasks_launched.inc_by(a.tasks.len() as u64);
                }
                a.offer_id = local;
                (shard, opb::call::Call::Accept(a))
            }
            opb::call::Call::Decline(mut d) => {
                let Some(o) = offers.remove(&d.offer_id).filter(|o| o.framework == id) else {
                    return;
                };
                if let Some(m) = &self.metrics {
                    m.declined.inc();
                }
                d.offer_id = o.local;
                (o.shard, opb::call::Call::Decline(d))
            }
            opb::call::Call::Kill(k) => {
                let Some(shard) = f.tasks.get(&k.task).cloned() else {
                    f.error(format!("no task {:?} to kill", k.task));
                    return;
                };
                (shard, opb::call::Call::Kill(k))
            }
            opb::call::Call::Subscribe(_) => {
                f.error("subscribed already on this stream".into());
                return;
            }
        };
        let accepted: Vec<String> = match &call {
            opb::call::Call::Accept(a) => a.tasks.iter().map(|t| t.name.clone()).collect(),
            _ => Vec::new(),
        };
        if !self.down(
            &shard,
            id,
            pb::offers_down::Op::Call(opb::Call { call: Some(call) }),
        ) {
            for t in accepted {
                f.tasks.remove(&t);
                f.send(opb::event::Event::Update(opb::TaskStatus {
                    task: t,
                    state: opb::TaskState::TaskFailed as i32,
                    node: String::new(),
                    message: format!("shard {shard} is not connected to the federation"),
                }));
            }
        }
    }

    /// An event of one framework's, from shard `shard`.
    fn up(&self, shard: &str, m: pb::OffersUp) {
        let mut st = self.state.lock();
        let State {
            frameworks, offers, ..
        } = &mut *st;
        let Some(f) = frameworks.get_mut(&m.framework) else {
            return;
        };
        let Some(event) = m.event.and_then(|e| e.event) else {
            return;
        };
        let event = match event {
            opb::event::Event::Offers(mut batch) => {
                if f.tx.is_none() {
                    // Gone: the shard takes the offers back when it is detached.
                    return;
                }
                for o in &mut batch.offers {
                    let id = format!("{shard}/{}", o.id);
                    offers.insert(
                        id.clone(),
                        Outstanding {
                            shard: shard.to_owned(),
                            local: std::mem::replace(&mut o.id, id),
                            framework: m.framework.clone(),
                        },
                    );
                    o.node_labels
                        .insert(SHARD_LABEL.to_owned(), shard.to_owned());
                }
                if let Some(met) = &self.metrics {
                    met.offers.inc_by(batch.offers.len() as u64);
                }
                opb::event::Event::Offers(batch)
            }
            opb::event::Event::Rescind(mut r) => {
                r.offer_id = format!("{shard}/{}", r.offer_id);
                // Counted by the shard (timeout, node).
                offers.remove(&r.offer_id);
                opb::event::Event::Rescind(r)
            }
            opb::event::Event::Update(u) => {
                if live(u.state) {
                    f.tasks.insert(u.task.clone(), shard.to_owned());
                } else if f.tasks.get(&u.task).is_some_and(|s| s == shard) {
                    f.tasks.remove(&u.task);
                }
                if let Some(met) = &self.metrics
                    && let Ok(s) = opb::TaskState::try_from(u.state)
                {
                    met.task_updates.with_label_values(&[s.as_str_name()]).inc();
                }
                opb::event::Event::Update(u)
            }
            opb::event::Event::Error(e) => opb::event::Event::Error(opb::event::Error {
                message: format!("shard {shard}: {}", e.message),
            }),
            opb::event::Event::Subscribed(_) | opb::event::Event::Heartbeat(_) => return,
        };
        f.send(event);
    }

    /// Shard `shard`'s ledger: kept, and answered with the fleet as it is to see it.
    fn ledger(&self, shard: &str, l: pb::OffersLedger) {
        let fleet = {
            let mut st = self.state.lock();
            let known = |m: HashMap<String, opb::Resources>| -> HashMap<String, Amounts> {
                m.into_iter()
                    .filter(|(f, _)| st.frameworks.contains_key(f))
                    .map(|(f, r)| (f, [r.cpu_milli, r.memory_bytes]))
                    .collect()
            };
            let ledger = Ledger {
                total: l.total.map_or([0, 0], |r| [r.cpu_milli, r.memory_bytes]),
                holds: known(l.holds),
                usable: known(l.usable),
            };
            st.ledgers.insert(shard.to_owned(), ledger);
            fleet_for(&st.ledgers, shard)
        };
        let each =
            |m: HashMap<String, Amounts>| m.into_iter().map(|(f, a)| (f, resources(a))).collect();
        self.registry.send_to(
            shard,
            pb::federation_message::Message::Fleet(pb::OffersFleet {
                total: Some(resources(fleet.total)),
                elsewhere: each(fleet.elsewhere),
                usable: each(fleet.usable),
            }),
        );
    }

    /// A shard (re)connected: every connected framework is attached there.
    fn joined(&self, shard: &str) {
        let st = self.state.lock();
        for (id, f) in &st.frameworks {
            if f.tx.is_some() {
                self.registry
                    .send_to(shard, Self::attach_message(id, &f.info));
            }
        }
    }

    /// A shard dropped out: its ledger goes, and its outstanding offers are rescinded.
    fn left(&self, shard: &str) {
        let mut st = self.state.lock();
        st.ledgers.remove(shard);
        let gone: Vec<String> = st
            .offers
            .iter()
            .filter(|(_, o)| o.shard == shard)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let Some(o) = st.offers.remove(&id) else {
                continue;
            };
            if let Some(f) = st.frameworks.get(&o.framework) {
                f.send(opb::event::Event::Rescind(opb::event::Rescind {
                    offer_id: id,
                    reason: format!("shard {shard} lost its connection to the federation"),
                }));
            }
            if let Some(m) = &self.metrics {
                m.rescinded.with_label_values(&["shard"]).inc();
            }
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<opb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Scheduler for FleetOffers {
    type SessionStream = EventStream;

    async fn session(
        &self,
        request: Request<Streaming<opb::Call>>,
    ) -> Result<Response<EventStream>, Status> {
        let token = tessera_offers::bearer(request.metadata());
        let mut calls = request.into_inner();
        let info = tessera_offers::first_subscribe(&mut calls).await?;
        let (_, info) = tessera_offers::admit(
            &self.shared.authenticate,
            info,
            token,
            "the federation",
            self.shared.probe,
        )
        .await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.shared.subscribe(info, &tx)?;
        let shared = self.shared.clone();
        tokio::spawn(async move {
            while let Ok(Some(call)) = calls.message().await {
                if let Some(c) = call.call {
                    shared.call(&id, c);
                }
            }
            shared.disconnected(&id);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(total: i64, holds: &[(&str, i64)], usable: &[(&str, i64)]) -> Ledger {
        let map = |xs: &[(&str, i64)]| {
            xs.iter()
                .map(|(f, h)| ((*f).to_owned(), [*h, *h << 20]))
                .collect()
        };
        Ledger {
            total: [total, total << 20],
            holds: map(holds),
            usable: map(usable),
        }
    }

    #[test]
    fn each_shard_sees_the_fleets_total_and_what_frameworks_hold_in_the_others() {
        let ledgers: HashMap<String, Ledger> = [
            (
                "a".to_owned(),
                ledger(
                    8_000,
                    &[("x", 3_000), ("y", 1_000)],
                    &[("x", 8_000), ("y", 8_000)],
                ),
            ),
            // y refuses b's nodes.
            (
                "b".to_owned(),
                ledger(4_000, &[("x", 2_000)], &[("x", 4_000), ("y", 0)]),
            ),
            (
                "c".to_owned(),
                ledger(4_000, &[], &[("x", 4_000), ("y", 4_000)]),
            ),
        ]
        .into();
        let a = fleet_for(&ledgers, "a");
        assert_eq!(a.total, [16_000, 16_000 << 20]);
        assert_eq!(a.elsewhere.get("x"), Some(&[2_000, 2_000 << 20]));
        assert_eq!(a.elsewhere.get("y"), None, "y holds nothing outside a");
        assert_eq!(a.usable["x"][0], 16_000);
        assert_eq!(a.usable["y"][0], 12_000, "the fleet less what y refuses");
        let c = fleet_for(&ledgers, "c");
        assert_eq!(c.elsewhere["x"], [5_000, 5_000 << 20]);
        assert_eq!(c.elsewhere["y"], [1_000, 1_000 << 20]);
        assert_eq!(c.usable, a.usable, "the same fleet from every shard");
        // A shard not yet in the ledgers still sees the whole fleet.
        let d = fleet_for(&ledgers, "d");
        assert_eq!(d.total[0], 16_000);
        assert_eq!(d.elsewhere["x"][0], 5_000);
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<pb::FederationMessage>) -> Vec<pb::OffersDown> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if let Some(pb::federation_message::Message::Offers(o)) = m.message {
                out.push(o);
            }
        }
        out
    }

    #[tokio::test]
    async fn a_framework_is_attached_in_every_shard_and_taken_back_by_its_id_after_a_restart() {
        let registry = Registry::new(crate::RegistryConfig::new("sekret"), None);
        let mut shards = Vec::new();
        for name in ["a", "b"] {
            let (_, rx) = registry
                .register(&pb::Register {
                    name: name.into(),
                    token: "sekret".into(),
                    ..Default::default()
                })
                .expect("registered");
            shards.push(rx);
        }
        let probe = tessera_client::request::find_resource("", "v1", "configmaps").expect("served");
        let offers = FleetOffers::new(
            registry.clone(),
            Arc::new(|_| Box::pin(async { None })),
            probe,
            None,
        );
        let info = |id: &str, ns: &str| opb::FrameworkInfo {
            name: "batch".into(),
            namespace: ns.into(),
            weight: 1.0,
            id: id.into(),
            ..Default::default()
        };
        // A new framework: an id of its name, attached in both shards.
        let (tx, mut events) = mpsc::unbounded_channel();
        let id = offers.shared.subscribe(info("", "jobs"), &tx).expect("new");
        assert!(id.starts_with("batch-"), "{id}");
        for rx in &mut shards {
            let sent = drain(rx);
            assert_eq!(sent.len(), 1, "{sent:?}");
            assert_eq!(sent[0].framework, id);
            let Some(pb::offers_down::Op::Attach(a)) = &sent[0].op else {
                panic!("attach: {sent:?}")
            };
            assert_eq!(
                a.framework.as_ref().map(|f| f.namespace.as_str()),
                Some("jobs")
            );
        }
        let Ok(Ok(opb::Event {
            event: Some(opb::event::Event::Subscribed(s)),
        })) = events.try_recv()
        else {
            panic!("subscribed first")
        };
        assert_eq!(s.framework_id, id);
        // Connected: not again on another stream; gone: detached everywhere.
        let (tx2, _events2) = mpsc::unbounded_channel();
        let err = offers
            .shared
            .subscribe(info(&id, "jobs"), &tx2)
            .expect_err("connected");
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        offers.shared.disconnected(&id);
        for rx in &mut shards {
            let sent = drain(rx);
            assert!(
                matches!(sent[0].op, Some(pb::offers_down::Op::Detach(_))),
                "{sent:?}"
            );
        }
        // Back in another namespace: refused, naming both.
        let err = offers
            .shared
            .subscribe(info(&id, "other"), &tx2)
            .expect_err("namespace");
        assert!(
            err.message().contains("runs in namespace jobs, not other"),
            "{err:?}"
        );
        // A federation that restarted does not know the id: it takes it back and attaches
        // it everywhere (each shard checks the namespace it ran in).
        let restarted = FleetOffers::new(
            registry.clone(),
            Arc::new(|_| Box::pin(async { None })),
            probe,
            None,
        );
        let (tx3, _events3) = mpsc::unbounded_channel();
        let again = restarted
            .shared
            .subscribe(info("batch-7f3", "jobs"), &tx3)
            .expect("taken back");
        assert_eq!(again, "batch-7f3");
        for rx in &mut shards {
            let sent = drain(rx);
            assert_eq!(sent.len(), 1, "{sent:?}");
            assert_eq!(sent[0].framework, "batch-7f3");
        }
    }
}
