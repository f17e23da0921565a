//! `kubectl exec` and `kubectl port-forward` into pods on a process node, with the real
//! kubectl 1.32 (WebSocket `v5.channel.k8s.io` for exec, SPDY tunnelled in a WebSocket for
//! port-forward), through the API server to the node's agent — and who may not.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{Cluster, fed, http_get, said, wait_for};

/// A pod on `proc-0` running `script` (in the sandbox) that tolerates nothing: it is placed
/// by name.
fn pod(c: &Cluster, ns: &str, name: &str, script: &str) {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  nodeName: proc-0\n  containers:\n  - name: main\n    image: busybox\n    command: [sh, -c, {script:?}]\n    env: [{{name: GREETING, value: hello-from-env}}]\n    ports: [{{containerPort: 8080}}]\n"
    );
    let file = c.file(&format!("{ns}-{name}.yaml"), &yaml);
    c.ok(&["apply", "-f", &file]);
    let running = || {
        c.ok(&[
            "get",
            "pod",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.containerStatuses[0].state.running.startedAt}",
        ])
    };
    assert!(
        wait_for(Duration::from_secs(60), || (!running().is_empty())
            .then_some(()))
        .is_some(),
        "{name} runs: {}",
        c.ok(&["get", "pod", name, "-n", ns, "-o", "yaml"])
    );
}

