//! The Deployment controller: one ReplicaSet per pod template (named by the template's
//! hash), rolled from old to new with `maxSurge`/`maxUnavailable` (or Recreate), numbered by
//! revision (so `kubectl rollout history|undo` work), paused and resumed, with old sets kept
//! up to `revisionHistoryLimit`, and status and conditions that `kubectl rollout status`
//! reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use tessera_client::request::PatchType;
use tessera_core::time::{now_secs, rfc3339};
use tessera_runtime::WorkQueue;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::events::{EventType, ObjectRef, Recorder};
use tessera_runtime::informer::{Cache, Change, controller_of, owner_key};
use tessera_runtime::mutation::MutationCache;
use tessera_runtime::selector::from_metav1;

use crate::context::{Context, res};
use crate::pods;

/// The controller's name.
pub const NAME: &str = "deployment-controller";
/// The revision annotation on Deployments and their ReplicaSets.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The Deployment size a ReplicaSet was last sized for.
const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// That size plus maxSurge: what proportional scaling divides by.
const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// The label that tells a template's pods apart.
pub const HASH_LABEL: &str = "pod-template-hash";

struct Deployments {
    ctx: Context,
    deployments: Arc<Cache<Deployment>>,
    sets: Arc<Cache<ReplicaSet>>,
    /// This controller's writes of sets, until `sets` shows them.
    written: MutationCache<ReplicaSet>,
    pods: Arc<Cache<Pod>>,
    recorder: Recorder,
}

/// How long a write is laid over the cache at most (an object deleted meanwhile).
const WRITTEN_TTL: Duration = Duration::from_secs(30);

/// Runs the controller until the future is dropped.
pub async fn run(ctx: Context) {
    let deployments = ctx.informer::<Deployment>(res("apps", "deployments"));
    let sets = ctx.informer::<ReplicaSet>(res("apps", "replicasets"));
    let pods = ctx.informer::<Pod>(res("", "pods"));
    let r = Arc::new(Deployments {
        recorder: ctx.recorder(NAME),
        deployments: deployments.cache().clone(),
        sets: sets.cache().clone(),
        written: MutationCache::new(WRITTEN_TTL),
        pods: pods.cache().clone(),
        ctx: ctx.clone(),
    });
    let set_cache = sets.cache().clone();
    ctx.controller(NAME)
        .watches(&deployments)
        .watches_with(&sets, |c, q| {
            // A set whose status alone moved (its pods progressed) changes the Deployment's
            // status, and the next step of a rollout: such changes are taken together, and
            // with a new set's arrival (mostly this controller's own creation).
            let batched = match c {
                Change::Added(_) => true,
                Change::Updated { old, new } => only_status_moved(old, new),
                Change::Deleted(_) => false,
            };
            match owner_key(&c.object().metadata, "Deployment") {
                Some(key) if batched => q.add_throttled(key, c.class()),
                _ => enqueue_owner(q, &c.object().metadata, "Deployment", c),
            }
        })
        // Pods matter only for Recreate (old pods must be gone before new ones start).
        .watches_with(&pods, move |c, q| {
            if let Change::Deleted(p) = c
                && let Some(rs) =
                    owner_key(&p.metadata, "ReplicaSet").and_then(|k| set_cache.get(&k))
            {
                enqueue_owner(q, &rs.metadata, "Deployment", c);
            }
        })
        .run(r)
        .await;
}

/// Whether only a ReplicaSet's status changed: the same spec (generation), labels,
/// annotations, owners and deletion.
fn only_status_moved(old: &ReplicaSet, new: &ReplicaSet) -> bool {
    let (o, n) = (&old.metadata, &new.metadata);
    o.generation == n.generation
        && o.labels == n.labels
        && o.annotations == n.annotations
        && o.owner_references == n.owner_references
        && o.deletion_timestamp == n.deletion_timestamp
}

fn enqueue_owner<T>(
    q: &WorkQueue<String>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: &str,
    c: &Change<T>,
) {
    if let Some(key) = owner_key(meta, kind) {
        q.add(key, c.class());
    }
}

