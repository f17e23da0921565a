//! The planner's decisions, round by round, over made-up reports.

use super::*;

const RES: [&str; 3] = ["cpu", "memory", "pods"];

fn shard(name: &str, policy: LendingPolicy, report: pb::Lending) -> ShardLending {
    ShardLending {
        name: name.into(),
        ready: true,
        capable: true,
        policy,
        resources: RES.iter().map(|r| (*r).to_owned()).collect(),
        report: Some(report),
    }
}

fn lends(n: u64) -> LendingPolicy {
    LendingPolicy {
        min_nodes: 1,
        max_lend: n,
        max_borrow: 0,
    }
}

fn borrows(n: u64) -> LendingPolicy {
    LendingPolicy {
        min_nodes: 0,
        max_lend: 0,
        max_borrow: n,
    }
}

/// A node of 4 cpu, 16 GiB, 110 pods.
fn idle(name: &str) -> pb::IdleNode {
    pb::IdleNode {
        name: name.into(),
        allocatable: vec![4000, 16 << 30, 110],
        process: false,
    }
}

/// `pods` pods of one cpu each waiting.
fn waiting(pods: u64) -> pb::Lending {
    pb::Lending {
        unmet_pods: pods,
        own_unmet_pods: pods,
        unmet: vec![pods * 1000, pods << 30, pods],
        unmet_process: vec![0, 0, 0],
        schedulable_nodes: 2,
        ..Default::default()
    }
}

fn spare(idle_nodes: &[&str], schedulable: u64) -> pb::Lending {
    pb::Lending {
        idle: idle_nodes.iter().map(|n| idle(n)).collect(),
        schedulable_nodes: schedulable,
        unmet: vec![0, 0, 0],
        unmet_process: vec![0, 0, 0],
        ..Default::default()
    }
}

fn loan_state(node: &str, peer: &str, loan: &str, ready: bool, idle: bool) -> pb::LoanState {
    pb::LoanState {
        node: node.into(),
        peer: peer.into(),
        loan: loan.into(),
        ready,
        idle,
    }
}

fn ops(steps: &[Step]) -> Vec<(String, pb::loan::Op, String)> {
    steps
        .iter()
        .map(|s| (s.to.clone(), s.op, s.node.clone()))
        .collect()
}

#[test]
fn a_shard_waiting_long_enough_borrows_just_enough_idle_nodes() {
    let cfg = LendingConfig::default();
    let mut p = Planner::default();
    let t0 = Instant::now();
    let fleet = vec![
        shard("a", lends(8), spare(&["a-1", "a-2", "a-3", "a-4"], 5)),
        shard("b", borrows(8), waiting(6)),
    ];
    // Not yet: the demand has to last `borrow_after`.
    let (steps, _) = p.plan(&fleet, &cfg, t0, 1);
    assert!(steps.is_empty(), "{steps:?}");
    let (steps, _) = p.plan(&fleet, &cfg, t0 + cfg.borrow_after, 2);
    // 6 cpu wanted, 4 per node: two nodes, each admitted by b and lent by a.
    assert_eq!(
        ops(&steps),
        vec![
            ("b".into(), pb::loan::Op::Admit, "a-1".into()),
            ("a".into(), pb::loan::Op::Lend, "a-1".into()),
            ("b".into(), pb::loan::Op::Admit, "a-2".into()),
            ("a".into(), pb::loan::Op::Lend, "a-2".into()),
        ]
    );
    // While those are on their way nothing more is lent, and nothing is sent again before
    // `resend`.
    let (steps, _) = p.plan(
        &fleet,
        &cfg,
        t0 + cfg.borrow_after + Duration::from_secs(1),
        3,
    );
    assert!(steps.is_empty(), "{steps:?}");
}

#[test]
fn policies_cap_what_is_lent_and_borrowed_and_keep_min_nodes_home() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    let later = t0 + cfg.borrow_after;
    for (lender, borrower, schedulable, want) in [
        // maxBorrow 1.
        (lends(8), borrows(1), 5, 1),
        // maxLend 1.
        (lends(1), borrows(8), 5, 1),
        // minNodes 1 of 3 schedulable: two may go.
        (lends(8), borrows(8), 3, 2),
        // It lends nothing.
        (lends(0), borrows(8), 5, 0),
        // It borrows nothing.
        (lends(8), borrows(0), 5, 0),
    ] {
        let mut p = Planner::default();
        let fleet = vec![
            shard(
                "a",
                lender,
                spare(&["a-1", "a-2", "a-3", "a-4"], schedulable),
            ),
            shard("b", borrower, waiting(16)),
        ];
        p.plan(&fleet, &cfg, t0, 1);
        let (steps, _) = p.plan(&fleet, &cfg, later, 2);
        let lent = steps.iter().filter(|s| s.op == pb::loan::Op::Lend).count();
        assert_eq!(lent, want, "{lender:?} {borrower:?} {schedulable}");
    }
}

