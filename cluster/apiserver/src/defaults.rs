//! Defaulting: the values Kubernetes fills in when a client leaves a field out (a Deployment's
//! rolling-update strategy, a container's pull policy, a Service port's protocol, ...), so that
//! stored objects look as they would in Kubernetes and controllers can rely on them.
//! Applied to every decoded object, before validation; idempotent.

use serde_json::{Value, json};

use crate::catalog::Resource;

fn set(obj: &mut Value, key: &str, v: Value) {
    if obj.is_object() && obj.get(key).is_none_or(Value::is_null) {
        obj[key] = v;
    }
}

/// The list `key` of `obj`, if it has one (`obj[key]` on a `&mut Value` would add a null
/// member where there is none).
fn list_mut<'a>(obj: &'a mut Value, key: &str) -> Option<&'a mut Vec<Value>> {
    obj.get_mut(key).and_then(Value::as_array_mut)
}

/// Go serializes a kind's status struct even when it is empty, with its fields that are not
/// `omitempty` at zero: Kubernetes returns these on every read. (Pods and namespaces get
/// their status from the server's own admission.)
fn empty_status(res: &Resource, obj: &mut Value) {
    let zero: &[&str] = match (res.group, res.kind) {
        ("", "Service") | ("networking.k8s.io", "Ingress") => {
            set(obj, "status", json!({}));
            set(&mut obj["status"], "loadBalancer", json!({}));
            return;
        }
        // A new claim or volume waits to be bound (Kubernetes' strategies set the phase).
        ("", "PersistentVolumeClaim") | ("", "PersistentVolume") => {
            set(obj, "status", json!({}));
            set(&mut obj["status"], "phase", json!("Pending"));
            return;
        }
        ("apps", "Deployment") | ("batch", "Job") | ("batch", "CronJob") => &[],
        ("", "ResourceQuota") => &[],
        ("apps", "ReplicaSet") | ("", "ReplicationController") => &["replicas"],
        ("autoscaling", "HorizontalPodAutoscaler") => &["desiredReplicas"],
        ("apps", "StatefulSet") => &["replicas", "availableReplicas"],
        ("apps", "DaemonSet") => &[
            "currentNumberScheduled",
            "numberMisscheduled",
            "desiredNumberScheduled",
            "numberReady",
        ],
        ("policy", "PodDisruptionBudget") => &[
            "disruptionsAllowed",
            "currentHealthy",
            "desiredHealthy",
            "expectedPods",
        ],
        _ => return,
    };
    if !obj.is_object() {
        return;
    }
    set(obj, "status", json!({}));
    for field in zero {
        set(&mut obj["status"], field, json!(0));
    }
}

