//! Service addresses: a ClusterIP from the service range (10.96.0.0/12, Kubernetes' default)
//! for every non-headless Service, and a node port (30000-32767) for every port of a NodePort
//! or LoadBalancer Service. Each address is a key of its own (`/registry/ipallocations/...`),
//! taken with a create that fails if someone holds it, *before* the Service is written and
//! given back if that fails or when the Service is deleted — no address is ever handed out
//! twice. (The two writes are separate because a Service and the allocation keys can live on
//! different stores of a sharded layout; a crash between them can leave an address held by
//! nobody, which a repair loop of the next issue reclaims.)

use std::net::Ipv4Addr;

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Api, store_error};
use crate::status::{ApiError, Cause};

/// The service address range: 10.96.0.0/12.
const SERVICE_NET: u32 = u32::from_be_bytes([10, 96, 0, 0]);
const SERVICE_BITS: u32 = 12;
/// Node ports.
const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

fn ip_key(ip: Ipv4Addr) -> String {
    format!("/registry/ipallocations/serviceips/{ip}")
}

fn port_key(port: u16) -> String {
    format!("/registry/ipallocations/nodeports/{port}")
}

fn in_range(ip: Ipv4Addr) -> bool {
    let mask = u32::MAX << (32 - SERVICE_BITS);
    (u32::from(ip) & mask) == SERVICE_NET
}

/// What a Service holds.
#[derive(Debug, Default)]
pub(super) struct Held {
    keys: Vec<String>,
}

fn invalid(name: &str, field: &str, value: &Value, why: &str) -> ApiError {
    ApiError::invalid(
        "",
        "Service",
        name,
        vec![Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value}: {why}"),
        }],
    )
}

impl Api {
    /// Takes `key` for `owner`; false if someone holds it.
    async fn take(&self, key: &str, owner: &str) -> Result<bool, ApiError> {
        match self
            .store
            .create(Bytes::from(key.to_owned()), Bytes::from(owner.to_owned()))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.precondition().is_some() => Ok(false),
            Err(e) => Err(store_error(e)),
        }
    }

    /// Gives back what a Service held (failures are logged: a repair loop reclaims them).
    pub(super) async fn release(&self, held: Held) {
        for key in held.keys {
            if let Err(e) = self.store.delete(Bytes::from(key.clone()), None).await
                && e.precondition().is_none()
            {
                tracing::warn!(key = %key, error = %e, "could not release a service address");
            }
        }
    }

    /// The addresses a Service holds, from its spec (for release at delete).
    pub(super) fn held_by(svc: &Value) -> Held {
        let mut keys = Vec::new();
        if let Some(ip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|s| s.parse().ok())
        {
            keys.push(ip_key(ip));
        }
        for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(n) = p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok()) {
                keys.push(port_key(n));
            }
        }
        Held { keys }
    }

    /// Allocates a new Service's ClusterIP and node ports (or takes the ones it asks for),
    /// writing them into `svc`. On error nothing stays held.
    pub(super) async fn allocate(&self, svc: &mut Value, dry_run: bool) -> Result<Held, ApiError> {
        let name = svc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let owner = format!(
            "{}/{name}",
            svc["metadata"]["namespace"].as_str().unwrap_or_default()
        );
        let ty = svc["spec"]["type"]
            .as_str()
            .unwrap_or("ClusterIP")
            .to_owned();
        let mut held = Held::default();
        let result = async {
            if ty == "ExternalName" {
                return Ok(());
            }
            match svc["spec"]["clusterIP"].as_str() {
                Some("None") => {}
                Some(asked) if !asked.is_empty() => {
                    let ip: Ipv4Addr = asked.parse().map_err(|_| {
                        invalid(&name, "spec.clusterIP", &svc["spec"]["clusterIP"], "must be an IPv4 address, \"None\" or empty")
                    })?;
                    if !in_range(ip) {
                        return Err(invalid(&name, "spec.clusterIP", &svc["spec"]["clusterIP"], "provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/12"));
                    }
                    if !dry_run && !self.take(&ip_key(ip), &owner).await? {
                        return Err(invalid(&name, "spec.clusterIP", &svc["spec"]["clusterIP"], "provided IP is already allocated"));
                    }
                    held.keys.push(ip_key(ip));
                }
                _ => {
                    let mut chosen = None;
                    for _ in 0..64 {
                        let offset = rand::random_range(1..(1u32 << (32 - SERVICE_BITS)) - 1);
                        let ip = Ipv4Addr::from(SERVICE_NET + offset);
                        if dry_run || self.take(&ip_key(ip), &owner).await? {
                            chosen = Some(ip);
                            break;
                        }
                    }
                    let ip = chosen.ok_or_else(|| {
                        ApiError::new(503, "ServiceUnavailable", "no free ClusterIP found in 10.96.0.0/12; try again")
                    })?;
                    if !dry_run {
                        held.keys.push(ip_key(ip));
                    }
                    svc["spec"]["clusterIP"] = json!(ip.to_string());
                }
            }
            if let Some(ip) = svc["spec"]["clusterIP"].as_str() {
                let ip = ip.to_owned();
                svc["spec"]["clusterIPs"] = json!([ip]);
                svc["spec"]["ipFamilies"] = json!(["IPv4"]);
                svc["spec"]["ipFamilyPolicy"] = json!("SingleStack");
            }
            if ty == "NodePort" || ty == "LoadBalancer" {
                let ports = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
                let mut out = Vec::with_capacity(ports.len());
                for (i, mut p) in ports.into_iter().enumerate() {
                    let field = format!("spec.ports[{i}].nodePort");
                    match p["nodePort"].as_u64() {
                        Some(n) => {
                            let port = u16::try_from(n).ok().filter(|n| NODE_PORTS.contains(n)).ok_or_else(|| {
                                invalid(&name, &field, &p["nodePort"], "provided port is not in the valid range. The range of valid ports is 30000-32767")
                            })?;
                            if !dry_run && !self.take(&port_key(port), &owner).await? {
                                return Err(invalid(&name, &field, &p["nodePort"], "provided port is already allocated"));
                            }
                            held.keys.push(port_key(port));
                        }
                        None => {
                            let mut chosen = None;
                            for _ in 0..64 {
                                let port = rand::random_range(NODE_PORTS);
                                if dry_run || self.take(&port_key(port), &owner).await? {
                                    chosen = Some(port);
                                    break;
                                }
                            }
                            let port = chosen.ok_or_else(|| {
                                ApiError::new(503, "ServiceUnavailable", "no free node port found in 30000-32767; try again")
                            })?;
                            if !dry_run {
                                held.keys.push(port_key(port));
                            }
                            p["nodePort"] = json!(port);
                        }
                    }
                    out.push(p);
                }
                svc["spec"]["ports"] = Value::Array(out);
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(held),
            Err(e) => {
                self.release(held).await;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_range_is_10_96_slash_12() {
        assert!(in_range("10.96.0.1".parse().expect("ip")));
        assert!(in_range("10.111.255.254".parse().expect("ip")));
        assert!(!in_range("10.112.0.1".parse().expect("ip")));
        assert!(!in_range("192.168.0.1".parse().expect("ip")));
    }
}
