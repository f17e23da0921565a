//! The CronJob controller: creates a Job at each time the schedule names (in `timeZone`),
//! within `startingDeadlineSeconds`, following `concurrencyPolicy` (Allow, Forbid, Replace),
//! and keeps only the newest finished Jobs (`successfulJobsHistoryLimit`,
//! `failedJobsHistoryLimit`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use serde_json::json;
use tessera_client::request::{PatchType, Propagation};
use tessera_core::time::rfc3339;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, controller_of};

use crate::context::{Context, res};
use crate::cron::Schedule;
use crate::pods;

/// The controller's name.
pub const NAME: &str = "cronjob-controller";
/// Annotation on created Jobs: the scheduled time they run for.
pub const SCHEDULED: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

struct CronJobs {
    ctx: Context,
    cronjobs: Arc<Cache<CronJob>>,
    jobs: Arc<Cache<Job>>,
    recorder: Recorder,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let cronjobs = ctx.informer::<CronJob>(res("batch", "cronjobs"));
    let jobs = ctx.informer::<Job>(res("batch", "jobs"));
    let r = Arc::new(CronJobs {
        recorder: ctx.recorder(NAME),
        cronjobs: cronjobs.cache().clone(),
        jobs: jobs.cache().clone(),
        ctx: ctx.clone(),
    });
    ctx.controller(NAME)
        .watches(&cronjobs)
        .owns(&jobs, "CronJob")
        .run(r)
        .await;
}

fn job_finished(j: &Job) -> Option<(&'static str, i64)> {
    let c = j
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    let at = c
        .last_transition_time
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    Some((
        if c.type_ == "Complete" {
            "Complete"
        } else {
            "Failed"
        },
        at,
    ))
}

#[async_trait]
impl Reconciler for CronJobs {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(cj) = self.cronjobs.get(key) else {
            return Ok(Action::Done);
        };
        if cj.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = cj.metadata.namespace.clone().unwrap_or_default();
        let name = cj.metadata.name.clone().unwrap_or_default();
        let uid = cj.metadata.uid.clone().unwrap_or_default();
        let spec = cj.spec.clone().unwrap_or_default();
        let r = ObjectRef::new("batch/v1", "CronJob", &cj.metadata);
        let owned: Vec<Arc<Job>> = self
            .jobs
            .owned_by(&uid)
            .into_iter()
            .filter(|j| controller_of(&j.metadata).is_some_and(|o| o.uid == uid))
            .collect();
        self.prune(&owned, &spec).await?;
        let tz = match spec.time_zone.as_deref() {
            None => TimeZone::UTC,
            Some(z) => match TimeZone::get(z) {
                Ok(tz) => tz,
                Err(_) => {
                    self.recorder.event(
                        &r,
                        EventType::Warning,
                        "UnknownTimeZone",
                        &format!("unknown time zone {z:?}"),
                    );
                    return Ok(Action::Done);
                }
            },
        };
        let schedule = match Schedule::parse(&spec.schedule) {
            Ok(s) => s,
            Err(e) => {
                self.recorder.event(
                    &r,
                    EventType::Warning,
                    "InvalidSchedule",
                    &format!("invalid schedule {:?}: {e}", spec.schedule),
                );
                return Ok(Action::Done);
            }
        };
        let now = self.ctx.clock.now();
        let status = cj.status.clone().unwrap_or_default();
        let since = status
            .last_schedule_time
            .as_ref()
            .or(cj.metadata.creation_timestamp.as_ref())
            .map_or(now, |t| t.0);
        // The most recent time due (missed ones before it are skipped, as Kubernetes does).
        let mut due = None;
        let mut t = since;
        let mut missed = 0;
        while let Some(next) = schedule.next_after(t, &tz) {
            if next > now {
                break;
            }
            due = Some(next);
            t = next;
            missed += 1;
            if missed > 100 {
                // Far behind (a long outage): start from the latest time only.
                t = now
                    .checked_sub(jiff::SignedDuration::from_secs(61))
                    .unwrap_or(now);
                missed = 0;
            }
        }
        let active: Vec<&Arc<Job>> = owned.iter().filter(|j| job_finished(j).is_none()).collect();
        if let Some(at) = due
            && !spec.suspend.unwrap_or(false)
        {
            let late = (now - at).get_seconds();
            let too_late = spec.starting_deadline_seconds.is_some_and(|d| late > d);
            let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
            if too_late {
                self.recorder.event(
                    &r,
                    EventType::Warning,
                    "MissSchedule",
                    &format!(
                        "Missed scheduled time to start a job: {}",
                        rfc3339(at.as_second())
                    ),
                );
                self.set_last_schedule(&ns, &name, at).await?;
            } else if policy == "Forbid" && !active.is_empty() {
                self.recorder.event(&r, EventType::Normal, "JobAlreadyActive",
                    "Not starting job because prior execution is running and concurrency policy is Forbid");
            } else {
                if policy == "Replace" {
                    for j in &active {
                        let _ = self
                            .ctx
                            .client
                            .delete(
                                res("batch", "jobs"),
                                Some(&ns),
                                j.metadata.name.as_deref().unwrap_or(""),
                                Some(Propagation::Background),
                            )
                            .await;
                    }
                }
                self.create_job(&cj, at).await?;
                self.set_last_schedule(&ns, &name, at).await?;
            }
        }
        let next = schedule.next_after(now, &tz);
        Ok(match next {
            Some(n) => Action::RequeueAfter(Duration::from_millis(
                ((n - now).get_milliseconds().max(0) as u64) + 100,
            )),
            None => Action::Done,
        })
    }
}

