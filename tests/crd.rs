//! CustomResourceDefinitions end to end with the real kubectl against `tessera up`: a CRD is
//! served as soon as it is created (discovery, `kubectl explain`, short names, categories),
//! its schema refuses invalid objects naming the field, fills in defaults and prunes unknown
//! fields, its printer columns show in `kubectl get`, its status and scale subresources work
//! (`kubectl scale`), a second version is served alongside, and deleting the CRD deletes its
//! objects and stops serving the kind.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Cluster, wait_for};

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wd]
    categories: [all]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
        labelSelectorPath: .status.selector
    additionalPrinterColumns:
    - name: Size
      type: integer
      jsonPath: .spec.size
    - name: Colour
      type: string
      jsonPath: .spec.colour
    - name: Ready
      type: boolean
      jsonPath: .status.ready
      priority: 1
    schema:
      openAPIV3Schema:
        type: object
        description: A Widget is a thing made of parts.
        properties:
          spec:
            type: object
            description: What the widget should be.
            required: [size]
            properties:
              size:
                type: integer
                minimum: 1
                maximum: 10
                description: How many parts.
              colour:
                type: string
                enum: [red, blue]
                default: red
              replicas:
                type: integer
                default: 1
              owner:
                type: string
                pattern: '^[a-z]+$'
              labels:
                type: object
                additionalProperties: {type: string}
          status:
            type: object
            properties:
              ready: {type: boolean}
              replicas: {type: integer}
              selector: {type: string}
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

/// Applies the CRD in `file` and waits until kubectl sees it Established.
fn establish(c: &Cluster, file: &str) {
    c.ok(&["apply", "-f", file]);
    c.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
}

/// `kubectl patch RESOURCE w1 -n shop [EXTRA] --type=merge -p PATCH`.
fn merge_patch(c: &Cluster, resource: &str, extra: &[&str], patch: &str) {
    let mut args = vec!["patch", resource, "w1", "-n", "shop"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--type=merge", "-p", patch]);
    c.ok(&args);
}

/// Widget `name` in namespace `shop`, as JSON.
fn widget(c: &Cluster, name: &str) -> Value {
    json(&c.ok(&["get", "widget", name, "-n", "shop", "-o", "json"]))
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).expect("kubectl printed JSON")
}

