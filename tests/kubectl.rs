//! The real kubectl (1.32, through the kubeconfig `tessera up` writes, over TLS) drives the
//! API end to end: every step asserts on kubectl's output or exit code.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{Cluster, Running, wait_for};

const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n";

fn deployment(image: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: demo
  labels: {{app: web}}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: app
        image: {image}
        ports: [{{containerPort: 80}}]
      - name: sidecar
        image: busybox:1.36
"
    )
}

fn json(c: &Cluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&c.ok(&all)).expect("kubectl -o json prints JSON")
}

#[test]
fn kubectl_drives_objects_end_to_end() {
    // The API alone: no scheduler, controllers or nodes to change what kubectl wrote.
    drive(&Cluster::start_with(
        "up",
        &[
            "--scheduler=false",
            "--controllers=false",
            "--nodes-per-shard=0",
        ],
    ));
}

/// The same, with `tessera apiserver` over real etcd processes in the sharded layout: a
/// default cluster, events on their own, namespaces hashed over two tenant shards.
#[test]
fn kubectl_drives_objects_over_sharded_etcd() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (a, b, e) = rt.block_on(async {
        let (a, b, e) = tokio::join!(
            tessera_store::testing::EtcdProcess::start(),
            tessera_store::testing::EtcdProcess::start(),
            tessera_store::testing::EtcdProcess::start()
        );
        (a.expect("etcd a"), b.expect("etcd b"), e.expect("etcd e"))
    });
    let overrides = format!("/events#{}", e.url());
    let shards = format!("{};{}", a.url(), b.url());
    let c = Cluster::start_with(
        "apiserver",
        &[
            "--store",
            "etcd",
            "--etcd-servers",
            &a.url(),
            "--etcd-servers-overrides",
            &overrides,
            "--tenant-shards",
            &shards,
        ],
    );
    drive(&c);
    drop(c);
    drop((a, b, e));
}

