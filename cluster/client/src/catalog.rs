//! The kinds the API server serves: group, version, names, scope and subresources of each.
//! Discovery, routing and storage keys are all derived from this one table.

use std::collections::HashMap;
use std::sync::LazyLock;

/// A subresource (`status`, `scale`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subresource {
    /// Its name.
    pub name: &'static str,
    /// The kind it answers with, as (group, version, kind).
    pub response: (&'static str, &'static str, &'static str),
    /// Its verbs.
    pub verbs: &'static [&'static str],
}

/// One served resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for core).
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name, as in URLs.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names (`po`, `deploy`).
    pub short_names: &'static [&'static str],
    /// Categories (`all`).
    pub categories: &'static [&'static str],
    /// Subresources.
    pub subresources: &'static [Subresource],
}

/// The verbs every served resource supports.
pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

const UPDATE_VERBS: &[&str] = &["get", "patch", "update"];

const fn status(group: &'static str, version: &'static str, kind: &'static str) -> Subresource {
    Subresource {
        name: "status",
        response: (group, version, kind),
        verbs: UPDATE_VERBS,
    }
}

const SCALE: Subresource = Subresource {
    name: "scale",
    response: ("autoscaling", "v1", "Scale"),
    verbs: UPDATE_VERBS,
};

#[allow(clippy::too_many_arguments)]
const fn r(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    subresources: &'static [Subresource],
) -> Resource {
    Resource {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        categories,
        subresources,
    }
}

const ALL: &[&str] = &["all"];

/// The RBAC API group.
pub const RBAC: &str = "rbac.authorization.k8s.io";

/// Every served resource, grouped by API group in discovery order.
pub const RESOURCES: &[Resource] = &[
    r(
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        &[],
        &[status("", "v1", "Namespace")],
    ),
    r(
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        true,
        &["po"],
        ALL,
        &[
            status("", "v1", "Pod"),
            Subresource {
                name: "binding",
                response: ("", "v1", "Binding"),
                verbs: &["create"],
            },
            Subresource {
                name: "eviction",
                response: ("policy", "v1", "Eviction"),
                verbs: &["create"],
            },
            Subresource {
                name: "log",
                response: ("", "v1", "Pod"),
                verbs: &["get"],
            },
        ],
    ),
    r(
        "",
        "v1",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        &[],
        &[status("", "v1", "Node")],
    ),
    r(
        "",
        "v1",
        "services",
        "service",
        "Service",
        true,
        &["svc"],
        ALL,
        &[status("", "v1", "Service")],
    ),
    r(
        "",
        "v1",
        "endpoints",
        "endpoints",
        "Endpoints",
        true,
        &["ep"],
        &[],
        &[],
    ),
    r(
        "",
        "v1",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        &[],
        &[],
    ),
    r(
        "",
        "v1",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        &[],
        &[],
    ),
    r("", "v1", "secrets", "secret", "Secret", true, &[], &[], &[]),
    r(
        "",
        "v1",
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
        &["quota"],
        &[],
        &[status("", "v1", "ResourceQuota")],
    ),
    r(
        "",
        "v1",
        "limitranges",
        "limitrange",
        "LimitRange",
        true,
        &["limits"],
        &[],
        &[],
    ),
    r(
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        &["sa"],
        &[],
        &[Subresource {
            name: "token",
            response: ("authentication.k8s.io", "v1", "TokenRequest"),
            verbs: &["create"],
        }],
    ),
    r(
        "",
        "v1",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        &[],
        &[status("", "v1", "PersistentVolumeClaim")],
    ),
    r(
        "",
        "v1",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        &[],
        &[status("", "v1", "PersistentVolume")],
    ),
    r(
        "",
        "v1",
        "podtemplates",
        "podtemplate",
        "PodTemplate",
        true,
        &[],
        &[],
        &[],
    ),
    r(
        "apps",
        "v1",
        "deployments",
        "deployment",
        "Deployment",
        true,
        &["deploy"],
        ALL,
        &[status("apps", "v1", "Deployment"), SCALE],
    ),
    r(
        "apps",
        "v1",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        &["rs"],
        ALL,
        &[status("apps", "v1", "ReplicaSet"), SCALE],
    ),
    r(
        "apps",
        "v1",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        ALL,
        &[status("apps", "v1", "DaemonSet")],
    ),
    r(
        "apps",
        "v1",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
        &["sts"],
        ALL,
        &[status("apps", "v1", "StatefulSet"), SCALE],
    ),
    r(
        "apps",
        "v1",
        "controllerrevisions",
        "controllerrevision",
        "ControllerRevision",
        true,
        &[],
        &[],
        &[],
    ),
    r(
        "batch",
        "v1",
        "jobs",
        "job",
        "Job",
        true,
        &[],
        ALL,
        &[status("batch", "v1", "Job")],
    ),
    r(
        "batch",
        "v1",
        "cronjobs",
        "cronjob",
        "CronJob",
        true,
        &["cj"],
        ALL,
        &[status("batch", "v1", "CronJob")],
    ),
    r(
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        &[],
        &[],
    ),
    r(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "priorityclass",
        "PriorityClass",
        false,
        &["pc"],
        &[],
        &[],
    ),
    r(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        &[],
        &[status("policy", "v1", "PodDisruptionBudget")],
    ),
    r(
        "networking.k8s.io",
        "v1",
        "ingresses",
        "ingress",
        "Ingress",
        true,
        &["ing"],
        &[],
        &[status("networking.k8s.io", "v1", "Ingress")],
    ),
    r(
        "networking.k8s.io",
        "v1",
        "ingressclasses",
        "ingressclass",
        "IngressClass",
        false,
        &[],
        &[],
        &[],
    ),
    r(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "networkpolicy",
        "NetworkPolicy",
        true,
        &["netpol"],
        &[],
        &[],
    ),
    r(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        &[],
        &[],
    ),
    r(
        RBAC,
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        &[],
        &[],
        &[],
    ),
    r(
        RBAC,
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        &[],
        &[],
        &[],
    ),
    r(
        RBAC,
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        &[],
        &[],
        &[],
    ),
    r(RBAC, "v1", "roles", "role", "Role", true, &[], &[], &[]),
    r(
        "tessera.io",
        "v1alpha1",
        "tenants",
        "tenant",
        "Tenant",
        false,
        &[],
        &[],
        &[status("tessera.io", "v1alpha1", "Tenant")],
    ),
    r(
        "tessera.io",
        "v1alpha1",
        "podgroups",
        "podgroup",
        "PodGroup",
        true,
        &["pg"],
        &[],
        &[
            status("tessera.io", "v1alpha1", "PodGroup"),
            Subresource {
                name: "binding",
                response: ("tessera.io", "v1alpha1", "PodGroupBinding"),
                verbs: &["create"],
            },
        ],
    ),
    r(
        "tessera.io",
        "v1alpha1",
        "shards",
        "shard",
        "Shard",
        false,
        &[],
        &[],
        &[status("tessera.io", "v1alpha1", "Shard")],
    ),
    r(
        "tessera.io",
        "v1alpha1",
        "shardmaps",
        "shardmap",
        "ShardMap",
        false,
        &[],
        &[],
        &[],
    ),
    r(
        "tessera.io",
        "v1alpha1",
        "placements",
        "placement",
        "Placement",
        true,
        &[],
        &[],
        &[],
    ),
];

