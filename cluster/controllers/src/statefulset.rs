//! The StatefulSet controller: pods with stable names `{set}-{ordinal}`; with `OrderedReady`
//! each ordinal is created only once every lower one is Running and Ready, and scaling down
//! removes the highest ordinal first, one at a time; `Parallel` does both at once. Template
//! changes roll from the highest ordinal down (above `partition`), one pod at a time.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tessera_client::client::create_typed;
use tessera_client::request::PatchType;
use tessera_runtime::EventClass;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, controller_of, key_of};

use crate::context::{Context, res};
use crate::deployment::template_hash;
use crate::history::{History, Owner};
use crate::pods;

/// The controller's name.
pub const NAME: &str = "statefulset-controller";
/// The label carrying a pod's template revision.
pub use crate::history::REVISION_LABEL;

struct Sets {
    ctx: Context,
    history: History,
    sets: Arc<Cache<StatefulSet>>,
    pods: Arc<Cache<Pod>>,
    recorder: Recorder,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let sets = ctx.informer::<StatefulSet>(res("apps", "statefulsets"));
    let pod_inf = ctx.informer::<Pod>(res("", "pods"));
    let revisions = ctx.informer::<ControllerRevision>(res("apps", "controllerrevisions"));
    let r = Arc::new(Sets {
        history: History::new(ctx.clone(), revisions.cache().clone()),
        recorder: ctx.recorder(NAME),
        sets: sets.cache().clone(),
        pods: pod_inf.cache().clone(),
        ctx: ctx.clone(),
    });
    ctx.controller(NAME)
        .watches_with(&sets, |c, q| {
            q.add(key_of(&c.object().metadata), EventClass::Update)
        })
        .owns(&pod_inf, "StatefulSet")
        .reads(&revisions)
        .run(r)
        .await;
}

fn ordinal(set: &str, pod: &str) -> Option<usize> {
    pod.strip_prefix(set)?.strip_prefix('-')?.parse().ok()
}

fn running_ready(p: &Pod) -> bool {
    pods::phase(p) == "Running" && pods::is_ready(p) && p.metadata.deletion_timestamp.is_none()
}

#[async_trait]
impl Reconciler for Sets {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(set) = self.sets.get(key) else {
            return Ok(Action::Done);
        };
        if set.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        let name = set.metadata.name.clone().unwrap_or_default();
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let spec = set.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1).max(0) as usize;
        let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
        let template_value = serde_json::to_value(&spec.template).unwrap_or(Value::Null);
        let revision = template_hash(&template_value, 0);
        let mut by_ordinal: BTreeMap<usize, Arc<Pod>> = BTreeMap::new();
        for p in self.pods.owned_by(&uid) {
            if controller_of(&p.metadata).is_none_or(|o| o.uid != uid) {
                continue;
            }
            if let Some(i) = ordinal(&name, p.metadata.name.as_deref().unwrap_or("")) {
                by_ordinal.insert(i, p);
            }
        }
        let in_use: HashSet<String> = by_ordinal
            .values()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(REVISION_LABEL).cloned())
            .collect();
        let owner = Owner {
            api_version: "apps/v1",
            kind: "StatefulSet",
            meta: &set.metadata,
            template: &template_value,
            limit: spec.revision_history_limit.unwrap_or(10),
        };
        self.history.sync(&owner, &revision, &in_use).await?;
        let r = ObjectRef::new("apps/v1", "StatefulSet", &set.metadata);
        let rev_of = |p: &Pod| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(REVISION_LABEL).cloned())
                .unwrap_or_default()
        };
        // Failed or finished pods are replaced under the same name.
        for (i, p) in &by_ordinal {
            if pods::is_terminal(p) && p.metadata.deletion_timestamp.is_none() && *i < replicas {
                pods::delete_pod_if_present(&self.ctx.client, p).await?;
                return Ok(Action::Done);
            }
        }
        // Create missing ordinals below `replicas`.
        for i in 0..replicas {
            if by_ordinal.contains_key(&i) {
                if !parallel && !by_ordinal.get(&i).is_some_and(|p| running_ready(p)) {
                    // OrderedReady: wait for this one before the next.
                    break;
                }
                continue;
            }
            self.create(&set, i, &revision).await?;
            self.recorder.event(
                &r,
                EventType::Normal,
                "SuccessfulCreate",
                &format!("create Pod {name}-{i} in StatefulSet {name} successful"),
            );
            if !parallel {
                break;
            }
        }
        // Scale down: highest ordinals first (one at a time unless Parallel).
        let extra: Vec<(usize, Arc<Pod>)> = by_ordinal
            .iter()
            .rev()
            .filter(|(i, _)| **i >= replicas)
            .map(|(i, p)| (*i, p.clone()))
            .collect();
        for (i, p) in &extra {
            if p.metadata.deletion_timestamp.is_some() {
                if !parallel {
                    break;
                }
                continue;
            }
            // OrderedReady scales down only while the rest is healthy.
            if !parallel && by_ordinal.range(..*i).any(|(_, q)| !running_ready(q)) {
                break;
            }
            pods::delete_pod_if_present(&self.ctx.client, p).await?;
            self.recorder.event(
                &r,
                EventType::Normal,
                "SuccessfulDelete",
                &format!("delete Pod {name}-{i} in StatefulSet {name} successful"),
            );
            if !parallel {
                break;
            }
        }
        // Rolling update, from the top down to the partition, one pod at a time.
        let strategy = spec.update_strategy.clone().unwrap_or_default();
        if extra.is_empty()
            && strategy.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate"
        {
            let partition = strategy
                .rolling_update
                .as_ref()
                .and_then(|r| r.partition)
                .unwrap_or(0)
                .max(0) as usize;
            let all_ready =
                (0..replicas).all(|i| by_ordinal.get(&i).is_some_and(|p| running_ready(p)));
            if all_ready
                && let Some((_, p)) = by_ordinal
                    .iter()
                    .rev()
                    .filter(|(i, _)| **i >= partition && **i < replicas)
                    .find(|(_, p)| rev_of(p) != revision)
            {
                pods::delete_pod_if_present(&self.ctx.client, p).await?;
            }
        }
        // Status.
        let live: Vec<&Arc<Pod>> = by_ordinal.values().filter(|p| pods::is_active(p)).collect();
        let ready = live.iter().filter(|p| pods::is_ready(p)).count();
        let updated = live.iter().filter(|p| rev_of(p) == revision).count();
        let status = json!({"status": {
            "replicas": live.len(), "readyReplicas": ready, "availableReplicas": ready,
            "currentReplicas": updated, "updatedReplicas": updated,
            "currentRevision": format!("{name}-{revision}"), "updateRevision": format!("{name}-{revision}"),
            "observedGeneration": set.metadata.generation.unwrap_or(0)}});
        let old = serde_json::to_value(&set.status).unwrap_or(Value::Null);
        let changed = [
            "replicas",
            "readyReplicas",
            "updatedReplicas",
            "observedGeneration",
        ]
        .iter()
        .any(|k| old[*k].as_i64().unwrap_or(0) != status["status"][*k].as_i64().unwrap_or(0))
            || old["updateRevision"] != status["status"]["updateRevision"];
        if changed {
            match self
                .ctx
                .client
                .patch(
                    res("apps", "statefulsets"),
                    Some(&ns),
                    &name,
                    Some("status"),
                    PatchType::Merge,
                    &status,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::Done)
    }
}

