//! The federation fence inside the shard: what stops the shard's `AtMostOnce` federated
//! workloads when the shard has lost the federation even if its federation agent cannot —
//! stopped (SIGSTOP), killed, or hung — while this control plane runs on.
//!
//! The agent renews the Lease `kube-system/tessera-federation` each time the federation
//! acknowledges a renewal, with the time it sent that renewal: the Lease ends when the
//! agent's own lease with the federation ends, which is never later than the federation's.
//! When it has ended, this controller scales each federated copy marked
//! `tessera.io/failover: AtMostOnce` to zero (Deployments, ReplicaSets, StatefulSets) or
//! suspends it (Jobs, CronJobs). It never resumes anything: the agent does, by applying the
//! federation's copy again when the federation assigns it again. A shard that never joined a
//! federation has no such Lease, and nothing is done.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_client::request::{ApiRequest, PatchType, Verb, find_resource};
use tessera_client::types::{FAILOVER_ANNOTATION, FEDERATED_LABEL, FEDERATION_LEASE};
use tessera_client::workloads::WorkloadKind;
use tessera_runtime::events::{EventType, ObjectRef, Recorder};

use crate::context::Context;

/// The controller's name.
pub const NAME: &str = "federation-fence";

/// The field manager of the fence's writes.
const MANAGER: &str = "tessera-federation-fence";

/// How often the Lease is looked at.
const PERIOD: Duration = Duration::from_millis(500);

pub use tessera_client::types::federation_lease_end as lease_end;

/// What stops `kind`, as a merge patch (`None`: `spec` already stopped).
fn stop_patch(kind: WorkloadKind, spec: &Value) -> Option<Value> {
    match kind {
        WorkloadKind::Job | WorkloadKind::CronJob => {
            (spec["suspend"] != true).then(|| json!({"spec": {"suspend": true}}))
        }
        _ => (spec["replicas"].as_i64() != Some(0)).then(|| json!({"spec": {"replicas": 0}})),
    }
}

/// Runs until dropped.
pub async fn run(ctx: Context) {
    let recorder = Recorder::new(ctx.client.clone(), NAME, ctx.runtime_metrics.clone());
    let Ok(leases) = find_resource("coordination.k8s.io", "v1", "leases") else {
        return;
    };
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Ok(lease) = ctx
            .client
            .get(leases, Some("kube-system"), FEDERATION_LEASE)
            .await
        else {
            continue;
        };
        let Some(end) = lease_end(&lease) else {
            continue;
        };
        let now = ctx.clock.now().as_microsecond() as f64 / 1e6;
        if now < end {
            continue;
        }
        stop_all(&ctx, &recorder, now - end).await;
    }
}

/// Stops every federated `AtMostOnce` copy not stopped yet.
async fn stop_all(ctx: &Context, recorder: &Recorder, late: f64) {
    for kind in WorkloadKind::ALL {
        let mut req = ApiRequest::new(Verb::List, kind.resource());
        req.params.label_selector = Some(
            format!("{FEDERATED_LABEL}=true")
                .parse()
                .expect("a valid selector"),
        );
        let Ok(list) = ctx.client.list(req).await else {
            continue;
        };
        for w in list["items"].as_array().into_iter().flatten() {
            if w["metadata"]["annotations"][FAILOVER_ANNOTATION] != "AtMostOnce" {
                continue;
            }
            let Some(patch) = stop_patch(kind, &w["spec"]) else {
                continue;
            };
            let ns = w["metadata"]["namespace"].as_str();
            let name = w["metadata"]["name"].as_str().unwrap_or_default();
            let mut req = ApiRequest::new(Verb::Patch(PatchType::Merge), kind.resource());
            req.namespace = ns.map(str::to_owned);
            req.name = Some(name.to_owned());
            req.params.field_manager = Some(MANAGER.to_owned());
            req.object = Some(tessera_client::request::Decoded::value(patch));
            match ctx.client.call(req).await {
                Ok(_) => {
                    tracing::warn!(
                        kind = kind.kind(),
                        namespace = ns,
                        name,
                        late_s = late,
                        "stopped an at-most-once federated workload: the shard's federation lease ended"
                    );
                    let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.to_owned()),
                        namespace: ns.map(str::to_owned),
                        uid: w["metadata"]["uid"].as_str().map(str::to_owned),
                        ..Default::default()
                    };
                    recorder.event(
                        &ObjectRef::new(kind.api_version(), kind.kind(), &meta),
                        EventType::Warning,
                        "FederationLeaseLost",
                        &format!(
                            "the shard's federation lease ended {late:.1}s ago and its agent did not stop this {kind}: stopped here, as it fails over AtMostOnce"
                        ),
                    );
                }
                Err(e) if e.code == 404 => {}
                Err(e) => {
                    tracing::error!(kind = kind.kind(), name, error = %e.message, "could not stop an at-most-once federated workload")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ends_at_its_renewal_plus_its_duration_and_only_if_held() {
        let held = json!({"spec": {"holderIdentity": "east", "leaseDurationSeconds": 15,
            "renewTime": "2026-12-04T10:00:00.500000Z"}});
        let at: jiff::Timestamp = "2026-12-04T10:00:00Z".parse().expect("time");
        assert_eq!(
            lease_end(&held),
            Some(at.as_second() as f64 + 15.5),
            "renewal plus duration"
        );
        for broken in [
            json!({"spec": {"leaseDurationSeconds": 15, "renewTime": "2026-12-04T10:00:00Z"}}),
            json!({"spec": {"holderIdentity": "", "leaseDurationSeconds": 15,
                "renewTime": "2026-12-04T10:00:00Z"}}),
            json!({"spec": {"holderIdentity": "east", "renewTime": "2026-12-04T10:00:00Z"}}),
            json!({"spec": {"holderIdentity": "east", "leaseDurationSeconds": 15,
                "renewTime": "yesterday"}}),
        ] {
            assert_eq!(lease_end(&broken), None, "{broken}");
        }
    }

    #[test]
    fn each_kind_is_stopped_its_own_way_and_only_once() {
        assert_eq!(
            stop_patch(WorkloadKind::Job, &json!({"completions": 1})),
            Some(json!({"spec": {"suspend": true}}))
        );
        assert_eq!(
            stop_patch(WorkloadKind::CronJob, &json!({"suspend": true})),
            None
        );
        assert_eq!(
            stop_patch(WorkloadKind::StatefulSet, &json!({"replicas": 3})),
            Some(json!({"spec": {"replicas": 0}}))
        );
        assert_eq!(
            stop_patch(WorkloadKind::Deployment, &json!({"replicas": 0})),
            None
        );
        // A Deployment without replicas runs one.
        assert!(stop_patch(WorkloadKind::Deployment, &json!({})).is_some());
    }
}