/// FNV-1a (32 bit) of the template, in the alphabet Kubernetes uses for generated names.
pub fn template_hash(template: &Value, collisions: i32) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let text = template.to_string();
    for b in text.bytes().chain(collisions.to_le_bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = u64::from(h);
    let mut out = Vec::new();
    loop {
        out.push(ALPHABET[(n % ALPHABET.len() as u64) as usize]);
        n /= ALPHABET.len() as u64;
        if n == 0 {
            break;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Resolves `maxSurge`/`maxUnavailable` against `replicas` (percentages: surge rounds up,
/// unavailable rounds down; both zero means one may be unavailable).
pub fn surge_and_unavailable(
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
    replicas: i32,
) -> Result<(i32, i32), String> {
    let resolve = |v: Option<&IntOrString>, up: bool| -> Result<i32, String> {
        match v {
            None => Ok(if up {
                (replicas * 25 + 99) / 100
            } else {
                replicas * 25 / 100
            }),
            Some(IntOrString::Int(i)) => Ok(*i),
            Some(IntOrString::String(s)) => {
                let pct: i32 = s
                    .strip_suffix('%')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("{s:?} is neither a number nor a percentage"))?;
                Ok(if up {
                    (replicas * pct + 99) / 100
                } else {
                    replicas * pct / 100
                })
            }
        }
    };
    let s = resolve(surge, true)?;
    let mut u = resolve(unavailable, false)?;
    if s == 0 && u == 0 {
        u = 1;
    }
    Ok((s, u.min(replicas.max(0))))
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn annotation(rs: &ReplicaSet, key: &str) -> Option<i32> {
    rs.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// The sizes proportional scaling gives a Deployment's active ReplicaSets when it is scaled
/// mid-rollout, as Kubernetes computes them: each set `(replicas, max-replicas annotation)`
/// grows or shrinks by its share of the change — its size times the new
/// `desired + maxSurge` over the total it was sized for — within what is left to add or
/// take away; rounding leftovers go to the first (largest) set. `sets` come largest first.
pub fn proportional_sizes(
    sets: &[(i32, Option<i32>)],
    desired: i32,
    max_surge: i32,
    status_replicas: i32,
) -> Vec<i32> {
    let allowed = if desired > 0 { desired + max_surge } else { 0 };
    let total: i32 = sets.iter().map(|(n, _)| n).sum();
    let to_add = allowed - total;
    let mut sizes: Vec<i32> = sets.iter().map(|(n, _)| *n).collect();
    if to_add == 0 {
        return sizes;
    }
    let mut added = 0;
    for (i, (n, max)) in sets.iter().enumerate() {
        if *n == 0 || added == to_add {
            continue;
        }
        let fraction = if desired == 0 {
            -n
        } else {
            let was = max.filter(|m| *m > 0).unwrap_or(status_replicas.max(1));
            (f64::from(*n) * f64::from(desired + max_surge) / f64::from(was)).round() as i32 - n
        };
        let left = to_add - added;
        let share = if to_add > 0 {
            fraction.min(left)
        } else {
            fraction.max(left)
        };
        sizes[i] += share;
        added += share;
    }
    if let Some(first) = sizes.first_mut() {
        *first = (*first + to_add - added).max(0);
    }
    sizes
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

/// Available pods of a set, never more than its spec asks for: right after a scale-down the
/// set's status still counts pods being deleted, and counting them would let the rollout
/// take down more than `maxUnavailable` allows.
fn available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
        .min(spec_replicas(rs))
}

/// The template of `rs` without its hash label, for comparison with a Deployment's.
fn template_without_hash(rs: &ReplicaSet) -> Value {
    let mut t = serde_json::to_value(rs.spec.as_ref().and_then(|s| s.template.as_ref()))
        .unwrap_or(Value::Null);
    if let Some(labels) = t
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(HASH_LABEL);
    }
    t
}

struct Plan<'a> {
    d: &'a Deployment,
    key: &'a str,
}

#[async_trait]
impl Reconciler for Deployments {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(d) = self.deployments.get(key) else {
            return Ok(Action::Done);
        };
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        self.sync(Plan { d: &d, key }).await
    }
}

impl Deployments {
    fn owned_sets(&self, d: &Deployment) -> Vec<Arc<ReplicaSet>> {
        let uid = d.metadata.uid.as_deref().unwrap_or("");
        let controlled =
            |rs: &ReplicaSet| controller_of(&rs.metadata).is_some_and(|o| o.uid == uid);
        // The sets as this controller last wrote them where the cache is behind (a resize
        // decided on a set's older size would be wrong).
        let mut v: Vec<Arc<ReplicaSet>> = self
            .written
            .merge(&self.sets, self.sets.owned_by(uid), |rs| controlled(rs))
            .into_iter()
            .filter(|rs| controlled(rs))
            .collect();
        v.sort_by_key(|rs| {
            (
                rs.metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second()),
                rs.metadata.name.clone(),
            )
        });
        v
    }

    fn event(&self, d: &Deployment, reason: &str, message: &str) {
        self.recorder.event(
            &ObjectRef::new("apps/v1", "Deployment", &d.metadata),
            EventType::Normal,
            reason,
            message,
        );
    }

    async fn sync(&self, plan: Plan<'_>) -> Result<Action, ReconcileError> {
        let d = plan.d;
        let spec = d.spec.clone().unwrap_or_default();
        let desired = spec.replicas.unwrap_or(1).max(0);
        let selector = from_metav1(&spec.selector)
            .map_err(|e| ReconcileError::new(format!("Deployment {}: {e}", plan.key)))?;
        if selector.is_empty() {
            return Ok(Action::Done);
        }
        let template = serde_json::to_value(&spec.template).unwrap_or(Value::Null);
        let sets = self.owned_sets(d);
        let max_revision = sets.iter().map(|rs| revision_of(rs)).max().unwrap_or(0);
        let current = sets
            .iter()
            .find(|rs| template_without_hash(rs) == template)
            .cloned();
        let olds: Vec<Arc<ReplicaSet>> = sets
            .iter()
            .filter(|rs| {
                current
                    .as_ref()
                    .is_none_or(|c| c.metadata.uid != rs.metadata.uid)
            })
            .cloned()
            .collect();
        let paused = spec.paused.unwrap_or(false);
        let strategy = spec
            .strategy
            .as_ref()
            .and_then(|s| s.type_.clone())
            .unwrap_or_else(|| "RollingUpdate".into());
        let (max_surge, max_unavailable) = if strategy == "RollingUpdate" {
            let ru = spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref());
            surge_and_unavailable(
                ru.and_then(|r| r.max_surge.as_ref()),
                ru.and_then(|r| r.max_unavailable.as_ref()),
                desired,
            )
            .map_err(|e| ReconcileError::new(format!("Deployment {}: {e}", plan.key)))?
        } else {
            (0, desired)
        };

        // The new ReplicaSet: found, or created (not while paused).
        let mut created = false;
        let new = match current {
            Some(rs) => {
                if revision_of(&rs) < max_revision {
                    // Rolled back to an old template: it becomes the newest revision.
                    self.set_rs(&rs, None, Some(max_revision + 1), d, max_surge)
                        .await?;
                }
                Some(rs)
            }
            None if paused => None,
            None => {
                let initial =
                    if strategy == "Recreate" || !olds.iter().any(|rs| spec_replicas(rs) > 0) {
                        // Nothing old to replace (or Recreate, which scales up later).
                        if strategy == "Recreate" { 0 } else { desired }
                    } else {
                        0
                    };
                created = sets.is_empty();
                Some(
                    self.create_rs(d, &template, initial, max_revision + 1, max_surge)
                        .await?,
                )
            }
        };
        // Scaled (or paused): resize the sets as they are, and roll on later.
        let scaling = sets.iter().any(|rs| {
            spec_replicas(rs) > 0 && annotation(rs, DESIRED_REPLICAS).is_some_and(|n| n != desired)
        });
        let mut changed = false;
        if paused || scaling {
            changed = self
                .scale(
                    d,
                    new.as_deref(),
                    &olds,
                    desired,
                    max_surge,
                    strategy == "RollingUpdate",
                )
                .await?;
        } else if let Some(new) = &new {
            changed = if strategy == "Recreate" {
                self.recreate(d, new, &olds, desired).await?
            } else {
                self.roll(d, new, &olds, desired, max_surge, max_unavailable)
                    .await?
            };
        }
        self.cleanup(d, &olds, spec.revision_history_limit.unwrap_or(10))
            .await?;
        if created {
            // A new Deployment's first set: its arrival queues the Deployment again, and the
            // status is written then, with the set's first progress, not twice. (A rollout's
            // new set is written at once: the new generation shows as observed.)
            return Ok(Action::Done);
        }
        let requeue = self
            .update_status(
                d,
                new.as_deref(),
                &sets,
                desired,
                max_unavailable,
                paused,
                changed,
            )
            .await?;
        Ok(requeue.map_or(Action::Done, Action::RequeueAfter))
    }

    async fn create_rs(
        &self,
        d: &Deployment,
        template: &Value,
        replicas: i32,
        revision: i64,
        max_surge: i32,
    ) -> Result<Arc<ReplicaSet>, ReconcileError> {
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let name = d.metadata.name.clone().unwrap_or_default();
        let spec = d.spec.clone().unwrap_or_default();
        let collisions = d
            .status
            .as_ref()
            .and_then(|s| s.collision_count)
            .unwrap_or(0);
        let hash = template_hash(template, collisions);
        let mut t = template.clone();
        t["metadata"]["labels"][HASH_LABEL] = json!(hash);
        let mut selector = serde_json::to_value(&spec.selector).unwrap_or(json!({}));
        selector["matchLabels"][HASH_LABEL] = json!(hash);
        let mut labels = t["metadata"]["labels"].clone();
        labels[HASH_LABEL] = json!(hash);
        let owner = pods::owner_ref(
            "apps/v1",
            "Deployment",
            &name,
            d.metadata.uid.as_deref().unwrap_or(""),
        );
        let mut annotations: BTreeMap<String, String> = d
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| {
                k != REVISION && k != "kubectl.kubernetes.io/last-applied-configuration"
            })
            .collect();
        annotations.insert(REVISION.into(), revision.to_string());
        // Both sizes, as Kubernetes sets them on a new set: a later mid-rollout resize divides
        // by max-replicas, not by a Deployment status that may not have caught up.
        let desired = spec.replicas.unwrap_or(1);
        annotations.insert(DESIRED_REPLICAS.into(), desired.to_string());
        annotations.insert(MAX_REPLICAS.into(), (desired + max_surge).to_string());
        let rs = json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("{name}-{hash}"), "namespace": ns, "labels": labels,
                "annotations": annotations, "ownerReferences": [owner]},
            "spec": {"replicas": replicas, "minReadySeconds": spec.min_ready_seconds.unwrap_or(0),
                "selector": selector, "template": t},
        });
        match self
            .ctx
            .client
            .create(res("apps", "replicasets"), Some(&ns), &rs)
            .await
        {
            Ok(v) => {
                self.event(
                    d,
                    "ScalingReplicaSet",
                    &format!("Scaled up replica set {name}-{hash} to {replicas}"),
                );
                serde_json::from_value(v)
                    .map(|rs| self.written.record(rs))
                    .map_err(|e| {
                        ReconcileError::new(format!("a created ReplicaSet did not decode: {e}"))
                    })
            }
            Err(e) if e.code == 409 => {
                // A set of that name exists: ours with an equal template is found next time
                // (the informer is behind); someone else's is a hash collision.
                let existing = self.sets.get(&format!("{ns}/{name}-{hash}"));
                let ours = existing.as_ref().is_some_and(|rs| {
                    controller_of(&rs.metadata)
                        .is_some_and(|o| Some(o.uid.as_str()) == d.metadata.uid.as_deref())
                });
                if existing.is_some() && !ours {
                    let patch = json!({"status": {"collisionCount": collisions + 1}});
                    self.ctx
                        .client
                        .patch(
                            res("apps", "deployments"),
                            Some(&ns),
                            &name,
                            Some("status"),
                            PatchType::Merge,
                            &patch,
                        )
                        .await?;
                }
                Err(ReconcileError::raced(format!(
                    "ReplicaSet {name}-{hash} already exists; retrying"
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sets a ReplicaSet's replicas and/or revision, with its resourceVersion as
    /// precondition (a stale or deposed controller's write fails).
    async fn set_rs(
        &self,
        rs: &ReplicaSet,
        replicas: Option<i32>,
        revision: Option<i64>,
        d: &Deployment,
        max_surge: i32,
    ) -> Result<(), ReconcileError> {
        let mut patch = json!({"metadata": {"resourceVersion": rs.metadata.resource_version}});
        let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let mut ann = json!({
            DESIRED_REPLICAS: desired.to_string(),
            MAX_REPLICAS: (desired + max_surge).to_string(),
        });
        if let Some(r) = revision {
            ann[REVISION] = json!(r.to_string());
        }
        patch["metadata"]["annotations"] = ann;
        if let Some(n) = replicas {
            patch["spec"] = json!({"replicas": n});
        }
        let written = self
            .ctx
            .client
            .patch(
                res("apps", "replicasets"),
                rs.metadata.namespace.as_deref(),
                rs.metadata.name.as_deref().unwrap_or(""),
                None,
                PatchType::Merge,
                &patch,
            )
            .await?;
        if let Ok(w) = serde_json::from_value::<ReplicaSet>(written) {
            self.written.record(w);
        }
        if let Some(n) = replicas {
            let from = spec_replicas(rs);
            let verb = if n > from { "up" } else { "down" };
            self.event(
                d,
                "ScalingReplicaSet",
                &format!(
                    "Scaled {verb} replica set {} from {from} to {n}",
                    rs.metadata.name.as_deref().unwrap_or("")
                ),
            );
        }
        Ok(())
    }

    /// Resizes the sets to a new replica count without rolling (Kubernetes' `scale`): the
    /// only active set (or the newest) takes the count; with the new set complete, the old
    /// ones go; mid-rollout, the active sets share the change in proportion to their sizes.
    /// True if anything was written.
    async fn scale(
        &self,
        d: &Deployment,
        new: Option<&ReplicaSet>,
        olds: &[Arc<ReplicaSet>],
        desired: i32,
        max_surge: i32,
        rolling: bool,
    ) -> Result<bool, ReconcileError> {
        let mut active: Vec<&ReplicaSet> = new
            .into_iter()
            .chain(olds.iter().map(|rs| &**rs))
            .filter(|rs| spec_replicas(rs) > 0)
            .collect();
        let stale = |rs: &ReplicaSet| annotation(rs, DESIRED_REPLICAS) != Some(desired);
        if active.len() <= 1 {
            let target = active
                .first()
                .copied()
                .or(new)
                .or_else(|| olds.iter().max_by_key(|rs| revision_of(rs)).map(|rs| &**rs));
            let Some(t) = target else { return Ok(false) };
            if spec_replicas(t) == desired && !stale(t) {
                return Ok(false);
            }
            let n = (spec_replicas(t) != desired).then_some(desired);
            self.set_rs(t, n, None, d, max_surge).await?;
            return Ok(true);
        }
        if let Some(n) = new
            && spec_replicas(n) == desired
            && available(n) == desired
        {
            for rs in olds.iter().filter(|rs| spec_replicas(rs) > 0) {
                self.set_rs(rs, Some(0), None, d, max_surge).await?;
            }
            return Ok(true);
        }
        if !rolling {
            return Ok(false);
        }
        let total: i32 = active.iter().map(|rs| spec_replicas(rs)).sum();
        let growing = desired + max_surge > total;
        // Largest first; among equals the newer first when growing, the older when shrinking.
        active.sort_by(|a, b| {
            spec_replicas(b).cmp(&spec_replicas(a)).then_with(|| {
                if growing {
                    revision_of(b).cmp(&revision_of(a))
                } else {
                    revision_of(a).cmp(&revision_of(b))
                }
            })
        });
        let shape: Vec<(i32, Option<i32>)> = active
            .iter()
            .map(|rs| (spec_replicas(rs), annotation(rs, MAX_REPLICAS)))
            .collect();
        let status_replicas = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let sizes = proportional_sizes(&shape, desired, max_surge, status_replicas);
        let mut wrote = false;
        for (rs, size) in active.iter().zip(sizes) {
            if size != spec_replicas(rs) || stale(rs) {
                let n = (size != spec_replicas(rs)).then_some(size);
                self.set_rs(rs, n, None, d, max_surge).await?;
                wrote = true;
            }
        }
        Ok(wrote)
    }

    /// One step of a rolling update; true if a set was scaled.
    async fn roll(
        &self,
        d: &Deployment,
        new: &ReplicaSet,
        olds: &[Arc<ReplicaSet>],
        desired: i32,
        max_surge: i32,
        max_unavailable: i32,
    ) -> Result<bool, ReconcileError> {
        let all: i32 = spec_replicas(new) + olds.iter().map(|rs| spec_replicas(rs)).sum::<i32>();
        // Scale the new set up, within desired + maxSurge in total (of the sets' specs, as
        // Kubernetes counts: an old set's pods of a scale-down may live on for a moment, until
        // its controller has deleted them).
        let new_count = spec_replicas(new);
        if new_count > desired {
            self.set_rs(new, Some(desired), None, d, max_surge).await?;
            return Ok(true);
        }
        if new_count < desired {
            let room = desired + max_surge - all;
            let up = room.min(desired - new_count);
            if up > 0 {
                self.set_rs(new, Some(new_count + up), None, d, max_surge)
                    .await?;
                return Ok(true);
            }
        }
        // Scale old sets down, keeping desired - maxUnavailable available.
        let old_total: i32 = olds.iter().map(|rs| spec_replicas(rs)).sum();
        if old_total == 0 {
            return Ok(false);
        }
        let min_available = desired - max_unavailable;
        let new_unavailable = (spec_replicas(new) - available(new)).max(0);
        let mut budget = all - min_available - new_unavailable;
        if budget <= 0 {
            return Ok(false);
        }
        let mut scaled = false;
        // First the old pods that are not available anyway.
        for rs in olds {
            let unhealthy = spec_replicas(rs) - available(rs);
            if budget <= 0 || unhealthy <= 0 || spec_replicas(rs) == 0 {
                continue;
            }
            let down = unhealthy.min(budget);
            self.set_rs(rs, Some(spec_replicas(rs) - down), None, d, max_surge)
                .await?;
            budget -= down;
            scaled = true;
        }
        if scaled {
            return Ok(true);
        }
        // Then available ones, oldest sets first, as long as enough stay available.
        let available_now: i32 = available(new) + olds.iter().map(|rs| available(rs)).sum::<i32>();
        let mut left = available_now - min_available;
        for rs in olds {
            if left <= 0 {
                break;
            }
            let n = spec_replicas(rs);
            if n == 0 {
                continue;
            }
            let down = n.min(left);
            self.set_rs(rs, Some(n - down), None, d, max_surge).await?;
            left -= down;
            scaled = true;
        }
        Ok(scaled)
    }

    /// Recreate: every old pod gone before the new set scales up.
    async fn recreate(
        &self,
        d: &Deployment,
        new: &ReplicaSet,
        olds: &[Arc<ReplicaSet>],
        desired: i32,
    ) -> Result<bool, ReconcileError> {
        let mut scaled = false;
        for rs in olds {
            if spec_replicas(rs) > 0 {
                self.set_rs(rs, Some(0), None, d, 0).await?;
                scaled = true;
            }
        }
        if scaled {
            return Ok(true);
        }
        let old_pods_left = olds.iter().any(|rs| {
            let uid = rs.metadata.uid.as_deref().unwrap_or("");
            self.pods
                .owned_by(uid)
                .iter()
                .any(|p| !pods::is_terminal(p))
        });
        if old_pods_left {
            return Ok(false);
        }
        if spec_replicas(new) != desired {
            self.set_rs(new, Some(desired), None, d, 0).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Deletes old sets with nothing left beyond `limit`, oldest revisions first.
    async fn cleanup(
        &self,
        d: &Deployment,
        olds: &[Arc<ReplicaSet>],
        limit: i32,
    ) -> Result<(), ReconcileError> {
        let mut empty: Vec<&Arc<ReplicaSet>> = olds
            .iter()
            .filter(|rs| {
                spec_replicas(rs) == 0
                    && rs.status.as_ref().map_or(0, |s| s.replicas) == 0
                    && rs.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let extra = empty.len() as i64 - i64::from(limit.max(0));
        if extra <= 0 {
            return Ok(());
        }
        empty.sort_by_key(|rs| revision_of(rs));
        for rs in empty.into_iter().take(extra as usize) {
            match self
                .ctx
                .client
                .delete(
                    res("apps", "replicasets"),
                    d.metadata.namespace.as_deref(),
                    rs.metadata.name.as_deref().unwrap_or(""),
                    None,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn update_status(
        &self,
        d: &Deployment,
        new: Option<&ReplicaSet>,
        sets: &[Arc<ReplicaSet>],
        desired: i32,
        max_unavailable: i32,
        paused: bool,
        changed: bool,
    ) -> Result<Option<Duration>, ReconcileError> {
        let sum = |f: &dyn Fn(&ReplicaSet) -> i32| sets.iter().map(|rs| f(rs)).sum::<i32>();
        let replicas = sum(&|rs| rs.status.as_ref().map_or(0, |s| s.replicas));
        let ready = sum(&|rs| {
            rs.status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0)
        });
        let avail = sum(&|rs| available(rs));
        let total_spec = sum(&|rs| spec_replicas(rs));
        let updated = new.map_or(0, |rs| rs.status.as_ref().map_or(0, |s| s.replicas));
        let generation = d.metadata.generation.unwrap_or(0);
        let complete = new.is_some()
            && updated == desired
            && replicas == desired
            && avail == desired
            && !paused;
        let now = rfc3339(now_secs());
        let old = d.status.clone().unwrap_or_default();
        let old_conds = old.conditions.clone().unwrap_or_default();
        let find = |t: &str| old_conds.iter().find(|c| c.type_ == t);
        let is_available = avail >= desired - max_unavailable;
        let mut conditions = Vec::new();
        let (a_status, a_reason, a_msg) = if is_available {
            (
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        } else {
            (
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        };
        conditions.push(condition(
            find("Available"),
            "Available",
            a_status,
            a_reason,
            a_msg,
            &now,
            false,
        ));
        let new_name = new
            .and_then(|rs| rs.metadata.name.clone())
            .unwrap_or_default();
        let deadline = d
            .spec
            .as_ref()
            .and_then(|s| s.progress_deadline_seconds)
            .unwrap_or(600);
        let prev = find("Progressing");
        let (p_status, p_reason, p_msg, touch) = if paused {
            (
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".to_owned(),
                false,
            )
        } else if complete {
            (
                "True",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{new_name}\" has successfully progressed."),
                false,
            )
        } else if changed || prev.is_none_or(|c| c.reason.as_deref() == Some("DeploymentPaused")) {
            (
                "True",
                "ReplicaSetUpdated",
                format!("ReplicaSet \"{new_name}\" is progressing."),
                true,
            )
        } else {
            let since = prev
                .and_then(|c| c.last_update_time.as_ref())
                .map_or(now_secs(), |t| t.0.as_second());
            if prev.is_some_and(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
                || now_secs() - since > i64::from(deadline)
            {
                (
                    "False",
                    "ProgressDeadlineExceeded",
                    format!("ReplicaSet \"{new_name}\" has timed out progressing."),
                    false,
                )
            } else {
                (
                    "True",
                    "ReplicaSetUpdated",
                    format!("ReplicaSet \"{new_name}\" is progressing."),
                    false,
                )
            }
        };
        conditions.push(condition(
            prev,
            "Progressing",
            p_status,
            p_reason,
            &p_msg,
            &now,
            touch,
        ));
        let status = json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": avail,
            "unavailableReplicas": (total_spec - avail).max(0),
            "conditions": conditions,
            "collisionCount": old.collision_count,
        });
        let old_value = serde_json::to_value(&old).unwrap_or(Value::Null);
        let same = [
            "observedGeneration",
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
        ]
        .iter()
        .all(|k| old_value[*k].as_i64().unwrap_or(0) == status[*k].as_i64().unwrap_or(0))
            && same_conditions(&old_value["conditions"], &status["conditions"]);
        let mut revision_patch = None;
        let max_revision = sets.iter().map(|rs| revision_of(rs)).max().unwrap_or(0);
        let current_revision = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REVISION))
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        let new_revision = new.map_or(max_revision, revision_of);
        if new_revision > 0 && new_revision != current_revision {
            revision_patch =
                Some(json!({"metadata": {"annotations": {REVISION: new_revision.to_string()}}}));
        }
        let ns = d.metadata.namespace.as_deref();
        let name = d.metadata.name.as_deref().unwrap_or("");
        if let Some(p) = revision_patch {
            self.ctx
                .client
                .patch(
                    res("apps", "deployments"),
                    ns,
                    name,
                    None,
                    PatchType::Merge,
                    &p,
                )
                .await?;
        }
        if !same {
            match self
                .ctx
                .client
                .patch(
                    res("apps", "deployments"),
                    ns,
                    name,
                    Some("status"),
                    PatchType::Merge,
                    &json!({"status": status}),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        // Until complete, look again by the progress deadline.
        Ok((!complete && !paused)
            .then(|| Duration::from_secs(u64::from(deadline.max(1) as u32) + 1)))
    }
}

fn condition(
    prev: Option<&k8s_openapi::api::apps::v1::DeploymentCondition>,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &str,
    touch: bool,
) -> Value {
    let same_status = prev.is_some_and(|c| c.status == status);
    let same_reason = prev.is_some_and(|c| c.reason.as_deref() == Some(reason));
    let ts = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map(|t| rfc3339(t.0.as_second()))
    };
    let transition = if same_status {
        ts(prev.and_then(|c| c.last_transition_time.as_ref())).unwrap_or_else(|| now.to_owned())
    } else {
        now.to_owned()
    };
    let update = if same_status && same_reason && !touch {
        ts(prev.and_then(|c| c.last_update_time.as_ref())).unwrap_or_else(|| now.to_owned())
    } else {
        now.to_owned()
    };
    json!({"type": kind, "status": status, "reason": reason, "message": message,
        "lastUpdateTime": update, "lastTransitionTime": transition})
}

fn same_conditions(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Vec<Value> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                json!([
                    c["type"],
                    c["status"],
                    c["reason"],
                    c["message"],
                    c["lastUpdateTime"]
                ])
            })
            .collect()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surge_and_unavailable_round_like_kubernetes() {
        let pct = |s: &str| Some(IntOrString::String(s.into()));
        let int = |i: i32| Some(IntOrString::Int(i));
        let cases = [
            (None, None, 10, (3, 2)),
            (pct("25%"), pct("25%"), 4, (1, 1)),
            (pct("10%"), pct("10%"), 5, (1, 0)),
            (int(0), int(0), 5, (0, 1)),
            (int(2), int(20), 5, (2, 5)),
            (pct("100%"), int(0), 3, (3, 0)),
        ];
        for (s, u, n, want) in cases {
            assert_eq!(
                surge_and_unavailable(s.as_ref(), u.as_ref(), n).expect("valid"),
                want,
                "{s:?} {u:?} {n}"
            );
        }
        assert!(surge_and_unavailable(pct("x%").as_ref(), None, 3).is_err());
    }

    #[test]
    fn scaling_mid_rollout_is_proportional() {
        // 10 replicas with maxSurge 3, mid-rollout at 8 old + 5 new (sized for 13), scaled
        // to 15 (18 with surge): each grows by its share.
        assert_eq!(
            proportional_sizes(&[(8, Some(13)), (5, Some(13))], 15, 3, 13),
            [11, 7]
        );
        // Scaled down to 5 (7 with surge 2): each shrinks by its share, leftovers to the first.
        assert_eq!(
            proportional_sizes(&[(11, Some(18)), (7, Some(18))], 5, 2, 18),
            [4, 3]
        );
        // To zero: everything goes.
        assert_eq!(
            proportional_sizes(&[(4, Some(7)), (3, Some(7))], 0, 0, 7),
            [0, 0]
        );
        // Already the allowed size: unchanged.
        assert_eq!(
            proportional_sizes(&[(8, Some(13)), (5, Some(13))], 10, 3, 13),
            [8, 5]
        );
        // No annotation: sized against the Deployment's status count.
        assert_eq!(
            proportional_sizes(&[(6, None), (6, None)], 20, 4, 12),
            [12, 12]
        );
        // The sum is always what is allowed.
        for (a, b, desired, surge) in [(7, 3, 31, 5), (1, 9, 3, 1), (50, 49, 200, 50)] {
            let sizes =
                proportional_sizes(&[(a, Some(a + b)), (b, Some(a + b))], desired, surge, a + b);
            assert_eq!(
                sizes.iter().sum::<i32>(),
                desired + surge,
                "{a} {b} {desired} {surge}"
            );
        }
    }

    #[test]
    fn template_hashes_are_stable_and_differ() {
        let a = json!({"spec": {"containers": [{"name": "c", "image": "nginx:1"}]}});
        let b = json!({"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}});
        assert_eq!(template_hash(&a, 0), template_hash(&a, 0));
        assert_ne!(template_hash(&a, 0), template_hash(&b, 0));
        assert_ne!(
            template_hash(&a, 0),
            template_hash(&a, 1),
            "a collision changes the name"
        );
        assert!(
            template_hash(&a, 0)
                .chars()
                .all(|c| c.is_ascii_alphanumeric())
        );
    }
}