/// Fills in the defaults of `res`'s kind, and the status stanza Kubernetes always returns.
pub fn apply(res: &Resource, obj: &mut Value) {
    empty_status(res, obj);
    match (res.group, res.kind) {
        ("", "Pod") => pod_spec(&mut obj["spec"]),
        // rbac/v1 defaults a User's or Group's apiGroup (clients leave it out).
        (crate::catalog::RBAC, "RoleBinding" | "ClusterRoleBinding") => {
            for s in obj["subjects"].as_array_mut().into_iter().flatten() {
                if matches!(s["kind"].as_str(), Some("User" | "Group"))
                    && s["apiGroup"].as_str().is_none_or(str::is_empty)
                {
                    s["apiGroup"] = json!(crate::catalog::RBAC);
                }
            }
        }
        (crate::catalog::ADMISSIONREGISTRATION, "ValidatingAdmissionPolicy") => {
            let spec = &mut obj["spec"];
            set(spec, "failurePolicy", json!("Fail"));
            match_resources(&mut spec["matchConstraints"]);
        }
        (crate::catalog::ADMISSIONREGISTRATION, "ValidatingAdmissionPolicyBinding") => {
            let spec = &mut obj["spec"];
            match_resources(&mut spec["matchResources"]);
            if spec["paramRef"].is_object() {
                set(
                    &mut spec["paramRef"],
                    "parameterNotFoundAction",
                    json!("Deny"),
                );
            }
        }
        (crate::catalog::ADMISSIONREGISTRATION, kind) => {
            let mutating = kind == "MutatingWebhookConfiguration";
            for hook in obj["webhooks"].as_array_mut().into_iter().flatten() {
                webhook(hook, mutating);
            }
        }
        (crate::catalog::APIEXTENSIONS, "CustomResourceDefinition") => {
            set(&mut obj["spec"], "conversion", json!({"strategy": "None"}));
        }
        ("apps", "Deployment") => {
            let spec = &mut obj["spec"];
            set(spec, "replicas", json!(1));
            set(spec, "revisionHistoryLimit", json!(10));
            set(spec, "progressDeadlineSeconds", json!(600));
            set(spec, "strategy", json!({"type": "RollingUpdate"}));
            if spec["strategy"]["type"] == "RollingUpdate" {
                set(
                    &mut spec["strategy"],
                    "rollingUpdate",
                    json!({"maxSurge": "25%", "maxUnavailable": "25%"}),
                );
            }
            template(spec);
        }
        ("autoscaling", "HorizontalPodAutoscaler") => hpa_spec(&mut obj["spec"]),
        // core/v1: the selector and the object's labels default to the template's labels.
        ("", "ReplicationController") => {
            let labels = obj["spec"]["template"]["metadata"]["labels"].clone();
            if labels.as_object().is_some_and(|l| !l.is_empty()) {
                if obj["spec"]["selector"]
                    .as_object()
                    .is_none_or(|m| m.is_empty())
                {
                    obj["spec"]["selector"] = labels.clone();
                }
                if obj["metadata"]["labels"]
                    .as_object()
                    .is_none_or(|m| m.is_empty())
                {
                    obj["metadata"]["labels"] = labels;
                }
            }
            set(&mut obj["spec"], "replicas", json!(1));
            template(&mut obj["spec"]);
        }
        ("apps", "ReplicaSet") => {
            set(&mut obj["spec"], "replicas", json!(1));
            template(&mut obj["spec"]);
        }
        ("apps", "StatefulSet") => {
            let spec = &mut obj["spec"];
            set(spec, "replicas", json!(1));
            set(spec, "podManagementPolicy", json!("OrderedReady"));
            set(spec, "revisionHistoryLimit", json!(10));
            set(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            set(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
            template(spec);
        }
        ("apps", "DaemonSet") => {
            let spec = &mut obj["spec"];
            set(spec, "revisionHistoryLimit", json!(10));
            set(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            template(spec);
        }
        ("batch", "Job") => job_spec(&mut obj["spec"]),
        ("batch", "CronJob") => {
            let spec = &mut obj["spec"];
            set(spec, "concurrencyPolicy", json!("Allow"));
            set(spec, "suspend", json!(false));
            set(spec, "successfulJobsHistoryLimit", json!(3));
            set(spec, "failedJobsHistoryLimit", json!(1));
            if spec["jobTemplate"].is_object() {
                job_spec(&mut spec["jobTemplate"]["spec"]);
            }
        }
        ("", "Service") => {
            let spec = &mut obj["spec"];
            if !spec.is_object() {
                return;
            }
            set(spec, "type", json!("ClusterIP"));
            set(spec, "sessionAffinity", json!("None"));
            if let Some(ports) = list_mut(spec, "ports") {
                for p in ports {
                    set(p, "protocol", json!("TCP"));
                    let port = p["port"].clone();
                    set(p, "targetPort", port);
                }
            }
        }
        ("", "Secret") => {
            set(obj, "type", json!("Opaque"));
            string_data(obj);
        }
        ("", "PersistentVolumeClaim") => {
            set(&mut obj["spec"], "volumeMode", json!("Filesystem"));
        }
        ("", "PersistentVolume") => {
            let spec = &mut obj["spec"];
            set(spec, "volumeMode", json!("Filesystem"));
            set(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        }
        ("", "PodTemplate") if obj["template"]["spec"].is_object() => {
            pod_spec(&mut obj["template"]["spec"]);
        }
        ("storage.k8s.io", "StorageClass") => {
            set(obj, "reclaimPolicy", json!("Delete"));
            set(obj, "volumeBindingMode", json!("Immediate"));
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            let types = if obj["spec"]["egress"].is_array() {
                json!(["Ingress", "Egress"])
            } else {
                json!(["Ingress"])
            };
            set(&mut obj["spec"], "policyTypes", types);
        }
        ("scheduling.k8s.io", "PriorityClass") => {
            set(obj, "preemptionPolicy", json!("PreemptLowerPriority"))
        }
        _ => {}
    }
}

/// A Secret's `stringData` is write-only, as in Kubernetes: each key is merged into `data`
/// (base64, over a key of the same name there) and the field is dropped.
fn string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(Value::Object(plain)) = obj.as_object_mut().and_then(|o| o.remove("stringData"))
    else {
        return;
    };
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (k, v) in plain {
        if let Some(text) = v.as_str() {
            obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
}

fn template(spec: &mut Value) {
    if spec["template"]["spec"].is_object() {
        pod_spec(&mut spec["template"]["spec"]);
    }
}

fn job_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    set(spec, "parallelism", json!(1));
    if spec["completions"].is_null() && spec["parallelism"] == json!(1) {
        spec["completions"] = json!(1);
    }
    set(spec, "backoffLimit", json!(6));
    set(spec, "completionMode", json!("NonIndexed"));
    set(spec, "suspend", json!(false));
    set(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    template(spec);
}

fn pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    set(spec, "restartPolicy", json!("Always"));
    set(spec, "dnsPolicy", json!("ClusterFirst"));
    set(spec, "schedulerName", json!("default-scheduler"));
    set(spec, "terminationGracePeriodSeconds", json!(30));
    set(spec, "securityContext", json!({}));
    set(spec, "enableServiceLinks", json!(true));
    for list in ["initContainers", "containers"] {
        if let Some(cs) = list_mut(spec, list) {
            for c in cs {
                let image = c["image"].as_str().unwrap_or_default();
                let last = image.rsplit('/').next().unwrap_or_default();
                let latest = !last.contains(':') || last.ends_with(":latest");
                let policy = if latest && !image.contains('@') {
                    "Always"
                } else {
                    "IfNotPresent"
                };
                set(c, "imagePullPolicy", json!(policy));
                set(c, "terminationMessagePath", json!("/dev/termination-log"));
                set(c, "terminationMessagePolicy", json!("File"));
                set(c, "resources", json!({}));
                requests_from_limits(c);
                if let Some(ports) = list_mut(c, "ports") {
                    for p in ports {
                        set(p, "protocol", json!("TCP"));
                    }
                }
            }
        }
    }
}

/// A container's limit without a request requests the limit (Kubernetes' defaulting; also
/// run again by LimitRange admission after it fills in default limits).
pub(crate) fn requests_from_limits(c: &mut Value) {
    let limits = c["resources"]["limits"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (k, v) in limits {
        if c["resources"]["requests"][&k].is_null() {
            c["resources"]["requests"][&k] = v;
        }
    }
}

/// admissionregistration/v1's defaults of one webhook: fail closed, equivalent-version
/// matching, every namespace and object, 10 s, rules of any scope, service port 443 and
/// (mutating) no reinvocation.
/// `matchConstraints` of a policy, `matchResources` of a binding: as a webhook's selection.
fn match_resources(m: &mut Value) {
    if !m.is_object() {
        return;
    }
    set(m, "matchPolicy", json!("Equivalent"));
    set(m, "namespaceSelector", json!({}));
    set(m, "objectSelector", json!({}));
    for key in ["resourceRules", "excludeResourceRules"] {
        for rule in m[key].as_array_mut().into_iter().flatten() {
            set(rule, "scope", json!("*"));
        }
    }
}

fn webhook(hook: &mut Value, mutating: bool) {
    set(hook, "failurePolicy", json!("Fail"));
    set(hook, "matchPolicy", json!("Equivalent"));
    set(hook, "namespaceSelector", json!({}));
    set(hook, "objectSelector", json!({}));
    set(hook, "timeoutSeconds", json!(10));
    if mutating {
        set(hook, "reinvocationPolicy", json!("Never"));
    }
    for rule in hook["rules"].as_array_mut().into_iter().flatten() {
        set(rule, "scope", json!("*"));
    }
    if let Some(service) = hook
        .get_mut("clientConfig")
        .and_then(|c| c.get_mut("service"))
        .filter(|s| s.is_object())
    {
        set(service, "port", json!(443));
    }
}

/// An HPA's defaults (`autoscaling/v2`): one replica at least; with no metrics, 80% of the
/// pods' CPU requests; and where `behavior` is given, the rules it leaves out — scale up
/// without a stabilization window by at most 4 pods or 100% per 15 s, whichever is more,
/// scale down by at most 100% per 15 s (its window, when not given, is the controller's).
pub fn hpa_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    set(spec, "minReplicas", json!(1));
    if spec["metrics"].as_array().is_none_or(Vec::is_empty) {
        spec["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 80}}}]);
    }
    let Some(behavior) = spec.get_mut("behavior").filter(|b| b.is_object()) else {
        return;
    };
    for (direction, policies) in [
        (
            "scaleUp",
            json!([{"type": "Pods", "value": 4, "periodSeconds": 15},
                {"type": "Percent", "value": 100, "periodSeconds": 15}]),
        ),
        (
            "scaleDown",
            json!([{"type": "Percent", "value": 100, "periodSeconds": 15}]),
        ),
    ] {
        set(behavior, direction, json!({}));
        let rules = &mut behavior[direction];
        if direction == "scaleUp" {
            set(rules, "stabilizationWindowSeconds", json!(0));
        }
        set(rules, "selectPolicy", json!("Max"));
        if rules["policies"].as_array().is_none_or(Vec::is_empty) {
            rules["policies"] = policies;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::find_resource;

    #[test]
    fn a_secrets_string_data_is_merged_into_data_and_dropped() {
        let res = crate::request::find_resource("", "v1", "secrets").expect("served");
        let mut s =
            json!({"data": {"a": "b2xk", "keep": "eA=="}, "stringData": {"a": "new", "b": "two"}});
        apply(res, &mut s);
        assert_eq!(s["data"], json!({"a": "bmV3", "keep": "eA==", "b": "dHdv"}));
        assert!(s.get("stringData").is_none());
        assert_eq!(s["type"], "Opaque");
    }

    #[test]
    fn deployments_get_kubernetes_defaults_once() {
        let res = find_resource("apps", "v1", "deployments").expect("served");
        let mut d = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "nginx"}, {"name": "b", "image": "reg:5000/x:1.2", "ports": [{"containerPort": 80}]}]}}}});
        apply(res, &mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        let cs = &d["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0]["imagePullPolicy"], "Always");
        assert_eq!(cs[1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(cs[1]["ports"][0]["protocol"], "TCP");
        let once = d.clone();
        apply(res, &mut d);
        assert_eq!(d, once, "defaulting is idempotent");
        let mut recreate = json!({"spec": {"strategy": {"type": "Recreate"}}});
        apply(res, &mut recreate);
        assert!(recreate["spec"]["strategy"]["rollingUpdate"].is_null());
    }
}
