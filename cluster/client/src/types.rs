//! Tessera's own kinds (`tessera.io/v1alpha1`), typed like the built-in ones so that they are
//! decoded, validated and described (OpenAPI) the same way.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A tenant: owns namespaces, has a weight for fair sharing and a quota over all of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.Tenant")]
pub struct Tenant {
    /// APIVersion: `tessera.io/v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind: `Tenant`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the tenant owns and may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<TenantSpec>,
    /// Observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TenantStatus>,
}

/// What a tenant owns and may use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.TenantSpec")]
pub struct TenantSpec {
    /// The namespaces this tenant owns: its tokens may touch these and no others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    /// Relative share of the shard when tenants compete (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Most API requests of this tenant served at once; more are answered 429 (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight_requests: Option<i32>,
    /// Total resources (cpu, memory, pods, ...) the tenant's pods may request in all its
    /// namespaces together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<BTreeMap<String, Quantity>>,
    /// The loosest Pod Security level its namespaces may have: `privileged`, `baseline`
    /// (default) or `restricted`. Namespace labels can only make it stricter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<String>,
    /// Whether its pods may run on process nodes (which carry the taint
    /// `tessera.io/runtime=process:NoSchedule`): without it, a toleration of that taint or a
    /// `nodeName` of a process node is refused (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_nodes: Option<bool>,
    /// Watches its tokens may hold open at once (default: 4 per request seat, at least 16);
    /// more answer 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_watches: Option<i32>,
    /// Bumped by an admin to revoke every token minted for this tenant before (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_generation: Option<i64>,
    /// The shards whose nodes its federated pods may run on when those nodes are lent to the
    /// shard the pods are in (elastic shards): unset, any shard's; empty, none (its pods stay
    /// on their own shard's nodes, and never make their shard borrow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_from: Option<Vec<String>>,
}

