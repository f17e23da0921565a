//! The DaemonSet controller: one pod on every eligible node (the template's nodeSelector
//! and required node affinity admit it, and the pod tolerates its NoSchedule/NoExecute
//! taints), following nodes as they join and leave; template changes roll out node by node
//! within `maxUnavailable` (or wait for deletions with `OnDelete`).
//!
//! Each pod is pinned with required node affinity on `metadata.name` and placed by the
//! scheduler, as Kubernetes does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodTemplateSpec, Taint,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use tessera_client::request::PatchType;
use tessera_core::time::now_secs;
use tessera_runtime::EventClass;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::expectations::Expectations;
use tessera_runtime::informer::{Cache, Change, controller_of, key_of, owner_key};
use tessera_runtime::taints::tolerates;

use crate::context::{Context, res};
use crate::deployment::template_hash;
use crate::history::{History, Owner};
use crate::pods::{self, uid_of};

/// The controller's name.
pub const NAME: &str = "daemonset-controller";
/// The label carrying a pod's template revision.
pub use crate::history::REVISION_LABEL;

struct DaemonSets {
    ctx: Context,
    history: History,
    sets: Arc<Cache<DaemonSet>>,
    nodes: Arc<Cache<Node>>,
    pods: Arc<Cache<Pod>>,
    expectations: Arc<Expectations>,
    recorder: Recorder,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let sets = ctx.informer::<DaemonSet>(res("apps", "daemonsets"));
    let nodes = ctx.informer::<Node>(res("", "nodes"));
    let pod_inf = ctx.informer::<Pod>(res("", "pods"));
    let revisions = ctx.informer::<ControllerRevision>(res("apps", "controllerrevisions"));
    let expectations = Arc::new(Expectations::new());
    let r = Arc::new(DaemonSets {
        history: History::new(ctx.clone(), revisions.cache().clone()),
        recorder: ctx.recorder(NAME),
        sets: sets.cache().clone(),
        nodes: nodes.cache().clone(),
        pods: pod_inf.cache().clone(),
        expectations: expectations.clone(),
        ctx: ctx.clone(),
    });
    let set_cache = sets.cache().clone();
    ctx.controller(NAME)
        .watches_with(&sets, |c, q| {
            q.add(key_of(&c.object().metadata), EventClass::Update)
        })
        // A node joining, leaving or changing may change every set's placement.
        .watches_with(&nodes, move |c, q| {
            let class = c.class();
            for ds in set_cache.list() {
                q.add(key_of(&ds.metadata), class);
            }
        })
        .watches_with(&pod_inf, move |c, q| {
            let p = c.object();
            if let Some(key) = owner_key(&p.metadata, "DaemonSet") {
                match c {
                    Change::Added(_) => expectations.observed_add(&key),
                    // A daemon pod counts as gone once removed: its node gets no second
                    // pod while the first terminates.
                    Change::Deleted(p) => expectations.observed_delete(&key, uid_of(p)),
                    _ => {}
                }
                q.add(key, EventClass::Update);
            }
        })
        .reads(&revisions)
        .run(r)
        .await;
}

/// The tolerations Kubernetes gives every daemon pod, so it runs on nodes being drained,
/// unready or under pressure.
fn daemon_tolerations() -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: Some(format!("node.kubernetes.io/{key}")),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Toleration::default()
    };
    let mut t = vec![
        exists("not-ready", "NoExecute"),
        exists("unreachable", "NoExecute"),
    ];
    for k in [
        "disk-pressure",
        "memory-pressure",
        "pid-pressure",
        "unschedulable",
    ] {
        t.push(exists(k, "NoSchedule"));
    }
    t
}

/// Whether a daemon pod of `template` belongs on `node`.
pub fn eligible(template: &PodTemplateSpec, node: &Node) -> bool {
    let spec = template.spec.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if !tessera_runtime::affinity::node_admits(&spec, &labels, name) {
        return false;
    }
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    tolerations.extend(daemon_tolerations());
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerates(&tolerations, t))
}

