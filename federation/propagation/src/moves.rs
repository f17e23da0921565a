//! Moving a workload between live shards — when a shard joins and the map gives its tenant a
//! new home, or a shard is drained — without a gap and without running anything twice that
//! must not run twice:
//!
//! - a `Fast` workload moves **make-before-break**: its new shares are started, and the
//!   shares leaving stay until every new share is available;
//! - an `AtMostOnce` workload moves **stop-then-start**: the leaving copies are stopped
//!   (scaled down, Jobs and CronJobs suspended) and only once their shards report nothing of
//!   them running is the new share started.
//!
//! Pure: the controller hands in what shards hold and report, and applies the plan.

use std::collections::BTreeMap;

use serde_json::Value;
use tessera_client::workloads::WorkloadKind;
use tessera_placement::FailoverMode;
use tessera_registry::Reported;

/// What one shard is handed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copy {
    /// Run this many replicas.
    Run(u64),
    /// Stop down to this many (a Job or CronJob suspended; the rest scaled to it).
    Stop(u64),
}

/// What each shard is handed now, and which shares are still leaving.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Shard → its copy; a shard left out holds nothing.
    pub assign: BTreeMap<String, Copy>,
    /// Shares leaving their shard, kept until the move finishes (empty: no move).
    pub leaving: BTreeMap<String, u64>,
}

/// The shares a new decision `target` takes off live shards while it also starts replicas
/// elsewhere: they must wait for the move. A decision that only grows (scale-up, spill-over)
/// or only shrinks (scale-down) moves nothing and waits for nothing.
pub fn leaving_for(
    before: &BTreeMap<String, u64>,
    target: &BTreeMap<String, u64>,
    live: impl Fn(&str) -> bool,
) -> BTreeMap<String, u64> {
    let grows = target
        .iter()
        .any(|(s, n)| *n > before.get(s).copied().unwrap_or(0));
    if !grows {
        return BTreeMap::new();
    }
    before
        .iter()
        .filter(|(s, n)| live(s) && target.get(*s).copied().unwrap_or(0) < **n)
        .map(|(s, n)| (s.clone(), *n))
        .collect()
}

/// What to hand each shard for `target` while `leaving` shares leave (`held`: what each shard
/// holds now). `available(shard, n)`: that shard's copy runs `n` available replicas of the
/// current generation; `stopped(shard, n)`: that shard runs at most `n` (nothing, for a
/// suspended Job).
pub fn plan(
    target: &BTreeMap<String, u64>,
    leaving: &BTreeMap<String, u64>,
    held: &BTreeMap<String, u64>,
    mode: FailoverMode,
    available: impl Fn(&str, u64) -> bool,
    stopped: impl Fn(&str, u64) -> bool,
) -> Plan {
    let run_target = || {
        target
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| (s.clone(), Copy::Run(*n)))
            .collect::<BTreeMap<_, _>>()
    };
    if leaving.is_empty() {
        return Plan {
            assign: run_target(),
            leaving: BTreeMap::new(),
        };
    }
    match mode {
        FailoverMode::Fast => {
            let mut assign = run_target();
            if target.iter().all(|(s, n)| available(s, *n)) {
                return Plan {
                    assign,
                    leaving: BTreeMap::new(),
                };
            }
            for (s, n) in leaving {
                assign.insert(s.clone(), Copy::Run(*n));
            }
            Plan {
                assign,
                leaving: leaving.clone(),
            }
        }
        FailoverMode::AtMostOnce => {
            let to = |s: &str| target.get(s).copied().unwrap_or(0);
            if leaving.keys().all(|s| stopped(s, to(s))) {
                return Plan {
                    assign: run_target(),
                    leaving: BTreeMap::new(),
                };
            }
            // Nothing new starts yet: a shard that is not leaving keeps what it holds (no
            // more), a leaving one is told to stop.
            let mut assign: BTreeMap<String, Copy> = target
                .iter()
                .filter(|(s, _)| !leaving.contains_key(*s))
                .map(|(s, n)| (s, (*n).min(held.get(s).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .map(|(s, n)| (s.clone(), Copy::Run(n)))
                .collect();
            for s in leaving.keys() {
                assign.insert(s.clone(), Copy::Stop(to(s)));
            }
            Plan {
                assign,
                leaving: leaving.clone(),
            }
        }
    }
}

/// Workloads waiting for a move slot, in the order they began waiting.
#[derive(Debug, Default)]
pub struct Waiting {
    order: std::collections::VecDeque<String>,
    members: std::collections::HashSet<String>,
}

impl Waiting {
    /// Adds `key` at the back; false if it waits already.
    pub fn push(&mut self, key: &str) -> bool {
        if !self.members.insert(key.to_owned()) {
            return false;
        }
        self.order.push_back(key.to_owned());
        true
    }

    /// Takes `key` out (it moves, or is gone).
    pub fn remove(&mut self, key: &str) {
        self.members.remove(key);
    }

    /// Takes up to `n` from the front.
    pub fn pop(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::with_capacity(n.min(self.members.len()));
        while out.len() < n {
            let Some(k) = self.order.pop_front() else {
                break;
            };
            // Keys taken out meanwhile are skipped here (removal is O(1)).
            if self.members.remove(&k) {
                out.push(k);
            }
        }
        out
    }
}

fn count(status: &Value, field: &str) -> i64 {
    status[field].as_i64().unwrap_or(0)
}

fn condition_true(status: &Value, type_: &str) -> bool {
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    })
}

