//! APIServices (`apiregistration.k8s.io/v1`): the registry of which API group-versions the
//! server offers, as `kubectl get apiservices` shows it. Every built-in group-version and
//! `metrics.k8s.io/v1beta1` (served by this API server itself, where Kubernetes runs
//! metrics-server) is registered as a *local* APIService, Available. One naming a Service
//! hands its group-version to that extension API server ([`crate::aggregator`]); its
//! status is the availability checker's.

use serde_json::{Value, json};

use crate::catalog::{APIREGISTRATION, Resource};
use crate::status::{ApiError, Cause};

/// Whether `res` is the APIService kind.
pub fn is_apiservice(res: &Resource) -> bool {
    res.group == APIREGISTRATION && res.kind == "APIService"
}

/// The status the server keeps on an APIService: Available for a local one; for one that
/// names a Service, the `Available` condition the availability checker writes
/// ([`crate::aggregator::available`]), its transition time kept while its status stays.
pub fn prepare(obj: &mut Value, current: Option<&Value>) {
    let available = |v: Option<&Value>| -> Option<Value> {
        v?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Available")
            .cloned()
    };
    let was = available(current);
    let since = |status: &str| {
        was.as_ref().filter(|c| c["status"] == status).map_or_else(
            || json!(tessera_core::time::rfc3339(tessera_core::time::now_secs())),
            |c| c["lastTransitionTime"].clone(),
        )
    };
    if obj["spec"]["service"].is_null() {
        obj["status"] = json!({"conditions": [{"type": "Available", "status": "True",
            "lastTransitionTime": since("True"), "reason": "Local",
            "message": "Local APIServices are always available"}]});
        return;
    }
    match available(Some(obj)) {
        Some(mut c) => {
            let status = c["status"].as_str().unwrap_or("Unknown").to_owned();
            c["lastTransitionTime"] = since(&status);
            obj["status"] = json!({"conditions": [c]});
        }
        None => match current.filter(|c| c["status"].is_object()) {
            Some(cur) if was.as_ref().is_some_and(|c| c["reason"] != "Local") => {
                obj["status"] = cur["status"].clone();
            }
            _ => {
                obj["status"] = json!({"conditions": [{"type": "Available", "status": "Unknown",
                    "lastTransitionTime": since("Unknown"), "reason": "Pending",
                    "message": "the API server has not checked the extension server yet"}]});
            }
        },
    }
}

/// Checks an APIService as Kubernetes does.
pub fn validate(obj: &Value, out: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let version = spec["version"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let want = if group.is_empty() {
        format!("{version}.")
    } else {
        format!("{version}.{group}")
    };
    if name != want {
        out.push(Cause {
            reason: "FieldValueInvalid",
            field: "metadata.name".into(),
            message: format!("Invalid value: {name:?}: must be `spec.version+\".\"+spec.group`"),
        });
    }
    if version.is_empty() {
        out.push(Cause {
            reason: "FieldValueRequired",
            field: "spec.version".into(),
            message: "Required value".into(),
        });
    }
    for (field, max) in [("groupPriorityMinimum", 20_000), ("versionPriority", 1_000)] {
        let v = spec[field].as_i64().unwrap_or(0);
        if !(1..=max).contains(&v) {
            out.push(Cause {
                reason: "FieldValueInvalid",
                field: format!("spec.{field}"),
                message: format!(
                    "Invalid value: {v}: must be positive and less than {}",
                    max + 1
                ),
            });
        }
    }
    let service = &spec["service"];
    if !service.is_null() && crate::catalog::RESOURCES.iter().any(|r| r.group == group) {
        out.push(Cause {
            reason: "FieldValueForbidden",
            field: "spec.service".into(),
            message: format!(
                "Forbidden: group {group:?} is served by this API server itself; an extension API server may serve other groups only"
            ),
        });
    }
    if !service.is_null() {
        for f in ["namespace", "name"] {
            if service[f].as_str().is_none_or(str::is_empty) {
                out.push(Cause {
                    reason: "FieldValueRequired",
                    field: format!("spec.service.{f}"),
                    message: "Required value".into(),
                });
            }
        }
        if spec["caBundle"].is_null() && spec["insecureSkipTLSVerify"] != true {
            out.push(Cause {
                reason: "FieldValueRequired",
                field: "spec.caBundle".into(),
                message: "Required value: caBundle or insecureSkipTLSVerify is required".into(),
            });
        }
    }
}

/// The local APIServices of the built-in group-versions and `metrics.k8s.io/v1beta1`, with
/// Kubernetes' priorities for the groups it has.
pub fn local() -> Vec<Value> {
    let mut gvs: Vec<(&str, &str)> = Vec::new();
    for r in crate::catalog::RESOURCES {
        if !gvs.contains(&(r.group, r.version)) {
            gvs.push((r.group, r.version));
        }
    }
    gvs.push(("metrics.k8s.io", "v1beta1"));
    gvs.iter()
        .map(|(group, version)| {
            let (group_priority, version_priority) = match *group {
                "" => (18_000, 1),
                "apps" => (17_800, 15),
                "batch" => (17_400, 15),
                "autoscaling" => (17_500, 15),
                "policy" => (17_600, 15),
                "rbac.authorization.k8s.io" => (17_000, 15),
                "apiextensions.k8s.io" => (16_700, 15),
                "certificates.k8s.io" => (17_300, 15),
                "apiregistration.k8s.io" => (18_000, 15),
                "metrics.k8s.io" => (100, 100),
                _ => (16_000, 15),
            };
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": format!("{version}.{group}"),
                    "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
                "spec": {"group": group, "version": version,
                    "groupPriorityMinimum": group_priority, "versionPriority": version_priority}})
        })
        .collect()
}

