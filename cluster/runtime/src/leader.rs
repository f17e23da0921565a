//! Active/standby through a `coordination.k8s.io/v1` Lease, as Kubernetes' components do.
//!
//! A candidate takes the Lease when it is free or when its holder has not renewed it for a
//! whole lease duration — measured on the candidate's own clock, from the moment it saw the
//! Lease's record last change, so clock skew between machines does not matter. Every write is
//! an update with the Lease's `resourceVersion` as precondition: of two candidates only one
//! wins. The leader renews every retry period; if it has not managed to renew for the renew
//! deadline (shorter than the lease duration) it stops its work *before* any standby may take
//! over — a deposed leader never writes alongside its successor.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tessera_client::catalog::Resource;
use tessera_client::client::Client;
use tessera_client::status::ApiError;
use tessera_core::time::rfc3339_micro_now;
use tokio::time::Instant;

use crate::metrics::RuntimeMetrics;

/// The Lease and timings of an election.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Namespace of the Lease (`kube-system`).
    pub namespace: String,
    /// Name of the Lease (`tessera-scheduler`).
    pub name: String,
    /// This candidate's identity (host and process).
    pub identity: String,
    /// How long a Lease stays held without renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Kubernetes' defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
    pub fn new(name: &str, identity: String) -> LeaderConfig {
        LeaderConfig {
            namespace: "kube-system".into(),
            name: name.into(),
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Why leading stopped.
#[derive(Debug, thiserror::Error)]
#[error("lost the leader lease {0}: it could not be renewed within the renew deadline")]
pub struct LostLease(pub String);

/// A candidate for one Lease.
pub struct LeaderElector {
    client: Arc<dyn Client>,
    config: LeaderConfig,
    metrics: Option<RuntimeMetrics>,
    /// The Lease record last seen (holder, renewTime, resourceVersion) and when it was seen.
    observed: Option<(String, Instant)>,
}

/// The identity of this process: host name and process id.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}_{}", std::process::id())
}

fn lease_resource() -> &'static Resource {
    tessera_client::catalog::RESOURCES
        .iter()
        .find(|r| r.plural == "leases")
        .expect("the catalog serves leases")
}

impl LeaderElector {
    /// A candidate.
    pub fn new(
        client: Arc<dyn Client>,
        config: LeaderConfig,
        metrics: Option<RuntimeMetrics>,
    ) -> Self {
        LeaderElector {
            client,
            config,
            metrics,
            observed: None,
        }
    }

    fn set_gauge(&self, v: i64) {
        if let Some(m) = &self.metrics {
            m.leader.with_label_values(&[&self.config.name]).set(v);
        }
    }

    /// One attempt to take or renew the Lease; `Ok(true)` if this candidate holds it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, ApiError> {
        let c = &self.config;
        let res = lease_resource();
        let now = rfc3339_micro_now();
        let duration_secs = c.lease_duration.as_secs().max(1) as i64;
        let current = match self.client.get(res, Some(&c.namespace), &c.name).await {
            Ok(v) => v,
            Err(e) if e.code == 404 => {
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": c.name, "namespace": c.namespace},
                    "spec": {"holderIdentity": c.identity, "leaseDurationSeconds": duration_secs,
                             "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
                });
                return match self.client.create(res, Some(&c.namespace), &lease).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.code == 409 => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let spec = &current["spec"];
        let holder = spec["holderIdentity"].as_str().unwrap_or_default();
        let record = format!(
            "{holder}|{}|{}",
            spec["renewTime"].as_str().unwrap_or_default(),
            current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
        );
        let seen_at = match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record, at));
                at
            }
        };
        let held_by_other = !holder.is_empty() && holder != c.identity;
        let their_duration = Duration::from_secs(
            spec["leaseDurationSeconds"]
                .as_u64()
                .unwrap_or(c.lease_duration.as_secs()),
        );
        if held_by_other && seen_at.elapsed() < their_duration {
            return Ok(false);
        }
        let mut next: Value = current.clone();
        next["spec"]["holderIdentity"] = json!(c.identity);
        next["spec"]["leaseDurationSeconds"] = json!(duration_secs);
        next["spec"]["renewTime"] = json!(now);
        if holder != c.identity {
            next["spec"]["acquireTime"] = json!(now);
            let t = spec["leaseTransitions"].as_i64().unwrap_or(0);
            next["spec"]["leaseTransitions"] = json!(t + 1);
        }
        match self.client.update(res, Some(&c.namespace), &next).await {
            Ok(v) => {
                let record = format!(
                    "{}|{}|{}",
                    c.identity,
                    now,
                    v["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                );
                self.observed = Some((record, Instant::now()));
                Ok(true)
            }
            Err(e) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&mut self) {
        loop {
            let attempt =
                tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(true)) => {
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "became the leader");
                    self.set_gauge(1);
                    return;
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.config.name, error = %e.message, "could not read or take the lease")
                }
                Err(_) => tracing::warn!(lease = %self.config.name, "lease request timed out"),
            }
            let jitter = rand::random::<f64>() * 0.2 + 1.0;
            tokio::time::sleep(self.config.retry_period.mul_f64(jitter)).await;
        }
    }

    /// Keeps renewing; returns when a renew deadline passes without a successful renewal.
    async fn renew_until_lost(&mut self) -> LostLease {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let left = self.config.renew_deadline.saturating_sub(last_ok.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_ok = Instant::now(),
                Ok(Ok(false)) => {
                    // Someone else holds it: we are deposed now.
                    break;
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.config.name, error = %e.message, "lease renewal failed")
                }
                Err(_) => {}
            }
            if last_ok.elapsed() >= self.config.renew_deadline {
                break;
            }
        }
        self.set_gauge(0);
        tracing::error!(lease = %self.config.name, "lost the leader lease; stopping");
        LostLease(self.config.name.clone())
    }

    /// Lets go of the Lease so a standby takes over at once (holder cleared).
    pub async fn release(&mut self) {
        let c = &self.config;
        let res = lease_resource();
        if let Ok(mut v) = self.client.get(res, Some(&c.namespace), &c.name).await
            && v["spec"]["holderIdentity"].as_str() == Some(&c.identity)
        {
            v["spec"]["holderIdentity"] = Value::Null;
            v["spec"]["leaseDurationSeconds"] = json!(1);
            let _ = self.client.update(res, Some(&c.namespace), &v).await;
        }
        self.set_gauge(0);
    }

    /// Waits for the Lease, then runs `work` while holding it. Returns `Ok` with the work's
    /// output if it finished (the Lease is released), or `Err` the moment the Lease is lost
    /// (the work is dropped, so it writes nothing more).
    pub async fn lead<F: Future>(mut self, work: F) -> Result<F::Output, LostLease> {
        self.acquire().await;
        let out = tokio::select! {
            out = work => Ok(out),
            lost = self.renew_until_lost() => Err(lost),
        };
        if out.is_ok() {
            self.release().await;
        }
        out
    }
}
