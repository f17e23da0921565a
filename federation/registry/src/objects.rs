//! The registry as the federation's API shows it: a `Shard` object per shard (created when
//! it first registers; its status written from the registry, its spec — cordon, taints,
//! weight — read back into it) and the `ShardMap` object `default` with the map's version.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use tessera_client::client::Client;
use tessera_client::request::{PatchType, find_resource};
use tessera_client::types::Shard;
use tessera_core::time::{now_secs, rfc3339};
use tessera_placement::Taint;
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, Informer, Scope};

use crate::registry::{Registry, ShardView};

/// How often Shard objects are brought up to date (only the changed ones are written).
const PERIOD: Duration = Duration::from_secs(1);

/// A status field's amount as a Kubernetes quantity.
fn quantity(resource: &str, v: u64) -> Quantity {
    Quantity(tessera_placement::summary::human(resource, v))
}

/// The status a Shard object shows for `v` (the lease's renew time is rounded to the
/// lease's renew period by the caller, so that an idle shard is not rewritten every second).
pub fn status_of(v: &ShardView, lease_seconds: u64, renewed: i64) -> Value {
    let mut allocatable = BTreeMap::new();
    let mut free = BTreeMap::new();
    if let Some(s) = &v.summary {
        for (i, r) in s.resources.iter().enumerate() {
            allocatable.insert(r.clone(), quantity(r, s.allocatable[i]));
            free.insert(r.clone(), quantity(r, s.free[i]));
        }
    }
    let (reason, message) = if v.ready {
        (
            "LeaseHeld",
            "the shard's agent is connected and renewing its lease".to_owned(),
        )
    } else if v.session.is_some() {
        (
            "LeaseExpired",
            "the shard's agent stopped renewing its lease".to_owned(),
        )
    } else {
        (
            "Disconnected",
            "the shard's agent is not connected; its lease runs out on its own".to_owned(),
        )
    };
    json!({
        "conditions": [{
            "type": "Ready",
            "status": if v.ready { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastTransitionTime": rfc3339(now_secs()),
        }],
        "nodes": v.summary.as_ref().map_or(0, |s| s.nodes),
        "allocatable": allocatable,
        "free": free,
        "podsRunning": v.pods.0,
        "podsPending": v.pods.1,
        "podsPlacedLastMinute": v.placed_last_minute,
        "slots": v.summary.as_ref().map_or(0, |s| s.slots.len()),
        "summaryVersion": v.summary.as_ref().map_or(0, |s| s.version),
        "lease": {
            "holder": v.session.map(|s| format!("session-{s}")),
            "leaseDurationSeconds": lease_seconds,
            "renewTime": rfc3339(renewed),
        },
        "apiUrl": v.api_url,
        "workloads": v.held,
        "movingOut": v.leaving,
        "lentNodes": v.lent,
        "borrowedNodes": v.borrowed,
        "unmetPods": v.unmet_pods,
        "weight": v.weight,
        "nodeGroups": v.summary.as_ref().map(|s| {
            s.groups
                .iter()
                .map(|g| {
                    let labels: BTreeMap<&str, &str> = s
                        .group_keys
                        .iter()
                        .zip(&g.values)
                        .filter(|(_, v)| !v.is_empty())
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    let free: BTreeMap<&str, Quantity> = s
                        .resources
                        .iter()
                        .zip(&g.summary.free)
                        .map(|(r, f)| (r.as_str(), quantity(r, *f)))
                        .collect();
                    json!({"labels": labels, "nodes": g.summary.nodes, "free": free})
                })
                .collect::<Vec<_>>()
        }).filter(|g| !g.is_empty()),
    })
}

/// The taint on a shard whose lease has lapsed (kept off it while it is lost).
pub const UNREACHABLE_TAINT: &str = "tessera.io/unreachable";

/// Adds [`UNREACHABLE_TAINT`] (`NoSchedule`) to `shard` when it is not `ready`, removes it
/// when it is; the admin's own taints stay. Written only onto the version read.
async fn taint_if_lost(
    client: &dyn Client,
    shards: &'static tessera_client::catalog::Resource,
    shard: &Shard,
    ready: bool,
) {
    let taints = shard
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tainted = taints.iter().any(|t| t.key == UNREACHABLE_TAINT);
    if tainted != ready {
        return;
    }
    let mut want: Vec<Value> = taints
        .iter()
        .filter(|t| t.key != UNREACHABLE_TAINT)
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    if !ready {
        want.push(json!({
            "key": UNREACHABLE_TAINT,
            "effect": "NoSchedule",
            "timeAdded": rfc3339(now_secs()),
        }));
    }
    let name = shard.metadata.name.as_deref().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": shard.metadata.resource_version},
        "spec": {"taints": want},
    });
    match client
        .patch(shards, None, name, None, PatchType::Merge, &patch)
        .await
    {
        Ok(_) => tracing::info!(
            shard = name,
            tainted = !ready,
            "shard's unreachable taint set"
        ),
        // Written again from the next version read.
        Err(e) => tracing::debug!(shard = name, error = %e.message, "tainting the Shard"),
    }
}

