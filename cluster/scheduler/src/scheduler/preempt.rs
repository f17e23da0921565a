//! What the loop does when preemption chose a node: hold the room there for the pod, set
//! its `status.nominatedNodeName`, and evict the victims gracefully (each delete is
//! conditional on the victim's UID, so a pod replaced meanwhile is not touched), each with a
//! `Preempted` event.

use super::*;
use crate::framework::Nomination;
use tessera_client::request::{ApiRequest, Verb};

impl Scheduler {
    pub(super) fn preempt(&mut self, pod: &Arc<PodInfo>, nomination: Nomination) {
        let Nomination { node, victims } = nomination;
        tracing::info!(pod = %pod.key, %node, victims = victims.len(), "preempting");
        let keys = victims.iter().map(|v| v.key.clone()).collect();
        self.cache.nominate(pod.clone(), &node, keys);
        if let Some(m) = &self.metrics {
            m.preemption_attempts.inc();
            m.preemption_victims.observe(victims.len() as f64);
        }
        for v in &victims {
            self.recorder.event(
                &ObjectRef::new("v1", "Pod", &v.pod.metadata),
                EventType::Normal,
                "Preempted",
                &format!("Preempted by {} on node {node}", pod.key),
            );
        }
        self.patch_status(
            pod,
            json!({"status": {"nominatedNodeName": node}}),
            "the nominated node",
        );
        let client = self.client.clone();
        tokio::spawn(async move {
            for v in victims {
                let mut req = ApiRequest::new(Verb::Delete, res("pods"));
                req.namespace = v.pod.metadata.namespace.clone();
                req.name = Some(v.name().to_owned());
                req.body = json!({"kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"uid": v.uid()}})
                .to_string()
                .into();
                if let Err(e) = client.call(req).await
                    && e.code != 404
                    && e.code != 409
                {
                    tracing::warn!(victim = %v.key, error = %e.message, "could not evict a preemption victim");
                }
            }
        });
    }
}
