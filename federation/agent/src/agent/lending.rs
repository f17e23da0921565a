//! The shard's side of elastic shards: what the federation's [`pb::Loan`] steps do here.
//!
//! - **Admit** (borrower): the loan goes into the shard's loan ledger, the ConfigMap
//!   `kube-system/tessera-loans` (node → loan), which is what makes the node's credential
//!   good here.
//! - **Lend** (lender): the node, idle, is tainted `tessera.io/lent=<borrower>:NoExecute`
//!   (pods that slipped on are evicted), labelled with the loan, and its ticket — the
//!   borrower's address, CA and the credential — left in `kube-system/tessera-loan.<node>`
//!   for the node's agent, which then registers the node with the borrower.
//! - **Return** (borrower): the node is tainted `tessera.io/returning:NoExecute`, its pods
//!   are deleted (their controllers make them again elsewhere), then the Node is removed and
//!   the loan struck from the ledger — the credential is dead from then on.
//! - **Reclaim** (lender): the label, annotation, taint and ticket go; the node is its
//!   shard's again, and its agent stops running it with the borrower.
//!
//! Every step is idempotent: the federation repeats it until the summaries show it done.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tessera_client::request::{PatchType, find_resource};
use tessera_client::status::ApiError;
use tessera_client::types::{
    LENT_FROM_LABEL, LENT_TAINT_KEY, LENT_TO_ANNOTATION, LOAN_LABEL, LOANS_CONFIGMAP,
    loan_secret_name,
};
use tessera_proto::federation::v1 as pb;
use tessera_runtime::events::{EventType, ObjectRef};

use super::State;

/// The taint a borrowed node carries while it is given back.
pub const RETURNING_TAINT_KEY: &str = "tessera.io/returning";

/// Longest a returning node waits for its pods to stop before it is removed anyway.
const RETURN_GRACE: Duration = Duration::from_secs(60);

/// The loans this shard takes part in, as its federation agent keeps them.
#[derive(Default)]
pub(super) struct Loans {
    /// Admitted here (borrower): node → (loan, lender).
    admitted: Mutex<BTreeMap<String, (String, String)>>,
    /// Nodes being given back now.
    returning: Mutex<HashSet<String>>,
}

fn res(group: &str, version: &str, plural: &str) -> &'static tessera_client::catalog::Resource {
    find_resource(group, version, plural).expect("served")
}

impl Loans {
    /// The loans admitted here: node → loan.
    pub(super) fn admitted(&self) -> BTreeMap<String, (String, String)> {
        self.admitted.lock().clone()
    }
}

/// Reads the loan ledger (after a restart of the agent).
pub(super) async fn load(state: &Arc<State>) {
    let (ns, name) = LOANS_CONFIGMAP;
    match state
        .client
        .get(res("", "v1", "configmaps"), Some(ns), name)
        .await
    {
        Ok(cm) => {
            let mut admitted = state.loans.admitted.lock();
            for (node, loan) in cm["data"].as_object().into_iter().flatten() {
                if let Some(loan) = loan.as_str() {
                    let lender = cm["metadata"]["annotations"][format!("lender.{loan}")]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    admitted.insert(node.clone(), (loan.to_owned(), lender));
                }
            }
        }
        Err(e) if e.code == 404 => {}
        Err(e) => tracing::warn!(error = %e.message, "reading the loan ledger"),
    }
}

/// Carries out one step.
pub(super) async fn handle(state: &Arc<State>, loan: pb::Loan) {
    let op = pb::loan::Op::try_from(loan.op).unwrap_or(pb::loan::Op::Admit);
    let result = match op {
        pb::loan::Op::Admit => admit(state, &loan).await,
        pb::loan::Op::Lend => lend(state, &loan).await,
        pb::loan::Op::Return => {
            give_back(state, &loan);
            Ok(())
        }
        pb::loan::Op::Reclaim => reclaim(state, &loan).await,
    };
    if let Err(e) = result {
        tracing::warn!(shard = %state.config.name, op = ?op, node = %loan.node, loan = %loan.loan, error = %e.message, "loan step failed; the federation repeats it");
    }
    state.changed.notify_one();
}