/// Whether a shard's copy of a `kind` workload, as `r` reports it, runs `n` available
/// replicas made from federation generation `generation` (a Job or CronJob: has started).
pub fn is_available(kind: WorkloadKind, r: &Reported, generation: i64, n: u64) -> bool {
    if n == 0 {
        return true;
    }
    if !r.present || r.federation_generation != generation || !r.observed {
        return false;
    }
    match kind {
        WorkloadKind::Job | WorkloadKind::CronJob => true,
        _ => count(&r.status, "availableReplicas").max(0) as u64 >= n,
    }
}

/// Whether a shard's copy of a `kind` workload, as `r` reports it, runs at most `n`
/// replicas: its spec says so and no pod beyond them is left, terminating ones included (a
/// Job: suspended with no pod active or terminating, or finished; a CronJob: suspended with
/// no Job of it active).
pub fn is_stopped(kind: WorkloadKind, r: &Reported, n: u64) -> bool {
    if !r.present {
        return true;
    }
    match kind {
        WorkloadKind::Job => {
            // Finished (complete or failed), or suspended with nothing left running.
            kind.needs_no_room(&r.status)
                || (r.replicas == 0
                    && condition_true(&r.status, "Suspended")
                    && count(&r.status, "active") == 0
                    && count(&r.status, "terminating") == 0)
        }
        WorkloadKind::CronJob => {
            r.replicas == 0 && r.status["active"].as_array().is_none_or(|a| a.is_empty())
        }
        _ => r.replicas as u64 <= n && r.observed && count(&r.status, "replicas") as u64 <= n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect()
    }

    #[test]
    fn only_a_decision_that_both_starts_and_takes_away_is_a_move() {
        let live = |_: &str| true;
        // A new home: b starts what a gives up.
        assert_eq!(
            leaving_for(&m(&[("a", 3)]), &m(&[("b", 3)]), live),
            m(&[("a", 3)])
        );
        // Part of it: a keeps 1, so 2 leave — but a's copy is kept whole until b is up.
        assert_eq!(
            leaving_for(&m(&[("a", 3)]), &m(&[("a", 1), ("b", 2)]), live),
            m(&[("a", 3)])
        );
        // Scale-up with spill-over and scale-down are not moves.
        assert!(leaving_for(&m(&[("a", 3)]), &m(&[("a", 3), ("b", 2)]), live).is_empty());
        assert!(leaving_for(&m(&[("a", 3), ("b", 2)]), &m(&[("a", 3)]), live).is_empty());
        // A shard that is not live is failover's business, not a move's.
        assert!(leaving_for(&m(&[("a", 3)]), &m(&[("b", 3)]), |s| s != "a").is_empty());
    }

    #[test]
    fn a_fast_move_keeps_the_old_copy_until_the_new_one_is_available() {
        let target = m(&[("b", 3)]);
        let leaving = m(&[("a", 3)]);
        let held = m(&[("a", 3)]);
        let never = |_: &str, _: u64| false;
        let p = plan(&target, &leaving, &held, FailoverMode::Fast, never, never);
        assert_eq!(p.assign.get("a"), Some(&Copy::Run(3)), "a keeps running");
        assert_eq!(p.assign.get("b"), Some(&Copy::Run(3)), "b starts");
        assert_eq!(p.leaving, leaving);
        // b has 2 of 3 available: still both.
        let two = |s: &str, n: u64| s == "b" && n <= 2;
        let p = plan(&target, &leaving, &held, FailoverMode::Fast, two, never);
        assert_eq!(p.leaving, leaving);
        // b is whole: a goes.
        let all = |s: &str, n: u64| s == "b" && n <= 3;
        let p = plan(&target, &leaving, &held, FailoverMode::Fast, all, never);
        assert_eq!(p.assign, [("b".to_owned(), Copy::Run(3))].into());
        assert!(p.leaving.is_empty());
    }

    #[test]
    fn an_at_most_once_move_starts_nothing_until_the_old_copy_has_stopped() {
        let target = m(&[("b", 1)]);
        let leaving = m(&[("a", 1)]);
        let held = m(&[("a", 1)]);
        let yes = |_: &str, _: u64| true;
        let no = |_: &str, _: u64| false;
        // Even if b were to report something, nothing starts there before a has stopped.
        let p = plan(&target, &leaving, &held, FailoverMode::AtMostOnce, yes, no);
        assert_eq!(p.assign, [("a".to_owned(), Copy::Stop(0))].into());
        assert_eq!(p.leaving, leaving);
        let p = plan(&target, &leaving, &held, FailoverMode::AtMostOnce, no, yes);
        assert_eq!(p.assign, [("b".to_owned(), Copy::Run(1))].into());
        assert!(p.leaving.is_empty());
        // Divided over shards: b keeps what it had (no more) while a stops down to its share.
        let target = m(&[("a", 1), ("b", 4)]);
        let leaving = m(&[("a", 3)]);
        let held = m(&[("a", 3), ("b", 2)]);
        let p = plan(&target, &leaving, &held, FailoverMode::AtMostOnce, yes, no);
        assert_eq!(
            p.assign,
            [
                ("a".to_owned(), Copy::Stop(1)),
                ("b".to_owned(), Copy::Run(2))
            ]
            .into()
        );
    }

    #[test]
    fn no_move_hands_out_the_decision() {
        let p = plan(
            &m(&[("a", 2), ("b", 0)]),
            &BTreeMap::new(),
            &m(&[("a", 5)]),
            FailoverMode::AtMostOnce,
            |_, _| false,
            |_, _| false,
        );
        assert_eq!(p.assign, [("a".to_owned(), Copy::Run(2))].into());
        assert!(p.leaving.is_empty());
    }

    #[test]
    fn waiting_moves_are_woken_in_order_once_each() {
        let mut w = Waiting::default();
        assert!(w.push("a"));
        assert!(w.push("b"));
        assert!(!w.push("a"), "waits once");
        assert!(w.push("c"));
        w.remove("b");
        assert_eq!(w.pop(1), ["a"]);
        assert_eq!(w.pop(5), ["c"], "b left the line");
        assert!(w.pop(1).is_empty());
        // Back in line after leaving it: once, at the back.
        assert!(w.push("b"));
        assert!(w.push("a"));
        assert_eq!(w.pop(2), ["b", "a"]);
    }

    fn reported(replicas: i64, observed: bool, status: Value) -> Reported {
        Reported {
            present: true,
            gang: None,
            federation_generation: 2,
            observed,
            status,
            replicas,
        }
    }

    #[test]
    fn available_means_this_generation_observed_and_enough_replicas_available() {
        let d = WorkloadKind::Deployment;
        let r = reported(3, true, json!({"availableReplicas": 3}));
        assert!(is_available(d, &r, 2, 3));
        assert!(!is_available(d, &r, 3, 3), "made from an older generation");
        assert!(!is_available(d, &r, 2, 4));
        let unobserved = reported(3, false, json!({"availableReplicas": 3}));
        assert!(!is_available(d, &unobserved, 2, 3));
        assert!(is_available(d, &Reported::default(), 2, 0), "nothing asked");
    }

    #[test]
    fn stopped_counts_terminating_pods_and_needs_the_stopped_spec() {
        let job = WorkloadKind::Job;
        let suspended = json!({"conditions": [{"type": "Suspended", "status": "True"}]});
        assert!(is_stopped(job, &reported(0, true, suspended.clone()), 0));
        // Its pods still terminating.
        let mut terminating = suspended.clone();
        terminating["terminating"] = json!(1);
        assert!(!is_stopped(job, &reported(0, true, terminating), 0));
        // A report from before the suspension reached it.
        assert!(!is_stopped(
            job,
            &reported(1, true, json!({"active": 0})),
            0
        ));
        let complete = json!({"conditions": [{"type": "Complete", "status": "True"}]});
        assert!(is_stopped(job, &reported(1, true, complete), 0));
        let cron = WorkloadKind::CronJob;
        assert!(!is_stopped(
            cron,
            &reported(0, true, json!({"active": [{"name": "x"}]})),
            0
        ));
        assert!(is_stopped(
            cron,
            &reported(0, true, json!({"active": []})),
            0
        ));
        let sts = WorkloadKind::StatefulSet;
        assert!(!is_stopped(
            sts,
            &reported(0, true, json!({"replicas": 1})),
            0
        ));
        assert!(!is_stopped(
            sts,
            &reported(0, false, json!({"replicas": 0})),
            0
        ));
        assert!(is_stopped(
            sts,
            &reported(0, true, json!({"replicas": 0})),
            0
        ));
        assert!(is_stopped(sts, &Reported::default(), 0), "no copy at all");
    }
}
