//! RBAC end to end with the real kubectl against `tessera up`: the default roles and their
//! aggregation, a Role that grants `get pods` and nothing else, `kubectl auth can-i --list`
//! and `whoami`, ServiceAccount tokens from `kubectl create token`, and the attacks a tenant
//! or its users could try — escalating through a Role or binding, a binding that reaches past
//! the tenant's namespaces, reusing a token after its account is gone.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Cluster, wait_for};

/// A user token from `tessera token create`.
fn user_token(c: &Cluster, args: &[&str]) -> String {
    support::token(c, args)
}

/// Runs kubectl as the bearer of `token`: (success, stdout, stderr).
fn as_token(c: &Cluster, token: &str, args: &[&str]) -> (bool, String, String) {
    let flag = format!("--token={token}");
    let mut all = vec![flag.as_str()];
    all.extend_from_slice(args);
    let out = c.kubectl(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(c: &Cluster, token: &str, args: &[&str]) -> String {
    let (ok, out, err) = as_token(c, token, args);
    assert!(ok, "kubectl {args:?} failed: {err}");
    out
}

fn refused(c: &Cluster, token: &str, args: &[&str]) -> String {
    let (ok, out, err) = as_token(c, token, args);
    assert!(!ok, "kubectl {args:?} should have been refused: {out}");
    err
}

const SETUP: &str = "apiVersion: tessera.io/v1alpha1
kind: Tenant
metadata: {name: acme}
spec: {namespaces: [acme-dev]}
---
apiVersion: tessera.io/v1alpha1
kind: Tenant
metadata: {name: zeta}
spec: {namespaces: [zeta-dev]}
---
apiVersion: v1
kind: Namespace
metadata: {name: acme-dev}
---
apiVersion: v1
kind: Namespace
metadata: {name: zeta-dev}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: plans, namespace: zeta-dev}
data: {x: \"1\"}
---
apiVersion: v1
kind: Pod
metadata: {name: p1, namespace: acme-dev}
spec:
  containers: [{name: c, image: nginx}]
";

#[test]
fn rbac_end_to_end_with_kubectl() {
    let c = Cluster::start();
    let setup = c.file("setup.yaml", SETUP);
    c.ok(&["create", "-f", &setup]);

    // The defaults are there, and `view` gathers the rules of the roles labelled into it.
    let roles = c.ok(&["get", "clusterroles", "-o", "name"]);
    for r in [
        "admin",
        "edit",
        "view",
        "cluster-admin",
        "system:basic-user",
    ] {
        assert!(
            roles.contains(&format!("clusterrole.rbac.authorization.k8s.io/{r}\n")),
            "{roles}"
        );
    }
    let aggregated = |role: &str, resource: &str| {
        wait_for(Duration::from_secs(30), || {
            let out = c.ok(&["get", "clusterrole", role, "-o", "json"]);
            let v: Value = serde_json::from_str(&out).expect("json");
            v["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| {
                    r["resources"]
                        .as_array()
                        .is_some_and(|rs| rs.iter().any(|x| x == resource))
                })
                .then_some(())
        })
        .is_some()
    };
    assert!(
        aggregated("view", "pods"),
        "view aggregates system:aggregate-to-view"
    );
    assert!(aggregated("admin", "rolebindings"), "admin aggregates");
    assert!(
        aggregated("admin", "pods"),
        "admin gets edit's and view's rules"
    );

    let owner = support::tenant_token(&c, "acme");
    let alice = user_token(&c, &["--tenant", "acme", "--user", "alice"]);

    // Who am I.
    let who = ok(&c, &alice, &["auth", "whoami", "-o", "json"]);
    let who: Value = serde_json::from_str(&who).expect("json");
    assert_eq!(who["status"]["userInfo"]["username"], "alice");
    let groups = who["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("tessera:tenant:acme") && groups.contains("system:authenticated"),
        "{groups}"
    );

    // Nothing is granted yet: Kubernetes' own refusal, word for word.
    let err = refused(&c, &alice, &["get", "pods", "-n", "acme-dev"]);
    assert!(
        err.contains("pods is forbidden: User \"alice\" cannot list resource \"pods\" in API group \"\" in the namespace \"acme-dev\""),
        "{err}"
    );

    // The tenant grants `get pods` and nothing else.
    ok(
        &c,
        &owner,
        &[
            "create",
            "role",
            "pod-reader",
            "-n",
            "acme-dev",
            "--verb=get",
            "--resource=pods",
        ],
    );
    ok(
        &c,
        &owner,
        &[
            "create",
            "rolebinding",
            "alice-reads",
            "-n",
            "acme-dev",
            "--role=pod-reader",
            "--user=alice",
        ],
    );
    assert!(
        ok(
            &c,
            &alice,
            &["get", "pod", "p1", "-n", "acme-dev", "-o", "name"]
        )
        .contains("pod/p1")
    );
    let forbidden = |verb: &str, what: &str| {
        format!(
            "is forbidden: User \"alice\" cannot {verb} resource \"{what}\" in API group \"\" in the namespace \"acme-dev\""
        )
    };
    let manifest = |name: &str| {
        c.file(
            &format!("{name}.yaml"),
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: acme-dev}}\nspec:\n  containers: [{{name: c, image: nginx}}]\n"),
        )
    };
    let (p1, p2) = (manifest("p1"), manifest("p2"));
    for (args, verb, what) in [
        (vec!["get", "pods", "-n", "acme-dev"], "list", "pods"),
        (vec!["create", "-f", p2.as_str()], "create", "pods"),
        (
            vec!["label", "pod", "p1", "-n", "acme-dev", "x=y"],
            "patch",
            "pods",
        ),
        (vec!["replace", "-f", p1.as_str()], "update", "pods"),
        (
            vec!["delete", "pod", "p1", "-n", "acme-dev"],
            "delete",
            "pods",
        ),
        (
            vec!["delete", "pods", "--all", "-n", "acme-dev"],
            "list",
            "pods",
        ),
        (vec!["logs", "p1", "-n", "acme-dev"], "get", "pods/log"),
        (
            vec!["get", "configmaps", "-n", "acme-dev"],
            "list",
            "configmaps",
        ),
    ] {
        let err = refused(&c, &alice, &args);
        assert!(err.contains(&forbidden(verb, what)), "{args:?}: {err}");
    }
    // watch and deletecollection, as API calls (kubectl lists before it watches or deletes).
    let err = refused(
        &c,
        &alice,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/acme-dev/pods?watch=true",
        ],
    );
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
    let err = refused(
        &c,
        &alice,
        &["delete", "--raw", "/api/v1/namespaces/acme-dev/pods"],
    );
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
    let (allowed, said, _) = as_token(
        &c,
        &alice,
        &[
            "auth",
            "can-i",
            "deletecollection",
            "pods",
            "-n",
            "acme-dev",
        ],
    );
    assert!(!allowed && said.trim() == "no", "{said}");
    let (allowed, said, _) = as_token(
        &c,
        &alice,
        &["auth", "can-i", "watch", "pods", "-n", "acme-dev"],
    );
    assert!(!allowed && said.trim() == "no", "{said}");

    // Impersonation: the admin acts as alice (`--as`, within her tenant with `--as-group`),
    // and sees what she sees; alice and the tenant may impersonate nobody.
    let as_alice = ["--as=alice", "--as-group=tessera:tenant:acme"];
    fn with<'a>(first: &[&'a str], args: &[&'a str]) -> Vec<&'a str> {
        first.iter().chain(args).copied().collect()
    }
    let with = |args: &[&'static str]| with(&as_alice, args);
    assert!(
        c.ok(&with(&["get", "pod", "p1", "-n", "acme-dev", "-o", "name"]))
            .contains("pod/p1")
    );
    let err = c.fails(&with(&["get", "pods", "-n", "acme-dev"]));
    assert!(err.contains(&forbidden("list", "pods")), "{err}");
    assert_eq!(
        c.ok(&with(&["auth", "can-i", "get", "pods", "-n", "acme-dev"]))
            .trim(),
        "yes"
    );
    let err = c.fails(&with(&["get", "configmap", "plans", "-n", "zeta-dev"]));
    assert!(err.contains("not one of tenant acme's namespaces"), "{err}");
    let err = refused(&c, &alice, &["get", "pods", "-n", "acme-dev", "--as=bob"]);
    assert!(
        err.contains("User \"alice\" cannot impersonate resource \"users\""),
        "{err}"
    );
    let err = refused(
        &c,
        &owner,
        &["get", "pods", "--as=root", "--as-group=system:masters"],
    );
    assert!(err.contains("cannot impersonate"), "{err}");

    // can-i agrees with the evaluator, and --list shows the rule.
    assert_eq!(
        ok(
            &c,
            &alice,
            &["auth", "can-i", "get", "pods", "-n", "acme-dev"]
        )
        .trim(),
        "yes"
    );
    let (allowed, said, _) = as_token(
        &c,
        &alice,
        &["auth", "can-i", "delete", "pods", "-n", "acme-dev"],
    );
    assert!(!allowed && said.trim() == "no", "{said}");
    let list = ok(&c, &alice, &["auth", "can-i", "--list", "-n", "acme-dev"]);
    let pods_row = list
        .lines()
        .find(|l| l.split_whitespace().next() == Some("pods"))
        .unwrap_or_else(|| panic!("no pods row: {list}"));
    assert!(
        pods_row.contains("[get]") && !pods_row.contains("list"),
        "{pods_row}"
    );
    assert!(
        list.contains("selfsubjectaccessreviews.authorization.k8s.io"),
        "{list}"
    );

    // Escalation: the tenant may not grant what it does not hold — cluster-admin's `*`
    // even in its own namespace — but may bind `admin` there.
    let err = refused(
        &c,
        &owner,
        &[
            "create",
            "rolebinding",
            "all",
            "-n",
            "acme-dev",
            "--clusterrole=cluster-admin",
            "--user=alice",
        ],
    );
    assert!(
        err.contains("attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    ok(
        &c,
        &owner,
        &[
            "create",
            "rolebinding",
            "alice-admin",
            "-n",
            "acme-dev",
            "--clusterrole=admin",
            "--user=alice",
        ],
    );
    assert!(ok(&c, &alice, &["get", "pods", "-n", "acme-dev", "-o", "name"]).contains("pod/p1"));
    // alice, admin of acme-dev, grants what admin holds, and not what it does not.
    ok(
        &c,
        &alice,
        &[
            "create",
            "role",
            "cm-editor",
            "-n",
            "acme-dev",
            "--verb=get,list,create,delete",
            "--resource=configmaps",
        ],
    );
    // A wildcard is covered only by a wildcard, which admin does not hold.
    let err = refused(
        &c,
        &alice,
        &[
            "create",
            "role",
            "cm-all",
            "-n",
            "acme-dev",
            "--verb=*",
            "--resource=configmaps",
        ],
    );
    assert!(err.contains("not currently held"), "{err}");
    let err = refused(
        &c,
        &alice,
        &[
            "create",
            "role",
            "node-killer",
            "-n",
            "acme-dev",
            "--verb=delete",
            "--resource=nodes",
        ],
    );
    assert!(
        err.contains("attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    // A binding's roleRef never changes.
    let err = refused(
        &c,
        &alice,
        &[
            "patch",
            "rolebinding",
            "alice-reads",
            "-n",
            "acme-dev",
            "--type=merge",
            "-p",
            "{\"roleRef\":{\"name\":\"cm-editor\"}}",
        ],
    );
    assert!(err.contains("cannot change roleRef"), "{err}");
    // Tenants write no cluster-scoped RBAC.
    let err = refused(
        &c,
        &owner,
        &[
            "create",
            "clusterrolebinding",
            "mine",
            "--clusterrole=view",
            "--user=alice",
        ],
    );
    assert!(err.contains("forbidden"), "{err}");

    // Isolation first: even cluster-admin, bound by the admin, does not take alice out of
    // her tenant's namespaces or let her lift its quotas.
    c.ok(&[
        "create",
        "clusterrolebinding",
        "alice-everything",
        "--clusterrole=cluster-admin",
        "--user=alice",
    ]);
    let err = refused(&c, &alice, &["get", "configmap", "plans", "-n", "zeta-dev"]);
    assert!(err.contains("not one of tenant acme's namespaces"), "{err}");
    let err = refused(
        &c,
        &alice,
        &["create", "quota", "q", "-n", "acme-dev", "--hard=pods=1"],
    );
    assert!(err.contains("only an admin may change it"), "{err}");
    let (allowed, said, _) = as_token(
        &c,
        &alice,
        &["auth", "can-i", "get", "configmaps", "-n", "zeta-dev"],
    );
    assert!(!allowed && said.starts_with("no"), "{said}");

    // A user outside any tenant is RBAC's alone: a group bound to `view` cluster-wide.
    let bob = user_token(&c, &["--user", "bob", "--group", "auditors"]);
    let err = refused(&c, &bob, &["get", "pods", "-A"]);
    assert!(
        err.contains(
            "User \"bob\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        ),
        "{err}"
    );
    c.ok(&[
        "create",
        "clusterrolebinding",
        "auditors-view",
        "--clusterrole=view",
        "--group=auditors",
    ]);
    let all = ok(&c, &bob, &["get", "pods", "-A", "-o", "name"]);
    assert!(all.contains("pod/p1"), "{all}");
    assert!(
        ok(&c, &bob, &["get", "cm", "-n", "zeta-dev", "-o", "name"]).contains("configmap/plans")
    );
    let err = refused(&c, &bob, &["get", "secrets", "-n", "zeta-dev"]);
    assert!(
        err.contains("cannot list resource \"secrets\""),
        "view reads no secrets: {err}"
    );
    // Reserved names are not for user tokens.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "token",
            "create",
            "--user",
            "mallory",
            "--group",
            "system:masters",
            "--data-dir",
        ])
        .arg(c.dir.path())
        .output()
        .expect("token create");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reserves"));

    // ServiceAccount tokens: issued by `kubectl create token`, RBAC's like any subject.
    ok(
        &c,
        &owner,
        &["create", "serviceaccount", "robot", "-n", "acme-dev"],
    );
    let robot = ok(&c, &owner, &["create", "token", "robot", "-n", "acme-dev"])
        .trim()
        .to_owned();
    assert!(robot.starts_with("eyJ"), "a JWT: {robot}");
    let who: Value =
        serde_json::from_str(&ok(&c, &robot, &["auth", "whoami", "-o", "json"])).expect("json");
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:acme-dev:robot"
    );
    let err = refused(&c, &robot, &["get", "pods", "-n", "acme-dev"]);
    assert!(
        err.contains("User \"system:serviceaccount:acme-dev:robot\" cannot list resource \"pods\""),
        "{err}"
    );
    ok(
        &c,
        &owner,
        &[
            "create",
            "rolebinding",
            "robot-view",
            "-n",
            "acme-dev",
            "--clusterrole=view",
            "--serviceaccount=acme-dev:robot",
        ],
    );
    assert!(ok(&c, &robot, &["get", "pods", "-n", "acme-dev", "-o", "name"]).contains("pod/p1"));
    let impersonated = c.ok(&[
        "--as=system:serviceaccount:acme-dev:robot",
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(impersonated, "system:serviceaccount:acme-dev:robot");
    // A ServiceAccount in a tenant's namespace is held by the tenant's isolation too.
    c.ok(&[
        "create",
        "clusterrolebinding",
        "robot-everything",
        "--clusterrole=cluster-admin",
        "--serviceaccount=acme-dev:robot",
    ]);
    let err = refused(&c, &robot, &["get", "cm", "-n", "zeta-dev"]);
    assert!(err.contains("not one of tenant acme's namespaces"), "{err}");
    // Too short a life; a token for another audience does not open the API.
    let err = refused(
        &c,
        &owner,
        &[
            "create",
            "token",
            "robot",
            "-n",
            "acme-dev",
            "--duration=5m",
        ],
    );
    assert!(
        err.contains("may not specify a duration less than 10 minutes"),
        "{err}"
    );
    let vault = ok(
        &c,
        &owner,
        &[
            "create",
            "token",
            "robot",
            "-n",
            "acme-dev",
            "--audience=vault",
        ],
    )
    .trim()
    .to_owned();
    let err = refused(&c, &vault, &["get", "pods", "-n", "acme-dev"]);
    assert!(
        err.contains("Unauthorized") || err.contains("must be logged in"),
        "{err}"
    );
    // A tenant cannot mint tokens for another tenant's accounts.
    let err = refused(
        &c,
        &owner,
        &["create", "token", "default", "-n", "zeta-dev"],
    );
    assert!(err.contains("forbidden"), "{err}");
    // Deleting the account ends its tokens.
    ok(
        &c,
        &owner,
        &["delete", "serviceaccount", "robot", "-n", "acme-dev"],
    );
    let err = refused(&c, &robot, &["get", "pods", "-n", "acme-dev"]);
    assert!(
        err.contains("Unauthorized") || err.contains("must be logged in"),
        "{err}"
    );
}

/// The official Python client drives RBAC and TokenRequest (`tests/python/rbac_scenario.py`).
/// A PEM certificate request for `cn` (and the key pair, to sign a certificate with).
fn certificate_request(cn: &str) -> (String, rcgen::KeyPair, rcgen::CertificateParams) {
    support::certs::request(cn, &[])
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn certificate_signing_requests_are_approved_only_as_rbac_allows() {
    let c = Cluster::start();
    let bob = user_token(&c, &["--user", "bob"]);
    // Bob may make requests and update their approval, but approve for no signer yet.
    let role = c.file(
        "csr-role.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: csr-maker}\nrules:\n- apiGroups: [certificates.k8s.io]\n  resources: [certificatesigningrequests]\n  verbs: [create, get, list, watch]\n- apiGroups: [certificates.k8s.io]\n  resources: [certificatesigningrequests/approval]\n  verbs: [update]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: bob-makes-csrs}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-maker}\nsubjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]\n",
    );
    c.ok(&["apply", "-f", &role]);
    let (pem, key, params) = certificate_request("alice");
    let manifest = |name: &str, request: &str, signer: &str| {
        format!(
            "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  request: {request}\n  signerName: {signer}\n  usages: [client auth, digital signature]\n  expirationSeconds: 86400\n  username: admin\n  groups: [system:masters]\n"
        )
    };
    let file = c.file(
        "alice.yaml",
        &manifest("alice", &b64(pem.as_bytes()), "example.com/users"),
    );
    let made = wait_for(Duration::from_secs(10), || {
        as_token(&c, &bob, &["create", "-f", &file]).0.then_some(())
    });
    assert!(
        made.is_some(),
        "{:?}",
        as_token(&c, &bob, &["create", "-f", &file])
    );
    // The requester is bob, whatever the body said; the table says what kubectl's does.
    let row = c.ok(&["get", "csr", "alice", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[0], "alice", "{row}");
    assert_eq!(
        &cols[2..],
        ["example.com/users", "bob", "24h", "Pending"],
        "{row}"
    );
    let groups = c.ok(&["get", "csr", "alice", "-o", "jsonpath={.spec.groups}"]);
    assert!(!groups.contains("system:masters"), "{groups}");
    // Approving needs `approve` on the signer.
    let (ok, _, err) = as_token(&c, &bob, &["certificate", "approve", "alice"]);
    assert!(!ok);
    assert!(
        err.contains("not permitted to approve requests with signerName \"example.com/users\""),
        "{err}"
    );
    let signers = c.file(
        "signers.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: approve-example}\nrules:\n- apiGroups: [certificates.k8s.io]\n  resources: [signers]\n  resourceNames: [example.com/*]\n  verbs: [approve]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: bob-approves}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: approve-example}\nsubjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]\n",
    );
    c.ok(&["apply", "-f", &signers]);
    let approved = wait_for(Duration::from_secs(10), || {
        as_token(&c, &bob, &["certificate", "approve", "alice"])
            .0
            .then_some(())
    });
    assert!(
        approved.is_some(),
        "{:?}",
        as_token(&c, &bob, &["certificate", "approve", "alice"])
    );
    let row = c.ok(&["get", "csr", "alice", "--no-headers"]);
    assert!(row.trim_end().ends_with(" Approved"), "{row}");
    // A signer issues through the status subresource; the approval stays.
    let cert = params.self_signed(&key).expect("cert").pem();
    let patch = format!(
        "{{\"status\":{{\"certificate\":\"{}\"}}}}",
        b64(cert.as_bytes())
    );
    c.ok(&[
        "patch",
        "csr",
        "alice",
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ]);
    let row = c.ok(&["get", "csr", "alice", "--no-headers"]);
    assert!(row.trim_end().ends_with(" Approved,Issued"), "{row}");
    // Nothing takes the approval back, changes the certificate, or changes the spec.
    // (kubectl itself will not deny an approved request; the server refuses it too.)
    let mut both: Value =
        serde_json::from_str(&c.ok(&["get", "csr", "alice", "-o", "json"])).expect("json");
    both["status"]["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(serde_json::json!({"type": "Denied", "status": "True", "reason": "Changed"}));
    let file = c.file("both.json", &both.to_string());
    let e = c.fails(&[
        "replace",
        "--raw",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/alice/approval",
        "-f",
        &file,
    ]);
    assert!(e.contains("mutually exclusive"), "{e}");
    let other = c.ok(&[
        "patch",
        "csr",
        "alice",
        "--type=merge",
        "-p",
        "{\"spec\":{\"signerName\":\"evil.example.com/x\"}}",
    ]);
    assert!(other.contains("alice"), "{other}");
    assert_eq!(
        c.ok(&["get", "csr", "alice", "-o", "jsonpath={.spec.signerName}"]),
        "example.com/users"
    );
    // Invalid requests are refused naming the field, and nothing is stored.
    for (name, request, signer, field) in [
        (
            "junk",
            b64(b"not a request"),
            "example.com/users",
            "spec.request",
        ),
        ("nosigner", b64(pem.as_bytes()), "users", "spec.signerName"),
    ] {
        let file = c.file(&format!("{name}.yaml"), &manifest(name, &request, signer));
        let e = c.fails(&["create", "-f", &file]);
        assert!(e.contains(field), "{name}: {e}");
        assert!(!c.kubectl(&["get", "csr", name]).status.success());
    }
    // A tenant makes no cluster-scoped requests.
    c.ok(&["apply", "-f", &c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n",
    )]);
    let acme = support::tenant_token(&c, "acme");
    let file = c.file(
        "t.yaml",
        &manifest("tenant-csr", &b64(pem.as_bytes()), "example.com/users"),
    );
    let (ok, _, err) = as_token(&c, &acme, &["create", "-f", &file]);
    assert!(!ok && err.to_lowercase().contains("forbidden"), "{err}");
}

#[test]
fn the_python_client_drives_rbac() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "py"]);
    let carol = user_token(&c, &["--user", "carol"]);
    support::python_scenario(&c, "rbac_scenario.py", &["py", &carol]);
}

/// `kubectl certificate approve` of a `kubernetes.io/kube-apiserver-client` request gets a
/// certificate from the shard's signer (the API server's CA), which kubectl then
/// authenticates with — as the user and groups it names, with what RBAC grants them and
/// nothing more. `system:masters` cannot be asked for, usages the signer does not issue fail
/// the request, and a certificate of another CA is refused at the handshake.
#[test]
fn approved_client_certificates_authenticate_as_their_subject() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "shop"]);
    let (pem, key, _) = support::certs::request("jane", &["devs"]);
    let file = c.file(
        "jane.yaml",
        &support::certs::client_csr("jane", &pem, "client auth, digital signature"),
    );
    c.ok(&["create", "-f", &file]);
    c.ok(&["certificate", "approve", "jane"]);
    let cert = support::certs::issued(&c, "jane");
    let row = c.ok(&["get", "csr", "jane", "--no-headers"]);
    assert!(row.trim_end().ends_with(" Approved,Issued"), "{row}");
    let cert_file = c.file("jane.crt", &cert);
    let key_file = c.file("jane.key", &key.serialize_pem());
    let ca_file = c.dir.path().join("pki").join("ca.crt");
    let server = c.server();
    let jane = |args: &[&str]| {
        support::certs::kubectl_with_cert(&server, &ca_file, &cert_file, &key_file, args)
    };
    let (ok, who, err) = jane(&["auth", "whoami", "-o", "json"]);
    assert!(ok, "{err}");
    let who: Value = serde_json::from_str(&who).expect("json");
    assert_eq!(who["status"]["userInfo"]["username"], "jane", "{who}");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!(["devs", "system:authenticated"]),
        "{who}"
    );
    // RBAC decides: nothing until the group is bound.
    let (ok, _, err) = jane(&["get", "pods", "-n", "shop"]);
    assert!(!ok);
    assert!(
        err.contains("User \"jane\" cannot list resource \"pods\""),
        "{err}"
    );
    view_for_devs(&c);
    let allowed = wait_for(Duration::from_secs(10), || {
        jane(&["get", "pods", "-n", "shop"]).0.then_some(())
    });
    assert!(
        allowed.is_some(),
        "{:?}",
        jane(&["get", "pods", "-n", "shop"])
    );
    let (ok, _, err) = jane(&["create", "configmap", "x", "-n", "shop"]);
    assert!(
        !ok && err.contains("forbidden"),
        "view does not create: {err}"
    );

    // system:masters cannot be asked for (Kubernetes' CertificateSubjectRestriction).
    let (pem, _, _) = support::certs::request("root", &["system:masters"]);
    let file = c.file(
        "root.yaml",
        &support::certs::client_csr("root", &pem, "client auth"),
    );
    let err = c.fails(&["create", "-f", &file]);
    assert!(
        err.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"),
        "{err}"
    );
    assert!(!c.kubectl(&["get", "csr", "root"]).status.success());
    // A usage the signer does not issue fails the approved request, saying why.
    let (pem, _, _) = certificate_request("web");
    let file = c.file(
        "web.yaml",
        &support::certs::client_csr("web", &pem, "server auth"),
    );
    c.ok(&["create", "-f", &file]);
    c.ok(&["certificate", "approve", "web"]);
    let failed = wait_for(Duration::from_secs(30), || {
        let reason = c.ok(&[
            "get",
            "csr",
            "web",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Failed\")].message}",
        ]);
        (!reason.trim().is_empty()).then_some(reason)
    })
    .expect("the signer failed the request");
    assert!(
        failed.contains("invalid usage for client certificate: server auth"),
        "{failed}"
    );
    assert!(
        c.ok(&["get", "csr", "web", "-o", "jsonpath={.status.certificate}"])
            .trim()
            .is_empty()
    );

    // A certificate for jane from a CA of her own is refused at the handshake.
    let own_ca_key = rcgen::KeyPair::generate().expect("key");
    let mut own_ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    own_ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let own_issuer = rcgen::Issuer::new(own_ca, own_ca_key);
    let (_, forged_key, mut forged) = support::certs::request("jane", &["devs"]);
    forged.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let forged_cert = forged.signed_by(&forged_key, &own_issuer).expect("signed");
    let forged_cert_file = c.file("forged.crt", &forged_cert.pem());
    let forged_key_file = c.file("forged.key", &forged_key.serialize_pem());
    let (ok, _, err) = support::certs::kubectl_with_cert(
        &server,
        &ca_file,
        &forged_cert_file,
        &forged_key_file,
        &["get", "pods", "-n", "shop"],
    );
    assert!(!ok, "a forged certificate was accepted");
    // Refused at the handshake, not by an HTTP answer. With TLS 1.3 the client has finished
    // its side before the server checks the certificate, so kubectl sees the server's alert
    // ("bad certificate") or, when its request was already on the way, the closed
    // connection ("broken pipe", "connection reset") — all as "Unable to connect".
    assert!(err.contains("Unable to connect to the server"), "{err}");
    assert!(
        !err.contains("Forbidden") && !err.contains("Unauthorized"),
        "the forged certificate reached the API: {err}"
    );
}