/// Writes `data[node] = loan` (or removes it, `None`) in the loan ledger.
async fn ledger_set(state: &State, node: &str, loan: Option<(&str, &str)>) -> Result<(), ApiError> {
    let (ns, name) = LOANS_CONFIGMAP;
    let cms = res("", "v1", "configmaps");
    let patch = match loan {
        Some((id, lender)) => json!({"metadata": {"annotations": {format!("lender.{id}"): lender}},
            "data": {node: id}}),
        None => {
            let old = state.loans.admitted.lock().get(node).cloned();
            let mut p = json!({"data": {node: null}});
            if let Some((id, _)) = old {
                p["metadata"] = json!({"annotations": {format!("lender.{id}"): null}});
            }
            p
        }
    };
    match state
        .client
        .patch(cms, Some(ns), name, None, PatchType::Merge, &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 && loan.is_some() => {
            let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns}});
            cm["data"] = patch["data"].clone();
            cm["metadata"]["annotations"] = patch["metadata"]["annotations"].clone();
            match state.client.create(cms, Some(ns), &cm).await {
                Err(e) if e.code == 409 => state
                    .client
                    .patch(cms, Some(ns), name, None, PatchType::Merge, &patch)
                    .await
                    .map(|_| ()),
                r => r.map(|_| ()),
            }
        }
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn admit(state: &Arc<State>, l: &pb::Loan) -> Result<(), ApiError> {
    if let Some(n) = state.nodes.get(&l.node) {
        let labels = n.metadata.labels.as_ref();
        if labels.and_then(|ls| ls.get(LENT_FROM_LABEL)).is_none() {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "node {} is one of this shard's own: a node lent here must have a name unique in the federation",
                    l.node
                ),
            ));
        }
        if labels.and_then(|ls| ls.get(LOAN_LABEL)) != Some(&l.loan) {
            // Left over from an earlier loan of the same node.
            delete_node(state, &l.node).await?;
        }
    }
    ledger_set(state, &l.node, Some((&l.loan, &l.peer))).await?;
    state
        .loans
        .admitted
        .lock()
        .insert(l.node.clone(), (l.loan.clone(), l.peer.clone()));
    Ok(())
}

/// Replaces node `name`'s taints with `f(taints)` (read, then written onto that version).
async fn retaint(
    state: &State,
    name: &str,
    meta: Value,
    f: impl Fn(&mut Vec<Value>),
) -> Result<(), ApiError> {
    let nodes = res("", "v1", "nodes");
    for _ in 0..5 {
        let now = state.client.get(nodes, None, name).await?;
        let mut taints = now["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        f(&mut taints);
        let mut patch = json!({"metadata": meta.clone(), "spec": {"taints": taints}});
        patch["metadata"]["resourceVersion"] = now["metadata"]["resourceVersion"].clone();
        match state
            .client
            .patch(nodes, None, name, None, PatchType::Merge, &patch)
            .await
        {
            Err(e) if e.code == 409 => continue,
            r => return r.map(|_| ()),
        }
    }
    Err(ApiError::new(
        409,
        "Conflict",
        format!("node {name} kept changing while its taints were written"),
    ))
}

async fn lend(state: &Arc<State>, l: &pb::Loan) -> Result<(), ApiError> {
    let Some(node) = state.nodes.get(&l.node) else {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("node {} is not here", l.node),
        ));
    };
    let labels = node.metadata.labels.as_ref();
    match labels.and_then(|ls| ls.get(LOAN_LABEL)) {
        Some(loan) if loan == &l.loan => {}
        Some(other) => {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("node {} is already lent for loan {other}", l.node),
            ));
        }
        None if labels.is_some_and(|ls| ls.contains_key(LENT_FROM_LABEL)) => {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "node {} is borrowed here: only its own shard lends it",
                    l.node
                ),
            ));
        }
        None if !idle(state, &node) => {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("node {} runs pods now: only an idle node is lent", l.node),
            ));
        }
        None => {}
    }
    // The ticket first: the node's agent acts on the label.
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": loan_secret_name(&l.node), "namespace": "kube-system",
            "labels": {LOAN_LABEL: l.loan}},
        "stringData": {"server": l.server, "ca.crt": l.ca_pem, "token": l.token,
            "lender": state.config.name, "loan": l.loan}});
    state
        .client
        .apply(
            res("", "v1", "secrets"),
            Some("kube-system"),
            &loan_secret_name(&l.node),
            "tessera-federation-agent",
            &secret,
        )
        .await?;
    let taint = json!({"key": LENT_TAINT_KEY, "value": l.peer, "effect": "NoExecute",
        "timeAdded": tessera_core::time::rfc3339(tessera_core::time::now_secs())});
    retaint(
        state,
        &l.node,
        json!({"labels": {LOAN_LABEL: l.loan}, "annotations": {LENT_TO_ANNOTATION: l.peer}}),
        |ts| {
            ts.retain(|t| t["key"] != LENT_TAINT_KEY);
            ts.push(taint.clone());
        },
    )
    .await?;
    state.recorder.event(
        &ObjectRef::new("v1", "Node", &node.metadata),
        EventType::Normal,
        "NodeLent",
        &format!("lent to shard {} (loan {})", l.peer, l.loan),
    );
    Ok(())
}

/// Whether `node` runs no active pod.
fn idle(state: &State, node: &Node) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    state.ledger.lock().idle(name)
}

async fn delete_node(state: &State, name: &str) -> Result<(), ApiError> {
    match state
        .client
        .delete(res("", "v1", "nodes"), None, name, None)
        .await
    {
        Err(e) if e.code != 404 => Err(e),
        _ => Ok(()),
    }
}

