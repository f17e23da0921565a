//! ValidatingAdmissionPolicies end to end with the real kubectl against `tessera up`: a
//! policy with a binding refuses Deployments over a replica limit read from a ConfigMap
//! parameter, with its message, reason and variables; Warn and Audit bindings; match
//! conditions and namespace selectors; failure policies; invalid policies refused naming
//! the field; a tenant neither registers policies nor slips out of their selectors.

mod support;

use support::Cluster;

const POLICY: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replica-limit.example.com}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments, deployments/scale]
  matchConditions:
  - name: not-exempt
    expression: "!has(object.metadata.labels) || !('exempt' in object.metadata.labels)"
  variables:
  - name: limit
    expression: int(params.data.maxReplicas)
  validations:
  - expression: object.spec.replicas <= variables.limit
    messageExpression: "'replicas ' + string(object.spec.replicas) + ' exceed the limit of ' + string(variables.limit)"
    reason: Invalid
  - expression: object.metadata.name.size() <= 20
    message: names are at most 20 characters
    reason: Forbidden
"#;

const BINDING: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replica-limit-binding}
spec:
  policyName: replica-limit.example.com
  validationActions: [Deny]
  paramRef: {name: limits, namespace: policy, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector: {matchLabels: {limits: enforced}}
"#;

fn deployment(c: &Cluster, name: &str, ns: &str, replicas: u32, labels: &str) -> String {
    c.file(
        &format!("{ns}-{name}.yaml"),
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}\n\
             spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n\
             \x20 template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, image: pause}}]}}\n"
        ),
    )
}

#[test]
fn a_bound_policy_refuses_warns_and_follows_its_failure_policy() {
    let c = Cluster::start();
    for ns in ["policy", "shop", "other"] {
        c.ok(&["create", "namespace", ns]);
    }
    c.ok(&["label", "namespace", "shop", "limits=enforced"]);
    let policy = c.file("policy.yaml", POLICY);
    let binding = c.file("binding.yaml", BINDING);
    c.ok(&["apply", "-f", &policy, "-f", &binding]);
    let table = c.ok(&["get", "validatingadmissionpolicies"]);
    assert!(
        table.contains("VALIDATIONS") && table.contains("v1/ConfigMap"),
        "{table}"
    );
    let table = c.ok(&["get", "validatingadmissionpolicybindings"]);
    assert!(
        table.contains("replica-limit.example.com") && table.contains("policy/limits"),
        "{table}"
    );

    // No parameter yet, and the binding denies then: the policy fails closed.
    let err = c.fails(&["apply", "-f", &deployment(&c, "web", "shop", 3, "")]);
    assert!(
        err.contains("ValidatingAdmissionPolicy 'replica-limit.example.com' with binding 'replica-limit-binding' denied request")
            && err.contains("no params found"),
        "{err}"
    );
    c.ok(&[
        "create",
        "configmap",
        "limits",
        "-n",
        "policy",
        "--from-literal=maxReplicas=5",
    ]);
    c.ok(&["apply", "-f", &deployment(&c, "web", "shop", 3, "")]);
    // Over the limit: refused as Invalid with the message expression's words.
    let err = c.fails(&["apply", "-f", &deployment(&c, "big", "shop", 7, "")]);
    assert!(
        err.contains("is invalid")
            && err.contains("denied request: replicas 7 exceed the limit of 5"),
        "{err}"
    );
    // Through the scale subresource too (the policy sees the Scale).
    let err = c.fails(&["scale", "deployment", "web", "-n", "shop", "--replicas=9"]);
    assert!(err.contains("exceed the limit of 5"), "{err}");
    // The second validation's reason is Forbidden.
    let long = "a-name-longer-than-twenty";
    let err = c.fails(&["apply", "-f", &deployment(&c, long, "shop", 1, "")]);
    assert!(
        err.contains("is forbidden") && err.contains("names are at most 20 characters"),
        "{err}"
    );
    // The match condition exempts a labelled Deployment; another namespace is not selected.
    c.ok(&[
        "apply",
        "-f",
        &deployment(&c, "batch", "shop", 8, "exempt: 'yes'"),
    ]);
    c.ok(&["apply", "-f", &deployment(&c, "big", "other", 8, "")]);
    // A new limit in the parameter applies at once.
    c.ok(&[
        "patch",
        "configmap",
        "limits",
        "-n",
        "policy",
        "--type=merge",
        "-p",
        r#"{"data":{"maxReplicas":"10"}}"#,
    ]);
    c.ok(&["apply", "-f", &deployment(&c, "big", "shop", 7, "")]);

    // A Warn binding lets the request through with kubectl's warning.
    c.ok(&["delete", "-f", &binding]);
    let warn = c.file(
        "warn.yaml",
        &BINDING.replace(
            "validationActions: [Deny]",
            "validationActions: [Warn, Audit]",
        ),
    );
    c.ok(&["apply", "-f", &warn]);
    let out = c.kubectl(&["apply", "-f", &deployment(&c, "huge", "shop", 12, "")]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'replica-limit.example.com' with binding 'replica-limit-binding': replicas 12 exceed the limit of 10"),
        "{said}"
    );
    let warned = support::sample(
        &c.metrics_addr,
        "tessera_apiserver_admission_policy_checks_total{binding=\"replica-limit-binding\",policy=\"replica-limit.example.com\",result=\"warned\"} ",
    );
    assert!(warned >= 1.0, "warned checks counted: {warned}");

    // An expression that fails to evaluate (a parameter without the key) refuses while the
    // policy fails closed, and lets the request through once it fails open.
    c.ok(&[
        "patch",
        "configmap",
        "limits",
        "-n",
        "policy",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/data/maxReplicas"}]"#,
    ]);
    c.ok(&["delete", "-f", &warn]);
    c.ok(&["apply", "-f", &binding]);
    let err = c.fails(&["apply", "-f", &deployment(&c, "next", "shop", 1, "")]);
    assert!(
        err.contains("variable 'limit'") && err.contains("resulted in error"),
        "{err}"
    );
    let open = c.file(
        "open.yaml",
        &POLICY.replace("failurePolicy: Fail", "failurePolicy: Ignore"),
    );
    c.ok(&["apply", "-f", &open]);
    c.ok(&["apply", "-f", &deployment(&c, "next", "shop", 1, "")]);
}

