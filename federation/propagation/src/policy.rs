//! From the federation's objects to placement's inputs: a namespace's tenant, the Placement
//! that selects a workload, and that Placement as a [`Policy`].

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_client::types::{Placement, Tenant};
use tessera_client::workloads::WorkloadKind;
use tessera_placement::{Failover, FailoverMode, Mode, Policy, Spread, Toleration};

/// Which Tenant owns each namespace, kept from the Tenant informer's changes, so routing a
/// workload to its tenant is one lookup, not a scan of every Tenant.
#[derive(Debug, Default)]
pub struct TenantIndex {
    owner: HashMap<String, String>,
}

impl TenantIndex {
    /// Takes a Tenant's change: `old` as it was (none if new), `new` as it is (none if gone).
    pub fn update(&mut self, old: Option<&Tenant>, new: Option<&Tenant>) {
        let namespaces = |t: &Tenant| -> Vec<String> {
            t.spec
                .as_ref()
                .and_then(|s| s.namespaces.clone())
                .unwrap_or_default()
        };
        if let Some(t) = old {
            for ns in namespaces(t) {
                if self.owner.get(&ns) == t.metadata.name.as_ref() {
                    self.owner.remove(&ns);
                }
            }
        }
        if let Some(t) = new
            && let Some(name) = t.metadata.name.as_deref()
        {
            for ns in namespaces(t) {
                self.owner.insert(ns, name.to_owned());
            }
        }
    }

    /// The tenant a namespace routes as: the Tenant that owns it, or — for a namespace no
    /// Tenant owns — a tenant of its own, named after it.
    pub fn tenant_of<'a>(&'a self, namespace: &'a str) -> &'a str {
        self.owner.get(namespace).map_or(namespace, String::as_str)
    }
}

/// The tolerations a tenant's pods get for nodes lent to their shard by other shards
/// (`tessera.io/borrowed=<lender>:NoSchedule`): every lender's when its Tenant says nothing
/// (or there is no Tenant), the lenders `spec.borrowFrom` lists otherwise (none if empty).
pub fn borrow_tolerations(t: Option<&Tenant>) -> Vec<serde_json::Value> {
    use tessera_client::types::BORROWED_TAINT_KEY;
    match t
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.borrow_from.as_ref())
    {
        None => vec![
            serde_json::json!({"key": BORROWED_TAINT_KEY, "operator": "Exists",
            "effect": "NoSchedule"}),
        ],
        Some(lenders) => lenders
            .iter()
            .map(|l| {
                serde_json::json!({"key": BORROWED_TAINT_KEY, "operator": "Equal", "value": l,
                    "effect": "NoSchedule"})
            })
            .collect(),
    }
}

/// Adds `tolerations` to the pod template of `kind` in `spec` (those it has already stay).
pub fn add_tolerations(
    kind: WorkloadKind,
    spec: &mut serde_json::Value,
    tolerations: &[serde_json::Value],
) {
    if tolerations.is_empty() {
        return;
    }
    let template = match kind {
        WorkloadKind::CronJob => &mut spec["jobTemplate"]["spec"]["template"],
        _ => &mut spec["template"],
    };
    let list = &mut template["spec"]["tolerations"];
    if !list.is_array() {
        *list = serde_json::json!([]);
    }
    let list = list.as_array_mut().expect("an array");
    for t in tolerations {
        if !list.contains(t) {
            list.push(t.clone());
        }
    }
}

/// Whether `p` selects the workload of `kind` with `meta`.
pub fn selects(p: &Placement, api_version: &str, kind: &str, meta: &ObjectMeta) -> bool {
    let Some(spec) = &p.spec else { return false };
    spec.resource_selectors.iter().any(|s| {
        if s.api_version.as_deref().is_some_and(|v| v != api_version) {
            return false;
        }
        if s.kind.as_deref().is_some_and(|k| k != kind) {
            return false;
        }
        if s.name
            .as_deref()
            .is_some_and(|n| Some(n) != meta.name.as_deref())
        {
            return false;
        }
        if let Some(sel) = &s.label_selector {
            let empty = BTreeMap::new();
            let labels = meta.labels.as_ref().unwrap_or(&empty);
            if let Some(ml) = &sel.match_labels
                && ml.iter().any(|(k, v)| labels.get(k) != Some(v))
            {
                return false;
            }
            for e in sel.match_expressions.iter().flatten() {
                let have = labels.get(&e.key);
                let values = e.values.as_deref().unwrap_or(&[]);
                let ok = match e.operator.as_str() {
                    "In" => have.is_some_and(|v| values.contains(v)),
                    "NotIn" => have.is_none_or(|v| !values.contains(v)),
                    "Exists" => have.is_some(),
                    "DoesNotExist" => have.is_none(),
                    _ => false,
                };
                if !ok {
                    return false;
                }
            }
        }
        true
    })
}

