//! The CSR signing controller: an approved CertificateSigningRequest of the signer it runs
//! for (`kubernetes.io/kube-apiserver-client`), neither denied nor failed nor issued yet,
//! gets its certificate in `status.certificate`; one the signer will not sign (a usage it
//! does not issue, a reserved name, a request that does not verify) gets a `Failed`
//! condition saying why (`SignerValidationFailure`), as kube-controller-manager's signer
//! marks it. The signing itself is the [`CertificateSigner`] the controller is given (the
//! binary hands it the API server's CA); requests of other signers are left to theirs.

use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde_json::json;
use tessera_client::request::PatchType;
use tessera_runtime::controller::{Action, ReconcileError, Reconciler};
use tessera_runtime::informer::Cache;

use crate::context::{Context, res};

/// The controller's name.
pub const NAME: &str = "csrsigning-controller";

/// What signs: the certificate (PEM) for a request (PEM), or why it will not.
pub trait CertificateSigner: Send + Sync {
    /// The `signerName` whose requests it signs.
    fn signer_name(&self) -> &str;

    /// The certificate for `request_pem` with `usages` (Kubernetes' names), valid for
    /// `expiration_seconds` if asked (within the signer's bounds).
    fn sign(
        &self,
        request_pem: &str,
        usages: &[String],
        expiration_seconds: Option<u64>,
    ) -> Result<String, String>;
}

impl std::fmt::Debug for dyn CertificateSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateSigner")
            .field("signer_name", &self.signer_name())
            .finish_non_exhaustive()
    }
}

struct Signing {
    ctx: Context,
    signer: Arc<dyn CertificateSigner>,
    requests: Arc<Cache<CertificateSigningRequest>>,
}

fn csrs() -> &'static tessera_client::catalog::Resource {
    res(
        tessera_client::catalog::CERTIFICATES,
        "certificatesigningrequests",
    )
}

/// Runs the controller until dropped, signing with `signer`.
pub async fn run(ctx: Context, signer: Arc<dyn CertificateSigner>) {
    let informer = ctx.informer::<CertificateSigningRequest>(csrs());
    let r = Arc::new(Signing {
        ctx: ctx.clone(),
        signer,
        requests: informer.cache().clone(),
    });
    ctx.controller(NAME).watches(&informer).run(r).await;
}

/// Whether `csr` has a condition of `ty`.
fn has(csr: &CertificateSigningRequest, ty: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty))
}

#[async_trait]
impl Reconciler for Signing {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn reconcile(&self, key: &str) -> Result<Action, ReconcileError> {
        let Some(csr) = self.requests.get(key) else {
            return Ok(Action::Done);
        };
        let issued = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty());
        if csr.spec.signer_name != self.signer.signer_name()
            || !has(&csr, "Approved")
            || has(&csr, "Denied")
            || has(&csr, "Failed")
            || issued
        {
            return Ok(Action::Done);
        }
        let request = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
        let usages = csr.spec.usages.clone().unwrap_or_default();
        let expiration = csr
            .spec
            .expiration_seconds
            .and_then(|s| u64::try_from(s).ok());
        let status = match self.signer.sign(&request, &usages, expiration) {
            Ok(pem) => {
                tracing::info!(csr = key, signer = %csr.spec.signer_name, "issued a certificate");
                json!({"certificate": base64::engine::general_purpose::STANDARD.encode(pem)})
            }
            Err(why) => {
                tracing::warn!(csr = key, error = %why, "refused to sign a certificate request");
                let now = tessera_core::time::rfc3339(tessera_core::time::now_secs());
                let mut conditions: Vec<serde_json::Value> = csr
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .map(|cs| {
                        cs.iter()
                            .filter_map(|c| serde_json::to_value(c).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                conditions.push(json!({
                    "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": why, "lastUpdateTime": now, "lastTransitionTime": now,
                }));
                json!({"conditions": conditions})
            }
        };
        let patch = json!({"metadata": {"resourceVersion": csr.metadata.resource_version},
            "status": status});
        match self
            .ctx
            .client
            .patch(csrs(), None, key, Some("status"), PatchType::Merge, &patch)
            .await
        {
            Ok(_) => Ok(Action::Done),
            // Changed meanwhile (the watch brings it back here) or gone.
            Err(e) if e.code == 409 || e.code == 404 => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}
