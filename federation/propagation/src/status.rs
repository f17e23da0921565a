//! A federated workload's status from its shards' copies: counts summed, the generation
//! observed only once every shard has observed the spec made from it, conditions merged —
//! so `kubectl rollout status` and `kubectl get deploy` at the federation tell the truth.

use serde_json::{Value, json};
use tessera_client::workloads::WorkloadKind;
use tessera_registry::Reported;

/// The counters of a Deployment's (and StatefulSet's, ReplicaSet's) status that add up.
const COUNTS: [&str; 6] = [
    "replicas",
    "updatedReplicas",
    "readyReplicas",
    "availableReplicas",
    "unavailableReplicas",
    "currentReplicas",
];

/// What the federation knows of a workload's placement, for its status.
#[derive(Debug, Clone, Default)]
pub struct Placed {
    /// The federation object's generation.
    pub generation: i64,
    /// Its shares per shard.
    pub shares: Vec<(String, u64)>,
    /// Replicas that fit nowhere yet.
    pub unplaced: u64,
    /// Why, if some wait.
    pub why: String,
    /// Whether they wait because the chosen policy is one the kind cannot follow (not for
    /// room): `why` says what to change.
    pub policy_refused: bool,
    /// Whether some wait because the tenant's fleet-wide quota is used up.
    pub quota_exceeded: bool,
}

