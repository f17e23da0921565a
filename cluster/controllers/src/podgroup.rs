//! The PodGroup status controller: counts a gang's members (pods labelled
//! `scheduling.x-k8s.io/pod-group: <name>` in its namespace) that are bound and running, and
//! sets its phase — `Pending` (none placed), `Scheduling` (some placed), `Running` (at least
//! `minMember` running), `Failed` (too many members failed for `minMember` to be reached).
//! Placing the gang all together is the scheduler's (the next scheduler issue).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tessera_client::request::PatchType;
use tessera_client::types::{POD_GROUP_LABEL, PodGroup};
use tessera_core::LabelSelector;
use tessera_core::selector::label::{Operator, Requirement};
use tessera_runtime::EventClass;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Cache, key_of};

use crate::context::{Context, res};
use crate::pods;

/// The controller's name.
pub const NAME: &str = "podgroup-controller";

struct Groups {
    ctx: Context,
    groups: Arc<Cache<PodGroup>>,
    pods: Arc<Cache<Pod>>,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let groups = ctx.informer::<PodGroup>(res("tessera.io", "podgroups"));
    let pod_inf = ctx.informer::<Pod>(res("", "pods"));
    let r = Arc::new(Groups {
        ctx: ctx.clone(),
        groups: groups.cache().clone(),
        pods: pod_inf.cache().clone(),
    });
    ctx.controller(NAME)
        .watches_with(&groups, |c, q| {
            q.add(key_of(&c.object().metadata), EventClass::Update)
        })
        .watches_with(&pod_inf, |c, q| {
            let p = c.object();
            if let Some(g) = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POD_GROUP_LABEL))
            {
                q.add(
                    format!("{}/{g}", p.metadata.namespace.as_deref().unwrap_or("")),
                    EventClass::Update,
                );
            }
        })
        .run(r)
        .await;
}

/// The phase of a gang of `min` with these member counts.
pub fn phase(min: i32, scheduled: i32, running: i32, failed: i32, total: i32) -> &'static str {
    if running >= min.max(1) {
        "Running"
    } else if failed > 0 && total - failed < min {
        "Failed"
    } else if scheduled > 0 {
        "Scheduling"
    } else {
        "Pending"
    }
}

#[async_trait]
impl Reconciler for Groups {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(g) = self.groups.get(key) else {
            return Ok(Action::Done);
        };
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let selector = LabelSelector::from_requirements(vec![Requirement {
            key: POD_GROUP_LABEL.into(),
            operator: Operator::Equals,
            values: vec![name.to_owned()],
        }]);
        let members = self.pods.select(Some(ns), &selector);
        let live: Vec<&Arc<Pod>> = members
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let scheduled = live
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count() as i32;
        let running = live.iter().filter(|p| pods::phase(p) == "Running").count() as i32;
        let failed = live.iter().filter(|p| pods::phase(p) == "Failed").count() as i32;
        let min = g.spec.as_ref().map_or(1, |s| s.min_member);
        let phase = phase(min, scheduled, running, failed, live.len() as i32);
        let status = g.status.clone().unwrap_or_default();
        if status.phase.as_deref() == Some(phase)
            && status.scheduled == Some(scheduled)
            && status.running == Some(running)
        {
            return Ok(Action::Done);
        }
        let patch = json!({"status": {"phase": phase, "scheduled": scheduled, "running": running}});
        match self
            .ctx
            .client
            .patch(
                res("tessera.io", "podgroups"),
                Some(ns),
                name,
                Some("status"),
                PatchType::Merge,
                &patch,
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
    use super::phase;

    #[test]
    fn phases() {
        let cases = [
            ((3, 0, 0, 0, 3), "Pending"),
            ((3, 2, 0, 0, 3), "Scheduling"),
            ((3, 3, 3, 0, 3), "Running"),
            ((3, 3, 3, 0, 4), "Running"),
            ((3, 3, 1, 2, 3), "Failed"),
            ((3, 4, 2, 1, 5), "Scheduling"),
        ];
        for ((min, s, r, f, t), want) in cases {
            assert_eq!(phase(min, s, r, f, t), want, "{min} {s} {r} {f} {t}");
        }
    }
}