#[test]
fn invalid_policies_and_bindings_are_refused_naming_the_field() {
    let c = Cluster::start();
    let cases = [
        (
            POLICY.replace(
                "object.spec.replicas <= variables.limit",
                "object.spec.replicas <=",
            ),
            "spec.validations[0].expression",
        ),
        (
            POLICY.replace(
                "int(params.data.maxReplicas)",
                "int(parms.data.maxReplicas)",
            ),
            "spec.variables[0].expression",
        ),
        (
            POLICY.replace("reason: Forbidden", "reason: Teapot"),
            "spec.validations[1].reason",
        ),
        (
            POLICY.replace("      operations: [CREATE, UPDATE]\n", ""),
            "spec.matchConstraints.resourceRules[0].operations",
        ),
        (
            POLICY.replace("name: not-exempt", "name: 'not exempt!'"),
            "spec.matchConditions[0].name",
        ),
        (
            BINDING.replace(
                "validationActions: [Deny]",
                "validationActions: [Deny, Warn]",
            ),
            "spec.validationActions",
        ),
        (
            BINDING.replace("validationActions: [Deny]", "validationActions: [Block]"),
            "spec.validationActions[0]",
        ),
        (
            BINDING.replace("name: limits, ", "name: limits, selector: {}, "),
            "spec.paramRef",
        ),
    ];
    for (yaml, field) in cases {
        let file = c.file("bad.yaml", &yaml);
        let err = c.fails(&["create", "-f", &file]);
        assert!(err.contains(field), "{field}: {err}");
    }
    for kind in [
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ] {
        let left = c.ok(&["get", kind, "-o", "name"]);
        assert!(left.trim().is_empty(), "nothing was stored: {left}");
    }
}

#[test]
fn tenants_cannot_register_policies_or_slip_out_of_their_selectors() {
    let c = Cluster::start();
    let setup = c.file(
        "tenants.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: acme-dev, labels: {limits: enforced}}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: policy}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: limits, namespace: policy}\ndata: {maxReplicas: '2'}\n",
    );
    c.ok(&["create", "-f", &setup]);
    let acme = support::tenant_token(&c, "acme");
    let as_acme = |args: &[&str]| c.kubectl_as(&acme, args);
    let refused = |args: &[&str], words: &str| c.refused_as(&acme, args, words);
    let policy = c.file("policy.yaml", POLICY);
    let binding = c.file("binding.yaml", BINDING);
    // A tenant may register neither a policy nor a binding (one binding a permissive
    // policy would be a way around the admin's).
    refused(&["create", "-f", &policy], "Forbidden");
    refused(&["create", "-f", &binding], "Forbidden");
    c.ok(&["apply", "-f", &policy, "-f", &binding]);
    // The admin's policy judges the tenant's writes, which cannot read the parameter
    // themselves.
    refused(
        &["apply", "-f", &deployment(&c, "web", "acme-dev", 3, "")],
        "exceed the limit of 2",
    );
    refused(&["get", "configmap", "limits", "-n", "policy"], "Forbidden");
    // Nor can the tenant take its namespace out of the binding's selector.
    refused(
        &["label", "namespace", "acme-dev", "limits-"],
        "selects namespaces by label limits",
    );
    refused(
        &["apply", "-f", &deployment(&c, "web", "acme-dev", 3, "")],
        "exceed the limit of 2",
    );
    let out = as_acme(&["apply", "-f", &deployment(&c, "web", "acme-dev", 2, "")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