#[test]
fn a_crd_is_served_validated_and_cleaned_up_with_kubectl() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "shop"]);
    let crd = c.file("crd.yaml", CRD);
    establish(&c, &crd);

    // Served at once: `kubectl get crd`, discovery with the short name, and `explain` from
    // the schema published in /openapi/v3.
    let crds = c.ok(&["get", "crd"]);
    assert!(
        crds.contains("widgets.example.com")
            && crds.starts_with("NAME")
            && crds.contains("CREATED AT"),
        "{crds}"
    );
    let resources = c.ok(&["api-resources", "--api-group=example.com"]);
    assert!(
        resources.contains("widgets") && resources.contains("wd") && resources.contains("Widget"),
        "{resources}"
    );
    let versions = c.ok(&["api-versions"]);
    assert!(
        versions.contains("example.com/v1\n") && versions.contains("example.com/v1beta1\n"),
        "{versions}"
    );
    let explained = c.ok(&["explain", "widgets.spec.size"]);
    assert!(explained.contains("How many parts"), "{explained}");
    assert_eq!(
        support::sample(&c.metrics_addr, "tessera_apiserver_custom_resources "),
        2.0,
        "two versions served"
    );

    // A valid object: defaults applied, unknown fields pruned (with a warning by default).
    let w1 = c.file(
        "w1.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: shop}\n\
         spec: {size: 3, owner: ann, bogus: 1}\n",
    );
    let out = c.kubectl(&["create", "-f", &w1, "--validate=false"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = widget(&c, "w1");
    assert_eq!(stored["spec"]["colour"], "red", "default applied: {stored}");
    assert_eq!(stored["spec"]["replicas"], 1);
    assert!(stored["spec"].get("bogus").is_none(), "pruned: {stored}");
    // Strict validation (kubectl's default) refuses the unknown field instead, naming it.
    let w2 = c.file(
        "w2.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2, namespace: shop}\n\
         spec: {size: 3, bogus: 1}\n",
    );
    let err = c.fails(&["create", "-f", &w2]);
    assert!(err.contains("bogus"), "{err}");

    // Invalid objects are refused naming the field, and nothing is stored.
    for (spec, field, words) in [
        ("{size: 11}", "spec.size", "less than or equal to 10"),
        ("{colour: red}", "spec.size", "Required value"),
        ("{size: 2, colour: pink}", "spec.colour", "supported values"),
        ("{size: 2, owner: Ann}", "spec.owner", "should match"),
        ("{size: two}", "spec.size", "must be of type integer"),
    ] {
        let bad = c.file(
            "bad.yaml",
            &format!(
                "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: bad, namespace: shop}}\nspec: {spec}\n"
            ),
        );
        let err = c.fails(&["create", "-f", &bad, "--validate=false"]);
        assert!(err.contains(field) && err.contains(words), "{spec}: {err}");
    }
    let missing = c.fails(&["get", "widget", "bad", "-n", "shop"]);
    assert!(
        missing.contains("NotFound") || missing.contains("not found"),
        "{missing}"
    );

    // Printer columns, the priority-1 one only with -o wide; the short name and the `all`
    // category reach it.
    let table = c.ok(&["get", "wd", "-n", "shop"]);
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("SIZE") && header.contains("COLOUR") && !header.contains("READY"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("w1") && l.contains('3') && l.contains("red")),
        "{table}"
    );
    let wide = c.ok(&["get", "widgets", "-n", "shop", "-o", "wide"]);
    assert!(wide.contains("READY"), "{wide}");
    let all = c.ok(&["get", "all", "-n", "shop"]);
    assert!(all.contains("widget.example.com/w1"), "{all}");

    // The status subresource: the main resource ignores status, /status takes only it.
    merge_patch(
        &c,
        "widget",
        &[],
        r#"{"status":{"ready":true},"spec":{"size":4}}"#,
    );
    let w = widget(&c, "w1");
    assert_eq!(w["spec"]["size"], 4);
    assert!(
        w["status"]["ready"].is_null(),
        "status ignored on the main resource: {w}"
    );
    merge_patch(
        &c,
        "widget",
        &["--subresource=status"],
        r#"{"status":{"ready":true,"replicas":1,"selector":"app=w1"},"spec":{"size":5}}"#,
    );
    let w = widget(&c, "w1");
    assert_eq!(w["status"]["ready"], true);
    assert_eq!(w["spec"]["size"], 4, "spec ignored on /status: {w}");
    // A strategic merge patch needs Go types: refused with Kubernetes' reason.
    let err = c.fails(&[
        "patch",
        "widget",
        "w1",
        "-n",
        "shop",
        "-p",
        r#"{"spec":{"size":5}}"#,
    ]);
    assert!(
        err.contains("UnsupportedMediaType")
            || err.contains("unknown format")
            || err.contains("strategic"),
        "{err}"
    );

    // The scale subresource, through kubectl scale and the Scale it reads.
    c.ok(&["scale", "widget", "w1", "-n", "shop", "--replicas=3"]);
    let w = widget(&c, "w1");
    assert_eq!(w["spec"]["replicas"], 3);
    let scale = json(&c.ok(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/shop/widgets/w1/scale",
    ]));
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "app=w1");

    // The second version serves the same objects under its own apiVersion.
    let beta = json(&c.ok(&[
        "get",
        "widgets.v1beta1.example.com",
        "w1",
        "-n",
        "shop",
        "-o",
        "json",
    ]));
    assert_eq!(beta["apiVersion"], "example.com/v1beta1");
    assert_eq!(beta["spec"]["size"], 4);
    // And takes writes: an object written in v1 is patched through v1beta1.
    merge_patch(
        &c,
        "widgets.v1beta1.example.com",
        &[],
        r#"{"metadata":{"labels":{"patched":"beta"}}}"#,
    );
    let w = widget(&c, "w1");
    assert_eq!(w["apiVersion"], "example.com/v1");
    assert_eq!(w["metadata"]["labels"]["patched"], "beta");

    // kubectl apply, client-side (a merge patch: custom kinds have no strategic one) and
    // server-side, updates it.
    let applied = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w4, namespace: shop}\n\
                   spec: {size: 2, labels: {a: b}}\n";
    let file = c.file("w4.yaml", applied);
    c.ok(&["apply", "-f", &file]);
    let file = c.file(
        "w4.yaml",
        &applied
            .replace("size: 2", "size: 6")
            .replace("a: b", "c: d"),
    );
    c.ok(&["apply", "-f", &file]);
    let w = widget(&c, "w4");
    assert_eq!(w["spec"]["size"], 6);
    assert_eq!(
        w["spec"]["labels"],
        serde_json::json!({"c": "d"}),
        "the removed key went: {w}"
    );
    let file = c.file("w4.yaml", &applied.replace("size: 2", "size: 7"));
    c.ok(&["apply", "--server-side", "--force-conflicts", "-f", &file]);
    let w = widget(&c, "w4");
    assert_eq!(w["spec"]["size"], 7);
    c.ok(&["delete", "widget", "w4", "-n", "shop"]);

    // The garbage collector deletes what a custom object owned once it is gone, and never
    // what an owner of a kind no CRD defines owns.
    let w5 = c.file(
        "w5.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w5, namespace: shop}\nspec: {size: 1}\n",
    );
    c.ok(&["create", "-f", &w5]);
    let uid = c.ok(&[
        "get",
        "widget",
        "w5",
        "-n",
        "shop",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let owned = c.file(
        "owned.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w5-parts\n  namespace: shop\n  ownerReferences:\n\
             \x20 - {{apiVersion: example.com/v1, kind: Widget, name: w5, uid: {uid}}}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: unknown-owner\n  namespace: shop\n  ownerReferences:\n\
             \x20 - {{apiVersion: nothing.example.com/v1, kind: Gadget, name: g, uid: \"u-0000\"}}\n"
        ),
    );
    c.ok(&["create", "-f", &owned]);
    c.ok(&["delete", "widget", "w5", "-n", "shop"]);
    let collected = wait_for(Duration::from_secs(60), || {
        (!c.kubectl(&["get", "configmap", "w5-parts", "-n", "shop"])
            .status
            .success())
        .then_some(())
    });
    assert!(collected.is_some(), "the Widget's ConfigMap was collected");
    c.ok(&["get", "configmap", "unknown-owner", "-n", "shop"]);

    // Deleting a namespace deletes the custom objects in it.
    c.ok(&["create", "namespace", "scratch"]);
    let w3 = c.file(
        "w3.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w3, namespace: scratch}\nspec: {size: 1}\n",
    );
    c.ok(&["create", "-f", &w3]);
    c.ok(&["delete", "namespace", "scratch", "--timeout=60s"]);
    let left = json(&c.ok(&["get", "widgets", "-A", "-o", "json"]));
    let names: Vec<&str> = left["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, vec!["w1"], "w3 went with its namespace");

    // Deleting the CRD deletes its objects and stops serving the kind.
    c.ok(&["delete", "crd", "widgets.example.com", "--timeout=60s"]);
    let gone = wait_for(Duration::from_secs(30), || {
        let out = c.kubectl(&["get", "crd", "widgets.example.com"]);
        (!out.status.success()).then_some(())
    });
    assert!(gone.is_some(), "the CRD went once its objects were deleted");
    let err = c.fails(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/shop/widgets",
    ]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    assert!(
        support::sample(
            &c.metrics_addr,
            "tessera_apiserver_crd_cleanup_deleted_objects_total "
        ) >= 1.0
    );
    // Created again, it is empty: the old objects did not survive.
    establish(&c, &crd);
    let list = json(&c.ok(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/shop/widgets",
    ]));
    assert_eq!(list["items"], serde_json::json!([]), "{list}");
}

