//! Subresources that are not the object itself: `pods/binding` (a pod is bound once, node and
//! `PodScheduled` together), `pods/eviction` (a delete that respects PodDisruptionBudgets —
//! what `kubectl drain` asks for) and `scale` (the autoscaling/v1 Scale view of
//! `spec.replicas`).

use super::*;

/// The Scale of an object: `spec.replicas`, `status.replicas` and the selector, or for a
/// custom resource the paths its CRD's scale subresource names.
pub(super) fn to_scale_plain(
    _res: &Resource,
    custom: Option<&crate::crd::ScalePaths>,
    obj: &Value,
) -> Value {
    let (replicas, status_replicas, selector) = match custom {
        Some(p) => (
            crate::crd::at_path(obj, &p.spec_replicas)
                .and_then(Value::as_i64)
                .unwrap_or(0),
            crate::crd::at_path(obj, &p.status_replicas)
                .and_then(Value::as_i64)
                .unwrap_or(0),
            p.label_selector
                .as_deref()
                .and_then(|s| crate::crd::at_path(obj, s))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        ),
        None => (
            obj["spec"]["replicas"].as_i64().unwrap_or(1),
            obj["status"]["replicas"].as_i64().unwrap_or(0),
            // A ReplicationController's selector is a plain map of labels; the others'
            // are label selectors.
            crate::table::selector_text(&obj["spec"]["selector"]),
        ),
    };
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "uid": obj["metadata"]["uid"],
            "resourceVersion": obj["metadata"]["resourceVersion"],
            "creationTimestamp": obj["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    })
}

pub(super) fn to_scale(
    req: &ApiRequest,
    custom: Option<&crate::crd::ScalePaths>,
    obj: &Value,
) -> Value {
    to_scale_plain(req.resource, custom, obj)
}

/// The object after a write to its Scale: only the replicas (`spec.replicas`, or the
/// custom resource's `specReplicasPath`) change.
pub(super) fn from_scale(
    custom: Option<&crate::crd::ScalePaths>,
    current: &Value,
    scale: &Value,
) -> Result<Value, ApiError> {
    let replicas = scale["spec"]["replicas"].as_i64().unwrap_or(0);
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name_of(current),
            vec![Cause {
                reason: "FieldValueInvalid",
                field: "spec.replicas".into(),
                message: format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            }],
        ));
    }
    let mut next = current.clone();
    match custom {
        Some(p) => crate::crd::set_path(&mut next, &p.spec_replicas, json!(replicas)),
        None => next["spec"]["replicas"] = json!(replicas),
    }
    if let Some(rv) = scale["metadata"]["resourceVersion"].as_str() {
        next["metadata"]["resourceVersion"] = json!(rv);
    }
    Ok(next)
}

/// `pod` assigned to `node`: `spec.nodeName` and `PodScheduled=True` together; a pod already
/// assigned or being deleted is a conflict.
pub(super) fn assign(
    mut pod: Value,
    res: &Resource,
    name: &str,
    node: &str,
) -> Result<Value, ApiError> {
    if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        return Err(ApiError::conflict_because(
            res.group,
            res.plural,
            name,
            &format!("pod {name} is already assigned to node \"{current}\""),
        ));
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        return Err(ApiError::conflict_because(
            res.group,
            res.plural,
            name,
            "the pod is being deleted",
        ));
    }
    pod["spec"]["nodeName"] = json!(node);
    let cond = json!({"type": "PodScheduled", "status": "True",
        "lastTransitionTime": rfc3339(now_secs())});
    let mut conds = match pod["status"]["conditions"].take() {
        Value::Array(conds) => conds,
        _ => Vec::new(),
    };
    conds.retain(|c| c["type"] != "PodScheduled");
    conds.push(cond);
    pod["status"]["conditions"] = Value::Array(conds);
    Ok(pod)
}

