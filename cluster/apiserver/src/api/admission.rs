//! Admission at create: LimitRange defaults and bounds, ResourceQuota charges in the
//! creating transaction, and the usage they count; pods' default NoExecute tolerations.

use super::*;

pub use tessera_client::types::{PROCESS_TAINT_KEY, PROCESS_TAINT_VALUE};

/// The same error with reason Forbidden (403), as LimitRange admission answers.
fn forbidden_reason(mut e: ApiError) -> ApiError {
    e.code = 403;
    e.reason = "Forbidden";
    e
}

/// Adds (or with `charge == false` takes back) `usage` to `used` for every resource `limits`
/// names; refuses a charge that would go over a limit, changing nothing then, with what was
/// asked, what is used and the limit in Kubernetes' words (`requested: pods=1, used: pods=10,
/// limited: pods=10`). The one rule of ResourceQuotas and Tenant quotas.
pub(super) fn charge_usage(
    used: &mut BTreeMap<String, Quantity>,
    usage: &BTreeMap<String, Quantity>,
    limits: &BTreeMap<String, Quantity>,
    charge: bool,
) -> Result<(), String> {
    let mut next = used.clone();
    for (k, limit) in limits {
        let Some(add) = usage.get(k) else { continue };
        let cur = used
            .get(k)
            .copied()
            .unwrap_or_else(|| Quantity::from_units(0));
        let after = if charge {
            cur.saturating_add(*add)
        } else {
            cur.saturating_sub(*add)
        };
        if charge && after > *limit {
            return Err(format!(
                "requested: {k}={add}, used: {k}={cur}, limited: {k}={limit}"
            ));
        }
        next.insert(k.clone(), after);
    }
    *used = next;
    Ok(())
}

impl Api {
    /// Every object of core/v1 `plural` in namespace `ns` (a namespace's few quotas or
    /// limit ranges).
    pub(super) async fn all_in(&self, plural: &str, ns: &str) -> Result<Vec<KeyValue>, ApiError> {
        let res = crate::request::find_resource("", "v1", plural)?;
        Ok(self
            .store
            .list(ListRequest {
                prefix: prefix(res, Some(ns)).into(),
                ..Default::default()
            })
            .await
            .map_err(store_error)?
            .kvs)
    }

    /// What the objects in `ns` use of the resources a quota limits (`hard`): a quota
    /// starts from the namespace's current usage; from then on every create and delete
    /// charges it in the same transaction.
    pub(super) async fn usage_in(
        &self,
        ns: &str,
        hard: &BTreeMap<String, Quantity>,
        spec: &Value,
    ) -> Result<BTreeMap<String, Quantity>, ApiError> {
        let mut used: BTreeMap<String, Quantity> = hard
            .keys()
            .map(|k| (k.clone(), Quantity::from_units(0)))
            .collect();
        for res in crate::catalog::RESOURCES.iter().filter(|r| r.namespaced) {
            if !crate::quota::tracked(res, hard) {
                continue;
            }
            let page = self
                .store
                .list(ListRequest {
                    prefix: prefix(res, Some(ns)).into(),
                    ..Default::default()
                })
                .await
                .map_err(store_error)?;
            for kv in &page.kvs {
                let obj = decode_stored(kv)?;
                if crate::quota::in_scope(spec, res, &obj) {
                    crate::quota::add_tracked(&mut used, crate::quota::usage_of(res, &obj));
                }
            }
        }
        Ok(used)
    }

