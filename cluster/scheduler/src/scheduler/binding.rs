//! The binding cycle: Permit waits, PreBind and Bind run off the loop, at most
//! `MAX_BINDS_IN_FLIGHT` at once, and report back; a failed binding un-assumes the pod.

use super::*;

/// Bindings in flight at once: two of the API's batched transactions (128 bindings each)
/// keep the store busy, and the scheduler stays well inside its seats at the API.
pub(super) const MAX_BINDS_IN_FLIGHT: usize = 256;

pub(super) struct BindOutcome {
    profile: usize,
    info: Arc<PodInfo>,
    node: String,
    state: Arc<CycleState>,
    status: Status,
    attempts: u32,
    started: Instant,
}

impl Scheduler {
    pub(super) async fn spawn_binding(
        &mut self,
        pi: usize,
        qp: QueuedPod,
        node: String,
        state: CycleState,
        wait: Option<super::cycle::PermitWait>,
    ) {
        // A pod that waits at Permit takes its slot only once it is let go: waiting gang
        // members must not hold the slots the rest of their gang needs to be placed.
        let slot = if wait.is_none() {
            match self.binds.clone().acquire_owned().await {
                Ok(s) => Some(s),
                Err(_) => return,
            }
        } else {
            // A gang member waits for its mates: those backing off or parked are tried now.
            self.queue.activate_gang_of(&qp.info);
            None
        };
        let binds = self.binds.clone();
        let profile = &self.profiles[pi];
        let pre_bind: Vec<_> = profile
            .at(Point::PreBind)
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        let bind: Vec<_> = profile
            .at(Point::Bind)
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        let tx = self.outcome_tx.clone();
        let waiting = self.waiting.clone();
        let state = Arc::new(state);
        tokio::spawn(async move {
            let started = Instant::now();
            let pod = &qp.info;
            let mut status = Status::success();
            if let Some(w) = wait {
                status = match tokio::time::timeout(w.timeout, w.verdict).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(_)) => Status::error("the permit wait was cancelled"),
                    Err(_) => {
                        waiting.remove(pod.uid());
                        Status::unschedulable(format!(
                            "rejected due to timeout after waiting {:?} at permit: {}",
                            w.timeout, w.why
                        ))
                    }
                };
            }
            let _slot = match slot {
                Some(s) => Some(s),
                None if status.is_success() => binds.acquire_owned().await.ok(),
                None => None,
            };
            if status.is_success() {
                for p in &pre_bind {
                    let Some(pb) = p.pre_bind() else { continue };
                    let s = pb.pre_bind(&state, pod, &node).await;
                    if !s.is_success() {
                        status = s.by(p.name());
                        break;
                    }
                }
            }
            if status.is_success() {
                status = Status::error("no bind plugin bound the pod");
                for p in &bind {
                    let Some(b) = p.bind() else { continue };
                    let s = b.bind(&state, pod, &node).await;
                    if s.code != Code::Skip {
                        status = s.by(p.name());
                        break;
                    }
                }
            }
            drop(_slot);
            let _ = tx.send(BindOutcome {
                profile: pi,
                info: qp.info.clone(),
                node,
                state,
                status,
                attempts: qp.attempts,
                started,
            });
        });
    }

    pub(super) fn finish_binding(&mut self, o: BindOutcome) {
        let result = if o.status.is_success() {
            "bound"
        } else {
            "error"
        };
        if let Some(m) = &self.metrics {
            m.binding_duration
                .with_label_values(&[result])
                .observe(o.started.elapsed().as_secs_f64());
        }
        let pod = &o.info;
        if o.status.is_success() {
            if let Some(at) = self.enqueued_at.remove(&pod.key)
                && let Some(m) = &self.metrics
            {
                let attempts = (o.attempts + 1).min(16).to_string();
                let waited = at.elapsed().as_secs_f64();
                m.e2e.with_label_values(&[&attempts]).observe(waited);
                let ns = pod.pod.metadata.namespace.as_deref().unwrap_or("");
                m.tenant_wait
                    .with_label_values(&[self.queue.tenant_name(ns)])
                    .observe(waited);
            }
            self.recorder.event(
                &ObjectRef::new("v1", "Pod", &pod.pod.metadata),
                EventType::Normal,
                "Scheduled",
                &format!("Successfully assigned {} to {}", pod.key, o.node),
            );
            return;
        }
        tracing::debug!(pod = %pod.key, node = %o.node, error = %o.status.message(), "binding failed");
        self.unreserve(o.profile, &o.state, pod, &o.node);
        // What it held on its node is free again (a gang let go frees many): pods that did
        // not fit may now (kube-scheduler moves them the same way).
        self.event(ClusterEvent::AssignedPodDelete);
        // Requeue only a pod that still waits for a node.
        let still_pending = self
            .pods
            .as_ref()
            .and_then(|c| c.get(&pod.key))
            .is_some_and(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_none_or(str::is_empty)
                    && p.metadata.deletion_timestamp.is_none()
            });
        if still_pending {
            let mates =
                self.queue
                    .requeue_after_bind_failure(pod.clone(), o.attempts + 1, Instant::now());
            if o.status.is_rejection() {
                self.report_unschedulable(pod, &o.status.message());
                self.report_gang_backoff(pod, &mates, &o.status.message());
            }
        }
    }

    /// Tells the gang mates of `pod` that the queue backed off with it why: each gets
    /// `PodScheduled=False` and a `FailedScheduling` Event naming the member and its reason
    /// (they were not tried themselves, and `kubectl describe` of any member should say why
    /// it waits).
    pub(super) fn report_gang_backoff(&self, pod: &PodInfo, mates: &[Arc<PodInfo>], message: &str) {
        if mates.is_empty() {
            return;
        }
        let Some(gang) = crate::plugins::gang::gang_of(&pod.pod) else {
            return;
        };
        let said = format!(
            "gang {gang} backs off with its member {}: {message}",
            pod.name()
        );
        for m in mates {
            self.report_unschedulable(m, &said);
        }
    }

    /// Sets `PodScheduled=False` with the reason (if it changed) and writes an Event.
    pub(super) fn report_unschedulable(&self, pod: &PodInfo, message: &str) {
        self.recorder.event(
            &ObjectRef::new("v1", "Pod", &pod.pod.metadata),
            EventType::Warning,
            "FailedScheduling",
            message,
        );
        let conditions = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let same = conditions.iter().any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.message.as_deref() == Some(message)
        });
        if same {
            return;
        }
        let mut list: Vec<serde_json::Value> = conditions
            .iter()
            .filter(|c| c.type_ != "PodScheduled")
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        list.push(
            json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": rfc3339(now_secs())}),
        );
        self.patch_status(
            pod,
            json!({"status": {"conditions": list}}),
            "PodScheduled=False",
        );
    }

    /// Merge-patches `pod`'s status in the background (`what` names it in the log if the
    /// write fails: the scheduler goes on either way).
    pub(super) fn patch_status(&self, pod: &PodInfo, patch: serde_json::Value, what: &'static str) {
        let client = self.client.clone();
        let ns = pod.pod.metadata.namespace.clone();
        let name = pod.name().to_owned();
        tokio::spawn(async move {
            let r = client
                .patch(
                    res("pods"),
                    ns.as_deref(),
                    &name,
                    Some("status"),
                    PatchType::Merge,
                    &patch,
                )
                .await;
            if let Err(e) = r {
                tracing::debug!(pod = %name, error = %e.message, "could not record {what}");
            }
        });
    }
}