/// Creates the local APIServices that are missing.
pub async fn ensure(client: &dyn crate::client::Client) -> Result<(), ApiError> {
    let res = crate::request::find_resource(APIREGISTRATION, "v1", "apiservices")?;
    for want in local() {
        client.create_if_absent(res, None, &want).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_apiservices_are_valid_and_available() {
        let all = local();
        assert!(
            all.iter()
                .any(|a| a["metadata"]["name"] == "v1beta1.metrics.k8s.io")
        );
        assert!(all.iter().any(|a| a["metadata"]["name"] == "v1."));
        for mut a in all {
            let mut out = Vec::new();
            validate(&a, &mut out);
            assert!(out.is_empty(), "{a}: {out:?}");
            prepare(&mut a, None);
            assert_eq!(a["status"]["conditions"][0]["status"], "True");
        }
    }

    #[test]
    fn one_naming_a_service_keeps_the_checkers_condition() {
        let mut a = json!({"metadata": {"name": "v1alpha1.custom.metrics.k8s.io"},
            "spec": {"group": "custom.metrics.k8s.io", "version": "v1alpha1",
                "groupPriorityMinimum": 100, "versionPriority": 100,
                "insecureSkipTLSVerify": true,
                "service": {"namespace": "monitoring", "name": "adapter"}}});
        let mut out = Vec::new();
        validate(&a, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Not checked yet.
        prepare(&mut a, None);
        assert_eq!(a["status"]["conditions"][0]["status"], "Unknown");
        assert_eq!(a["status"]["conditions"][0]["reason"], "Pending");
        // The checker's condition is taken; a spec update without status keeps it, and its
        // transition time stays while the status does.
        let current = a.clone();
        a["status"] = json!({"conditions": [{"type": "Available", "status": "False",
            "reason": "MissingEndpoints", "message": "no endpoints"}]});
        prepare(&mut a, Some(&current));
        assert_eq!(a["status"]["conditions"][0]["reason"], "MissingEndpoints");
        let current = a.clone();
        let mut update = a.clone();
        update["status"] = Value::Null;
        prepare(&mut update, Some(&current));
        assert_eq!(update["status"], current["status"]);
        let mut again = current.clone();
        again["status"]["conditions"][0]["lastTransitionTime"] = json!("1970-01-01T00:00:00Z");
        prepare(&mut again, Some(&current));
        assert_eq!(
            again["status"]["conditions"][0]["lastTransitionTime"],
            current["status"]["conditions"][0]["lastTransitionTime"]
        );
        a["metadata"]["name"] = json!("wrong");
        a["spec"]["versionPriority"] = json!(0);
        let mut out = Vec::new();
        validate(&a, &mut out);
        let fields: Vec<&str> = out.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, vec!["metadata.name", "spec.versionPriority"]);
    }

    #[test]
    fn built_in_groups_cannot_be_handed_to_an_extension() {
        let a = json!({"metadata": {"name": "v1.apps"},
            "spec": {"group": "apps", "version": "v1",
                "groupPriorityMinimum": 100, "versionPriority": 100,
                "insecureSkipTLSVerify": true,
                "service": {"namespace": "evil", "name": "apps"}}});
        let mut out = Vec::new();
        validate(&a, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].field, "spec.service");
        assert!(out[0].message.contains("served by this API server itself"));
    }
}
