//! Validation of objects after their types were checked: names, labels, quantities and the
//! rules of each kind, each failure a `Cause` with the field path, as Kubernetes reports them.

use serde_json::Value;
use tessera_core::names;
use tessera_core::quantity::Quantity;

use crate::catalog::Resource;
use crate::status::Cause;

mod hpa;
pub(crate) mod webhooks;

/// Collects causes.
#[derive(Default, Debug)]
pub struct Errors(pub Vec<Cause>);

impl Errors {
    fn required(&mut self, field: &str) {
        self.0.push(Cause {
            reason: "FieldValueRequired",
            field: field.to_owned(),
            message: "Required value".into(),
        });
    }

    fn invalid(&mut self, field: &str, value: &Value, why: impl std::fmt::Display) {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        self.0.push(Cause {
            reason: "FieldValueInvalid",
            field: field.to_owned(),
            message: format!("Invalid value: {shown}: {why}"),
        });
    }

    fn not_supported(&mut self, field: &str, value: &Value, allowed: &[&str]) {
        let quoted: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        self.0.push(Cause {
            reason: "FieldValueNotSupported",
            field: field.to_owned(),
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                quoted.join(", ")
            ),
        });
    }

    fn duplicate(&mut self, field: &str, value: &Value) {
        self.0.push(Cause {
            reason: "FieldValueDuplicate",
            field: field.to_owned(),
            message: format!("Duplicate value: {value}"),
        });
    }

    /// True if nothing was found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// `obj[key]`, where given, is one of `allowed` (the field reported as `at.key`).
fn one_of(obj: &Value, key: &str, allowed: &[&str], at: &str, e: &mut Errors) {
    if let Some(v) = obj.get(key).filter(|v| !v.is_null())
        && !v.as_str().is_some_and(|s| allowed.contains(&s))
    {
        e.not_supported(&format!("{at}.{key}"), v, allowed);
    }
}

