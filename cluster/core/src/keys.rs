//! Where objects live in the store: Kubernetes' key layout, `/registry/<resource>/<namespace>/<name>`
//! for namespaced objects and `/registry/<resource>/<name>` for cluster-scoped ones. The API
//! server writes these keys and the sharded store routes by them, so both use this module.

/// The root of every object key.
pub const ROOT: &str = "/registry/";

/// Kubernetes' built-in API groups, whose resources it stores under `/registry/<resource>/`
/// without the group; other groups' resources are stored under `<resource>.<group>`.
const BUILTIN_GROUPS: &[&str] = &[
    "",
    "core",
    "apps",
    "batch",
    "autoscaling",
    "policy",
    "coordination.k8s.io",
    "scheduling.k8s.io",
    "networking.k8s.io",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "discovery.k8s.io",
    "admissionregistration.k8s.io",
    "events.k8s.io",
    "certificates.k8s.io",
    "node.k8s.io",
    "apiregistration.k8s.io",
];

/// The key segment a resource of an API group is stored under (`deployments` for
/// `apps/deployments`, `podgroups.tessera.io` for `tessera.io/podgroups`).
pub fn resource_segment(group: &str, resource: &str) -> String {
    if BUILTIN_GROUPS.contains(&group) {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// The key of one object.
pub fn object_key(segment: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ROOT}{segment}/{ns}/{name}"),
        None => format!("{ROOT}{segment}/{name}"),
    }
}

/// The prefix of a resource's keys, in one namespace or in all.
pub fn resource_prefix(segment: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{ROOT}{segment}/{ns}/"),
        None => format!("{ROOT}{segment}/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_kubernetes() {
        assert_eq!(resource_segment("apps", "deployments"), "deployments");
        assert_eq!(resource_segment("", "events"), "events");
        assert_eq!(
            resource_segment("tessera.io", "podgroups"),
            "podgroups.tessera.io"
        );
        assert_eq!(object_key("pods", Some("ns"), "p"), "/registry/pods/ns/p");
        assert_eq!(object_key("nodes", None, "n1"), "/registry/nodes/n1");
        assert_eq!(resource_prefix("pods", Some("ns")), "/registry/pods/ns/");
        assert_eq!(resource_prefix("pods", None), "/registry/pods/");
    }
}
