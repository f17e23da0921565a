//! The ClusterRole aggregation controller: a ClusterRole with an `aggregationRule` gets as its
//! `rules` every rule of the ClusterRoles its selectors match (in name order, each rule once),
//! so that `admin`, `edit` and `view` grow when an operator installs a ClusterRole labelled
//! `rbac.authorization.k8s.io/aggregate-to-view: "true"` for its custom resources, and shrink
//! when it is removed.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use serde_json::json;
use tessera_client::request::PatchType;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Cache, Change};
use tessera_runtime::selector::from_metav1;

use crate::context::{Context, res};

/// The controller's name.
pub const NAME: &str = "clusterrole-aggregation-controller";

struct Aggregator {
    ctx: Context,
    roles: Arc<Cache<ClusterRole>>,
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let informer = ctx.informer::<ClusterRole>(res(tessera_client::catalog::RBAC, "clusterroles"));
    let roles = informer.cache().clone();
    let cache = roles.clone();
    let r = Arc::new(Aggregator {
        ctx: ctx.clone(),
        roles,
    });
    ctx.controller(NAME)
        .watches_with(&informer, move |c, q| {
            // Any role may feed any aggregated one: queue every aggregated role (they are
            // few), and the changed one if it aggregates.
            if let Change::Added(r) | Change::Updated { new: r, .. } = c
                && r.aggregation_rule.is_some()
            {
                q.add(r.metadata.name.clone().unwrap_or_default(), c.class());
            }
            for role in cache.list() {
                if role.aggregation_rule.is_some() {
                    q.add(role.metadata.name.clone().unwrap_or_default(), c.class());
                }
            }
        })
        .run(r)
        .await;
}

/// The rules `name`'s selectors gather from `roles`, in name order, each once.
pub fn aggregate(name: &str, role: &ClusterRole, roles: &[Arc<ClusterRole>]) -> Vec<PolicyRule> {
    let selectors: Vec<_> = role
        .aggregation_rule
        .iter()
        .flat_map(|a| a.cluster_role_selectors.iter().flatten())
        .filter_map(|s| from_metav1(s).ok())
        .collect();
    let mut sources: Vec<&Arc<ClusterRole>> = roles
        .iter()
        .filter(|r| r.metadata.name.as_deref() != Some(name))
        .filter(|r| {
            let labels = r.metadata.labels.clone().unwrap_or_default();
            selectors.iter().any(|s| s.matches(&labels))
        })
        .collect();
    sources.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out: Vec<PolicyRule> = Vec::new();
    for r in sources {
        for rule in r.rules.iter().flatten() {
            if !out.contains(rule) {
                out.push(rule.clone());
            }
        }
    }
    out
}

#[async_trait]
impl Reconciler for Aggregator {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(role) = self.roles.get(key) else {
            return Ok(Action::Done);
        };
        if role.aggregation_rule.is_none() {
            return Ok(Action::Done);
        }
        let rules = aggregate(key, &role, &self.roles.list());
        if role.rules.as_deref().unwrap_or_default() == rules.as_slice() {
            return Ok(Action::Done);
        }
        let patch = json!({"metadata": {"resourceVersion": role.metadata.resource_version},
            "rules": rules});
        match self
            .ctx
            .client
            .patch(
                res(tessera_client::catalog::RBAC, "clusterroles"),
                None,
                key,
                None,
                PatchType::Merge,
                &patch,
            )
            .await
        {
            Ok(_) => Ok(Action::Done),
            // Changed meanwhile (the watch brings it back here) or gone.
            Err(e) if e.code == 409 || e.code == 404 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use std::collections::BTreeMap;

    fn role(name: &str, label: Option<&str>, verbs: &[&str]) -> Arc<ClusterRole> {
        Arc::new(ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: label.map(|l| BTreeMap::from([(l.to_owned(), "true".to_owned())])),
                ..ObjectMeta::default()
            },
            rules: Some(
                verbs
                    .iter()
                    .map(|v| PolicyRule {
                        api_groups: Some(vec![String::new()]),
                        resources: Some(vec!["pods".into()]),
                        verbs: vec![(*v).into()],
                        ..PolicyRule::default()
                    })
                    .collect(),
            ),
            aggregation_rule: None,
        })
    }

    #[test]
    fn rules_are_gathered_in_name_order_once_each() {
        let mut view = (*role("view", None, &[])).clone();
        view.aggregation_rule = Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some(BTreeMap::from([("to-view".into(), "true".into())])),
                match_expressions: None,
            }]),
        });
        let roles = vec![
            role("z-ext", Some("to-view"), &["watch", "get"]),
            role("a-core", Some("to-view"), &["get", "list"]),
            role("other", Some("elsewhere"), &["delete"]),
        ];
        let verbs: Vec<String> = aggregate("view", &view, &roles)
            .into_iter()
            .map(|r| r.verbs[0].clone())
            .collect();
        assert_eq!(verbs, ["get", "list", "watch"]);
    }
}
