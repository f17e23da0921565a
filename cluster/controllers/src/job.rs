//! The Job controller: runs pods until `completions` succeed, `parallelism` at a time;
//! fails the Job after `backoffLimit` failed pods or past `activeDeadlineSeconds` (removing
//! what still runs); records start and completion times, counts and conditions; deletes a
//! finished Job `ttlSecondsAfterFinished` later.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tessera_client::request::{PatchType, Propagation};
use tessera_core::time::{now_secs, rfc3339};
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::expectations::Expectations;
use tessera_runtime::informer::{Cache, Change, controller_of, key_of, owner_key};
use tessera_runtime::{EventClass, WorkQueue};

use crate::context::{Context, res};
use crate::pods::{self, BURST};

/// The controller's name.
pub const NAME: &str = "job-controller";

struct Jobs {
    ctx: Context,
    jobs: Arc<Cache<Job>>,
    pods: Arc<Cache<Pod>>,
    expectations: Arc<Expectations>,
    recorder: Recorder,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let jobs = ctx.informer::<Job>(res("batch", "jobs"));
    let pod_inf = ctx.informer::<Pod>(res("", "pods"));
    let expectations = Arc::new(Expectations::new());
    let r = Arc::new(Jobs {
        recorder: ctx.recorder(NAME),
        jobs: jobs.cache().clone(),
        pods: pod_inf.cache().clone(),
        expectations: expectations.clone(),
        ctx: ctx.clone(),
    });
    let exp = expectations.clone();
    ctx.controller(NAME)
        .watches_with(&jobs, move |c, q| {
            let key = key_of(&c.object().metadata);
            if let Change::Deleted(_) = c {
                expectations.forget(&key);
            }
            q.add(key, c.class());
        })
        .watches_with(&pod_inf, move |c, q| on_pod(c, q, &exp))
        .run(r)
        .await;
}

fn on_pod(c: &Change<Pod>, q: &WorkQueue<String>, exp: &Expectations) {
    let p = c.object();
    let Some(key) = owner_key(&p.metadata, "Job") else {
        return;
    };
    // Only creations are expected: the pods a Job deletes (too many active, a failed Job)
    // are deleted again if still seen, which is harmless.
    if let Change::Added(_) = c {
        exp.observed_add(&key);
    }
    q.add(key, EventClass::Update);
}

fn condition(kind: &str, reason: &str, message: &str) -> serde_json::Value {
    let now = rfc3339(now_secs());
    json!({"type": kind, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now})
}

/// The Job's status says it is suspended (a `Suspended` condition that is True).
fn suspended_now(status: &k8s_openapi::api::batch::v1::JobStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Suspended" && c.status == "True")
}

fn finished(job: &Job) -> Option<&str> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| c.type_.as_str())
}

