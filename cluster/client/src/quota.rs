//! What counts against a ResourceQuota, shared by the API server (which charges creates and
//! refunds deletes in the same transaction) and the resource quota controller (which
//! recomputes a quota's usage from the objects).
//!
//! As in Kubernetes, a pod that has finished (`Succeeded` or `Failed`) uses nothing: its
//! charge is given back in the transaction that records it finished.

use std::collections::BTreeMap;

use serde_json::Value;
use tessera_core::quantity::Quantity;

use crate::catalog::Resource;

/// Whether a pod has finished (it no longer counts against quotas).
pub fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// A pod's QoS class, as Kubernetes derives it from its containers' requests and limits.
pub fn qos_class(pod: &Value) -> &'static str {
    let containers = pod["spec"]["containers"].as_array();
    let mut any = false;
    let mut guaranteed = true;
    for c in containers.into_iter().flatten() {
        let r = &c["resources"];
        for k in ["cpu", "memory"] {
            let req = r["requests"][k].as_str().or(r["limits"][k].as_str());
            let lim = r["limits"][k].as_str();
            if req.is_some() || lim.is_some() {
                any = true;
            }
            if lim.is_none() || req != lim {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Whether a quota with `spec` counts `obj` of `res`. An unscoped quota counts everything it
/// limits; a scoped one (`scopes`, `scopeSelector`) counts only pods that match every scope:
/// `Terminating`/`NotTerminating` (an `activeDeadlineSeconds` or not), `BestEffort`/
/// `NotBestEffort` (the QoS class), `PriorityClass` (the pod's `priorityClassName` against
/// `In`/`NotIn`/`Exists`/`DoesNotExist`), `CrossNamespacePodAffinity` (affinity terms that
/// name other namespaces).
pub fn in_scope(spec: &Value, res: &Resource, obj: &Value) -> bool {
    let mut scopes: Vec<(&str, &str, Vec<&str>)> = spec["scopes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s.as_str()?, "Exists", Vec::new())))
        .collect();
    for x in spec["scopeSelector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let values = x["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        scopes.push((
            x["scopeName"].as_str().unwrap_or_default(),
            x["operator"].as_str().unwrap_or_default(),
            values,
        ));
    }
    if scopes.is_empty() {
        return true;
    }
    if !(res.plural == "pods" && res.group.is_empty()) {
        return false;
    }
    let spec = &obj["spec"];
    scopes.iter().all(|(scope, op, values)| match *scope {
        "Terminating" => spec["activeDeadlineSeconds"]
            .as_i64()
            .is_some_and(|s| s >= 0),
        "NotTerminating" => spec["activeDeadlineSeconds"].as_i64().is_none_or(|s| s < 0),
        "BestEffort" => qos_class(obj) == "BestEffort",
        "NotBestEffort" => qos_class(obj) != "BestEffort",
        "PriorityClass" => {
            let class = spec["priorityClassName"].as_str().unwrap_or_default();
            match *op {
                "In" => values.contains(&class),
                "NotIn" => !values.contains(&class),
                "DoesNotExist" => class.is_empty(),
                _ => !class.is_empty(),
            }
        }
        "CrossNamespacePodAffinity" => ["podAffinity", "podAntiAffinity"].iter().any(|a| {
            let terms = &spec["affinity"][a];
            [
                "requiredDuringSchedulingIgnoredDuringExecution",
                "preferredDuringSchedulingIgnoredDuringExecution",
            ]
            .iter()
            .flat_map(|k| terms[k].as_array().into_iter().flatten())
            .any(|t| {
                let t = if t["podAffinityTerm"].is_object() {
                    &t["podAffinityTerm"]
                } else {
                    t
                };
                t["namespaces"].as_array().is_some_and(|n| !n.is_empty())
                    || t["namespaceSelector"].is_object()
            })
        }),
        _ => false,
    })
}

/// Core kinds also counted by their plain name (`services: 10`).
fn counted_by_name(res: &Resource) -> bool {
    res.group.is_empty()
        && [
            "services",
            "secrets",
            "configmaps",
            "resourcequotas",
            "replicationcontrollers",
        ]
        .contains(&res.plural)
}

/// The object-count name of a resource (`count/deployments.apps`).
pub fn count_name(res: &Resource) -> String {
    format!("count/{}", crate::status::qualified(res.group, res.plural))
}

/// The Tenant quota on the bytes a tenant's objects take in the store (every kind, as
/// encoded there), charged in [`STORED_BLOCK`]s.
pub const STORED_BYTES: &str = "tessera.io/stored-bytes";

/// The unit stored bytes are charged in: an update that does not cross a block boundary
/// (most status writes) changes nothing in the quota and does not write the Tenant.
pub const STORED_BLOCK: u64 = 4096;

/// The bytes of `obj` a stored-bytes quota charges: its compact JSON, less what only the
/// system writes and changes on its own — `status`, and the deletion bookkeeping and
/// counters in `metadata` (`resourceVersion`, `generation`, `deletionTimestamp`,
/// `deletionGracePeriodSeconds`). So the writes that change the charge are the ones that go
/// through the quota (create, update, patch, delete), and a quota or budget status update
/// inside another request never does.
pub fn charged_len(obj: &Value) -> usize {
    fn json_len(v: &Value) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0 += b.len();
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut c = Count(0);
        let _ = serde_json::to_writer(&mut c, v);
        c.0
    }
    // A member `"key":value` and the comma that separates it.
    fn member_len(key: &str, v: &Value) -> usize {
        json_len(&Value::String(key.to_owned())) + 1 + json_len(v) + 1
    }
    let mut len = json_len(obj);
    if let Some(status) = obj.get("status") {
        len = len.saturating_sub(member_len("status", status));
    }
    if let Some(meta) = obj.get("metadata").and_then(Value::as_object) {
        for key in [
            "resourceVersion",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            if let Some(v) = meta.get(key) {
                len = len.saturating_sub(member_len(key, v));
            }
        }
    }
    len
}

/// What an object of `len` stored bytes is charged: its size rounded up to whole blocks.
pub fn stored_charge(len: usize) -> Quantity {
    let blocks = (len as u64).div_ceil(STORED_BLOCK).max(1);
    Quantity::from_units((blocks * STORED_BLOCK) as i64)
}

/// Whether a quota limiting `hard` counts objects of `res`.
pub fn tracked(res: &Resource, hard: &BTreeMap<String, Quantity>) -> bool {
    hard.contains_key(&count_name(res))
        || (counted_by_name(res) && hard.contains_key(res.plural))
        || (res.plural == "pods" && res.group.is_empty() && !hard.is_empty())
}

/// What one object of `res` uses: a pod its requests and limits (nothing once finished),
/// anything else one of its kind.
pub fn usage_of(res: &Resource, obj: &Value) -> BTreeMap<String, Quantity> {
    if res.plural == "pods" && res.group.is_empty() {
        if is_terminal(obj) {
            return BTreeMap::new();
        }
        let mut m = pod_usage(obj);
        m.insert(count_name(res), Quantity::from_units(1));
        return m;
    }
    let mut m = BTreeMap::new();
    m.insert(count_name(res), Quantity::from_units(1));
    if counted_by_name(res) {
        m.insert(res.plural.to_owned(), Quantity::from_units(1));
    }
    m
}

/// Adds `usage` to `total` for the resources `total` holds.
pub fn add_tracked(total: &mut BTreeMap<String, Quantity>, usage: BTreeMap<String, Quantity>) {
    for (k, v) in usage {
        if let Some(u) = total.get_mut(&k) {
            *u = u.saturating_add(v);
        }
    }
}

/// A pod's requests and limits, summed over its containers (`requests.cpu`, and `cpu` too).
pub fn pod_usage(pod: &Value) -> BTreeMap<String, Quantity> {
    let mut out: BTreeMap<String, Quantity> = BTreeMap::new();
    out.insert("pods".into(), Quantity::from_units(1));
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for (section, prefix) in [("requests", "requests."), ("limits", "limits.")] {
            for (k, v) in c["resources"][section].as_object().into_iter().flatten() {
                let Some(q) = v.as_str().and_then(|s| s.parse::<Quantity>().ok()) else {
                    continue;
                };
                let mut names = vec![format!("{prefix}{k}")];
                if section == "requests" {
                    names.push(k.clone());
                }
                for n in names {
                    let e = out.entry(n).or_insert_with(|| Quantity::from_units(0));
                    *e = (*e).saturating_add(q);
                }
            }
        }
    }
    out
}

/// The quantities of a `{name: "quantity"}` map (unparsable ones left out).
pub fn quantity_map(v: &Value) -> BTreeMap<String, Quantity> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.parse().ok()?)))
        .collect()
}

