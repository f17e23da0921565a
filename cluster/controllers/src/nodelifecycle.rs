//! The node lifecycle controller: a node whose Lease has not been renewed for the grace
//! period (measured on this controller's clock from the last renewal it saw) becomes
//! `Ready=Unknown` and is tainted `node.kubernetes.io/unreachable` (NoSchedule and
//! NoExecute); its pods that do not tolerate the NoExecute taint are evicted after their
//! `tolerationSeconds` (at once without a toleration), so their controllers replace them
//! elsewhere. When the node reports Ready again, the taints go. Every other NoExecute taint
//! (an admin's `kubectl taint ... :NoExecute`, a node lent to another shard) evicts the same
//! way, as Kubernetes' taint manager does: at once without a toleration, after the
//! toleration's seconds from the taint's `timeAdded` (a taint without one evicts only the
//! pods that do not tolerate it).
//!
//! A node's Lease is the one in `kube-node-lease` named after it, as a kubelet keeps, or the
//! one its `tessera.io/node-lease` annotation names: hollow nodes of one simulated agent share
//! one, and all of them lapse with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::request::PatchType;
use tessera_client::status::ApiError;
use tessera_client::types::NODE_LEASE_ANNOTATION;
use tessera_core::time::{now_secs, rfc3339};
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, Change, key_of};
use tokio::time::Instant;

use crate::context::{Context, res};

/// The controller's name.
pub const NAME: &str = "node-lifecycle-controller";
/// The taint of an unreachable node.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// Timings.
#[derive(Clone, Copy, Debug)]
pub struct NodeLifecycleConfig {
    /// A node whose Lease was not renewed for this long is unreachable (Kubernetes: 40 s).
    pub grace: Duration,
    /// How often nodes are checked (Kubernetes: 5 s).
    pub period: Duration,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            grace: Duration::from_secs(40),
            period: Duration::from_secs(5),
        }
    }
}

fn ready_status(n: &Node) -> Option<&str> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

fn has_taint(n: &Node, effect: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNREACHABLE && t.effect == effect))
}

/// Whether `n` has any NoExecute taint (its pods that do not tolerate it must go).
fn any_no_execute(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.effect == "NoExecute"))
}

/// When each Lease was last seen renewed (its renewTime, and when on this clock), by name.
type Renewals = Arc<Mutex<HashMap<String, (String, Instant)>>>;

/// The name of the Lease that stands for `node`.
fn lease_of(node: &Node) -> &str {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_LEASE_ANNOTATION))
        .or(node.metadata.name.as_ref())
        .map_or("", String::as_str)
}

struct Lifecycle {
    ctx: Context,
    config: NodeLifecycleConfig,
    nodes: Arc<Cache<Node>>,
    pods: Arc<Cache<Pod>>,
    seen: Renewals,
    /// Leases a node named before this controller saw them, and when it first looked: their
    /// grace counts from then (a node and its Lease arrive through two watches, in either
    /// order).
    unseen: Arc<Mutex<HashMap<String, Instant>>>,
    /// Pods by node, kept from the pod watch.
    by_node: Arc<Mutex<HashMap<String, HashSet<String>>>>,
    recorder: Recorder,
}

/// Runs the controller until dropped: each node is a key that requeues itself for the moment
/// its Lease would lapse (or, while it is tainted unreachable, every period for evictions),
/// so a quiet fleet costs one look per node per grace period, not a scan of every node.
pub async fn run(ctx: Context, config: NodeLifecycleConfig) {
    let nodes = ctx.informer::<Node>(res("", "nodes"));
    let leases = ctx.informer::<Lease>(res("coordination.k8s.io", "leases"));
    let pods = ctx.informer::<Pod>(res("", "pods"));
    let seen: Renewals = Arc::new(Mutex::new(HashMap::new()));
    let unseen: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let by_node: Arc<Mutex<HashMap<String, HashSet<String>>>> =
        Arc::new(Mutex::new(HashMap::new()));
    let r = Arc::new(Lifecycle {
        ctx: ctx.clone(),
        config,
        nodes: nodes.cache().clone(),
        pods: pods.cache().clone(),
        seen: seen.clone(),
        unseen: unseen.clone(),
        by_node: by_node.clone(),
        recorder: ctx.recorder(NAME),
    });
    ctx.controller(NAME)
        .watches_with(&nodes, |c, q| {
            if !matches!(c, Change::Deleted(_)) {
                q.add(key_of(&c.object().metadata), c.class());
            }
        })
        .watches_with(&leases, move |c, _| {
            let l = c.object();
            if l.metadata.namespace.as_deref() != Some("kube-node-lease") {
                return;
            }
            let name = l.metadata.name.clone().unwrap_or_default();
            let renew = l
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            let mut s = seen.lock();
            match c {
                Change::Deleted(_) => {
                    s.remove(&name);
                }
                _ => {
                    if s.get(&name).is_none_or(|(r, _)| *r != renew) {
                        unseen.lock().remove(&name);
                        s.insert(name, (renew, Instant::now()));
                    }
                }
            }
        })
        .watches_with(&pods, move |c, _| {
            let p = c.object();
            let key = key_of(&p.metadata);
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let mut m = by_node.lock();
            if let Change::Updated { old, .. } = c
                && let Some(n) = old.spec.as_ref().and_then(|s| s.node_name.as_ref())
                && let Some(set) = m.get_mut(n)
            {
                set.remove(&key);
            }
            if let Some(n) = node {
                if matches!(c, Change::Deleted(_)) {
                    if let Some(set) = m.get_mut(&n) {
                        set.remove(&key);
                    }
                } else {
                    m.entry(n).or_default().insert(key);
                }
            }
        })
        .run(r)
        .await;
}

