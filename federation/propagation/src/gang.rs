//! Cross-shard gangs: a Job whose pods form a PodGroup of `Federation` scope may be divided
//! over shards when no one shard can hold it, and is then started in all of them or in none.
//!
//! The federation commits it in two phases, each part a Job of `share` pods and a PodGroup
//! of `minMember: share` in its shard:
//!
//! 1. **Reserve.** Each part's PodGroup says `tessera.io/gang-phase: Reserve`: the shard's
//!    scheduler places the part's members and holds them at Permit, binding none, and
//!    reports `status.reserved` for the attempt (`tessera.io/gang-attempt`). A reservation
//!    lives for the PodGroup's `scheduleTimeoutSeconds` (its TTL); then the members are let
//!    go and gather again.
//! 2. **Commit.** Once every part reports its members reserved for this attempt, the
//!    federation records `Committed` (before any shard is told, so a restarted federation
//!    goes on committing, never re-deciding) and turns every part's phase to `Commit`: each
//!    shard binds its part in one store transaction.
//!
//! A gang that cannot reserve every part by its deadline, or that loses a shard (its lease
//! lapsed) before every part is bound, is **aborted**: every part is removed, and the gang is
//! placed again only after a back-off that also covers the lost shard's fence (lease +
//! grace + margin), by when that shard has stopped its part itself. So no part is ever bound
//! without a recorded commit, and a gang found partial is torn down, not left running. Two
//! shards cannot be made to start at the same instant across a partition (the two generals);
//! what is guaranteed is that a partial gang never stays.
//!
//! Decisions here are pure: the controller feeds reports in and acts on [`Next`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_client::types::{
    FEDERATED_LABEL, GANG_ATTEMPT_ANNOTATION, GANG_JOB_ANNOTATION, GANG_PHASE_ANNOTATION,
    GANG_SCOPE_FEDERATION, POD_GROUP_LABEL, PodGroup,
};

/// How long a gang's reservation lives when its PodGroup does not say.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// What the federation allows on top of the TTL for parts to reserve, or to bind after a
/// commit (pods to be created, reports to come back).
pub const SLACK: Duration = Duration::from_secs(10);
/// The least wait after an abort before the gang is placed again.
pub const BACKOFF: Duration = Duration::from_secs(3);

/// Where a federation-scope gang stands: part of its Job's recorded decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    /// Its parts are assigned in the `Reserve` phase.
    #[default]
    Reserving,
    /// Every part was reserved and the commit is recorded: parts are told to bind.
    Committed,
    /// Every part is bound.
    Bound,
    /// Aborted: nothing is assigned until `until`.
    Backoff,
}

/// The gang's record (in the Job's `tessera.io/placement`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Where it stands.
    pub phase: Phase,
    /// Which attempt: each placement after an abort is a new one, so a reservation left from
    /// an older attempt never counts.
    pub attempt: i64,
    /// When the phase began (Unix milliseconds).
    pub since: u64,
    /// In `Backoff`: not placed again before (Unix milliseconds).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub until: u64,
    /// Why the last attempt was aborted.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Record {
    /// A new attempt, reserving from `now`.
    pub fn reserving(previous: Option<&Record>, now: u64) -> Record {
        Record {
            phase: Phase::Reserving,
            attempt: previous.map_or(1, |r| r.attempt + 1),
            since: now,
            until: 0,
            why: String::new(),
        }
    }

    /// A new attempt placed on `parts` shards from `now`: reserving in each, or — a gang
    /// whole in one shard — committed at once, as the shard's own transaction binds it whole
    /// (no second phase to wait for, so no reservation held for one).
    pub fn start(previous: Option<&Record>, now: u64, parts: usize) -> Record {
        let mut r = Record::reserving(previous, now);
        if parts == 1 {
            r.phase = Phase::Committed;
        }
        r
    }

    /// The PodGroup phase its parts are assigned with.
    pub fn part_phase(&self) -> &'static str {
        match self.phase {
            Phase::Reserving | Phase::Backoff => "Reserve",
            Phase::Committed | Phase::Bound => "Commit",
        }
    }
}

