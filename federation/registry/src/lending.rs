//! Elastic shards: which idle nodes the federation lends from one shard to another, and
//! when they go back. Pure decisions over what the shards' summaries report
//! ([`pb::Lending`]) and each Shard's policy; the [`crate::Registry`] sends the steps.
//!
//! A loan goes through three phases:
//!
//! 1. **Lending**: the borrower is told to admit it, the lender to hand the node over (both
//!    repeated until the borrower reports the node registered, or given up after
//!    [`LendingConfig::lend_timeout`]).
//! 2. **Active**: the node runs the borrower's pods.
//! 3. **Returning**: the borrower drains and removes it, then the lender takes it back. A loan
//!    returns when the lender has pending pods of its own no node can take (the lender comes
//!    first), when the node has been idle for [`LendingConfig::idle_return`] and the
//!    borrower has nothing waiting, when a policy no longer allows it, or when either side
//!    stops reporting it.
//!
//! Loans live in the shards (node labels, the borrower's loan ledger), not in the federation:
//! after a restart the planner takes back what the summaries report — a loan both sides
//! report is active, one only one side reports is returned (once both sides have reported,
//! or after `lend_timeout` if one never does).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tessera_proto::federation::v1 as pb;
use tokio::time::Instant;

/// A shard's lending policy (`spec.lending` of its Shard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LendingPolicy {
    /// Nodes it keeps for itself whatever it lends.
    pub min_nodes: u64,
    /// Most nodes lent out at once (0: none).
    pub max_lend: u64,
    /// Most nodes borrowed at once (0: none).
    pub max_borrow: u64,
}

/// The planner's timings.
#[derive(Clone, Copy, Debug)]
pub struct LendingConfig {
    /// How long a shard's unmet demand must last before it borrows.
    pub borrow_after: Duration,
    /// How long a borrowed node stays idle (its borrower with nothing waiting) before it
    /// goes back.
    pub idle_return: Duration,
    /// How long a lender's own unmet demand must last before it takes its nodes back.
    pub recall_after: Duration,
    /// A loan not active after this long is given up.
    pub lend_timeout: Duration,
    /// How often a step not yet seen done is sent again.
    pub resend: Duration,
    /// Most nodes lent to one borrower per decision.
    pub max_per_round: usize,
}

impl Default for LendingConfig {
    fn default() -> Self {
        LendingConfig {
            borrow_after: Duration::from_secs(3),
            idle_return: Duration::from_secs(30),
            recall_after: Duration::from_secs(2),
            lend_timeout: Duration::from_secs(60),
            resend: Duration::from_secs(5),
            max_per_round: 16,
        }
    }
}

/// Replicas the federation holds back for want of room: the shard they would go to first
/// (its tenant's home, or the first its policy allows), what each asks for (cpu millicores,
/// memory bytes, pods) and how many.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The shard.
    pub shard: String,
    /// Per replica: cpu (millicores), memory (bytes), pods.
    pub per_replica: [u64; 3],
    /// Replicas held back.
    pub replicas: u64,
    /// They must run on process nodes.
    pub process: bool,
}

/// `report` with the replicas held back for it at the federation (`waiting`: cpu, memory,
/// pods in all, and how many) counted as its unmet demand: they are pods the shard would run
/// if it had the room.
pub fn with_waiting(
    mut report: pb::Lending,
    resources: &[String],
    waiting: &[&Waiting],
) -> pb::Lending {
    report.unmet.resize(resources.len(), 0);
    report.unmet_process.resize(resources.len(), 0);
    for w in waiting {
        let (pods, unmet) = if w.process {
            (&mut report.unmet_process_pods, &mut report.unmet_process)
        } else {
            (&mut report.unmet_pods, &mut report.unmet)
        };
        for (name, x) in ["cpu", "memory", "pods"].iter().zip(w.per_replica) {
            if let Some(i) = resources.iter().position(|r| r == name) {
                unmet[i] += x * w.replicas;
            }
        }
        *pods += w.replicas;
        report.own_unmet_pods += w.replicas;
    }
    report
}

/// One shard as the planner sees it.
#[derive(Clone, Debug, Default)]
pub struct ShardLending {
    /// The shard's name.
    pub name: String,
    /// It holds its lease.
    pub ready: bool,
    /// It can take part: it sent its API's CA and loan key.
    pub capable: bool,
    /// Its Shard's policy.
    pub policy: LendingPolicy,
    /// The resources its summary counts, in order (what `unmet` and idle nodes' amounts
    /// follow).
    pub resources: Vec<String>,
    /// Its last report (none yet: it is left alone).
    pub report: Option<pb::Lending>,
}