#[test]
fn invalid_definitions_are_refused_naming_the_field() {
    let c = Cluster::start();
    let cases = [
        (
            CRD.replace("name: widgets.example.com", "name: gadgets.example.com"),
            "metadata.name",
        ),
        (
            CRD.replace("name: widgets.example.com", "name: widgets.apps")
                .replace("group: example.com", "group: apps"),
            "spec.group",
        ),
        (
            CRD.replace(
                "              colour:\n                type: string\n",
                "              colour:\n",
            ),
            "properties[colour].type",
        ),
    ];
    for (yaml, field) in cases {
        let file = c.file("bad-crd.yaml", &yaml);
        let err = c.fails(&["create", "-f", &file]);
        assert!(err.contains(field), "{field}: {err}");
    }
    let crds = c.ok(&["get", "crd", "-o", "name"]);
    assert!(crds.trim().is_empty(), "nothing was stored: {crds}");
    // A CEL rule that does not compile refuses the CRD, naming the rule.
    let broken = CRD.replace(
        "            description: What the widget should be.\n",
        "            description: What the widget should be.\n            x-kubernetes-validations: [{rule: 'self.size >'}]\n",
    );
    let file = c.file("broken-cel-crd.yaml", &broken);
    let err = c.fails(&["create", "-f", &file]);
    assert!(
        err.contains("openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule")
            && err.contains("compilation failed"),
        "{err}"
    );
    let crds = c.ok(&["get", "crd", "-o", "name"]);
    assert!(crds.trim().is_empty(), "nothing was stored: {crds}");
}

/// `x-kubernetes-validations`: CEL rules refuse objects with their messages, reasons and
/// field paths; transition rules compare with the stored object on updates (a map list's
/// items with the old item of the same key).
#[test]
fn cel_rules_of_a_crd_are_enforced() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "shop"]);
    let rules = CRD
        .replace(
            "            description: What the widget should be.\n",
            concat!(
                "            description: What the widget should be.\n",
                "            x-kubernetes-validations:\n",
                "            - rule: \"!has(self.owner) || self.owner.size() <= self.size\"\n",
                "              message: an owner name may not be longer than the size\n",
                "            - rule: self.replicas >= oldSelf.replicas\n",
                "              messageExpression: \"'replicas may not go down from ' + string(oldSelf.replicas)\"\n",
                "              reason: FieldValueForbidden\n",
                "              fieldPath: .replicas\n",
            ),
        )
        .replace(
            "                additionalProperties: {type: string}\n",
            concat!(
                "                additionalProperties: {type: string}\n",
                "              parts:\n",
                "                type: array\n",
                "                x-kubernetes-list-type: map\n",
                "                x-kubernetes-list-map-keys: [name]\n",
                "                items:\n",
                "                  type: object\n",
                "                  x-kubernetes-validations:\n",
                "                  - {rule: 'self.count == oldSelf.count', message: a part's count is immutable}\n",
                "                  properties:\n",
                "                    name: {type: string}\n",
                "                    count: {type: integer}\n",
            ),
        );
    let file = c.file("cel-crd.yaml", &rules);
    establish(&c, &file);
    let w = |spec: &str| {
        c.file(
            "w1.yaml",
            &format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w1, namespace: shop}}\nspec: {spec}\n"),
        )
    };
    let err = c.fails(&["create", "-f", &w("{size: 2, owner: alice}")]);
    assert!(
        err.contains("The Widget \"w1\" is invalid")
            && err.contains(
                "spec: Invalid value: \"object\": an owner name may not be longer than the size"
            ),
        "{err}"
    );
    c.ok(&["create", "-f", &w("{size: 5, owner: alice, replicas: 3, parts: [{name: a, count: 1}, {name: b, count: 2}]}")]);
    // Going down is refused at the rule's fieldPath, with its reason and message expression.
    let err = c.fails(&["apply", "-f", &w("{size: 5, owner: alice, replicas: 2, parts: [{name: a, count: 1}, {name: b, count: 2}]}")]);
    assert!(
        err.contains("spec.replicas: Forbidden: replicas may not go down from 3"),
        "{err}"
    );
    // Items correlate by key, not by position: reordering passes, a changed count does not.
    c.ok(&["apply", "-f", &w("{size: 5, owner: alice, replicas: 4, parts: [{name: b, count: 2}, {name: a, count: 1}, {name: c, count: 9}]}")]);
    let err = c.fails(&["apply", "-f", &w("{size: 5, owner: alice, replicas: 4, parts: [{name: b, count: 3}, {name: a, count: 1}, {name: c, count: 9}]}")]);
    assert!(
        err.contains("spec.parts[0]: Invalid value: \"object\": a part's count is immutable"),
        "{err}"
    );
    assert_eq!(
        widget(&c, "w1")["spec"]["replicas"],
        4,
        "the refused writes changed nothing"
    );
    let failed = support::sample(
        &c.metrics_addr,
        "tessera_apiserver_crd_validation_rules_total{result=\"failed\"} ",
    );
    let passed = support::sample(
        &c.metrics_addr,
        "tessera_apiserver_crd_validation_rules_total{result=\"passed\"} ",
    );
    assert!(
        failed >= 3.0 && passed >= 3.0,
        "rules counted: {failed} failed, {passed} passed"
    );
}

