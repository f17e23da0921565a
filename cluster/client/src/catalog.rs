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
    /// Defined at run time by a CustomResourceDefinition (its schema, columns and versions
    /// are the API server's to look up), not built in.
    pub custom: bool,
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

/// A CertificateSigningRequest's `approval` subresource (`kubectl certificate approve`).
const APPROVAL: Subresource = Subresource {
    name: "approval",
    response: (CERTIFICATES, "v1", "CertificateSigningRequest"),
    verbs: UPDATE_VERBS,
};

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
        custom: false,
    }
}

const ALL: &[&str] = &["all"];

/// The RBAC API group.
pub const RBAC: &str = "rbac.authorization.k8s.io";

/// The group of APIServices.
pub const APIREGISTRATION: &str = "apiregistration.k8s.io";

/// The group of admission webhook configurations.
pub const ADMISSIONREGISTRATION: &str = "admissionregistration.k8s.io";

/// The group of CertificateSigningRequests.
pub const CERTIFICATES: &str = "certificates.k8s.io";

/// The group of CustomResourceDefinitions.
pub const APIEXTENSIONS: &str = "apiextensions.k8s.io";

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
            // Streams to a pod's node (WebSocket or SPDY upgrades), answered on their own
            // routes.
            Subresource {
                name: "attach",
                response: ("", "v1", "PodAttachOptions"),
                verbs: &["create", "get"],
            },
            Subresource {
                name: "exec",
                response: ("", "v1", "PodExecOptions"),
                verbs: &["create", "get"],
            },
            Subresource {
                name: "portforward",
                response: ("", "v1", "PodPortForwardOptions"),
                verbs: &["create", "get"],
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
        "",
        "v1",
        "replicationcontrollers",
        "replicationcontroller",
        "ReplicationController",
        true,
        &["rc"],
        ALL,
        &[status("", "v1", "ReplicationController"), SCALE],
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
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
        ALL,
        &[status("autoscaling", "v2", "HorizontalPodAutoscaler")],
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
        CERTIFICATES,
        "v1",
        "certificatesigningrequests",
        "certificatesigningrequest",
        "CertificateSigningRequest",
        false,
        &["csr"],
        &[],
        &[
            APPROVAL,
            status(CERTIFICATES, "v1", "CertificateSigningRequest"),
        ],
    ),
    r(
        APIREGISTRATION,
        "v1",
        "apiservices",
        "apiservice",
        "APIService",
        false,
        &[],
        &["api-extensions"],
        &[status(APIREGISTRATION, "v1", "APIService")],
    ),
    r(
        ADMISSIONREGISTRATION,
        "v1",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        "MutatingWebhookConfiguration",
        false,
        &[],
        &["api-extensions"],
        &[],
    ),
    r(
        ADMISSIONREGISTRATION,
        "v1",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        "ValidatingWebhookConfiguration",
        false,
        &[],
        &["api-extensions"],
        &[],
    ),
    r(
        ADMISSIONREGISTRATION,
        "v1",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        false,
        &[],
        &["api-extensions"],
        &[status(
            ADMISSIONREGISTRATION,
            "v1",
            "ValidatingAdmissionPolicy",
        )],
    ),
    r(
        ADMISSIONREGISTRATION,
        "v1",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        "ValidatingAdmissionPolicyBinding",
        false,
        &[],
        &["api-extensions"],
        &[],
    ),
    r(
        APIEXTENSIONS,
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        &["api-extensions"],
        &[status(APIEXTENSIONS, "v1", "CustomResourceDefinition")],
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

/// Older versions of stored kinds, served by converting to and from the stored version
/// (Kubernetes' storage version) at the API's edge: requests, answers and watch events. The
/// store, controllers, admission and every walk of [`RESOURCES`] see the stored version only.
pub const VIEWS: &[Resource] = &[r(
    "autoscaling",
    "v1",
    "horizontalpodautoscalers",
    "horizontalpodautoscaler",
    "HorizontalPodAutoscaler",
    true,
    &["hpa"],
    ALL,
    &[status("autoscaling", "v1", "HorizontalPodAutoscaler")],
)];

/// Every built-in resource served: the stored versions, then the views of older versions.
pub fn served() -> impl Iterator<Item = &'static Resource> {
    RESOURCES.iter().chain(VIEWS)
}

/// The stored resource a view of an older version stands for (`autoscaling/v1`
/// HorizontalPodAutoscalers: `autoscaling/v2`'s), or `None` if `res` is stored itself.
pub fn stored_version_of(res: &Resource) -> Option<&'static Resource> {
    if res.custom || !VIEWS.contains(res) {
        return None;
    }
    RESOURCES
        .iter()
        .find(|r| r.group == res.group && r.plural == res.plural)
}