/// Where a loan stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Admit and lend sent; the node has not registered with the borrower yet.
    Lending,
    /// The node works for the borrower.
    Active,
    /// Being given back: `borrower_done` once the borrower has let it go.
    Returning {
        /// The borrower no longer reports it.
        borrower_done: bool,
        /// Why it goes back.
        why: String,
    },
}

impl Phase {
    /// Its name, as metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Lending => "lending",
            Phase::Active => "active",
            Phase::Returning { .. } => "returning",
        }
    }
}

/// One loan.
#[derive(Clone, Debug)]
pub struct Loan {
    /// Its id (no dots).
    pub id: String,
    /// The node.
    pub node: String,
    /// The shard the node belongs to.
    pub lender: String,
    /// The shard it is lent to.
    pub borrower: String,
    /// Where it stands.
    pub phase: Phase,
    /// When it entered its phase.
    pub since: Instant,
    /// When its node was last seen running something for the borrower (or the borrower
    /// last had unmet demand).
    pub busy_at: Instant,
    /// When its step was last sent.
    pub sent: Option<Instant>,
}

/// A step for the registry to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The shard to send it to.
    pub to: String,
    /// What to do.
    pub op: pb::loan::Op,
    /// The loan.
    pub loan: String,
    /// The node.
    pub node: String,
    /// The other shard.
    pub peer: String,
}

/// A change worth an event and a metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A loan began.
    Lent {
        /// The loan.
        loan: String,
        /// Its node.
        node: String,
        /// From.
        lender: String,
        /// To.
        borrower: String,
    },
    /// A loan started returning.
    Returning {
        /// The loan.
        loan: String,
        /// Its node.
        node: String,
        /// From.
        lender: String,
        /// To.
        borrower: String,
        /// Why.
        why: String,
    },
    /// A loan is over: the node is back.
    Returned {
        /// The loan.
        loan: String,
        /// Its node.
        node: String,
        /// From.
        lender: String,
        /// How long it took to come back.
        away: Duration,
    },
}

/// The loans and the decisions about them.
#[derive(Debug, Default)]
pub struct Planner {
    loans: BTreeMap<String, Loan>,
    /// Since when each shard has had unmet demand (borrowers) and own unmet demand
    /// (lenders).
    unmet_since: HashMap<String, Instant>,
    own_unmet_since: HashMap<String, Instant>,
    next: u64,
    /// The first round (a restarted federation waits for both sides of a loan to report).
    started: Option<Instant>,
}

fn amount(resources: &[String], v: &[u64], name: &str) -> u64 {
    resources
        .iter()
        .position(|r| r == name)
        .and_then(|i| v.get(i).copied())
        .unwrap_or(0)
}

impl Planner {
    /// The loans now.
    pub fn loans(&self) -> impl Iterator<Item = &Loan> {
        self.loans.values()
    }

    fn new_id(&mut self, now_ms: u64) -> String {
        self.next += 1;
        format!("{now_ms:x}-{}", self.next)
    }