/// The official Python client drives a CRD and its objects (`CustomObjectsApi`) with RBAC
/// (`tests/python/custom_objects_scenario.py`).
#[test]
fn the_python_client_drives_custom_objects() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "py"]);
    let dave = support::token(&c, &["--user", "dave"]);
    support::python_scenario(&c, "custom_objects_scenario.py", &["py", &dave, "dave"]);
}

/// Tenancy holds for custom kinds as for built-in ones, tried as an attacker would: a
/// tenant cannot define kinds (a CRD is cluster-wide), its own token reaches custom objects
/// in its namespaces only, its users only where RBAC grants them and still only in its
/// namespaces — whatever a ClusterRoleBinding says — and nobody of a tenant writes
/// cluster-scoped custom objects.
#[test]
fn tenants_reach_custom_objects_only_in_their_namespaces() {
    let c = Cluster::start();
    let setup = c.file(
        "tenants.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n---\n\
         apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: zeta}\nspec: {namespaces: [zeta-dev]}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: acme-dev}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: zeta-dev}\n",
    );
    c.ok(&["create", "-f", &setup]);
    let crd = c.file("crd.yaml", CRD);
    establish(&c, &crd);
    let rename = |plural: &str, singular: &str, kind: &str, short: &str| {
        CRD.replace("widgets", plural)
            .replace("widget", singular)
            .replace("Widget", kind)
            .replace("shortNames: [wd]", &format!("shortNames: [{short}]"))
    };
    let gizmos = c.file(
        "gizmos.yaml",
        &rename("gizmos", "gizmo", "Gizmo", "gz").replace("scope: Namespaced", "scope: Cluster"),
    );
    c.ok(&["apply", "-f", &gizmos]);
    let zeta_widget = c.file(
        "zw.yaml",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: secret-plans, namespace: zeta-dev}\nspec: {size: 9}\n",
    );
    c.ok(&["create", "-f", &zeta_widget]);
    let widget_in = |name: &str, ns: &str| {
        c.file(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{size: 2}}\n"
            ),
        )
    };
    let gizmo = c.file(
        "gizmo.yaml",
        "apiVersion: example.com/v1\nkind: Gizmo\nmetadata: {name: g}\nspec: {size: 2}\n",
    );
    let run = |token: &str, args: &[&str]| -> (bool, String) {
        let flag = format!("--token={token}");
        let mut all = vec![flag.as_str()];
        all.extend_from_slice(args);
        let out = c.kubectl(&all);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    let refused = |token: &str, args: &[&str]| {
        let (ok, out) = run(token, args);
        assert!(!ok && out.contains("Forbidden"), "{args:?}: {out}");
        assert!(!out.contains("size"), "nothing of zeta's leaks: {out}");
    };
    // What stays out of every tenant caller's reach.
    let outside = |token: &str| {
        refused(token, &["get", "widget", "secret-plans", "-n", "zeta-dev"]);
        refused(token, &["get", "widgets", "-n", "zeta-dev"]);
        refused(
            token,
            &["delete", "widget", "secret-plans", "-n", "zeta-dev"],
        );
        refused(token, &["get", "widgets", "-A"]);
        refused(token, &["create", "-f", &widget_in("planted", "zeta-dev")]);
        refused(token, &["create", "-f", &gizmo]);
    };

    // The tenant's own token: defining a kind is the cluster admin's; its namespaces are its.
    let acme = support::tenant_token(&c, "acme");
    let other = c.file("other-crd.yaml", &rename("things", "thing", "Thing", "th"));
    refused(&acme, &["create", "-f", &other]);
    let (ok, out) = run(&acme, &["create", "-f", &widget_in("mine", "acme-dev")]);
    assert!(ok, "{out}");
    outside(&acme);

    // A user of the tenant: nothing until RBAC grants it, then only in acme's namespaces
    // even though the grant is cluster-wide.
    let bob = support::token(&c, &["--user", "bob", "--tenant", "acme"]);
    refused(&bob, &["get", "widgets", "-n", "acme-dev"]);
    let grant = c.file(
        "grant.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: widget-admin}\n\
         rules: [{apiGroups: [example.com], resources: ['*'], verbs: ['*']}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: bob-widgets}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: widget-admin}\n\
         subjects: [{kind: User, name: bob}]\n",
    );
    c.ok(&["create", "-f", &grant]);
    let created = wait_for(Duration::from_secs(30), || {
        run(&bob, &["create", "-f", &widget_in("bobs", "acme-dev")])
            .0
            .then_some(())
    });
    assert!(created.is_some(), "the grant lets bob create in acme-dev");
    outside(&bob);

    let plans = json(&c.ok(&[
        "get",
        "widget",
        "secret-plans",
        "-n",
        "zeta-dev",
        "-o",
        "json",
    ]));
    assert_eq!(plans["spec"]["size"], 9, "zeta's object is untouched");
    let listed = c.ok(&["get", "widgets", "-n", "zeta-dev", "-o", "name"]);
    assert_eq!(listed.trim(), "widget.example.com/secret-plans");
    let gizmos = c.ok(&["get", "gizmos", "-o", "name"]);
    assert!(gizmos.trim().is_empty(), "{gizmos}");
}