impl CronJobs {
    async fn create_job(&self, cj: &CronJob, at: Timestamp) -> Result<(), ReconcileError> {
        let ns = cj.metadata.namespace.clone().unwrap_or_default();
        let name = cj.metadata.name.clone().unwrap_or_default();
        let uid = cj.metadata.uid.clone().unwrap_or_default();
        let template = cj
            .spec
            .as_ref()
            .map(|s| s.job_template.clone())
            .unwrap_or_default();
        let meta = template.metadata.clone().unwrap_or_default();
        let job_name = format!("{name}-{}", at.as_second() / 60);
        let mut annotations = meta.annotations.unwrap_or_default();
        annotations.insert(SCHEDULED.into(), rfc3339(at.as_second()));
        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name, "namespace": ns, "labels": meta.labels,
                "annotations": annotations,
                "ownerReferences": [pods::owner_ref("batch/v1", "CronJob", &name, &uid)]},
            "spec": template.spec});
        let r = ObjectRef::new("batch/v1", "CronJob", &cj.metadata);
        match self
            .ctx
            .client
            .create(res("batch", "jobs"), Some(&ns), &job)
            .await
        {
            Ok(_) => {
                self.recorder.event(
                    &r,
                    EventType::Normal,
                    "SuccessfulCreate",
                    &format!("Created job {job_name}"),
                );
                Ok(())
            }
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => {
                self.recorder.event(
                    &r,
                    EventType::Warning,
                    "FailedCreate",
                    &format!("Error creating job: {}", e.message),
                );
                Err(e.into())
            }
        }
    }

    async fn set_last_schedule(
        &self,
        ns: &str,
        name: &str,
        at: Timestamp,
    ) -> Result<(), ReconcileError> {
        let patch = json!({"status": {"lastScheduleTime": rfc3339(at.as_second())}});
        match self
            .ctx
            .client
            .patch(
                res("batch", "cronjobs"),
                Some(ns),
                name,
                Some("status"),
                PatchType::Merge,
                &patch,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes finished Jobs beyond the history limits (oldest first); records the last
    /// successful time and the active Jobs.
    async fn prune(
        &self,
        owned: &[Arc<Job>],
        spec: &k8s_openapi::api::batch::v1::CronJobSpec,
    ) -> Result<(), ReconcileError> {
        for (kind, limit) in [
            ("Complete", spec.successful_jobs_history_limit.unwrap_or(3)),
            ("Failed", spec.failed_jobs_history_limit.unwrap_or(1)),
        ] {
            let mut done: Vec<(i64, &Arc<Job>)> = owned
                .iter()
                .filter_map(|j| {
                    job_finished(j)
                        .filter(|(k, _)| *k == kind)
                        .map(|(_, at)| (at, j))
                })
                .filter(|(_, j)| j.metadata.deletion_timestamp.is_none())
                .collect();
            done.sort_by_key(|(at, j)| (*at, j.metadata.name.clone()));
            let extra = done.len().saturating_sub(limit.max(0) as usize);
            for (_, j) in done.into_iter().take(extra) {
                match self
                    .ctx
                    .client
                    .delete(
                        res("batch", "jobs"),
                        j.metadata.namespace.as_deref(),
                        j.metadata.name.as_deref().unwrap_or(""),
                        Some(Propagation::Background),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
}