/// An event on the Shards a loan concerns.
fn loan_event(recorder: &Recorder, cache: &Cache<Shard>, o: &crate::lending::Outcome) {
    use crate::lending::Outcome;
    let on = |shard: &str, kind: EventType, reason: &str, message: &str| {
        if let Some(s) = cache.get(shard) {
            recorder.event(
                &ObjectRef::new("tessera.io/v1alpha1", "Shard", &s.metadata),
                kind,
                reason,
                message,
            );
        }
    };
    match o {
        Outcome::Lent {
            loan,
            node,
            lender,
            borrower,
        } => {
            let m = format!("node {node} of shard {lender} joined shard {borrower} (loan {loan})");
            on(lender, EventType::Normal, "NodeLent", &m);
            on(borrower, EventType::Normal, "NodeBorrowed", &m);
        }
        Outcome::Returning {
            loan,
            node,
            lender,
            borrower,
            why,
        } => {
            let m = format!(
                "node {node} of shard {lender} goes back from shard {borrower} (loan {loan}): {why}"
            );
            on(lender, EventType::Normal, "NodeReturning", &m);
            on(borrower, EventType::Normal, "NodeReturning", &m);
        }
        Outcome::Returned {
            loan,
            node,
            lender,
            away,
        } => {
            let m = format!(
                "node {node} is back (loan {loan}), {:.1}s after it was asked back",
                away.as_secs_f64()
            );
            on(lender, EventType::Normal, "NodeReturned", &m);
        }
    }
}