/// One long session of kubectl against `c`.
fn drive(c: &Cluster) {
    let versions = c.ok(&["api-versions"]);
    for gv in ["v1", "apps/v1", "batch/v1", "tessera.io/v1alpha1"] {
        assert!(versions.lines().any(|l| l == gv), "{gv} in {versions}");
    }

    // kubectl's typed generators send protobuf; each object arrives whole.
    for args in [
        &["create", "namespace", "gen"][..],
        &[
            "create",
            "configmap",
            "cfg",
            "-n",
            "gen",
            "--from-literal=a=1",
        ],
        &[
            "create",
            "secret",
            "generic",
            "pw",
            "-n",
            "gen",
            "--from-literal=pw=hunter2",
        ],
        &[
            "create",
            "deployment",
            "api",
            "-n",
            "gen",
            "--image=nginx:1.25",
            "--replicas=3",
            "--port=80",
        ],
        &[
            "create",
            "job",
            "once",
            "-n",
            "gen",
            "--image=busybox",
            "--",
            "echo",
            "hi",
        ],
        &[
            "create",
            "cronjob",
            "tick",
            "-n",
            "gen",
            "--image=busybox",
            "--schedule=*/5 * * * *",
            "--",
            "date",
        ],
        &["create", "serviceaccount", "robot", "-n", "gen"],
        &[
            "create",
            "service",
            "clusterip",
            "api",
            "-n",
            "gen",
            "--tcp=80:8080",
        ],
        &["create", "quota", "small", "-n", "gen", "--hard=pods=10"],
        &["create", "priorityclass", "high", "--value=1000"],
        &[
            "create",
            "poddisruptionbudget",
            "keep",
            "-n",
            "gen",
            "--selector=app=api",
            "--min-available=1",
        ],
    ] {
        let out = c.ok(args);
        assert!(out.trim().ends_with("created"), "{args:?}: {out}");
    }
    let d = json(c, &["get", "deploy", "api", "-n", "gen"]);
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.25"
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        80
    );
    let pw = json(c, &["get", "secret", "pw", "-n", "gen"]);
    assert_eq!(pw["data"]["pw"], "aHVudGVyMg==", "bytes survive protobuf");
    assert_eq!(pw["type"], "Opaque");
    let svc = json(c, &["get", "svc", "api", "-n", "gen"]);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(
        json(c, &["get", "cj", "tick", "-n", "gen"])["spec"]["schedule"],
        "*/5 * * * *"
    );
    assert_eq!(json(c, &["get", "pc", "high"])["value"], 1000);
    assert_eq!(
        c.ok(&["auth", "can-i", "create", "pods", "-n", "gen"])
            .trim(),
        "yes"
    );

    // create -f and apply -f, under kubectl's default strict validation (served by
    // /openapi/v3 and fieldValidation=Strict).
    let ns = c.file("ns.yaml", NAMESPACE);
    assert_eq!(
        c.ok(&["create", "-f", &ns]).trim(),
        "namespace/demo created"
    );
    let d1 = c.file("d1.yaml", &deployment("nginx:1.25", 2));
    assert_eq!(
        c.ok(&["apply", "-f", &d1]).trim(),
        "deployment.apps/web created"
    );

    // get: table, wide, name, json, yaml.
    let table = c.ok(&["get", "deployments", "-n", "demo"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    assert!(
        table.lines().nth(1).expect("row").starts_with("web    0/2"),
        "{table}"
    );
    let wide = c.ok(&["get", "deploy", "-n", "demo", "-o", "wide"]);
    assert!(
        wide.contains("nginx:1.25,busybox:1.36") && wide.contains("app=web"),
        "{wide}"
    );
    assert_eq!(
        c.ok(&["get", "deploy", "-n", "demo", "-o", "name"]).trim(),
        "deployment.apps/web"
    );
    let d = json(c, &["get", "deploy", "web", "-n", "demo"]);
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%",
        "defaulted"
    );
    assert_eq!(d["metadata"]["generation"], 1);
    assert!(
        c.ok(&["get", "deploy", "web", "-n", "demo", "-o", "yaml"])
            .contains("kind: Deployment")
    );

    // apply: change, then unchanged.
    let d2 = c.file("d2.yaml", &deployment("nginx:1.26", 2));
    assert_eq!(
        c.ok(&["apply", "-f", &d2]).trim(),
        "deployment.apps/web configured"
    );
    assert_eq!(
        c.ok(&["apply", "-f", &d2]).trim(),
        "deployment.apps/web unchanged"
    );
    let d = json(c, &["get", "deploy", "web", "-n", "demo"]);
    assert_eq!(
        d["metadata"]["generation"], 2,
        "a spec change bumps generation once"
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.26"
    );

    // scale, label, annotate; selectors.
    assert_eq!(
        c.ok(&["scale", "deploy", "web", "-n", "demo", "--replicas=5"])
            .trim(),
        "deployment.apps/web scaled"
    );
    c.ok(&["label", "deploy", "web", "-n", "demo", "tier=front"]);
    c.ok(&["annotate", "deploy", "web", "-n", "demo", "owner=team-a"]);
    let d = json(c, &["get", "deploy", "web", "-n", "demo"]);
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(d["metadata"]["labels"]["tier"], "front");
    assert_eq!(d["metadata"]["annotations"]["owner"], "team-a");
    assert_eq!(
        c.ok(&[
            "get",
            "deploy",
            "-n",
            "demo",
            "-l",
            "tier=front",
            "-o",
            "name"
        ])
        .trim(),
        "deployment.apps/web"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "deploy",
            "-n",
            "demo",
            "-l",
            "tier=back",
            "-o",
            "name"
        ])
        .trim(),
        ""
    );
    assert!(
        c.ok(&["get", "deploy", "-n", "demo", "--show-labels"])
            .contains("app=web,tier=front")
    );

    // patch of each type; the strategic merge keeps the sidecar (containers merge by name).
    c.ok(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "demo",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":4}]"#,
    ]);
    c.ok(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "demo",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"tier":null}}}"#,
    ]);
    c.ok(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "demo",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"nginx:1.27"}]}}}}"#,
    ]);
    let d = json(c, &["get", "deploy", "web", "-n", "demo"]);
    assert_eq!(d["spec"]["replicas"], 4);
    assert!(d["metadata"]["labels"].get("tier").is_none());
    let images: Vec<&str> = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .filter_map(|c| c["image"].as_str())
        .collect();
    assert_eq!(images, ["nginx:1.27", "busybox:1.36"]);
    let err = c.fails(&[
        "patch",
        "deploy",
        "web",
        "-n",
        "demo",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/nosuch"}]"#,
    ]);
    assert!(err.contains("the patch could not be applied"), "{err}");

    // get -w sees an update.
    let mut watch = c
        .command(&[
            "get",
            "deploy",
            "web",
            "-n",
            "demo",
            "-w",
            "-o",
            "jsonpath={.spec.replicas}{\"\\n\"}",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .expect("kubectl get -w");
    let mut lines = BufReader::new(watch.0.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("first").expect("line"), "4");
    c.ok(&["scale", "deploy", "web", "-n", "demo", "--replicas=7"]);
    assert_eq!(lines.next().expect("update").expect("line"), "7");
    drop(watch);

    // edit, with an editor that changes the replicas.
    let editor = c.file(
        "editor.sh",
        "#!/bin/sh\nsed -i 's/replicas: 7$/replicas: 3/' \"$1\"\n",
    );
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let out = c
        .command(&["edit", "deploy", "web", "-n", "demo"])
        .env("EDITOR", &editor)
        .output()
        .expect("kubectl edit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deployment.apps/web edited"
    );
    assert_eq!(
        json(c, &["get", "deploy", "web", "-n", "demo"])["spec"]["replicas"],
        3
    );

    // explain and describe.
    let explain = c.ok(&["explain", "deployment.spec.strategy"]);
    assert!(
        explain.contains("rollingUpdate") && explain.contains("DeploymentStrategy"),
        "{explain}"
    );
    let describe = c.ok(&["describe", "deploy", "web", "-n", "demo"]);
    assert!(
        describe.contains("RollingUpdateStrategy:  25% max unavailable, 25% max surge"),
        "{describe}"
    );
    assert!(describe.contains("nginx:1.27"), "{describe}");

    // Server-side apply: a conflict with another manager, then forced.
    let cm = c.file("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: demo\ndata:\n  a: \"1\"\n  b: \"2\"\n");
    assert_eq!(
        c.ok(&["apply", "--server-side", "-f", &cm]).trim(),
        "configmap/cfg serverside-applied"
    );
    let cm2 = c.file("cm2.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: demo\ndata:\n  a: \"9\"\n");
    let err = c.fails(&[
        "apply",
        "--server-side",
        "--field-manager=other",
        "-f",
        &cm2,
    ]);
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .data.a"),
        "{err}"
    );
    c.ok(&[
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "-f",
        &cm2,
    ]);
    let cfg = json(
        c,
        &["get", "cm", "cfg", "-n", "demo", "--show-managed-fields"],
    );
    assert_eq!(cfg["data"]["a"], "9");
    assert_eq!(
        cfg["data"]["b"], "2",
        "the first manager's other field stays"
    );
    let managers: Vec<&str> = cfg["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, ["kubectl", "other"]);
    // The first manager re-applies without `a`: it no longer owns it, and `b` it drops goes.
    let cm3 = c.file("cm3.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: demo\ndata:\n  c: \"3\"\n");
    c.ok(&["apply", "--server-side", "-f", &cm3]);
    let cfg = json(c, &["get", "cm", "cfg", "-n", "demo"]);
    assert_eq!(cfg["data"], serde_json::json!({"a": "9", "c": "3"}));

    // Field selectors and -A.
    let pods = c.file("pods.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p1\n  namespace: demo\nspec:\n  nodeName: n1\n  containers: [{name: c, image: busybox}]\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p2\n  namespace: demo\nspec:\n  containers: [{name: c, image: busybox}]\n");
    c.ok(&["create", "-f", &pods]);
    assert_eq!(
        c.ok(&[
            "get",
            "pods",
            "-n",
            "demo",
            "--field-selector",
            "spec.nodeName=n1",
            "-o",
            "name"
        ])
        .trim(),
        "pod/p1"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "pods",
            "-n",
            "demo",
            "--field-selector",
            "spec.nodeName=",
            "-o",
            "name"
        ])
        .trim(),
        "pod/p2"
    );
    let all = c.ok(&["get", "pods", "-A"]);
    assert!(
        all.starts_with("NAMESPACE") && all.contains("demo") && all.contains("Pending"),
        "{all}"
    );
    let err = c.fails(&[
        "get",
        "pods",
        "-n",
        "demo",
        "--field-selector",
        "spec.color=red",
    ]);
    assert!(
        err.contains("field label not supported: spec.color"),
        "{err}"
    );

    // Bad manifests: each gets the error a person needs, and nothing is created.
    let unknown = c.file(
        "bad1.yaml",
        &deployment("x", 1)
            .replace("replicas: 1", "replica: 1")
            .replace("name: web\n", "name: bad1\n"),
    );
    let err = c.fails(&["apply", "-f", &unknown]);
    assert!(err.contains("unknown field \"spec.replica\""), "{err}");
    let wrong_type = c.file(
        "bad2.yaml",
        &deployment("x", 1)
            .replace("replicas: 1", "replicas: three")
            .replace("name: web\n", "name: bad2\n"),
    );
    let err = c.fails(&["apply", "-f", &wrong_type]);
    assert!(
        err.contains("spec.replicas") && err.contains("invalid type"),
        "{err}"
    );
    let invalid = c.file(
        "bad3.yaml",
        &deployment("\"\"", 1).replace("name: web\n", "name: bad3\n"),
    );
    let err = c.fails(&["apply", "-f", &invalid]);
    assert!(
        err.contains("spec.template.spec.containers[0].image: Required value"),
        "{err}"
    );
    let err = c.fails(&["get", "deploy", "bad1", "bad2", "bad3", "-n", "demo"]);
    assert_eq!(
        err.matches("not found").count(),
        3,
        "nothing was created: {err}"
    );

    // dryRun changes nothing.
    let dry = c.file(
        "dry.yaml",
        &deployment("nginx", 1).replace("name: web\n", "name: dry\n"),
    );
    assert!(
        c.ok(&["apply", "--dry-run=server", "-f", &dry])
            .contains("(server dry run)")
    );
    assert!(
        c.fails(&["get", "deploy", "dry", "-n", "demo"])
            .contains("not found")
    );

    // ResourceQuota and LimitRange admission at create.
    let quota = c.file("quota.yaml", "apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: q\n  namespace: demo\nspec:\n  hard: {pods: \"4\", requests.cpu: \"1\"}\n---\napiVersion: v1\nkind: LimitRange\nmetadata:\n  name: lr\n  namespace: demo\nspec:\n  limits:\n  - type: Container\n    defaultRequest: {cpu: 400m}\n    max: {cpu: \"2\"}\n");
    c.ok(&["create", "-f", &quota]);
    let p3 = c.file("p3.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p3\n  namespace: demo\nspec:\n  containers: [{name: c, image: busybox, resources: {limits: {cpu: 800m}}}]\n");
    c.ok(&["create", "-f", &p3]);
    let p3 = json(c, &["get", "pod", "p3", "-n", "demo"]);
    assert_eq!(
        p3["spec"]["containers"][0]["resources"]["requests"]["cpu"], "800m",
        "request defaults to the limit"
    );
    let p4 = c.file("p4.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p4\n  namespace: demo\nspec:\n  containers: [{name: c, image: busybox, resources: {limits: {cpu: \"1\"}}}]\n");
    let err = c.fails(&["create", "-f", &p4]);
    assert!(
        err.contains("exceeded quota: q, requested: requests.cpu=1"),
        "{err}"
    );
    let big = c.file("p5.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p5\n  namespace: demo\nspec:\n  containers: [{name: c, image: busybox, resources: {limits: {cpu: \"3\"}}}]\n");
    let err = c.fails(&["create", "-f", &big]);
    assert!(err.contains("max cpu usage per Container is 2"), "{err}");

    // Deletion: background now; orphan and foreground wait on their finalizers.
    for (name, cascade, finalizer) in [
        ("o", "orphan", "orphan"),
        ("f", "foreground", "foregroundDeletion"),
    ] {
        let cmf = c.file(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: demo\n"
            ),
        );
        c.ok(&["create", "-f", &cmf]);
        c.ok(&[
            "delete",
            "cm",
            name,
            "-n",
            "demo",
            &format!("--cascade={cascade}"),
            "--wait=false",
        ]);
        let obj = json(c, &["get", "cm", name, "-n", "demo"]);
        assert!(obj["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(obj["metadata"]["finalizers"][0], finalizer);
        // The garbage collector's part: removing the finalizer lets it go.
        c.ok(&[
            "patch",
            "cm",
            name,
            "-n",
            "demo",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
        assert!(
            c.fails(&["get", "cm", name, "-n", "demo"])
                .contains("not found")
        );
    }
    assert_eq!(
        c.ok(&[
            "delete",
            "deploy",
            "web",
            "-n",
            "demo",
            "--cascade=background"
        ])
        .trim(),
        "deployment.apps \"web\" deleted"
    );
    assert!(
        c.fails(&["get", "deploy", "web", "-n", "demo"])
            .contains("not found")
    );
    // Namespaces: an empty one goes at once; one with content is Terminating and takes no
    // new objects (the namespace controller of the next issue empties it).
    let nss = c.file("nss.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: empty\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: full\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: full\n");
    c.ok(&["create", "-f", &nss]);
    c.ok(&["delete", "ns", "empty"]);
    assert!(c.fails(&["get", "ns", "empty"]).contains("not found"));
    c.ok(&["delete", "ns", "full", "--wait=false"]);
    assert!(c.ok(&["get", "ns", "full"]).contains("Terminating"));
    let late = c.file(
        "late.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: late\n  namespace: full\n",
    );
    let err = c.fails(&["create", "-f", &late]);
    assert!(err.contains("because it is being terminated"), "{err}");

    // drain: cordon, then evictions (protobuf) that respect disruption budgets.
    let nodes = c.file("drain.yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: n-drain\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: dr\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: loose\n  namespace: dr\nspec:\n  nodeName: n-drain\n  containers: [{name: c, image: busybox}]\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: kept\n  namespace: dr\n  labels: {app: kept}\nspec:\n  nodeName: n-drain\n  containers: [{name: c, image: busybox}]\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: keep\n  namespace: dr\nspec:\n  minAvailable: 1\n  selector: {matchLabels: {app: kept}}\n");
    c.ok(&["create", "-f", &nodes]);
    let err = c.fails(&[
        "drain",
        "n-drain",
        "--force",
        "--grace-period=0",
        "--timeout=3s",
    ]);
    assert!(
        err.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{err}"
    );
    assert!(
        c.fails(&["get", "pod", "loose", "-n", "dr"])
            .contains("not found"),
        "the unprotected pod went"
    );
    c.ok(&["get", "pod", "kept", "-n", "dr"]);
    assert_eq!(
        json(c, &["get", "node", "n-drain"])["spec"]["unschedulable"],
        true
    );
    c.ok(&["delete", "pdb", "keep", "-n", "dr"]);
    assert!(
        c.ok(&[
            "drain",
            "n-drain",
            "--force",
            "--grace-period=0",
            "--timeout=20s"
        ])
        .contains("node/n-drain drained")
    );
    assert!(
        c.fails(&["get", "pod", "kept", "-n", "dr"])
            .contains("not found")
    );

    // YAML bodies, as curl or any HTTP client may send them: a create, and a server-side apply.
    let server = c.server();
    let curl = |method: &str, path: &str, ct: &str, body: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-X", method, "--cacert"])
            .arg(c.dir.path().join("pki/ca.crt"))
            .args(["-H", &format!("Authorization: Bearer {}", c.admin_token())])
            .args(["-H", &format!("Content-Type: {ct}"), "--data-binary", body])
            .arg(format!("{server}{path}"))
            .output()
            .expect("curl");
        serde_json::from_slice::<Value>(&out.stdout).expect("a JSON answer")
    };
    let made = curl(
        "POST",
        "/api/v1/namespaces/demo/configmaps",
        "application/yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  k: v\n",
    );
    assert_eq!(made["metadata"]["name"], "from-yaml", "{made}");
    let applied = curl(
        "PATCH",
        "/api/v1/namespaces/demo/configmaps/from-yaml?fieldManager=curl",
        "application/apply-patch+yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  k: v\n  added: by-apply\n",
    );
    assert_eq!(applied["data"]["added"], "by-apply", "{applied}");
    let bad = curl(
        "POST",
        "/api/v1/namespaces/demo/configmaps",
        "application/yaml",
        "a: [1, 2",
    );
    assert_eq!(
        (bad["code"].as_i64(), bad["reason"].as_str()),
        (Some(400), Some("BadRequest")),
        "{bad}"
    );

    // Quota usage was charged at create and is refunded at delete.
    c.ok(&["delete", "pod", "p3", "-n", "demo"]);
    let q = json(c, &["get", "quota", "q", "-n", "demo"]);
    assert_eq!(q["status"]["used"]["pods"], "2");
    assert_eq!(q["status"]["used"]["requests.cpu"], "0");
}

#[test]
fn tenants_see_only_their_own_namespaces() {
    let c = Cluster::start();
    let setup = c.file("tenants.yaml", "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata:\n  name: acme\nspec:\n  namespaces: [acme-dev]\n---\napiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata:\n  name: zeta\nspec:\n  namespaces: [zeta-dev]\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: acme-dev\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: zeta-dev\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: secret-plans\n  namespace: zeta-dev\ndata: {x: \"1\"}\n");
    c.ok(&["create", "-f", &setup]);
    let token = |tenant: &str| support::tenant_token(&c, tenant);
    let acme = format!("--token={}", token("acme"));
    let acme_ok = |args: &[&str]| {
        let mut all = vec![acme.as_str()];
        all.extend_from_slice(args);
        c.ok(&all)
    };
    let acme_fails = |args: &[&str]| {
        let mut all = vec![acme.as_str()];
        all.extend_from_slice(args);
        c.fails(&all)
    };
    // Its own namespace works.
    let mine = c.file("mine.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plans\n  namespace: acme-dev\ndata: {y: \"2\"}\n");
    acme_ok(&["create", "-f", &mine]);
    // With the kube-root-ca.crt that every namespace holds (published shortly after the
    // namespace appears).
    let listed = wait_for(Duration::from_secs(30), || {
        let out = acme_ok(&["get", "cm", "-n", "acme-dev", "-o", "name"]);
        out.contains("kube-root-ca.crt").then_some(out)
    })
    .expect("the root CA published in the tenant's namespace");
    assert_eq!(listed.trim(), "configmap/kube-root-ca.crt\nconfigmap/plans");
    assert_eq!(
        acme_ok(&["get", "ns", "-o", "name"]).trim(),
        "namespace/acme-dev",
        "namespaces filtered"
    );
    acme_ok(&["get", "nodes"]);
    acme_ok(&["get", "tenant", "acme"]);

    // kubectl auth can-i asks the same authorizer.
    assert_eq!(
        acme_ok(&["auth", "can-i", "create", "pods", "-n", "acme-dev"]).trim(),
        "yes"
    );
    let out = c
        .command(&[
            acme.as_str(),
            "auth",
            "can-i",
            "create",
            "pods",
            "-n",
            "zeta-dev",
        ])
        .output()
        .expect("can-i");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("no - ") && said.contains("not one of tenant acme's namespaces"),
        "{said}"
    );
    // A typed generator (protobuf) is authorized like everything else.
    acme_ok(&[
        "create",
        "configmap",
        "typed",
        "-n",
        "acme-dev",
        "--from-literal=k=v",
    ]);
    let err = acme_fails(&[
        "create",
        "configmap",
        "typed",
        "-n",
        "zeta-dev",
        "--from-literal=k=v",
    ]);
    assert!(err.contains("forbidden"), "{err}");

    // Everything of another tenant's, or of nobody's, answers the same 403.
    let other = c.file(
        "other.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: mine-now\n  namespace: zeta-dev\n",
    );
    let refused: Vec<Vec<&str>> = vec![
        vec!["get", "cm", "-n", "zeta-dev"],
        vec!["get", "cm", "secret-plans", "-n", "zeta-dev"],
        vec!["get", "cm", "-n", "zeta-dev", "-w", "--request-timeout=5s"],
        vec!["get", "cm", "-A"],
        vec!["create", "-f", &other],
        vec!["delete", "cm", "secret-plans", "-n", "zeta-dev"],
        vec![
            "patch",
            "cm",
            "secret-plans",
            "-n",
            "zeta-dev",
            "-p",
            "{\"data\":{\"x\":\"2\"}}",
        ],
        vec!["label", "cm", "secret-plans", "-n", "zeta-dev", "a=b"],
        vec!["get", "ns", "zeta-dev"],
        vec!["delete", "ns", "zeta-dev"],
        vec!["get", "tenant", "zeta"],
        vec!["get", "tenants"],
        vec!["logs", "p", "-n", "zeta-dev"],
        vec!["delete", "node", "n1"],
    ];
    for args in &refused {
        let err = acme_fails(args);
        assert!(
            err.contains("Forbidden") || err.contains("forbidden"),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("secret-plans\" not found") && !err.contains("\"x\""),
            "{args:?} leaks: {err}"
        );
    }
    // An existing and a missing namespace of someone else look alike.
    let a = acme_fails(&["get", "cm", "anything", "-n", "zeta-dev"]);
    let b = acme_fails(&["get", "cm", "anything", "-n", "no-such-ns"]);
    assert_eq!(a.replace("zeta-dev", "NS"), b.replace("no-such-ns", "NS"));
    // The other tenant's object is untouched.
    let cm = json(&c, &["get", "cm", "secret-plans", "-n", "zeta-dev"]);
    assert_eq!(cm["data"]["x"], "1");
    assert!(cm["metadata"]["labels"].is_null());
    // A forged token is not a tenant's.
    let forged = token("acme").replace("tenant.acme.", "tenant.zeta.");
    let err = c.fails(&[&format!("--token={forged}"), "get", "cm", "-n", "zeta-dev"]);
    assert!(err.contains("You must be logged in"), "{err}");
    // Revocation: bumping the Tenant's tokenGeneration, or deleting and re-creating it,
    // refuses every token minted before; a fresh one works.
    let before = acme.clone();
    c.ok(&[
        "patch",
        "tenant",
        "acme",
        "--type=merge",
        "-p",
        r#"{"spec":{"tokenGeneration":1}}"#,
    ]);
    let err = c.fails(&[before.as_str(), "get", "cm", "-n", "acme-dev"]);
    assert!(
        err.contains("You must be logged in"),
        "revoked by the generation: {err}"
    );
    let fresh = format!("--token={}", token("acme"));
    c.ok(&[fresh.as_str(), "get", "cm", "-n", "acme-dev"]);
    c.ok(&["delete", "tenant", "acme"]);
    c.ok(&["create", "-f", &c.file("acme.yaml", "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata:\n  name: acme\nspec:\n  namespaces: [acme-dev]\n  tokenGeneration: 1\n")]);
    let err = c.fails(&[fresh.as_str(), "get", "cm", "-n", "acme-dev"]);
    assert!(
        err.contains("You must be logged in"),
        "an old token of a re-created Tenant (same name and generation, another uid): {err}"
    );
    c.ok(&[
        &format!("--token={}", token("acme")),
        "get",
        "cm",
        "-n",
        "acme-dev",
    ]);
    // The API's metrics saw the refusals.
    let metrics = wait_for(Duration::from_secs(5), || {
        let mut s = std::net::TcpStream::connect(&c.metrics_addr).ok()?;
        use std::io::{Read, Write};
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.contains("tessera_apiserver_requests_total")
            .then_some(body)
    })
    .expect("metrics");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("tessera_apiserver_requests_total") && l.contains("code=\"403\"")
        ),
        "{metrics}"
    );
    // The open metrics port names no tenant; the API port shows everything to the admin
    // and nothing to a tenant.
    assert!(!metrics.contains("user=\"tenant:"), "{metrics}");
    let full = c.ok(&["get", "--raw", "/metrics"]);
    assert!(full.contains("user=\"tenant:acme\""), "{full}");
    let err = c.fails(&[
        &format!("--token={}", token("acme")),
        "get",
        "--raw",
        "/metrics",
    ]);
    assert!(
        err.contains("Forbidden") || err.contains("forbidden"),
        "{err}"
    );
}