    /// One round: takes the shards' reports, moves loans through their phases, and decides
    /// new ones. Returns the steps to send (repeated every `resend` until seen done) and what
    /// happened.
    pub fn plan(
        &mut self,
        shards: &[ShardLending],
        config: &LendingConfig,
        now: Instant,
        now_ms: u64,
    ) -> (Vec<Step>, Vec<Outcome>) {
        let by_name: BTreeMap<&str, &ShardLending> =
            shards.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut outcomes = Vec::new();
        let started = *self.started.get_or_insert(now);
        // A half-reported loan is only judged once both sides have reported, or after
        // `lend_timeout` (the other side is gone for good).
        self.adopt(
            shards,
            now,
            now.duration_since(started) >= config.lend_timeout,
        );
        // How long demand has lasted.
        for s in shards {
            let Some(r) = &s.report else { continue };
            track(
                &mut self.unmet_since,
                &s.name,
                r.unmet_pods + r.unmet_process_pods > 0,
                now,
            );
            track(
                &mut self.own_unmet_since,
                &s.name,
                r.own_unmet_pods > 0,
                now,
            );
        }
        let lasted = |m: &HashMap<String, Instant>, name: &str, d: Duration| {
            m.get(name).is_some_and(|t| now.duration_since(*t) >= d)
        };
        // Phases.
        let mut lent_count: HashMap<&str, u64> = HashMap::new();
        let mut borrowed_count: HashMap<&str, u64> = HashMap::new();
        for l in self.loans.values() {
            if !matches!(l.phase, Phase::Returning { .. }) {
                *lent_count.entry(l.lender.as_str()).or_default() += 1;
                *borrowed_count.entry(l.borrower.as_str()).or_default() += 1;
            }
        }
        let mut over_lend: HashMap<String, u64> = HashMap::new();
        let mut over_borrow: HashMap<String, u64> = HashMap::new();
        for s in shards {
            let lent = lent_count.get(s.name.as_str()).copied().unwrap_or(0);
            over_lend.insert(s.name.clone(), lent.saturating_sub(s.policy.max_lend));
            let b = borrowed_count.get(s.name.as_str()).copied().unwrap_or(0);
            over_borrow.insert(s.name.clone(), b.saturating_sub(s.policy.max_borrow));
        }
        let ids: Vec<String> = self.loans.keys().cloned().collect();
        for id in ids {
            let l = self.loans.get_mut(&id).expect("listed");
            let lender = by_name.get(l.lender.as_str());
            let borrower = by_name.get(l.borrower.as_str());
            let in_lender = lender
                .and_then(|s| s.report.as_ref())
                .and_then(|r| r.lent.iter().find(|x| x.loan == l.id));
            let in_borrower = borrower
                .and_then(|s| s.report.as_ref())
                .and_then(|r| r.borrowed.iter().find(|x| x.loan == l.id));
            let busy = in_borrower.is_some_and(|b| !b.idle)
                || borrower
                    .and_then(|s| s.report.as_ref())
                    .is_some_and(|r| r.unmet_pods + r.unmet_process_pods > 0);
            if busy {
                l.busy_at = now;
            }
            let mut to_return: Option<String> = None;
            match &l.phase {
                Phase::Lending => {
                    if in_borrower.is_some_and(|b| b.ready) {
                        l.phase = Phase::Active;
                        l.since = now;
                        l.busy_at = now;
                        outcomes.push(Outcome::Lent {
                            loan: l.id.clone(),
                            node: l.node.clone(),
                            lender: l.lender.clone(),
                            borrower: l.borrower.clone(),
                        });
                    } else if now.duration_since(l.since) >= config.lend_timeout {
                        to_return = Some(format!(
                            "the node did not join shard {} within {}s",
                            l.borrower,
                            config.lend_timeout.as_secs()
                        ));
                    }
                }
                Phase::Active => {
                    let lender_reports = lender.is_some_and(|s| s.report.is_some());
                    let borrower_reports = borrower.is_some_and(|s| s.report.is_some());
                    if lender_reports && in_lender.is_none() {
                        to_return = Some(format!("shard {} no longer lends it", l.lender));
                    } else if borrower_reports && in_borrower.is_none_or(|b| !b.ready) {
                        to_return = Some(format!("it left shard {}", l.borrower));
                    } else if lasted(&self.own_unmet_since, &l.lender, config.recall_after) {
                        to_return = Some(format!(
                            "shard {} has pending pods of its own (a lender comes first)",
                            l.lender
                        ));
                    } else if now.duration_since(l.busy_at) >= config.idle_return {
                        to_return = Some(format!(
                            "idle for {}s with nothing waiting in shard {}",
                            config.idle_return.as_secs(),
                            l.borrower
                        ));
                    } else if let Some(n) = over_lend.get_mut(&l.lender).filter(|n| **n > 0) {
                        *n -= 1;
                        to_return = Some(format!("shard {}'s maxLend is lower now", l.lender));
                    } else if let Some(n) = over_borrow.get_mut(&l.borrower).filter(|n| **n > 0) {
                        *n -= 1;
                        to_return = Some(format!("shard {}'s maxBorrow is lower now", l.borrower));
                    }
                }
                Phase::Returning { borrower_done, why } => {
                    let borrower_reports = borrower.is_some_and(|s| s.report.is_some());
                    if !borrower_done && borrower_reports && in_borrower.is_none() {
                        l.phase = Phase::Returning {
                            borrower_done: true,
                            why: why.clone(),
                        };
                        l.sent = None;
                    }
                }
            }
            if let Some(why) = to_return {
                outcomes.push(Outcome::Returning {
                    loan: l.id.clone(),
                    node: l.node.clone(),
                    lender: l.lender.clone(),
                    borrower: l.borrower.clone(),
                    why: why.clone(),
                });
                l.phase = Phase::Returning {
                    borrower_done: false,
                    why,
                };
                l.since = now;
                l.sent = None;
            }
        }
        // Done: the borrower let go and the lender no longer lends it.
        let lender_has = |l: &Loan| {
            by_name
                .get(l.lender.as_str())
                .and_then(|s| s.report.as_ref())
                .is_none_or(|r| r.lent.iter().any(|x| x.loan == l.id))
        };
        let done: Vec<String> = self
            .loans
            .values()
            .filter(|l| {
                matches!(
                    l.phase,
                    Phase::Returning {
                        borrower_done: true,
                        ..
                    }
                ) && !lender_has(l)
            })
            .map(|l| l.id.clone())
            .collect();
        for id in done {
            let l = self.loans.remove(&id).expect("listed");
            outcomes.push(Outcome::Returned {
                loan: l.id,
                node: l.node,
                lender: l.lender,
                away: now.duration_since(l.since),
            });
        }
        // New loans.
        self.borrow(shards, config, now, now_ms);
        // Steps due.
        let mut steps = Vec::new();
        for l in self.loans.values_mut() {
            if l.sent
                .is_some_and(|t| now.duration_since(t) < config.resend)
            {
                continue;
            }
            l.sent = Some(now);
            let step = |to: &str, op, peer: &str| Step {
                to: to.to_owned(),
                op,
                loan: l.id.clone(),
                node: l.node.clone(),
                peer: peer.to_owned(),
            };
            match &l.phase {
                Phase::Lending => {
                    steps.push(step(&l.borrower, pb::loan::Op::Admit, &l.lender));
                    steps.push(step(&l.lender, pb::loan::Op::Lend, &l.borrower));
                }
                Phase::Active => {}
                Phase::Returning {
                    borrower_done: false,
                    ..
                } => steps.push(step(&l.borrower, pb::loan::Op::Return, &l.lender)),
                Phase::Returning { .. } => {
                    steps.push(step(&l.lender, pb::loan::Op::Reclaim, &l.borrower));
                }
            }
        }
        (steps, outcomes)
    }