/// Keeps Shard objects and the ShardMap in the federation's API in step with `registry`,
/// and the registry in step with what admins write in Shard specs. Runs until dropped.
pub async fn run(registry: Arc<Registry>, client: Arc<dyn Client>) {
    let shards = find_resource("tessera.io", "v1alpha1", "shards").expect("served");
    let maps = find_resource("tessera.io", "v1alpha1", "shardmaps").expect("served");
    let informer = Informer::<Shard>::new(client.clone(), shards, Scope::default(), None);
    {
        let registry = registry.clone();
        informer
            .on_change(move |c| {
                let s = c.object();
                let Some(name) = s.metadata.name.as_deref() else {
                    return;
                };
                let spec = s.spec.clone().unwrap_or_default();
                let taints = spec
                    .taints
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| Taint {
                        key: t.key,
                        value: t.value.unwrap_or_default(),
                        effect: t.effect,
                    })
                    .collect();
                registry.set_spec(
                    name,
                    spec.unschedulable.unwrap_or(false),
                    taints,
                    spec.weight.map(|w| w.clamp(1, 10_240) as u64),
                );
                let lending = spec.lending.unwrap_or_default();
                let n = |v: Option<i64>| v.unwrap_or(0).max(0) as u64;
                registry.set_lending(
                    name,
                    crate::lending::LendingPolicy {
                        min_nodes: n(lending.min_nodes),
                        max_lend: n(lending.max_lend),
                        max_borrow: n(lending.max_borrow),
                    },
                );
            })
            .detach();
    }
    let cache = informer.cache().clone();
    let recorder = Recorder::new(client.clone(), "tessera-federation", None);
    let _watch = tessera_runtime::informer::Tasks(vec![tokio::spawn(informer.clone().run())]);
    informer.synced().await;
    // Map versions go on from the stored map's (a restarted federation does not start at 1
    // again: a version seen once names one map only).
    loop {
        match client.get(maps, None, "default").await {
            Ok(m) => {
                if let Some(v) = m["spec"]["version"].as_u64() {
                    registry.resume_map_version(v);
                }
                break;
            }
            Err(e) if e.code == 404 => break,
            Err(e) => {
                tracing::warn!(error = %e.message, "reading the stored ShardMap; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    // What was last written, per shard, to write only changes.
    let mut written: BTreeMap<String, Value> = BTreeMap::new();
    let mut map_written = 0u64;
    let mut renewed: BTreeMap<String, (Option<u64>, i64)> = BTreeMap::new();
    let lease = registry.config().lease.as_secs();
    let renew = registry.config().renew.as_secs().max(1) as i64;
    let mut tick = tokio::time::interval(PERIOD);
    loop {
        tick.tick().await;
        registry.tick();
        for o in registry.lending_tick() {
            loan_event(&recorder, &cache, &o);
        }
        for v in registry.views() {
            if cache.get(&v.name).is_none() && !written.contains_key(&v.name) {
                let obj = json!({
                    "apiVersion": "tessera.io/v1alpha1",
                    "kind": "Shard",
                    "metadata": {"name": v.name, "labels": v.labels},
                    "spec": {},
                });
                match client.create(shards, None, &obj).await {
                    Ok(_) => tracing::info!(shard = %v.name, "Shard object created"),
                    Err(e) if e.code == 409 => {}
                    Err(e) => {
                        tracing::warn!(shard = %v.name, error = %e.message, "creating the Shard object");
                        continue;
                    }
                }
            } else if let Some(obj) = cache.get(&v.name) {
                // Labels the agent registers with are laid over the object's (an admin's
                // own labels stay).
                let have = obj.metadata.labels.clone().unwrap_or_default();
                if v.labels.iter().any(|(k, val)| have.get(k) != Some(val)) {
                    let patch = json!({"metadata": {"labels": v.labels}});
                    if let Err(e) = client
                        .patch(shards, None, &v.name, None, PatchType::Merge, &patch)
                        .await
                    {
                        tracing::warn!(shard = %v.name, error = %e.message, "labelling the Shard object");
                    }
                }
            }
            // A lost shard is tainted, as Kubernetes taints an unreachable node: no new
            // work goes there, and `kubectl get shard -o yaml` says why.
            if let Some(obj) = cache.get(&v.name) {
                taint_if_lost(client.as_ref(), shards, &obj, v.ready).await;
            }
            // The renew time shown moves every six renew periods while the lease is held by
            // one session (not at every renewal: an idle fleet is not rewritten each second).
            let now = now_secs();
            let entry = renewed.entry(v.name.clone()).or_insert((None, now));
            if v.ready && (entry.0 != v.session || now - entry.1 >= renew * 6) {
                *entry = (v.session, now);
            }
            let mut status = status_of(&v, lease, entry.1);
            // Ready keeps its transition time while it does not change.
            let old_ready = cache.get(&v.name).and_then(|o| {
                o.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .cloned()
            });
            if let Some(old) = old_ready
                && status["conditions"][0]["status"] == old.status.as_str()
                && let Ok(t) = serde_json::to_value(&old.last_transition_time)
            {
                status["conditions"][0]["lastTransitionTime"] = t;
            }
            let mut comparable = status.clone();
            comparable["conditions"][0]["lastTransitionTime"] = Value::Null;
            if written.get(&v.name) == Some(&comparable) {
                continue;
            }
            let patch = json!({"status": status});
            match client
                .patch(
                    shards,
                    None,
                    &v.name,
                    Some("status"),
                    PatchType::Merge,
                    &patch,
                )
                .await
            {
                Ok(_) => {
                    written.insert(v.name.clone(), comparable);
                }
                Err(e) => {
                    tracing::debug!(shard = %v.name, error = %e.message, "writing the Shard status")
                }
            }
        }
        let (version, weights) = registry.map();
        if version != map_written {
            let body = json!({
                "apiVersion": "tessera.io/v1alpha1",
                "kind": "ShardMap",
                "metadata": {"name": "default"},
                "spec": {
                    "version": version,
                    "shards": weights.iter().map(|w| json!({"name": w.name, "weight": w.weight})).collect::<Vec<_>>(),
                },
            });
            match client
                .apply(
                    maps,
                    None,
                    "default",
                    tessera_client::types::FEDERATION_MANAGER,
                    &body,
                )
                .await
            {
                Ok(_) => map_written = version,
                Err(e) => tracing::warn!(error = %e.message, "writing the ShardMap"),
            }
        }
    }
}
