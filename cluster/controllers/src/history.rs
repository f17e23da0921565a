//! Revision history of DaemonSets and StatefulSets as `ControllerRevision`s, as Kubernetes
//! keeps it: one per pod template, named `<owner>-<hash>` (the hash is the pods'
//! `controller-revision-hash` label), holding a patch that puts the template back
//! (`{"spec":{"template":{..., "$patch":"replace"}}}`) and a revision number. Going back to
//! an earlier template gives its revision the next number. `kubectl rollout history` lists
//! them and `kubectl rollout undo` applies one's patch to the owner.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use tessera_client::request::PatchType;
use tessera_runtime::controller::ReconcileError;
use tessera_runtime::informer::{Cache, controller_of};

use crate::context::{Context, res};

/// The pod label naming a template's revision.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// What a revision is about: its owner and the owner's current template.
pub struct Owner<'a> {
    /// `apps/v1`.
    pub api_version: &'a str,
    /// `DaemonSet` or `StatefulSet`.
    pub kind: &'a str,
    /// The owner's metadata.
    pub meta: &'a ObjectMeta,
    /// Its pod template.
    pub template: &'a Value,
    /// Its `revisionHistoryLimit`.
    pub limit: i32,
}

/// An owner's revisions, from the controller's cache.
pub struct History {
    ctx: Context,
    revisions: Arc<Cache<ControllerRevision>>,
}

/// The name of an owner's revision for template hash `hash`.
pub fn revision_name(owner: &str, hash: &str) -> String {
    format!("{owner}-{hash}")
}

impl History {
    /// Revisions read from `revisions`, written through `ctx`.
    pub fn new(ctx: Context, revisions: Arc<Cache<ControllerRevision>>) -> History {
        History { ctx, revisions }
    }

    fn owned(&self, uid: &str) -> Vec<Arc<ControllerRevision>> {
        self.revisions
            .owned_by(uid)
            .into_iter()
            .filter(|r| controller_of(&r.metadata).is_some_and(|o| o.uid == uid))
            .collect()
    }

    /// Makes sure the current template (hash `hash`) has the newest revision, and prunes
    /// unused old ones past the owner's limit (`in_use`: hashes live pods still carry).
    /// Returns the current revision's number.
    pub async fn sync(
        &self,
        owner: &Owner<'_>,
        hash: &str,
        in_use: &HashSet<String>,
    ) -> Result<i64, ReconcileError> {
        let meta = owner.meta;
        let ns = meta.namespace.as_deref();
        let uid = meta.uid.as_deref().unwrap_or_default();
        let name = revision_name(meta.name.as_deref().unwrap_or_default(), hash);
        let revisions = self.owned(uid);
        let newest = revisions.iter().map(|r| r.revision).max().unwrap_or(0);
        let crs = res("apps", "controllerrevisions");
        let current = match revisions
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
        {
            Some(r) if r.revision == newest => r.revision,
            Some(r) => {
                // Back to an earlier template: it becomes the newest revision.
                let patch = json!({"metadata": {"resourceVersion": r.metadata.resource_version},
                    "revision": newest + 1});
                self.ctx
                    .client
                    .patch(crs, ns, &name, None, PatchType::Merge, &patch)
                    .await?;
                newest + 1
            }
            None => {
                let mut labels = owner.template["metadata"]["labels"].clone();
                if !labels.is_object() {
                    labels = json!({});
                }
                labels[REVISION_LABEL] = json!(hash);
                let mut template = owner.template.clone();
                template["$patch"] = json!("replace");
                let obj = json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                    "metadata": {"name": name, "namespace": ns, "labels": labels,
                        "annotations": meta.annotations,
                        "ownerReferences": [{"apiVersion": owner.api_version, "kind": owner.kind,
                            "name": meta.name, "uid": uid, "controller": true,
                            "blockOwnerDeletion": true}]},
                    "data": {"spec": {"template": template}},
                    "revision": newest + 1});
                match self.ctx.client.create(crs, ns, &obj).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {
                        // Ours, and the cache is behind; or another owner's of that name.
                        let there = self.ctx.client.get(crs, ns, &name).await?;
                        let ours = there["metadata"]["ownerReferences"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|o| o["uid"] == uid);
                        if !ours {
                            return Err(ReconcileError::new(format!(
                                "ControllerRevision {name} exists and belongs to someone else"
                            )));
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
                newest + 1
            }
        };
        // Prune: the oldest unused revisions beyond the limit.
        let mut old: Vec<&Arc<ControllerRevision>> = revisions
            .iter()
            .filter(|r| r.metadata.name.as_deref() != Some(name.as_str()))
            .filter(|r| {
                let h = r
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(REVISION_LABEL));
                h.is_none_or(|h| !in_use.contains(h))
            })
            .collect();
        let excess = old.len().saturating_sub(owner.limit.max(0) as usize);
        old.sort_by_key(|r| r.revision);
        for r in old.into_iter().take(excess) {
            let gone = self
                .ctx
                .client
                .delete(
                    crs,
                    ns,
                    r.metadata.name.as_deref().unwrap_or_default(),
                    None,
                )
                .await;
            if let Err(e) = gone
                && e.code != 404
            {
                return Err(e.into());
            }
        }
        Ok(current)
    }
}