impl Sets {
    /// Makes claim `{template}-{pod}` from `template` unless it exists; its name.
    async fn claim(
        &self,
        set: &StatefulSet,
        template: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
        pod_name: &str,
        ns: &str,
    ) -> Result<String, ReconcileError> {
        let name = format!(
            "{}-{pod_name}",
            template.metadata.name.as_deref().unwrap_or_default()
        );
        let mut labels = template.metadata.labels.clone().unwrap_or_default();
        let selector = set
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone());
        labels.extend(selector.unwrap_or_default());
        let claim = k8s_openapi::api::core::v1::PersistentVolumeClaim {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                annotations: template.metadata.annotations.clone(),
                ..Default::default()
            },
            spec: template.spec.clone(),
            status: None,
        };
        match create_typed(
            &*self.ctx.client,
            res("", "persistentvolumeclaims"),
            Some(ns),
            &claim,
        )
        .await
        {
            Ok(_) => Ok(name),
            Err(e) if e.code == 409 => Ok(name),
            Err(e) => Err(e.into()),
        }
    }

    async fn create(
        &self,
        set: &StatefulSet,
        i: usize,
        revision: &str,
    ) -> Result<(), ReconcileError> {
        let ns = set.metadata.namespace.clone().unwrap_or_default();
        let name = set.metadata.name.clone().unwrap_or_default();
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let spec = set.spec.clone().unwrap_or_default();
        let pod_name = format!("{name}-{i}");
        let labels = BTreeMap::from([
            (REVISION_LABEL.to_owned(), revision.to_owned()),
            (
                "statefulset.kubernetes.io/pod-name".to_owned(),
                pod_name.clone(),
            ),
            ("apps.kubernetes.io/pod-index".to_owned(), i.to_string()),
        ]);
        let owner = pods::owner_ref("apps/v1", "StatefulSet", &name, &uid);
        let mut p = pods::from_template(&spec.template, &owner, "", Some(&pod_name), &labels);
        if let Some(svc) = spec.service_name.as_ref().filter(|s| !s.is_empty()) {
            let pod_spec = p.spec.get_or_insert_default();
            pod_spec.hostname = Some(pod_name.clone());
            pod_spec.subdomain = Some(svc.clone());
        }
        // Each ordinal's claims, made before its pod (kept when the pod goes, as with
        // Kubernetes' default `Retain`), and the pod's volumes naming them.
        for template in spec.volume_claim_templates.iter().flatten() {
            let claim = self.claim(set, template, &pod_name, &ns).await?;
            let volumes = p
                .spec
                .get_or_insert_default()
                .volumes
                .get_or_insert_default();
            let tname = template.metadata.name.clone().unwrap_or_default();
            volumes.retain(|v| v.name != tname);
            volumes.push(k8s_openapi::api::core::v1::Volume {
                name: tname,
                persistent_volume_claim: Some(
                    k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                        claim_name: claim,
                        read_only: None,
                    },
                ),
                ..Default::default()
            });
        }
        match create_typed(&*self.ctx.client, res("", "pods"), Some(&ns), &p).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_come_from_stable_names() {
        let cases = [
            ("db", "db-0", Some(0)),
            ("db", "db-12", Some(12)),
            ("db", "db-x", None),
            ("db", "dbx-1", None),
            ("db", "db", None),
            ("web-db", "web-db-3", Some(3)),
            ("db", "other-1", None),
        ];
        for (set, pod, want) in cases {
            assert_eq!(ordinal(set, pod), want, "{set} {pod}");
        }
    }
}