/// `kubectl get apiservices`: every group-version served is a local APIService, Available,
/// `metrics.k8s.io` among them; one naming a Service is stored but says it is not available
/// (this server does not proxy to extension API servers).
#[test]
fn apiservices_list_what_is_served() {
    let c = Cluster::start();
    let listed = c.ok(&["get", "apiservices"]);
    let metrics = listed
        .lines()
        .find(|l| l.starts_with("v1beta1.metrics.k8s.io "))
        .unwrap_or_else(|| panic!("{listed}"));
    let cols: Vec<&str> = metrics.split_whitespace().collect();
    assert_eq!(cols[1..3], ["Local", "True"], "{metrics}");
    assert!(
        listed.lines().any(|l| l.starts_with("v1.apps ")),
        "{listed}"
    );
    let adapter = c.file(
        "adapter.yaml",
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {name: v1beta1.custom.metrics.k8s.io}\n\
         spec: {group: custom.metrics.k8s.io, version: v1beta1, groupPriorityMinimum: 100, versionPriority: 100,\n\
         \x20 insecureSkipTLSVerify: true, service: {namespace: monitoring, name: adapter}}\n",
    );
    c.ok(&["create", "-f", &adapter]);
    let row = c.ok(&[
        "get",
        "apiservice",
        "v1beta1.custom.metrics.k8s.io",
        "--no-headers",
    ]);
    assert!(row.contains("monitoring/adapter"), "{row}");
    // Its Service does not exist: the availability check says so.
    let row = support::extension::apiservice_available(
        &c,
        "v1beta1.custom.metrics.k8s.io",
        "ServiceNotFound",
    );
    assert!(row.contains("False (ServiceNotFound)"), "{row}");
    let bad = c.file(
        "bad.yaml",
        "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {name: wrong}\n\
         spec: {group: x.example.com, version: v1, groupPriorityMinimum: 100, versionPriority: 100}\n",
    );
    let err = c.fails(&["create", "-f", &bad]);
    assert!(err.contains("metadata.name"), "{err}");
}

/// Route `name` in namespace `shop` as `version` shows it.
fn route(c: &Cluster, version: &str, name: &str) -> Value {
    let resource = format!("routes.{version}.example.com");
    json(&c.ok(&["get", &resource, name, "-n", "shop", "-o", "json"]))
}

