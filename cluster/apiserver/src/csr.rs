//! CertificateSigningRequests (`certificates.k8s.io/v1`, `kubectl get csr`): a request for a
//! certificate, approved or denied through the `approval` subresource (`kubectl certificate
//! approve|deny`) and issued by a signer through the `status` subresource, as Kubernetes
//! does. The server records who asked (`spec.username`, `groups`, `uid` come from the
//! requester's credentials, never from the body), checks the request and every transition,
//! and lets only a user RBAC grants `approve` on the signer (`signers` in
//! `certificates.k8s.io`, named by `signerName` or `<domain>/*`) approve or deny.
//!
//! Requests of `kubernetes.io/kube-apiserver-client` are signed by the controller manager's
//! signer with the API server's CA ([`crate::client_certs::ClientSigner`]), giving client
//! certificates the API server authenticates; as Kubernetes' CertificateSubjectRestriction
//! admission does, none may ask for the `system:masters` group. Other signers are an
//! operator's (cert-manager's, a service mesh's): they watch approved requests and write
//! `status.certificate`.

use base64::Engine;
use serde_json::{Value, json};

use crate::auth::User;
use crate::catalog::Resource;
use crate::status::{ApiError, Cause};

/// The API group.
pub const GROUP: &str = crate::catalog::CERTIFICATES;

/// The key usages a request may ask for (Kubernetes' `KeyUsage` values).
const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// The condition types Kubernetes defines; each may appear once, with status `True`.
const BUILT_IN: &[&str] = &["Approved", "Denied", "Failed"];

/// Whether `res` is the CertificateSigningRequest kind.
pub fn is_csr(res: &Resource) -> bool {
    res.group == GROUP && res.kind == "CertificateSigningRequest"
}

/// What the server sets on a new request: who asked (from `user`'s credentials, whatever
/// the body said) and no status.
pub fn requested_by(obj: &mut Value, user: &User) {
    let spec = &mut obj["spec"];
    spec["username"] = json!(user.name());
    spec["groups"] = json!(user.groups());
    if let Some(s) = spec.as_object_mut() {
        s.remove("uid");
        s.remove("extra");
    }
    if let Some(o) = obj.as_object_mut() {
        o.remove("status");
    }
}

/// The object an update of `sub` makes from `current` and the `proposed` one: the main
/// resource changes metadata only (the spec is immutable, the status is the
/// subresources'); `approval` changes the Approved and Denied conditions alone; `status`
/// changes the rest of the status and keeps those two as they were.
pub fn merge(sub: Option<&str>, current: &Value, mut proposed: Value) -> Value {
    let approval = |c: &Value| matches!(c["type"].as_str(), Some("Approved" | "Denied"));
    let conditions = |v: &Value| {
        v["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let mut next = current.clone();
    match sub {
        Some("approval") => {
            let mut kept: Vec<Value> = conditions(current)
                .into_iter()
                .filter(|c| !approval(c))
                .collect();
            kept.extend(conditions(&proposed).into_iter().filter(approval));
            next["status"]["conditions"] = Value::Array(kept);
        }
        Some("status") => {
            let mut status = proposed["status"].take();
            let mut kept: Vec<Value> = conditions(current).into_iter().filter(approval).collect();
            if let Some(Value::Array(asked)) = status.get_mut("conditions").map(Value::take) {
                kept.extend(asked.into_iter().filter(|c| !approval(c)));
            }
            if status.is_object() || !kept.is_empty() {
                status["conditions"] = Value::Array(kept);
            }
            next["status"] = status;
        }
        _ => next["metadata"] = proposed["metadata"].take(),
    }
    if let Some(s) = next["status"].as_object_mut()
        && s.get("conditions")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
    {
        s.remove("conditions");
    }
    next
}

fn invalid(field: &str, value: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.into(),
        message: format!("Invalid value: {value:?}: {why}"),
    }
}

fn required(field: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.into(),
        message: format!("Required value: {why}"),
    }
}

fn forbidden(field: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        field: field.into(),
        message: format!("Forbidden: {why}"),
    }
}

/// The DER bodies of the PEM blocks labelled `label` in `pem`; an error names what is wrong.
fn pem_blocks(pem: &str, label: &str) -> Result<Vec<Vec<u8>>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(at) = rest.find(&begin) {
        let after = &rest[at + begin.len()..];
        let Some(stop) = after.find(&end) else {
            return Err(format!("the {label} PEM block has no END line"));
        };
        let body: String = after[..stop].split_whitespace().collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.as_bytes())
            .map_err(|e| format!("the {label} PEM block is not base64: {e}"))?;
        // A DER SEQUENCE, as certificates and requests are.
        if der.first() != Some(&0x30) || der.len() < 16 {
            return Err(format!(
                "the {label} PEM block does not hold a DER structure"
            ));
        }
        out.push(der);
        rest = &after[stop + end.len()..];
    }
    Ok(out)
}

