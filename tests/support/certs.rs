//! Client certificates for the tests: keys and PKCS#10 requests, CertificateSigningRequest
//! manifests for the API server's own signer, and kubectl authenticating with a certificate.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use base64::Engine;

/// A key and a PKCS#10 request (PEM) for CN `cn` in organizations `orgs`.
pub fn request(cn: &str, orgs: &[&str]) -> (String, rcgen::KeyPair, rcgen::CertificateParams) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    for o in orgs {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *o);
    }
    let pem = params
        .serialize_request(&key)
        .expect("request")
        .pem()
        .expect("pem");
    (pem, key, params)
}

/// A client CertificateSigningRequest manifest for the API server's own signer.
pub fn client_csr(name: &str, request_pem: &str, usages: &str) -> String {
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\n\
         spec:\n  request: {}\n  signerName: kubernetes.io/kube-apiserver-client\n  usages: [{usages}]\n  expirationSeconds: 3600\n",
        base64::engine::general_purpose::STANDARD.encode(request_pem.as_bytes())
    )
}

/// The certificate (PEM) the signer issued for request `name`, once it has.
pub fn issued(c: &super::Cluster, name: &str) -> String {
    let cert = super::wait_for(Duration::from_secs(30), || {
        let cert = c.ok(&["get", "csr", name, "-o", "jsonpath={.status.certificate}"]);
        (!cert.trim().is_empty()).then_some(cert)
    })
    .expect("the signer issued a certificate");
    let der = base64::engine::general_purpose::STANDARD
        .decode(cert.trim())
        .expect("base64");
    String::from_utf8(der).expect("PEM")
}

/// kubectl against `server` (trusting `ca`) authenticating with a client certificate and
/// its key (files) alone: whether it succeeded, its output and its errors.
pub fn kubectl_with_cert(
    server: &str,
    ca: &Path,
    cert: &str,
    key: &str,
    args: &[&str],
) -> (bool, String, String) {
    let ca_flag = format!("--certificate-authority={}", ca.display());
    let out = Command::new("kubectl")
        .args([
            "--kubeconfig=/dev/null",
            "--server",
            server,
            &ca_flag,
            "--client-certificate",
            cert,
            "--client-key",
            key,
        ])
        .args(args)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