/// `spec.conversion.strategy: Webhook`: objects are stored in the storage version and
/// converted by the CRD's webhook for every version a client reads or writes — kubectl
/// gets, lists, patches, server-side applies and watches in either version, validation and
/// printer columns of the request's version, admission webhooks seeing their own version,
/// and a failing webhook failing requests with a clear error and storing nothing.
#[test]
fn a_conversion_webhook_converts_between_versions() {
    let c = Cluster::start();
    let (addr, ca, seen, _rt) = support::conversion::start();
    let client = |path: &str| support::conversion::client_config(addr, &ca, path);
    let reviews = |s: &support::conversion::Seen| s.lock().expect("lock").len();
    c.ok(&["create", "namespace", "shop"]);

    // Invalid conversion settings are refused naming the field.
    let no_client = support::conversion::route_crd(&client("/convert"))
        .replace(&format!("      clientConfig: {}\n", client("/convert")), "");
    let file = c.file("no-client.yaml", &no_client);
    let err = c.fails(&["create", "-f", &file]);
    assert!(
        err.contains("spec.conversion.webhook.clientConfig: Required value"),
        "{err}"
    );
    let file = c.file(
        "no-review-version.yaml",
        &support::conversion::route_crd(&client("/convert")).replace("[v9, v1]", "[v9]"),
    );
    let err = c.fails(&["create", "-f", &file]);
    assert!(
        err.contains("spec.conversion.webhook.conversionReviewVersions")
            && err.contains("v1, v1beta1"),
        "{err}"
    );
    let file = c.file(
        "http.yaml",
        &support::conversion::route_crd(&format!(
            "{{url: \"http://127.0.0.1:{}/convert\"}}",
            addr.port()
        )),
    );
    let err = c.fails(&["create", "-f", &file]);
    assert!(
        err.contains("spec.conversion.webhook.clientConfig.url"),
        "{err}"
    );
    assert!(c.ok(&["get", "crd", "-o", "name"]).trim().is_empty());

    let file = c.file(
        "routes.yaml",
        &support::conversion::route_crd(&client("/convert")),
    );
    c.ok(&["apply", "-f", &file]);
    c.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/routes.example.com",
        "--timeout=30s",
    ]);

    // Written in v1 (defaulted in v1: port 80), stored in v2.
    let r1 = c.file(
        "r1.yaml",
        "apiVersion: example.com/v1\nkind: Route\nmetadata: {name: r1, namespace: shop, labels: {app: web}}\nspec: {host: a.example}\n",
    );
    c.ok(&["apply", "-f", &r1]);
    let to_storage = seen.lock().expect("lock").iter().any(|(_, r)| {
        r["request"]["desiredAPIVersion"] == "example.com/v2"
            && r["request"]["objects"][0]["spec"] == json!({"host": "a.example", "port": 80})
    });
    assert!(to_storage, "the v1 object went to the webhook for v2");
    assert!(
        seen.lock()
            .expect("lock")
            .iter()
            .all(|(_, r)| r["apiVersion"] == "apiextensions.k8s.io/v1"),
        "reviews are sent in v1, the first version both speak"
    );
    let v2 = route(&c, "v2", "r1");
    assert_eq!(v2["apiVersion"], "example.com/v2");
    assert_eq!(v2["spec"], json!({"address": "a.example:80"}), "{v2}");
    assert_eq!(
        v2["metadata"]["name"], "r1",
        "the webhook may not rename: {v2}"
    );
    assert_eq!(v2["metadata"]["labels"]["app"], "web");
    let v1 = route(&c, "v1", "r1");
    assert_eq!(v1["apiVersion"], "example.com/v1");
    assert_eq!(v1["spec"], json!({"host": "a.example", "port": 80}), "{v1}");
    assert_eq!(
        v1["metadata"]["annotations"]["example.com/converted-from"], "example.com/v2",
        "annotations come from the webhook: {v1}"
    );
    assert_eq!(v1["metadata"]["uid"], v2["metadata"]["uid"]);

    // Reads in the storage version of objects stored in it need no webhook.
    let before = reviews(&seen);
    let listed = c.ok(&["get", "routes.v2.example.com", "-n", "shop", "-o", "name"]);
    assert_eq!(listed.trim(), "route.example.com/r1");
    assert_eq!(reviews(&seen), before, "a v2 list called the webhook");

    // Each version's printer columns, of the object in that version.
    let table = c.ok(&["get", "routes.v1.example.com", "-n", "shop"]);
    assert!(
        table.contains("HOST") && table.contains("a.example   80"),
        "{table}"
    );
    let table = c.ok(&["get", "routes.v2.example.com", "-n", "shop"]);
    assert!(
        table.contains("ADDRESS") && table.contains("a.example:80"),
        "{table}"
    );

    // Each version's schema validates the object as it was sent.
    let bad = c.file(
        "bad-v1.yaml",
        "apiVersion: example.com/v1\nkind: Route\nmetadata: {name: bad1, namespace: shop}\nspec: {host: b.example, port: 70000}\n",
    );
    let err = c.fails(&["create", "-f", &bad]);
    assert!(err.contains("spec.port"), "{err}");
    let bad = c.file(
        "bad-v2.yaml",
        "apiVersion: example.com/v2\nkind: Route\nmetadata: {name: bad2, namespace: shop}\nspec: {address: no-port}\n",
    );
    let err = c.fails(&["create", "-f", &bad]);
    assert!(err.contains("spec.address"), "{err}");

    // A merge patch through v1 applies to the object as v1 shows it.
    support::conversion::set_port(&c, "r1", 9090);
    let v2 = route(&c, "v2", "r1");
    assert_eq!(v2["spec"]["address"], "a.example:9090", "{v2}");
    // Server-side apply in v1, then a v2 object beside it.
    let r2 = c.file(
        "r2.yaml",
        "apiVersion: example.com/v1\nkind: Route\nmetadata: {name: r2, namespace: shop}\nspec: {host: c.example, port: 8443}\n",
    );
    c.ok(&["apply", "--server-side", "-f", &r2]);
    let r3 = c.file(
        "r3.yaml",
        "apiVersion: example.com/v2\nkind: Route\nmetadata: {name: r3, namespace: shop}\nspec: {address: 'd.example:53'}\n",
    );
    c.ok(&["apply", "-f", &r3]);
    let v1 = json(&c.ok(&["get", "routes.v1.example.com", "-n", "shop", "-o", "json"]));
    let specs: Vec<&Value> = v1["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| &i["spec"])
        .collect();
    assert_eq!(
        specs,
        [
            &json!({"host": "a.example", "port": 9090}),
            &json!({"host": "c.example", "port": 8443}),
            &json!({"host": "d.example", "port": 53}),
        ],
        "{v1}"
    );
    assert!(
        v1["items"]
            .as_array()
            .expect("items")
            .iter()
            .all(|i| i["apiVersion"] == "example.com/v1"),
        "{v1}"
    );

    // A watch in v1 sees v1 objects.
    let events = c.ok(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/shop/routes?watch=1&timeoutSeconds=1",
    ]);
    let added: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    assert_eq!(added.len(), 3, "{events}");
    assert!(
        added.iter().all(|e| e["type"] == "ADDED"
            && e["object"]["apiVersion"] == "example.com/v1"
            && e["object"]["spec"]["host"].is_string()),
        "{events}"
    );

    // An admission webhook whose rules name v2 sees a v1 write converted to v2.
    let admission = c.file(
        "admission.yaml",
        &format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\n\
             metadata: {{name: routes}}\nwebhooks:\n- name: routes.example.com\n  sideEffects: None\n\
             \x20 admissionReviewVersions: [v1]\n  matchPolicy: Equivalent\n  clientConfig: {}\n\
             \x20 rules: [{{operations: [CREATE], apiGroups: [example.com], apiVersions: [v2], resources: [routes]}}]\n",
            client("/admit")
        ),
    );
    c.ok(&["create", "-f", &admission]);
    let r4 = c.file(
        "r4.yaml",
        "apiVersion: example.com/v1\nkind: Route\nmetadata: {name: r4, namespace: shop}\nspec: {host: e.example, port: 25}\n",
    );
    c.ok(&["create", "-f", &r4]);
    let admitted = seen
        .lock()
        .expect("lock")
        .iter()
        .find(|(path, _)| path == "admit")
        .map(|(_, r)| r["request"].clone())
        .expect("the admission webhook was called");
    assert_eq!(
        admitted["object"]["apiVersion"], "example.com/v2",
        "{admitted}"
    );
    assert_eq!(
        admitted["object"]["spec"],
        json!({"address": "e.example:25"}),
        "{admitted}"
    );
    assert_eq!(admitted["requestKind"]["version"], "v1", "{admitted}");
    c.ok(&["delete", "validatingwebhookconfiguration", "routes"]);

    // The calls are counted.
    let calls = support::sample(
        &c.metrics_addr,
        "tessera_apiserver_crd_conversion_webhook_calls_total{crd=\"routes.example.com\",result=\"success\"} ",
    );
    assert!(calls >= 5.0, "conversion calls counted: {calls}");

    // A webhook that refuses, or answers wrongly, fails the request and stores nothing.
    for (path, words) in [
        ("/fail", "conversions are switched off"),
        ("/wrong-uid", "expected response uid"),
    ] {
        let file = c.file(
            "routes.yaml",
            &support::conversion::route_crd(&client(path)),
        );
        c.ok(&["apply", "-f", &file]);
        let err = wait_for(Duration::from_secs(10), || {
            let out = c.kubectl(&["get", "routes.v1.example.com", "r1", "-n", "shop"]);
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            (!out.status.success()).then_some(err)
        })
        .expect("reads in v1 fail once the webhook fails");
        assert!(
            err.contains("conversion webhook for example.com/v2, Kind=Route failed")
                && err.contains(words),
            "{path}: {err}"
        );
        let r5 = c.file(
            "r5.yaml",
            "apiVersion: example.com/v1\nkind: Route\nmetadata: {name: r5, namespace: shop}\nspec: {host: f.example}\n",
        );
        let err = c.fails(&["create", "-f", &r5]);
        assert!(err.contains(words), "{path}: {err}");
        // The storage version is still read without the webhook.
        let names = c.ok(&["get", "routes.v2.example.com", "-n", "shop", "-o", "name"]);
        assert!(!names.contains("r5"), "{path}: stored anyway: {names}");
        assert_eq!(names.lines().count(), 4, "{names}");
    }
}

