//! Node agents. [`sim`] runs hollow nodes: thousands of simulated nodes in one process, each
//! with its own Node and pods, as kubemark and KWOK do — what a shard's control plane sees of
//! them is what real agents would show it. Their liveness is one Lease for the whole agent by
//! default (one process, one failure domain; see [`sim::SimConfig::shared_lease`]), or a
//! Lease per node as a kubelet keeps. [`process`] runs one real node, with its own Lease.

pub mod cgroups;
pub mod env;
pub mod fence;
pub mod isolation;
pub mod loans;
pub mod logs;
pub mod metrics;
pub mod probe;
pub mod process;
pub mod sandbox;
pub mod seccomp;
pub mod sim;
pub mod streams;
pub mod usage;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tessera_client::client::Client;
use tessera_client::request::{ApiRequest, Verb, find_resource};
use tessera_client::status::ApiError;

/// Makes `dir` (and its parents) and keeps it to its owner (0700): what the agent keeps
/// there — pods' volumes, Secrets among them — is no one else's to read.
pub fn data_dir_private(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Removes a pod whose containers have stopped: grace 0, this very pod only (its UID as
/// precondition), as a kubelet does once a deleted pod's containers are gone.
pub async fn remove_stopped(client: &Arc<dyn Client>, pod: &Pod) -> Result<(), ApiError> {
    let mut req = ApiRequest::new(Verb::Delete, find_resource("", "v1", "pods")?);
    req.namespace = pod.metadata.namespace.clone();
    req.name = pod.metadata.name.clone();
    req.params.grace_period_seconds = Some(0);
    req.body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "gracePeriodSeconds": 0, "preconditions": {"uid": pod.metadata.uid}})
    .to_string()
    .into();
    client.call(req).await.map(|_| ())
}