    /// Pod Security admission for a pod, or (warnings only) a workload's pod template in
    /// namespace `ns`; and the process-node boundary: a pod of a Tenant without
    /// `spec.processNodes` may neither tolerate the process nodes' taint nor name one.
    /// Violations of the `warn` level are added to `warnings`. `labels` are the namespace's,
    /// if the caller read them already.
    pub(super) async fn admit_pod_security(
        &self,
        res: &Resource,
        ns: &str,
        labels: Option<&Value>,
        obj: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        use super::pod_security::{Level, Policy, TENANT_DEFAULT, message, violations};
        let Some(spec) = super::pod_security::template_spec(res.kind, obj) else {
            return Ok(());
        };
        let tenant = self.tenant_of(ns).await?;
        let tenant_max = tenant.as_ref().map(|t| {
            t["spec"]["podSecurity"]
                .as_str()
                .and_then(Level::parse)
                .unwrap_or(TENANT_DEFAULT)
        });
        let labels = match labels {
            Some(l) => l.clone(),
            None => {
                let ns_res = crate::request::find_resource("", "v1", "namespaces")?;
                match self.read(ns_res, None, ns).await? {
                    Some((mut n, _)) => n["metadata"]["labels"].take(),
                    None => Value::Null,
                }
            }
        };
        let policy = Policy::of(&labels, tenant_max);
        let name = name_of(obj);
        if res.kind == "Pod" {
            let v = violations(spec, policy.enforce);
            if !v.is_empty() {
                return Err(ApiError::forbidden(format!(
                    "pods {name:?} is forbidden: {}",
                    message(policy.enforce, &v)
                )));
            }
            if let Some(t) = &tenant
                && t["spec"]["processNodes"] != true
            {
                self.refuse_process_nodes(spec, name, name_of(t)).await?;
            }
        }
        let w = violations(spec, policy.warn);
        if !w.is_empty() {
            warnings.push(format!(
                "would violate PodSecurity \"{}:latest\": {}",
                policy.warn.as_str(),
                w.join(", ")
            ));
        }
        let a = violations(spec, policy.audit);
        if !a.is_empty() {
            tracing::info!(target: "audit", namespace = ns, kind = res.kind, name,
                "pod-security.kubernetes.io/audit-violations: {}", message(policy.audit, &a));
        }
        Ok(())
    }

    /// Refuses a pod that tolerates the process nodes' taint or names a process node.
    async fn refuse_process_nodes(
        &self,
        spec: &Value,
        name: &str,
        tenant: &str,
    ) -> Result<(), ApiError> {
        let why = |what: String| {
            ApiError::forbidden(format!(
                "pods {name:?} is forbidden: {what}; tenant {tenant:?} may not run pods on process \
                 nodes (an administrator can allow it with spec.processNodes: true on the Tenant)"
            ))
        };
        for (i, t) in spec["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let key = t["key"].as_str().unwrap_or("");
            let exists = t["operator"] == "Exists";
            let effect_ok = t["effect"]
                .as_str()
                .is_none_or(|e| e.is_empty() || e == "NoSchedule");
            let tolerates = effect_ok
                && ((key.is_empty() && exists)
                    || (key == PROCESS_TAINT_KEY
                        && (exists || t["value"].as_str() == Some(PROCESS_TAINT_VALUE))));
            if tolerates {
                return Err(why(format!(
                    "spec.tolerations[{i}] tolerates the process nodes' taint {PROCESS_TAINT_KEY}={PROCESS_TAINT_VALUE}:NoSchedule"
                )));
            }
        }
        if let Some(node) = spec["nodeName"].as_str() {
            let nodes = crate::request::find_resource("", "v1", "nodes")?;
            if let Some((n, _)) = self.read(nodes, None, node).await?
                && n["metadata"]["labels"][PROCESS_TAINT_KEY] == PROCESS_TAINT_VALUE
            {
                return Err(why(format!("spec.nodeName {node:?} is a process node")));
            }
        }
        Ok(())
    }