#[async_trait]
impl Reconciler for Lifecycle {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, name: &str) -> Result<Action, ReconcileError> {
        let Some(node) = self.nodes.get(name) else {
            return Ok(Action::Done);
        };
        let grace = self.config.grace;
        // Grace counts from the last renewal seen; for a Lease not seen yet, from the first
        // look at it (so from this controller's start for the nodes it starts with).
        let lease = lease_of(&node);
        let seen = self.seen.lock().get(lease).map(|(_, at)| *at);
        let since = seen.unwrap_or_else(|| {
            *self
                .unseen
                .lock()
                .entry(lease.to_owned())
                .or_insert_with(Instant::now)
        });
        let stale = since.elapsed() > grace;
        let r = ObjectRef::new("v1", "Node", &node.metadata);
        if stale && ready_status(&node) != Some("Unknown") {
            mark_unknown(&self.ctx, &node).await?;
            self.recorder.event(&r, EventType::Warning, "NodeNotReady",
                &format!("Node {name} status is now: NodeNotReady (its Lease was not renewed for {grace:?})"));
        } else if stale && !(has_taint(&node, "NoExecute") && has_taint(&node, "NoSchedule")) {
            // The next look sees the node as written here (its resourceVersion moved).
            set_taints(&self.ctx, &node, true).await?;
        } else if !stale
            && ready_status(&node) == Some("True")
            && (has_taint(&node, "NoExecute") || has_taint(&node, "NoSchedule"))
        {
            set_taints(&self.ctx, &node, false).await?;
            self.recorder.event(
                &r,
                EventType::Normal,
                "NodeReady",
                &format!("Node {name} status is now: NodeReady"),
            );
        }
        let no_execute = any_no_execute(&node);
        if no_execute {
            self.evict_due(&node, name).await;
        }
        // Look again when the Lease would lapse without a renewal — a renewal meanwhile moves
        // that moment, which the look then finds — or every period while the node is
        // unreachable or tainted (it may come back; evictions fall due).
        let next = if stale || no_execute || has_taint(&node, "NoSchedule") {
            self.config.period
        } else {
            (since + grace)
                .saturating_duration_since(Instant::now())
                .max(self.config.period / 4)
                + Duration::from_millis(10)
        };
        Ok(Action::RequeueAfter(next))
    }
}

impl Lifecycle {
    /// Evicts the pods of a NoExecute-tainted node whose toleration of it has run out.
    async fn evict_due(&self, node: &Node, name: &str) {
        let keys: Vec<String> = self
            .by_node
            .lock()
            .get(name)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        // Every NoExecute taint counts (the controller's own `unreachable`, an admin's, a
        // node lent away): a pod goes once the first it does not tolerate (long enough) is due.
        let taints: Vec<(Taint, i64)> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter(|t| t.effect == "NoExecute")
            .map(|t| {
                let added = t
                    .time_added
                    .as_ref()
                    .map_or(now_secs(), |t| t.0.as_second());
                (t.clone(), added)
            })
            .collect();
        for key in keys {
            let Some(p) = self.pods.get(&key) else {
                continue;
            };
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let due = taints.iter().find(|(t, added)| {
                eviction_delay(&p, t).is_some_and(|after| now_secs() >= added + after)
            });
            if let Some((t, _)) = due {
                evict(&self.ctx, &self.recorder, &p, name, t).await;
            }
        }
    }
}

