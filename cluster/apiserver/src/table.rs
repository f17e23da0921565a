//! `meta.k8s.io/v1` Table output: what `kubectl get` asks for and prints, with Kubernetes'
//! columns for the main kinds (priority 1 columns appear with `-o wide`).

use serde_json::{Value, json};

use crate::api::now_secs;
use crate::catalog::Resource;

/// A column: name, type, priority (0 always shown, 1 with `-o wide`), description.
type Column = (&'static str, &'static str, u8, &'static str);

const NAME: Column = (
    "Name",
    "string",
    0,
    "Name must be unique within a namespace.",
);
const AGE: Column = (
    "Age",
    "string",
    0,
    "Time since the object was created (creationTimestamp).",
);

fn columns(res: &Resource) -> Vec<Column> {
    let c = |n, t, p| (n, t, p, "");
    match (res.group, res.plural) {
        ("", "pods") => vec![
            NAME,
            c("Ready", "string", 0),
            c("Status", "string", 0),
            c("Restarts", "string", 0),
            AGE,
            c("IP", "string", 1),
            c("Node", "string", 1),
            c("Nominated Node", "string", 1),
            c("Readiness Gates", "string", 1),
        ],
        ("", "nodes") => vec![
            NAME,
            c("Status", "string", 0),
            c("Roles", "string", 0),
            AGE,
            c("Version", "string", 0),
            c("Internal-IP", "string", 1),
            c("OS-Image", "string", 1),
        ],
        ("", "namespaces") => vec![NAME, c("Status", "string", 0), AGE],
        ("", "services") => vec![
            NAME,
            c("Type", "string", 0),
            c("Cluster-IP", "string", 0),
            c("External-IP", "string", 0),
            c("Port(s)", "string", 0),
            AGE,
            c("Selector", "string", 1),
        ],
        ("", "configmaps") => vec![NAME, c("Data", "integer", 0), AGE],
        ("", "secrets") => vec![NAME, c("Type", "string", 0), c("Data", "integer", 0), AGE],
        ("", "endpoints") => vec![NAME, c("Endpoints", "string", 0), AGE],
        ("", "events") => vec![
            c("Last Seen", "string", 0),
            c("Type", "string", 0),
            c("Reason", "string", 0),
            c("Object", "string", 0),
            c("Message", "string", 0),
        ],
        ("", "serviceaccounts") => vec![NAME, c("Secrets", "integer", 0), AGE],
        ("", "resourcequotas") => vec![
            NAME,
            AGE,
            c("Request", "string", 0),
            c("Limit", "string", 0),
        ],
        ("apps", "deployments") => vec![
            NAME,
            c("Ready", "string", 0),
            c("Up-to-date", "integer", 0),
            c("Available", "integer", 0),
            AGE,
            c("Containers", "string", 1),
            c("Images", "string", 1),
            c("Selector", "string", 1),
        ],
        ("apps", "replicasets") | ("", "replicationcontrollers") => vec![
            NAME,
            c("Desired", "integer", 0),
            c("Current", "integer", 0),
            c("Ready", "integer", 0),
            AGE,
            c("Containers", "string", 1),
            c("Images", "string", 1),
            c("Selector", "string", 1),
        ],
        ("apps", "statefulsets") => vec![
            NAME,
            c("Ready", "string", 0),
            AGE,
            c("Containers", "string", 1),
            c("Images", "string", 1),
        ],
        ("apps", "daemonsets") => vec![
            NAME,
            c("Desired", "integer", 0),
            c("Current", "integer", 0),
            c("Ready", "integer", 0),
            c("Up-to-date", "integer", 0),
            c("Available", "integer", 0),
            c("Node Selector", "string", 0),
            AGE,
        ],
        ("batch", "jobs") => vec![
            NAME,
            c("Status", "string", 0),
            c("Completions", "string", 0),
            c("Duration", "string", 0),
            AGE,
        ],
        ("batch", "cronjobs") => vec![
            NAME,
            c("Schedule", "string", 0),
            c("Timezone", "string", 0),
            c("Suspend", "boolean", 0),
            c("Active", "integer", 0),
            c("Last Schedule", "string", 0),
            AGE,
        ],
        ("coordination.k8s.io", "leases") => vec![NAME, c("Holder", "string", 0), AGE],
        (crate::catalog::RBAC, "roles" | "clusterroles") => {
            vec![NAME, c("Created At", "date", 0)]
        }
        ("", "persistentvolumeclaims") => vec![
            NAME,
            c("Status", "string", 0),
            c("Volume", "string", 0),
            c("Capacity", "string", 0),
            c("Access Modes", "string", 0),
            c("StorageClass", "string", 0),
            c("VolumeAttributesClass", "string", 0),
            AGE,
            c("VolumeMode", "string", 1),
        ],
        ("", "persistentvolumes") => vec![
            NAME,
            c("Capacity", "string", 0),
            c("Access Modes", "string", 0),
            c("Reclaim Policy", "string", 0),
            c("Status", "string", 0),
            c("Claim", "string", 0),
            c("StorageClass", "string", 0),
            c("VolumeAttributesClass", "string", 0),
            c("Reason", "string", 0),
            AGE,
            c("VolumeMode", "string", 1),
        ],
        ("", "podtemplates") => vec![
            NAME,
            c("Containers", "string", 0),
            c("Images", "string", 0),
            c("Pod Labels", "string", 0),
        ],
        ("networking.k8s.io", "ingresses") => vec![
            NAME,
            c("Class", "string", 0),
            c("Hosts", "string", 0),
            c("Address", "string", 0),
            c("Ports", "string", 0),
            AGE,
        ],
        (crate::catalog::CERTIFICATES, "certificatesigningrequests") => vec![
            NAME,
            AGE,
            c("SignerName", "string", 0),
            c("Requestor", "string", 0),
            c("RequestedDuration", "string", 0),
            c("Condition", "string", 0),
        ],
        ("networking.k8s.io", "ingressclasses") => vec![
            NAME,
            c("Controller", "string", 0),
            c("Parameters", "string", 0),
            AGE,
        ],
        ("networking.k8s.io", "networkpolicies") => {
            vec![NAME, c("Pod-Selector", "string", 0), AGE]
        }
        (crate::catalog::APIEXTENSIONS, "customresourcedefinitions") => {
            vec![NAME, c("Created At", "date", 0)]
        }
        (
            crate::catalog::ADMISSIONREGISTRATION,
            "mutatingwebhookconfigurations" | "validatingwebhookconfigurations",
        ) => vec![NAME, c("Webhooks", "integer", 0), AGE],
        (crate::catalog::ADMISSIONREGISTRATION, "validatingadmissionpolicies") => vec![
            NAME,
            c("Validations", "integer", 0),
            c("ParamKind", "string", 0),
            AGE,
        ],
        (crate::catalog::ADMISSIONREGISTRATION, "validatingadmissionpolicybindings") => vec![
            NAME,
            c("PolicyName", "string", 0),
            c("ParamRef", "string", 0),
            AGE,
        ],
        (crate::catalog::APIREGISTRATION, "apiservices") => vec![
            NAME,
            c("Service", "string", 0),
            c("Available", "string", 0),
            AGE,
        ],
        ("storage.k8s.io", "storageclasses") => vec![
            NAME,
            c("Provisioner", "string", 0),
            c("ReclaimPolicy", "string", 0),
            c("VolumeBindingMode", "string", 0),
            c("AllowVolumeExpansion", "string", 0),
            AGE,
        ],
        (crate::catalog::RBAC, "rolebindings" | "clusterrolebindings") => vec![
            NAME,
            c("Role", "string", 0),
            AGE,
            c("Users", "string", 1),
            c("Groups", "string", 1),
            c("ServiceAccounts", "string", 1),
        ],
        ("scheduling.k8s.io", "priorityclasses") => vec![
            NAME,
            c("Value", "integer", 0),
            c("Global-Default", "boolean", 0),
            AGE,
            c("PreemptionPolicy", "string", 0),
        ],
        ("autoscaling", "horizontalpodautoscalers") => vec![
            NAME,
            c("Reference", "string", 0),
            c("Targets", "string", 0),
            c("MinPods", "string", 0),
            c("MaxPods", "integer", 0),
            c("Replicas", "integer", 0),
            AGE,
        ],
        ("policy", "poddisruptionbudgets") => vec![
            NAME,
            c("Min Available", "string", 0),
            c("Max Unavailable", "string", 0),
            c("Allowed Disruptions", "integer", 0),
            AGE,
        ],
        ("tessera.io", "tenants") => vec![
            NAME,
            c("Namespaces", "string", 0),
            c("Weight", "integer", 0),
            AGE,
        ],
        ("tessera.io", "podgroups") => vec![
            NAME,
            c("Min Member", "integer", 0),
            c("Phase", "string", 0),
            AGE,
        ],
        ("tessera.io", "shards") => vec![
            NAME,
            c("Ready", "string", 0),
            c("Region", "string", 0),
            c("Nodes", "integer", 0),
            c("CPU", "string", 0),
            c("Memory", "string", 0),
            c("Pods", "string", 0),
            c("Workloads", "string", 0),
            AGE,
            c("Labels", "string", 1),
        ],
        ("tessera.io", "shardmaps") => vec![
            NAME,
            c("Version", "integer", 0),
            c("Shards", "integer", 0),
            AGE,
        ],
        ("tessera.io", "placements") => vec![
            NAME,
            c("Scheduling", "string", 0),
            c("Selects", "string", 0),
            AGE,
        ],
        _ => vec![NAME, AGE],
    }
}

/// Kubernetes' human durations, as kubectl prints ages: `45s`, `5m3s`, `90m`, `3h15m`,
/// `25h`, `2d4h`, `400d`, `3y12d`.
pub fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    let (minutes, hours, days) = (s / 60, s / 3600, s / 86_400);
    let pair = |big: i64, bu: &str, small: i64, su: &str| {
        if small == 0 {
            format!("{big}{bu}")
        } else {
            format!("{big}{bu}{small}{su}")
        }
    };
    match () {
        () if s < 120 => format!("{s}s"),
        () if minutes < 10 => pair(minutes, "m", s % 60, "s"),
        () if minutes < 180 => format!("{minutes}m"),
        () if hours < 8 => pair(hours, "h", minutes % 60, "m"),
        () if hours < 48 => format!("{hours}h"),
        () if days < 8 => pair(days, "d", hours % 24, "h"),
        () if days < 2 * 365 => format!("{days}d"),
        () if days < 8 * 365 => pair(days / 365, "y", days % 365, "d"),
        () => format!("{}y", days / 365),
    }
}