#[test]
fn a_lender_with_demand_of_its_own_lends_nothing_and_a_shard_never_lends_to_itself() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    let mut busy = spare(&["a-1", "a-2"], 5);
    busy.own_unmet_pods = 1;
    let mut p = Planner::default();
    let fleet = vec![
        shard("a", lends(8), busy),
        shard("b", borrows(8), waiting(4)),
    ];
    p.plan(&fleet, &cfg, t0, 1);
    let (steps, _) = p.plan(&fleet, &cfg, t0 + cfg.borrow_after, 2);
    assert!(steps.is_empty(), "{steps:?}");
    // Both lend and borrow, one has idle nodes and waits: it does not lend to itself.
    let mut both = waiting(4);
    both.idle = vec![idle("b-9")];
    let policy = LendingPolicy {
        min_nodes: 0,
        max_lend: 8,
        max_borrow: 8,
    };
    let mut p = Planner::default();
    let fleet = vec![shard("b", policy, both)];
    p.plan(&fleet, &cfg, t0, 1);
    let (steps, _) = p.plan(&fleet, &cfg, t0 + cfg.borrow_after, 2);
    assert!(steps.is_empty(), "{steps:?}");
}

/// Runs a loan of `a-1` from a to b up to active; the planner and the loan id.
fn active_loan(cfg: &LendingConfig, t0: Instant) -> (Planner, String) {
    let mut p = Planner::default();
    let fleet = vec![
        shard("a", lends(8), spare(&["a-1"], 5)),
        shard("b", borrows(8), waiting(1)),
    ];
    p.plan(&fleet, cfg, t0, 1);
    let (steps, _) = p.plan(&fleet, cfg, t0 + cfg.borrow_after, 2);
    let id = steps[0].loan.clone();
    let mut a = spare(&[], 4);
    a.lent = vec![loan_state("a-1", "b", &id, true, true)];
    let mut b = waiting(0);
    b.borrowed = vec![loan_state("a-1", "a", &id, true, false)];
    let fleet = vec![shard("a", lends(8), a), shard("b", borrows(8), b)];
    let (_, outcomes) = p.plan(&fleet, cfg, t0 + cfg.borrow_after, 3);
    assert!(
        matches!(&outcomes[..], [Outcome::Lent { node, .. }] if node == "a-1"),
        "{outcomes:?}"
    );
    (p, id)
}

#[test]
fn a_loan_goes_back_when_the_lender_needs_it_borrower_first_then_lender() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    let (mut p, id) = active_loan(&cfg, t0);
    let t = t0 + cfg.borrow_after;
    // The lender now has pods of its own waiting (its other nodes full).
    let mut a = spare(&[], 4);
    a.lent = vec![loan_state("a-1", "b", &id, true, true)];
    a.own_unmet_pods = 3;
    let mut b = waiting(0);
    b.borrowed = vec![loan_state("a-1", "a", &id, true, false)];
    let fleet = vec![shard("a", lends(8), a.clone()), shard("b", borrows(8), b)];
    let (steps, _) = p.plan(&fleet, &cfg, t + Duration::from_secs(1), 4);
    assert!(
        steps.is_empty(),
        "its demand has to last recall_after first"
    );
    let (steps, outcomes) = p.plan(
        &fleet,
        &cfg,
        t + cfg.recall_after + Duration::from_secs(1),
        5,
    );
    assert!(
        matches!(&outcomes[..], [Outcome::Returning { why, .. }] if why.contains("lender comes first")),
        "{outcomes:?}"
    );
    assert_eq!(
        ops(&steps),
        vec![("b".into(), pb::loan::Op::Return, "a-1".into())]
    );
    // The borrower let it go: the lender takes it back.
    let fleet = vec![shard("a", lends(8), a), shard("b", borrows(8), waiting(0))];
    let t = t + Duration::from_secs(10);
    let (steps, _) = p.plan(&fleet, &cfg, t, 6);
    assert_eq!(
        ops(&steps),
        vec![("a".into(), pb::loan::Op::Reclaim, "a-1".into())]
    );
    // Back home: the loan is over.
    let fleet = vec![
        shard("a", lends(8), spare(&["a-1"], 5)),
        shard("b", borrows(8), waiting(0)),
    ];
    let (steps, outcomes) = p.plan(&fleet, &cfg, t + Duration::from_secs(1), 7);
    assert!(steps.is_empty(), "{steps:?}");
    assert!(
        matches!(&outcomes[..], [Outcome::Returned { node, .. }] if node == "a-1"),
        "{outcomes:?}"
    );
    assert_eq!(p.loans().count(), 0);
}