    /// Takes in the loans the shards report that the planner does not know (it restarted):
    /// reported by both sides, active; by one, returned.
    fn adopt(&mut self, shards: &[ShardLending], now: Instant, give_up_waiting: bool) {
        let reported: BTreeSet<&str> = shards
            .iter()
            .filter(|s| s.report.is_some())
            .map(|s| s.name.as_str())
            .collect();
        // Per loan: (node, lender, borrower) as the lender and as the borrower report it.
        type Side = (String, String, String);
        let mut seen: BTreeMap<String, (Option<Side>, Option<Side>)> = BTreeMap::new();
        for s in shards {
            let Some(r) = &s.report else { continue };
            for x in &r.lent {
                seen.entry(x.loan.clone()).or_default().0 =
                    Some((x.node.clone(), s.name.clone(), x.peer.clone()));
            }
            for x in &r.borrowed {
                seen.entry(x.loan.clone()).or_default().1 =
                    Some((x.node.clone(), x.peer.clone(), s.name.clone()));
            }
        }
        for (id, (lent, borrowed)) in seen {
            if self.loans.contains_key(&id) {
                continue;
            }
            let Some((node, lender, borrower)) = lent.as_ref().or(borrowed.as_ref()).cloned()
            else {
                continue;
            };
            let both = lent.is_some() && borrowed.is_some();
            let both_reported =
                reported.contains(lender.as_str()) && reported.contains(borrower.as_str());
            if !(both || give_up_waiting || both_reported) {
                // The other side has not reported since this federation started: wait.
                continue;
            }
            self.loans.insert(
                id.clone(),
                Loan {
                    id,
                    node,
                    lender,
                    borrower,
                    phase: if both {
                        Phase::Active
                    } else {
                        Phase::Returning {
                            borrower_done: borrowed.is_none(),
                            why: "found half-made after a restart of the federation".into(),
                        }
                    },
                    since: now,
                    busy_at: now,
                    sent: None,
                },
            );
        }
    }