/// A gang the federation divides: the Job's PodGroup, of `Federation` scope.
#[derive(Clone, Debug, PartialEq)]
pub struct Gang {
    /// The PodGroup's name.
    pub group: String,
    /// Its `minMember`: the Job's pods, all of them started together.
    pub min_member: u64,
    /// How long a part's reservation lives.
    pub ttl: Duration,
}

/// The federation-scope gang Job `spec` forms with the PodGroup its template names
/// (`group`, if it exists here); `Ok(None)` for a Job that is no such gang, `Err` with what
/// to change for one the federation cannot divide.
pub fn of_job(spec: &Value, group: Option<&PodGroup>) -> Result<Option<Gang>, String> {
    let Some(g) = group else { return Ok(None) };
    let gspec = g.spec.clone().unwrap_or_default();
    if gspec.scope.as_deref() != Some(GANG_SCOPE_FEDERATION) {
        return Ok(None);
    }
    let name = g.metadata.name.clone().unwrap_or_default();
    let min = gspec.min_member.max(0) as u64;
    let parallelism = spec["parallelism"].as_u64().unwrap_or(1);
    if parallelism != min {
        return Err(format!(
            "a Job of the federation-scope gang {name} must start its minMember pods at once: set spec.parallelism to {min} (it is {parallelism})"
        ));
    }
    if let Some(c) = spec["completions"].as_u64()
        && c != min
    {
        return Err(format!(
            "a Job of the federation-scope gang {name} runs each member once: set spec.completions to {min} or leave it out (it is {c})"
        ));
    }
    if spec["completionMode"] == "Indexed" {
        return Err(format!(
            "a Job of the federation-scope gang {name} is divided over shards, which an Indexed Job's completion indexes cannot be: use completionMode NonIndexed"
        ));
    }
    let ttl = gspec
        .schedule_timeout_seconds
        .filter(|s| *s > 0)
        .map_or(DEFAULT_TTL, |s| Duration::from_secs(s as u64));
    Ok(Some(Gang {
        group: name,
        min_member: min,
        ttl,
    }))
}

/// The PodGroup a pod template names (`namespace/name`), if any.
pub fn group_named(template: &Value, ns: &str) -> Option<String> {
    template["metadata"]["labels"][POD_GROUP_LABEL]
        .as_str()
        .map(|g| format!("{ns}/{g}"))
}

/// The PodGroup that is a shard's part of `gang`: `share` members, in `phase` of `attempt`.
pub fn part_manifest(gang: &Gang, ns: &str, job: &str, share: u64, record: &Record) -> Value {
    json!({
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "name": gang.group,
            "namespace": ns,
            "labels": {FEDERATED_LABEL: "true"},
            "annotations": {
                GANG_PHASE_ANNOTATION: record.part_phase(),
                GANG_ATTEMPT_ANNOTATION: record.attempt.to_string(),
                GANG_JOB_ANNOTATION: job,
            },
        },
        "spec": {"minMember": share, "scheduleTimeoutSeconds": gang.ttl.as_secs()},
    })
}

/// What a shard holds of one part, as it reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Part {
    /// The part's size.
    pub share: u64,
    /// The shard's lease lapsed: it is cut off or gone.
    pub lost: bool,
    /// The shard evicts the gang (a `NoExecute` taint it does not tolerate: a drain), and
    /// why.
    pub evicted: Option<String>,
    /// Members reserved, the attempt they are for, members bound (none reported: `None`).
    pub gang: Option<(i64, i64, i64)>,
}

impl Part {
    fn reserved_for(&self, attempt: i64) -> bool {
        self.gang
            .is_some_and(|(r, a, _)| a == attempt && r >= self.share as i64)
    }

    fn bound(&self) -> i64 {
        self.gang.map_or(0, |g| g.2)
    }
}

