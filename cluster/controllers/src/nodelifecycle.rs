//! The node lifecycle controller: a node whose Lease has not been renewed for the grace
//! period (measured on this controller's clock from the last renewal it saw) becomes
//! `Ready=Unknown` and is tainted `node.kubernetes.io/unreachable` (NoSchedule and
//! NoExecute); its pods that do not tolerate the NoExecute taint are evicted after their
//! `tolerationSeconds` (at once without a toleration), so their controllers replace them
//! elsewhere. When the node reports Ready again, the taints go.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::request::PatchType;
use tessera_core::time::{now_secs, rfc3339};
use tessera_runtime::events::{EventType, ObjectRef};
use tessera_runtime::informer::{Change, key_of};
use tokio::time::Instant;

use crate::context::{Context, Tasks, res};

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

/// Runs the controller until dropped.
pub async fn run(ctx: Context, config: NodeLifecycleConfig) {
    let nodes = ctx.informer::<Node>(res("", "nodes"));
    let leases = ctx.informer::<Lease>(res("coordination.k8s.io", "leases"));
    let pods = ctx.informer::<Pod>(res("", "pods"));
    // When each node's Lease was last seen renewed, on this clock.
    let seen: Arc<Mutex<HashMap<String, (String, Instant)>>> = Arc::new(Mutex::new(HashMap::new()));
    {
        let seen = seen.clone();
        leases.on_change(move |c| {
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
                        s.insert(name, (renew, Instant::now()));
                    }
                }
            }
        });
    }
    // Pods by node, kept from the pod watch.
    let by_node: Arc<Mutex<HashMap<String, HashSet<String>>>> =
        Arc::new(Mutex::new(HashMap::new()));
    {
        let by_node = by_node.clone();
        pods.on_change(move |c| {
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
        });
    }
    let _tasks = Tasks(vec![
        tokio::spawn(nodes.clone().run()),
        tokio::spawn(leases.clone().run()),
        tokio::spawn(pods.clone().run()),
    ]);
    nodes.synced().await;
    leases.synced().await;
    pods.synced().await;
    let recorder = ctx.recorder(NAME);
    let started = Instant::now();
    let mut tick = tokio::time::interval(config.period);
    loop {
        tick.tick().await;
        for node in nodes.cache().list() {
            let name = node.metadata.name.clone().unwrap_or_default();
            let last = seen.lock().get(&name).map(|(_, at)| *at);
            // Grace counts from this controller's start for nodes it has not seen renew.
            let stale = last.unwrap_or(started).elapsed() > config.grace;
            let r = ObjectRef::new("v1", "Node", &node.metadata);
            if stale && ready_status(&node) != Some("Unknown") {
                if let Err(e) = mark_unknown(&ctx, &node).await {
                    tracing::warn!(node = %name, error = %e, "could not mark the node unreachable");
                    continue;
                }
                recorder.event(&r, EventType::Warning, "NodeNotReady",
                    &format!("Node {name} status is now: NodeNotReady (its Lease was not renewed for {:?})", config.grace));
            } else if stale && !(has_taint(&node, "NoExecute") && has_taint(&node, "NoSchedule")) {
                // The next look sees the node as written above (its resourceVersion moved).
                if let Err(e) = set_taints(&ctx, &node, true).await {
                    tracing::debug!(node = %name, error = %e, "tainting the node failed; retrying");
                }
            } else if !stale
                && ready_status(&node) == Some("True")
                && (has_taint(&node, "NoExecute") || has_taint(&node, "NoSchedule"))
            {
                if let Err(e) = set_taints(&ctx, &node, false).await {
                    tracing::warn!(node = %name, error = %e, "could not remove the unreachable taints");
                }
                recorder.event(
                    &r,
                    EventType::Normal,
                    "NodeReady",
                    &format!("Node {name} status is now: NodeReady"),
                );
            }
            if has_taint(&node, "NoExecute") {
                let keys: Vec<String> = by_node
                    .lock()
                    .get(&name)
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                let added = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .and_then(|t| {
                        t.iter()
                            .find(|t| t.key == UNREACHABLE && t.effect == "NoExecute")
                    })
                    .and_then(|t| t.time_added.as_ref())
                    .map_or(now_secs(), |t| t.0.as_second());
                for key in keys {
                    let Some(p) = pods.cache().get(&key) else {
                        continue;
                    };
                    if p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    if let Some(after) = eviction_delay(&p)
                        && now_secs() >= added + after
                    {
                        evict(&ctx, &recorder, &p, &name).await;
                    }
                }
            }
        }
    }
}

/// Seconds after the NoExecute taint a pod is evicted (None: it tolerates it for ever).
fn eviction_delay(p: &Pod) -> Option<i64> {
    let taint = Taint {
        key: UNREACHABLE.into(),
        effect: "NoExecute".into(),
        ..Default::default()
    };
    let tols = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let matching: Vec<_> = tols
        .iter()
        .filter(|t| tessera_runtime::taints::toleration_matches(t, &taint))
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

async fn mark_unknown(ctx: &Context, node: &Node) -> Result<(), String> {
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
        .map_err(|e| e.message)
}

async fn set_taints(ctx: &Context, node: &Node, on: bool) -> Result<(), String> {
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
        .map_err(|e| e.message)
}

async fn evict(ctx: &Context, recorder: &tessera_runtime::events::Recorder, p: &Pod, node: &str) {
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
                "Marking for deletion Pod {}: node {node} is unreachable",
                key_of(&p.metadata)
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
        for (what, tolerations, want) in cases {
            assert_eq!(eviction_delay(&pod(tolerations)), want, "{what}");
        }
    }
}