/// Checks `obj` (already of the kind's type) for `res`.
pub fn validate(res: &Resource, obj: &Value) -> Errors {
    let mut e = Errors::default();
    metadata(res, &obj["metadata"], &mut e);
    let spec = &obj["spec"];
    match (res.group, res.kind) {
        ("", "Pod") => pod_spec(spec, "spec", false, &mut e),
        ("apps", "Deployment") | ("apps", "ReplicaSet") | ("apps", "StatefulSet") => {
            replicas(spec, &mut e);
            selected_template(spec, "spec", true, &mut e);
        }
        ("apps", "DaemonSet") => selected_template(spec, "spec", true, &mut e),
        ("", "ReplicationController") => {
            replicas(spec, &mut e);
            // Its selector is a map of labels (after defaulting, the template's): checked
            // as the equal-labels selector it stands for.
            if spec["selector"].as_object().is_none_or(|m| m.is_empty()) {
                e.required("spec.selector");
            } else {
                let mut as_set = spec.clone();
                as_set["selector"] = serde_json::json!({"matchLabels": spec["selector"]});
                selected_template(&as_set, "spec", true, &mut e);
            }
        }
        ("batch", "Job") => job_spec(spec, "spec", &mut e),
        ("batch", "CronJob") => {
            match str_at(spec, "schedule") {
                None | Some("") => e.required("spec.schedule"),
                Some(s) if s.split_whitespace().count() != 5 && !s.starts_with('@') => e.invalid(
                    "spec.schedule",
                    &spec["schedule"],
                    "a cron schedule has five fields (minute hour day-of-month month day-of-week) or is a macro like @hourly",
                ),
                _ => {}
            }
            job_spec(
                &spec["jobTemplate"]["spec"],
                "spec.jobTemplate.spec",
                &mut e,
            );
        }
        ("", "Service") => service_spec(spec, &mut e),
        ("", "Node") => {
            // The Lease a node's liveness is read from (hollow nodes share their agent's).
            let key = tessera_client::types::NODE_LEASE_ANNOTATION;
            let lease = &obj["metadata"]["annotations"][key];
            if !lease.is_null()
                && let Some(why) = lease.as_str().map_or(
                    Some("must be a string".to_owned()),
                    names::dns1123_subdomain,
                )
            {
                e.invalid(
                    &format!("metadata.annotations[{key}]"),
                    lease,
                    format!("must name a Lease in kube-node-lease (or be left out for the node's own Lease): {why}"),
                );
            }
        }
        ("", "ConfigMap") | ("", "Secret") => {
            for field in ["data", "binaryData", "stringData"] {
                if let Some(m) = obj[field].as_object() {
                    for k in m.keys() {
                        if k.is_empty()
                            || k.len() > 253
                            || !k
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
                        {
                            e.invalid(
                                &format!("{field}[{k}]"),
                                &Value::String(k.clone()),
                                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                            );
                        }
                    }
                }
            }
        }
        ("", "PersistentVolumeClaim") => {
            access_modes(&spec["accessModes"], "spec.accessModes", &mut e);
            storage_quantity(
                &spec["resources"]["requests"],
                "spec.resources.requests",
                &mut e,
            );
        }
        ("", "PersistentVolume") => {
            access_modes(&spec["accessModes"], "spec.accessModes", &mut e);
            storage_quantity(&spec["capacity"], "spec.capacity", &mut e);
            const SOURCES: &[&str] = &[
                "hostPath",
                "local",
                "nfs",
                "csi",
                "iscsi",
                "fc",
                "cephfs",
                "rbd",
                "glusterfs",
                "azureDisk",
                "azureFile",
                "awsElasticBlockStore",
                "gcePersistentDisk",
                "vsphereVolume",
                "portworxVolume",
                "scaleIO",
                "storageos",
                "quobyte",
                "flocker",
                "flexVolume",
                "cinder",
                "photonPersistentDisk",
            ];
            match SOURCES.iter().filter(|k| spec[**k].is_object()).count() {
                0 => e.required("spec"),
                1 => {}
                _ => e.invalid(
                    "spec",
                    &Value::Null,
                    "may not specify more than 1 volume type",
                ),
            }
            if let Some(p) = str_at(spec, "persistentVolumeReclaimPolicy")
                && !["Retain", "Delete", "Recycle"].contains(&p)
            {
                e.not_supported(
                    "spec.persistentVolumeReclaimPolicy",
                    &spec["persistentVolumeReclaimPolicy"],
                    &["Delete", "Recycle", "Retain"],
                );
            }
        }
        ("autoscaling", "HorizontalPodAutoscaler") => hpa::spec(spec, &mut e),
        (crate::catalog::ADMISSIONREGISTRATION, "ValidatingAdmissionPolicy") => {
            webhooks::policy(spec, &mut e);
        }
        (crate::catalog::ADMISSIONREGISTRATION, "ValidatingAdmissionPolicyBinding") => {
            webhooks::binding(spec, &mut e);
        }
        (crate::catalog::ADMISSIONREGISTRATION, kind) => {
            webhooks::configuration(obj, kind == "MutatingWebhookConfiguration", &mut e);
        }
        ("", "PodTemplate") => pod_spec(&obj["template"]["spec"], "template.spec", false, &mut e),
        ("networking.k8s.io", "Ingress") => ingress_spec(spec, &mut e),
        ("networking.k8s.io", "IngressClass")
            if str_at(spec, "controller").is_none_or(str::is_empty) =>
        {
            e.required("spec.controller");
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            if !spec["podSelector"].is_object() {
                e.required("spec.podSelector");
            } else {
                label_selector(&spec["podSelector"], "spec.podSelector", &mut e);
            }
            for (i, t) in spec["policyTypes"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if !["Ingress", "Egress"].iter().any(|x| t == *x) {
                    e.not_supported(&format!("spec.policyTypes[{i}]"), t, &["Egress", "Ingress"]);
                }
            }
            for dir in ["ingress", "egress"] {
                for (i, rule) in spec[dir].as_array().into_iter().flatten().enumerate() {
                    for (j, port) in rule["ports"].as_array().into_iter().flatten().enumerate() {
                        if let Some(p) = str_at(port, "protocol")
                            && !["TCP", "UDP", "SCTP"].contains(&p)
                        {
                            e.not_supported(
                                &format!("spec.{dir}[{i}].ports[{j}].protocol"),
                                &port["protocol"],
                                &["SCTP", "TCP", "UDP"],
                            );
                        }
                    }
                }
            }
        }
        ("storage.k8s.io", "StorageClass") => {
            if str_at(obj, "provisioner").is_none_or(str::is_empty) {
                e.required("provisioner");
            }
            if let Some(p) = str_at(obj, "reclaimPolicy")
                && !["Retain", "Delete"].contains(&p)
            {
                e.not_supported(
                    "reclaimPolicy",
                    &obj["reclaimPolicy"],
                    &["Delete", "Retain"],
                );
            }
            if let Some(m) = str_at(obj, "volumeBindingMode")
                && !["Immediate", "WaitForFirstConsumer"].contains(&m)
            {
                e.not_supported(
                    "volumeBindingMode",
                    &obj["volumeBindingMode"],
                    &["Immediate", "WaitForFirstConsumer"],
                );
            }
        }
        (crate::catalog::RBAC, "Role" | "ClusterRole") => {
            policy_rules(&obj["rules"], res.kind == "ClusterRole", &mut e);
        }
        (crate::catalog::RBAC, "RoleBinding" | "ClusterRoleBinding") => {
            role_binding(obj, res.kind == "ClusterRoleBinding", &mut e);
        }
        ("", "ResourceQuota") => quantities(&spec["hard"], "spec.hard", &mut e),
        ("", "LimitRange") => {
            for (i, item) in spec["limits"].as_array().into_iter().flatten().enumerate() {
                for f in [
                    "max",
                    "min",
                    "default",
                    "defaultRequest",
                    "maxLimitRequestRatio",
                ] {
                    quantities(&item[f], &format!("spec.limits[{i}].{f}"), &mut e);
                }
            }
        }
        ("tessera.io", "Tenant") => {
            let namespaces = spec["namespaces"].as_array().map_or(&[][..], Vec::as_slice);
            for (i, ns) in namespaces.iter().enumerate() {
                let field = format!("spec.namespaces[{i}]");
                if let Some(why) = ns.as_str().and_then(names::dns1123_label) {
                    e.invalid(&field, ns, why);
                } else if ns.as_str().is_some_and(is_system_namespace) {
                    e.invalid(
                        &field,
                        ns,
                        "is a system namespace (default, kube-*): no tenant may own it",
                    );
                } else if namespaces[..i].contains(ns) {
                    e.invalid(&field, ns, "is listed twice");
                }
            }
            for f in ["weight", "maxInflightRequests"] {
                if let Some(w) = spec[f].as_i64()
                    && w < 1
                {
                    e.invalid(
                        &format!("spec.{f}"),
                        &spec[f],
                        "must be greater than or equal to 1",
                    );
                }
            }
            quantities(&spec["quota"], "spec.quota", &mut e);
            for (i, shard) in spec["borrowFrom"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let field = format!("spec.borrowFrom[{i}]");
                match shard.as_str().map(names::dns1123_label) {
                    None => e.invalid(&field, shard, "must be a shard's name"),
                    Some(Some(why)) => e.invalid(&field, shard, why),
                    Some(None) => {}
                }
            }
            if let Some(level) = spec["podSecurity"].as_str()
                && crate::api::pod_security::Level::parse(level).is_none()
            {
                e.invalid(
                    "spec.podSecurity",
                    &spec["podSecurity"],
                    "must be one of privileged, baseline, restricted",
                );
            }
        }
        ("tessera.io", "Shard") => {
            for f in ["minNodes", "maxLend", "maxBorrow"] {
                let v = &spec["lending"][f];
                if !v.is_null() && v.as_i64().is_none_or(|n| n < 0) {
                    e.invalid(
                        &format!("spec.lending.{f}"),
                        v,
                        "must be a whole number of nodes, 0 or more",
                    );
                }
            }
            if let Some(w) = spec["weight"].as_i64()
                && !(1..=10_240).contains(&w)
            {
                e.invalid(
                    "spec.weight",
                    &spec["weight"],
                    "must be between 1 and 10240",
                );
            }
            for (i, t) in spec["taints"].as_array().into_iter().flatten().enumerate() {
                if !matches!(
                    t["effect"].as_str(),
                    Some("NoSchedule" | "NoExecute" | "PreferNoSchedule")
                ) {
                    e.invalid(
                        &format!("spec.taints[{i}].effect"),
                        &t["effect"],
                        "must be NoSchedule, NoExecute or PreferNoSchedule",
                    );
                }
            }
        }
        ("tessera.io", "Placement") => placement(spec, &mut e),
        ("tessera.io", "PodGroup") => {
            if !spec["scope"].is_null()
                && !matches!(spec["scope"].as_str(), Some("Shard" | "Federation"))
            {
                e.invalid(
                    "spec.scope",
                    &spec["scope"],
                    "must be Shard (the gang fits in one shard) or Federation (it may be divided over shards)",
                );
            }
            if spec.is_null() {
                e.required("spec");
            } else if spec["minMember"].as_i64().unwrap_or(0) < 1 {
                e.invalid(
                    "spec.minMember",
                    &spec["minMember"],
                    "must be greater than or equal to 1",
                );
            } else if spec["minMember"].as_i64().unwrap_or(0)
                > tessera_store::validation::MAX_TXN_OPS as i64
            {
                e.invalid(
                    "spec.minMember",
                    &spec["minMember"],
                    format!(
                        "must be less than or equal to {}: a gang is bound in one store transaction, which holds at most that many writes",
                        tessera_store::validation::MAX_TXN_OPS
                    ),
                );
            }
        }
        _ => {}
    }
    e
}

/// A Placement's spec: modes and divisions by name, weights that can place something, shard
/// names and labels that can match a shard (whether such a shard exists is the federation's
/// to say: shards come and go).
/// The longest `spec.failover.delaySeconds` a Placement may ask for: a day.
const MAX_FAILOVER_DELAY: i64 = 86_400;