/// The API groups with their versions, in discovery order (core first, as ""); a group's
/// stored version comes before its views, so it is the preferred one.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for res in served() {
        if !out.contains(&(res.group, res.version)) {
            out.push((res.group, res.version));
        }
    }
    out
}

/// Whether `group`/`version` is a built-in group-version.
pub fn find_group_version(group: &str, version: &str) -> bool {
    served().any(|r| r.group == group && r.version == version)
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
    for r in served() {
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
    served().filter(move |r| r.group == group && r.version == version)
}

/// Where requests find their resource: the built-in catalog, and in an API server that
/// serves CustomResourceDefinitions, the kinds they define.
pub trait Lookup {
    /// The resource `plural` in `group`/`version`, if served.
    fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Resource>;
    /// Whether `plural` in `group` is a namespaced resource in some served version.
    fn namespaced(&self, group: &str, plural: &str) -> bool;
}

/// The built-in catalog alone.
pub struct Builtin;

impl Lookup for Builtin {
    fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        find(group, version, plural)
    }
    fn namespaced(&self, group: &str, plural: &str) -> bool {
        RESOURCES
            .iter()
            .any(|r| r.plural == plural && r.namespaced && r.group == group)
    }
}

/// The names of a resource defined at run time, owned, for [`intern`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustomNames {
    /// API group.
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names.
    pub short_names: Vec<String>,
    /// Categories.
    pub categories: Vec<String>,
    /// Serves `status`.
    pub status: bool,
    /// Serves `scale`.
    pub scale: bool,
}

/// The one `&'static Resource` for `names`: resources defined at run time are interned, so
/// the request path keeps handling `&'static Resource` alike for built-in and custom kinds.
/// Each distinct set of names is allocated once for the life of the process (a CRD deleted
/// and created again reuses it), so what is held grows with the distinct definitions ever
/// served, not with requests or CRD updates.
pub fn intern(names: &CustomNames) -> &'static Resource {
    static INTERNED: LazyLock<std::sync::Mutex<HashMap<CustomNames, &'static Resource>>> =
        LazyLock::new(Default::default);
    let mut interned = INTERNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(r) = interned.get(names) {
        return r;
    }
    fn leak(s: &str) -> &'static str {
        Box::leak(s.to_owned().into_boxed_str())
    }
    fn leak_all(v: &[String]) -> &'static [&'static str] {
        Box::leak(
            v.iter()
                .map(|s| leak(s))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        )
    }
    let group = leak(&names.group);
    let version = leak(&names.version);
    let kind = leak(&names.kind);
    let mut subresources = Vec::new();
    if names.status {
        subresources.push(Subresource {
            name: "status",
            response: (group, version, kind),
            verbs: UPDATE_VERBS,
        });
    }
    if names.scale {
        subresources.push(SCALE);
    }
    let res: &'static Resource = Box::leak(Box::new(Resource {
        group,
        version,
        plural: leak(&names.plural),
        singular: leak(&names.singular),
        kind,
        namespaced: names.namespaced,
        short_names: leak_all(&names.short_names),
        categories: leak_all(&names.categories),
        subresources: Box::leak(subresources.into_boxed_slice()),
        custom: true,
    }));
    interned.insert(names.clone(), res);
    res
}

/// The resource a CustomResourceDefinition (as JSON) defines in `version`, interned; None if
/// the CRD does not define that version.
pub fn custom_resource(crd: &serde_json::Value, version: &str) -> Option<&'static Resource> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let v = spec["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"].as_str() == Some(version))?;
    let text = |x: &serde_json::Value| x.as_str().unwrap_or_default().to_owned();
    let list = |x: &serde_json::Value| -> Vec<String> {
        x.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let kind = text(&names["kind"]);
    Some(intern(&CustomNames {
        group: text(&spec["group"]),
        version: version.to_owned(),
        plural: text(&names["plural"]),
        singular: match text(&names["singular"]) {
            s if s.is_empty() => kind.to_lowercase(),
            s => s,
        },
        kind,
        namespaced: spec["scope"].as_str() != Some("Cluster"),
        short_names: list(&names["shortNames"]),
        categories: list(&names["categories"]),
        status: v["subresources"]["status"].is_object(),
        scale: v["subresources"]["scale"].is_object(),
    }))
}

/// The resource of a CRD's storage version (what a client walking every kind lists).
pub fn custom_storage_resource(crd: &serde_json::Value) -> Option<&'static Resource> {
    let storage = crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"] == serde_json::Value::Bool(true))?;
    custom_resource(crd, storage["name"].as_str()?)
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
