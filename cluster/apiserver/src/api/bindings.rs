//! Bindings in batches: concurrent `pods/binding` requests are written to the store
//! together, many in one transaction (a group commit, as etcd's raft batches proposals).
//!
//! A scheduler binds hundreds of pods at once (one request each, from its binding cycles).
//! Each request is checked in its own task, exactly as a lone binding is (the pod read,
//! assigned, decoded, merged, validated, its tenant's stored bytes measured); only the
//! write is shared: the checked writes waiting at one moment go to the store as **one
//! transaction**, each conditional on its pod's revision. The API does not change: each
//! request gets its own answer, and a request that fails its checks fails alone. If the
//! transaction is not written — a pod changed between its read and the write (its compare
//! failed), or the batch was refused whole (a tenant over its stored bytes) — nothing of it
//! was written and each binding in it is done again alone, through the lone path; a
//! second binding of the same pod in one batch is sent there too, where it meets the first
//! one's result. So a binding is never lost or applied twice, and a pod is bound once.
//!
//! The queueing is [`super::group`]'s.

use std::collections::HashSet;

use tokio::sync::oneshot;

use super::*;

/// A checked binding waiting for the committer, and where its outcome goes: true if it was
/// written, false if it must be done again alone.
pub(super) struct Pending {
    prepared: Prepared,
    written: oneshot::Sender<bool>,
}

/// A binding checked and ready to write.
pub(super) struct Prepared {
    /// The write (conditional on the pod's revision).
    pub(super) op: Op,
    /// The pod's namespace and name.
    pub(super) ns: String,
    pub(super) name: String,
    /// Its charged size before and after, when its tenant counts stored bytes.
    pub(super) size: Option<(usize, usize)>,
}

/// Why prepared bindings were not written (then none of them was).
pub(super) enum WriteFailure {
    /// A pod changed since it was read: read again, or bind alone.
    Changed,
    /// Refused (a tenant's stored bytes over quota, the store failing).
    Refused(ApiError),
}

/// The answer to a binding written.
pub(super) fn bound(warnings: Vec<String>) -> ApiResponse {
    ApiResponse::Object {
        code: 201,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        warnings,
    }
}

impl Api {
    /// Checks the binding of the pod `req` names to `node`, then writes it with the other
    /// bindings waiting at that moment (or alone, if that batch is not written).
    pub(super) async fn bind_batched(
        &self,
        req: &ApiRequest,
        user: &User,
        node: String,
    ) -> Result<ApiResponse, ApiError> {
        let ns = req.namespace.clone().unwrap_or_default();
        let name = req.name.clone().unwrap_or_default();
        let prepared = self
            .prepare_binding(&req.params, user, &ns, &name, &node, |_| Ok(()))
            .await?;
        let (written, outcome) = oneshot::channel();
        if self.binds.push(Pending { prepared, written }) {
            // A task, not this request: a caller that goes away must not strand the others.
            let api = self.clone();
            tokio::spawn(async move { api.binds.drain(|batch| api.commit_batch(batch)).await });
        }
        if outcome.await.unwrap_or(false) {
            Ok(bound(Vec::new()))
        } else {
            self.bind_alone(req, user, node).await
        }
    }

    async fn commit_batch(&self, batch: Vec<Pending>) {
        let Ok(pods) = crate::request::find_resource("", "v1", "pods") else {
            return;
        };
        let mut seen = HashSet::with_capacity(batch.len());
        let (mut first, mut again) = (Vec::with_capacity(batch.len()), Vec::new());
        for p in batch {
            if seen.insert((p.prepared.ns.clone(), p.prepared.name.clone())) {
                first.push(p);
            } else {
                again.push(p);
            }
        }
        for p in again {
            let _ = p.written.send(false);
        }
        // One transaction per store backend (and per megabyte).
        let parts = super::group::split(&*self.store, first, |p| &p.prepared.op);
        futures::future::join_all(
            parts
                .into_iter()
                .map(|part| self.commit_bindings_part(pods, part)),
        )
        .await;
    }

    /// Writes one part of a batch in one transaction, or lets each of it bind alone.
    async fn commit_bindings_part(&self, pods: &'static Resource, first: Vec<Pending>) {
        if let Some(m) = &self.metrics {
            m.binding_batch.observe(first.len() as f64);
        }
        let prepared: Vec<&Prepared> = first.iter().map(|p| &p.prepared).collect();
        let written = match self.write_prepared(pods, &prepared).await {
            Ok(()) => true,
            Err(WriteFailure::Changed) => {
                tracing::debug!(
                    bindings = prepared.len(),
                    "a pod changed before its batched binding was written: each binds alone"
                );
                false
            }
            Err(WriteFailure::Refused(e)) => {
                tracing::debug!(bindings = prepared.len(), error = %e, "a batch of bindings was refused whole: each binds alone");
                false
            }
        };
        if let Some(m) = &self.metrics {
            let result = if written { "written" } else { "alone" };
            m.binding_batches.with_label_values(&[result]).inc();
        }
        for p in first {
            let _ = p.written.send(written);
        }
    }

