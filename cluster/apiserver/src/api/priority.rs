//! Priority admission: at create, a pod's `spec.priorityClassName` is resolved to
//! `spec.priority` and `spec.preemptionPolicy`, as Kubernetes' Priority admission plugin
//! does — the global default class (or 0) when none is named, the two system classes by
//! their built-in values, and a clear refusal for a class that does not exist or a priority
//! set by hand that the class contradicts.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Api, name_of};
use crate::status::ApiError;

/// How long a read of the PriorityClasses is reused (a write here clears it at once).
const CLASSES_TTL: Duration = Duration::from_secs(1);

/// Kubernetes' built-in classes, by name, with their values.
pub(super) const SYSTEM_CLASSES: [(&str, i64); 2] = [
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

/// What a pod gets from its class: the class name, its value and preemption policy.
struct Resolved {
    class: Option<String>,
    value: i64,
    policy: Option<String>,
}

fn resolved(c: &Value) -> Resolved {
    Resolved {
        class: Some(name_of(c).to_owned()),
        value: c["value"].as_i64().unwrap_or(0),
        policy: c["preemptionPolicy"].as_str().map(str::to_owned),
    }
}

impl Api {
    /// `f` of every PriorityClass, from a list read at most `CLASSES_TTL` ago.
    async fn with_priority_classes<R>(&self, f: impl Fn(&[Value]) -> R) -> Result<R, ApiError> {
        let res = crate::request::find_resource("scheduling.k8s.io", "v1", "priorityclasses")?;
        self.with_cached(&self.priority_classes, res, CLASSES_TTL, f)
            .await
    }

    /// After a write to a PriorityClass, the next pod admitted here reads them afresh.
    pub(super) fn priority_classes_changed(&self, res: &crate::catalog::Resource) {
        if res.kind == "PriorityClass" {
            *self.priority_classes.lock() = None;
        }
    }

    /// Sets `spec.priority` (and `preemptionPolicy`, when the pod names none) from the pod's
    /// PriorityClass; refuses a class that does not exist (403), or a `spec.priority` that
    /// differs from the class's value.
    pub(super) async fn apply_priority(&self, pod: &mut Value) -> Result<(), ApiError> {
        let name = pod["spec"]["priorityClassName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let pod_name = name_of(pod).to_owned();
        let forbidden =
            |why: String| ApiError::forbidden(format!("pods \"{pod_name}\" is forbidden: {why}"));
        let found = if name.is_empty() {
            // The global default: among classes marked so, the lowest value (as Kubernetes).
            self.with_priority_classes(|list| {
                list.iter()
                    .filter(|c| c["globalDefault"] == true)
                    .min_by_key(|c| c["value"].as_i64().unwrap_or(0))
                    .map(resolved)
            })
            .await?
            .unwrap_or(Resolved {
                class: None,
                value: 0,
                policy: None,
            })
        } else {
            let stored = self
                .with_priority_classes(|list| {
                    list.iter().find(|c| name_of(c) == name).map(resolved)
                })
                .await?;
            match stored {
                Some(r) => r,
                None => match SYSTEM_CLASSES.iter().find(|(n, _)| *n == name) {
                    Some((n, v)) => Resolved {
                        class: Some((*n).to_owned()),
                        value: *v,
                        policy: None,
                    },
                    None => {
                        return Err(forbidden(format!(
                            "no PriorityClass with name {name} was found"
                        )));
                    }
                },
            }
        };
        if let Some(p) = pod["spec"]["priority"].as_i64()
            && p != found.value
        {
            return Err(forbidden(format!(
                "the integer value of priority ({p}) must not be provided in pod spec; priority admission controller computed {} from the given PriorityClass name",
                found.value
            )));
        }
        pod["spec"]["priority"] = json!(found.value);
        if let Some(class) = found.class {
            pod["spec"]["priorityClassName"] = json!(class);
        }
        if pod["spec"]["preemptionPolicy"].is_null() {
            pod["spec"]["preemptionPolicy"] =
                json!(found.policy.as_deref().unwrap_or("PreemptLowerPriority"));
        }
        Ok(())
    }
}