/// A `signerName` as Kubernetes accepts it: `<fully qualified domain>/<path>`.
fn signer_problem(name: &str) -> Option<&'static str> {
    let Some((domain, path)) = name.split_once('/') else {
        return Some(
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        );
    };
    if !domain.contains('.')
        || domain.len() > 253
        || !domain.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
    {
        return Some(
            "the domain part must be a fully qualified, lower-case DNS name (example.com)",
        );
    }
    if path.is_empty() || path.contains('/') || path.len() > 510 || path.contains('*') {
        return Some("the path part must be one non-empty segment without '*' (signer-name)");
    }
    None
}

/// Checks a request (`current`: the stored one, on an update) as Kubernetes does.
pub fn validate(obj: &Value, current: Option<&Value>, out: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    match spec["request"].as_str() {
        None | Some("") => out.push(required(
            "spec.request",
            "a PEM-encoded PKCS#10 certificate request (base64 of its text)",
        )),
        Some(b64) => {
            let text = base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            match text.map(|t| pem_blocks(&t, "CERTIFICATE REQUEST")) {
                Some(Ok(blocks)) if blocks.len() == 1 => {}
                Some(Ok(blocks)) => out.push(invalid(
                    "spec.request",
                    "<request>",
                    &format!(
                        "must hold exactly one CERTIFICATE REQUEST PEM block, not {}",
                        blocks.len()
                    ),
                )),
                Some(Err(why)) => out.push(invalid("spec.request", "<request>", &why)),
                None => out.push(invalid(
                    "spec.request",
                    "<request>",
                    "must be PEM text (base64-encoded in JSON)",
                )),
            }
        }
    }
    match spec["signerName"].as_str() {
        None | Some("") => out.push(required(
            "spec.signerName",
            "the signer to issue the certificate (example.com/signer-name)",
        )),
        Some(name) => {
            if let Some(why) = signer_problem(name) {
                out.push(invalid("spec.signerName", name, why));
            }
        }
    }
    match spec["usages"].as_array() {
        None => out.push(required("spec.usages", "usages must be provided")),
        Some(us) if us.is_empty() => out.push(required("spec.usages", "usages must be provided")),
        Some(us) => {
            for (i, u) in us.iter().enumerate() {
                let s = u.as_str().unwrap_or_default();
                if !USAGES.contains(&s) {
                    out.push(Cause {
                        reason: "FieldValueNotSupported",
                        field: format!("spec.usages[{i}]"),
                        message: format!(
                            "Unsupported value: {s:?}: supported values: {}",
                            USAGES
                                .iter()
                                .map(|u| format!("\"{u}\""))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            }
        }
    }
    if let Some(secs) = spec["expirationSeconds"].as_i64()
        && secs < 600
    {
        out.push(invalid(
            "spec.expirationSeconds",
            &secs.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    let conditions = obj["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, c) in conditions.iter().enumerate() {
        let ty = c["type"].as_str().unwrap_or_default();
        let at = format!("status.conditions[{i}]");
        if ty.is_empty() {
            out.push(required(&format!("{at}.type"), "a condition needs a type"));
        }
        if BUILT_IN.contains(&ty) {
            if c["status"] != "True" {
                out.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: format!("{at}.status"),
                    message: format!(
                        "Unsupported value: {}: supported values: \"True\"",
                        c["status"]
                    ),
                });
            }
            if conditions[..i].iter().any(|o| o["type"] == ty) {
                out.push(Cause {
                    reason: "FieldValueDuplicate",
                    field: format!("{at}.type"),
                    message: format!("Duplicate value: {ty:?}"),
                });
            }
        }
    }
    let has = |v: &Value, ty: &str| {
        v["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty))
    };
    if has(obj, "Approved") && has(obj, "Denied") {
        out.push(invalid(
            "status.conditions",
            "Approved, Denied",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    let certificate = obj["status"]["certificate"].as_str().unwrap_or_default();
    if !certificate.is_empty() {
        let text = base64::engine::general_purpose::STANDARD
            .decode(certificate.as_bytes())
            .ok()
            .and_then(|b| String::from_utf8(b).ok());
        match text.map(|t| pem_blocks(&t, "CERTIFICATE")) {
            Some(Ok(b)) if !b.is_empty() => {}
            Some(Ok(_)) => out.push(invalid(
                "status.certificate",
                "<certificate data>",
                "must contain at least one CERTIFICATE PEM block",
            )),
            Some(Err(why)) => out.push(invalid("status.certificate", "<certificate data>", &why)),
            None => out.push(invalid(
                "status.certificate",
                "<certificate data>",
                "must be PEM text",
            )),
        }
        if !has(obj, "Approved") || has(obj, "Denied") || has(obj, "Failed") {
            out.push(forbidden(
                "status.certificate",
                "a certificate may be set only on an Approved request that is not Failed",
            ));
        }
    }
    let Some(current) = current else {
        return;
    };
    if spec != &current["spec"] {
        out.push(forbidden(
            "spec",
            "field is immutable: a request cannot change once made (create a new one)",
        ));
    }
    for ty in ["Approved", "Denied"] {
        if has(current, ty) && !has(obj, ty) {
            out.push(forbidden(
                "status.conditions",
                &format!("updates may not remove the {ty} condition"),
            ));
        }
    }
    let before = current["status"]["certificate"]
        .as_str()
        .unwrap_or_default();
    if !before.is_empty() && before != certificate {
        out.push(forbidden(
            "status.certificate",
            "updates may not modify a certificate once set",
        ));
    }
}

/// Whether approving (or denying) changes anything: an Approved or Denied condition the
/// stored request did not have.
pub fn decides(current: &Value, next: &Value) -> bool {
    let of = |v: &Value| -> Vec<String> {
        v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["type"].as_str())
            .filter(|t| matches!(*t, "Approved" | "Denied"))
            .map(str::to_owned)
            .collect()
    };
    of(current) != of(next)
}

/// Kubernetes' CertificateSubjectRestriction: a new `kubernetes.io/kube-apiserver-client`
/// request may not ask for the `system:masters` group (a certificate of it would be
/// everything's master). A request that cannot be read is left to validation.
pub fn restrict_subject(obj: &Value) -> Result<(), ApiError> {
    if obj["spec"]["signerName"] != crate::client_certs::CLIENT_SIGNER {
        return Ok(());
    }
    let Some(pem) = obj["spec"]["request"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
    else {
        return Ok(());
    };
    match crate::client_certs::request_subject(&pem) {
        Ok((_, groups)) if groups.iter().any(|g| g == crate::client_certs::MASTERS) => {
            Err(ApiError::forbidden(format!(
                "certificatesigningrequests.{GROUP} {:?} is forbidden: use of {} signer with {} group is not allowed",
                obj["metadata"]["name"].as_str().unwrap_or_default(),
                crate::client_certs::CLIENT_SIGNER,
                crate::client_certs::MASTERS,
            )))
        }
        _ => Ok(()),
    }
}

/// The refusal of a user who may not approve requests of `signer`.
pub fn may_not_approve(name: &str, user: &User, signer: &str) -> ApiError {
    ApiError::forbidden(format!(
        "certificatesigningrequests.{GROUP} {name:?} is forbidden: user {:?} is not permitted to approve requests with signerName {signer:?} (RBAC must grant it the verb \"approve\" on resource \"signers\" in group {GROUP:?}, named {signer:?} or {:?})",
        user.name(),
        signer_wildcard(signer)
    ))
}

/// `<domain>/*`: the name that grants approval for every signer of a domain.
pub fn signer_wildcard(signer: &str) -> String {
    format!("{}/*", signer.split('/').next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM_REQUEST: &str = "-----BEGIN CERTIFICATE REQUEST-----\nMIIBVjCB/QIBADAbMRkwFwYDVQQDDBBteS11c2VyLmV4YW1wbGUwWTATBgcqhkjOPQIBBggqhkjO\n-----END CERTIFICATE REQUEST-----\n";

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn request() -> Value {
        json!({"metadata": {"name": "alice"}, "spec": {"request": b64(PEM_REQUEST),
            "signerName": "example.com/users", "usages": ["client auth", "digital signature"]}})
    }

    fn fields(obj: &Value, current: Option<&Value>) -> Vec<String> {
        let mut out = Vec::new();
        validate(obj, current, &mut out);
        out.into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn a_request_is_checked_as_kubernetes_checks_it() {
        assert!(
            fields(&request(), None).is_empty(),
            "{:?}",
            fields(&request(), None)
        );
        for (change, want) in [
            (
                json!({"request": b64("not pem")}),
                "spec.request: Invalid value",
            ),
            (json!({"request": "***"}), "must be PEM text"),
            (json!({"request": null}), "spec.request: Required value"),
            (
                json!({"signerName": "users"}),
                "fully qualified domain and path",
            ),
            (
                json!({"signerName": "Example.com/users"}),
                "lower-case DNS name",
            ),
            (
                json!({"signerName": "example.com/a/b"}),
                "one non-empty segment",
            ),
            (json!({"usages": []}), "spec.usages: Required value"),
            (
                json!({"usages": ["client auth", "mind control"]}),
                "spec.usages[1]: Unsupported value",
            ),
            (json!({"expirationSeconds": 60}), "less than 600 seconds"),
        ] {
            let mut r = request();
            for (k, v) in change.as_object().expect("object") {
                r["spec"][k] = v.clone();
            }
            let got = fields(&r, None);
            assert!(got.iter().any(|f| f.contains(want)), "{change}: {got:?}");
        }
    }

    #[test]
    fn approval_and_issuance_follow_the_rules() {
        let stored = request();
        // Approval touches only the Approved/Denied conditions.
        let mut asked = stored.clone();
        asked["status"] = json!({"conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove"}],
            "certificate": b64("x")});
        asked["spec"]["signerName"] = json!("evil.example.com/x");
        let approved = merge(Some("approval"), &stored, asked);
        assert_eq!(approved["spec"], stored["spec"]);
        assert!(approved["status"]["certificate"].is_null());
        assert!(decides(&stored, &approved));
        assert!(fields(&approved, Some(&stored)).is_empty());
        // The status subresource cannot add or drop them; a certificate needs approval.
        let mut issued = approved.clone();
        issued["status"]["conditions"] = json!([]);
        issued["status"]["certificate"] = json!(b64(
            "-----BEGIN CERTIFICATE-----\nMIIBVjCB/QIBADAbMRkwFwYDVQQDDBBteS11c2VyLmV4YW1wbGUw\n-----END CERTIFICATE-----\n"
        ));
        let issued = merge(Some("status"), &approved, issued);
        assert_eq!(issued["status"]["conditions"][0]["type"], "Approved");
        assert!(
            fields(&issued, Some(&approved)).is_empty(),
            "{:?}",
            fields(&issued, Some(&approved))
        );
        let mut early = stored.clone();
        early["status"]["certificate"] = issued["status"]["certificate"].clone();
        let early = merge(Some("status"), &stored, early);
        assert!(
            fields(&early, Some(&stored))
                .iter()
                .any(|f| f.contains("only on an Approved request"))
        );
        // Approved and Denied exclude each other; neither can be taken back.
        let mut both = approved.clone();
        both["status"]["conditions"] =
            json!([{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]);
        let both = merge(Some("approval"), &approved, both);
        assert!(
            fields(&both, Some(&approved))
                .iter()
                .any(|f| f.contains("mutually exclusive"))
        );
        let mut undone = approved.clone();
        undone["status"]["conditions"] = json!([]);
        let undone = merge(Some("approval"), &approved, undone);
        assert!(
            fields(&undone, Some(&approved))
                .iter()
                .any(|f| f.contains("may not remove the Approved"))
        );
        // A certificate once set stays; the main resource changes no spec.
        let mut swapped = issued.clone();
        swapped["status"]["certificate"] = json!(b64(
            "-----BEGIN CERTIFICATE-----\nMIIBVjCB/QIBADAbMRkwFwYDVQQDDBBteS11c2VyLmV4YW1wbGUx\n-----END CERTIFICATE-----\n"
        ));
        let swapped = merge(Some("status"), &issued, swapped);
        assert!(
            fields(&swapped, Some(&issued))
                .iter()
                .any(|f| f.contains("may not modify a certificate"))
        );
        let mut relabelled = issued.clone();
        relabelled["metadata"]["labels"] = json!({"team": "a"});
        relabelled["spec"]["usages"] = json!(["any"]);
        let relabelled = merge(None, &issued, relabelled);
        assert_eq!(relabelled["metadata"]["labels"]["team"], "a");
        assert_eq!(relabelled["spec"], issued["spec"]);
    }

    #[test]
    fn the_requester_comes_from_the_credentials() {
        let mut r = request();
        r["spec"]["username"] = json!("admin");
        r["spec"]["groups"] = json!(["system:masters"]);
        r["spec"]["uid"] = json!("forged");
        r["status"] = json!({"certificate": "x"});
        let bob = User::Named {
            name: "bob".into(),
            groups: vec!["dev".into()],
            tenant: None,
        };
        requested_by(&mut r, &bob);
        assert_eq!(r["spec"]["username"], "bob");
        let groups = r["spec"]["groups"].as_array().expect("groups");
        assert!(groups.contains(&json!("dev")) && !groups.contains(&json!("system:masters")));
        assert!(r["spec"]["uid"].is_null() && r["status"].is_null());
        assert_eq!(signer_wildcard("example.com/users"), "example.com/*");
    }
}
