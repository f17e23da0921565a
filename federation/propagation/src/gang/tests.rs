//! The two phases as a table: every report a gang can be in, and what the federation does.

use super::*;

const TTL: Duration = Duration::from_secs(20);
/// The deadline of a phase begun at 0: TTL + SLACK.
const DEADLINE: u64 = 30_000;

fn rec(phase: Phase, attempt: i64) -> Record {
    Record {
        phase,
        attempt,
        since: 0,
        until: if phase == Phase::Backoff { 5_000 } else { 0 },
        why: String::new(),
    }
}

fn part(share: u64, gang: Option<(i64, i64, i64)>, lost: bool) -> Part {
    Part {
        share,
        lost,
        gang,
        evicted: None,
    }
}

fn drained(share: u64) -> Part {
    Part {
        evicted: Some("shard b has taint tessera.io/drain:NoExecute".into()),
        ..part(share, Some((0, 0, share as i64)), false)
    }
}

/// One row: what, the record, its parts, now, whether a live shard holds a copy, the step.
type Case = (
    &'static str,
    Record,
    BTreeMap<String, Part>,
    u64,
    bool,
    Next,
);

fn parts(list: &[(&str, Part)]) -> BTreeMap<String, Part> {
    list.iter()
        .map(|(s, p)| (s.to_string(), p.clone()))
        .collect()
}

#[test]
fn the_two_phases() {
    let reserved = |n| Some((n, 2, 0));
    let cases: Vec<Case> = vec![
        (
            "every part reserved for this attempt: commit",
            rec(Phase::Reserving, 2),
            parts(&[
                ("a", part(4, reserved(4), false)),
                ("b", part(2, reserved(2), false)),
            ]),
            1_000,
            true,
            Next::Commit,
        ),
        (
            "one part short: wait until the deadline",
            rec(Phase::Reserving, 2),
            parts(&[
                ("a", part(4, reserved(4), false)),
                ("b", part(2, reserved(1), false)),
            ]),
            1_000,
            true,
            Next::Stay(Some(Duration::from_millis(DEADLINE - 1_000))),
        ),
        (
            "a reservation left from an older attempt does not count",
            rec(Phase::Reserving, 2),
            parts(&[
                ("a", part(4, reserved(4), false)),
                ("b", part(2, Some((2, 1, 0)), false)),
            ]),
            1_000,
            true,
            Next::Stay(Some(Duration::from_millis(DEADLINE - 1_000))),
        ),
        (
            "past the deadline: abort, naming what was short",
            rec(Phase::Reserving, 2),
            parts(&[
                ("a", part(4, reserved(4), false)),
                ("b", part(2, Some((2, 1, 0)), false)),
            ]),
            DEADLINE,
            true,
            Next::Abort("not every part was reserved within 30s (b reserved 0 of 2)".into()),
        ),
        (
            "a shard lost while reserving: abort",
            rec(Phase::Reserving, 2),
            parts(&[
                ("a", part(4, reserved(4), false)),
                ("b", part(2, reserved(2), true)),
            ]),
            1_000,
            true,
            Next::Abort("shard b was lost before the gang was committed".into()),
        ),
        (
            "committed, every part bound",
            rec(Phase::Committed, 2),
            parts(&[
                ("a", part(4, Some((4, 2, 4)), false)),
                ("b", part(2, Some((0, 0, 2)), false)),
            ]),
            1_000,
            true,
            Next::Bound,
        ),
        (
            "committed, one part not bound yet",
            rec(Phase::Committed, 2),
            parts(&[
                ("a", part(4, Some((4, 2, 4)), false)),
                ("b", part(2, reserved(2), false)),
            ]),
            1_000,
            true,
            Next::Stay(Some(Duration::from_millis(DEADLINE - 1_000))),
        ),
        (
            "committed, a shard cut off before its part was bound: abort",
            rec(Phase::Committed, 2),
            parts(&[
                ("a", part(4, Some((4, 2, 4)), false)),
                ("b", part(2, reserved(2), true)),
            ]),
            1_000,
            true,
            Next::Abort("shard b was lost before its part of the gang was bound".into()),
        ),
        (
            "committed, a part never bound by the deadline: abort",
            rec(Phase::Committed, 2),
            parts(&[
                ("a", part(4, Some((4, 2, 4)), false)),
                ("b", part(2, Some((0, 2, 1)), false)),
            ]),
            DEADLINE + 1,
            true,
            Next::Abort("shard b bound 1 of its 2 members within 30s of the commit".into()),
        ),
        (
            "whole in one shard, committed at once, not bound by the deadline: aborted",
            rec(Phase::Committed, 2),
            parts(&[("a", part(6, Some((0, 0, 1)), false))]),
            DEADLINE,
            true,
            Next::Abort("shard a bound 1 of its 6 members within 30s of the commit".into()),
        ),
        (
            "bound and whole: nothing to do",
            rec(Phase::Bound, 2),
            parts(&[
                ("a", part(4, Some((0, 0, 4)), false)),
                ("b", part(2, Some((0, 0, 2)), false)),
            ]),
            DEADLINE * 10,
            true,
            Next::Stay(None),
        ),
        (
            "bound, then a shard lost: torn down whole",
            rec(Phase::Bound, 2),
            parts(&[
                ("a", part(4, Some((0, 0, 4)), false)),
                ("b", part(2, None, true)),
            ]),
            1_000,
            true,
            Next::Abort("shard b was lost: the gang runs whole or not at all".into()),
        ),
        (
            "bound, then a shard drained: moved whole",
            rec(Phase::Bound, 2),
            parts(&[("a", part(4, Some((0, 0, 4)), false)), ("b", drained(2))]),
            1_000,
            true,
            Next::Abort("shard b has taint tessera.io/drain:NoExecute; the gang is stopped and placed again whole without shard b".into()),
        ),
        (
            "reserving on a shard being drained: aborted at once",
            rec(Phase::Reserving, 2),
            parts(&[("a", part(4, reserved(4), false)), ("b", drained(2))]),
            1_000,
            true,
            Next::Abort("shard b has taint tessera.io/drain:NoExecute; the gang is stopped and placed again whole without shard b".into()),
        ),
        (
            "backing off: wait for its end",
            rec(Phase::Backoff, 2),
            BTreeMap::new(),
            1_000,
            false,
            Next::Stay(Some(Duration::from_millis(4_000))),
        ),
        (
            "backed off, but a live shard still holds a copy",
            rec(Phase::Backoff, 2),
            BTreeMap::new(),
            6_000,
            true,
            Next::Stay(Some(Duration::from_secs(1))),
        ),
        (
            "backed off and nothing left: place again",
            rec(Phase::Backoff, 2),
            BTreeMap::new(),
            6_000,
            false,
            Next::Place,
        ),
    ];
    for (what, record, parts, now, live, want) in cases {
        assert_eq!(next(&record, &parts, TTL, now, live), want, "{what}");
    }
}