/// The API groups with their versions, in discovery order (core first, as "").
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for res in RESOURCES {
        if !out.contains(&(res.group, res.version)) {
            out.push((res.group, res.version));
        }
    }
    out
}

/// The catalog indexed by (group, version, plural) and by (group, version, kind): a lookup
/// is a hash and one compare, not a walk of every entry's strings (the API looks resources up
/// on every request, and its admission on every create).
struct Index {
    by_plural: HashMap<(&'static str, &'static str, &'static str), &'static Resource>,
    by_kind: HashMap<(&'static str, &'static str, &'static str), &'static Resource>,
}

static INDEX: LazyLock<Index> = LazyLock::new(|| {
    let mut by_plural = HashMap::with_capacity(RESOURCES.len());
    let mut by_kind = HashMap::with_capacity(RESOURCES.len());
    for r in RESOURCES {
        by_plural.entry((r.group, r.version, r.plural)).or_insert(r);
        by_kind.entry((r.group, r.version, r.kind)).or_insert(r);
    }
    Index { by_plural, by_kind }
});

/// The resource `plural` in `group`/`version` (`""`, `"v1"`, `"pods"`), if served.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    INDEX.by_plural.get(&(group, version, plural)).copied()
}

/// The resource of `kind` in `api_version` (`apps/v1`, `v1`), as an object names itself.
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    INDEX.by_kind.get(&(group, version, kind)).copied()
}

/// The resources of one group-version.
pub fn resources_of(group: &str, version: &str) -> impl Iterator<Item = &'static Resource> {
    let (group, version) = (group.to_owned(), version.to_owned());
    RESOURCES
        .iter()
        .filter(move |r| r.group == group && r.version == version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_finds_what_a_walk_of_the_table_finds() {
        for r in RESOURCES {
            let walked = RESOURCES
                .iter()
                .find(|x| x.group == r.group && x.version == r.version && x.plural == r.plural);
            assert_eq!(find(r.group, r.version, r.plural), walked);
            let api_version = if r.group.is_empty() {
                r.version.to_owned()
            } else {
                format!("{}/{}", r.group, r.version)
            };
            let walked = RESOURCES
                .iter()
                .find(|x| x.group == r.group && x.version == r.version && x.kind == r.kind);
            assert_eq!(find_kind(&api_version, r.kind), walked);
        }
        assert_eq!(find("", "v1", "podz"), None);
        assert_eq!(find("apps", "v1", "pods"), None);
        assert_eq!(find_kind("v2", "Pod"), None);
    }

    #[test]
    fn names_are_unique_and_consistent() {
        let mut seen = std::collections::HashSet::new();
        for res in RESOURCES {
            assert!(seen.insert((res.group, res.plural)), "{} twice", res.plural);
            assert_eq!(res.plural, res.plural.to_lowercase());
            assert!(res.kind.starts_with(|c: char| c.is_ascii_uppercase()));
            for s in res.short_names {
                assert!(
                    RESOURCES
                        .iter()
                        .filter(|o| o.short_names.contains(s))
                        .count()
                        == 1,
                    "short name {s} is ambiguous"
                );
            }
        }
        assert_eq!(groups()[0], ("", "v1"), "core comes first");
        assert_eq!(resources_of("apps", "v1").count(), 5);
        assert_eq!(
            find_kind("apps/v1", "Deployment").map(|r| r.plural),
            Some("deployments")
        );
        assert_eq!(
            find_kind("v1", "Namespace").map(|r| r.plural),
            Some("namespaces")
        );
        assert!(find_kind("apps/v2", "Deployment").is_none());
    }
}