    /// LimitRange admission: container defaults filled in, min/max checked.
    pub(super) async fn apply_limit_ranges(
        &self,
        req: &ApiRequest,
        pod: &mut Value,
    ) -> Result<(), ApiError> {
        let Some(ns) = req.namespace.as_deref() else {
            return Ok(());
        };
        let ranges = self.all_in("limitranges", ns).await?;
        let mut causes = Vec::new();
        for kv in &ranges {
            let range = decode_stored(kv)?;
            for limit in range["spec"]["limits"].as_array().into_iter().flatten() {
                if limit["type"] != "Container" {
                    continue;
                }
                let containers = pod["spec"]["containers"]
                    .as_array_mut()
                    .map(std::mem::take)
                    .unwrap_or_default();
                let mut out = Vec::with_capacity(containers.len());
                for (i, mut c) in containers.into_iter().enumerate() {
                    // Requests were set from limits by defaulting before admission; the
                    // range's defaults fill in what is still unset.
                    for (from, to) in [("default", "limits"), ("defaultRequest", "requests")] {
                        for (k, v) in limit[from].as_object().into_iter().flatten() {
                            if c["resources"][to][k].is_null() {
                                c["resources"][to][k] = v.clone();
                            }
                        }
                    }
                    // A default limit without a request requests the limit, too.
                    crate::defaults::requests_from_limits(&mut c);
                    for (bound, section, cmp) in [
                        ("max", "limits", std::cmp::Ordering::Greater),
                        ("min", "requests", std::cmp::Ordering::Less),
                    ] {
                        for (k, b) in quantity_map(&limit[bound]) {
                            let v = c["resources"][section][&k]
                                .as_str()
                                .and_then(|s| s.parse::<Quantity>().ok());
                            match v {
                                Some(v) if v.cmp(&b) == cmp => causes.push(Cause {
                                    reason: "FieldValueForbidden",
                                    field: format!("spec.containers[{i}].resources.{section}"),
                                    message: format!(
                                        "Forbidden: {bound} {k} usage per Container is {b}, but {section} is {v} (LimitRange {})",
                                        name_of(&range)
                                    ),
                                }),
                                None if bound == "max" => causes.push(Cause {
                                    reason: "FieldValueRequired",
                                    field: format!("spec.containers[{i}].resources.limits[{k}]"),
                                    message: format!(
                                        "Required value: LimitRange {} sets a maximum {k}, so every container must set a {k} limit",
                                        name_of(&range)
                                    ),
                                }),
                                _ => {}
                            }
                        }
                    }
                    out.push(c);
                }
                pod["spec"]["containers"] = Value::Array(out);
            }
        }
        if !causes.is_empty() {
            return Err(forbidden_reason(ApiError::invalid(
                "",
                "Pod",
                name_of(pod),
                causes,
            )));
        }
        Ok(())
    }

    /// Store operations that charge (or refund) `obj` to its namespace's ResourceQuotas,
    /// conditional on each quota's revision. Fails with 403 when a quota would be exceeded.
    pub(super) async fn quota_ops(
        &self,
        req: &ApiRequest,
        obj: &Value,
        charge: bool,
    ) -> Result<Vec<Op>, ApiError> {
        let Some(ns) = req.namespace.as_deref() else {
            return Ok(Vec::new());
        };
        let res = req.resource;
        let usage = crate::quota::usage_of(res, obj);
        if usage.is_empty() {
            // A finished pod: its charge was given back when it finished.
            return Ok(Vec::new());
        }
        let quotas = self.all_in("resourcequotas", ns).await?;
        let mut ops = Vec::new();
        for kv in &quotas {
            let mut quota = decode_stored(kv)?;
            let hard = quantity_map(&quota["spec"]["hard"]);
            if !hard.keys().any(|k| usage.contains_key(k))
                || !crate::quota::in_scope(&quota["spec"], res, obj)
            {
                continue;
            }
            let mut used = quantity_map(&quota["status"]["used"]);
            if let Err(over) = charge_usage(&mut used, &usage, &hard, charge) {
                return Err(ApiError::forbidden(format!(
                    "{} \"{}\" is forbidden: exceeded quota: {}, {over}",
                    crate::status::qualified(res.group, res.plural),
                    name_of(obj),
                    name_of(&quota),
                )));
            }
            quota["status"]["hard"] = quantity_json(&hard);
            quota["status"]["used"] = quantity_json(&used);
            ops.push(Op::Update {
                key: kv.key.clone(),
                value: encode(&quota)?,
                expected: kv.mod_revision,
                lease: 0,
            });
        }
        Ok(ops)
    }
}

/// DefaultTolerationSeconds admission, as kube-apiserver runs it by default: a new pod
/// that does not tolerate its node turning not ready (or unreachable) for NoExecute gets a
/// toleration of it for a while — so a node that misses its heartbeats for a minute does not
/// evict every pod at once, and they are evicted after five minutes if it stays away.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DefaultTolerations {
    /// Seconds of `node.kubernetes.io/not-ready:NoExecute` tolerated.
    pub not_ready: i64,
    /// Seconds of `node.kubernetes.io/unreachable:NoExecute` tolerated.
    pub unreachable: i64,
}