fn placement(spec: &Value, e: &mut Errors) {
    if spec.is_null() {
        e.required("spec");
        return;
    }
    if spec["resourceSelectors"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        e.required("spec.resourceSelectors");
    }
    for (i, sel) in spec["resourceSelectors"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(kind) = sel["kind"].as_str() else {
            continue;
        };
        match tessera_client::workloads::WorkloadKind::from_kind(kind) {
            None => e.invalid(
                &format!("spec.resourceSelectors[{i}].kind"),
                &sel["kind"],
                "the federation places Deployment, ReplicaSet, StatefulSet, Job and CronJob",
            ),
            Some(k) if !k.divisible() && spec["replicas"]["scheduling"] == "Divided" => e.invalid(
                "spec.replicas.scheduling",
                &spec["replicas"]["scheduling"],
                format!(
                    "a {k} runs whole in each shard it is placed in and cannot be divided: use Home, Whole or Duplicated (resourceSelectors[{i}] selects {k})"
                ),
            ),
            Some(_) => {}
        }
    }
    for (i, sel) in spec["resourceSelectors"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, x) in sel["labelSelector"]["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !matches!(
                x["operator"].as_str(),
                Some("In" | "NotIn" | "Exists" | "DoesNotExist")
            ) {
                e.invalid(
                    &format!(
                        "spec.resourceSelectors[{i}].labelSelector.matchExpressions[{j}].operator"
                    ),
                    &x["operator"],
                    "must be In, NotIn, Exists or DoesNotExist",
                );
            }
        }
    }
    for (k, v) in spec["shardAffinity"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let field = format!("spec.shardAffinity.matchLabels[{k}]");
        if let Some(why) = names::qualified_name(k) {
            e.invalid(&field, &Value::String(k.clone()), why);
        } else if let Some(why) = v
            .as_str()
            .map_or(Some("must be a string".to_owned()), names::label_value)
        {
            e.invalid(&field, v, why);
        }
    }
    for (i, n) in spec["shardAffinity"]["shardNames"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(why) = n.as_str().and_then(names::dns1123_label) {
            e.invalid(&format!("spec.shardAffinity.shardNames[{i}]"), n, why);
        }
    }
    let r = &spec["replicas"];
    let scheduling = r["scheduling"].as_str().unwrap_or("Home");
    if !matches!(scheduling, "Home" | "Duplicated" | "Divided" | "Whole") {
        e.invalid(
            "spec.replicas.scheduling",
            &r["scheduling"],
            "must be Home, Duplicated, Divided or Whole",
        );
    }
    let division = r["division"].as_str();
    if let Some(d) = division {
        if !matches!(d, "Weighted" | "Capacity") {
            e.invalid(
                "spec.replicas.division",
                &r["division"],
                "must be Weighted or Capacity",
            );
        } else if scheduling != "Divided" {
            e.invalid(
                "spec.replicas.division",
                &r["division"],
                "applies only with scheduling: Divided",
            );
        }
    }
    let weights = r["weights"].as_array().map_or(&[][..], Vec::as_slice);
    if division == Some("Weighted") {
        if weights
            .iter()
            .all(|w| w["weight"].as_i64().unwrap_or(0) <= 0)
        {
            e.invalid(
                "spec.replicas.weights",
                &r["weights"],
                "a Weighted division needs at least one shard of positive weight",
            );
        }
    } else if !weights.is_empty() {
        e.invalid(
            "spec.replicas.weights",
            &r["weights"],
            "applies only with division: Weighted",
        );
    }
    for (i, w) in weights.iter().enumerate() {
        if w["weight"].as_i64().is_none_or(|v| v < 0) {
            e.invalid(
                &format!("spec.replicas.weights[{i}].weight"),
                &w["weight"],
                "must be a whole number, 0 or more",
            );
        }
        if let Some(why) = w["shard"]
            .as_str()
            .map_or(Some("is required".to_owned()), names::dns1123_label)
        {
            e.invalid(
                &format!("spec.replicas.weights[{i}].shard"),
                &w["shard"],
                why,
            );
        }
        if weights[..i].iter().any(|o| o["shard"] == w["shard"]) {
            e.invalid(
                &format!("spec.replicas.weights[{i}].shard"),
                &w["shard"],
                "is listed twice",
            );
        }
    }
    let failover = &spec["failover"];
    if !failover["mode"].is_null()
        && !matches!(failover["mode"].as_str(), Some("AtMostOnce" | "Fast"))
    {
        e.invalid(
            "spec.failover.mode",
            &failover["mode"],
            "must be AtMostOnce (never in two shards at once) or Fast (re-placed as soon as the lease lapses)",
        );
    }
    if !failover["delaySeconds"].is_null()
        && failover["delaySeconds"]
            .as_i64()
            .is_none_or(|d| !(0..=MAX_FAILOVER_DELAY).contains(&d))
    {
        e.invalid(
            "spec.failover.delaySeconds",
            &failover["delaySeconds"],
            format!("must be a whole number of seconds from 0 to {MAX_FAILOVER_DELAY} (a day)"),
        );
    }
    let spread = spec["spreadConstraints"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if !spread.is_empty() && !matches!(scheduling, "Duplicated" | "Divided") {
        e.invalid(
            "spec.spreadConstraints",
            &spec["spreadConstraints"],
            "spreads replicas over groups of shards: use it with scheduling Duplicated or Divided",
        );
    }
    for (i, c) in spread.iter().enumerate() {
        let field = |f: &str| format!("spec.spreadConstraints[{i}].{f}");
        if let Some(why) = c["spreadByLabel"]
            .as_str()
            .map_or(Some("is required".to_owned()), names::qualified_name)
        {
            e.invalid(&field("spreadByLabel"), &c["spreadByLabel"], why);
        }
        if spread[..i]
            .iter()
            .any(|o| o["spreadByLabel"] == c["spreadByLabel"])
        {
            e.invalid(
                &field("spreadByLabel"),
                &c["spreadByLabel"],
                "is listed twice",
            );
        }
        let min = c["minGroups"].as_i64();
        let max = c["maxGroups"].as_i64();
        if !c["minGroups"].is_null() && min.is_none_or(|m| m < 1) {
            e.invalid(&field("minGroups"), &c["minGroups"], "must be 1 or more");
        }
        if !c["maxGroups"].is_null() && max.is_none_or(|m| m < 1) {
            e.invalid(&field("maxGroups"), &c["maxGroups"], "must be 1 or more");
        }
        if let (Some(lo), Some(hi)) = (min, max)
            && lo > hi
        {
            e.invalid(
                &field("maxGroups"),
                &c["maxGroups"],
                format!("must be at least minGroups ({lo})"),
            );
        }
    }
}

/// A claim's or volume's access modes: at least one, each one Kubernetes knows.
fn access_modes(modes: &Value, path: &str, e: &mut Errors) {
    const MODES: &[&str] = &[
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOnce",
        "ReadWriteOncePod",
    ];
    let list = modes.as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        e.0.push(Cause {
            reason: "FieldValueRequired",
            field: path.to_owned(),
            message: "Required value: at least 1 access mode is required".into(),
        });
    }
    for (i, m) in list.iter().enumerate() {
        if !MODES.iter().any(|x| m == *x) {
            e.not_supported(&format!("{path}[{i}]"), m, MODES);
        }
    }
}

