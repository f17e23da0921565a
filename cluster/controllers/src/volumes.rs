//! The volume binder and Tessera's hostPath provisioner: a PersistentVolumeClaim is bound to
//! a PersistentVolume that fits it — the one it names, else the smallest Available one of its
//! StorageClass with its access modes and at least its size — or, when none fits and its
//! class's provisioner is `tessera.io/hostpath`, to a new volume made for it: a directory
//! under the class's `parameters.root` (`pvc-<claim uid>`), which the process agent of
//! whichever node runs the pod makes on first use. A claim deleted releases its volume; a
//! provisioned one whose class says `reclaimPolicy: Delete` is deleted (its directory stays
//! on the node).
//!
//! Binding writes the volume first (its `claimRef`, then `status.phase: Bound`), then the
//! claim (`spec.volumeName`, then its status): a claim is never shown Bound to a volume that
//! does not name it, and two claims never take one volume (the volume's write is a
//! compare-and-swap on its resourceVersion).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};
use tessera_client::request::PatchType;
use tessera_core::quantity::Quantity;
use tessera_runtime::EventClass;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Cache, Change, key_of};

use crate::context::{Context, res};

/// The controller's name.
pub const NAME: &str = "persistentvolume-binder";

/// The provisioner of Tessera's hostPath volumes.
pub const HOSTPATH_PROVISIONER: &str = "tessera.io/hostpath";
/// The annotation that marks a StorageClass the default.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The annotation naming who provisioned a volume.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Where hostPath volumes go when the class names no `parameters.root`.
pub const DEFAULT_ROOT: &str = "/var/lib/tessera/volumes";

struct Binder {
    ctx: Context,
    claims: Arc<Cache<PersistentVolumeClaim>>,
    volumes: Arc<Cache<PersistentVolume>>,
    classes: Arc<Cache<StorageClass>>,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let claims = ctx.informer::<PersistentVolumeClaim>(res("", "persistentvolumeclaims"));
    let volumes = ctx.informer::<PersistentVolume>(res("", "persistentvolumes"));
    let classes = ctx.informer::<StorageClass>(res("storage.k8s.io", "storageclasses"));
    let r = Arc::new(Binder {
        ctx: ctx.clone(),
        claims: claims.cache().clone(),
        volumes: volumes.cache().clone(),
        classes: classes.cache().clone(),
    });
    let pending = claims.cache().clone();
    ctx.controller(NAME)
        .watches(&claims)
        // A volume's change concerns the claim it names; a new or freed volume, or a new
        // class, may fit a claim that waits.
        .watches_with(&volumes, move |c, q| {
            if let Some(r) = c.object().spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
                q.add(
                    format!(
                        "{}/{}",
                        r.namespace.as_deref().unwrap_or_default(),
                        r.name.as_deref().unwrap_or_default()
                    ),
                    c.class(),
                );
            }
            if !matches!(c, Change::Deleted(_)) {
                for claim in pending.list() {
                    if phase(&claim) == "Pending" {
                        q.add(key_of(&claim.metadata), EventClass::Resync);
                    }
                }
            }
        })
        .reads(&classes)
        .run(r)
        .await;
}

