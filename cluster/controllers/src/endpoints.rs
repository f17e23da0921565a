//! The Endpoints controller: each Service with a selector gets an Endpoints object of the
//! same name listing its pods' IPs — ready pods under `addresses`, the others under
//! `notReadyAddresses` — with the Service's ports resolved against the pods' named ports.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use tessera_core::LabelSelector;
use tessera_core::selector::label::{Operator, Requirement};
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::{Cache, Change, key_of};
use tessera_runtime::{EventClass, WorkQueue};

use crate::context::{Context, res};
use crate::pods;

/// The controller's name.
pub const NAME: &str = "endpoints-controller";

struct Endpoints {
    ctx: Context,
    services: Arc<Cache<Service>>,
    pods: Arc<Cache<Pod>>,
}

fn selector_of(s: &Service) -> Option<LabelSelector> {
    let sel = s.spec.as_ref()?.selector.as_ref()?;
    if sel.is_empty() {
        return None;
    }
    Some(LabelSelector::from_requirements(
        sel.iter()
            .map(|(k, v)| Requirement {
                key: k.clone(),
                operator: Operator::Equals,
                values: vec![v.clone()],
            })
            .collect(),
    ))
}

/// Runs the controller until dropped.
pub async fn run(ctx: Context) {
    let services = ctx.informer::<Service>(res("", "services"));
    let pod_inf = ctx.informer::<Pod>(res("", "pods"));
    let r = Arc::new(Endpoints {
        ctx: ctx.clone(),
        services: services.cache().clone(),
        pods: pod_inf.cache().clone(),
    });
    let svc = services.cache().clone();
    ctx.controller(NAME)
        .watches(&services)
        .watches_with(&pod_inf, move |c, q| {
            if let Change::Updated { old, .. } = c {
                queue_services(old, &svc, q);
            }
            queue_services(c.object(), &svc, q);
        })
        .run(r)
        .await;
}

fn queue_services(p: &Pod, services: &Cache<Service>, q: &WorkQueue<String>) {
    let Some(labels) = p.metadata.labels.as_ref() else {
        return;
    };
    let ns = p.metadata.namespace.as_deref().unwrap_or("");
    for s in services.in_namespace(ns) {
        if selector_of(&s).is_some_and(|sel| sel.matches(labels)) {
            q.add(key_of(&s.metadata), EventClass::Update);
        }
    }
}

#[async_trait]
impl Reconciler for Endpoints {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let eps = res("", "endpoints");
        let Some(svc) = self.services.get(key) else {
            // The Service is gone: so is its Endpoints object.
            return match self.ctx.client.delete(eps, Some(ns), name, None).await {
                Ok(_) => Ok(Action::Done),
                Err(e) if e.code == 404 => Ok(Action::Done),
                Err(e) => Err(e.into()),
            };
        };
        let Some(selector) = selector_of(&svc) else {
            return Ok(Action::Done);
        };
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        let mut ports: Vec<Value> = Vec::new();
        let mut chosen: Vec<&Arc<Pod>> = Vec::new();
        let selected = self.pods.select(Some(ns), &selector);
        for p in &selected {
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            if !pods::is_active(p) || ip.is_none() {
                continue;
            }
            chosen.push(p);
            let addr = json!({"ip": ip, "nodeName": p.spec.as_ref().and_then(|s| s.node_name.clone()),
                "targetRef": {"kind": "Pod", "namespace": ns, "name": p.metadata.name, "uid": p.metadata.uid}});
            if pods::is_ready(p) {
                ready.push(addr);
            } else {
                not_ready.push(addr);
            }
        }
        for sp in svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
        {
            let port = match &sp.target_port {
                None => sp.port,
                Some(IntOrString::Int(p)) => *p,
                Some(IntOrString::String(named)) => chosen
                    .iter()
                    .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|cp| cp.name.as_deref() == Some(named.as_str()))
                    .map_or(sp.port, |cp| cp.container_port),
            };
            let mut v = json!({"port": port, "protocol": sp.protocol.clone().unwrap_or_else(|| "TCP".into())});
            if let Some(n) = &sp.name {
                v["name"] = json!(n);
            }
            ports.push(v);
        }
        let key_ip = |a: &Value| a["ip"].as_str().unwrap_or("").to_owned();
        ready.sort_by_key(key_ip);
        not_ready.sort_by_key(key_ip);
        let subsets = if ready.is_empty() && not_ready.is_empty() {
            json!([])
        } else {
            let mut s = json!({"ports": ports});
            if !ready.is_empty() {
                s["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                s["notReadyAddresses"] = json!(not_ready);
            }
            json!([s])
        };
        let labels = svc.metadata.labels.clone().unwrap_or_default();
        match self.ctx.client.get(eps, Some(ns), name).await {
            Ok(mut current) => {
                if current["subsets"] == subsets
                    || (current["subsets"].is_null() && subsets == json!([]))
                {
                    return Ok(Action::Done);
                }
                current["subsets"] = subsets;
                current["metadata"]["labels"] = json!(labels);
                self.ctx.client.update(eps, Some(ns), &current).await?;
            }
            Err(e) if e.code == 404 => {
                let obj = json!({"apiVersion": "v1", "kind": "Endpoints",
                    "metadata": {"name": name, "namespace": ns, "labels": labels},
                    "subsets": subsets});
                match self.ctx.client.create(eps, Some(ns), &obj).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {
                        return Err(ReconcileError::raced(
                            "Endpoints appeared meanwhile; retrying",
                        ));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Action::Done)
    }
}