#[test]
fn an_extension_api_server_serves_its_group_through_the_aggregator() {
    use support::extension::{self, GROUP, VERSION, apiservice_available};
    let c = Cluster::start();
    let setup = c.file(
        "tenants.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev]}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: acme-dev}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
    );
    c.ok(&["apply", "-f", &setup]);
    let extension::Installed {
        name,
        wardle,
        sa_token,
        service,
        bundle,
        rt: serving,
    } = extension::install(&c);
    let ca_file = c.dir.path().join("pki/ca.crt");

    // Discovery: kubectl finds the kind (aggregated discovery) with its short name.
    let listed = wait_for(Duration::from_secs(30), || {
        let out = c.ok(&["api-resources", "--api-group", GROUP]);
        out.contains("flunders").then_some(out)
    })
    .expect("flunders in api-resources");
    assert!(
        listed.contains("fl ") && listed.contains("Flunder"),
        "{listed}"
    );
    let groups = c.ok(&["api-versions"]);
    assert!(groups.contains(&format!("{GROUP}/{VERSION}")), "{groups}");
    // Its OpenAPI document comes from it: kubectl explain reads the extension's schema.
    let explained = c.ok(&["explain", "flunders.spec"]);
    assert!(explained.contains("reference"), "{explained}");

    // The admin creates and reads a Flunder; the extension saw who asked.
    let flunder = c.file(
        "flunder.yaml",
        &format!("apiVersion: {GROUP}/{VERSION}\nkind: Flunder\nmetadata: {{name: first}}\nspec: {{reference: none}}\n"),
    );
    c.ok(&["create", "-f", &flunder, "-n", "shop"]);
    let got: Value = json(&c.ok(&["get", "flunder", "first", "-n", "shop", "-o", "json"]));
    assert_eq!(
        got["metadata"]["annotations"]["wardle.example.com/created-by"],
        "admin"
    );
    assert!(c.ok(&["get", "fl", "-n", "shop"]).contains("first"));
    // A protocol switch (a console's WebSocket) goes through, spliced both ways, for the
    // caller who may reach the object; not for one who may not.
    let cluster_ca = std::fs::read_to_string(&ca_file).expect("ca");
    let echo = format!("/apis/{GROUP}/{VERSION}/namespaces/shop/flunders/first/echo");
    let (status, echoed) = serving.block_on(extension::echo_through(
        &c.server(),
        &cluster_ca,
        &c.admin_token(),
        &echo,
    ));
    assert!(status.contains(" 101 "), "{status}: {echoed}");
    assert_eq!(echoed, "ping\n");
    // A watch streams through: its event arrives while the extension keeps it open.
    let watched = std::process::Command::new("timeout")
        .args(["5", "kubectl"])
        .args(
            c.command(&[
                "get",
                "flunders",
                "-n",
                "shop",
                "--watch-only",
                "-o",
                "name",
            ])
            .get_args(),
        )
        .output();
    let watched = watched.expect("timeout kubectl");
    let said = String::from_utf8_lossy(&watched.stdout);
    assert!(said.contains("flunder.wardle.example.com/first"), "{said}");

    // A tenant: in its namespace, as itself; elsewhere refused before the extension hears.
    let acme = support::tenant_token(&c, "acme");
    let out = c.kubectl_as(&acme, &["create", "-f", &flunder, "-n", "acme-dev"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = json(&String::from_utf8_lossy(
        &c.kubectl_as(
            &acme,
            &["get", "flunder", "first", "-n", "acme-dev", "-o", "json"],
        )
        .stdout,
    ));
    assert_eq!(
        got["metadata"]["annotations"]["wardle.example.com/created-by"],
        "tenant:acme"
    );
    let before = wardle.seen.lock().expect("lock").len();
    c.refused_as(
        &acme,
        &["get", "flunders", "-n", "shop"],
        "flunders.wardle.example.com is forbidden: User \"tenant:acme\" cannot list resource \"flunders\" in API group \"wardle.example.com\" in the namespace \"shop\"",
    );
    c.refused_as(&acme, &["get", "flunders", "-A"], "at the cluster scope");
    let (status, _) = serving.block_on(extension::echo_through(
        &c.server(),
        &cluster_ca,
        &acme,
        &echo,
    ));
    assert!(status.contains(" 403 "), "{status}");
    c.refused_as(
        &acme,
        &["delete", "flunder", "first", "-n", "shop"],
        "forbidden",
    );
    // Paths that an extension would resolve elsewhere than where they were authorized are
    // refused (curl --path-as-is sends them as written).
    let raw = |path: &str| -> String {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--path-as-is", "--cacert"])
            .arg(c.dir.path().join("pki/ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {acme}")])
            .arg(format!("{}{path}", c.server()))
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for path in [
        format!("/apis/{GROUP}/{VERSION}/namespaces/acme-dev/../shop/flunders"),
        format!("/apis/{GROUP}/{VERSION}/namespaces/acme-dev/%2e%2e/shop/flunders"),
        format!("/apis/{GROUP}/{VERSION}/namespaces/acme-dev%2F..%2Fshop/flunders"),
    ] {
        let said = raw(&path);
        assert!(said.contains("is not canonical"), "{path}: {said}");
    }
    let said = raw(&format!(
        "/openapi/v3/apis/{GROUP}/{VERSION}/../../../../apis/{GROUP}/{VERSION}/namespaces/shop/flunders"
    ));
    assert!(said.contains("NotFound"), "{said}");
    // A tenant cannot register an APIService (cluster-scoped).
    let out = c.kubectl_as(&acme, &["apply", "-f", &service]);
    assert!(!out.status.success(), "a tenant registered an APIService");
    let checks_only = wardle
        .seen
        .lock()
        .expect("lock")
        .iter()
        .skip(before)
        .all(|s| s.user == "system:kube-aggregator");
    assert!(checks_only, "a refused request reached the extension");
    // Headers naming another caller are dropped: the extension hears the tenant.
    let spoof = std::process::Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(&ca_file)
        .args([
            "-H",
            &format!("Authorization: Bearer {acme}"),
            "-H",
            "X-Remote-User: admin",
            "-H",
            "X-Remote-Group: system:masters",
            "-H",
            "Impersonate-User: admin",
            &format!(
                "{}/apis/{GROUP}/{VERSION}/namespaces/acme-dev/flunders",
                c.server()
            ),
        ])
        .output()
        .expect("curl");
    let said = String::from_utf8_lossy(&spoof.stdout);
    assert!(
        said.contains("FlunderList") || said.contains("Forbidden"),
        "{said}"
    );
    {
        let seen = wardle.seen.lock().expect("lock");
        assert!(
            seen.iter()
                .all(|s| s.user != "admin" || !s.request.contains("acme-dev")),
            "a caller named itself to the extension: {seen:?}"
        );
        assert!(
            !seen
                .iter()
                .any(|s| s.groups.iter().any(|g| g == "system:masters")
                    && s.user.starts_with("tenant:")),
            "{seen:?}"
        );
    }
    // RBAC decides for users outside tenants: the extension's own account may list
    // flunders in shop once a Role says so, and its extra fields reach the extension as
    // X-Remote-Extra-* headers.
    let out = c.kubectl_as(&sa_token, &["get", "flunders", "-n", "shop"]);
    assert!(!out.status.success(), "listed flunders without a grant");
    let role = c.file(
        "reader.yaml",
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: flunder-reader, namespace: shop}}\n\
             rules: [{{apiGroups: [{GROUP}], resources: [flunders], verbs: [list]}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: wardle-reads, namespace: shop}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: flunder-reader}}\n\
             subjects: [{{kind: ServiceAccount, name: wardle, namespace: wardle-system}}]\n"
        ),
    );
    c.ok(&["apply", "-f", &role]);
    let listed = wait_for(Duration::from_secs(10), || {
        let out = c.kubectl_as(&sa_token, &["get", "flunders", "-n", "shop"]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .expect("the Role grants the list");
    assert!(listed.contains("first"), "{listed}");
    {
        let seen = wardle.seen.lock().expect("lock");
        let last = seen
            .iter()
            .rev()
            .find(|s| s.user == "system:serviceaccount:wardle-system:wardle")
            .expect("the account's request");
        assert!(
            last.extra.iter().any(|(k, v)| k
                == "x-remote-extra-authentication.kubernetes.io%2fcredential-id"
                && v.starts_with("JTI=")),
            "{last:?}"
        );
    }
    c.refused_as(
        &sa_token,
        &["get", "flunders", "-n", "acme-dev"],
        "forbidden",
    );

    // Counted per APIService.
    let metrics = c.ok(&["get", "--raw", "/metrics"]);
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!(
            "tessera_apiserver_aggregator_requests_total{{apiservice=\"{name}\",code=\"201\"}}"
        ))),
        "no aggregator counter"
    );

    // Without endpoints the APIService is unavailable, saying why, and requests get a 503.
    c.ok(&["delete", "endpoints", "wardle", "-n", "wardle-system"]);
    let row = apiservice_available(&c, &name, "MissingEndpoints");
    assert!(row.contains("False (MissingEndpoints)"), "{row}");
    let err = c.fails(&["get", "flunders", "-n", "shop"]);
    assert!(
        err.contains("ServiceUnavailable") || err.contains("unable to handle"),
        "{err}"
    );
    c.ok(&["apply", "-f", &service]);
    apiservice_available(&c, &name, "True");
    assert!(c.ok(&["get", "flunders", "-n", "shop"]).contains("first"));

    // A built-in group cannot be handed to an extension server.
    let hijack = c.file(
        "hijack.yaml",
        &format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: v1.apps}}\n\
             spec: {{group: apps, version: v1, groupPriorityMinimum: 100, versionPriority: 100,\n\
             \x20 caBundle: {bundle}, service: {{namespace: wardle-system, name: wardle}}}}\n"
        ),
    );
    let err = c.fails(&["apply", "-f", &hijack]);
    assert!(
        err.contains("spec.service") && err.contains("served by this API server itself"),
        "{err}"
    );
    assert!(
        c.ok(&["api-resources", "--api-group", "apps"])
            .contains("deployments")
    );
}
