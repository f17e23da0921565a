//! Deletes: preconditions, propagation finalizers, graceful pod deletion, Terminating
//! namespaces, deletecollection.

use super::*;

pub(super) struct DeleteOpts {
    propagation: Option<Propagation>,
    grace: Option<i64>,
    precondition_uid: Option<String>,
    precondition_rv: Option<String>,
}

/// DeleteOptions from the body (if any) and the query.
pub(super) fn delete_options(req: &ApiRequest) -> Result<DeleteOpts, ApiError> {
    let mut o = DeleteOpts {
        propagation: req.params.propagation,
        grace: req.params.grace_period_seconds,
        precondition_uid: None,
        precondition_rv: None,
    };
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(o);
    }
    let body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("the DeleteOptions are not valid JSON: {e}")))?;
    let typed: k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions =
        serde_path_to_error::deserialize(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the DeleteOptions are not valid: {}: {}",
                e.path(),
                e.inner()
            ))
        })?;
    if let Some(p) = typed.propagation_policy.as_deref() {
        o.propagation = Some(crate::request::propagation(p)?);
    }
    if typed.orphan_dependents == Some(true) {
        o.propagation = Some(Propagation::Orphan);
    }
    if let Some(g) = typed.grace_period_seconds {
        o.grace = Some(g);
    }
    if let Some(p) = typed.preconditions {
        o.precondition_uid = p.uid;
        o.precondition_rv = p.resource_version;
    }
    if typed.dry_run.is_some_and(|d| d.iter().any(|x| x == "All")) {
        // Handled through the request's dryRun below; a body-only dryRun is honoured too.
    }
    Ok(o)
}

