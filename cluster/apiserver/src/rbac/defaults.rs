//! The ClusterRoles and ClusterRoleBindings every cluster has: `cluster-admin`, the
//! user-facing `admin`, `edit` and `view` (aggregated from the `aggregate-to-*` roles, so an
//! operator's own ClusterRoles labelled `rbac.authorization.k8s.io/aggregate-to-view: "true"`
//! join them), and the `system:` roles every authenticated caller is bound to. The rules
//! follow Kubernetes 1.32's bootstrap policy, limited to the resources this server serves
//! (a test keeps them so); the tenant-facing extras are in `tessera:aggregate-to-*`.

use serde_json::{Value, json};

use crate::catalog::RBAC;
use crate::status::ApiError;

/// The label that makes a ClusterRole one of Kubernetes' defaults.
pub const BOOTSTRAP_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
/// The annotation that lets the server put a default role's rules back at start.
pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn meta(name: &str, labels: &[(&str, &str)]) -> Value {
    let mut l = serde_json::Map::new();
    l.insert(BOOTSTRAP_LABEL.0.into(), BOOTSTRAP_LABEL.1.into());
    for (k, v) in labels {
        l.insert((*k).into(), (*v).into());
    }
    json!({"name": name, "labels": l, "annotations": {AUTOUPDATE: "true"}})
}

fn role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": meta(name, labels), "rules": rules})
}

fn aggregated(name: &str, labels: &[(&str, &str)], from: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": meta(name, labels),
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {from: "true"}}]},
        "rules": []})
}

fn binding(name: &str, role: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
        .collect();
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": meta(name, &[]),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects})
}

const TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The default ClusterRoles.
pub fn cluster_roles() -> Vec<Value> {
    let rw: Vec<&str> = READ.iter().chain(WRITE).copied().collect();
    vec![
        role(
            "cluster-admin",
            &[],
            vec![
                rule(&["*"], &["*"], &["*"]),
                json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
            ],
        ),
        aggregated("admin", &[], TO_ADMIN),
        aggregated("edit", &[(TO_ADMIN, "true")], TO_EDIT),
        aggregated("view", &[(TO_EDIT, "true")], TO_VIEW),
        role(
            "system:aggregate-to-admin",
            &[(TO_ADMIN, "true")],
            vec![
                rule(
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings", "roles"],
                    &rw,
                ),
                rule(
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
        role(
            "system:aggregate-to-edit",
            &[(TO_EDIT, "true")],
            vec![
                rule(
                    &[""],
                    &[
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                        "secrets",
                        "services/proxy",
                    ],
                    READ,
                ),
                rule(&[""], &["serviceaccounts"], &["impersonate"]),
                rule(
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                    ],
                    WRITE,
                ),
                rule(&[""], &["pods/eviction"], &["create"]),
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                    WRITE,
                ),
                rule(
                    &["networking.k8s.io"],
                    &["ingresses", "networkpolicies"],
                    WRITE,
                ),
                rule(&[""], &["serviceaccounts/token"], &["create"]),
                rule(
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                    WRITE,
                ),
                rule(&["autoscaling"], &["horizontalpodautoscalers"], WRITE),
                rule(&["batch"], &["cronjobs", "jobs"], WRITE),
                rule(&["policy"], &["poddisruptionbudgets"], WRITE),
                rule(&["coordination.k8s.io"], &["leases"], &rw),
            ],
        ),
        role(
            "system:aggregate-to-view",
            &[(TO_VIEW, "true")],
            vec![
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "replicationcontrollers/status",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                    READ,
                ),
                rule(
                    &["networking.k8s.io"],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                    READ,
                ),
                rule(
                    &[""],
                    &[
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                    READ,
                ),
                rule(&[""], &["namespaces"], READ),
                rule(
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                    READ,
                ),
                rule(
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                    READ,
                ),
                rule(
                    &["batch"],
                    &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                    READ,
                ),
                rule(
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                    READ,
                ),
            ],
        ),
        role(
            "tessera:aggregate-to-edit",
            &[(TO_EDIT, "true")],
            vec![rule(&["tessera.io"], &["podgroups", "placements"], WRITE)],
        ),
        role(
            "tessera:aggregate-to-view",
            &[(TO_VIEW, "true")],
            vec![rule(
                &["tessera.io"],
                &["podgroups", "podgroups/status", "placements"],
                READ,
            )],
        ),
        role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
            ],
        ),
        role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
        role(
            "system:discovery",
            &[],
            vec![
                json!({"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                "verbs": ["get"]}),
            ],
        ),
        role(
            "system:public-info-viewer",
            &[],
            vec![
                json!({"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version",
                "/version/"], "verbs": ["get"]}),
            ],
        ),
    ]
}

