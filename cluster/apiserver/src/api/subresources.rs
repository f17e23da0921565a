//! Subresources that are not the object itself: `pods/binding` (a pod is bound once, node and
//! `PodScheduled` together) and `scale` (the autoscaling/v1 Scale view of `spec.replicas`).

use super::*;

pub(super) fn to_scale_plain(res: &Resource, obj: &Value) -> Value {
    let selector = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let _ = res;
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
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

pub(super) fn to_scale(req: &ApiRequest, obj: &Value) -> Value {
    to_scale_plain(req.resource, obj)
}

/// The object after a write to its Scale: only `spec.replicas` changes.
pub(super) fn from_scale(
    res: &Resource,
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
    let _ = res;
    let mut next = current.clone();
    next["spec"]["replicas"] = json!(replicas);
    if let Some(rv) = scale["metadata"]["resourceVersion"].as_str() {
        next["metadata"]["resourceVersion"] = json!(rv);
    }
    Ok(next)
}

impl Api {
    /// `pods/binding`: assigns an unassigned pod to a node, once.
    pub(super) async fn bind(
        &self,
        req: &ApiRequest,
        user: &User,
    ) -> Result<ApiResponse, ApiError> {
        let binding: Value = serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("the Binding is not valid JSON: {e}")))?;
        if let Some(t) = kinds::of_kind("", "Binding") {
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
        let res = req.resource;
        let name = req.name.clone().unwrap_or_default();
        self.write_existing(
            req,
            user,
            move |mut pod| {
                if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
                    return Err(ApiError::conflict_because(
                        res.group,
                        res.plural,
                        &name,
                        &format!("pod {name} is already assigned to node \"{current}\""),
                    ));
                }
                if pod["metadata"]["deletionTimestamp"].is_string() {
                    return Err(ApiError::conflict_because(
                        res.group,
                        res.plural,
                        &name,
                        "the pod is being deleted",
                    ));
                }
                pod["spec"]["nodeName"] = json!(node);
                let cond = json!({"type": "PodScheduled", "status": "True",
                    "lastTransitionTime": rfc3339(now_secs())});
                let conds = pod["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| c["type"] != "PodScheduled")
                    .chain(std::iter::once(cond))
                    .collect::<Vec<_>>();
                pod["status"]["conditions"] = json!(conds);
                Ok(pod)
            },
            Vec::new(),
        )
        .await
        .map(|r| match r {
            ApiResponse::Object { warnings, .. } => ApiResponse::Object {
                code: 201,
                body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                warnings,
            },
            other => other,
        })
    }
}