impl Api {
    /// `pods/binding`: assigns an unassigned pod to a node, once.
    pub(super) async fn bind(
        &self,
        req: &ApiRequest,
        user: &User,
        object: Option<Decoded>,
    ) -> Result<ApiResponse, ApiError> {
        if req.resource.plural == "podgroups" {
            return self.bind_group(req, user).await;
        }
        // A Binding serialized from its own type needs no decoding into it.
        let (binding, typed): (Value, bool) = match object {
            Some(o) => {
                let typed = o.is_typed_as("", "v1", "Binding");
                (o.into_value(), typed)
            }
            None => (
                serde_json::from_slice(&req.body).map_err(|e| {
                    ApiError::bad_request(format!("the Binding is not valid JSON: {e}"))
                })?,
                false,
            ),
        };
        if !typed && let Some(t) = kinds::of_kind("", "Binding") {
            (t.normalize)(&binding).map_err(|e| {
                ApiError::bad_request(format!(
                    "the Binding is not valid: {}: {}",
                    e.path, e.message
                ))
            })?;
        }
        let node = binding["target"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if node.is_empty() {
            return Err(ApiError::invalid(
                "",
                "Binding",
                req.name.as_deref().unwrap_or_default(),
                vec![Cause {
                    reason: "FieldValueRequired",
                    field: "target.name".into(),
                    message: "Required value".into(),
                }],
            ));
        }
        if req.params.dry_run {
            return self.bind_alone(req, user, node).await;
        }
        // Written with the other bindings waiting at this moment, in one transaction.
        self.bind_batched(req, user, node).await
    }

    /// A binding written on its own (a dry run, or one whose batch met a changed pod).
    pub(super) async fn bind_alone(
        &self,
        req: &ApiRequest,
        user: &User,
        node: String,
    ) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        self.write_existing(
            req,
            user,
            move |pod| assign(pod, res, &name, &node),
            Vec::new(),
        )
        .await
        .map(|r| match r {
            ApiResponse::Object { warnings, .. } => super::bindings::bound(warnings),
            other => other,
        })
    }

    /// `pods/eviction`: deletes the pod unless that would break its PodDisruptionBudget. The
    /// budget's `status.disruptionsAllowed` (kept by the disruption controller) is spent with a
    /// compare-and-swap before the delete, and the pod recorded in `disruptedPods`; with none
    /// left the answer is 429, as Kubernetes answers, and `kubectl drain` retries.
    pub(super) async fn evict(&self, req: &ApiRequest) -> Result<ApiResponse, ApiError> {
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        let ns = req.namespace.clone().unwrap_or_default();
        let eviction: Value = serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("the Eviction is not valid JSON: {e}")))?;
        if let Some(t) = kinds::of_kind("policy", "Eviction") {
            (t.normalize)(&eviction).map_err(|e| {
                ApiError::bad_request(format!(
                    "the Eviction is not valid: {}: {}",
                    e.path, e.message
                ))
            })?;
        }
        let (pod, _) = self
            .read(res, Some(&ns), &name)
            .await?
            .ok_or_else(|| ApiError::not_found(res.group, res.plural, &name))?;
        let mut delete = req.clone();
        delete.verb = Verb::Delete;
        delete.subresource = None;
        delete.body = match eviction.get("deleteOptions") {
            Some(o) if o.is_object() => Bytes::from(o.to_string()),
            _ => Bytes::new(),
        };
        let done = || json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
        // Pods that are finished or already going need no budget.
        let settled = matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        ) || pod["metadata"]["deletionTimestamp"].is_string();
        if !settled {
            self.spend_budget(&ns, &pod).await?;
        }
        if !req.params.dry_run {
            // The eviction itself is what is admitted (as in Kubernetes), not this delete.
            self.delete(&delete, None).await?;
        }
        Ok(ApiResponse::Object {
            code: 201,
            body: done(),
            warnings: Vec::new(),
        })
    }

    /// Takes one disruption from the budget that covers `pod`, if one does.
    async fn spend_budget(&self, ns: &str, pod: &Value) -> Result<(), ApiError> {
        let pdbs = crate::request::find_resource("policy", "v1", "poddisruptionbudgets")?;
        let name = name_of(pod).to_owned();
        for _attempt in 0..16 {
            let page = self
                .store
                .list(ListRequest {
                    prefix: prefix(pdbs, Some(ns)).into(),
                    ..Default::default()
                })
                .await
                .map_err(store_error)?;
            let mut covering = Vec::new();
            for kv in &page.kvs {
                let pdb = decode_stored(kv)?;
                if selects(&pdb["spec"]["selector"], &pod["metadata"]["labels"]) {
                    covering.push((pdb, kv.clone()));
                }
            }
            let (mut pdb, kv) = match covering.len() {
                0 => return Ok(()),
                1 => covering.remove(0),
                _ => {
                    return Err(ApiError::conflict_because(
                        "",
                        "pods",
                        &name,
                        "this pod has more than one PodDisruptionBudget, which the eviction subresource does not support",
                    ));
                }
            };
            let allowed = pdb["status"]["disruptionsAllowed"].as_i64().unwrap_or(0);
            if allowed <= 0 {
                let mut e = ApiError::new(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                );
                e.details = Some(
                    json!({"causes": [{"reason": "DisruptionBudget", "message": format!(
                        "The disruption budget {} needs {} healthy pods and has {} currently",
                        name_of(&pdb),
                        pdb["status"]["desiredHealthy"].as_i64().unwrap_or(0),
                        pdb["status"]["currentHealthy"].as_i64().unwrap_or(0)
                    )}]}),
                );
                return Err(e);
            }
            pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
            pdb["status"]["disruptedPods"][&name] = json!(rfc3339(now_secs()));
            match self
                .store
                .update(kv.key.clone(), encode(&pdb)?, kv.mod_revision)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.precondition().is_some() => continue,
                Err(e) => return Err(store_error(e)),
            }
        }
        Err(ApiError::conflict_because(
            "",
            "pods",
            &name,
            "the pod's disruption budget kept changing; try again",
        ))
    }
}