/// The default ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<Value> {
    vec![
        binding("cluster-admin", "cluster-admin", &["system:masters"]),
        binding(
            "system:basic-user",
            "system:basic-user",
            &["system:authenticated"],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            &["system:authenticated"],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ]
}

/// Puts the defaults in place at start: creates those missing, and puts back the rules (and
/// the default subjects) of those still marked `autoupdate: "true"` that were changed — as
/// kube-apiserver reconciles its bootstrap policy. An aggregated role's rules are the
/// aggregation controller's, and are left alone.
pub async fn ensure(client: &dyn crate::client::Client) -> Result<(), ApiError> {
    let roles = crate::request::find_resource(RBAC, "v1", "clusterroles")?;
    let bindings = crate::request::find_resource(RBAC, "v1", "clusterrolebindings")?;
    for (res, objects) in [
        (roles, cluster_roles()),
        (bindings, cluster_role_bindings()),
    ] {
        for want in objects {
            let name = want["metadata"]["name"].as_str().unwrap_or_default();
            let mut have = match client.create(res, None, &want).await {
                Ok(_) => continue,
                Err(e) if e.code == 409 => client.get(res, None, name).await?,
                Err(e) => return Err(e),
            };
            if have["metadata"]["annotations"][AUTOUPDATE] != "true" {
                continue;
            }
            let changed = if res.kind == "ClusterRole" {
                let stale = want["aggregationRule"].is_null() && have["rules"] != want["rules"];
                if stale {
                    have["rules"] = want["rules"].clone();
                }
                stale
            } else {
                let subjects = have["subjects"].as_array().cloned().unwrap_or_default();
                let missing: Vec<Value> = want["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|s| !subjects.contains(s))
                    .cloned()
                    .collect();
                let stale = !missing.is_empty();
                if stale {
                    have["subjects"] = subjects.into_iter().chain(missing).collect();
                }
                stale
            };
            if changed {
                match client.update(res, None, &have).await {
                    Ok(_) => {}
                    // Another API server put it back meanwhile.
                    Err(e) if e.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    let roles = crate::request::find_resource(RBAC, "v1", "roles")?;
    client
        .create_if_absent(roles, Some("kube-system"), &authentication_reader())
        .await?;
    Ok(())
}

/// The Role in `kube-system` that lets an extension API server read how to authenticate
/// requests (kube-apiserver's `extension-apiserver-authentication-reader`; an extension's
/// ServiceAccount is bound to it, beside `system:auth-delegator`).
pub fn authentication_reader() -> Value {
    let mut metadata = meta("extension-apiserver-authentication-reader", &[]);
    metadata["namespace"] = json!("kube-system");
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": metadata,
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": [crate::aggregator::AUTHENTICATION_CONFIG_MAP],
            "verbs": ["get", "list", "watch"]}]})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::RESOURCES;

    /// Reviews and subresources this server answers outside the catalog, or that a role may
    /// name before the server serves them (they grant nothing until then).
    const NOT_IN_CATALOG: &[&str] = &[
        "localsubjectaccessreviews",
        "subjectaccessreviews",
        "tokenreviews",
        "selfsubjectaccessreviews",
        "selfsubjectrulesreviews",
        "selfsubjectreviews",
        "pods/attach",
        "pods/exec",
        "pods/portforward",
        "pods/proxy",
        "services/proxy",
        "deployments/rollback",
        "namespaces/status",
    ];

    #[test]
    fn default_roles_name_served_resources() {
        for role in cluster_roles() {
            for rule in role["rules"].as_array().into_iter().flatten() {
                let groups = rule["apiGroups"].as_array().cloned().unwrap_or_default();
                for r in rule["resources"].as_array().into_iter().flatten() {
                    let r = r.as_str().expect("string");
                    if r == "*" || NOT_IN_CATALOG.contains(&r) {
                        continue;
                    }
                    let (plural, sub) = r.split_once('/').map_or((r, None), |(p, s)| (p, Some(s)));
                    let served = RESOURCES.iter().any(|res| {
                        res.plural == plural
                            && groups.iter().any(|g| g == res.group)
                            && sub.is_none_or(|s| res.subresources.iter().any(|x| x.name == s))
                    });
                    assert!(
                        served,
                        "{} names {r}, which is not served",
                        role["metadata"]["name"]
                    );
                }
            }
        }
    }
}