/// The `storage` quantity of `map`: present and more than zero.
fn storage_quantity(map: &Value, path: &str, e: &mut Errors) {
    let at = format!("{path}[storage]");
    match map["storage"].as_str().map(str::parse::<Quantity>) {
        None => e.required(&at),
        Some(Err(why)) => e.invalid(&at, &map["storage"], why),
        Some(Ok(q)) if q <= Quantity::ZERO => {
            e.invalid(&at, &map["storage"], "must be greater than zero");
        }
        Some(Ok(_)) => {}
    }
}

/// Kubernetes' Ingress rules: each path with a `pathType` (an `Exact` or `Prefix` path
/// absolute), each backend a Service (with a port by number or name) or a resource, not both.
fn ingress_spec(spec: &Value, e: &mut Errors) {
    let backend = |b: &Value, at: &str, e: &mut Errors| match (
        b["service"].is_object(),
        b["resource"].is_object(),
    ) {
        (true, true) => e.invalid(
            at,
            &Value::Null,
            "cannot set both service and resource backends",
        ),
        (false, false) => e.required(&format!("{at}.service")),
        (true, false) => {
            let svc = &b["service"];
            if str_at(svc, "name").is_none_or(str::is_empty) {
                e.required(&format!("{at}.service.name"));
            }
            let port = &svc["port"];
            if port["number"].is_null() == port["name"].is_null() {
                e.invalid(
                    &format!("{at}.service.port"),
                    port,
                    "must specify one of port.number or port.name",
                );
            }
        }
        (false, true) => {}
    };
    if spec["defaultBackend"].is_object() {
        backend(&spec["defaultBackend"], "spec.defaultBackend", e);
    }
    for (i, rule) in spec["rules"].as_array().into_iter().flatten().enumerate() {
        if let Some(host) = str_at(rule, "host") {
            let bare = host.strip_prefix("*.").unwrap_or(host);
            if host.parse::<std::net::IpAddr>().is_ok() {
                e.invalid(
                    &format!("spec.rules[{i}].host"),
                    &rule["host"],
                    "must be a DNS name, not an IP address",
                );
            } else if let Some(why) = names::dns1123_subdomain(bare) {
                e.invalid(&format!("spec.rules[{i}].host"), &rule["host"], why);
            }
        }
        for (j, p) in rule["http"]["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = format!("spec.rules[{i}].http.paths[{j}]");
            // The typed decode makes a missing `pathType` (a required Go string) "".
            match str_at(p, "pathType") {
                None | Some("") => e.required(&format!("{at}.pathType")),
                Some("Exact" | "Prefix") => {
                    if !str_at(p, "path").is_some_and(|x| x.starts_with('/')) {
                        e.invalid(
                            &format!("{at}.path"),
                            &p["path"],
                            "must be an absolute path",
                        );
                    }
                }
                Some("ImplementationSpecific") => {}
                Some(_) => e.not_supported(
                    &format!("{at}.pathType"),
                    &p["pathType"],
                    &["Exact", "ImplementationSpecific", "Prefix"],
                ),
            }
            backend(&p["backend"], &format!("{at}.backend"), e);
        }
    }
}

/// Kubernetes' `ValidatePolicyRule`: every rule names verbs, and either API groups and
/// resources or (in a ClusterRole only) non-resource URLs, not both.
fn policy_rules(rules: &Value, cluster: bool, e: &mut Errors) {
    for (i, r) in rules.as_array().into_iter().flatten().enumerate() {
        let at = format!("rules[{i}]");
        let len = |k: &str| r[k].as_array().map_or(0, Vec::len);
        if len("verbs") == 0 {
            e.required(&format!("{at}.verbs"));
        }
        let urls = len("nonResourceURLs");
        if urls > 0 {
            if !cluster {
                e.invalid(
                    &format!("{at}.nonResourceURLs"),
                    &r["nonResourceURLs"],
                    "namespaced rules cannot apply to non-resource URLs",
                );
            }
            if len("apiGroups") > 0 || len("resources") > 0 || len("resourceNames") > 0 {
                e.invalid(
                    &format!("{at}.nonResourceURLs"),
                    &r["nonResourceURLs"],
                    "rules cannot apply to both regular resources and non-resource URLs",
                );
            }
            for (j, u) in r["nonResourceURLs"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let u = u.as_str().unwrap_or_default();
                if !(u == "*" || u.starts_with('/')) || u[..u.len().saturating_sub(1)].contains('*')
                {
                    e.invalid(
                        &format!("{at}.nonResourceURLs[{j}]"),
                        &r["nonResourceURLs"][j],
                        "must be \"*\" or a path starting with \"/\", with \"*\" only at its end",
                    );
                }
            }
            continue;
        }
        if len("apiGroups") == 0 {
            e.required(&format!("{at}.apiGroups"));
        }
        if len("resources") == 0 {
            e.required(&format!("{at}.resources"));
        }
    }
}

/// Kubernetes' `ValidateRoleBinding`: a roleRef to a Role or ClusterRole of RBAC's group
/// (a ClusterRoleBinding's only to a ClusterRole), and subjects that are users, groups or
/// ServiceAccounts, each named.
fn role_binding(obj: &Value, cluster: bool, e: &mut Errors) {
    let rr = &obj["roleRef"];
    if rr["apiGroup"] != crate::catalog::RBAC {
        e.not_supported("roleRef.apiGroup", &rr["apiGroup"], &[crate::catalog::RBAC]);
    }
    let kinds: &[&str] = if cluster {
        &["ClusterRole"]
    } else {
        &["Role", "ClusterRole"]
    };
    if !kinds.iter().any(|k| rr["kind"] == *k) {
        e.not_supported("roleRef.kind", &rr["kind"], kinds);
    }
    match str_at(rr, "name") {
        None | Some("") => e.required("roleRef.name"),
        Some(n) => {
            if let Some(why) = path_segment_name(n) {
                e.invalid("roleRef.name", &rr["name"], why);
            }
        }
    }
    for (i, s) in obj["subjects"].as_array().into_iter().flatten().enumerate() {
        let at = format!("subjects[{i}]");
        if str_at(s, "name").is_none_or(str::is_empty) {
            e.required(&format!("{at}.name"));
        }
        match str_at(s, "kind") {
            Some("ServiceAccount") => {
                if s["apiGroup"].as_str().is_some_and(|g| !g.is_empty()) {
                    e.not_supported(&format!("{at}.apiGroup"), &s["apiGroup"], &[""]);
                }
                if cluster && str_at(s, "namespace").is_none_or(str::is_empty) {
                    e.required(&format!("{at}.namespace"));
                }
            }
            Some("User" | "Group") => {
                if s["apiGroup"] != crate::catalog::RBAC {
                    e.not_supported(
                        &format!("{at}.apiGroup"),
                        &s["apiGroup"],
                        &[crate::catalog::RBAC],
                    );
                }
            }
            _ => e.not_supported(
                &format!("{at}.kind"),
                &s["kind"],
                &["ServiceAccount", "User", "Group"],
            ),
        }
    }
}

/// Why `name` cannot be a name that goes into a request path (RBAC's names, which may hold
/// `:`), if it cannot.
fn path_segment_name(name: &str) -> Option<&'static str> {
    if name == "." || name == ".." {
        Some("may not be '.' or '..'")
    } else if name.contains('/') || name.contains('%') {
        Some("may not contain '/' or '%'")
    } else {
        None
    }
}

