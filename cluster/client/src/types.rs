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
    /// How long the scheduler holds a partly placed gang before releasing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_timeout_seconds: Option<i32>,
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
}

impl k8s_openapi::Resource for PodGroup {
    const API_VERSION: &'static str = "tessera.io/v1alpha1";
    const GROUP: &'static str = "tessera.io";
    const KIND: &'static str = "PodGroup";
    const VERSION: &'static str = "v1alpha1";
    const URL_PATH_SEGMENT: &'static str = "podgroups";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for PodGroup {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The label that makes a pod a member of the PodGroup it names (the coscheduling
/// convention of Kubernetes' scheduler-plugins).
pub const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// The taint (and label) process nodes carry: their pods run as real processes on the
/// node's machine, so scheduling there is opt-in.
pub const PROCESS_TAINT_KEY: &str = "tessera.io/runtime";
/// Its value.
pub const PROCESS_TAINT_VALUE: &str = "process";