#[test]
fn kubectl_exec_runs_in_the_container_and_returns_output_and_exit_code() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=1", "--process-nodes=1"]);
    assert!(
        wait_for(Duration::from_secs(60), || {
            c.ok(&["get", "node", "proc-0", "-o", "name"])
                .contains("proc-0")
                .then_some(())
        })
        .is_some()
    );
    c.ok(&["create", "namespace", "t1"]);
    pod(&c, "t1", "shell", "sleep 3600");

    // Output on both streams, the container's environment, and the exit code.
    let out = c.kubectl(&[
        "exec",
        "-n",
        "t1",
        "shell",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; echo $GREETING; exit 3",
    ]);
    let (code, stdout, stderr) = said(&out);
    assert_eq!(
        code,
        Some(3),
        "kubectl exits with the command's code: {stderr}"
    );
    assert_eq!(stdout, "out\nhello-from-env\n");
    assert!(stderr.starts_with("err\n"), "{stderr}");
    assert!(
        stderr.contains("command terminated with exit code 3"),
        "{stderr}"
    );

    // Inside the container's sandbox: its host name, its own PID namespace (its init is 1),
    // its root (nothing of the agent's data directory).
    let inside = c.ok(&[
        "exec",
        "-n",
        "t1",
        "shell",
        "--",
        "sh",
        "-c",
        "hostname; cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /",
    ]);
    let mut lines = inside.lines();
    assert_eq!(lines.next(), Some("shell"), "{inside}");
    let init = lines.next().unwrap_or_default();
    assert!(
        init.contains("init"),
        "PID 1 is the container's init: {inside}"
    );
    let data_dir = c.dir.path().display().to_string();
    assert!(
        !inside.contains(&data_dir) && !inside.contains("kubeconfig"),
        "{inside}"
    );

    // Standard input, to its end (the v5 close signal).
    let (code, stdout, stderr) = said(&fed(
        &mut c.command(&[
            "exec",
            "-i",
            "-n",
            "t1",
            "shell",
            "--",
            "sh",
            "-c",
            "wc -l; cat",
        ]),
        b"one\ntwo\nthree\n",
        "kubectl exec -i",
    ));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "3", "wc saw all of stdin, then its end");

    // A terminal (kubectl -t needs one of its own: `script` gives it one).
    let tty = Command::new("script")
        .args(["-qec"])
        .arg(format!(
            "kubectl --kubeconfig {} exec -it -n t1 shell -- sh -c 'test -t 0 && echo on-a-terminal; exit 5'",
            c.kubeconfig.display()
        ))
        .arg("/dev/null")
        .stdin(Stdio::piped())
        .output()
        .expect("script");
    let (code, stdout, stderr) = said(&tty);
    assert!(stdout.contains("on-a-terminal"), "{stdout}{stderr}");
    assert_eq!(code, Some(5), "{stdout}{stderr}");

    // Clients that fall back to SPDY (kubectl before 1.30, or with WebSockets turned off)
    // get the same: v4.channel.k8s.io, a SPDY stream per channel.
    let (code, stdout, stderr) = said(&fed(
        c.command(&[
            "exec",
            "-i",
            "-n",
            "t1",
            "shell",
            "--",
            "sh",
            "-c",
            "echo via-spdy; wc -c; exit 4",
        ])
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
        b"12345",
        "kubectl exec over SPDY",
    ));
    assert_eq!(code, Some(4), "{stderr}");
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["via-spdy", "5"],
        "{stderr}"
    );

    // Attach: `kubectl run -i` sends stdin to a new pod's shell (stdinOnce closes it at the
    // end of input), shows what it prints, and the pod goes with --rm.
    let (code, stdout, stderr) = said(&fed(
        &mut c.command(&[
            "run",
            "-i",
            "--rm",
            "--restart=Never",
            "-n",
            "t1",
            "once",
            "--image=busybox",
            "--overrides={\"spec\":{\"nodeName\":\"proc-0\"}}",
            "--",
            "sh",
        ]),
        b"echo typed-into-run\nexit 0\n",
        "kubectl run -i",
    ));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("typed-into-run"), "{stdout}{stderr}");
    // `kubectl attach` to a running pod shows its output from then on.
    pod(
        &c,
        "t1",
        "ticker",
        "while true; do echo tick; sleep 0.2; done",
    );
    let out = Command::new("timeout")
        .args(["3", "kubectl", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .args(["attach", "-n", "t1", "ticker"])
        .output()
        .expect("kubectl attach");
    let (_, stdout, stderr) = said(&out);
    assert!(stdout.matches("tick").count() >= 3, "{stdout}{stderr}");

    // The node counted them, by kind and transport.
    let metrics = http_get(&c.metrics_addr, "/metrics").expect("metrics");
    let sessions = |kind: &str, transport: &str| {
        count(
            &metrics,
            &format!(
                "tessera_agent_stream_sessions_total{{kind=\"{kind}\",node=\"proc-0\",transport=\"{transport}\"}}"
            ),
        )
    };
    assert!(sessions("exec", "websocket") >= 4, "{metrics}");
    assert_eq!(sessions("exec", "spdy"), 1, "{metrics}");
    assert!(sessions("attach", "websocket") >= 2, "{metrics}");

    // The official Python client speaks v4.channel.k8s.io.
    support::python_scenario(&c, "exec_scenario.py", &["t1", "shell"]);

    // A command that is not there: 127, as a shell says.
    let out = c.kubectl(&["exec", "-n", "t1", "shell", "--", "no-such-command"]);
    let (code, _, stderr) = said(&out);
    assert_eq!(code, Some(127), "{stderr}");
    assert!(stderr.contains("no-such-command"), "{stderr}");

    // Clear refusals: a missing pod, a container it does not have, a simulated node.
    let e = c.fails(&["exec", "-n", "t1", "ghost", "--", "true"]);
    assert!(e.contains("NotFound") || e.contains("not found"), "{e}");
    let e = c.fails(&["exec", "-n", "t1", "shell", "-c", "side", "--", "true"]);
    assert!(e.contains("container side is not valid"), "{e}");
    // (The process node's taint keeps it on the simulated one.)
    c.ok(&["run", "simmed", "-n", "t1", "--image=nginx"]);
    let on_sim = || {
        c.ok(&[
            "get",
            "pod",
            "simmed",
            "-n",
            "t1",
            "-o",
            "jsonpath={.status.phase}",
        ])
    };
    assert!(
        wait_for(Duration::from_secs(30), || (on_sim() == "Running")
            .then_some(()))
        .is_some()
    );
    let e = c.fails(&["exec", "-n", "t1", "simmed", "--", "true"]);
    assert!(e.contains("simulated nodes"), "{e}");

    // Who may: a user with `get pods` but not `create pods/exec` is refused; with it, in.
    let bob = support::token(&c, &["--user", "bob"]);
    let flag = format!("--token={bob}");
    let role = c.file(
        "role.yaml",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: viewer, namespace: t1}\nrules:\n- apiGroups: ['']\n  resources: [pods]\n  verbs: [get, list]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bob-views, namespace: t1}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: viewer}\nsubjects: [{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}]\n",
    );
    c.ok(&["apply", "-f", &role]);
    let e = c.fails(&[&flag, "exec", "-n", "t1", "shell", "--", "true"]);
    assert!(
        e.contains("cannot create resource \"pods/exec\""),
        "refused with Kubernetes' message: {e}"
    );
    c.ok(&[
        "create",
        "role",
        "execer",
        "-n",
        "t1",
        "--verb=create",
        "--resource=pods/exec",
    ]);
    c.ok(&[
        "create",
        "rolebinding",
        "bob-execs",
        "-n",
        "t1",
        "--role=execer",
        "--user=bob",
    ]);
    let ok = wait_for(Duration::from_secs(10), || {
        let out = c.kubectl(&[&flag, "exec", "-n", "t1", "shell", "--", "echo", "bob-in"]);
        (String::from_utf8_lossy(&out.stdout) == "bob-in\n").then_some(())
    });
    assert!(ok.is_some(), "bob execs once the role allows it");
}