fn metadata(res: &Resource, meta: &Value, e: &mut Errors) {
    if let Some(name) = str_at(meta, "name") {
        let why = if res.plural == "namespaces" || res.plural == "services" {
            names::dns1123_label(name)
        } else if res.group == crate::catalog::RBAC || res.group == crate::catalog::APIREGISTRATION
        {
            path_segment_name(name).map(str::to_owned)
        } else {
            names::dns1123_subdomain(name)
        };
        if let Some(why) = why {
            e.invalid("metadata.name", &meta["name"], why);
        }
    }
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            if let Some(why) = names::qualified_name(k) {
                e.invalid("metadata.labels", &Value::String(k.clone()), why);
            }
            if let Some(why) = v.as_str().and_then(names::label_value) {
                e.invalid(&format!("metadata.labels[{k}]"), v, why);
            }
        }
    }
    if let Some(annotations) = meta["annotations"].as_object() {
        let mut total = 0;
        for (k, v) in annotations {
            total += k.len() + v.as_str().map_or(0, str::len);
            if let Some(why) = names::qualified_name(&k.to_lowercase()) {
                e.invalid("metadata.annotations", &Value::String(k.clone()), why);
            }
        }
        if total > 256 * 1024 {
            e.0.push(Cause {
                reason: "FieldValueTooLong",
                field: "metadata.annotations".into(),
                message: format!("Too long: may not be more than 262144 bytes (these are {total})"),
            });
        }
    }
    for (i, f) in meta["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(why) = f.as_str().and_then(names::qualified_name) {
            e.invalid(&format!("metadata.finalizers[{i}]"), f, why);
        }
    }
}

fn quantities(map: &Value, path: &str, e: &mut Errors) {
    for (k, v) in map.as_object().into_iter().flatten() {
        if let Some(s) = v.as_str()
            && let Err(why) = s.parse::<Quantity>()
        {
            e.invalid(&format!("{path}[{k}]"), v, why);
        }
    }
}

fn replicas(spec: &Value, e: &mut Errors) {
    if let Some(r) = spec["replicas"].as_i64()
        && r < 0
    {
        e.invalid(
            "spec.replicas",
            &spec["replicas"],
            "must be greater than or equal to 0",
        );
    }
}

/// `spec.selector` + `spec.template` of the workload kinds.
fn selected_template(spec: &Value, path: &str, always_restart: bool, e: &mut Errors) {
    let selector = &spec["selector"];
    let template_labels = &spec["template"]["metadata"]["labels"];
    if selector.is_null() {
        e.required(&format!("{path}.selector"));
    } else {
        let match_labels = selector["matchLabels"].as_object();
        let exprs = selector["matchExpressions"].as_array();
        if match_labels.is_none_or(|m| m.is_empty()) && exprs.is_none_or(|x| x.is_empty()) {
            e.invalid(
                &format!("{path}.selector"),
                selector,
                "empty selector is invalid for deployment",
            );
        }
        let valid = label_selector(selector, &format!("{path}.selector"), e);
        let labels_match = match_labels
            .into_iter()
            .flatten()
            .all(|(k, v)| template_labels.get(k) == Some(v))
            && (!valid
                || exprs
                    .into_iter()
                    .flatten()
                    .all(|x| expression_matches(x, template_labels)));
        if !labels_match {
            e.invalid(
                &format!("{path}.template.metadata.labels"),
                template_labels,
                "`selector` does not match template `labels`",
            );
        }
    }
    if spec["template"].is_null() {
        e.required(&format!("{path}.template"));
        return;
    }
    pod_spec(
        &spec["template"]["spec"],
        &format!("{path}.template.spec"),
        always_restart,
        e,
    );
}