/// The Placement of `placements` (one namespace's) that selects the workload: the one
/// naming it, else the oldest that selects it, ties by name — so the choice is stable.
pub fn choose<'a>(
    placements: &'a [std::sync::Arc<Placement>],
    api_version: &str,
    kind: &str,
    meta: &ObjectMeta,
) -> Option<&'a Placement> {
    let mut matching: Vec<&Placement> = placements
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| selects(p, api_version, kind, meta))
        .collect();
    matching.sort_by(|a, b| {
        let by_name = |p: &Placement| {
            p.spec.as_ref().is_some_and(|s| {
                s.resource_selectors
                    .iter()
                    .any(|r| r.name.is_some() && r.name.as_deref() == meta.name.as_deref())
            })
        };
        by_name(b)
            .cmp(&by_name(a))
            .then(
                a.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0)),
            )
            .then(a.metadata.name.cmp(&b.metadata.name))
    });
    matching.into_iter().next()
}

/// A Placement as placement's [`Policy`] (none: the default, home with spill-over).
pub fn policy_of(p: Option<&Placement>) -> Policy {
    let Some(spec) = p.and_then(|p| p.spec.as_ref()) else {
        return Policy::default();
    };
    let affinity = spec.shard_affinity.clone().unwrap_or_default();
    let r = spec.replicas.clone().unwrap_or_default();
    let mode = match (r.scheduling.as_deref(), r.division.as_deref()) {
        (Some("Duplicated"), _) => Mode::Duplicated,
        (Some("Whole"), _) => Mode::Whole,
        (Some("Divided"), Some("Weighted")) => Mode::Weighted(
            r.weights
                .unwrap_or_default()
                .into_iter()
                .map(|w| (w.shard, w.weight.max(0) as u64))
                .collect(),
        ),
        (Some("Divided"), _) => Mode::ByCapacity,
        _ => Mode::Home,
    };
    Policy {
        shard_names: affinity.shard_names.unwrap_or_default(),
        shard_labels: affinity.match_labels.unwrap_or_default(),
        tolerations: spec
            .tolerations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|t| Toleration {
                key: t.key.unwrap_or_default(),
                operator: t.operator.unwrap_or_else(|| "Equal".into()),
                value: t.value.unwrap_or_default(),
                effect: t.effect.unwrap_or_default(),
            })
            .collect(),
        mode,
        spread: spec
            .spread_constraints
            .iter()
            .flatten()
            .map(|c| Spread {
                label: c.spread_by_label.clone(),
                min_groups: c.min_groups.unwrap_or(1).max(0) as u64,
                max_groups: c.max_groups.map(|m| m.max(0) as u64),
            })
            .collect(),
        failover: spec.failover.as_ref().map(|f| {
            (
                f.mode.as_deref().and_then(FailoverMode::parse),
                std::time::Duration::from_secs(f.delay_seconds.unwrap_or(0).max(0) as u64),
            )
        }),
    }
}

/// How a workload of `kind` under `policy` fails over: as its Placement says, or by its
/// kind — Jobs, CronJobs and StatefulSets at most once (a completion or an ordinal must not
/// run in two shards), everything else fast.
pub fn failover_of(policy: &Policy, kind: WorkloadKind) -> Failover {
    let by_kind = match kind {
        WorkloadKind::Job | WorkloadKind::CronJob | WorkloadKind::StatefulSet => {
            FailoverMode::AtMostOnce
        }
        _ => FailoverMode::Fast,
    };
    match policy.failover {
        Some((mode, delay)) => Failover {
            mode: mode.unwrap_or(by_kind),
            delay,
        },
        None => Failover {
            mode: by_kind,
            delay: std::time::Duration::ZERO,
        },
    }
}