fn phase(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn storage(
    q: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Quantity {
    q.and_then(|m| m.get("storage"))
        .and_then(|s| s.0.parse().ok())
        .unwrap_or(Quantity::ZERO)
}

/// Whether volume `pv` can take claim `c` of class `class`: free (or already naming this
/// claim), of the class, with every access mode the claim asks and at least its size.
pub fn fits(pv: &PersistentVolume, c: &PersistentVolumeClaim, class: &str) -> bool {
    let (Some(spec), Some(cspec)) = (pv.spec.as_ref(), c.spec.as_ref()) else {
        return false;
    };
    let free = match &spec.claim_ref {
        None => true,
        Some(r) => {
            r.name == c.metadata.name
                && r.namespace == c.metadata.namespace
                && r.uid
                    .as_ref()
                    .is_none_or(|u| Some(u) == c.metadata.uid.as_ref())
        }
    };
    let modes = spec.access_modes.clone().unwrap_or_default();
    free && pv.metadata.deletion_timestamp.is_none()
        && spec.storage_class_name.as_deref().unwrap_or_default() == class
        && cspec
            .access_modes
            .iter()
            .flatten()
            .all(|m| modes.contains(m))
        && storage(spec.capacity.as_ref())
            >= storage(cspec.resources.as_ref().and_then(|r| r.requests.as_ref()))
}

impl Binder {
    /// The claim's class: the one it names, else the default class (`""` if none).
    fn class_of(&self, c: &PersistentVolumeClaim) -> String {
        if let Some(name) = c.spec.as_ref().and_then(|s| s.storage_class_name.clone()) {
            return name;
        }
        self.classes
            .list()
            .into_iter()
            .find(|sc| {
                sc.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                    .is_some_and(|v| v == "true")
            })
            .and_then(|sc| sc.metadata.name.clone())
            .unwrap_or_default()
    }

    async fn patch(
        &self,
        plural: &str,
        ns: Option<&str>,
        name: &str,
        sub: Option<&str>,
        patch: Value,
    ) -> Result<(), tessera_client::status::ApiError> {
        self.ctx
            .client
            .patch(res("", plural), ns, name, sub, PatchType::Merge, &patch)
            .await
            .map(|_| ())
    }

    /// Binds claim `c` to volume `pv` (see the module's order of writes).
    async fn bind(
        &self,
        c: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<(), tessera_client::status::ApiError> {
        let (ns, name) = (
            c.metadata.namespace.as_deref().unwrap_or_default(),
            c.metadata.name.as_deref().unwrap_or_default(),
        );
        let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
        let claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": ns, "name": name, "uid": c.metadata.uid,
            "resourceVersion": c.metadata.resource_version});
        let named = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some_and(|r| {
                r.uid
                    .as_ref()
                    .is_some_and(|u| Some(u) == c.metadata.uid.as_ref())
            });
        if !named {
            self.patch(
                "persistentvolumes",
                None,
                pv_name,
                None,
                json!({"metadata": {"resourceVersion": pv.metadata.resource_version},
                    "spec": {"claimRef": claim_ref}}),
            )
            .await?;
        }
        self.patch(
            "persistentvolumes",
            None,
            pv_name,
            Some("status"),
            json!({"status": {"phase": "Bound"}}),
        )
        .await?;
        if c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) != Some(pv_name) {
            self.patch(
                "persistentvolumeclaims",
                Some(ns),
                name,
                None,
                json!({"spec": {"volumeName": pv_name}}),
            )
            .await?;
        }
        let spec = pv.spec.clone().unwrap_or_default();
        self.patch(
            "persistentvolumeclaims",
            Some(ns),
            name,
            Some("status"),
            json!({"status": {"phase": "Bound", "accessModes": spec.access_modes,
                "capacity": spec.capacity}}),
        )
        .await
    }

    /// A new hostPath volume for claim `c` of class `class`.
    async fn provision(
        &self,
        c: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<(), tessera_client::status::ApiError> {
        let uid = c.metadata.uid.clone().unwrap_or_default();
        let name = format!("pvc-{uid}");
        let root = class
            .parameters
            .as_ref()
            .and_then(|p| p.get("root"))
            .cloned()
            .unwrap_or_else(|| DEFAULT_ROOT.to_owned());
        let spec = c.spec.clone().unwrap_or_default();
        let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY: HOSTPATH_PROVISIONER},
            "labels": {"tessera.io/claim-namespace": c.metadata.namespace}},
        "spec": {
            "capacity": {"storage": storage(spec.resources.as_ref().and_then(|r| r.requests.as_ref())).to_string()},
            "accessModes": spec.access_modes,
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class.metadata.name,
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "hostPath": {"path": format!("{}/{name}", root.trim_end_matches('/')),
                "type": "DirectoryOrCreate"},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": c.metadata.namespace, "name": c.metadata.name, "uid": uid},
        }});
        match self
            .ctx
            .client
            .create(res("", "persistentvolumes"), None, &pv)
            .await
        {
            // Its event brings the claim back here to be bound.
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The volume that named claim `key` (now gone): released, or deleted if it was
    /// provisioned for it with `reclaimPolicy: Delete`.
    async fn release(&self, key: &str) -> Result<Action, ReconcileError> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        for pv in self.volumes.list() {
            let Some(spec) = pv.spec.as_ref() else {
                continue;
            };
            let named = spec.claim_ref.as_ref().is_some_and(|r| {
                r.namespace.as_deref() == Some(ns) && r.name.as_deref() == Some(name)
            });
            if !named {
                continue;
            }
            let pv_name = pv.metadata.name.clone().unwrap_or_default();
            let provisioned = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PROVISIONED_BY))
                .is_some_and(|p| p == HOSTPATH_PROVISIONER);
            let result = if provisioned
                && spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete")
            {
                self.ctx
                    .client
                    .delete(res("", "persistentvolumes"), None, &pv_name, None)
                    .await
                    .map(|_| ())
            } else if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released") {
                self.patch(
                    "persistentvolumes",
                    None,
                    &pv_name,
                    Some("status"),
                    json!({"status": {"phase": "Released"}}),
                )
                .await
            } else {
                Ok(())
            };
            match result {
                Ok(()) => {}
                Err(e) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::Done)
    }
}