/// Seconds after NoExecute taint `taint` was added that a pod is evicted for it (None: it
/// tolerates it for ever).
fn eviction_delay(p: &Pod, taint: &Taint) -> Option<i64> {
    let tols = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let matching: Vec<_> = tols
        .iter()
        .filter(|t| tessera_runtime::taints::toleration_matches(t, taint))
        .collect();
    if matching.is_empty() {
        return Some(0);
    }
    if matching.iter().any(|t| t.toleration_seconds.is_none()) {
        return None;
    }
    matching
        .iter()
        .filter_map(|t| t.toleration_seconds)
        .min()
        .map(|s| s.max(0))
}

async fn mark_unknown(ctx: &Context, node: &Node) -> Result<(), ApiError> {
    let now = rfc3339(now_secs());
    let mut conditions: Vec<Value> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    for c in conditions.iter_mut() {
        if c["type"] == "Ready" {
            c["status"] = json!("Unknown");
            c["reason"] = json!("NodeStatusUnknown");
            c["message"] = json!("Kubelet stopped posting node status.");
            c["lastTransitionTime"] = json!(now);
        }
    }
    ctx.client
        .patch(
            res("", "nodes"),
            None,
            node.metadata.name.as_deref().unwrap_or(""),
            Some("status"),
            PatchType::Merge,
            &json!({"status": {"conditions": conditions}}),
        )
        .await
        .map(|_| ())
}

async fn set_taints(ctx: &Context, node: &Node, on: bool) -> Result<(), ApiError> {
    let mut taints: Vec<Value> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != UNREACHABLE)
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    if on {
        let now = rfc3339(now_secs());
        taints.push(json!({"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now}));
        taints.push(json!({"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}));
    }
    ctx.client
        .patch(
            res("", "nodes"),
            None,
            node.metadata.name.as_deref().unwrap_or(""),
            None,
            PatchType::Merge,
            &json!({"spec": {"taints": taints}, "metadata": {"resourceVersion": node.metadata.resource_version}}),
        )
        .await
        .map(|_| ())
}

async fn evict(ctx: &Context, recorder: &Recorder, p: &Pod, node: &str, taint: &Taint) {
    let r = ctx
        .client
        .delete(
            res("", "pods"),
            p.metadata.namespace.as_deref(),
            p.metadata.name.as_deref().unwrap_or(""),
            None,
        )
        .await;
    if r.is_ok() {
        recorder.event(
            &ObjectRef::new("v1", "Pod", &p.metadata),
            EventType::Normal,
            "TaintManagerEviction",
            &format!(
                "Marking for deletion Pod {}: node {node} {}",
                key_of(&p.metadata),
                if taint.key == UNREACHABLE {
                    "is unreachable".to_owned()
                } else {
                    format!(
                        "has taint {}:NoExecute, which it does not tolerate",
                        taint.key
                    )
                }
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn eviction_waits_for_the_shortest_matching_toleration() {
        let pod = |tolerations: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"},
                "spec": {"containers": [], "tolerations": tolerations}}))
            .expect("pod")
        };
        let unreachable = |secs: Option<i64>| {
            let mut t = json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"});
            if let Some(s) = secs {
                t["tolerationSeconds"] = json!(s);
            }
            t
        };
        let cases = [
            ("no toleration: at once", json!([]), Some(0)),
            (
                "300 s, as Kubernetes' default",
                json!([unreachable(Some(300))]),
                Some(300),
            ),
            (
                "the shortest of several",
                json!([unreachable(Some(300)), unreachable(Some(30))]),
                Some(30),
            ),
            ("for ever", json!([unreachable(None)]), None),
            ("any key, any effect", json!([{"operator": "Exists"}]), None),
            (
                "another key does not count",
                json!([{"key": "other", "operator": "Exists", "tolerationSeconds": 5, "effect": "NoExecute"}]),
                Some(0),
            ),
            (
                "NoSchedule only does not count",
                json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoSchedule"}]),
                Some(0),
            ),
        ];
        let taint = Taint {
            key: UNREACHABLE.into(),
            effect: "NoExecute".into(),
            ..Default::default()
        };
        for (what, tolerations, want) in cases {
            assert_eq!(eviction_delay(&pod(tolerations), &taint), want, "{what}");
        }
        // Any NoExecute taint is judged the same way: a node lent away evicts a pod that
        // tolerates only `unreachable` at once.
        let lent = Taint {
            key: "tessera.io/lent".into(),
            value: Some("b".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        };
        assert_eq!(
            eviction_delay(&pod(json!([unreachable(Some(300))])), &lent),
            Some(0)
        );
        assert_eq!(
            eviction_delay(
                &pod(
                    json!([{"key": "tessera.io/lent", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 7}])
                ),
                &lent
            ),
            Some(7)
        );
    }
}