/// Seconds since the epoch of an RFC 3339 timestamp (`2026-11-30T12:00:00Z`).
pub fn parse_rfc3339(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + s)
}

fn age(obj: &Value, field: &str) -> String {
    obj["metadata"][field]
        .as_str()
        .or(obj[field].as_str())
        .and_then(parse_rfc3339)
        .map_or_else(|| "<unknown>".into(), |t| human_duration(now_secs() - t))
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".into(),
        other => other.to_string(),
    }
}

/// Access modes as kubectl abbreviates them (`RWO,ROX`).
fn access_modes(modes: &Value) -> String {
    modes
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m.as_str().unwrap_or_default() {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn int(v: &Value) -> Value {
    json!(v.as_i64().unwrap_or(0))
}

/// A label selector in its text form (`app=web,tier in (a,b),!canary`), as Kubernetes
/// prints one: a `metav1.LabelSelector`, or a plain map of labels (a Service's, a
/// ReplicationController's). Empty for an empty selector.
pub(crate) fn selector_text(sel: &Value) -> String {
    let structured = sel.get("matchLabels").is_some() || sel.get("matchExpressions").is_some();
    let labels = if structured { &sel["matchLabels"] } else { sel };
    let mut parts: Vec<String> = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

fn selector_string(sel: &Value) -> String {
    let text = selector_text(sel);
    if text.is_empty() {
        "<none>".into()
    } else {
        text
    }
}

fn containers_and_images(pod_spec: &Value) -> (String, String) {
    let cs = pod_spec["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = cs.iter().map(|c| s(&c["name"])).collect();
    let images: Vec<String> = cs.iter().map(|c| s(&c["image"])).collect();
    (names.join(","), images.join(","))
}

fn cells(res: &Resource, o: &Value) -> Vec<Value> {
    let name = json!(o["metadata"]["name"].as_str().unwrap_or_default());
    let age_v = json!(age(o, "creationTimestamp"));
    let spec = &o["spec"];
    let status = &o["status"];
    match (res.group, res.plural) {
        ("", "pods") => {
            let statuses = status["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let total = spec["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            let mut phase = status["reason"]
                .as_str()
                .or(status["phase"].as_str())
                .unwrap_or("Pending")
                .to_owned();
            for c in &statuses {
                if let Some(r) = c["state"]["waiting"]["reason"].as_str() {
                    phase = r.to_owned();
                } else if let Some(r) = c["state"]["terminated"]["reason"].as_str() {
                    phase = r.to_owned();
                }
            }
            if o["metadata"]["deletionTimestamp"].is_string() {
                phase = "Terminating".into();
            }
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(phase),
                json!(restarts.to_string()),
                age_v,
                json!(status["podIP"].as_str().unwrap_or("<none>")),
                json!(spec["nodeName"].as_str().unwrap_or("<none>")),
                json!(status["nominatedNodeName"].as_str().unwrap_or("<none>")),
                json!("<none>"),
            ]
        }
        ("", "nodes") => {
            let ready = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready");
            let mut st = match ready.map(|c| c["status"].as_str().unwrap_or("")) {
                Some("True") => "Ready".to_owned(),
                Some(_) => "NotReady".to_owned(),
                None => "Unknown".to_owned(),
            };
            if spec["unschedulable"] == true {
                st.push_str(",SchedulingDisabled");
            }
            let roles: Vec<String> = o["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| {
                    k.strip_prefix("node-role.kubernetes.io/")
                        .map(str::to_owned)
                })
                .collect();
            let ip = status["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["type"] == "InternalIP")
                .map_or("<none>".to_owned(), |a| s(&a["address"]));
            vec![
                name,
                json!(st),
                json!(if roles.is_empty() {
                    "<none>".to_owned()
                } else {
                    roles.join(",")
                }),
                age_v,
                json!(status["nodeInfo"]["kubeletVersion"].as_str().unwrap_or("")),
                json!(ip),
                json!(
                    status["nodeInfo"]["osImage"]
                        .as_str()
                        .unwrap_or("<unknown>")
                ),
            ]
        }
        ("", "namespaces") => vec![
            name,
            json!(status["phase"].as_str().unwrap_or("Active")),
            age_v,
        ],
        ("", "services") => {
            let ports: Vec<String> = spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(np) => format!("{}:{np}/{proto}", p["port"]),
                        None => format!("{}/{proto}", p["port"]),
                    }
                })
                .collect();
            vec![
                name,
                json!(spec["type"].as_str().unwrap_or("ClusterIP")),
                json!(spec["clusterIP"].as_str().unwrap_or("<none>")),
                json!("<none>"),
                json!(if ports.is_empty() {
                    "<none>".to_owned()
                } else {
                    ports.join(",")
                }),
                age_v,
                json!(selector_string(&spec["selector"])),
            ]
        }
        ("", "configmaps") => {
            let n = o["data"].as_object().map_or(0, |m| m.len())
                + o["binaryData"].as_object().map_or(0, |m| m.len());
            vec![name, json!(n), age_v]
        }
        ("", "secrets") => vec![
            name,
            json!(o["type"].as_str().unwrap_or("Opaque")),
            json!(o["data"].as_object().map_or(0, |m| m.len())),
            age_v,
        ],
        ("", "endpoints") => {
            let eps: Vec<String> = o["subsets"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|ss| {
                    let ports: Vec<i64> = ss["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["port"].as_i64())
                        .collect();
                    ss["addresses"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(move |a| {
                            let ip = s(&a["ip"]);
                            if ports.is_empty() {
                                vec![ip]
                            } else {
                                ports.iter().map(|p| format!("{ip}:{p}")).collect()
                            }
                        })
                })
                .collect();
            vec![
                name,
                json!(if eps.is_empty() {
                    "<none>".to_owned()
                } else {
                    eps.join(",")
                }),
                age_v,
            ]
        }
        ("", "events") => {
            let involved = &o["involvedObject"];
            vec![
                json!(age(o, "lastTimestamp")),
                json!(o["type"].as_str().unwrap_or("")),
                json!(o["reason"].as_str().unwrap_or("")),
                json!(format!(
                    "{}/{}",
                    involved["kind"].as_str().unwrap_or("").to_lowercase(),
                    involved["name"].as_str().unwrap_or("")
                )),
                json!(o["message"].as_str().unwrap_or("")),
            ]
        }
        ("", "serviceaccounts") => vec![
            name,
            json!(o["secrets"].as_array().map_or(0, Vec::len)),
            age_v,
        ],
        ("", "resourcequotas") => {
            let used = &status["used"];
            let fmt = |pick: &dyn Fn(&str) -> bool| -> String {
                spec["hard"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| pick(k))
                    .map(|(k, v)| format!("{k}: {}/{}", used[k].as_str().unwrap_or("0"), s(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                name,
                age_v,
                json!(fmt(&|k: &str| !k.starts_with("limits."))),
                json!(fmt(&|k: &str| k.starts_with("limits."))),
            ]
        }
        ("apps", "deployments") => {
            let (cs, imgs) = containers_and_images(&spec["template"]["spec"]);
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    status["readyReplicas"].as_i64().unwrap_or(0),
                    spec["replicas"].as_i64().unwrap_or(1)
                )),
                int(&status["updatedReplicas"]),
                int(&status["availableReplicas"]),
                age_v,
                json!(cs),
                json!(imgs),
                json!(selector_string(&spec["selector"])),
            ]
        }
        ("apps", "replicasets") | ("", "replicationcontrollers") => {
            let (cs, imgs) = containers_and_images(&spec["template"]["spec"]);
            let selector = selector_string(&spec["selector"]);
            vec![
                name,
                json!(spec["replicas"].as_i64().unwrap_or(1)),
                int(&status["replicas"]),
                int(&status["readyReplicas"]),
                age_v,
                json!(cs),
                json!(imgs),
                json!(selector),
            ]
        }
        ("apps", "statefulsets") => {
            let (cs, imgs) = containers_and_images(&spec["template"]["spec"]);
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    status["readyReplicas"].as_i64().unwrap_or(0),
                    spec["replicas"].as_i64().unwrap_or(1)
                )),
                age_v,
                json!(cs),
                json!(imgs),
            ]
        }
        ("apps", "daemonsets") => vec![
            name,
            int(&status["desiredNumberScheduled"]),
            int(&status["currentNumberScheduled"]),
            int(&status["numberReady"]),
            int(&status["updatedNumberScheduled"]),
            int(&status["numberAvailable"]),
            json!(selector_string(&spec["template"]["spec"]["nodeSelector"])),
            age_v,
        ],
        ("batch", "jobs") => {
            let conds = status["conditions"].as_array().cloned().unwrap_or_default();
            let st = if conds
                .iter()
                .any(|c| c["type"] == "Complete" && c["status"] == "True")
            {
                "Complete"
            } else if conds
                .iter()
                .any(|c| c["type"] == "Failed" && c["status"] == "True")
            {
                "Failed"
            } else {
                "Running"
            };
            let dur = match (
                status["startTime"].as_str().and_then(parse_rfc3339),
                status["completionTime"].as_str().and_then(parse_rfc3339),
            ) {
                (Some(a), Some(b)) => human_duration(b - a),
                (Some(a), None) => human_duration(now_secs() - a),
                _ => String::new(),
            };
            vec![
                name,
                json!(st),
                json!(format!(
                    "{}/{}",
                    status["succeeded"].as_i64().unwrap_or(0),
                    spec["completions"].as_i64().unwrap_or(1)
                )),
                json!(dur),
                age_v,
            ]
        }
        ("batch", "cronjobs") => vec![
            name,
            json!(spec["schedule"].as_str().unwrap_or("")),
            json!(spec["timeZone"].as_str().unwrap_or("<none>")),
            json!(spec["suspend"].as_bool().unwrap_or(false)),
            json!(status["active"].as_array().map_or(0, Vec::len)),
            json!(
                status["lastScheduleTime"]
                    .as_str()
                    .and_then(parse_rfc3339)
                    .map_or("<none>".into(), |t| human_duration(now_secs() - t))
            ),
            age_v,
        ],
        ("coordination.k8s.io", "leases") => vec![
            name,
            json!(spec["holderIdentity"].as_str().unwrap_or("")),
            age_v,
        ],
        (crate::catalog::RBAC, "roles" | "clusterroles") => {
            vec![name, o["metadata"]["creationTimestamp"].clone()]
        }
        ("", "persistentvolumeclaims") => vec![
            name,
            json!(status["phase"].as_str().unwrap_or("Pending")),
            json!(spec["volumeName"].as_str().unwrap_or("")),
            json!(status["capacity"]["storage"].as_str().unwrap_or("")),
            json!(access_modes(&status["accessModes"])),
            json!(spec["storageClassName"].as_str().unwrap_or("<unset>")),
            json!(
                spec["volumeAttributesClassName"]
                    .as_str()
                    .unwrap_or("<unset>")
            ),
            age_v,
            json!(spec["volumeMode"].as_str().unwrap_or("Filesystem")),
        ],
        ("", "persistentvolumes") => vec![
            name,
            json!(spec["capacity"]["storage"].as_str().unwrap_or("")),
            json!(access_modes(&spec["accessModes"])),
            json!(
                spec["persistentVolumeReclaimPolicy"]
                    .as_str()
                    .unwrap_or("Retain")
            ),
            json!(status["phase"].as_str().unwrap_or("Pending")),
            json!(match spec["claimRef"]["name"].as_str() {
                Some(n) => format!("{}/{n}", s(&spec["claimRef"]["namespace"])),
                None => String::new(),
            }),
            json!(spec["storageClassName"].as_str().unwrap_or("")),
            json!(
                spec["volumeAttributesClassName"]
                    .as_str()
                    .unwrap_or("<unset>")
            ),
            json!(status["reason"].as_str().unwrap_or("")),
            age_v,
            json!(spec["volumeMode"].as_str().unwrap_or("Filesystem")),
        ],
        ("", "podtemplates") => {
            let containers = o["template"]["spec"]["containers"].as_array();
            let join = |f: &str| {
                containers
                    .into_iter()
                    .flatten()
                    .map(|c| s(&c[f]))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let labels: Vec<String> = o["template"]["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", s(v)))
                .collect();
            vec![
                name,
                json!(join("name")),
                json!(join("image")),
                json!(if labels.is_empty() {
                    "<none>".to_owned()
                } else {
                    labels.join(",")
                }),
            ]
        }
        ("networking.k8s.io", "ingresses") => {
            let hosts: Vec<String> = spec["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["host"].as_str().unwrap_or("*").to_owned())
                .collect();
            let address: Vec<String> = status["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| {
                    i["ip"]
                        .as_str()
                        .or(i["hostname"].as_str())
                        .map(str::to_owned)
                })
                .collect();
            let tls = spec["tls"].as_array().is_some_and(|t| !t.is_empty());
            vec![
                name,
                json!(spec["ingressClassName"].as_str().unwrap_or("<none>")),
                json!(if hosts.is_empty() {
                    "*".to_owned()
                } else {
                    hosts.join(",")
                }),
                json!(address.join(",")),
                json!(if tls { "80, 443" } else { "80" }),
                age_v,
            ]
        }
        (crate::catalog::CERTIFICATES, "certificatesigningrequests") => {
            let mut conditions: Vec<String> = o["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["type"].as_str().map(str::to_owned))
                .collect();
            if o["status"]["certificate"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
            {
                conditions.push("Issued".into());
            }
            if conditions.is_empty() {
                conditions.push("Pending".into());
            }
            vec![
                name,
                age_v,
                json!(spec["signerName"].as_str().unwrap_or("")),
                json!(spec["username"].as_str().unwrap_or("")),
                json!(
                    spec["expirationSeconds"]
                        .as_i64()
                        .map_or_else(|| "<none>".to_owned(), human_duration)
                ),
                json!(conditions.join(",")),
            ]
        }
        ("networking.k8s.io", "ingressclasses") => vec![
            name,
            json!(spec["controller"].as_str().unwrap_or("")),
            json!(match spec["parameters"]["name"].as_str() {
                Some(n) => format!("{}/{n}", s(&spec["parameters"]["kind"])),
                None => "<none>".to_owned(),
            }),
            age_v,
        ],
        ("networking.k8s.io", "networkpolicies") => {
            let sel = selector_string(&spec["podSelector"]);
            vec![
                name,
                json!(if sel.is_empty() {
                    "<none>".to_owned()
                } else {
                    sel
                }),
                age_v,
            ]
        }
        (crate::catalog::APIEXTENSIONS, "customresourcedefinitions") => {
            vec![name, o["metadata"]["creationTimestamp"].clone()]
        }
        (
            crate::catalog::ADMISSIONREGISTRATION,
            "mutatingwebhookconfigurations" | "validatingwebhookconfigurations",
        ) => {
            let count = o["webhooks"].as_array().map_or(0, Vec::len);
            vec![name, json!(count), age_v]
        }
        (crate::catalog::ADMISSIONREGISTRATION, "validatingadmissionpolicies") => {
            let count = spec["validations"].as_array().map_or(0, Vec::len);
            let pk = &spec["paramKind"];
            let param_kind = if pk.is_object() {
                format!("{}/{}", s(&pk["apiVersion"]), s(&pk["kind"]))
            } else {
                "<unset>".to_owned()
            };
            vec![name, json!(count), json!(param_kind), age_v]
        }
        (crate::catalog::ADMISSIONREGISTRATION, "validatingadmissionpolicybindings") => {
            let pr = &spec["paramRef"];
            let param_ref = if pr.is_object() {
                let target = if pr["name"].is_string() {
                    s(&pr["name"]).to_owned()
                } else {
                    "*".to_owned()
                };
                match pr["namespace"].as_str() {
                    Some(ns) => format!("{ns}/{target}"),
                    None => target,
                }
            } else {
                "<unset>".to_owned()
            };
            vec![name, json!(s(&spec["policyName"])), json!(param_ref), age_v]
        }
        (crate::catalog::APIREGISTRATION, "apiservices") => {
            let svc = &spec["service"];
            let service = if svc.is_null() {
                "Local".to_owned()
            } else {
                format!("{}/{}", s(&svc["namespace"]), s(&svc["name"]))
            };
            let available = status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
                .map_or_else(
                    || "Unknown".to_owned(),
                    |c| match c["status"].as_str() {
                        Some("True") => "True".to_owned(),
                        other => format!("{} ({})", other.unwrap_or("Unknown"), s(&c["reason"])),
                    },
                );
            vec![name, json!(service), json!(available), age_v]
        }
        ("storage.k8s.io", "storageclasses") => {
            let default = o["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"]
                == "true";
            let shown = if default {
                json!(format!("{} (default)", s(&o["metadata"]["name"])))
            } else {
                name
            };
            vec![
                shown,
                json!(o["provisioner"].as_str().unwrap_or("")),
                json!(o["reclaimPolicy"].as_str().unwrap_or("Delete")),
                json!(o["volumeBindingMode"].as_str().unwrap_or("Immediate")),
                json!(
                    o["allowVolumeExpansion"]
                        .as_bool()
                        .unwrap_or(false)
                        .to_string()
                ),
                age_v,
            ]
        }
        (crate::catalog::RBAC, "rolebindings" | "clusterrolebindings") => {
            let subjects = |kind: &str| {
                let names: Vec<String> = o["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|x| x["kind"] == kind)
                    .map(|x| match x["namespace"].as_str() {
                        Some(ns) if kind == "ServiceAccount" => format!("{ns}/{}", s(&x["name"])),
                        _ => s(&x["name"]),
                    })
                    .collect();
                json!(names.join(", "))
            };
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    s(&o["roleRef"]["kind"]),
                    s(&o["roleRef"]["name"])
                )),
                age_v,
                subjects("User"),
                subjects("Group"),
                subjects("ServiceAccount"),
            ]
        }
        ("scheduling.k8s.io", "priorityclasses") => vec![
            name,
            int(&o["value"]),
            json!(o["globalDefault"].as_bool().unwrap_or(false)),
            age_v,
            json!(
                o["preemptionPolicy"]
                    .as_str()
                    .unwrap_or("PreemptLowerPriority")
            ),
        ],
        ("autoscaling", "horizontalpodautoscalers") => vec![
            name,
            json!(format!(
                "{}/{}",
                s(&spec["scaleTargetRef"]["kind"]),
                s(&spec["scaleTargetRef"]["name"])
            )),
            json!(hpa_targets(spec, status)),
            json!(spec["minReplicas"].as_i64().unwrap_or(1).to_string()),
            int(&spec["maxReplicas"]),
            int(&status["currentReplicas"]),
            age_v,
        ],
        ("policy", "poddisruptionbudgets") => vec![
            name,
            json!(if spec["minAvailable"].is_null() {
                "N/A".into()
            } else {
                s(&spec["minAvailable"])
            }),
            json!(if spec["maxUnavailable"].is_null() {
                "N/A".into()
            } else {
                s(&spec["maxUnavailable"])
            }),
            int(&status["disruptionsAllowed"]),
            age_v,
        ],
        ("tessera.io", "tenants") => vec![
            name,
            json!(
                spec["namespaces"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(","))
                    .unwrap_or_else(|| "<none>".into())
            ),
            json!(spec["weight"].as_i64().unwrap_or(1)),
            age_v,
        ],
        ("tessera.io", "podgroups") => vec![
            name,
            int(&spec["minMember"]),
            json!(status["phase"].as_str().unwrap_or("Pending")),
            age_v,
        ],
        ("tessera.io", "shards") => shard_row(o, name, age_v),
        ("tessera.io", "shardmaps") => vec![
            name,
            int(&spec["version"]),
            json!(spec["shards"].as_array().map_or(0, Vec::len)),
            age_v,
        ],
        ("tessera.io", "placements") => vec![
            name,
            json!(
                spec["replicas"]["scheduling"]
                    .as_str()
                    .unwrap_or("Home")
                    .to_owned()
                    + spec["replicas"]["division"]
                        .as_str()
                        .map(|d| format!("/{d}"))
                        .as_deref()
                        .unwrap_or("")
            ),
            json!(
                spec["resourceSelectors"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .map(|r| format!(
                            "{}/{}",
                            r["kind"].as_str().unwrap_or("*"),
                            r["name"].as_str().unwrap_or("*")
                        ))
                        .collect::<Vec<_>>()
                        .join(","))
                    .unwrap_or_default()
            ),
            age_v,
        ],
        _ => vec![name, age_v],
    }
}

