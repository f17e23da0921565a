//! Jobs and CronJobs in a working shard (pods on hollow nodes finish after the seconds their
//! annotation says, with the exit code it says).

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Events, list, shard, wait_until};
use tessera_controllers::context::res;

fn job(name: &str, completions: i64, parallelism: i64, run: &str, exit: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": 2,
            "template": {"metadata": {"annotations": {
                    "tessera.io/sim-run-seconds": run, "tessera.io/sim-exit-code": exit}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
}

fn condition(j: &Value, kind: &str) -> Option<Value> {
    j["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_completes_with_bounded_parallelism_and_a_failing_one_stops() {
    let s = shard(4).await;
    let c = &s.client;
    c.create(
        res("batch", "jobs"),
        Some("default"),
        &job("work", 20, 5, "1", "0"),
    )
    .await
    .expect("job");
    let mut max_active = 0;
    for i in 0.. {
        let pods = list(c, "", "pods").await;
        let active = pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["job-name"] == "work")
            .filter(|p| p["status"]["phase"] != "Succeeded" && p["status"]["phase"] != "Failed")
            .count();
        max_active = max_active.max(active);
        let j = c
            .get(res("batch", "jobs"), Some("default"), "work")
            .await
            .expect("job");
        if condition(&j, "Complete").is_some() {
            assert_eq!(j["status"]["succeeded"], 20);
            assert!(j["status"]["completionTime"].is_string());
            break;
        }
        assert!(i < 3_000, "the job did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(max_active <= 5, "parallelism 5, saw {max_active} active");
    assert!(max_active >= 2, "pods ran in parallel ({max_active})");
    let succeeded = list(c, "", "pods")
        .await
        .iter()
        .filter(|p| {
            p["metadata"]["labels"]["job-name"] == "work" && p["status"]["phase"] == "Succeeded"
        })
        .count();
    assert_eq!(succeeded, 20, "exactly 20 pods ran: none twice");

    // Every pod fails: after backoffLimit (2) + 1 failures the Job fails.
    c.create(
        res("batch", "jobs"),
        Some("default"),
        &job("broken", 5, 1, "0", "3"),
    )
    .await
    .expect("job");
    wait_until("job failed", || async {
        let j = c
            .get(res("batch", "jobs"), Some("default"), "broken")
            .await
            .expect("job");
        condition(&j, "Failed").is_some_and(|c| c["reason"] == "BackoffLimitExceeded")
            && j["status"]["failed"] == 3
    })
    .await;

    // Past its deadline, a Job stops what runs. Its TTL (1 s) may delete it before a poll
    // would see it failed, so what it went through is read from a watch.
    let jobs = Events::start(c, "batch", "jobs", "default").await;
    let mut slow = job("slow", 1, 1, "600", "0");
    slow["spec"]["activeDeadlineSeconds"] = json!(1);
    slow["spec"]["ttlSecondsAfterFinished"] = json!(1);
    c.create(res("batch", "jobs"), Some("default"), &slow)
        .await
        .expect("job");
    // ...and with a TTL it is deleted once finished.
    wait_until("deleted after its TTL", || async {
        jobs.deleted().contains(&"slow".to_owned())
    })
    .await;
    let slow_states: Vec<Value> = jobs
        .seen()
        .into_iter()
        .filter(|(_, j)| j["metadata"]["name"] == "slow")
        .map(|(_, j)| j)
        .collect();
    let failed_at = slow_states
        .iter()
        .position(|j| condition(j, "Failed").is_some_and(|c| c["reason"] == "DeadlineExceeded"))
        .expect("the Job failed with DeadlineExceeded before it was deleted");
    assert!(
        slow_states[failed_at..]
            .iter()
            .all(|j| j["status"]["active"].as_i64().unwrap_or(0) == 0),
        "nothing runs once the deadline passed: {slow_states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cronjob_fires_on_schedule() {
    let s = shard(2).await;
    let c = &s.client;
    // Not a minute of waiting: the controllers' clock is moved to one second before the
    // next minute (the API's clock, which stamps the CronJob, stays where it is).
    let now = jiff::Timestamp::now();
    let next_minute =
        jiff::Timestamp::from_second(((now.as_second() + 2) / 60 + 1) * 60).expect("time");
    s.clock
        .set(next_minute - jiff::SignedDuration::from_secs(1));
    c.create(
        res("batch", "cronjobs"),
        Some("default"),
        &json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "tick", "namespace": "default"},
            "spec": {"schedule": "* * * * *", "timeZone": "Europe/Paris",
                "jobTemplate": {"spec": {"template": {
                    "metadata": {"annotations": {"tessera.io/sim-run-seconds": "0"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}}}),
    )
    .await
    .expect("cronjob");
    wait_until("the job of the next minute", || async {
        !list(c, "batch", "jobs").await.is_empty()
    })
    .await;
    let jobs = list(c, "batch", "jobs").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["metadata"]["ownerReferences"][0]["kind"], "CronJob");
    // Named after the minute it was scheduled for (as Kubernetes names them).
    assert_eq!(
        jobs[0]["metadata"]["name"],
        format!("tick-{}", next_minute.as_second() / 60)
    );
    wait_until("the job completed", || async {
        list(c, "batch", "jobs")
            .await
            .iter()
            .any(|j| condition(j, "Complete").is_some())
    })
    .await;
    let cj = c
        .get(res("batch", "cronjobs"), Some("default"), "tick")
        .await
        .expect("cj");
    assert!(cj["status"]["lastScheduleTime"].is_string());
}