/// `policy` as a workload of `kind` follows it: a kind that runs whole (a StatefulSet, a
/// Job, a CronJob) goes to the first shard on its list with room for all of it instead of
/// spilling a part over; dividing one is refused with what to change (`chosen` names the
/// Placement that asked for it).
pub fn for_kind(
    policy: Policy,
    kind: WorkloadKind,
    chosen: Option<&Placement>,
) -> Result<Policy, String> {
    if kind.divisible() {
        return Ok(policy);
    }
    match policy.mode {
        Mode::Home => Ok(Policy {
            mode: Mode::Whole,
            ..policy
        }),
        Mode::Whole | Mode::Duplicated => Ok(policy),
        Mode::Weighted(_) | Mode::ByCapacity => Err(format!(
            "Placement {:?} divides replicas over shards, but a {kind} runs whole in each shard it is placed in ({}): select it with a Placement whose scheduling is Home, Whole or Duplicated",
            chosen
                .and_then(|p| p.metadata.name.as_deref())
                .unwrap_or_default(),
            match kind {
                WorkloadKind::StatefulSet => "its pods' ordinals and volumes are identities",
                _ => "its completions count once",
            }
        )),
    }
}

/// Every mode's name, as [`mode_name`] gives it.
pub const MODE_NAMES: [&str; 5] = ["home", "duplicated", "weighted", "capacity", "whole"];