/// Gives node `l.node` back (in the background): drain, remove, strike the loan.
fn give_back(state: &Arc<State>, l: &pb::Loan) {
    if state.loans.admitted.lock().get(&l.node).map(|(id, _)| id) != Some(&l.loan) {
        return; // Given back already (or never admitted).
    }
    if !state.loans.returning.lock().insert(l.node.clone()) {
        return;
    }
    let (state, node, loan) = (state.clone(), l.node.clone(), l.loan.clone());
    tokio::spawn(async move {
        if let Err(e) = drain_and_remove(&state, &node, &loan).await {
            tracing::warn!(shard = %state.config.name, %node, %loan, error = %e.message, "giving a borrowed node back failed; the federation asks again");
        }
        state.loans.returning.lock().remove(&node);
        state.changed.notify_one();
    });
}

async fn drain_and_remove(state: &Arc<State>, node: &str, loan: &str) -> Result<(), ApiError> {
    if state.nodes.get(node).is_some() {
        let taint = json!({"key": RETURNING_TAINT_KEY, "effect": "NoExecute",
            "timeAdded": tessera_core::time::rfc3339(tessera_core::time::now_secs())});
        retaint(state, node, json!({}), |ts| {
            if !ts.iter().any(|t| t["key"] == RETURNING_TAINT_KEY) {
                ts.push(taint.clone());
            }
        })
        .await?;
        let pods = res("", "v1", "pods");
        let deadline = tokio::time::Instant::now() + RETURN_GRACE;
        let mut asked: HashSet<String> = HashSet::new();
        loop {
            let on: Vec<(String, String)> = state
                .pods
                .list()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
                .filter(|p| crate::summary::active(p))
                .map(|p| {
                    (
                        p.metadata.namespace.clone().unwrap_or_default(),
                        p.metadata.name.clone().unwrap_or_default(),
                    )
                })
                .collect();
            if on.is_empty() || tokio::time::Instant::now() >= deadline {
                break;
            }
            for (ns, name) in on {
                if asked.insert(format!("{ns}/{name}")) {
                    match state.client.delete(pods, Some(&ns), &name, None).await {
                        Err(e) if e.code != 404 => {
                            tracing::warn!(%node, pod = %name, error = %e.message, "deleting a pod of a returning node");
                        }
                        _ => {}
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        delete_node(state, node).await?;
    }
    ledger_set(state, node, None).await?;
    state.loans.admitted.lock().remove(node);
    tracing::info!(shard = %state.config.name, %node, %loan, "borrowed node given back");
    Ok(())
}

async fn reclaim(state: &Arc<State>, l: &pb::Loan) -> Result<(), ApiError> {
    if let Some(node) = state.nodes.get(&l.node)
        && node
            .metadata
            .labels
            .as_ref()
            .and_then(|ls| ls.get(LOAN_LABEL))
            == Some(&l.loan)
    {
        retaint(
            state,
            &l.node,
            json!({"labels": {LOAN_LABEL: null}, "annotations": {LENT_TO_ANNOTATION: null}}),
            |ts| ts.retain(|t| t["key"] != LENT_TAINT_KEY),
        )
        .await?;
        state.recorder.event(
            &ObjectRef::new("v1", "Node", &node.metadata),
            EventType::Normal,
            "NodeReclaimed",
            &format!("back from shard {} (loan {})", l.peer, l.loan),
        );
    }
    match state
        .client
        .delete(
            res("", "v1", "secrets"),
            Some("kube-system"),
            &loan_secret_name(&l.node),
            None,
        )
        .await
    {
        Err(e) if e.code != 404 => Err(e),
        _ => Ok(()),
    }
}

/// The summary's lending part: the ledger's view, and the loans admitted here (a loan
/// admitted whose node has not registered yet is reported not ready).
pub(super) fn to_pb(view: crate::summary::LendingView, loans: &Loans) -> pb::Lending {
    let admitted = loans.admitted();
    let registered: BTreeMap<&str, (&str, bool)> = view
        .borrowed
        .iter()
        .map(|(n, l, idle)| (n.as_str(), (l.as_str(), *idle)))
        .collect();
    let borrowed = admitted
        .iter()
        .map(|(node, (loan, lender))| {
            let reg = registered.get(node.as_str()).filter(|(l, _)| l == loan);
            pb::LoanState {
                node: node.clone(),
                peer: lender.clone(),
                loan: loan.clone(),
                ready: reg.is_some(),
                idle: reg.is_none_or(|(_, idle)| *idle),
            }
        })
        .collect();
    pb::Lending {
        unmet_pods: view.unmet_pods,
        unmet: view.unmet,
        unmet_process_pods: view.unmet_process_pods,
        unmet_process: view.unmet_process,
        own_cpu_milli: Some(view.own_cpu_milli),
        own_unmet_pods: view.own_unmet_pods,
        idle: view
            .idle
            .into_iter()
            .map(|(name, allocatable, process)| pb::IdleNode {
                name,
                allocatable,
                process,
            })
            .collect(),
        schedulable_nodes: view.schedulable_nodes,
        lent: view
            .lent
            .into_iter()
            .map(|(node, peer, loan)| pb::LoanState {
                node,
                peer,
                loan,
                ready: true,
                idle: true,
            })
            .collect(),
        borrowed,
    }
}