    /// Checks a binding of pod `ns/name` to `node` as a lone binding is checked (`check`
    /// adds the caller's own conditions on the pod as read), without writing it.
    pub(super) async fn prepare_binding(
        &self,
        params: &crate::request::Params,
        user: &User,
        ns: &str,
        name: &str,
        node: &str,
        check: impl Fn(&Value) -> Result<(), ApiError>,
    ) -> Result<Prepared, ApiError> {
        let pods = crate::request::find_resource("", "v1", "pods")?;
        let (current, kv) = self
            .read(pods, Some(ns), name)
            .await?
            .ok_or_else(|| ApiError::not_found("", "pods", name))?;
        check(&current)?;
        let mut pod_req = ApiRequest::new(Verb::Create, pods);
        pod_req.namespace = Some(ns.to_owned());
        pod_req.name = Some(name.to_owned());
        pod_req.subresource = Some("binding".into());
        pod_req.params = params.clone();
        // The stored pod was typed when it was written and `assign` sets only a node name
        // and a condition, so it is not decoded into its type again; it is validated below.
        let proposed = subresources::assign(current.clone(), pods, name, node)?;
        let next = self.merge_update(&pod_req, user, &current, proposed)?;
        let errors = validation::validate(pods, &next);
        if !errors.is_empty() {
            return Err(ApiError::invalid("", "Pod", name, errors.0));
        }
        let size = if self.tenant_counts_bytes(ns).await? {
            Some((
                crate::quota::charged_len(&current),
                crate::quota::charged_len(&next),
            ))
        } else {
            None
        };
        Ok(Prepared {
            op: Op::Update {
                key: kv.key.clone(),
                value: encode(&next)?,
                expected: kv.mod_revision,
                lease: 0,
            },
            ns: ns.to_owned(),
            name: name.to_owned(),
            size,
        })
    }

    /// Writes prepared bindings in one store transaction. Growth in a tenant's stored bytes
    /// is charged before the write and refunded if it fails; shrinking is refunded after.
    pub(super) async fn write_prepared(
        &self,
        pods: &'static Resource,
        prepared: &[&Prepared],
    ) -> Result<(), WriteFailure> {
        let mut charged = Vec::new();
        for p in prepared {
            let Some((old, new)) = p.size else { continue };
            if crate::quota::stored_charge(new) > crate::quota::stored_charge(old) {
                match self
                    .tenant_resize(&p.ns, pods, &p.name, (old, new), false, false)
                    .await
                {
                    Ok(true) => charged.push(*p),
                    Ok(false) => {}
                    Err(e) => {
                        self.refund(pods, &charged, true).await;
                        return Err(WriteFailure::Refused(e));
                    }
                }
            }
        }
        let ops = prepared.iter().map(|p| p.op.clone()).collect();
        match self.store.txn(ops).await {
            Ok(_) => {
                let shrank: Vec<&Prepared> = prepared
                    .iter()
                    .copied()
                    .filter(|p| {
                        p.size.is_some_and(|(old, new)| {
                            crate::quota::stored_charge(new) < crate::quota::stored_charge(old)
                        })
                    })
                    .collect();
                self.refund(pods, &shrank, false).await;
                Ok(())
            }
            Err(e) => {
                self.refund(pods, &charged, true).await;
                Err(if e.precondition().is_some() {
                    WriteFailure::Changed
                } else {
                    WriteFailure::Refused(store_error(e))
                })
            }
        }
    }

    /// Gives back stored-byte charges: growth charged for a write that failed (`undo`), or
    /// shrinking after one that succeeded.
    async fn refund(&self, pods: &'static Resource, which: &[&Prepared], undo: bool) {
        for p in which {
            let Some((old, new)) = p.size else { continue };
            let change = if undo { (new, old) } else { (old, new) };
            if let Err(e) = self
                .tenant_resize(&p.ns, pods, &p.name, change, false, false)
                .await
            {
                tracing::warn!(error = %e, pod = %p.name, "could not refund a tenant's stored bytes");
            }
        }
    }
}