#[async_trait]
impl Reconciler for Binder {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(c) = self.claims.get(key) else {
            return self.release(key).await;
        };
        if c.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let class = self.class_of(&c);
        let wanted = c.spec.as_ref().and_then(|s| s.volume_name.clone());
        let volumes = self.volumes.list();
        let chosen = match &wanted {
            Some(v) => volumes
                .iter()
                .find(|pv| pv.metadata.name.as_ref() == Some(v) && fits(pv, &c, &class)),
            None => volumes
                .iter()
                .filter(|pv| fits(pv, &c, &class))
                // One made for this claim first, then the smallest that fits.
                .min_by_key(|pv| {
                    let mine = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_some();
                    (
                        !mine,
                        storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())),
                    )
                }),
        };
        let bound = phase(&c) == "Bound";
        match chosen {
            Some(pv) => {
                let pv_bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                if bound && pv_bound {
                    return Ok(Action::Done);
                }
                match self.bind(&c, pv).await {
                    Ok(()) => Ok(Action::Done),
                    // Someone wrote meanwhile: the watch brings it back.
                    Err(e) if e.code == 409 || e.code == 404 => Ok(Action::Done),
                    Err(e) => Err(e.into()),
                }
            }
            None if bound || wanted.is_some() => Ok(Action::Done),
            None => {
                let Some(sc) = self.classes.get(&class) else {
                    return Ok(Action::Done);
                };
                if sc.provisioner != HOSTPATH_PROVISIONER {
                    return Ok(Action::Done);
                }
                self.provision(&c, &sc).await?;
                Ok(Action::Done)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(size: &str, modes: &[&str]) -> PersistentVolumeClaim {
        serde_json::from_value(
            json!({"metadata": {"name": "c", "namespace": "t", "uid": "u1"},
            "spec": {"accessModes": modes, "resources": {"requests": {"storage": size}}}}),
        )
        .expect("claim")
    }

    fn volume(size: &str, modes: &[&str], class: &str, claim: Option<&str>) -> PersistentVolume {
        let mut v = json!({"metadata": {"name": "v"}, "spec": {"capacity": {"storage": size},
            "accessModes": modes, "storageClassName": class, "hostPath": {"path": "/x"}}});
        if let Some(uid) = claim {
            v["spec"]["claimRef"] = json!({"namespace": "t", "name": "c", "uid": uid});
        }
        serde_json::from_value(v).expect("volume")
    }

    #[test]
    fn a_volume_fits_a_claim_by_class_modes_size_and_owner() {
        let c = claim("1Gi", &["ReadWriteOnce"]);
        assert!(fits(&volume("1Gi", &["ReadWriteOnce"], "s", None), &c, "s"));
        assert!(fits(
            &volume("2Gi", &["ReadWriteOnce", "ReadOnlyMany"], "s", None),
            &c,
            "s"
        ));
        assert!(
            !fits(&volume("512Mi", &["ReadWriteOnce"], "s", None), &c, "s"),
            "too small"
        );
        assert!(
            !fits(&volume("1Gi", &["ReadOnlyMany"], "s", None), &c, "s"),
            "mode"
        );
        assert!(
            !fits(&volume("1Gi", &["ReadWriteOnce"], "other", None), &c, "s"),
            "class"
        );
        assert!(
            fits(&volume("1Gi", &["ReadWriteOnce"], "s", Some("u1")), &c, "s"),
            "its own"
        );
        assert!(
            !fits(&volume("1Gi", &["ReadWriteOnce"], "s", Some("u2")), &c, "s"),
            "another's"
        );
    }
}