/// Whether a `metav1.LabelSelector` selects objects with `labels` (an empty selector selects
/// everything, as a PodDisruptionBudget's does).
pub(crate) fn selects(selector: &Value, labels: &Value) -> bool {
    if !selector.is_object() {
        // policy/v1: a budget without a selector covers no pod.
        return false;
    }
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    for (k, v) in selector["matchLabels"].as_object().into_iter().flatten() {
        if get(k) != v.as_str() {
            return false;
        }
    }
    for e in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let ok = match e["operator"].as_str() {
            Some("In") => get(key).is_some_and(|v| values.contains(&v)),
            Some("NotIn") => get(key).is_none_or(|v| !values.contains(&v)),
            Some("Exists") => get(key).is_some(),
            Some("DoesNotExist") => get(key).is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Members a `podgroups/binding` may assign at once: one store transaction holds at most
/// this many writes (etcd's default `--max-txn-ops`).
pub(crate) const MAX_GROUP_BINDING: usize = tessera_store::validation::MAX_TXN_OPS;

/// What `podgroups/binding` is asked: the members, checked for shape.
fn group_binding_members(
    req: &ApiRequest,
    group: &str,
) -> Result<Vec<crate::types::MemberBinding>, ApiError> {
    let body: Value = serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::bad_request(format!("the PodGroupBinding is not valid JSON: {e}"))
    })?;
    if let Some(t) = kinds::of_kind("tessera.io", "PodGroupBinding") {
        (t.normalize)(&body).map_err(|e| {
            ApiError::bad_request(format!(
                "the PodGroupBinding is not valid: {}: {}",
                e.path, e.message
            ))
        })?;
    }
    let binding: crate::types::PodGroupBinding = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("the PodGroupBinding is not valid: {e}")))?;
    let mut causes = Vec::new();
    let mut cause = |field: String, reason: &'static str, message: String| {
        causes.push(Cause {
            reason,
            field,
            message,
        })
    };
    if binding.members.is_empty() {
        cause(
            "members".into(),
            "FieldValueRequired",
            "Required value: name at least one member and its node".into(),
        );
    }
    if binding.members.len() > MAX_GROUP_BINDING {
        cause(
            "members".into(),
            "FieldValueTooMany",
            format!(
                "Too many: {}: must have at most {MAX_GROUP_BINDING} items",
                binding.members.len()
            ),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, m) in binding.members.iter().enumerate() {
        if m.pod.is_empty() {
            cause(
                format!("members[{i}].pod"),
                "FieldValueRequired",
                "Required value".into(),
            );
        } else if !seen.insert(m.pod.as_str()) {
            cause(
                format!("members[{i}].pod"),
                "FieldValueDuplicate",
                format!("Duplicate value: {:?}", m.pod),
            );
        }
        if m.node.is_empty() {
            cause(
                format!("members[{i}].node"),
                "FieldValueRequired",
                "Required value".into(),
            );
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "tessera.io",
            "PodGroupBinding",
            group,
            causes,
        ));
    }
    Ok(binding.members)
}