/// POSTs review `body` (JSON) to `path` as the bearer of `token` (`kubectl create --raw`):
/// the answer, or kubectl's error.
fn post_review(c: &Cluster, token: &str, path: &str, body: &Value) -> Result<Value, String> {
    let file = c.file("review.json", &body.to_string());
    let (ok, out, err) = as_token(c, token, &["create", "--raw", path, "-f", &file]);
    if ok {
        Ok(serde_json::from_str(&out).expect("a JSON review"))
    } else {
        Err(err)
    }
}

/// What delegates authentication and authorization to the API (Vault, a mesh, kube-rbac-proxy,
/// an extension API server) works: TokenReview names the user a token names — audiences,
/// revocation and all — and SubjectAccessReview and LocalSubjectAccessReview answer for
/// another user as the authorizer would, tenant isolation included. Only callers RBAC grants
/// `system:auth-delegator` (or an admin) may ask, and a tenant's callers only about their
/// own namespaces.
#[test]
fn token_and_subject_access_reviews_answer_for_others() {
    let c = Cluster::start();
    let admin = c.admin_token();
    c.ok(&["create", "namespace", "shop"]);
    c.ok(&["create", "serviceaccount", "robot", "-n", "shop"]);
    c.ok(&["create", "serviceaccount", "proxy", "-n", "shop"]);
    let robot = c
        .ok(&["create", "token", "robot", "-n", "shop"])
        .trim()
        .to_owned();
    let for_vault = c
        .ok(&[
            "create",
            "token",
            "robot",
            "-n",
            "shop",
            "--audience",
            "vault",
        ])
        .trim()
        .to_owned();
    const TOKENS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
    let token_review = |token: &str, audiences: &[&str]| {
        json_review(
            "authentication.k8s.io/v1",
            "TokenReview",
            json!({"token": token, "audiences": audiences}),
        )
    };
    // An admin asks: the account's token names it.
    let r = post_review(&c, &admin, TOKENS, &token_review(&robot, &[])).expect("reviewed");
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    assert_eq!(
        r["status"]["user"]["username"], "system:serviceaccount:shop:robot",
        "{r}"
    );
    let groups = r["status"]["user"]["groups"].to_string();
    assert!(groups.contains("system:serviceaccounts:shop"), "{groups}");
    assert!(
        !r["status"]["user"]["uid"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{r}"
    );
    // Audiences: a token for vault is good for vault, not for this API; an API token is not
    // good for vault.
    let r = post_review(
        &c,
        &admin,
        TOKENS,
        &token_review(&for_vault, &["vault", "other"]),
    )
    .expect("reviewed");
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    assert_eq!(r["status"]["audiences"], json!(["vault"]), "{r}");
    let r = post_review(&c, &admin, TOKENS, &token_review(&for_vault, &[])).expect("reviewed");
    assert_eq!(r["status"]["authenticated"], false, "{r}");
    let r = post_review(&c, &admin, TOKENS, &token_review(&robot, &["vault"])).expect("reviewed");
    assert_eq!(r["status"]["authenticated"], false, "{r}");
    // Nonsense names nobody, saying so; a tenant's token names the tenant.
    let r = post_review(&c, &admin, TOKENS, &token_review("not-a-token", &[])).expect("reviewed");
    assert_eq!(r["status"]["authenticated"], false, "{r}");
    assert!(
        r["status"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not valid"),
        "{r}"
    );
    c.ok(&["apply", "-f", &c.file(
        "tenant.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n",
    )]);
    let acme = support::tenant_token(&c, "acme");
    let r = post_review(&c, &admin, TOKENS, &token_review(&acme, &[])).expect("reviewed");
    assert_eq!(r["status"]["user"]["username"], "tenant:acme", "{r}");
    // A deleted account's tokens name nobody any more.
    c.ok(&["create", "serviceaccount", "temp", "-n", "shop"]);
    let temp = c
        .ok(&["create", "token", "temp", "-n", "shop"])
        .trim()
        .to_owned();
    c.ok(&["delete", "serviceaccount", "temp", "-n", "shop"]);
    let r = post_review(&c, &admin, TOKENS, &token_review(&temp, &[])).expect("reviewed");
    assert_eq!(r["status"]["authenticated"], false, "{r}");

    // Who may ask: the proxy's account only once bound to system:auth-delegator.
    let proxy = c
        .ok(&["create", "token", "proxy", "-n", "shop"])
        .trim()
        .to_owned();
    let err = post_review(&c, &proxy, TOKENS, &token_review(&robot, &[])).expect_err("refused");
    assert!(
        err.contains(
            "cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\""
        ),
        "{err}"
    );
    c.ok(&[
        "create",
        "clusterrolebinding",
        "proxy-delegates",
        "--clusterrole=system:auth-delegator",
        "--serviceaccount=shop:proxy",
    ]);
    let r = post_review(&c, &proxy, TOKENS, &token_review(&robot, &[])).expect("reviewed");
    assert_eq!(r["status"]["authenticated"], true, "{r}");
    // A tenant reviews no tokens, whatever it holds.
    let err = post_review(&c, &acme, TOKENS, &token_review(&robot, &[])).expect_err("refused");
    assert!(err.contains("tenant acme's callers"), "{err}");

    // SubjectAccessReview: what another user may do, as the authorizer decides it.
    const SUBJECTS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let sar = |user: &str, groups: &[&str], ns: &str, verb: &str| {
        json_review(
            "authorization.k8s.io/v1",
            "SubjectAccessReview",
            json!({"user": user, "groups": groups,
                "resourceAttributes": {"namespace": ns, "verb": verb, "resource": "pods"}}),
        )
    };
    // Whether the proxy's review says the user (in the groups) may do `verb` on pods in `ns`.
    let may = |user: &str, groups: &[&str], ns: &str, verb: &str| {
        let r = post_review(&c, &proxy, SUBJECTS, &sar(user, groups, ns, verb));
        r.expect("reviewed")["status"]["allowed"] == true
    };
    assert!(!may("bob", &["devs"], "shop", "list"));
    view_for_devs(&c);
    assert!(may("bob", &["devs"], "shop", "list"));
    assert!(!may("bob", &["devs"], "shop", "delete"));
    assert!(may("carol", &["system:masters"], "kube-system", "delete"));
    // Isolation holds for the subject: a tenant's user is nobody outside its namespaces,
    // whatever a binding says.
    c.ok(&[
        "create",
        "clusterrolebinding",
        "acme-everywhere",
        "--clusterrole=cluster-admin",
        "--group=tessera:tenant:acme",
    ]);
    assert!(!may("alice", &["tessera:tenant:acme"], "shop", "list"));
    assert!(may("alice", &["tessera:tenant:acme"], "acme-dev", "list"));
    assert!(!may("tenant:acme", &[], "shop", "get"));
    // Neither user nor group: refused naming the field.
    let err = post_review(&c, &proxy, SUBJECTS, &sar("", &[], "shop", "get")).expect_err("refused");
    assert!(
        err.contains("spec.user") && err.contains("at least one of user or group"),
        "{err}"
    );
    // A tenant asks only in its own namespaces, with LocalSubjectAccessReview.
    let err =
        post_review(&c, &acme, SUBJECTS, &sar("bob", &[], "acme-dev", "get")).expect_err("refused");
    assert!(
        err.contains("cannot create resource \"subjectaccessreviews\""),
        "{err}"
    );
    let local = |ns: &str| {
        format!("/apis/authorization.k8s.io/v1/namespaces/{ns}/localsubjectaccessreviews")
    };
    let lsar = |user: &str| {
        json_review(
            "authorization.k8s.io/v1",
            "LocalSubjectAccessReview",
            json!({"user": user, "resourceAttributes": {"verb": "get", "resource": "pods"}}),
        )
    };
    let r = post_review(&c, &acme, &local("acme-dev"), &lsar("tenant:acme")).expect("reviewed");
    assert_eq!(r["kind"], "LocalSubjectAccessReview", "{r}");
    assert_eq!(r["status"]["allowed"], true, "{r}");
    let err = post_review(&c, &acme, &local("shop"), &lsar("bob")).expect_err("refused");
    assert!(err.contains("in the namespace \"shop\""), "{err}");
    let mismatched = json_review(
        "authorization.k8s.io/v1",
        "LocalSubjectAccessReview",
        json!({"user": "bob", "resourceAttributes": {"namespace": "shop", "verb": "get", "resource": "pods"}}),
    );
    let err = post_review(&c, &acme, &local("acme-dev"), &mismatched).expect_err("refused");
    assert!(err.contains("must match metadata.namespace"), "{err}");
}

/// Binds ClusterRole `view` to group `devs` in namespace `shop`.
fn view_for_devs(c: &Cluster) {
    c.ok(&[
        "create",
        "rolebinding",
        "devs-view",
        "-n",
        "shop",
        "--clusterrole=view",
        "--group=devs",
    ]);
}

/// A review object of `kind` with `spec`.
fn json_review(api_version: &str, kind: &str, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "spec": spec})
}
