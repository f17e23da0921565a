//! Client certificates: x509 authentication of API callers, and the signing of
//! `kubernetes.io/kube-apiserver-client` CertificateSigningRequests that issues them.
//!
//! The API server's TLS listener asks for a client certificate and verifies one that is
//! sent against the server's CA (a connection without one goes on, to authenticate with a
//! bearer token). A verified certificate names a user as Kubernetes reads one: the subject's
//! common name is the user name, its organizations the groups. It must be meant for client
//! authentication (the `clientAuth` extended key usage). Names the server keeps for its
//! own callers (`system:`, `tessera:`, `tenant:`) are refused in certificates as in user
//! tokens: a certificate never makes an admin, a component, a node or a tenant — what its
//! user may do is RBAC's to say.
//!
//! [`ClientSigner`] signs the requests an approver approved: the requested subject and
//! subject alternative names, the key usages asked for (`digital signature`, `key
//! encipherment`, `client auth`, the last required), never a CA, for `expirationSeconds`
//! (at most the signer's maximum, a year by default, and never past the CA itself),
//! backdated five minutes for clocks behind, as Kubernetes' signer issues them. It names at
//! most one group (organization) per certificate; a certificate the CA signed elsewhere may
//! name any number.

use std::time::Duration;

use rcgen::{
    CertificateSigningRequestParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer};
use x509_parser::prelude::FromDer;

use crate::auth::reserved_name_problem;

/// The signer whose requests [`ClientSigner`] signs.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

/// The group whose members may do anything in Kubernetes: no certificate names it here.
pub const MASTERS: &str = "system:masters";

/// The longest a signed certificate is valid by default (kube-controller-manager's
/// `--cluster-signing-duration`).
pub const DEFAULT_MAX_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How far back a certificate's validity starts (a client clock a little behind still
/// accepts it at once).
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// The caller a verified client certificate names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The subject's common name.
    pub name: String,
    /// The subject's organizations.
    pub groups: Vec<String>,
}

/// Why a subject may not be named in a client certificate, if it may not.
fn subject_problem(name: &str, groups: &[String]) -> Option<String> {
    if name.is_empty() {
        return Some("the subject has no common name (CN), which names the user".into());
    }
    if let Some(why) = reserved_name_problem(name) {
        return Some(format!("the user name (CN) {name:?} {why}"));
    }
    groups
        .iter()
        .find_map(|g| reserved_name_problem(g).map(|why| format!("the group (O) {g:?} {why}")))
}

/// The caller a client certificate (DER, already verified against the CA) names, or why
/// it names none.
pub fn identity_of(der: &[u8]) -> Result<ClientIdentity, String> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| format!("the client certificate cannot be read: {e}"))?;
    match cert.extended_key_usage() {
        Ok(Some(eku)) if eku.value.client_auth => {}
        _ => {
            return Err(
                "the client certificate is not for client authentication (no clientAuth extended key usage)"
                    .into(),
            );
        }
    }
    let (name, groups) = names_of(cert.subject());
    if let Some(why) = subject_problem(&name, &groups) {
        return Err(format!("the client certificate is not accepted: {why}"));
    }
    Ok(ClientIdentity { name, groups })
}

/// The subject (CN, organizations) of a PEM certificate request, if it can be read.
pub fn request_subject(pem: &str) -> Result<(String, Vec<String>), String> {
    let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("the request is not PEM: {e}"))?;
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
        .map_err(|e| format!("the request is not a PKCS#10 certificate request: {e}"))?;
    Ok(names_of(&csr.certification_request_info.subject))
}

/// The common name (the user) and the organizations (the groups) of a subject.
fn names_of(subject: &x509_parser::x509::X509Name<'_>) -> (String, Vec<String>) {
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    (name, groups)
}