/// A Shard's row: READY from its `Ready` condition, REGION from its label, CPU and MEMORY as
/// free/allocatable, PODS as running/pending, WORKLOADS as held (and moving out).
/// An HPA's TARGETS cell as kubectl 1.32 prints it: `current/target` per metric (`50%/80%`,
/// `<unknown>/80%` before the first measurement), the first two, then how many more.
fn hpa_targets(spec: &Value, status: &Value) -> String {
    let specs = spec["metrics"].as_array().map_or(&[][..], Vec::as_slice);
    if specs.is_empty() {
        return "<none>".into();
    }
    let current = status["currentMetrics"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let mut shown = Vec::new();
    for (i, m) in specs.iter().take(2).enumerate() {
        let ty = m["type"].as_str().unwrap_or_default();
        let field = match ty {
            "Resource" => "resource",
            "ContainerResource" => "containerResource",
            "Pods" => "pods",
            "Object" => "object",
            "External" => "external",
            _ => "",
        };
        let target = &m[field]["target"];
        let now = current
            .get(i)
            .filter(|c| c["type"] == ty)
            .map(|c| &c[field]["current"]);
        let cell = match target["type"].as_str() {
            Some("Utilization") => format!(
                "{}/{}%",
                now.and_then(|c| c["averageUtilization"].as_i64())
                    .map_or("<unknown>".into(), |u| format!("{u}%")),
                target["averageUtilization"].as_i64().unwrap_or(0)
            ),
            Some("AverageValue") => format!(
                "{}/{}",
                now.and_then(|c| c["averageValue"].as_str())
                    .unwrap_or("<unknown>"),
                s(&target["averageValue"])
            ),
            _ => format!(
                "{}/{}",
                now.and_then(|c| c["value"].as_str()).unwrap_or("<unknown>"),
                s(&target["value"])
            ),
        };
        // An averaged Object or External target says so, as kubectl does.
        shown.push(
            if matches!(ty, "Object" | "External") && target["type"] == "AverageValue" {
                format!("{cell} (avg)")
            } else {
                cell
            },
        );
    }
    let mut out = shown.join(", ");
    if specs.len() > 2 {
        out.push_str(&format!(" + {} more...", specs.len() - 2));
    }
    out
}

fn shard_row(o: &Value, name: Value, age_v: Value) -> Vec<Value> {
    let status = &o["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map_or("Unknown", |c| {
            if c["status"] == "True" {
                "True"
            } else {
                "False"
            }
        });
    let cordoned = o["spec"]["unschedulable"] == true;
    let labels = &o["metadata"]["labels"];
    let pair = |r: &str| {
        let (f, a) = (&status["free"][r], &status["allocatable"][r]);
        if a.is_null() {
            "<none>".to_owned()
        } else {
            format!("{}/{}", s(f), s(a))
        }
    };
    vec![
        name,
        json!(if cordoned {
            format!("{ready},SchedulingDisabled")
        } else {
            ready.to_owned()
        }),
        json!(
            labels["topology.kubernetes.io/region"]
                .as_str()
                .or(labels["region"].as_str())
                .unwrap_or("<none>")
        ),
        json!(status["nodes"].as_i64().unwrap_or(0)),
        json!(pair("cpu")),
        json!(pair("memory")),
        json!(format!(
            "{}/{}",
            status["podsRunning"].as_i64().unwrap_or(0),
            status["podsPending"].as_i64().unwrap_or(0)
        )),
        // Federated workloads held, and those moving off (a drain under way).
        json!(match status["movingOut"].as_i64().unwrap_or(0) {
            0 => status["workloads"].as_i64().unwrap_or(0).to_string(),
            out => format!(
                "{} ({out} moving out)",
                status["workloads"].as_i64().unwrap_or(0)
            ),
        }),
        age_v,
        json!(
            labels
                .as_object()
                .map(|m| m
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(","))
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| "<none>".into())
        ),
    ]
}