/// The name of a mode, for metrics and messages.
pub fn mode_name(m: &Mode) -> &'static str {
    match m {
        Mode::Home => "home",
        Mode::Duplicated => "duplicated",
        Mode::Weighted(_) => "weighted",
        Mode::ByCapacity => "capacity",
        Mode::Whole => "whole",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tessera_client::types::{
        PlacementSpec, ReplicaPlacement, ResourceSelector, ShardWeightEntry, TenantSpec,
    };

    use super::*;

    #[test]
    fn every_mode_name_is_listed() {
        let modes = [
            Mode::Home,
            Mode::Duplicated,
            Mode::Weighted(Default::default()),
            Mode::ByCapacity,
            Mode::Whole,
        ];
        let names: Vec<&str> = modes.iter().map(mode_name).collect();
        assert_eq!(names, MODE_NAMES);
    }

    fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn placement(name: &str, sel: ResourceSelector, r: ReplicaPlacement) -> Arc<Placement> {
        Arc::new(Placement {
            metadata: meta(name, &[]),
            spec: Some(PlacementSpec {
                resource_selectors: vec![sel],
                replicas: Some(r),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn pods_tolerate_the_lenders_their_tenant_allows_and_keep_their_own_tolerations() {
        let tenant = |borrow_from: Option<Vec<&str>>| Tenant {
            metadata: meta("t", &[]),
            spec: Some(TenantSpec {
                borrow_from: borrow_from.map(|v| v.into_iter().map(str::to_owned).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let keys = |ts: &[serde_json::Value]| -> Vec<String> {
            ts.iter()
                .map(|t| {
                    format!(
                        "{}={}",
                        t["operator"].as_str().unwrap_or(""),
                        t["value"].as_str().unwrap_or("*")
                    )
                })
                .collect()
        };
        assert_eq!(
            keys(&borrow_tolerations(None)),
            vec!["Exists=*"],
            "no Tenant: any lender"
        );
        assert_eq!(
            keys(&borrow_tolerations(Some(&tenant(None)))),
            vec!["Exists=*"]
        );
        assert_eq!(
            keys(&borrow_tolerations(Some(&tenant(Some(vec!["a", "c"]))))),
            vec!["Equal=a", "Equal=c"]
        );
        assert!(
            borrow_tolerations(Some(&tenant(Some(vec![])))).is_empty(),
            "[]: none"
        );
        // Added to the pod template (a CronJob's one level down), once, beside its own.
        let own = serde_json::json!({"key": "gpu", "operator": "Exists"});
        let add = borrow_tolerations(None);
        let mut spec = serde_json::json!({"template": {"spec": {"tolerations": [own]}}});
        add_tolerations(WorkloadKind::Deployment, &mut spec, &add);
        add_tolerations(WorkloadKind::Deployment, &mut spec, &add);
        assert_eq!(
            spec["template"]["spec"]["tolerations"],
            serde_json::json!([own, add[0]])
        );
        let mut cron = serde_json::json!({"jobTemplate": {"spec": {"template": {"spec": {}}}}});
        add_tolerations(WorkloadKind::CronJob, &mut cron, &add);
        assert_eq!(
            cron["jobTemplate"]["spec"]["template"]["spec"]["tolerations"],
            serde_json::json!([add[0]])
        );
    }

    #[test]
    fn a_namespace_routes_as_its_tenant_or_as_itself() {
        let t = Arc::new(Tenant {
            metadata: meta("acme", &[]),
            spec: Some(TenantSpec {
                namespaces: Some(vec!["a1".into(), "a2".into()]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut index = TenantIndex::default();
        index.update(None, Some(&t));
        assert_eq!(index.tenant_of("a2"), "acme");
        assert_eq!(index.tenant_of("lonely"), "lonely");
        // The tenant gives up a1, then goes.
        let mut fewer = (*t).clone();
        fewer.spec.as_mut().expect("spec").namespaces = Some(vec!["a2".into()]);
        index.update(Some(&t), Some(&fewer));
        assert_eq!(index.tenant_of("a1"), "a1");
        assert_eq!(index.tenant_of("a2"), "acme");
        index.update(Some(&fewer), None);
        assert_eq!(index.tenant_of("a2"), "a2");
    }

    #[test]
    fn the_placement_naming_a_workload_wins_over_a_label_match() {
        let by_label = placement(
            "a-labels",
            ResourceSelector {
                label_selector: Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                        match_labels: Some([("app".into(), "web".into())].into()),
                        ..Default::default()
                    },
                ),
                ..Default::default()
            },
            ReplicaPlacement {
                scheduling: Some("Duplicated".into()),
                ..Default::default()
            },
        );
        let by_name = placement(
            "z-name",
            ResourceSelector {
                kind: Some("Deployment".into()),
                name: Some("web".into()),
                ..Default::default()
            },
            ReplicaPlacement {
                scheduling: Some("Divided".into()),
                division: Some("Weighted".into()),
                weights: Some(vec![ShardWeightEntry {
                    shard: "s1".into(),
                    weight: 2,
                }]),
            },
        );
        let all = vec![by_label.clone(), by_name];
        let m = meta("web", &[("app", "web")]);
        let chosen = choose(&all, "apps/v1", "Deployment", &m).expect("one");
        assert_eq!(chosen.metadata.name.as_deref(), Some("z-name"));
        assert_eq!(
            policy_of(Some(chosen)).mode,
            Mode::Weighted([("s1".into(), 2)].into())
        );
        // Another Deployment with the label gets the label's placement; a StatefulSet of
        // the same name is not selected by the kind-specific one.
        let other = meta("api", &[("app", "web")]);
        let chosen = choose(&all, "apps/v1", "Deployment", &other).expect("one");
        assert_eq!(policy_of(Some(chosen)).mode, Mode::Duplicated);
        let sts = meta("web", &[]);
        assert!(choose(&all, "apps/v1", "StatefulSet", &sts).is_none());
        assert_eq!(policy_of(None).mode, Mode::Home);
    }

    #[test]
    fn kinds_that_run_whole_are_kept_whole_and_never_divided() {
        let home = policy_of(None);
        assert_eq!(
            for_kind(home.clone(), WorkloadKind::Deployment, None).map(|p| p.mode),
            Ok(Mode::Home)
        );
        for kind in [
            WorkloadKind::StatefulSet,
            WorkloadKind::Job,
            WorkloadKind::CronJob,
        ] {
            assert_eq!(
                for_kind(home.clone(), kind, None).map(|p| p.mode),
                Ok(Mode::Whole),
                "{kind} spills over as a whole"
            );
            let dup = Policy {
                mode: Mode::Duplicated,
                ..Default::default()
            };
            assert_eq!(
                for_kind(dup, kind, None).map(|p| p.mode),
                Ok(Mode::Duplicated)
            );
            let split = placement(
                "split",
                ResourceSelector::default(),
                ReplicaPlacement {
                    scheduling: Some("Divided".into()),
                    ..Default::default()
                },
            );
            let err = for_kind(policy_of(Some(&split)), kind, Some(&split)).expect_err("refused");
            assert!(
                err.contains("\"split\"") && err.contains(kind.kind()),
                "{err}"
            );
        }
    }
}
