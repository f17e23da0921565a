//! The stored kinds charts and tools apply — Ingress, IngressClass, NetworkPolicy,
//! PodTemplate, StorageClass, PersistentVolume and PersistentVolumeClaim — through the real
//! kubectl: created, refused when invalid (naming the field), printed with Kubernetes'
//! columns; and claims bound by Tessera's hostPath provisioner, so a StatefulSet's
//! `volumeClaimTemplates` give each pod a volume that outlives it on a process node.

mod support;

use std::time::Duration;

use support::{Cluster, wait_for};

const KINDS: &str = "apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: k8s.io/ingress-nginx}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: site, namespace: web}
spec:
  ingressClassName: nginx
  tls: [{hosts: [a.example], secretName: tls}]
  rules:
  - host: a.example
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-web, namespace: web}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {}}], ports: [{port: 80}]}]
---
apiVersion: v1
kind: PodTemplate
metadata: {name: tpl, namespace: web}
template:
  metadata: {labels: {app: web}}
  spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: manual}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
";

#[test]
fn stored_kinds_and_claims_through_kubectl() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=0", "--process-nodes=1"]);
    let kinds = c.file("kinds.yaml", KINDS);
    c.ok(&["apply", "-f", &kinds]);

    let ing = c.ok(&["get", "ingress", "-n", "web"]);
    assert!(
        ing.contains("NAME") && ing.contains("CLASS") && ing.contains("HOSTS"),
        "{ing}"
    );
    let row = ing.lines().nth(1).unwrap_or_default();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..3], &["site", "nginx", "a.example"], "{ing}");
    assert!(row.contains("80, 443"), "{ing}");
    let netpol = c.ok(&["get", "netpol", "-n", "web", "--no-headers"]);
    assert!(
        netpol.starts_with("only-web") && netpol.contains("app=web"),
        "{netpol}"
    );
    let policy_types = c.ok(&[
        "get",
        "netpol",
        "only-web",
        "-n",
        "web",
        "-o",
        "jsonpath={.spec.policyTypes}",
    ]);
    assert_eq!(
        policy_types, "[\"Ingress\"]",
        "defaulted as Kubernetes does"
    );
    assert!(
        c.ok(&["get", "podtemplates", "-n", "web", "--no-headers"])
            .contains("app=web")
    );
    let classes = c.ok(&["get", "storageclass", "--no-headers"]);
    assert!(
        classes.contains("standard (default)") && classes.contains("tessera.io/hostpath"),
        "{classes}"
    );
    assert!(
        classes.contains("manual") && classes.contains("WaitForFirstConsumer"),
        "{classes}"
    );
    assert!(
        c.ok(&["get", "ingressclass", "--no-headers"])
            .contains("k8s.io/ingress-nginx")
    );

    // Invalid objects are refused with the field named, and nothing is stored.
    let bad = c.file("bad.yaml", "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: bad, namespace: web}\nspec:\n  rules:\n  - http:\n      paths:\n      - {path: /, backend: {service: {name: web, port: {number: 80}}}}\n");
    let err = c.fails(&["apply", "-f", &bad]);
    assert!(
        err.contains("spec.rules[0].http.paths[0].pathType: Required value"),
        "{err}"
    );
    let bad = c.file("badpvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: bad, namespace: web}\nspec:\n  resources: {requests: {storage: 1Gi}}\n");
    let err = c.fails(&["apply", "-f", &bad]);
    assert!(
        err.contains("spec.accessModes: Required value: at least 1 access mode is required"),
        "{err}"
    );
    assert!(
        !c.kubectl(&["get", "pvc", "bad", "-n", "web"])
            .status
            .success()
    );

    // A claim of the default class gets a volume of its own.
    let claim = c.file("claim.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: cache, namespace: web}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 2Gi}}\n");
    c.ok(&["apply", "-f", &claim]);
    let bound = wait_for(Duration::from_secs(30), || {
        let row = c.ok(&["get", "pvc", "cache", "-n", "web", "--no-headers"]);
        row.contains(" Bound ").then_some(row)
    })
    .expect("the claim is bound");
    assert!(
        bound.contains("2Gi") && bound.contains("RWO") && bound.contains("standard"),
        "{bound}"
    );
    let volume = c.ok(&[
        "get",
        "pvc",
        "cache",
        "-n",
        "web",
        "-o",
        "jsonpath={.spec.volumeName}",
    ]);
    let pv = c.ok(&["get", "pv", &volume, "--no-headers"]);
    assert!(
        pv.contains("Bound") && pv.contains("web/cache") && pv.contains("Delete"),
        "{pv}"
    );
    // Deleted, its provisioned volume goes with it (reclaimPolicy Delete).
    c.ok(&["delete", "pvc", "cache", "-n", "web"]);
    let gone = wait_for(Duration::from_secs(30), || {
        (!c.kubectl(&["get", "pv", &volume]).status.success()).then_some(())
    });
    assert!(
        gone.is_some(),
        "the provisioned volume was deleted with its claim"
    );

    // A StatefulSet's claims: the pod writes, is deleted, and its successor reads it.
    let sts = c.file(
        "sts.yaml",
        "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: web}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      tolerations: [{key: tessera.io/runtime, operator: Exists}]
      containers:
      - name: c
        image: busybox
        command: [sh, -c, 'ls /data; touch /data/written-by-$$; sleep 3600']
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
",
    );
    c.ok(&["apply", "-f", &sts]);
    let running = |uid_not: &str| {
        wait_for(Duration::from_secs(90), || {
            let out = c.ok(&[
                "get",
                "pod",
                "db-0",
                "-n",
                "web",
                "-o",
                "jsonpath={.status.phase} {.metadata.uid}",
            ]);
            let (phase, uid) = out.split_once(' ')?;
            (phase == "Running" && uid != uid_not).then(|| uid.to_owned())
        })
        .unwrap_or_else(|| {
            panic!(
                "db-0 running: {}",
                c.ok(&["describe", "pod", "db-0", "-n", "web"])
            )
        })
    };
    let first = running("");
    assert!(
        c.ok(&["get", "pvc", "data-db-0", "-n", "web", "--no-headers"])
            .contains(" Bound "),
        "the set's claim is bound"
    );
    let written = wait_for(Duration::from_secs(30), || {
        let out = c.ok(&["logs", "db-0", "-n", "web"]);
        Some(out)
    });
    assert_eq!(
        written.as_deref(),
        Some(""),
        "the first pod finds its volume empty"
    );
    c.ok(&["delete", "pod", "db-0", "-n", "web", "--wait=true"]);
    running(&first);
    let seen = wait_for(Duration::from_secs(30), || {
        let out = c.ok(&["logs", "db-0", "-n", "web"]);
        out.contains("written-by-").then_some(out)
    });
    assert!(seen.is_some(), "the second pod reads what the first wrote");
}