#[test]
fn an_idle_loan_goes_back_after_idle_return_and_a_busy_one_stays() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    let (mut p, id) = active_loan(&cfg, t0);
    let t = t0 + cfg.borrow_after;
    let mut a = spare(&[], 4);
    a.lent = vec![loan_state("a-1", "b", &id, true, true)];
    let fleet = |idle: bool| {
        let mut b = waiting(0);
        b.borrowed = vec![loan_state("a-1", "a", &id, true, idle)];
        vec![shard("a", lends(8), a.clone()), shard("b", borrows(8), b)]
    };
    // Busy well past idle_return: stays.
    let (steps, _) = p.plan(&fleet(false), &cfg, t + cfg.idle_return * 2, 4);
    assert!(steps.is_empty(), "{steps:?}");
    // Idle, but not for long enough yet.
    let t = t + cfg.idle_return * 2;
    let (steps, _) = p.plan(&fleet(true), &cfg, t + cfg.idle_return / 2, 5);
    assert!(steps.is_empty(), "{steps:?}");
    let (steps, outcomes) = p.plan(&fleet(true), &cfg, t + cfg.idle_return, 6);
    assert!(
        matches!(&outcomes[..], [Outcome::Returning { why, .. }] if why.starts_with("idle")),
        "{outcomes:?}"
    );
    assert_eq!(
        ops(&steps),
        vec![("b".into(), pb::loan::Op::Return, "a-1".into())]
    );
}

#[test]
fn a_loan_that_never_joins_is_given_up_and_steps_are_repeated_until_seen() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    let mut p = Planner::default();
    let fleet = vec![
        shard("a", lends(8), spare(&["a-1"], 5)),
        shard("b", borrows(8), waiting(1)),
    ];
    p.plan(&fleet, &cfg, t0, 1);
    let t = t0 + cfg.borrow_after;
    let (steps, _) = p.plan(&fleet, &cfg, t, 2);
    assert_eq!(steps.len(), 2);
    let (steps, _) = p.plan(&fleet, &cfg, t + cfg.resend, 3);
    assert_eq!(steps.len(), 2, "sent again: {steps:?}");
    let (steps, outcomes) = p.plan(&fleet, &cfg, t + cfg.lend_timeout, 4);
    assert!(
        matches!(&outcomes[..], [Outcome::Returning { why, .. }] if why.contains("did not join")),
        "{outcomes:?}"
    );
    assert_eq!(
        ops(&steps),
        vec![("b".into(), pb::loan::Op::Return, "a-1".into())]
    );
}

#[test]
fn after_a_restart_loans_are_taken_back_from_the_reports() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    // Both sides report loan x: active (nothing sent). Only the lender reports y: given
    // back (the lender reclaims it at once, the borrower has nothing to let go).
    let mut a = spare(&[], 4);
    a.lent = vec![
        loan_state("a-1", "b", "x", true, true),
        loan_state("a-2", "b", "y", true, true),
    ];
    let mut b = waiting(0);
    b.borrowed = vec![loan_state("a-1", "a", "x", true, false)];
    let fleet = vec![shard("a", lends(8), a), shard("b", borrows(8), b)];
    let mut p = Planner::default();
    let (steps, _) = p.plan(&fleet, &cfg, t0, 1);
    assert_eq!(
        ops(&steps),
        vec![("a".into(), pb::loan::Op::Reclaim, "a-2".into())]
    );
    let phases: Vec<(&str, &str)> = p.loans().map(|l| (l.id.as_str(), l.phase.name())).collect();
    assert_eq!(phases, vec![("x", "active"), ("y", "returning")]);
}

#[test]
fn after_a_restart_a_loan_one_side_reports_waits_for_the_other_side() {
    let cfg = LendingConfig::default();
    let t0 = Instant::now();
    let mut a = spare(&[], 4);
    a.lent = vec![loan_state("a-1", "b", "x", true, true)];
    let mut b = waiting(0);
    b.borrowed = vec![loan_state("a-1", "a", "x", true, false)];
    // Only a has reported since the federation came back: nothing is decided about x.
    let mut silent = shard("b", borrows(8), b.clone());
    silent.report = None;
    let mut p = Planner::default();
    let (steps, _) = p.plan(
        &[shard("a", lends(8), a.clone()), silent.clone()],
        &cfg,
        t0,
        1,
    );
    assert!(steps.is_empty(), "{steps:?}");
    assert_eq!(p.loans().count(), 0);
    // b reports: both sides have it, it is active.
    let (steps, _) = p.plan(
        &[shard("a", lends(8), a.clone()), shard("b", borrows(8), b)],
        &cfg,
        t0 + Duration::from_secs(1),
        2,
    );
    assert!(steps.is_empty(), "{steps:?}");
    assert_eq!(
        p.loans().map(|l| l.phase.name()).collect::<Vec<_>>(),
        vec!["active"]
    );
    // A borrower that never reports again: after lend_timeout the lender takes it back.
    let mut p = Planner::default();
    p.plan(
        &[shard("a", lends(8), a.clone()), silent.clone()],
        &cfg,
        t0,
        1,
    );
    let (steps, _) = p.plan(
        &[shard("a", lends(8), a), silent],
        &cfg,
        t0 + cfg.lend_timeout,
        2,
    );
    assert_eq!(
        ops(&steps),
        vec![("a".into(), pb::loan::Op::Reclaim, "a-1".into())]
    );
}
