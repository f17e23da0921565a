"""Exec through the official Python client (`kubernetes` on PyPI), which speaks the WebSocket
protocol `v4.channel.k8s.io` (kubectl speaks v5): output, the exit code from the error
channel, stdin. Run by tests/streams.rs against `tessera up` with a running process pod:

    python exec_scenario.py KUBECONFIG NAMESPACE POD

Prints one line per step and exits non-zero at the first step that goes wrong.
"""
import sys
import time

from kubernetes import client, config
from kubernetes.stream import stream

kubeconfig, ns, pod = sys.argv[1:4]
core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))

out = stream(core.connect_get_namespaced_pod_exec, pod, ns,
             command=["sh", "-c", "echo from-python; echo $GREETING"],
             stderr=True, stdin=False, stdout=True, tty=False)
assert out == "from-python\nhello-from-env\n", repr(out)
print("output read")

resp = stream(core.connect_get_namespaced_pod_exec, pod, ns,
              command=["sh", "-c", "read line; echo got-$line; echo oops >&2; exit 7"],
              stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
resp.write_stdin("typed\n")
stdout, stderr = "", ""
deadline = time.monotonic() + 30
while resp.is_open():
    assert time.monotonic() < deadline, ("the exec did not end", stdout, stderr)
    resp.update(timeout=1)
    stdout += resp.read_stdout()
    stderr += resp.read_stderr()
resp.close()
assert stdout == "got-typed\n", repr(stdout)
assert stderr == "oops\n", repr(stderr)
assert resp.returncode == 7, resp.returncode
print("stdin written, streams apart, exit code 7")
print("ok")
