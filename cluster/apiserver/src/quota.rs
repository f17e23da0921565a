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

/// Core kinds also counted by their plain name (`services: 10`).
fn counted_by_name(res: &Resource) -> bool {
    res.group.is_empty()
        && ["services", "secrets", "configmaps", "resourcequotas"].contains(&res.plural)
}

/// The object-count name of a resource (`count/deployments.apps`).
pub fn count_name(res: &Resource) -> String {
    format!("count/{}", crate::status::qualified(res.group, res.plural))
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