fn row_object(obj: &Value, include: Option<&str>) -> Value {
    match include {
        Some("None") => Value::Null,
        Some("Object") => obj.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }),
    }
}

/// The Table of a list (or of one object).
pub fn to_table(res: &Resource, body: &Value, include: Option<&str>) -> Value {
    let cols: Vec<Value> = columns(res)
        .into_iter()
        .map(|(name, ty, priority, desc)| {
            json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" },
                   "description": desc, "priority": priority})
        })
        .collect();
    table(cols, body, include, |o| cells(res, o))
}

/// The Table of a custom resource: its name, then its CRD's printer columns (a `date` shown
/// as the time since, as Kubernetes shows it).
pub fn to_custom_table(
    columns: &[crate::crd::Column],
    body: &Value,
    include: Option<&str>,
) -> Value {
    let mut cols = vec![json!({"name": NAME.0, "type": NAME.1, "format": "name",
        "description": NAME.3, "priority": 0})];
    cols.extend(columns.iter().map(|c| {
        json!({"name": c.name, "type": c.ty, "format": "", "description": c.description,
            "priority": c.priority})
    }));
    table(cols, body, include, |o| {
        let mut cells = vec![json!(o["metadata"]["name"].as_str().unwrap_or_default())];
        cells.extend(columns.iter().map(|c| {
            let v = crate::crd::cell(c, o);
            match (c.ty.as_str(), v.as_str()) {
                ("date", Some(t)) => json!(
                    parse_rfc3339(t)
                        .map_or_else(|| "<unknown>".into(), |t| human_duration(now_secs() - t))
                ),
                _ => v,
            }
        }));
        cells
    })
}