/// What to do next with a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing yet; look again after this long (or on the next report).
    Stay(Option<Duration>),
    /// Every part is reserved for this attempt: record the commit, then tell the parts.
    Commit,
    /// Every part is bound.
    Bound,
    /// Remove every part; place the gang again after the back-off. Why.
    Abort(String),
    /// The back-off is over and no live shard holds a part: place it afresh.
    Place,
}

/// The next step of gang `record` with its `parts` (by shard) at `now` (Unix ms).
/// `live_copies` says whether a live shard still reports a copy (an aborted gang is placed
/// again only when none does).
pub fn next(
    record: &Record,
    parts: &BTreeMap<String, Part>,
    ttl: Duration,
    now: u64,
    live_copies: bool,
) -> Next {
    let deadline = record.since + (ttl + SLACK).as_millis() as u64;
    let left = || Some(Duration::from_millis(deadline.saturating_sub(now).max(1)));
    let lost = parts.iter().find(|(_, p)| p.lost).map(|(s, _)| s);
    // A drained shard: the gang moves whole, stopped before it starts elsewhere.
    if record.phase != Phase::Backoff
        && let Some((s, why)) = parts
            .iter()
            .find_map(|(s, p)| p.evicted.as_ref().map(|w| (s, w)))
    {
        return Next::Abort(format!(
            "{why}; the gang is stopped and placed again whole without shard {s}"
        ));
    }
    match record.phase {
        Phase::Reserving => {
            if let Some(s) = lost {
                return Next::Abort(format!("shard {s} was lost before the gang was committed"));
            }
            if !parts.is_empty() && parts.values().all(|p| p.reserved_for(record.attempt)) {
                return Next::Commit;
            }
            if now >= deadline {
                let short: Vec<String> = parts
                    .iter()
                    .filter(|(_, p)| !p.reserved_for(record.attempt))
                    .map(|(s, p)| {
                        let have = p.gang.filter(|g| g.1 == record.attempt).map_or(0, |g| g.0);
                        format!("{s} reserved {have} of {}", p.share)
                    })
                    .collect();
                return Next::Abort(format!(
                    "not every part was reserved within {}s ({})",
                    (ttl + SLACK).as_secs(),
                    short.join(", ")
                ));
            }
            Next::Stay(left())
        }
        Phase::Committed => {
            if let Some(s) = lost {
                return Next::Abort(format!(
                    "shard {s} was lost before its part of the gang was bound"
                ));
            }
            if parts.values().all(|p| p.bound() >= p.share as i64) {
                return Next::Bound;
            }
            if now >= deadline {
                let (s, p) = parts
                    .iter()
                    .find(|(_, p)| p.bound() < p.share as i64)
                    .expect("a part is not bound");
                return Next::Abort(format!(
                    "shard {s} bound {} of its {} members within {}s of the commit",
                    p.bound(),
                    p.share,
                    (ttl + SLACK).as_secs()
                ));
            }
            Next::Stay(left())
        }
        Phase::Bound => match lost {
            Some(s) => Next::Abort(format!(
                "shard {s} was lost: the gang runs whole or not at all"
            )),
            None => Next::Stay(None),
        },
        Phase::Backoff => {
            if now < record.until {
                Next::Stay(Some(Duration::from_millis(record.until - now)))
            } else if live_copies {
                Next::Stay(Some(Duration::from_secs(1)))
            } else {
                Next::Place
            }
        }
    }
}

/// Now, in Unix milliseconds (what a [`Record`] counts in: it outlives the process).
pub fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The shares a gang of `min_member` gets from a decision that placed `shares` and left
/// `unplaced`: all or nothing.
pub fn all_or_nothing(shares: &mut BTreeMap<String, u64>, unplaced: &mut u64, min_member: u64) {
    if *unplaced > 0 {
        shares.clear();
        *unplaced = min_member;
    }
}

#[cfg(test)]
mod tests;