/// Observed state of a tenant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.TenantStatus")]
pub struct TenantStatus {
    /// Resources requested by the tenant's pods now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<BTreeMap<String, Quantity>>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// A gang: pods that are placed all together or not at all.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.PodGroup")]
pub struct PodGroup {
    /// APIVersion: `tessera.io/v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind: `PodGroup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The gang's requirements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodGroupSpec>,
    /// Observed state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodGroupStatus>,
}

/// What a gang needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.PodGroupSpec")]
pub struct PodGroupSpec {
    /// Fewest pods of the group that must be placeable together before any is bound.
    pub min_member: i32,
    /// How long the scheduler holds a partly placed gang before releasing it. For a gang
    /// of `Federation` scope, also how long its parts' reservations live before commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_timeout_seconds: Option<i32>,
    /// Where the gang must fit: `Shard` (the default: in one shard) or `Federation` (at the
    /// federation only: divided over shards when no single shard can hold it, and committed
    /// in all of them or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// Observed state of a gang.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.PodGroupStatus")]
pub struct PodGroupStatus {
    /// Pending, Scheduling, Running, Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Pods of the group bound to nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<i32>,
    /// Pods of the group running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,
    /// Members placed and held by the scheduler for a commit that has not come yet (a part
    /// of a federation-scope gang in its reserve phase); 0 once let go or bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<i32>,
    /// The `tessera.io/gang-attempt` the reservation was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_for: Option<i64>,
}

/// The gang scope that divides a PodGroup over shards (see [`PodGroupSpec::scope`]).
pub const GANG_SCOPE_FEDERATION: &str = "Federation";
/// On a shard's part of a federation-scope gang: `Reserve` (place and hold the members, bind
/// none) or `Commit` (bind them). Written by the federation.
pub const GANG_PHASE_ANNOTATION: &str = "tessera.io/gang-phase";
/// The attempt a part belongs to: a reservation counts only for the attempt it was made for.
pub const GANG_ATTEMPT_ANNOTATION: &str = "tessera.io/gang-attempt";
/// On a shard's part of a federation-scope gang: the Job it is the PodGroup of (a change to
/// the PodGroup is reported to the federation as the Job's).
pub const GANG_JOB_ANNOTATION: &str = "tessera.io/gang-job";

/// The label that makes a pod a member of the PodGroup it names (the coscheduling
/// convention of Kubernetes' scheduler-plugins).
pub const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// The body of `podgroups/{name}/binding`: members of one gang assigned to nodes together,
/// in one store transaction — all of them or none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.PodGroupBinding")]
pub struct PodGroupBinding {
    /// APIVersion: `tessera.io/v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind: `PodGroupBinding`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The PodGroup's name and namespace.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Each member and its node.
    #[serde(default)]
    pub members: Vec<MemberBinding>,
}

/// One member of a [`PodGroupBinding`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberBinding {
    /// The pod's name (in the PodGroup's namespace).
    pub pod: String,
    /// The pod's UID, if the binder knows it: the binding fails if the pod was replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The node it goes to.
    pub node: String,
}

/// The taint (and label) process nodes carry: their pods run as real processes on the
/// node's machine, so scheduling there is opt-in.
pub const PROCESS_TAINT_KEY: &str = "tessera.io/runtime";
/// Its value.
pub const PROCESS_TAINT_VALUE: &str = "process";

/// The annotation that names, in `kube-node-lease`, the Lease a node's liveness is read from
/// when that is not the node's own. Hollow nodes of one simulated agent share one Lease — one
/// process is one failure domain, so one heartbeat stands for all of them — and the node
/// lifecycle controller reads each node's liveness from the Lease this names. A node without
/// it has a Lease of its own, named after it, as a kubelet keeps.
pub const NODE_LEASE_ANNOTATION: &str = "tessera.io/node-lease";

/// The `k8s_openapi` resource and metadata traits of one of Tessera's kinds, so the
/// runtime's informers and caches hold it like a built-in kind.
macro_rules! tessera_kind {
    ($ty:ident, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = "tessera.io/v1alpha1";
            const GROUP: &'static str = "tessera.io";
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v1alpha1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

tessera_kind!(
    Tenant,
    "Tenant",
    "tenants",
    k8s_openapi::ClusterResourceScope
);
tessera_kind!(
    PodGroup,
    "PodGroup",
    "podgroups",
    k8s_openapi::NamespaceResourceScope
);

/// A member cluster of the federation: a whole control plane with its own store, joined by
/// its federation agent. Created by the federation when the shard first registers; an admin
/// cordons it (`spec.unschedulable`) or taints it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.Shard")]
pub struct Shard {
    /// APIVersion: `tessera.io/v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind: `Shard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard object metadata; its labels are the shard's (region, zone, ...).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the admin decides about the shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ShardSpec>,
    /// What its agent reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ShardStatus>,
}

/// What an admin decides about a shard.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardSpec")]
pub struct ShardSpec {
    /// Cordoned: no new work is placed here (what runs stays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<bool>,
    /// Taints: workloads whose Placement does not tolerate them are not placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    /// Virtual nodes on the shard map, overriding the weight its capacity gives (1..10240).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Whether and how much this shard lends idle nodes to shards whose pending work cannot
    /// fit, and borrows from others (elastic shards). Unset: it neither lends nor borrows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending: Option<ShardLending>,
}

/// A shard's lending policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardLending")]
pub struct ShardLending {
    /// Nodes it keeps for itself whatever it lends (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_nodes: Option<i64>,
    /// Most of its nodes lent out at once (default 0: it lends none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lend: Option<i64>,
    /// Most nodes it borrows at once (default 0: it borrows none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_borrow: Option<i64>,
}

/// What a shard's agent reports, as the federation last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardStatus")]
pub struct ShardStatus {
    /// `Ready`: the shard's lease is held (its agent is connected and renewing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Ready, schedulable nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// Allocatable totals (cpu, memory, pods, extended resources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    /// Free totals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<BTreeMap<String, Quantity>>,
    /// Pods running in the shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_running: Option<i64>,
    /// Pods waiting for a node in the shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_pending: Option<i64>,
    /// Pods the shard's scheduler placed (seen pending, then on a node) in about the last
    /// minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_placed_last_minute: Option<i64>,
    /// Free-slot histogram entries in its last summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<i64>,
    /// The last summary's version and when it came (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_version: Option<i64>,
    /// When the last summary came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_time: Option<String>,
    /// The shard's lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<ShardLease>,
    /// The shard's Kubernetes API, as its agent reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// Its virtual nodes on the current shard map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    /// Federated workloads it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<i64>,
    /// Of those, the ones moving off it (kept until their copies elsewhere are available,
    /// or stopped here first): a drain is done when `workloads` is zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_out: Option<i64>,
    /// Its schedulable nodes grouped by the label keys its summaries group by (zone,
    /// instance type): per group the labels, nodes and free amounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_groups: Option<Vec<ShardNodeGroup>>,
    /// Its nodes lent to other shards now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lent_nodes: Option<i64>,
    /// Other shards' nodes it borrows now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowed_nodes: Option<i64>,
    /// Pods pending here that no node has room for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmet_pods: Option<i64>,
}

/// Nodes of a shard with the same values of its summary's group keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardNodeGroup")]
pub struct ShardNodeGroup {
    /// The group's label values (a key absent from the map: nodes without that label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Schedulable nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// Free amounts per resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<BTreeMap<String, Quantity>>,
}

/// A shard's lease from the federation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardLease")]
pub struct ShardLease {
    /// The agent's session (a new one at each connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Seconds the lease runs from each renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i64>,
    /// The last renewal (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<String>,
}

tessera_kind!(Shard, "Shard", "shards", k8s_openapi::ClusterResourceScope);

/// The tenant → shard map the federation routes by, as it last changed: written by the
/// federation (one object, `default`), for operators to read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardMap")]
pub struct ShardMapObject {
    /// APIVersion: `tessera.io/v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind: `ShardMap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ShardMapSpec>,
}

/// A version of the shard map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardMapSpec")]
pub struct ShardMapSpec {
    /// Bumped at every change of the shards or their weights.
    pub version: i64,
    /// The shards on the ring and their virtual nodes.
    #[serde(default)]
    pub shards: Vec<ShardMapEntry>,
}

/// One shard on the map.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardMapEntry")]
pub struct ShardMapEntry {
    /// The shard.
    pub name: String,
    /// Its virtual nodes.
    pub weight: i64,
}

tessera_kind!(
    ShardMapObject,
    "ShardMap",
    "shardmaps",
    k8s_openapi::ClusterResourceScope
);

/// Where the federation places the workloads it selects in its namespace (the default for
/// a workload no Placement selects: its tenant's home shard, spilling over down the tenant's
/// preference list).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.Placement")]
pub struct Placement {
    /// APIVersion: `tessera.io/v1alpha1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind: `Placement`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PlacementSpec>,
}

/// A placement policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.PlacementSpec")]
pub struct PlacementSpec {
    /// The workloads it applies to (any one matching selects a workload).
    #[serde(default)]
    pub resource_selectors: Vec<ResourceSelector>,
    /// Only shards named here, or with these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_affinity: Option<ShardAffinity>,
    /// Shard taints the workloads tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<k8s_openapi::api::core::v1::Toleration>>,
    /// How replicas are spread over the shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaPlacement>,
    /// Spread over groups of shards (regions, zones) by a shard label: at least `minGroups`
    /// and at most `maxGroups` of them (with `Duplicated` or `Divided`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_constraints: Option<Vec<SpreadConstraint>>,
    /// What happens to the workloads when their shard loses the federation (its agent's
    /// lease lapses). Unset: Jobs, CronJobs and StatefulSets `AtMostOnce`, the others `Fast`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverPolicy>,
}

/// How a workload leaves a shard that lost the federation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.FailoverPolicy")]
pub struct FailoverPolicy {
    /// `AtMostOnce`: the cut-off shard stops the workload itself when its lease lapses, and
    /// the federation starts it elsewhere only after the lease, the pods' termination grace
    /// period and a margin have passed (never in two shards at once). `Fast`: it is started
    /// elsewhere as soon as the lease lapses (it may run twice for a while).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Seconds to wait after the lease lapsed before re-placing (for `AtMostOnce`, the least
    /// wait; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<i64>,
}

/// Spread over the groups of shards that share a label's value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.SpreadConstraint")]
pub struct SpreadConstraint {
    /// The shard label whose values make the groups (`region`, `zone`).
    pub spread_by_label: String,
    /// Replicas go to at least this many groups (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_groups: Option<i64>,
    /// And to at most this many, the tenant's nearest first (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_groups: Option<i64>,
}

/// Selects workloads by kind, name and labels.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ResourceSelector")]
pub struct ResourceSelector {
    /// `apps/v1`, `batch/v1` (empty: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `Deployment`, `StatefulSet`, `Job` (empty: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// One workload by name (empty: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Workloads with these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// Which shards a workload may go to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardAffinity")]
pub struct ShardAffinity {
    /// Only these shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_names: Option<Vec<String>>,
    /// Only shards with all these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
}

/// How a workload's replicas are spread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ReplicaPlacement")]
pub struct ReplicaPlacement {
    /// `Home` (default: the tenant's home shard, spilling over), `Duplicated` (every
    /// eligible shard runs all replicas), `Divided` (split over the shards) or `Whole` (all
    /// in one shard: a gang, a multi-role workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<String>,
    /// For `Divided`: `Weighted` (by `weights`) or `Capacity` (in proportion to each shard's
    /// room for the workload; the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub division: Option<String>,
    /// For `Divided` by `Weighted`: static weights per shard (shards not listed get none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Vec<ShardWeightEntry>>,
}

/// A shard's static weight in a `Divided` placement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.tessera.v1alpha1.ShardWeightEntry")]
pub struct ShardWeightEntry {
    /// The shard.
    pub shard: String,
    /// Its weight (≥ 0).
    pub weight: i64,
}

tessera_kind!(
    Placement,
    "Placement",
    "placements",
    k8s_openapi::NamespaceResourceScope
);

/// The label the federation puts on every object it applies in a shard.
pub const FEDERATED_LABEL: &str = "tessera.io/federated";

/// The kinds the federation holds in every shard as they are, as (group, plural, kind): RBAC
/// (what a tenant grants at the federation holds when its users reach a shard directly),
/// CustomResourceDefinitions (every shard serves the kinds an operator defines, wherever its
/// objects and workloads land), admission webhook configurations and ValidatingAdmission
/// policies with their bindings (a webhook or policy judges the writes of every shard, the
/// pods their controllers create among them).
pub const HELD_KINDS: [(&str, &str, &str); 9] = [
    (crate::catalog::RBAC, "roles", "Role"),
    (crate::catalog::RBAC, "rolebindings", "RoleBinding"),
    (crate::catalog::RBAC, "clusterroles", "ClusterRole"),
    (
        crate::catalog::RBAC,
        "clusterrolebindings",
        "ClusterRoleBinding",
    ),
    (
        crate::catalog::APIEXTENSIONS,
        "customresourcedefinitions",
        "CustomResourceDefinition",
    ),
    (
        crate::catalog::ADMISSIONREGISTRATION,
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
    ),
    (
        crate::catalog::ADMISSIONREGISTRATION,
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
    ),
    (
        crate::catalog::ADMISSIONREGISTRATION,
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
    ),
    (
        crate::catalog::ADMISSIONREGISTRATION,
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
    ),
];
/// The label the federation puts on objects it lists from a shard: which shard holds them.
pub const SHARD_LABEL: &str = "tessera.io/shard";
/// The field manager the federation applies with.
pub const FEDERATION_MANAGER: &str = "tessera-federation";

/// The annotation on a federated copy saying how it fails over (`AtMostOnce`, `Fast`): the
/// shard's fence stops `AtMostOnce` ones when the shard loses the federation.
pub const FAILOVER_ANNOTATION: &str = "tessera.io/failover";

/// The Lease (in `kube-system`) a shard's federation agent renews while the federation
/// acknowledges its renewals: when it ends, the shard's fence stops its `AtMostOnce` work.
pub const FEDERATION_LEASE: &str = "tessera-federation";

/// When the shard's federation Lease ends (seconds since the epoch, with fractions), if it is
/// one a federation agent wrote (holder, renew time and duration all set). The shard's fence
/// controller and its process nodes both stop `AtMostOnce` work from that instant.
pub fn federation_lease_end(lease: &serde_json::Value) -> Option<f64> {
    let spec = &lease["spec"];
    spec["holderIdentity"].as_str().filter(|h| !h.is_empty())?;
    let renewed: jiff::Timestamp = spec["renewTime"].as_str()?.parse().ok()?;
    let duration = spec["leaseDurationSeconds"].as_i64()?;
    Some(renewed.as_microsecond() as f64 / 1e6 + duration as f64)
}

// --- Elastic shards: nodes lent from one shard to another ---

/// The taint a lent node carries in the borrowing shard (`tessera.io/borrowed=<lender>:
/// NoSchedule`): only pods whose tenant may use the lender's nodes tolerate it.
pub const BORROWED_TAINT_KEY: &str = "tessera.io/borrowed";
/// The label naming a lent node's loan (on the node in both shards).
pub const LOAN_LABEL: &str = "tessera.io/loan";
/// The label naming the shard a borrowed node belongs to (in the borrowing shard).
pub const LENT_FROM_LABEL: &str = "tessera.io/lent-from";
/// The annotation naming the shard a node is lent to (in the lending shard).
pub const LENT_TO_ANNOTATION: &str = "tessera.io/lent-to";
/// The taint a lent node carries at home while away (`tessera.io/lent=<borrower>:NoSchedule`).
pub const LENT_TAINT_KEY: &str = "tessera.io/lent";
/// Where a shard keeps the loans it admits (namespace, name): a ConfigMap whose `data` maps a
/// lent node's name to its loan's id. Only the shard's federation agent writes it; a lent
/// node's credential is good while its entry is there.
pub const LOANS_CONFIGMAP: (&str, &str) = ("kube-system", "tessera-loans");

/// The Secret (in `kube-system` of the lending shard) holding what node `node` needs to join
/// the borrower: `server`, `ca.crt`, `token`.
pub fn loan_secret_name(node: &str) -> String {
    format!("tessera-loan.{node}")
}

/// A node lent to another shard, as it registers there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LentMark {
    /// The shard it belongs to.
    pub lender: String,
    /// The loan's id.
    pub loan: String,
}

impl LentMark {
    /// The labels it adds to its Node.
    pub fn labels(&self) -> [(&'static str, &str); 2] {
        [(LOAN_LABEL, &self.loan), (LENT_FROM_LABEL, &self.lender)]
    }

    /// The taint it adds to its Node.
    pub fn taint(&self) -> serde_json::Value {
        serde_json::json!({"key": BORROWED_TAINT_KEY, "value": self.lender, "effect": "NoSchedule"})
    }
}
