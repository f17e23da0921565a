//! Lent nodes, from the node's side. When the federation lends one of this agent's nodes to
//! another shard, the lending shard's federation agent cordons and taints the node at home,
//! labels it with the loan (`tessera.io/loan`) and leaves a Secret,
//! `kube-system/tessera-loan.<node>`, with the borrower's address, its CA and a credential
//! good for this node and loan only. This watcher sees that and runs the node a second time,
//! registered with the borrower through that credential (labelled with the loan, tainted
//! `tessera.io/borrowed=<lender>:NoSchedule`); at home the node stays cordoned, its Lease
//! renewed. When the loan ends — the label goes, or the borrower refuses the credential —
//! the borrowed run stops.
//!
//! The borrower drains the node before it gives it back, so the borrowed run has no pods
//! left when it stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use parking_lot::Mutex;
use tessera_client::client::{Client, HttpClient};
use tessera_client::request::find_resource;
use tessera_client::types::{LOAN_LABEL, LentMark, loan_secret_name};
use tessera_core::LabelSelector;
use tessera_runtime::informer::{Informer, Scope};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::process::{ProcessAgent, ProcessConfig};
use crate::sim::{SimAgent, SimConfig};

/// How one of this agent's nodes runs when it is lent.
#[derive(Clone)]
pub enum Lendable {
    /// A hollow node of this shape.
    Sim(Box<SimConfig>),
    /// A process node with these settings.
    Process(Box<ProcessConfig>),
}

/// What the lending shard left for a lent node (its `tessera-loan.<node>` Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoanTicket {
    /// The borrower's API.
    pub server: String,
    /// The CA that signs the borrower's API certificate (PEM).
    pub ca_pem: String,
    /// The credential for this node and loan.
    pub token: String,
    /// The lending shard's name.
    pub lender: String,
    /// The loan's id.
    pub loan: String,
}

impl LoanTicket {
    /// The ticket in Secret `secret`, or what is missing from it.
    pub fn from_secret(secret: &serde_json::Value) -> Result<LoanTicket, String> {
        let field = |k: &str| -> Result<String, String> {
            if let Some(s) = secret["stringData"][k].as_str() {
                return Ok(s.to_owned());
            }
            let b64 = secret["data"][k]
                .as_str()
                .ok_or_else(|| format!("the loan Secret has no {k:?}"))?;
            use base64::Engine;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("the loan Secret's {k:?} is not base64: {e}"))?;
            String::from_utf8(raw).map_err(|_| format!("the loan Secret's {k:?} is not text"))
        };
        Ok(LoanTicket {
            server: field("server")?,
            ca_pem: field("ca.crt")?,
            token: field("token")?,
            lender: field("lender")?,
            loan: field("loan")?,
        })
    }
}

struct Running {
    loan: String,
    task: JoinHandle<()>,
}

/// Runs this agent's lent nodes with their borrowers.
pub struct Loans {
    home: Arc<dyn Client>,
    nodes: HashMap<String, Lendable>,
    running: Mutex<HashMap<String, Running>>,
}