#[test]
fn tenants_exec_only_into_their_own_pods() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=0", "--process-nodes=1"]);
    let setup = c.file(
        "tenants.yaml",
        "apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: acme}\nspec: {namespaces: [acme-dev], processNodes: true}\n---\n\
         apiVersion: tessera.io/v1alpha1\nkind: Tenant\nmetadata: {name: zeta}\nspec: {namespaces: [zeta-dev], processNodes: true}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: acme-dev}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: zeta-dev}\n",
    );
    c.ok(&["create", "-f", &setup]);
    pod(
        &c,
        "zeta-dev",
        "vault",
        "echo s3cret > /tmp/key; sleep 3600",
    );
    pod(&c, "acme-dev", "mine", "sleep 3600");
    let acme = support::tenant_token(&c, "acme");
    let flag = format!("--token={acme}");
    // Into its own pod: yes, as the container (not the host's root).
    let out = c.kubectl(&[
        &flag,
        "exec",
        "-n",
        "acme-dev",
        "mine",
        "--",
        "cat",
        "/proc/self/uid_map",
    ]);
    let (code, stdout, stderr) = said(&out);
    assert_eq!(code, Some(0), "{stderr}");
    let host_base: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a uid map");
    assert!(host_base > 0, "container root is not host root: {stdout}");
    // Into another tenant's: refused before anything reaches the node.
    for args in [
        vec!["exec", "-n", "zeta-dev", "vault", "--", "cat", "/tmp/key"],
        vec!["port-forward", "-n", "zeta-dev", "pod/vault", "18999:8080"],
    ] {
        let mut all = vec![flag.as_str()];
        all.extend(args.iter());
        let out = c.kubectl(&all);
        let (code, stdout, stderr) = said(&out);
        assert_ne!(code, Some(0), "{args:?}: {stdout}");
        assert!(
            stderr.contains("Forbidden") || stderr.contains("forbidden"),
            "{args:?}: {stderr}"
        );
        assert!(!stdout.contains("s3cret") && !stderr.contains("s3cret"));
    }
    // Its own pod's files are not another pod's: the other pod's /tmp is its own.
    let out = c.kubectl(&[
        &flag, "exec", "-n", "acme-dev", "mine", "--", "cat", "/tmp/key",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cret"));
}

#[test]
fn kubectl_port_forward_reaches_a_process_pods_port() {
    let c = Cluster::start_with("up", &["--nodes-per-shard=0", "--process-nodes=1"]);
    c.ok(&["create", "namespace", "web"]);
    // A server on the pod's own loopback (its network namespace): reachable only through
    // the forward.
    pod(
        &c,
        "web",
        "site",
        "mkdir -p /tmp/www && echo served-from-the-pod > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8080 --bind 127.0.0.1",
    );
    // The server listens once python has started.
    assert!(
        c.listens("web", "site", 8080, Duration::from_secs(30)),
        "the pod's server listens"
    );
    let local = support::free_addr();
    let port = local.rsplit(':').next().expect("port").to_owned();
    let dead = support::free_addr();
    let dead_port = dead.rsplit(':').next().expect("port").to_owned();
    let mut forward = c
        .command(&[
            "port-forward",
            "-n",
            "web",
            "pod/site",
            &format!("{port}:8080"),
            &format!("{dead_port}:9"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(support::Running)
        .expect("kubectl port-forward");
    // The Python client's WebSocket channel protocol (v4.channel.k8s.io).
    support::python_scenario(&c, "portforward_scenario.py", &["web", "site"]);

    // The same over SPDY directly (kubectl with its WebSocket tunnel turned off).
    let spdy_local = support::free_addr();
    let spdy_port = spdy_local.rsplit(':').next().expect("port").to_owned();
    let mut spdy_forward = c
        .command(&[
            "port-forward",
            "-n",
            "web",
            "pod/site",
            &format!("{spdy_port}:8080"),
        ])
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")
        .stdout(Stdio::piped())
        .spawn()
        .map(support::Running)
        .expect("kubectl port-forward over SPDY");
    let mut spdy_lines = BufReader::new(spdy_forward.0.stdout.take().expect("stdout")).lines();
    let first = spdy_lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.starts_with("Forwarding from 127.0.0.1:"), "{first}");
    let body = http_get(&spdy_local, "/").expect("through the SPDY forward");
    assert!(body.contains("served-from-the-pod"), "{body}");
    drop(spdy_forward);

    let out = forward.0.stdout.take().expect("stdout");
    let mut lines = BufReader::new(out).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.starts_with("Forwarding from 127.0.0.1:"), "{first}");
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    let err = forward.0.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // Several connections, one after another and at once.
    for _ in 0..3 {
        let body = http_get(&local, "/").expect("through the forward");
        assert!(body.starts_with("HTTP/1.0 200"), "{body}");
        assert!(body.contains("served-from-the-pod"), "{body}");
    }
    let many: Vec<_> = (0..4)
        .map(|_| {
            let local = local.clone();
            std::thread::spawn(move || http_get(&local, "/index.html"))
        })
        .collect();
    for t in many {
        let body = t.join().expect("thread").expect("through the forward");
        assert!(body.contains("served-from-the-pod"), "{body}");
    }
    // A port nothing listens on in the pod: that connection ends empty and kubectl says
    // why — then gives up the whole forward, as kubectl 1.32 does against any kubelet.
    let nothing = http_get(&dead, "/").unwrap_or_default();
    assert!(!nothing.contains("HTTP/1.0 200"), "{nothing}");
    let mut stderr = Vec::new();
    let why = wait_for(Duration::from_secs(10), || {
        stderr.extend(rx.try_iter());
        stderr
            .iter()
            .any(|l| l.contains("error forwarding port 9 to pod site"))
            .then_some(())
    });
    assert!(
        why.is_some(),
        "kubectl reports the pod-side failure: {stderr:?}"
    );
    let metrics = http_get(&c.metrics_addr, "/metrics").expect("metrics");
    let forwards = |result: &str| {
        count(
            &metrics,
            &format!(
                "tessera_agent_portforward_connections_total{{node=\"proc-0\",result=\"{result}\"}}"
            ),
        )
    };
    assert!(forwards("forwarded") >= 9, "{metrics}");
    assert_eq!(forwards("failed"), 1, "{metrics}");
}

/// The value of the first series in `metrics` that starts with `series`.
fn count(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}
