//! A federated workload's status from its shards' copies: counts summed, the generation
//! observed only once every shard has observed the spec made from it, conditions merged —
//! so `kubectl rollout status` and `kubectl get deploy` at the federation tell the truth.

use serde_json::{Value, json};
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

/// The status of a federated Deployment of `placed`, from `reports` (shard → its copy's
/// report, none while it has reported nothing), keeping what `previous` had where nothing
/// changed (transition times, the observed generation until every shard catches up).
pub fn aggregate(
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
            available = *share == 0;
            complete = false;
            continue;
        };
        for (i, f) in COUNTS.iter().enumerate() {
            counts[i] += r.status[*f].as_i64().unwrap_or(0);
        }
        if r.federation_generation != placed.generation || !r.observed {
            all_observed = false;
        }
        if cond(&r.status, "Available").is_some_and(|c| c["status"] != "True") {
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
    conditions.push(if placed.unplaced == 0 {
        condition(
            "Placed",
            true,
            "Placed",
            &format!("all replicas placed: {}", shards.join(", ")),
            now,
        )
    } else {
        condition("Placed", false, "NoShardFits", &placed.why, now)
    });
    // A condition whose status and reason did not change keeps its transition time.
    for c in &mut conditions {
        if let Some(old) = cond(previous, c["type"].as_str().unwrap_or_default())
            && old["status"] == c["status"]
            && old["reason"] == c["reason"]
        {
            c["lastTransitionTime"] = old["lastTransitionTime"].clone();
            if old["message"] == c["message"] {
                c["lastUpdateTime"] = old["lastUpdateTime"].clone();
            }
        }
    }
    status["conditions"] = Value::Array(conditions);
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
        }
    }

    #[test]
    fn counts_add_up_and_the_generation_waits_for_every_shard() {
        let reports = vec![
            ("a".to_owned(), Some(report(3, true, 1, 1, true))),
            ("b".to_owned(), Some(report(2, true, 2, 2, true))),
        ];
        let prev = json!({"observedGeneration": 2});
        let s = aggregate(&placed(), &reports, &prev, "t");
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
        let s = aggregate(&placed(), &reports, &prev, "t");
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
        let s = aggregate(&placed(), &reports, &json!({}), "t");
        assert_eq!(s["observedGeneration"], 0);
        assert_eq!(cond(&s, "Available").expect("c")["status"], "False");
        assert_eq!(
            cond(&s, "Progressing").expect("c")["reason"],
            "ReplicaSetUpdated"
        );
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
        let s1 = aggregate(&p, &reports, &json!({}), "t1");
        let placed_c = cond(&s1, "Placed").expect("placed");
        assert_eq!(placed_c["status"], "False");
        assert!(
            placed_c["message"]
                .as_str()
                .expect("m")
                .contains("0/3 shards fit")
        );
        let s2 = aggregate(&p, &reports, &s1, "t2");
        assert_eq!(cond(&s2, "Placed").expect("p")["lastTransitionTime"], "t1");
    }
}