impl Api {
    /// `podgroups/binding`: assigns members of one gang to their nodes in one store
    /// transaction, so that a gang is never partly bound: if any member cannot be bound
    /// (gone, replaced, already assigned, being deleted, not of this group), none is.
    async fn bind_group(&self, req: &ApiRequest, user: &User) -> Result<ApiResponse, ApiError> {
        let group = req.name.clone().unwrap_or_default();
        let ns = req.namespace.clone().unwrap_or_default();
        let members = group_binding_members(req, &group)?;
        if self.read(req.resource, Some(&ns), &group).await?.is_none() {
            return Err(ApiError::not_found("tessera.io", "podgroups", &group));
        }
        let pods = crate::request::find_resource("", "v1", "pods")?;
        for _attempt in 0..16 {
            let mut prepared = Vec::with_capacity(members.len());
            for (i, m) in members.iter().enumerate() {
                let check = |current: &Value| -> Result<(), ApiError> {
                    let labelled = current["metadata"]["labels"][crate::types::POD_GROUP_LABEL]
                        .as_str()
                        == Some(group.as_str());
                    if !labelled {
                        return Err(ApiError::invalid(
                            "tessera.io",
                            "PodGroupBinding",
                            &group,
                            vec![Cause {
                                reason: "FieldValueInvalid",
                                field: format!("members[{i}].pod"),
                                message: format!(
                                    "Invalid value: {:?}: the pod is not a member of PodGroup {group} (it needs the label {}={group})",
                                    m.pod,
                                    crate::types::POD_GROUP_LABEL
                                ),
                            }],
                        ));
                    }
                    if let Some(uid) = m.uid.as_deref()
                        && current["metadata"]["uid"].as_str() != Some(uid)
                    {
                        return Err(ApiError::conflict_because(
                            "",
                            "pods",
                            &m.pod,
                            &format!("the pod's UID is not {uid}: it was replaced"),
                        ));
                    }
                    Ok(())
                };
                prepared.push(
                    self.prepare_binding(&req.params, user, &ns, &m.pod, &m.node, check)
                        .await?,
                );
            }
            if req.params.dry_run {
                return Ok(group_bound(&group, members.len()));
            }
            let all: Vec<&super::bindings::Prepared> = prepared.iter().collect();
            match self.write_prepared(pods, &all).await {
                Ok(()) => return Ok(group_bound(&group, members.len())),
                // A member changed in between: read them all again.
                Err(super::bindings::WriteFailure::Changed) => continue,
                Err(super::bindings::WriteFailure::Refused(e)) => return Err(e),
            }
        }
        Err(ApiError::conflict_because(
            "tessera.io",
            "podgroups",
            &group,
            "its members kept changing while they were bound; try again",
        ))
    }
}

fn group_bound(group: &str, n: usize) -> ApiResponse {
    ApiResponse::Object {
        code: 201,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "code": 201, "message": format!("{n} member(s) of PodGroup {group} bound")}),
        warnings: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_selectors_are_whole_label_selectors() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
            {"key": "track", "operator": "Exists"},
            {"key": "canary", "operator": "DoesNotExist"}]});
        let text = crate::table::selector_text(&sel);
        assert_eq!(text, "app=web,tier in (a,b),zone notin (x),track,!canary");
        assert_eq!(
            crate::table::selector_text(&json!({"app": "old"})),
            "app=old"
        );
        assert!(
            text.parse::<tessera_core::selector::label::LabelSelector>()
                .is_ok()
        );
    }

    #[test]
    fn label_selectors_select_like_kubernetes() {
        let labels = json!({"app": "web", "tier": "front"});
        for (sel, want) in [
            (json!({}), true),
            (Value::Null, false),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "Bogus"}]}),
                false,
            ),
        ] {
            assert_eq!(selects(&sel, &labels), want, "{sel}");
        }
    }
}