#[async_trait]
impl Reconciler for Jobs {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(job) = self.jobs.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::Done);
        };
        if job.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let name = job.metadata.name.clone().unwrap_or_default();
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let spec = job.spec.clone().unwrap_or_default();
        let now = now_secs();
        if finished(&job).is_some() {
            return self.ttl(&job, now).await;
        }
        let all: Vec<Arc<Pod>> = self
            .pods
            .owned_by(&uid)
            .into_iter()
            .filter(|p| controller_of(&p.metadata).is_some_and(|o| o.uid == uid))
            .collect();
        let active: Vec<&Arc<Pod>> = all.iter().filter(|p| pods::is_active(p)).collect();
        let succeeded = all.iter().filter(|p| pods::phase(p) == "Succeeded").count() as i32;
        let failed = all.iter().filter(|p| pods::phase(p) == "Failed").count() as i32;
        let ready = active.iter().filter(|p| pods::is_ready(p)).count() as i32;
        // Pods being deleted that have not finished: still running their grace period
        // (Kubernetes' `status.terminating`).
        let terminating = all
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some() && !pods::is_terminal(p))
            .count() as i32;
        let status = job.status.clone().unwrap_or_default();
        let start = status.start_time.as_ref().map_or(now, |t| t.0.as_second());
        let r = ObjectRef::new("batch/v1", "Job", &job.metadata);

        // Has it failed?
        let backoff_limit = spec.backoff_limit.unwrap_or(6);
        let deadline = spec.active_deadline_seconds;
        let failure = if failed > backoff_limit {
            Some((
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit".to_owned(),
            ))
        } else if let Some(d) = deadline
            && now - start >= d
        {
            Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline".to_owned(),
            ))
        } else {
            None
        };
        let completions = spec.completions;
        let parallelism = spec.parallelism.unwrap_or(1).max(0);
        let complete = match completions {
            Some(c) => succeeded >= c,
            // Without completions: done once one pod succeeded and none runs.
            None => succeeded > 0 && active.is_empty(),
        };
        let mut conditions: Vec<serde_json::Value> = Vec::new();
        let mut completion_time = None;
        if let Some((reason, message)) = &failure {
            for p in &active {
                pods::delete_pod_if_present(&self.ctx.client, p).await?;
            }
            self.recorder.event(&r, EventType::Warning, reason, message);
            conditions.push(condition("FailureTarget", reason, message));
            conditions.push(condition("Failed", reason, message));
        } else if complete {
            conditions.push(condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
            conditions.push(condition(
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
            completion_time = Some(rfc3339(now));
            self.recorder
                .event(&r, EventType::Normal, "Completed", "Job completed");
        } else if spec.suspend.unwrap_or(false) {
            // Suspended: as Kubernetes' Job controller, its running pods are deleted (each
            // with its grace period) and none are made until it is resumed.
            if !active.is_empty() {
                for p in &active {
                    pods::delete_pod_if_present(&self.ctx.client, p).await?;
                }
                self.recorder
                    .event(&r, EventType::Normal, "Suspended", "Job suspended");
            }
            if !suspended_now(&status) {
                conditions.push(condition("Suspended", "JobSuspended", "Job suspended"));
            }
        } else if self.expectations.satisfied(key) {
            if suspended_now(&status) {
                let mut resumed = condition("Suspended", "JobResumed", "Job resumed");
                resumed["status"] = json!("False");
                conditions.push(resumed);
            }
            let want = match completions {
                Some(c) => parallelism.min(c - succeeded),
                None if succeeded > 0 => 0,
                None => parallelism,
            }
            .max(0) as usize;
            if active.len() < want {
                let n = (want - active.len()).min(BURST);
                let owner = pods::owner_ref("batch/v1", "Job", &name, &uid);
                let template = spec.template.clone();
                let labels = BTreeMap::from([
                    ("batch.kubernetes.io/job-name".to_owned(), name.clone()),
                    ("job-name".to_owned(), name.clone()),
                    ("batch.kubernetes.io/controller-uid".to_owned(), uid.clone()),
                    ("controller-uid".to_owned(), uid.clone()),
                ]);
                let new = pods::typed_pods((0..n).map(|_| {
                    pods::from_template(&template, &owner, &format!("{name}-"), None, &labels)
                }))?;
                let (created, err) =
                    pods::create_slow_start(&self.ctx.client, &ns, new, &self.expectations, key)
                        .await;
                if created > 0 {
                    self.recorder.event(
                        &r,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("Created {created} pod(s)"),
                    );
                }
                if let Some(e) = err {
                    self.recorder.event(
                        &r,
                        EventType::Warning,
                        "FailedCreate",
                        &format!("Error creating: {}", e.message),
                    );
                    return Err(e.into());
                }
            } else if active.len() > want {
                let mut extra = active.clone();
                extra.sort_by_key(|p| pods::deletion_rank(p));
                for p in extra.into_iter().take(active.len() - want) {
                    pods::delete_pod_if_present(&self.ctx.client, p).await?;
                }
            }
        }
        let mut patch = json!({"status": {
            "active": if failure.is_some() || complete { 0 } else { active.len() as i32 },
            "succeeded": succeeded, "failed": failed, "ready": ready, "terminating": terminating,
            "startTime": rfc3339(start),
        }});
        if !conditions.is_empty() {
            patch["status"]["conditions"] = json!(conditions);
        }
        if let Some(t) = completion_time {
            patch["status"]["completionTime"] = json!(t);
        }
        let same = status.active.unwrap_or(0)
            == patch["status"]["active"].as_i64().unwrap_or(0) as i32
            && status.succeeded.unwrap_or(0) == succeeded
            && status.failed.unwrap_or(0) == failed
            && status.ready.unwrap_or(0) == ready
            && status.terminating.unwrap_or(0) == terminating
            && status.start_time.is_some()
            && conditions.is_empty();
        if !same {
            match self
                .ctx
                .client
                .patch(
                    res("batch", "jobs"),
                    Some(&ns),
                    &name,
                    Some("status"),
                    PatchType::Merge,
                    &patch,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(match deadline {
            Some(d) if failure.is_none() && !complete => {
                Action::RequeueAfter(Duration::from_secs((start + d - now).max(0) as u64 + 1))
            }
            _ => Action::Done,
        })
    }
}

impl Jobs {
    /// Deletes a finished Job once its TTL has passed.
    async fn ttl(&self, job: &Job, now: i64) -> Result<Action, ReconcileError> {
        let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
            return Ok(Action::Done);
        };
        let finished_at = job
            .status
            .as_ref()
            .and_then(|s| {
                s.completion_time.as_ref().or_else(|| {
                    s.conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == "Failed")?
                        .last_transition_time
                        .as_ref()
                })
            })
            .map_or(now, |t| t.0.as_second());
        let due = finished_at + i64::from(ttl);
        if now < due {
            return Ok(Action::RequeueAfter(Duration::from_secs(
                (due - now) as u64 + 1,
            )));
        }
        match self
            .ctx
            .client
            .delete(
                res("batch", "jobs"),
                job.metadata.namespace.as_deref(),
                job.metadata.name.as_deref().unwrap_or(""),
                Some(Propagation::Background),
            )
            .await
        {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.code == 404 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_finished_by_a_true_complete_or_failed_condition() {
        let job = |conditions: serde_json::Value| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j"},
                "status": {"conditions": conditions}}))
            .expect("job")
        };
        let cond = |t: &str, s: &str| json!({"type": t, "status": s});
        let cases = [
            (json!([]), None),
            (json!([cond("Complete", "True")]), Some("Complete")),
            (json!([cond("Failed", "True")]), Some("Failed")),
            (json!([cond("Complete", "False")]), None),
            (json!([cond("Suspended", "True")]), None),
            (
                json!([cond("Suspended", "True"), cond("Failed", "True")]),
                Some("Failed"),
            ),
        ];
        for (conditions, want) in cases {
            assert_eq!(finished(&job(conditions.clone())), want, "{conditions}");
        }
    }
}