#[test]
fn a_new_attempt_is_numbered_after_the_last() {
    let first = Record::reserving(None, 10);
    assert_eq!(
        (first.attempt, first.phase, first.since),
        (1, Phase::Reserving, 10)
    );
    let mut aborted = first.clone();
    aborted.phase = Phase::Backoff;
    assert_eq!(Record::reserving(Some(&aborted), 20).attempt, 2);
    assert_eq!(first.part_phase(), "Reserve");
    let divided = Record::start(Some(&aborted), 30, 2);
    assert_eq!((divided.phase, divided.attempt), (Phase::Reserving, 2));
    let whole = Record::start(None, 30, 1);
    assert_eq!(
        (whole.phase, whole.part_phase()),
        (Phase::Committed, "Commit"),
        "a gang in one shard needs no second phase"
    );
    assert_eq!(rec(Phase::Committed, 1).part_phase(), "Commit");
    assert_eq!(rec(Phase::Bound, 1).part_phase(), "Commit");
}

fn group(scope: Option<&str>, min: i32, ttl: Option<i32>) -> PodGroup {
    serde_json::from_value(json!({
        "metadata": {"name": "g", "namespace": "t"},
        "spec": {"minMember": min, "scope": scope, "scheduleTimeoutSeconds": ttl},
    }))
    .expect("a PodGroup")
}

#[test]
fn which_jobs_are_federation_gangs() {
    let fed = group(Some("Federation"), 6, Some(15));
    let job = |p: u64, c: Option<u64>, mode: &str| json!({"parallelism": p, "completions": c, "completionMode": mode});
    assert_eq!(
        of_job(&job(6, Some(6), "NonIndexed"), Some(&fed)),
        Ok(Some(Gang {
            group: "g".into(),
            min_member: 6,
            ttl: Duration::from_secs(15)
        }))
    );
    assert_eq!(
        of_job(
            &job(6, None, "NonIndexed"),
            Some(&group(Some("Federation"), 6, None))
        )
        .map(|g| g.map(|g| g.ttl)),
        Ok(Some(DEFAULT_TTL))
    );
    assert_eq!(of_job(&job(6, Some(6), "NonIndexed"), None), Ok(None));
    assert_eq!(
        of_job(&job(6, Some(6), "NonIndexed"), Some(&group(None, 6, None))),
        Ok(None),
        "a shard-scope gang is placed whole"
    );
    assert_eq!(
        of_job(&job(4, Some(6), "NonIndexed"), Some(&fed)),
        Err("a Job of the federation-scope gang g must start its minMember pods at once: set spec.parallelism to 6 (it is 4)".into())
    );
    assert_eq!(
        of_job(&job(6, Some(12), "NonIndexed"), Some(&fed)),
        Err("a Job of the federation-scope gang g runs each member once: set spec.completions to 6 or leave it out (it is 12)".into())
    );
    assert!(
        of_job(&job(6, Some(6), "Indexed"), Some(&fed))
            .expect_err("an Indexed Job is refused")
            .contains("use completionMode NonIndexed")
    );
}

#[test]
fn a_part_is_a_podgroup_of_its_share_in_the_recorded_phase() {
    let gang = Gang {
        group: "g".into(),
        min_member: 6,
        ttl: Duration::from_secs(15),
    };
    let m = part_manifest(&gang, "t", "train", 4, &rec(Phase::Committed, 3));
    assert_eq!(m["metadata"]["name"], "g");
    assert_eq!(
        m["spec"],
        json!({"minMember": 4, "scheduleTimeoutSeconds": 15})
    );
    assert_eq!(
        m["metadata"]["annotations"][GANG_PHASE_ANNOTATION],
        "Commit"
    );
    assert_eq!(m["metadata"]["annotations"][GANG_ATTEMPT_ANNOTATION], "3");
    assert_eq!(m["metadata"]["annotations"][GANG_JOB_ANNOTATION], "train");
    assert_eq!(m["metadata"]["labels"][FEDERATED_LABEL], "true");
}

#[test]
fn a_gang_is_placed_whole_or_not_at_all() {
    let mut shares: BTreeMap<String, u64> = [("a".to_string(), 4)].into();
    let mut unplaced = 2;
    all_or_nothing(&mut shares, &mut unplaced, 6);
    assert!(shares.is_empty());
    assert_eq!(unplaced, 6);
    let mut shares: BTreeMap<String, u64> = [("a".to_string(), 4), ("b".to_string(), 2)].into();
    let mut unplaced = 0;
    all_or_nothing(&mut shares, &mut unplaced, 6);
    assert_eq!(shares.len(), 2);
}