impl Default for DefaultTolerations {
    fn default() -> Self {
        DefaultTolerations {
            not_ready: 300,
            unreachable: 300,
        }
    }
}

impl DefaultTolerations {
    /// Adds the tolerations `pod` lacks. One it has already counts if its key is the taint's
    /// or empty (all keys) and its effect NoExecute or empty (all effects) — whatever its
    /// seconds, as Kubernetes' plugin decides.
    pub(crate) fn apply(&self, pod: &mut Value) {
        if !pod["spec"].is_object() {
            return;
        }
        let tolerations = &mut pod["spec"]["tolerations"];
        if !tolerations.is_array() {
            *tolerations = Value::Array(Vec::new());
        }
        let Value::Array(list) = tolerations else {
            return;
        };
        for (key, seconds) in [
            ("node.kubernetes.io/not-ready", self.not_ready),
            ("node.kubernetes.io/unreachable", self.unreachable),
        ] {
            let covered = list.iter().any(|t| {
                let k = t["key"].as_str().unwrap_or("");
                let e = t["effect"].as_str().unwrap_or("");
                (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
            });
            if !covered {
                list.push(
                    json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": seconds}),
                );
            }
        }
    }
}

impl Api {
    /// Kubernetes' DefaultStorageClass admission: a new claim that names no class (the field
    /// left out; `""` asks for none) gets the class annotated
    /// `storageclass.kubernetes.io/is-default-class: "true"` (the newest, if several are).
    pub(super) async fn default_storage_class(&self, claim: &mut Value) -> Result<(), ApiError> {
        if !claim["spec"].is_object() || !claim["spec"]["storageClassName"].is_null() {
            return Ok(());
        }
        let res = crate::request::find_resource("storage.k8s.io", "v1", "storageclasses")?;
        let classes = self.list_all(res).await?;
        let default = classes
            .iter()
            .filter(|c| {
                c["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"]
                    == "true"
            })
            .max_by(|a, b| {
                let t = |c: &Value| {
                    c["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                };
                t(a).cmp(&t(b))
            });
        if let Some(c) = default {
            claim["spec"]["storageClassName"] = c["metadata"]["name"].clone();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tolerations_after(tolerations: Value) -> Vec<(String, i64)> {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "x"}]}});
        if !tolerations.is_null() {
            pod["spec"]["tolerations"] = tolerations;
        }
        DefaultTolerations {
            not_ready: 300,
            unreachable: 120,
        }
        .apply(&mut pod);
        pod["spec"]["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["key"].as_str().unwrap_or("*").to_owned(),
                    t["tolerationSeconds"].as_i64().unwrap_or(-1),
                )
            })
            .collect()
    }

    #[test]
    fn new_pods_tolerate_a_lost_node_for_a_while_unless_they_say_otherwise() {
        let nr = "node.kubernetes.io/not-ready".to_owned();
        let un = "node.kubernetes.io/unreachable".to_owned();
        assert_eq!(
            tolerations_after(Value::Null),
            vec![(nr.clone(), 300), (un.clone(), 120)]
        );
        // A pod's own seconds for one taint stand; the other is added.
        assert_eq!(
            tolerations_after(json!([{"key": un, "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 1}])),
            vec![(un.clone(), 1), (nr.clone(), 300)]
        );
        // Tolerating every taint (no key, no effect) covers both: nothing added.
        assert_eq!(
            tolerations_after(json!([{"operator": "Exists"}])),
            vec![("*".to_owned(), -1)]
        );
        // A NoSchedule toleration is not a NoExecute one.
        assert_eq!(
            tolerations_after(json!([{"key": nr, "operator": "Exists", "effect": "NoSchedule"}]))
                .len(),
            3
        );
    }

    #[test]
    fn qos_follows_requests_and_limits() {
        let pod = |r: Value| json!({"spec": {"containers": [{"resources": r}]}});
        assert_eq!(crate::quota::qos_class(&pod(json!({}))), "BestEffort");
        assert_eq!(
            crate::quota::qos_class(&pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            "Guaranteed"
        );
        assert_eq!(
            crate::quota::qos_class(&pod(json!({"requests": {"cpu": "1"}}))),
            "Burstable"
        );
    }
}