#[async_trait]
impl Reconciler for DaemonSets {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(ds) = self.sets.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::Done);
        };
        if ds.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let name = ds.metadata.name.clone().unwrap_or_default();
        let uid = ds.metadata.uid.clone().unwrap_or_default();
        let spec = ds.spec.clone().unwrap_or_default();
        let template = spec.template.clone();
        let template_value = serde_json::to_value(&template).unwrap_or(Value::Null);
        let revision = template_hash(&template_value, 0);
        let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
        let now = now_secs();
        // Pods by node.
        let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        let owned = self.pods.owned_by(&uid);
        // A deletion asked for is seen once its pod is gone from the cache, event or not.
        if self.expectations.awaits_deletions(key) {
            let present: HashSet<&str> = owned.iter().map(|p| uid_of(p)).collect();
            self.expectations
                .retain_deletions(key, |u| present.contains(u));
        }
        for p in owned {
            if controller_of(&p.metadata).is_none_or(|o| o.uid != uid) || !pods::is_active(&p) {
                continue;
            }
            let node = pod_node(&p);
            by_node.entry(node).or_default().push(p);
        }
        let in_use: HashSet<String> = by_node
            .values()
            .flatten()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(REVISION_LABEL).cloned())
            .collect();
        let owner = Owner {
            api_version: "apps/v1",
            kind: "DaemonSet",
            meta: &ds.metadata,
            template: &template_value,
            limit: spec.revision_history_limit.unwrap_or(10),
        };
        self.history.sync(&owner, &revision, &in_use).await?;
        let nodes = self.nodes.list();
        let mut create_on = Vec::new();
        let mut delete = Vec::new();
        let (mut desired, mut scheduled, mut ready, mut available, mut updated, mut misscheduled) =
            (0, 0, 0, 0, 0, 0);
        let mut outdated = Vec::new();
        for n in &nodes {
            let node = n.metadata.name.clone().unwrap_or_default();
            let should = eligible(&template, n);
            let here = by_node.remove(&node).unwrap_or_default();
            if should {
                desired += 1;
                if here.is_empty() {
                    create_on.push(node.clone());
                } else {
                    scheduled += 1;
                    // More than one: keep the oldest.
                    let mut here = here;
                    here.sort_by_key(|p| {
                        p.metadata
                            .creation_timestamp
                            .as_ref()
                            .map(|t| t.0.as_second())
                    });
                    let keep = here.remove(0);
                    delete.extend(here);
                    ready += i32::from(pods::is_ready(&keep));
                    available += i32::from(pods::is_available(&keep, min_ready, now));
                    let current = keep
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(REVISION_LABEL))
                        .is_some_and(|r| *r == revision);
                    if current {
                        updated += 1;
                    } else {
                        outdated.push(keep);
                    }
                }
            } else if !here.is_empty() {
                misscheduled += 1;
                delete.extend(here);
            }
        }
        // Pods whose node is gone.
        for (_, rest) in by_node {
            delete.extend(rest);
        }
        let r = ObjectRef::new("apps/v1", "DaemonSet", &ds.metadata);
        if self.expectations.satisfied(key) {
            // Rolling update: replace outdated pods while enough stay available.
            let strategy = spec.update_strategy.clone().unwrap_or_default();
            if strategy.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate" {
                let max_unavailable = match strategy
                    .rolling_update
                    .as_ref()
                    .and_then(|r| r.max_unavailable.clone())
                {
                    Some(IntOrString::Int(i)) => i.max(0),
                    Some(IntOrString::String(p)) => {
                        let pct: i32 = p.trim_end_matches('%').parse().unwrap_or(0);
                        (desired * pct / 100).max(1)
                    }
                    None => 1,
                };
                let unavailable = desired - available;
                let budget = (max_unavailable - unavailable).max(0) as usize;
                // Not-ready outdated pods go first: they cost nothing.
                outdated.sort_by_key(|p| pods::is_ready(p));
                let mut budget = budget;
                for p in outdated {
                    if !pods::is_ready(&p) || budget > 0 {
                        if pods::is_ready(&p) {
                            budget -= 1;
                        }
                        delete.push(p);
                    }
                }
            }
            if !delete.is_empty() {
                self.expectations
                    .expect_deletions(key, delete.iter().map(|p| uid_of(p)));
                for p in &delete {
                    let gone = pods::delete_pod(&self.ctx.client, p).await;
                    if gone.is_err() {
                        self.expectations.observed_delete(key, uid_of(p));
                    }
                }
                self.recorder.event(
                    &r,
                    EventType::Normal,
                    "SuccessfulDelete",
                    &format!("Deleted {} pod(s)", delete.len()),
                );
            }
            if !create_on.is_empty() {
                let owner = pods::owner_ref("apps/v1", "DaemonSet", &name, &uid);
                let labels = BTreeMap::from([(REVISION_LABEL.to_owned(), revision.clone())]);
                let new = pods::typed_pods(create_on.iter().map(|node| {
                    let mut p =
                        pods::from_template(&template, &owner, &format!("{name}-"), None, &labels);
                    let spec = p.spec.get_or_insert_default();
                    // Bound to its node by a required node affinity on the node's name.
                    spec.affinity
                        .get_or_insert_default()
                        .node_affinity
                        .get_or_insert_default()
                        .required_during_scheduling_ignored_during_execution = Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_fields: Some(vec![NodeSelectorRequirement {
                                key: "metadata.name".into(),
                                operator: "In".into(),
                                values: Some(vec![node.to_string()]),
                            }]),
                            ..NodeSelectorTerm::default()
                        }],
                    });
                    spec.tolerations
                        .get_or_insert_default()
                        .extend(daemon_tolerations());
                    p
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
                    return Err(e.into());
                }
            }
        }
        let status = json!({"status": {
            "desiredNumberScheduled": desired, "currentNumberScheduled": scheduled,
            "numberReady": ready, "numberAvailable": available,
            "numberUnavailable": (desired - available).max(0),
            "updatedNumberScheduled": updated, "numberMisscheduled": misscheduled,
            "observedGeneration": ds.metadata.generation.unwrap_or(0)}});
        let old = serde_json::to_value(&ds.status).unwrap_or(Value::Null);
        let changed = [
            "desiredNumberScheduled",
            "currentNumberScheduled",
            "numberReady",
            "numberAvailable",
            "updatedNumberScheduled",
            "numberMisscheduled",
            "observedGeneration",
        ]
        .iter()
        .any(|k| old[*k].as_i64().unwrap_or(0) != status["status"][*k].as_i64().unwrap_or(0));
        if changed {
            match self
                .ctx
                .client
                .patch(
                    res("apps", "daemonsets"),
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

/// The node a daemon pod is for: where it runs, or where its affinity pins it.
fn pod_node(p: &Pod) -> String {
    if let Some(n) = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
    {
        return n;
    }
    p.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_fields.as_ref())
        .and_then(|f| f.first())
        .and_then(|f| f.values.as_ref())
        .and_then(|v| v.first().cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eligible_nodes_follow_selectors_affinity_and_taints() {
        let node = |labels: Value, taints: Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels},
                "spec": {"taints": taints}}))
            .expect("node")
        };
        let template = |spec: Value| -> PodTemplateSpec {
            let mut spec = spec;
            spec["containers"] = json!([{"name": "c"}]);
            serde_json::from_value(json!({"spec": spec})).expect("template")
        };
        let linux = json!({"kubernetes.io/os": "linux", "disk": "ssd"});
        let no_schedule = json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]);
        let prefer = json!([{"key": "soft", "effect": "PreferNoSchedule"}]);
        let affinity = |op: &str, values: Value| {
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": op, "values": values}]}]}}}})
        };
        let cases = [
            ("no constraints", json!({}), linux.clone(), json!([]), true),
            (
                "selector matches",
                json!({"nodeSelector": {"disk": "ssd"}}),
                linux.clone(),
                json!([]),
                true,
            ),
            (
                "selector misses",
                json!({"nodeSelector": {"disk": "hdd"}}),
                linux.clone(),
                json!([]),
                false,
            ),
            (
                "affinity In",
                affinity("In", json!(["ssd"])),
                linux.clone(),
                json!([]),
                true,
            ),
            (
                "affinity NotIn",
                affinity("NotIn", json!(["ssd"])),
                linux.clone(),
                json!([]),
                false,
            ),
            (
                "untolerated NoSchedule",
                json!({}),
                linux.clone(),
                no_schedule.clone(),
                false,
            ),
            (
                "tolerated NoSchedule",
                json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}),
                linux.clone(),
                no_schedule.clone(),
                true,
            ),
            (
                "PreferNoSchedule never blocks",
                json!({}),
                linux.clone(),
                prefer,
                true,
            ),
        ];
        for (what, spec, labels, taints, want) in cases {
            assert_eq!(
                eligible(&template(spec), &node(labels, taints)),
                want,
                "{what}"
            );
        }
    }
}