impl Loans {
    /// A watcher over `nodes` (by name: how each runs), reading their loans from the home
    /// shard through `home`.
    pub fn new(home: Arc<dyn Client>, nodes: HashMap<String, Lendable>) -> Arc<Loans> {
        Arc::new(Loans {
            home,
            nodes,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// Watches the home shard's labelled nodes until dropped; a loan that could not start
    /// yet (its Secret not there) is tried again every second.
    pub async fn run(self: Arc<Self>) {
        if self.nodes.is_empty() {
            return std::future::pending().await;
        }
        let scope = Scope {
            label_selector: Some(
                LOAN_LABEL
                    .parse::<LabelSelector>()
                    .expect("a valid selector"),
            ),
            ..Default::default()
        };
        let informer = Informer::<Node>::new(
            self.home.clone(),
            find_resource("", "v1", "nodes").expect("served"),
            scope,
            None,
        );
        let (tx, mut rx) = mpsc::unbounded_channel::<()>();
        let _sub = informer.on_change(move |_| {
            let _ = tx.send(());
        });
        let watch = tokio::spawn(informer.clone().run());
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                r = rx.recv() => if r.is_none() { break },
                _ = tick.tick() => {}
            }
            while rx.try_recv().is_ok() {}
            let wanted: HashMap<String, String> = informer
                .cache()
                .list()
                .iter()
                .filter_map(|n| {
                    let name = n.metadata.name.clone()?;
                    let loan = n.metadata.labels.as_ref()?.get(LOAN_LABEL)?.clone();
                    self.nodes.contains_key(&name).then_some((name, loan))
                })
                .collect();
            self.reconcile(wanted).await;
        }
        watch.abort();
    }

    /// Starts the borrowed run of every node in `wanted` (name → loan) not running it yet,
    /// and stops every run no longer wanted (or wanted for another loan).
    async fn reconcile(&self, wanted: HashMap<String, String>) {
        {
            let mut running = self.running.lock();
            running.retain(|name, r| {
                let keep = wanted.get(name) == Some(&r.loan) && !r.task.is_finished();
                if !keep {
                    tracing::info!(node = %name, loan = %r.loan, "loan over: the node stops running with its borrower");
                    r.task.abort();
                }
                keep
            });
        }
        for (name, loan) in wanted {
            if self.running.lock().contains_key(&name) {
                continue;
            }
            match self.start(name.clone(), loan.clone()).await {
                Ok(task) => {
                    self.running.lock().insert(name, Running { loan, task });
                }
                Err(why) => {
                    tracing::debug!(node = %name, %loan, %why, "lent node not started yet");
                }
            }
        }
    }

    /// Registers node `name` with its borrower for `loan` and runs it there.
    async fn start(&self, name: String, loan: String) -> Result<JoinHandle<()>, String> {
        let how = self
            .nodes
            .get(&name)
            .ok_or_else(|| "not this agent's node".to_owned())?
            .clone();
        let secret = self
            .home
            .get(
                find_resource("", "v1", "secrets").expect("served"),
                Some("kube-system"),
                &loan_secret_name(&name),
            )
            .await
            .map_err(|e| e.message)?;
        let ticket = LoanTicket::from_secret(&secret)?;
        if ticket.loan != loan {
            return Err(format!(
                "the loan Secret is for loan {}, the node for {loan}",
                ticket.loan
            ));
        }
        let client: Arc<dyn Client> = tessera_runtime::client::Retrying::wrap(Arc::new(
            HttpClient::new(&ticket.server, &ticket.ca_pem, &ticket.token)
                .map_err(|e| e.message)?,
        ));
        let mark = LentMark {
            lender: ticket.lender.clone(),
            loan: ticket.loan.clone(),
        };
        tracing::info!(node = %name, %loan, borrower = %ticket.server, "lent: registering with the borrower");
        Ok(match how {
            Lendable::Sim(template) => {
                let agent = SimAgent::lent(client, &template, &name, mark);
                agent
                    .register(|| {})
                    .await
                    .map_err(|e| format!("registering with the borrower: {}", e.message))?;
                tokio::spawn(agent.run())
            }
            Lendable::Process(config) => {
                let agent = ProcessAgent::new(
                    client,
                    ProcessConfig {
                        lent: Some(mark),
                        ..*config
                    },
                );
                agent
                    .register()
                    .await
                    .map_err(|e| format!("registering with the borrower: {}", e.message))?;
                tokio::spawn(agent.run())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_ticket_is_read_from_the_secret_or_says_what_is_missing() {
        use base64::Engine;
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let secret = json!({"data": {"server": b("https://127.0.0.1:1"), "ca.crt": b("PEM"),
            "token": b("loan.n.l1.9.00"), "lender": b("a"), "loan": b("l1")}});
        assert_eq!(
            LoanTicket::from_secret(&secret),
            Ok(LoanTicket {
                server: "https://127.0.0.1:1".into(),
                ca_pem: "PEM".into(),
                token: "loan.n.l1.9.00".into(),
                lender: "a".into(),
                loan: "l1".into(),
            })
        );
        let mut partial = secret.clone();
        partial["data"]
            .as_object_mut()
            .expect("map")
            .remove("token");
        assert_eq!(
            LoanTicket::from_secret(&partial),
            Err("the loan Secret has no \"token\"".into())
        );
        partial["data"]["token"] = json!("%%%");
        assert!(
            LoanTicket::from_secret(&partial)
                .expect_err("not base64")
                .contains("not base64")
        );
    }
}