    fn borrow(
        &mut self,
        shards: &[ShardLending],
        config: &LendingConfig,
        now: Instant,
        now_ms: u64,
    ) {
        let mut taken: BTreeSet<String> = self.loans.values().map(|l| l.node.clone()).collect();
        for b in shards {
            let Some(br) = &b.report else { continue };
            if !b.ready || !b.capable || br.unmet_pods + br.unmet_process_pods == 0 {
                continue;
            }
            if self
                .unmet_since
                .get(&b.name)
                .is_none_or(|t| now.duration_since(*t) < config.borrow_after)
            {
                continue;
            }
            // One round at a time: what is being lent may already cover the demand.
            let borrowing: Vec<&Loan> = self
                .loans
                .values()
                .filter(|l| l.borrower == b.name)
                .collect();
            if borrowing.iter().any(|l| l.phase == Phase::Lending) {
                continue;
            }
            let active = borrowing
                .iter()
                .filter(|l| !matches!(l.phase, Phase::Returning { .. }))
                .count() as u64;
            let mut room = b.policy.max_borrow.saturating_sub(active);
            // What is needed, by resource name: regular nodes and process nodes apart.
            let need = |v: &[u64]| -> [u64; 3] {
                [
                    amount(&b.resources, v, "cpu"),
                    amount(&b.resources, v, "memory"),
                    amount(&b.resources, v, "pods"),
                ]
            };
            let mut wants = [
                (false, need(&br.unmet), br.unmet_pods),
                (true, need(&br.unmet_process), br.unmet_process_pods),
            ];
            let mut picked = 0usize;
            for (process, need, pods) in wants.iter_mut() {
                if *pods == 0 {
                    continue;
                }
                while need.iter().any(|x| *x > 0) && room > 0 && picked < config.max_per_round {
                    let Some((lender, node, alloc)) = self.pick(shards, &b.name, *process, &taken)
                    else {
                        break;
                    };
                    for (n, a) in need.iter_mut().zip(alloc) {
                        *n = n.saturating_sub(a);
                    }
                    taken.insert(node.clone());
                    room -= 1;
                    picked += 1;
                    let id = self.new_id(now_ms);
                    self.loans.insert(
                        id.clone(),
                        Loan {
                            id,
                            node,
                            lender,
                            borrower: b.name.clone(),
                            phase: Phase::Lending,
                            since: now,
                            busy_at: now,
                            sent: None,
                        },
                    );
                }
            }
        }
    }

    /// An idle node a lender may give `borrower` now: from the lender with the most idle
    /// nodes of the kind, as long as it keeps `minNodes` and stays under `maxLend`.
    fn pick(
        &self,
        shards: &[ShardLending],
        borrower: &str,
        process: bool,
        taken: &BTreeSet<String>,
    ) -> Option<(String, String, [u64; 3])> {
        let mut best: Option<(usize, &ShardLending, &pb::IdleNode)> = None;
        for l in shards {
            let Some(r) = &l.report else { continue };
            if l.name == borrower || !l.ready || !l.capable || r.own_unmet_pods > 0 {
                continue;
            }
            let lent = self
                .loans
                .values()
                .filter(|x| x.lender == l.name && !matches!(x.phase, Phase::Returning { .. }))
                .count() as u64;
            // Nodes being handed over are still counted schedulable by the lender's report.
            let handing = self
                .loans
                .values()
                .filter(|x| x.lender == l.name && x.phase == Phase::Lending)
                .count() as u64;
            if lent >= l.policy.max_lend
                || r.schedulable_nodes.saturating_sub(handing + 1) < l.policy.min_nodes
            {
                continue;
            }
            let idle: Vec<&pb::IdleNode> = r
                .idle
                .iter()
                .filter(|n| n.process == process && !taken.contains(&n.name))
                .collect();
            if let Some(first) = idle.first()
                && best.as_ref().is_none_or(|(k, _, _)| idle.len() > *k)
            {
                best = Some((idle.len(), l, first));
            }
        }
        let (_, l, n) = best?;
        let alloc = [
            amount(&l.resources, &n.allocatable, "cpu"),
            amount(&l.resources, &n.allocatable, "memory"),
            amount(&l.resources, &n.allocatable, "pods"),
        ];
        Some((l.name.clone(), n.name.clone(), alloc))
    }
}

fn track(m: &mut HashMap<String, Instant>, name: &str, on: bool, now: Instant) {
    if on {
        m.entry(name.to_owned()).or_insert(now);
    } else {
        m.remove(name);
    }
}

#[cfg(test)]
mod tests;