/// Signs approved `kubernetes.io/kube-apiserver-client` requests with the API server's CA.
pub struct ClientSigner {
    issuer: Issuer<'static, KeyPair>,
    ca_not_after: time::OffsetDateTime,
    max: Duration,
}

impl std::fmt::Debug for ClientSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSigner")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl ClientSigner {
    /// A signer with the CA's certificate and key (PEM), issuing certificates valid for at
    /// most `max`.
    pub fn new(ca_pem: &str, ca_key_pem: &str, max: Duration) -> Result<ClientSigner, String> {
        let key = KeyPair::from_pem(ca_key_pem).map_err(|e| format!("the CA key: {e}"))?;
        let issuer = Issuer::from_ca_cert_pem(ca_pem, key)
            .map_err(|e| format!("the CA certificate: {e}"))?;
        let der = CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .map_err(|e| format!("the CA certificate: {e}"))?;
        let (_, ca) = x509_parser::certificate::X509Certificate::from_der(&der)
            .map_err(|e| format!("the CA certificate: {e}"))?;
        Ok(ClientSigner {
            issuer,
            ca_not_after: ca.validity().not_after.to_datetime(),
            max,
        })
    }

    /// The certificate (PEM) for a request (PEM) with these `usages` (Kubernetes' names)
    /// and `expiration_seconds`, or why it cannot be issued (the request's condition
    /// `Failed` says so).
    pub fn sign(
        &self,
        request_pem: &str,
        usages: &[String],
        expiration_seconds: Option<u64>,
    ) -> Result<String, String> {
        let mut key_usages = Vec::new();
        let mut client_auth = false;
        for u in usages {
            match u.as_str() {
                "digital signature" => key_usages.push(KeyUsagePurpose::DigitalSignature),
                "key encipherment" => key_usages.push(KeyUsagePurpose::KeyEncipherment),
                "client auth" => client_auth = true,
                other => {
                    return Err(format!(
                        "invalid usage for client certificate: {other} (allowed: \"digital signature\", \"key encipherment\", \"client auth\")"
                    ));
                }
            }
        }
        if !client_auth {
            return Err("missing required usage for client certificate: \"client auth\"".into());
        }
        let mut csr = CertificateSigningRequestParams::from_pem(request_pem)
            .map_err(|e| format!("the request cannot be used: {e}"))?;
        let (name, groups) = request_subject(request_pem)?;
        if let Some(why) = subject_problem(&name, &groups) {
            return Err(why);
        }
        if groups.len() > 1 {
            // The certificate library keeps one value per subject attribute.
            return Err(format!(
                "this signer issues certificates naming at most one group (O); the request names {}: ask for one group per certificate, or bind RBAC to the user",
                groups.len()
            ));
        }
        let now = time::OffsetDateTime::now_utc();
        let wanted = expiration_seconds.map_or(self.max, Duration::from_secs);
        let lifetime = time::Duration::try_from(wanted.min(self.max))
            .map_err(|e| format!("expirationSeconds: {e}"))?;
        let params = &mut csr.params;
        params.is_ca = IsCa::NoCa;
        params.key_usages = key_usages;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = now - time::Duration::try_from(BACKDATE).unwrap_or_default();
        params.not_after = (now + lifetime).min(self.ca_not_after);
        params.serial_number = Some(rand::random::<[u8; 16]>().to_vec().into());
        params.use_authority_key_identifier_extension = true;
        let cert = csr
            .signed_by(&self.issuer)
            .map_err(|e| format!("signing: {e}"))?;
        Ok(cert.pem())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType};

    fn ca() -> (String, String) {
        let creds = crate::pki::Credentials::generate().expect("credentials");
        (creds.ca_pem, creds.ca_key_pem.expect("a CA key"))
    }

    fn request(cn: &str, orgs: &[&str]) -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params
            .serialize_request(&key)
            .expect("request")
            .pem()
            .expect("pem")
    }

    fn der_of(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("pem")
            .to_vec()
    }

    #[test]
    fn a_signed_request_names_its_user_and_groups() {
        let (ca_pem, key_pem) = ca();
        let signer = ClientSigner::new(&ca_pem, &key_pem, DEFAULT_MAX_VALIDITY).expect("signer");
        let usages = ["digital signature".to_owned(), "client auth".to_owned()];
        let cert = signer
            .sign(&request("jane", &["devs"]), &usages, Some(3600))
            .expect("signed");
        let der = der_of(&cert);
        assert_eq!(
            identity_of(&der),
            Ok(ClientIdentity {
                name: "jane".into(),
                groups: vec!["devs".into()],
            })
        );
        let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(&der).expect("x509");
        let v = parsed.validity();
        let lifetime = v.not_after.timestamp() - v.not_before.timestamp();
        assert_eq!(lifetime, 3600 + 300, "an hour, backdated five minutes");
        assert!(!parsed.is_ca());
        // The certificate chains to the CA.
        let ca_der = der_of(&ca_pem);
        let (_, ca) = x509_parser::certificate::X509Certificate::from_der(&ca_der).expect("ca");
        assert!(parsed.verify_signature(Some(ca.public_key())).is_ok());
    }

    #[test]
    fn what_a_client_certificate_may_not_be() {
        let (ca_pem, key_pem) = ca();
        let signer =
            ClientSigner::new(&ca_pem, &key_pem, Duration::from_secs(7200)).expect("signer");
        let client = ["client auth".to_owned()];
        for (req, usages, why) in [
            (
                request("jane", &[]),
                &["server auth".to_owned()][..],
                "invalid usage",
            ),
            (
                request("jane", &[]),
                &["digital signature".to_owned()][..],
                "\"client auth\"",
            ),
            (request("", &["devs"]), &client[..], "no common name"),
            (request("root", &[MASTERS]), &client[..], "system:masters"),
            (request("tenant:acme", &[]), &client[..], "reserves"),
            (
                "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
                    .to_owned(),
                &client[..],
                "cannot be used",
            ),
        ] {
            match signer.sign(&req, usages, None) {
                Err(e) => assert!(e.contains(why), "{e} lacks {why}"),
                Ok(_) => panic!("signed: {why}"),
            }
        }
        // The signer's maximum bounds a longer request.
        let cert = signer
            .sign(&request("jane", &[]), &client, Some(86_400))
            .expect("signed");
        let der = der_of(&cert);
        let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(&der).expect("x509");
        let v = parsed.validity();
        assert_eq!(
            v.not_after.timestamp() - v.not_before.timestamp(),
            7200 + 300
        );
        // Several groups are not signed (one per certificate)...
        let mut two = CertificateParams::default();
        two.distinguished_name.push(DnType::CommonName, "jane");
        two.distinguished_name
            .push(DnType::OrganizationName, "devs");
        // (a second O, under the attribute's OID: the library keeps one per type)
        two.distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 10]), "ops");
        let key = KeyPair::generate().expect("key");
        let req = two
            .serialize_request(&key)
            .expect("request")
            .pem()
            .expect("pem");
        let err = signer.sign(&req, &client, None).expect_err("two groups");
        assert!(err.contains("at most one group"), "{err}");
        // ...but a certificate the CA signed elsewhere may name them all.
        two.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, KeyPair::from_pem(&key_pem).expect("key"))
            .expect("issuer");
        let cert = two.signed_by(&key, &issuer).expect("signed");
        assert_eq!(
            identity_of(cert.der()).map(|i| i.groups),
            Ok(vec!["devs".to_owned(), "ops".to_owned()])
        );
        // A certificate without clientAuth (the API server's serving one) names nobody.
        let creds = crate::pki::Credentials::generate().expect("credentials");
        let err = identity_of(&der_of(&creds.cert_pem)).expect_err("a serving certificate");
        assert!(err.contains("clientAuth"), "{err}");
    }
}