fn condition(type_: &str, status: bool, reason: &str, message: &str, now: &str) -> Value {
    json!({
        "type": type_,
        "status": if status { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    })
}

fn cond<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The status of a federated workload of `kind` placed as `placed`, from `reports` (shard →
/// its copy's report, none while it has reported nothing), keeping what `previous` had where
/// nothing changed (transition times, the observed generation until every shard catches up).
pub fn aggregate(
    kind: WorkloadKind,
    placed: &Placed,
    reports: &[(String, Option<Reported>)],
    previous: &Value,
    now: &str,
) -> Value {
    match kind {
        WorkloadKind::Deployment => deployment(placed, reports, previous, now),
        WorkloadKind::ReplicaSet | WorkloadKind::StatefulSet => {
            counted(kind, placed, reports, previous, now)
        }
        WorkloadKind::Job => job(placed, reports, previous, now),
        WorkloadKind::CronJob => cron_job(reports),
    }
}

/// A Deployment's status: counts summed, Available and Progressing merged so that `kubectl
/// rollout status` at the federation waits for every shard's rollout.
fn deployment(
    placed: &Placed,
    reports: &[(String, Option<Reported>)],
    previous: &Value,
    now: &str,
) -> Value {
    let mut counts = [0i64; COUNTS.len()];
    let mut all_observed = true;
    let mut available = true;
    let mut progressing_failed: Option<String> = None;
    let mut complete = true;
    for (shard, share) in &placed.shares {
        let Some(Some(r)) = reports.iter().find(|(s, _)| s == shard).map(|(_, r)| r) else {
            all_observed = false;
            available &= *share == 0;
            complete = false;
            continue;
        };
        for (i, f) in COUNTS.iter().enumerate() {
            counts[i] += r.status[*f].as_i64().unwrap_or(0);
        }
        if r.federation_generation != placed.generation || !r.observed {
            all_observed = false;
        }
        // A copy whose controller has written no Available condition yet (just applied) is
        // not known to be available.
        if *share > 0 && cond(&r.status, "Available").is_none_or(|c| c["status"] != "True") {
            available = false;
        }
        match cond(&r.status, "Progressing") {
            Some(c) if c["reason"] == "ProgressDeadlineExceeded" => {
                progressing_failed = Some(format!(
                    "shard {shard}: {}",
                    c["message"]
                        .as_str()
                        .unwrap_or("progress deadline exceeded")
                ));
            }
            Some(c) if c["reason"] == "NewReplicaSetAvailable" => {}
            _ => complete = false,
        }
    }
    // Copies still running where the placement no longer puts any (being removed) count
    // toward replicas, as an old ReplicaSet's pods do during a rollout.
    for (shard, r) in reports {
        if placed.shares.iter().any(|(s, _)| s == shard) {
            continue;
        }
        if let Some(r) = r {
            counts[0] += r.status["replicas"].as_i64().unwrap_or(0);
        }
    }
    let observed = if all_observed {
        placed.generation
    } else {
        previous["observedGeneration"].as_i64().unwrap_or(0)
    };
    let mut status = json!({"observedGeneration": observed});
    for (i, f) in COUNTS.iter().enumerate() {
        if counts[i] != 0 || *f == "replicas" {
            status[*f] = json!(counts[i]);
        }
    }
    let shards: Vec<String> = placed
        .shares
        .iter()
        .map(|(s, n)| format!("{s}={n}"))
        .collect();
    let mut conditions = vec![
        if available {
            condition(
                "Available",
                true,
                "MinimumReplicasAvailable",
                "every shard's copy has minimum availability",
                now,
            )
        } else {
            condition(
                "Available",
                false,
                "MinimumReplicasUnavailable",
                "a shard's copy does not have minimum availability yet",
                now,
            )
        },
        match &progressing_failed {
            Some(m) => condition("Progressing", false, "ProgressDeadlineExceeded", m, now),
            None if complete && placed.unplaced == 0 => condition(
                "Progressing",
                true,
                "NewReplicaSetAvailable",
                &format!(
                    "placed on {}; every shard's rollout is complete",
                    shards.join(", ")
                ),
                now,
            ),
            None => condition(
                "Progressing",
                true,
                "ReplicaSetUpdated",
                &format!("placed on {}; shards are rolling out", shards.join(", ")),
                now,
            ),
        },
    ];
    conditions.push(placed_condition(placed, now));
    status["conditions"] = Value::Array(keep_transitions(conditions, previous));
    status
}

/// The `Placed` condition: every replica placed, or why some wait.
fn placed_condition(placed: &Placed, now: &str) -> Value {
    if placed.policy_refused {
        condition("Placed", false, "PolicyNotApplicable", &placed.why, now)
    } else if placed.unplaced == 0 {
        condition(
            "Placed",
            true,
            "Placed",
            &format!("all replicas placed: {}", shard_list(placed).join(", ")),
            now,
        )
    } else if placed.quota_exceeded {
        condition("Placed", false, "QuotaExceeded", &placed.why, now)
    } else {
        condition("Placed", false, "NoShardFits", &placed.why, now)
    }
}

fn shard_list(placed: &Placed) -> Vec<String> {
    placed
        .shares
        .iter()
        .map(|(s, n)| format!("{s}={n}"))
        .collect()
}

/// A condition whose status and reason did not change keeps its transition time (and its
/// update time while its message stays).
fn keep_transitions(mut conditions: Vec<Value>, previous: &Value) -> Vec<Value> {
    for c in &mut conditions {
        if let Some(old) = cond(previous, c["type"].as_str().unwrap_or_default())
            && old["status"] == c["status"]
            && old["reason"] == c["reason"]
        {
            c["lastTransitionTime"] = old["lastTransitionTime"].clone();
            if old.get("lastUpdateTime").is_some() && old["message"] == c["message"] {
                c["lastUpdateTime"] = old["lastUpdateTime"].clone();
            }
        }
    }
    conditions
}

/// Adds a report's `fields` (integers) to `counts`.
fn add_counts(counts: &mut [i64], fields: &[&str], status: &Value) {
    for (c, f) in counts.iter_mut().zip(fields) {
        *c += status[*f].as_i64().unwrap_or(0);
    }
}

/// Writes `counts` into `status` under their `fields`.
fn set_counts(status: &mut Value, fields: &[&str], counts: &[i64]) {
    for (f, c) in fields.iter().zip(counts) {
        status[*f] = json!(c);
    }
}

/// The reports of the shards `placed` puts a share on, in its order (none for a shard that
/// has reported nothing yet).
fn placed_reports<'a>(
    placed: &'a Placed,
    reports: &'a [(String, Option<Reported>)],
) -> impl Iterator<Item = (&'a str, Option<&'a Reported>)> {
    placed.shares.iter().map(move |(shard, _)| {
        let r = reports
            .iter()
            .find(|(s, _)| s == shard)
            .and_then(|(_, r)| r.as_ref());
        (shard.as_str(), r)
    })
}

/// A ReplicaSet's or StatefulSet's status: counts summed, the generation observed once every
/// shard observed it, a StatefulSet's revisions equal only once every shard's rollout is
/// done (what `kubectl rollout status statefulset` waits for).
fn counted(
    kind: WorkloadKind,
    placed: &Placed,
    reports: &[(String, Option<Reported>)],
    previous: &Value,
    now: &str,
) -> Value {
    let fields: &[&str] = match kind {
        WorkloadKind::StatefulSet => &[
            "replicas",
            "readyReplicas",
            "currentReplicas",
            "updatedReplicas",
            "availableReplicas",
        ],
        _ => &[
            "replicas",
            "fullyLabeledReplicas",
            "readyReplicas",
            "availableReplicas",
        ],
    };
    let mut counts = vec![0i64; fields.len()];
    let mut all_observed = true;
    let mut update_revision: Option<&Value> = None;
    let mut lagging: Option<&Value> = None;
    for (_, r) in placed_reports(placed, reports) {
        let Some(r) = r else {
            all_observed = false;
            continue;
        };
        add_counts(&mut counts, fields, &r.status);
        if r.federation_generation != placed.generation || !r.observed {
            all_observed = false;
        }
        if !r.status["updateRevision"].is_null() {
            update_revision.get_or_insert(&r.status["updateRevision"]);
            if r.status["currentRevision"] != r.status["updateRevision"] {
                lagging.get_or_insert(&r.status["currentRevision"]);
            }
        }
    }
    let observed = if all_observed {
        placed.generation
    } else {
        previous["observedGeneration"].as_i64().unwrap_or(0)
    };
    let mut status = json!({"observedGeneration": observed});
    set_counts(&mut status, fields, &counts);
    if let Some(u) = update_revision {
        status["updateRevision"] = u.clone();
        status["currentRevision"] = lagging.unwrap_or(u).clone();
    }
    let conditions = vec![placed_condition(placed, now)];
    status["conditions"] = Value::Array(keep_transitions(conditions, previous));
    status
}

/// A Job's status: pods counted over its shards, started when the first started, Complete
/// once every shard's copy completed, Failed as soon as one failed (saying which).
fn job(
    placed: &Placed,
    reports: &[(String, Option<Reported>)],
    previous: &Value,
    now: &str,
) -> Value {
    let mut counts = [0i64; 4];
    const FIELDS: [&str; 4] = ["active", "ready", "succeeded", "failed"];
    let mut start: Option<&str> = None;
    let mut completion: Option<&str> = None;
    let mut complete = placed.unplaced == 0 && !placed.shares.is_empty();
    let mut failed: Option<Value> = None;
    let mut complete_condition: Option<&Value> = None;
    for (shard, r) in placed_reports(placed, reports) {
        let Some(r) = r else {
            complete = false;
            continue;
        };
        add_counts(&mut counts, &FIELDS, &r.status);
        if let Some(t) = r.status["startTime"].as_str() {
            start = Some(start.map_or(t, |s| s.min(t)));
        }
        if let Some(t) = r.status["completionTime"].as_str() {
            completion = Some(completion.map_or(t, |s| s.max(t)));
        }
        match cond(&r.status, "Complete") {
            Some(c) if c["status"] == "True" => {
                complete_condition = Some(c);
            }
            _ => complete = false,
        }
        if failed.is_none()
            && let Some(c) = cond(&r.status, "Failed").filter(|c| c["status"] == "True")
        {
            let mut c = c.clone();
            c["message"] = json!(format!(
                "shard {shard}: {}",
                c["message"].as_str().unwrap_or("the Job failed")
            ));
            failed = Some(c);
        }
    }
    let mut status = json!({});
    set_counts(&mut status, &FIELDS, &counts);
    if let Some(t) = start {
        status["startTime"] = json!(t);
    }
    let mut conditions = Vec::new();
    if let Some(c) = failed {
        conditions.push(c);
    } else if complete && let Some(c) = complete_condition {
        conditions.push(c.clone());
        if let Some(t) = completion {
            status["completionTime"] = json!(t);
        }
    }
    conditions.push(placed_condition(placed, now));
    status["conditions"] = Value::Array(keep_transitions(conditions, previous));
    status
}

/// A CronJob's status: the Jobs its copies run now, and the latest schedule and success of
/// any shard. (A CronJob's status has no conditions: why one waits is in its placement
/// annotation and its Events.)
fn cron_job(reports: &[(String, Option<Reported>)]) -> Value {
    let mut active = Vec::new();
    let mut last_schedule: Option<&str> = None;
    let mut last_success: Option<&str> = None;
    for r in reports.iter().filter_map(|(_, r)| r.as_ref()) {
        active.extend(r.status["active"].as_array().into_iter().flatten().cloned());
        if let Some(t) = r.status["lastScheduleTime"].as_str() {
            last_schedule = Some(last_schedule.map_or(t, |s| s.max(t)));
        }
        if let Some(t) = r.status["lastSuccessfulTime"].as_str() {
            last_success = Some(last_success.map_or(t, |s| s.max(t)));
        }
    }
    let mut status = json!({"active": active});
    if let Some(t) = last_schedule {
        status["lastScheduleTime"] = json!(t);
    }
    if let Some(t) = last_success {
        status["lastSuccessfulTime"] = json!(t);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(
        gen_: i64,
        observed: bool,
        replicas: i64,
        available: i64,
        complete: bool,
    ) -> Reported {
        Reported {
            present: true,
            gang: None,
            federation_generation: gen_,
            observed,
            replicas,
            status: json!({
                "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": available,
                "availableReplicas": available,
                "conditions": [
                    {"type": "Available", "status": if available == replicas {"True"} else {"False"}},
                    {"type": "Progressing", "status": "True",
                     "reason": if complete {"NewReplicaSetAvailable"} else {"ReplicaSetUpdated"}},
                ],
            }),
        }
    }

    fn placed() -> Placed {
        Placed {
            generation: 3,
            shares: vec![("a".into(), 1), ("b".into(), 2)],
            unplaced: 0,
            why: String::new(),
            policy_refused: false,
            quota_exceeded: false,
        }
    }

    #[test]
    fn counts_add_up_and_the_generation_waits_for_every_shard() {
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 1, true))),
            ("b".to_owned(), Some(report(2, true, 2, 2, true))),
        ];
        let prev = json!({"observedGeneration": 2});
        let s = deployment(&placed(), &reports, &prev, "t");
        assert_eq!(s["replicas"], 3);
        assert_eq!(s["availableReplicas"], 3);
        assert_eq!(
            s["observedGeneration"], 2,
            "b has not applied generation 3 yet"
        );
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 1, true))),
            ("b".to_owned(), Some(report(3, true, 2, 2, true))),
        ];
        let s = deployment(&placed(), &reports, &prev, "t");
        assert_eq!(s["observedGeneration"], 3);
        let progressing = cond(&s, "Progressing").expect("progressing");
        assert_eq!(progressing["reason"], "NewReplicaSetAvailable");
        assert_eq!(cond(&s, "Available").expect("available")["status"], "True");
    }

    #[test]
    fn a_shard_that_has_not_reported_holds_availability_and_completion() {
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 1, true))),
            ("b".to_owned(), None),
        ];
        let s = deployment(&placed(), &reports, &json!({}), "t");
        assert_eq!(s["observedGeneration"], 0);
        assert_eq!(cond(&s, "Available").expect("c")["status"], "False");
        assert_eq!(
            cond(&s, "Progressing").expect("c")["reason"],
            "ReplicaSetUpdated"
        );
    }

    #[test]
    fn a_copy_without_a_status_yet_is_not_available() {
        // Just applied: the shard reports it before its controller wrote any status.
        let fresh = Reported {
            present: true,
            gang: None,
            federation_generation: 3,
            observed: false,
            replicas: 2,
            status: json!({}),
        };
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 1, true))),
            ("b".to_owned(), Some(fresh)),
        ];
        let s = deployment(&placed(), &reports, &json!({}), "t");
        assert_eq!(cond(&s, "Available").expect("c")["status"], "False");
        // Nor does a later shard without a report make an earlier unavailable one available.
        let mut p = placed();
        p.shares.push(("c".into(), 0));
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 0, false))),
            ("b".to_owned(), Some(report(3, true, 2, 2, true))),
            ("c".to_owned(), None),
        ];
        let s = deployment(&p, &reports, &json!({}), "t");
        assert_eq!(cond(&s, "Available").expect("c")["status"], "False");
    }

    #[test]
    fn unplaced_replicas_say_why_and_transition_times_are_kept() {
        let mut p = placed();
        p.unplaced = 4;
        p.why = "0/3 shards fit 4 more replica(s): 3 lack room".into();
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 1, true))),
            ("b".to_owned(), Some(report(3, true, 2, 2, true))),
        ];
        let s1 = deployment(&p, &reports, &json!({}), "t1");
        let placed_c = cond(&s1, "Placed").expect("placed");
        assert_eq!(placed_c["status"], "False");
        assert!(
            placed_c["message"]
                .as_str()
                .expect("m")
                .contains("0/3 shards fit")
        );
        let s2 = deployment(&p, &reports, &s1, "t2");
        assert_eq!(cond(&s2, "Placed").expect("p")["lastTransitionTime"], "t1");
    }

    fn raw(status: Value) -> Reported {
        Reported {
            present: true,
            gang: None,
            federation_generation: 3,
            observed: true,
            replicas: 1,
            status,
        }
    }

    #[test]
    fn a_job_completes_once_every_shard_completed_and_fails_when_one_failed() {
        let complete =
            json!({"type": "Complete", "status": "True", "reason": "CompletionsReached"});
        let p = placed();
        let reports = vec![
            (
                "a".to_owned(),
                Some(raw(
                    json!({"succeeded": 1, "startTime": "2026-01-01T00:00:02Z",
                    "completionTime": "2026-01-01T00:00:09Z", "conditions": [complete]}),
                )),
            ),
            (
                "b".to_owned(),
                Some(raw(
                    json!({"active": 2, "startTime": "2026-01-01T00:00:01Z"}),
                )),
            ),
        ];
        let s = aggregate(WorkloadKind::Job, &p, &reports, &json!({}), "t");
        assert_eq!(
            (s["active"].clone(), s["succeeded"].clone()),
            (json!(2), json!(1))
        );
        assert_eq!(s["startTime"], "2026-01-01T00:00:01Z", "the earliest start");
        assert!(cond(&s, "Complete").is_none(), "b still runs");
        assert!(s["completionTime"].is_null());
        let reports = vec![
            reports[0].clone(),
            (
                "b".to_owned(),
                Some(raw(
                    json!({"succeeded": 2, "completionTime": "2026-01-01T00:00:20Z",
                    "conditions": [complete]}),
                )),
            ),
        ];
        let s = aggregate(WorkloadKind::Job, &p, &reports, &json!({}), "t");
        assert_eq!(cond(&s, "Complete").expect("complete")["status"], "True");
        assert_eq!(
            s["completionTime"], "2026-01-01T00:00:20Z",
            "the latest completion"
        );
        let failed = json!({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit"});
        let reports = vec![
            reports[0].clone(),
            (
                "b".to_owned(),
                Some(raw(json!({"failed": 7, "conditions": [failed]}))),
            ),
        ];
        let s = aggregate(WorkloadKind::Job, &p, &reports, &json!({}), "t");
        let f = cond(&s, "Failed").expect("failed");
        assert_eq!(f["reason"], "BackoffLimitExceeded");
        assert!(f["message"].as_str().expect("m").starts_with("shard b: "));
        assert!(cond(&s, "Complete").is_none());
    }

    #[test]
    fn a_statefulsets_revisions_agree_only_when_every_shard_rolled_out() {
        let sts = |current: &str, update: &str| {
            Some(raw(
                json!({"replicas": 2, "readyReplicas": 2, "currentRevision": current,
                "updateRevision": update, "observedGeneration": 1}),
            ))
        };
        let p = placed();
        let reports = vec![
            ("a".to_owned(), sts("web-2", "web-2")),
            ("b".to_owned(), sts("web-1", "web-2")),
        ];
        let s = aggregate(WorkloadKind::StatefulSet, &p, &reports, &json!({}), "t");
        assert_eq!(s["readyReplicas"], 4);
        assert_eq!(s["observedGeneration"], 3);
        assert_eq!(s["updateRevision"], "web-2");
        assert_eq!(s["currentRevision"], "web-1", "b is still rolling");
        let reports = vec![
            ("a".to_owned(), sts("web-2", "web-2")),
            ("b".to_owned(), sts("web-2", "web-2")),
        ];
        let s = aggregate(WorkloadKind::StatefulSet, &p, &reports, &json!({}), "t");
        assert_eq!(s["currentRevision"], "web-2");
        assert_eq!(cond(&s, "Placed").expect("placed")["status"], "True");
    }

    #[test]
    fn a_policy_the_kind_cannot_follow_is_not_placed_and_says_why() {
        let mut p = placed();
        p.why = "Placement \"split\" divides replicas".into();
        p.policy_refused = true;
        let s = aggregate(WorkloadKind::Job, &p, &[], &json!({}), "t");
        let c = cond(&s, "Placed").expect("placed");
        assert_eq!(
            (c["status"].clone(), c["reason"].clone()),
            (json!("False"), json!("PolicyNotApplicable"))
        );
    }

    #[test]
    fn replicas_held_by_the_quota_say_so() {
        let mut p = placed();
        p.unplaced = 2;
        p.why = "tenant \"t\" quota: 2 more replica(s)".into();
        p.quota_exceeded = true;
        let s = aggregate(WorkloadKind::Deployment, &p, &[], &json!({}), "t");
        let c = cond(&s, "Placed").expect("placed");
        assert_eq!(c["reason"], "QuotaExceeded");
        assert_eq!(c["message"], p.why.as_str());
        p.quota_exceeded = false;
        let s = aggregate(WorkloadKind::Deployment, &p, &[], &json!({}), "t");
        assert_eq!(cond(&s, "Placed").expect("placed")["reason"], "NoShardFits");
    }

    #[test]
    fn a_cronjobs_active_jobs_come_from_every_shard() {
        let reports = vec![
            (
                "a".to_owned(),
                Some(raw(json!({"active": [{"name": "c-1"}],
                "lastScheduleTime": "2026-01-01T00:01:00Z"}))),
            ),
            (
                "b".to_owned(),
                Some(raw(json!({"active": [{"name": "c-2"}],
                "lastScheduleTime": "2026-01-01T00:02:00Z"}))),
            ),
        ];
        let s = aggregate(WorkloadKind::CronJob, &placed(), &reports, &json!({}), "t");
        assert_eq!(s["active"].as_array().map(Vec::len), Some(2));
        assert_eq!(s["lastScheduleTime"], "2026-01-01T00:02:00Z");
        let s = aggregate(WorkloadKind::CronJob, &placed(), &[], &json!({}), "t");
        assert_eq!(
            s["active"],
            json!([]),
            "no Job runs: the list is emptied, not kept"
        );
    }
}