/// A Table of `body` (one object or a list) with `cols`, each row's cells from `cells`.
fn table(
    cols: Vec<Value>,
    body: &Value,
    include: Option<&str>,
    cells: impl Fn(&Value) -> Vec<Value>,
) -> Value {
    let (items, metadata) = match body["items"].as_array() {
        Some(items) => (items.clone(), body["metadata"].clone()),
        None => (
            vec![body.clone()],
            json!({"resourceVersion": body["metadata"]["resourceVersion"]}),
        ),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(o)});
            let ob = row_object(o, include);
            if !ob.is_null() {
                row["object"] = ob;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": cols,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::find_resource;

    #[test]
    fn durations_read_like_kubectls() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(303), "5m3s");
        assert_eq!(human_duration(3 * 3600), "3h");
        assert_eq!(human_duration(2 * 86_400 + 4 * 3600), "2d4h");
        assert_eq!(human_duration(400 * 86_400), "400d");
        assert_eq!(human_duration(90 * 60), "90m");
        assert_eq!(human_duration(3 * 3600 + 15 * 60), "3h15m");
        assert_eq!(human_duration(86_400), "24h");
        assert_eq!(human_duration(47 * 3600), "47h");
        assert_eq!(human_duration((3 * 365 + 12) * 86_400), "3y12d");
        assert_eq!(human_duration(9 * 365 * 86_400), "9y");
        assert_eq!(parse_rfc3339("1970-01-02T00:00:01Z"), Some(86_401));
        assert_eq!(
            parse_rfc3339(&crate::api::rfc3339(1_795_000_000)),
            Some(1_795_000_000)
        );
        assert_eq!(parse_rfc3339("garbage"), None);
    }

    #[test]
    fn every_row_has_a_cell_per_column() {
        for res in crate::catalog::RESOURCES {
            let t = to_table(res, &json!({"items": [{"metadata": {"name": "x"}}]}), None);
            let ncols = t["columnDefinitions"].as_array().expect("cols").len();
            let ncells = t["rows"][0]["cells"].as_array().expect("cells").len();
            assert_eq!(ncols, ncells, "{}", res.plural);
        }
    }

    #[test]
    fn deployment_rows_show_readiness() {
        let res = find_resource("apps", "v1", "deployments").expect("served");
        let d = json!({"metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let t = to_table(res, &d, None);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "2/3");
        assert_eq!(cells[6], "nginx");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