/// `tessera up --store etcd`: a whole shard (API, controllers, scheduler, nodes) on a real
/// etcd, driven as the README drives the embedded one; its objects live in etcd, so they
/// outlive the process; a backup is etcd's own business.
#[test]
fn tessera_up_runs_a_whole_shard_on_a_real_etcd() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let etcd = rt
        .block_on(tessera_store::testing::EtcdProcess::start())
        .expect("etcd");
    let mut c = Cluster::start_with(
        "up",
        &[
            "--store",
            "etcd",
            "--etcd-servers",
            &etcd.url(),
            "--nodes-per-shard=5",
        ],
    );
    assert!(
        c.banner
            .iter()
            .any(|l| l.contains("store:") && l.contains("etcd")),
        "{:?}",
        c.banner
    );
    c.ok(&["create", "namespace", "demo"]);
    c.deploy("demo", "web", 6);
    let nodes = c.ok(&[
        "get",
        "pods",
        "-n",
        "demo",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    assert_eq!(nodes.split_whitespace().count(), 6, "{nodes}");
    assert!(
        nodes.split_whitespace().all(|n| n.starts_with("sim-node-")),
        "{nodes}"
    );
    c.ok(&[
        "set",
        "image",
        "deployment/web",
        "-n",
        "demo",
        "nginx=nginx:1.28",
    ]);
    c.rollout("demo", "web");
    c.ok(&["scale", "deployment/web", "-n", "demo", "--replicas=2"]);
    let scaled = wait_for(Duration::from_secs(60), || {
        let out = c.ok(&["get", "pods", "-n", "demo", "--no-headers"]);
        (out.lines().filter(|l| l.contains("Running")).count() == 2 && !out.contains("Terminating"))
            .then_some(())
    });
    assert!(scaled.is_some(), "{}", c.ok(&["get", "pods", "-n", "demo"]));

    // Killed and started again: everything is read back from etcd.
    c.kill_and_restart();
    let image = c.ok(&[
        "get",
        "deployment",
        "web",
        "-n",
        "demo",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "nginx:1.28");
    c.rollout("demo", "web");
    // Backups of an etcd store are etcd's: the API says which tool to use.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["store", "backup", "--out"])
        .arg(c.dir.path().join("x.backup"))
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .output()
        .expect("backup");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("etcdctl snapshot save"),
        "{err}"
    );
    drop(c);
    drop(etcd);
}