/// Quantities as a `{name: "quantity"}` map.
pub fn quantity_json(m: &BTreeMap<String, Quantity>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.to_string())))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_stored_bytes_charge_leaves_out_what_the_system_alone_changes() {
        let bare = serde_json::json!({"metadata": {"name": "a", "namespace": "n",
            "finalizers": ["x"]}, "data": {"k": "v"}});
        let mut full = bare.clone();
        full["status"] = serde_json::json!({"phase": "Running", "n": 12345});
        full["metadata"]["resourceVersion"] = serde_json::json!("99");
        full["metadata"]["generation"] = serde_json::json!(7);
        full["metadata"]["deletionTimestamp"] = serde_json::json!("2026-12-01T00:00:00Z");
        full["metadata"]["deletionGracePeriodSeconds"] = serde_json::json!(30);
        assert_eq!(
            charged_len(&bare),
            serde_json::to_string(&bare).expect("json").len()
        );
        assert_eq!(charged_len(&full), charged_len(&bare));
        // What the writer controls counts: data, finalizers.
        let mut more = bare.clone();
        more["data"]["k2"] = serde_json::json!("vv");
        assert!(charged_len(&more) > charged_len(&bare));
        assert_eq!(stored_charge(1).to_string(), "4096");
        assert_eq!(stored_charge(4096).to_string(), "4096");
        assert_eq!(stored_charge(4097).to_string(), "8192");
    }
    use crate::request::find_resource;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn replication_controllers_count_by_their_plain_name_too() {
        let rcs = find_resource("", "v1", "replicationcontrollers").expect("rcs");
        let hard: BTreeMap<String, Quantity> =
            [("replicationcontrollers".to_owned(), Quantity::from_units(2))].into();
        assert!(tracked(rcs, &hard));
        let used = usage_of(rcs, &json!({"metadata": {"name": "r"}}));
        assert_eq!(used["replicationcontrollers"], Quantity::from_units(1));
        assert_eq!(
            used["count/replicationcontrollers"],
            Quantity::from_units(1)
        );
    }

    #[test]
    fn scopes_pick_the_pods_they_count() {
        let pods = find_resource("", "v1", "pods").expect("pods");
        let configmaps = find_resource("", "v1", "configmaps").expect("configmaps");
        let best_effort = pod(json!({"containers": [{"name": "c"}]}));
        let burstable = pod(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "1"}}}], "priorityClassName": "high"}));
        let deadline = pod(json!({"containers": [{"name": "c"}], "activeDeadlineSeconds": 60}));
        let scoped = |scopes: Value| json!({"hard": {"pods": "5"}, "scopes": scopes});
        let unscoped = json!({"hard": {"pods": "5"}});
        assert!(in_scope(&unscoped, pods, &best_effort));
        assert!(in_scope(&unscoped, configmaps, &json!({})));
        let be = scoped(json!(["BestEffort"]));
        assert!(in_scope(&be, pods, &best_effort));
        assert!(!in_scope(&be, pods, &burstable));
        assert!(
            !in_scope(&be, configmaps, &json!({})),
            "scoped quotas count pods only"
        );
        assert!(in_scope(
            &scoped(json!(["NotBestEffort"])),
            pods,
            &burstable
        ));
        let term = scoped(json!(["Terminating"]));
        assert!(in_scope(&term, pods, &deadline));
        assert!(!in_scope(&term, pods, &best_effort));
        assert!(in_scope(
            &scoped(json!(["NotTerminating"])),
            pods,
            &best_effort
        ));
        // Every scope must match.
        assert!(!in_scope(
            &scoped(json!(["BestEffort", "NotTerminating"])),
            pods,
            &deadline
        ));
        let selector = |op: &str, values: Value| {
            json!({"hard": {"pods": "5"}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": op, "values": values}]}})
        };
        assert!(in_scope(&selector("In", json!(["high"])), pods, &burstable));
        assert!(!in_scope(
            &selector("In", json!(["high"])),
            pods,
            &best_effort
        ));
        assert!(in_scope(
            &selector("NotIn", json!(["high"])),
            pods,
            &best_effort
        ));
        assert!(in_scope(&selector("Exists", json!([])), pods, &burstable));
        assert!(in_scope(
            &selector("DoesNotExist", json!([])),
            pods,
            &best_effort
        ));
        let cross = pod(
            json!({"containers": [{"name": "c"}], "affinity": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k",
                "namespaces": ["other"], "labelSelector": {}}]}}}),
        );
        let cna = scoped(json!(["CrossNamespacePodAffinity"]));
        assert!(in_scope(&cna, pods, &cross));
        assert!(!in_scope(&cna, pods, &best_effort));
    }

    #[test]
    fn finished_pods_use_nothing() {
        let pods = find_resource("", "v1", "pods").expect("pods");
        let mut p = pod(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "250m"}}}]}));
        let usage = usage_of(pods, &p);
        assert_eq!(usage["pods"], Quantity::from_units(1));
        assert_eq!(usage["count/pods"], Quantity::from_units(1));
        assert_eq!(usage["requests.cpu"].to_string(), "250m");
        assert_eq!(usage["cpu"].to_string(), "250m");
        p["status"] = json!({"phase": "Succeeded"});
        assert!(usage_of(pods, &p).is_empty());
    }
}