/// A `metav1.LabelSelector`'s rules (Kubernetes' `ValidateLabelSelector`): label keys
/// and values well formed; operators `In`, `NotIn` (with values), `Exists`, `DoesNotExist`
/// (without). True if it is valid.
fn label_selector(sel: &Value, path: &str, e: &mut Errors) -> bool {
    let before = e.0.len();
    for (k, v) in sel["matchLabels"].as_object().into_iter().flatten() {
        if let Some(why) = names::qualified_name(k) {
            e.invalid(
                &format!("{path}.matchLabels"),
                &Value::String(k.clone()),
                why,
            );
        }
        if let Some(why) = v.as_str().and_then(names::label_value) {
            e.invalid(&format!("{path}.matchLabels"), v, why);
        }
    }
    for (i, x) in sel["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("{path}.matchExpressions[{i}]");
        let key = x["key"].as_str().unwrap_or_default();
        if let Some(why) = names::qualified_name(key) {
            e.invalid(&format!("{at}.key"), &x["key"], why);
        }
        let values = x["values"].as_array().map_or(0, Vec::len);
        match x["operator"].as_str().unwrap_or_default() {
            "In" | "NotIn" if values == 0 => e.required(&format!("{at}.values")),
            "Exists" | "DoesNotExist" if values > 0 => e.invalid(
                &format!("{at}.values"),
                &x["values"],
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => e.not_supported(
                &format!("{at}.operator"),
                &x["operator"],
                &["DoesNotExist", "Exists", "In", "NotIn"],
            ),
        }
    }
    e.0.len() == before
}

/// Whether labels `labels` satisfy one (valid) selector expression.
fn expression_matches(x: &Value, labels: &Value) -> bool {
    let key = x["key"].as_str().unwrap_or_default();
    let have = labels.get(key).and_then(Value::as_str);
    let listed = || {
        x["values"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.as_str() == have)
    };
    match x["operator"].as_str().unwrap_or_default() {
        "In" => have.is_some() && listed(),
        "NotIn" => have.is_none() || !listed(),
        "Exists" => have.is_some(),
        _ => have.is_none(),
    }
}

fn job_spec(spec: &Value, path: &str, e: &mut Errors) {
    for f in ["parallelism", "completions", "backoffLimit"] {
        if let Some(n) = spec[f].as_i64()
            && n < 0
        {
            e.invalid(
                &format!("{path}.{f}"),
                &spec[f],
                "must be greater than or equal to 0",
            );
        }
    }
    if spec["template"].is_null() {
        e.required(&format!("{path}.template"));
        return;
    }
    let tpath = format!("{path}.template.spec");
    let pod = &spec["template"]["spec"];
    match str_at(pod, "restartPolicy") {
        Some("OnFailure") | Some("Never") => {}
        None => e.required(&format!("{tpath}.restartPolicy")),
        Some(_) => e.not_supported(
            &format!("{tpath}.restartPolicy"),
            &pod["restartPolicy"],
            &["OnFailure", "Never"],
        ),
    }
    pod_spec(pod, &tpath, false, e);
}

fn pod_spec(spec: &Value, path: &str, always_restart: bool, e: &mut Errors) {
    let containers = spec["containers"].as_array();
    match containers {
        None => e.required(&format!("{path}.containers")),
        Some(c) if c.is_empty() => e.required(&format!("{path}.containers")),
        _ => {}
    }
    // As Kubernetes' ValidatePodSpec: a node name is a DNS subdomain (bindings set it too).
    if let Some(node) = str_at(spec, "nodeName").filter(|n| !n.is_empty())
        && let Some(why) = names::dns1123_subdomain(node)
    {
        e.invalid(&format!("{path}.nodeName"), &spec["nodeName"], why);
    }
    let mut seen = std::collections::HashSet::new();
    for (list, items) in [
        ("initContainers", spec["initContainers"].as_array()),
        ("containers", containers),
    ] {
        for (i, c) in items.into_iter().flatten().enumerate() {
            let cpath = format!("{path}.{list}[{i}]");
            match str_at(c, "name") {
                None | Some("") => e.required(&format!("{cpath}.name")),
                Some(n) => {
                    if let Some(why) = names::dns1123_label(n) {
                        e.invalid(&format!("{cpath}.name"), &c["name"], why);
                    } else if !seen.insert(n.to_owned()) {
                        e.duplicate(&format!("{cpath}.name"), &c["name"]);
                    }
                }
            }
            if str_at(c, "image").is_none_or(|i| i.trim().is_empty()) {
                e.required(&format!("{cpath}.image"));
            }
            for (j, p) in c["ports"].as_array().into_iter().flatten().enumerate() {
                let port = p["containerPort"].as_i64().unwrap_or(0);
                if !(1..=65535).contains(&port) {
                    e.invalid(
                        &format!("{cpath}.ports[{j}].containerPort"),
                        &p["containerPort"],
                        "must be between 1 and 65535, inclusive",
                    );
                }
            }
            let requests = &c["resources"]["requests"];
            let limits = &c["resources"]["limits"];
            quantities(requests, &format!("{cpath}.resources.requests"), e);
            quantities(limits, &format!("{cpath}.resources.limits"), e);
            for (k, req) in requests.as_object().into_iter().flatten() {
                let (Some(r), Some(l)) = (
                    req.as_str().and_then(|s| s.parse::<Quantity>().ok()),
                    limits[k].as_str().and_then(|s| s.parse::<Quantity>().ok()),
                ) else {
                    continue;
                };
                if r > l {
                    e.invalid(
                        &format!("{cpath}.resources.requests"),
                        req,
                        format!("must be less than or equal to {k} limit of {l}"),
                    );
                }
            }
        }
    }
    if let Some(p) = spec.get("restartPolicy").filter(|p| !p.is_null()) {
        let allowed: &[&str] = if always_restart {
            &["Always"]
        } else {
            &["Always", "OnFailure", "Never"]
        };
        if !p.as_str().is_some_and(|s| allowed.contains(&s)) {
            e.not_supported(&format!("{path}.restartPolicy"), p, allowed);
        }
    }
    spread_constraints(spec, path, e);
    pod_affinity(spec, path, e);
}

/// `topologySpreadConstraints`, by Kubernetes' rules: a positive maxSkew, a topologyKey,
/// one of the two whenUnsatisfiable actions, each (topologyKey, whenUnsatisfiable) pair once,
/// minDomains only when the constraint is hard, the node inclusion policies, and
/// matchLabelKeys that are not already in the selector.
fn spread_constraints(spec: &Value, path: &str, e: &mut Errors) {
    let mut pairs = std::collections::HashSet::new();
    let list = spec["topologySpreadConstraints"].as_array();
    for (i, c) in list.into_iter().flatten().enumerate() {
        let at = format!("{path}.topologySpreadConstraints[{i}]");
        if c["maxSkew"].as_i64().is_none_or(|s| s <= 0) {
            e.invalid(
                &format!("{at}.maxSkew"),
                &c["maxSkew"],
                "must be greater than zero",
            );
        }
        let key = str_at(c, "topologyKey").unwrap_or_default();
        if key.is_empty() {
            e.required(&format!("{at}.topologyKey"));
        } else if let Some(why) = names::qualified_name(key) {
            e.invalid(&format!("{at}.topologyKey"), &c["topologyKey"], why);
        }
        let when = str_at(c, "whenUnsatisfiable").unwrap_or_default();
        if !matches!(when, "DoNotSchedule" | "ScheduleAnyway") {
            e.not_supported(
                &format!("{at}.whenUnsatisfiable"),
                &c["whenUnsatisfiable"],
                &["DoNotSchedule", "ScheduleAnyway"],
            );
        } else if !key.is_empty() && !pairs.insert((key, when)) {
            e.duplicate(
                &format!("{at}.{{topologyKey, whenUnsatisfiable}}"),
                &Value::String(format!("{{{key}, {when}}}")),
            );
        }
        if let Some(m) = c.get("minDomains").filter(|m| !m.is_null()) {
            if m.as_i64().is_none_or(|m| m <= 0) {
                e.invalid(&format!("{at}.minDomains"), m, "must be greater than 0");
            } else if when == "ScheduleAnyway" {
                e.invalid(
                    &format!("{at}.minDomains"),
                    m,
                    "can only use minDomains if whenUnsatisfiable=DoNotSchedule, not ScheduleAnyway",
                );
            }
        }
        for policy in ["nodeAffinityPolicy", "nodeTaintsPolicy"] {
            if let Some(v) = c.get(policy).filter(|v| !v.is_null())
                && !matches!(v.as_str(), Some("Honor" | "Ignore"))
            {
                e.not_supported(&format!("{at}.{policy}"), v, &["Honor", "Ignore"]);
            }
        }
        let selector = &c["labelSelector"];
        if selector.is_object() {
            label_selector(selector, &format!("{at}.labelSelector"), e);
        }
        for (j, k) in c["matchLabelKeys"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let kpath = format!("{at}.matchLabelKeys[{j}]");
            let Some(k) = k.as_str() else { continue };
            if !selector.is_object() {
                e.invalid(
                    &kpath,
                    &Value::String(k.into()),
                    "must not be specified when labelSelector is not set",
                );
            } else if selector["matchLabels"].get(k).is_some()
                || selector["matchExpressions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|x| x["key"] == k)
            {
                e.invalid(
                    &kpath,
                    &Value::String(k.into()),
                    "exists in both matchLabelKeys and labelSelector",
                );
            } else if let Some(why) = names::qualified_name(k) {
                e.invalid(&kpath, &Value::String(k.into()), why);
            }
        }
    }
}

/// Pod affinity and anti-affinity terms: each needs a topologyKey and valid selectors;
/// preferred terms weigh 1 to 100.
fn pod_affinity(spec: &Value, path: &str, e: &mut Errors) {
    for kind in ["podAffinity", "podAntiAffinity"] {
        let a = &spec["affinity"][kind];
        let at = format!("{path}.affinity.{kind}");
        let required = "requiredDuringSchedulingIgnoredDuringExecution";
        for (i, t) in a[required].as_array().into_iter().flatten().enumerate() {
            affinity_term(t, &format!("{at}.{required}[{i}]"), e);
        }
        let preferred = "preferredDuringSchedulingIgnoredDuringExecution";
        for (i, w) in a[preferred].as_array().into_iter().flatten().enumerate() {
            let wpath = format!("{at}.{preferred}[{i}]");
            if w["weight"].as_i64().is_none_or(|w| !(1..=100).contains(&w)) {
                e.invalid(
                    &format!("{wpath}.weight"),
                    &w["weight"],
                    "must be in the range 1-100",
                );
            }
            affinity_term(
                &w["podAffinityTerm"],
                &format!("{wpath}.podAffinityTerm"),
                e,
            );
        }
    }
}

fn affinity_term(t: &Value, at: &str, e: &mut Errors) {
    match str_at(t, "topologyKey").unwrap_or_default() {
        "" => e.required(&format!("{at}.topologyKey")),
        key => {
            if let Some(why) = names::qualified_name(key) {
                e.invalid(&format!("{at}.topologyKey"), &t["topologyKey"], why);
            }
        }
    }
    for sel in ["labelSelector", "namespaceSelector"] {
        if t[sel].is_object() {
            label_selector(&t[sel], &format!("{at}.{sel}"), e);
        }
    }
}

fn service_spec(spec: &Value, e: &mut Errors) {
    let headless = str_at(spec, "clusterIP") == Some("None");
    let ty = str_at(spec, "type").unwrap_or("ClusterIP");
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty) {
        e.not_supported(
            "spec.type",
            &spec["type"],
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        );
    }
    let ports = spec["ports"].as_array();
    if ports.is_none_or(|p| p.is_empty()) && !headless && ty != "ExternalName" {
        e.required("spec.ports");
    }
    for (i, p) in ports.into_iter().flatten().enumerate() {
        let port = p["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&port) {
            e.invalid(
                &format!("spec.ports[{i}].port"),
                &p["port"],
                "must be between 1 and 65535, inclusive",
            );
        }
    }
}

/// Namespaces the shard's own components use: `default` and every `kube-*` one.
pub fn is_system_namespace(ns: &str) -> bool {
    ns == "default" || ns.starts_with("kube-")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::request::find_resource;

    fn check(group: &str, plural: &str, obj: Value) -> Vec<String> {
        let res = find_resource(group, "v1", plural).expect("served");
        validate(res, &obj)
            .0
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    fn check_tessera(plural: &str, obj: Value) -> Vec<String> {
        let res = find_resource("tessera.io", "v1alpha1", plural).expect("served");
        validate(res, &obj)
            .0
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn placements_and_shards_report_each_field() {
        let good = json!({"metadata": {"name": "p", "namespace": "t"}, "spec": {
            "resourceSelectors": [{"kind": "Deployment", "labelSelector": {"matchExpressions":
                [{"key": "app", "operator": "In", "values": ["web"]}]}}],
            "shardAffinity": {"shardNames": ["shard-0"], "matchLabels": {"region": "eu"}},
            "replicas": {"scheduling": "Divided", "division": "Weighted",
                "weights": [{"shard": "shard-0", "weight": 1}]},
            "spreadConstraints": [{"spreadByLabel": "region", "minGroups": 2, "maxGroups": 3}],
            "failover": {"mode": "AtMostOnce", "delaySeconds": 60}}});
        assert_eq!(check_tessera("placements", good), Vec::<String>::new());
        let bad = json!({"metadata": {"name": "p", "namespace": "t"}, "spec": {
            "resourceSelectors": [{"kind": "Pod", "labelSelector": {"matchExpressions":
                [{"key": "app", "operator": "Near"}]}}],
            "shardAffinity": {"shardNames": ["Shard_0"], "matchLabels": {"region": "not ok"}},
            "replicas": {"scheduling": "Home", "division": "Weighted",
                "weights": [{"shard": "a", "weight": -1}, {"shard": "a", "weight": 1}]},
            "spreadConstraints": [{"spreadByLabel": "zone", "minGroups": 3, "maxGroups": 2},
                {"spreadByLabel": "zone", "minGroups": 0}, {"spreadByLabel": "bad key!"}],
            "failover": {"mode": "Eventually", "delaySeconds": -1}}});
        let got = check_tessera("placements", bad);
        for want in [
            "spec.resourceSelectors[0].kind: Invalid value: \"Pod\"",
            "spec.resourceSelectors[0].labelSelector.matchExpressions[0].operator: Invalid value: \"Near\"",
            "spec.shardAffinity.shardNames[0]: Invalid value: \"Shard_0\"",
            "spec.shardAffinity.matchLabels[region]: Invalid value: \"not ok\"",
            "spec.replicas.division: Invalid value: \"Weighted\": applies only with scheduling: Divided",
            "spec.replicas.weights[0].weight: Invalid value: -1",
            "spec.replicas.weights[1].shard: Invalid value: \"a\": is listed twice",
            "spec.spreadConstraints: Invalid value:",
            "spec.spreadConstraints[0].maxGroups: Invalid value: 2: must be at least minGroups (3)",
            "spec.spreadConstraints[1].spreadByLabel: Invalid value: \"zone\": is listed twice",
            "spec.spreadConstraints[1].minGroups: Invalid value: 0: must be 1 or more",
            "spec.spreadConstraints[2].spreadByLabel: Invalid value: \"bad key!\"",
            "spec.failover.mode: Invalid value: \"Eventually\": must be AtMostOnce",
            "spec.failover.delaySeconds: Invalid value: -1: must be a whole number of seconds from 0 to 86400",
        ] {
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "missing {want:?} in {got:#?}"
            );
        }
        let job_divided = json!({"metadata": {"name": "p", "namespace": "t"}, "spec": {
            "resourceSelectors": [{"kind": "Deployment"}, {"kind": "Job", "name": "etl"}],
            "replicas": {"scheduling": "Divided", "division": "Capacity"}}});
        let got = check_tessera("placements", job_divided);
        assert!(
            got.iter().any(|g| g.starts_with(
                "spec.replicas.scheduling: Invalid value: \"Divided\": a Job runs whole"
            ) && g.contains("resourceSelectors[1]")),
            "{got:#?}"
        );
        let cron_whole = json!({"metadata": {"name": "p", "namespace": "t"}, "spec": {
            "resourceSelectors": [{"kind": "CronJob"}, {"kind": "StatefulSet"}],
            "replicas": {"scheduling": "Whole"}}});
        assert_eq!(
            check_tessera("placements", cron_whole),
            Vec::<String>::new()
        );
        let shard = json!({"metadata": {"name": "s"}, "spec": {"weight": 0,
            "taints": [{"key": "k", "effect": "Sometimes"}]}});
        let got = check_tessera("shards", shard);
        assert!(
            got.iter()
                .any(|g| g.starts_with("spec.weight: Invalid value: 0")),
            "{got:#?}"
        );
        assert!(
            got.iter()
                .any(|g| g.starts_with("spec.taints[0].effect: Invalid value: \"Sometimes\"")),
            "{got:#?}"
        );
    }

    /// Spread constraints and pod (anti-)affinity terms, checked as Kubernetes checks them.
    #[test]
    fn spread_constraints_and_pod_affinity_report_each_field() {
        let good = json!({"metadata": {"name": "p", "namespace": "t", "labels": {"app": "w"}},
            "spec": {"containers": [{"name": "c", "image": "x"}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                 "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3,
                 "labelSelector": {"matchLabels": {"app": "w"}}, "matchLabelKeys": ["pod-template-hash"],
                 "nodeAffinityPolicy": "Ignore", "nodeTaintsPolicy": "Honor"},
                {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
                 "whenUnsatisfiable": "ScheduleAnyway"}],
            "affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "w"}}}],
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
                    "podAffinityTerm": {"topologyKey": "zone", "namespaceSelector": {}}}]}}}});
        assert_eq!(check("", "pods", good), Vec::<String>::new());
        let bad = json!({"metadata": {"name": "p", "namespace": "t"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
            "topologySpreadConstraints": [
                {"maxSkew": 0, "topologyKey": "", "whenUnsatisfiable": "Sometimes"},
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2,
                 "nodeAffinityPolicy": "Maybe", "labelSelector": {"matchLabels": {"app": "w"}},
                 "matchLabelKeys": ["app"]},
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
            "affinity": {"podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector":
                    {"matchExpressions": [{"key": "app", "operator": "Near"}]}}],
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 101,
                    "podAffinityTerm": {"topologyKey": "zone"}}]}}}});
        let got = check("", "pods", bad);
        let c = "spec.topologySpreadConstraints";
        let a = "spec.affinity.podAffinity";
        for want in [
            format!("{c}[0].maxSkew: Invalid value: 0: must be greater than zero"),
            format!("{c}[0].topologyKey: Required value"),
            format!("{c}[0].whenUnsatisfiable: Unsupported value: \"Sometimes\""),
            format!(
                "{c}[1].minDomains: Invalid value: 2: can only use minDomains if whenUnsatisfiable=DoNotSchedule"
            ),
            format!("{c}[1].nodeAffinityPolicy: Unsupported value: \"Maybe\""),
            format!(
                "{c}[1].matchLabelKeys[0]: Invalid value: \"app\": exists in both matchLabelKeys and labelSelector"
            ),
            format!(
                "{c}[2].{{topologyKey, whenUnsatisfiable}}: Duplicate value: \"{{zone, ScheduleAnyway}}\""
            ),
            format!(
                "{a}.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value"
            ),
            format!(
                "{a}.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator: Unsupported value: \"Near\""
            ),
            format!(
                "{a}.preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 101: must be in the range 1-100"
            ),
        ] {
            assert!(
                got.iter().any(|g| g.starts_with(&want)),
                "missing {want:?} in {got:#?}"
            );
        }
        assert_eq!(got.len(), 10, "{got:#?}");
    }

    #[test]
    fn a_good_deployment_passes() {
        let ok = json!({"metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx",
                        "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}]}}}});
        assert_eq!(check("apps", "deployments", ok), Vec::<String>::new());
    }

    #[test]
    fn each_rule_reports_its_field() {
        let bad = json!({"metadata": {"name": "Web_1", "labels": {"-bad": "x"}},
            "spec": {"replicas": -1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "other"}},
                    "spec": {"restartPolicy": "Never", "containers": [
                        {"name": "c", "image": ""},
                        {"name": "c", "image": "i", "ports": [{"containerPort": 70000}],
                         "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1", "memory": "lots"}}}]}}}});
        let got = check("apps", "deployments", bad);
        for want in [
            "metadata.name: Invalid value: \"Web_1\"",
            "metadata.labels: Invalid value: \"-bad\"",
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
            "spec.template.metadata.labels: Invalid value",
            "spec.template.spec.containers[0].image: Required value",
            "spec.template.spec.containers[1].name: Duplicate value: \"c\"",
            "spec.template.spec.containers[1].ports[0].containerPort: Invalid value: 70000",
            "spec.template.spec.containers[1].resources.limits[memory]: Invalid value: \"lots\"",
            "spec.template.spec.containers[1].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1",
            "spec.template.spec.restartPolicy: Unsupported value: \"Never\"",
        ] {
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "missing {want:?} in {got:#?}"
            );
        }
    }

    #[test]
    fn selector_expressions_are_checked() {
        let with = |exprs: Value, labels: Value| {
            check(
                "apps",
                "deployments",
                json!({"metadata": {"name": "web"},
                    "spec": {"selector": {"matchExpressions": exprs},
                        "template": {"metadata": {"labels": labels},
                            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}),
            )
        };
        let good = json!([{"key": "app", "operator": "In", "values": ["web"]},
            {"key": "tier", "operator": "DoesNotExist"}]);
        assert_eq!(
            with(good.clone(), json!({"app": "web"})),
            Vec::<String>::new()
        );
        // The template's labels must satisfy the expressions too.
        let got = with(good, json!({"app": "web", "tier": "db"}));
        assert!(
            got.iter()
                .any(|g| g.starts_with("spec.template.metadata.labels: Invalid value")),
            "{got:#?}"
        );
        let got = with(
            json!([{"key": "app", "operator": "Matches", "values": ["web"]},
                {"key": "a", "operator": "In"},
                {"key": "b", "operator": "Exists", "values": ["x"]},
                {"key": "-no", "operator": "Exists"}]),
            json!({"app": "web"}),
        );
        for want in [
            "spec.selector.matchExpressions[0].operator: Unsupported value: \"Matches\"",
            "spec.selector.matchExpressions[1].values: Required value",
            "spec.selector.matchExpressions[2].values: Invalid value",
            "spec.selector.matchExpressions[3].key: Invalid value: \"-no\"",
        ] {
            assert!(
                got.iter().any(|g| g.starts_with(want)),
                "missing {want:?} in {got:#?}"
            );
        }
    }

    #[test]
    fn kinds_have_their_own_rules() {
        // A node names the Lease its liveness is read from by a valid Lease name, or none.
        let node = |lease: Value| {
            check(
                "",
                "nodes",
                json!({"metadata": {"name": "n", "annotations": {"tessera.io/node-lease": lease}}}),
            )
        };
        assert_eq!(node(json!("tessera-sim.rack1")), Vec::<String>::new());
        let bad = node(json!("Not A Lease"));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].starts_with("metadata.annotations[tessera.io/node-lease]")
                && bad[0].contains("must name a Lease in kube-node-lease"),
            "{bad:?}"
        );
        assert_eq!(
            check(
                "",
                "services",
                json!({"metadata": {"name": "s"}, "spec": {}})
            ),
            vec!["spec.ports: Required value"]
        );
        assert_eq!(
            check(
                "",
                "configmaps",
                json!({"metadata": {"name": "c"}, "data": {"a b": "x"}})
            )
            .len(),
            1
        );
        assert_eq!(
            check(
                "batch",
                "jobs",
                json!({"metadata": {"name": "j"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}})
            ),
            vec!["spec.template.spec.restartPolicy: Required value"]
        );
        let res = find_resource("tessera.io", "v1alpha1", "podgroups").expect("served");
        assert_eq!(
            validate(
                res,
                &json!({"metadata": {"name": "g"}, "spec": {"minMember": 0}})
            )
            .0
            .len(),
            1
        );
        let too_big = validate(
            res,
            &json!({"metadata": {"name": "g"}, "spec": {"minMember": 129}}),
        );
        assert_eq!(too_big.0.len(), 1);
        assert!(
            too_big.0[0].message.contains("less than or equal to 128"),
            "{:?}",
            too_big.0[0].message
        );
    }
}
