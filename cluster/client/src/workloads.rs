//! The workload kinds the federation places on shards, and how each reads: where its pod
//! template is, how many pods it asks for at once, and whether its replicas may be divided
//! over shards. The federation's controller and each shard's agent share this table, so the
//! two ends agree on every kind.

use serde_json::Value;

use crate::catalog::Resource;
use crate::request::find_resource;

/// A kind the federation places.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    /// `apps/v1` Deployment: replicas divisible, status counts summed.
    Deployment,
    /// `apps/v1` ReplicaSet (standalone ones): as a Deployment.
    ReplicaSet,
    /// `apps/v1` StatefulSet: kept whole in each shard it runs in (its ordinals and their
    /// volumes are its pods' identities: dividing it would run `web-0` in two shards).
    StatefulSet,
    /// `batch/v1` Job: kept whole (its completions count once, in one shard).
    Job,
    /// `batch/v1` CronJob: kept whole; its Jobs are made by the shard it runs in.
    CronJob,
}

impl WorkloadKind {
    /// Every kind, in the order their informers start.
    pub const ALL: [WorkloadKind; 5] = [
        WorkloadKind::Deployment,
        WorkloadKind::ReplicaSet,
        WorkloadKind::StatefulSet,
        WorkloadKind::Job,
        WorkloadKind::CronJob,
    ];

    /// The kind's name (`Deployment`).
    pub fn kind(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::Job => "Job",
            WorkloadKind::CronJob => "CronJob",
        }
    }

    /// Its API group.
    pub fn group(self) -> &'static str {
        match self {
            WorkloadKind::Job | WorkloadKind::CronJob => "batch",
            _ => "apps",
        }
    }

    /// Its `apiVersion` (`apps/v1`).
    pub fn api_version(self) -> &'static str {
        match self {
            WorkloadKind::Job | WorkloadKind::CronJob => "batch/v1",
            _ => "apps/v1",
        }
    }

    /// Its resource (plural) name.
    pub fn plural(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "deployments",
            WorkloadKind::ReplicaSet => "replicasets",
            WorkloadKind::StatefulSet => "statefulsets",
            WorkloadKind::Job => "jobs",
            WorkloadKind::CronJob => "cronjobs",
        }
    }

    /// The kind served under `plural`, if the federation places it.
    pub fn from_plural(plural: &str) -> Option<WorkloadKind> {
        WorkloadKind::ALL.into_iter().find(|k| k.plural() == plural)
    }

    /// The kind named `kind`, if the federation places it.
    pub fn from_kind(kind: &str) -> Option<WorkloadKind> {
        WorkloadKind::ALL.into_iter().find(|k| k.kind() == kind)
    }

    /// Its entry in the resource catalog.
    pub fn resource(self) -> &'static Resource {
        find_resource(self.group(), "v1", self.plural()).expect("a served workload kind")
    }

    /// Whether its replicas may be divided over shards (each shard running a part). Only
    /// the kinds whose pods are interchangeable: a StatefulSet's are not, and a Job's
    /// completions would be counted once per shard.
    pub fn divisible(self) -> bool {
        matches!(self, WorkloadKind::Deployment | WorkloadKind::ReplicaSet)
    }

    /// The pod template in `spec`.
    pub fn template(self, spec: &Value) -> &Value {
        match self {
            WorkloadKind::CronJob => &spec["jobTemplate"]["spec"]["template"],
            _ => &spec["template"],
        }
    }

    /// How many pods it asks for at once — what a shard must have room for: `replicas` (1
    /// when unset), a Job's parallelism (never more than its completions), a CronJob's
    /// Job's.
    pub fn replicas(self, spec: &Value) -> u64 {
        let job = |s: &Value| {
            let parallelism = s["parallelism"].as_i64().unwrap_or(1).max(0) as u64;
            match s["completions"].as_i64() {
                Some(c) => parallelism.min(c.max(0) as u64),
                None => parallelism,
            }
        };
        match self {
            WorkloadKind::Job => job(spec),
            WorkloadKind::CronJob => job(&spec["jobTemplate"]["spec"]),
            _ => spec["replicas"].as_i64().unwrap_or(1).max(0) as u64,
        }
    }

    /// Whether a shard's copy carries its share in `spec.replicas` (the divisible kinds and
    /// StatefulSets); a Job's copy keeps its spec as it is.
    pub fn has_replicas(self) -> bool {
        !matches!(self, WorkloadKind::Job | WorkloadKind::CronJob)
    }

    /// Of a copy's status: the pods that exist for it now (what its shard already counts as
    /// used), so the rest of its share is room the shard has promised.
    pub fn pods_now(self, status: &Value) -> u64 {
        let n = match self {
            WorkloadKind::Job => status["active"].as_i64().unwrap_or(0),
            WorkloadKind::CronJob => status["active"].as_array().map_or(0, |a| a.len() as i64),
            _ => status["replicas"].as_i64().unwrap_or(0),
        };
        n.max(0) as u64
    }

    /// Whether a copy with this status needs no more room: a finished Job, or a CronJob
    /// (whose Jobs come and go on its schedule).
    pub fn needs_no_room(self, status: &Value) -> bool {
        match self {
            WorkloadKind::Job => status["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    matches!(c["type"].as_str(), Some("Complete" | "Failed"))
                        && c["status"] == "True"
                })
            }),
            WorkloadKind::CronJob => true,
            _ => false,
        }
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_kind_is_served_and_found_by_its_names() {
        for k in WorkloadKind::ALL {
            assert_eq!(k.resource().plural, k.plural());
            assert_eq!(WorkloadKind::from_plural(k.plural()), Some(k));
            assert_eq!(WorkloadKind::from_kind(k.kind()), Some(k));
        }
        assert_eq!(WorkloadKind::from_kind("Pod"), None);
    }

    #[test]
    fn replicas_read_per_kind() {
        let d = json!({"replicas": 4, "template": {"spec": {"containers": []}}});
        assert_eq!(WorkloadKind::Deployment.replicas(&d), 4);
        assert_eq!(WorkloadKind::StatefulSet.replicas(&json!({})), 1);
        assert_eq!(
            WorkloadKind::Job.replicas(&json!({"parallelism": 5, "completions": 3})),
            3
        );
        assert_eq!(WorkloadKind::Job.replicas(&json!({"parallelism": 5})), 5);
        assert_eq!(WorkloadKind::Job.replicas(&json!({})), 1);
        let cj =
            json!({"jobTemplate": {"spec": {"parallelism": 2, "template": {"spec": {"x": 1}}}}});
        assert_eq!(WorkloadKind::CronJob.replicas(&cj), 2);
        assert_eq!(WorkloadKind::CronJob.template(&cj)["spec"]["x"], 1);
        assert!(WorkloadKind::Deployment.divisible());
        assert!(!WorkloadKind::StatefulSet.divisible());
        assert!(!WorkloadKind::Job.has_replicas());
    }

    #[test]
    fn a_finished_job_needs_no_room() {
        let running = json!({"active": 2});
        let done = json!({"conditions": [{"type": "Complete", "status": "True"}]});
        assert_eq!(WorkloadKind::Job.pods_now(&running), 2);
        assert!(!WorkloadKind::Job.needs_no_room(&running));
        assert!(WorkloadKind::Job.needs_no_room(&done));
        assert_eq!(
            WorkloadKind::Deployment.pods_now(&json!({"replicas": 3})),
            3
        );
    }
}