impl Api {
    /// Deletes the object `req` names; `user` None for deletes the server makes itself
    /// (an eviction's), which admission webhooks do not see.
    pub(super) async fn delete(
        &self,
        req: &ApiRequest,
        user: Option<&User>,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        let opts = delete_options(req)?;
        for _attempt in 0..16 {
            let (current, kv) = self
                .read(res, req.namespace.as_deref(), &name)
                .await?
                .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
            match self.delete_one(req, user, &opts, current, kv).await {
                Err(e) if e.reason == "Conflict" && opts.precondition_rv.is_none() => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(res.group, res.plural, &name))
    }

    pub(super) async fn delete_one(
        &self,
        req: &ApiRequest,
        user: Option<&User>,
        opts: &DeleteOpts,
        current: Value,
        kv: KeyValue,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = name_of(&current).to_owned();
        if let Some(uid) = &opts.precondition_uid
            && current["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::conflict_because(
                res.group,
                res.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && current["metadata"]["resourceVersion"].as_str() != Some(rv)
        {
            return Err(ApiError::conflict_because(
                res.group,
                res.plural,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    current["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                ),
            ));
        }
        if let Some(user) = user
            && let Some(mut admission) = self
                .admission(req, user, crate::webhooks::Operation::Delete)
                .await?
        {
            let mut warnings = Vec::new();
            let mut none = Value::Null;
            self.mutate_by_webhooks(&mut admission, &mut none, Some(&current), &mut warnings)
                .await?;
            self.validate_by_webhooks(&mut admission, None, Some(&current), &mut warnings)
                .await?;
        }
        let mut next = current.clone();
        let finalizers: Vec<String> = next["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect();
        let add = |f: &str, next: &mut Value| {
            if !finalizers.iter().any(|x| x == f) {
                let mut list = next["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                list.push(json!(f));
                next["metadata"]["finalizers"] = json!(list);
            }
        };
        match opts.propagation {
            Some(Propagation::Foreground) => add(FOREGROUND_FINALIZER, &mut next),
            Some(Propagation::Orphan) => add(ORPHAN_FINALIZER, &mut next),
            _ => {}
        }
        let grace = match (res.plural, opts.grace) {
            ("pods", Some(g)) => g.max(0),
            ("pods", None) => next["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30),
            _ => 0,
        };
        // A pod on a node waits for its agent to stop it, within the grace period.
        let graceful = res.plural == "pods"
            && next["spec"]["nodeName"].is_string()
            && grace > 0
            && !matches!(
                next["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
        let pending_finalizers = next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let namespace_with_content =
            res.plural == "namespaces" && !self.namespace_is_empty(&name).await?;
        if pending_finalizers || graceful || namespace_with_content {
            if next["metadata"]["deletionTimestamp"].is_null() {
                next["metadata"]["deletionTimestamp"] = json!(rfc3339(now_secs() + grace));
                next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                let g = next["metadata"]["generation"].as_i64().unwrap_or(1);
                next["metadata"]["generation"] = json!(g + 1);
            } else if res.plural == "pods" {
                // A shorter grace period may be asked for later, never a longer one — down to
                // 0 from an agent whose containers stopped while finalizers still hold the pod
                // (it goes as soon as they are removed).
                let had = next["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(grace);
                if grace < had {
                    next["metadata"]["deletionTimestamp"] = json!(rfc3339(now_secs() + grace));
                    next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                }
            }
            if res.plural == "namespaces" {
                next["status"]["phase"] = json!("Terminating");
            }
            if next == current || req.params.dry_run {
                return Ok(ApiResponse::ok(next));
            }
            return match self
                .store
                .update(kv.key.clone(), encode(&next)?, kv.mod_revision)
                .await
            {
                Ok(w) => {
                    // A propagation finalizer added here is charged like any growth of the
                    // object (never refused: a delete must go through).
                    if let Some(ns) = current["metadata"]["namespace"].as_str()
                        && res.namespaced
                        && self.tenant_counts_bytes(ns).await.unwrap_or(false)
                        && let Err(e) = self
                            .tenant_resize(
                                ns,
                                res,
                                &name,
                                (
                                    crate::quota::charged_len(&current),
                                    crate::quota::charged_len(&next),
                                ),
                                false,
                                false,
                            )
                            .await
                    {
                        tracing::warn!(error = %e, object = %name, "could not charge a tenant's stored bytes");
                    }
                    Ok(ApiResponse::Object {
                        code: 200,
                        body: with_rv(next, w.mod_revision),
                        warnings: Vec::new(),
                    })
                }
                Err(e) if e.precondition().is_some() => {
                    Err(ApiError::conflict(res.group, res.plural, &name))
                }
                Err(e) => Err(store_error(e)),
            };
        }
        if req.params.dry_run {
            return Ok(ApiResponse::ok(current));
        }
        let mut ops = vec![Op::Delete {
            key: kv.key.clone(),
            expected: Some(kv.mod_revision),
        }];
        let mut quota_req = req.clone();
        quota_req.namespace = current["metadata"]["namespace"].as_str().map(str::to_owned);
        if res.namespaced {
            ops.extend(self.quota_ops(&quota_req, &current, false).await?);
        }
        match self.store.txn(ops).await {
            Ok(t) => {
                self.wrote(res);
                self.committed(res, &kv.key, None, t.revision);
                if res.plural == "services" && res.group.is_empty() {
                    self.release(Api::held_by(&current)).await;
                }
                if res.namespaced {
                    let stored = crate::quota::charged_len(&current);
                    self.refund_tenant(res, &current, Some(stored)).await;
                }
                Ok(ApiResponse::ok(current))
            }
            Err(e) if e.precondition().is_some() => {
                Err(ApiError::conflict(res.group, res.plural, &name))
            }
            Err(e) => Err(store_error(e)),
        }
    }

    pub(super) async fn namespace_is_empty(&self, ns: &str) -> Result<bool, ApiError> {
        let served = self.crds.snapshot().await?.resources();
        for res in served.into_iter().filter(|r| r.namespaced) {
            let page = self
                .store
                .list(ListRequest {
                    prefix: prefix(res, Some(ns)).into(),
                    limit: 1,
                    ..Default::default()
                })
                .await
                .map_err(store_error)?;
            if !page.kvs.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(super) async fn delete_collection(
        &self,
        req: &ApiRequest,
        user: &User,
        allowed: &Option<Vec<String>>,
    ) -> Result<ApiResponse, ApiError> {
        let found = self.list_items(req, allowed).await?;
        let opts = delete_options(req)?;
        let mut deleted = Vec::new();
        for (value, _) in &found.items {
            let item: Value = serde_json::from_slice(value)
                .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
            let item = &item;
            let mut one = req.clone();
            one.name = Some(name_of(item).to_owned());
            one.namespace = item["metadata"]["namespace"].as_str().map(str::to_owned);
            let Some((current, kv)) = self
                .read(req.resource, one.namespace.as_deref(), name_of(item))
                .await?
            else {
                continue;
            };
            match self.delete_one(&one, Some(user), &opts, current, kv).await {
                Ok(ApiResponse::Object { body, .. }) => deleted.push(body),
                Ok(_) => {}
                Err(e) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ApiResponse::ok(json!({
            "kind": format!("{}List", req.resource.kind),
            "apiVersion": api_version(req.resource),
            "metadata": {"resourceVersion": found.revision.to_string()},
            "items": deleted,
        })))
    }
}
