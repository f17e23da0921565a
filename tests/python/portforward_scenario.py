"""Port-forward through the official Python client (`kubernetes` on PyPI), which speaks the
WebSocket channel protocol (`v4.channel.k8s.io`, ports in the query) rather than kubectl's
SPDY tunnel. Run by tests/streams.rs against `tessera up` with a pod serving HTTP on 8080:

    python portforward_scenario.py KUBECONFIG NAMESPACE POD

Prints one line per step and exits non-zero at the first step that goes wrong.
"""
import sys

from kubernetes import client, config
from kubernetes.stream import portforward

kubeconfig, ns, pod = sys.argv[1:4]
core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))

pf = portforward(core.connect_get_namespaced_pod_portforward, pod, ns, ports="8080")
sock = pf.socket(8080)
sock.settimeout(30)
sock.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
answer = b""
while True:
    piece = sock.recv(65536)
    if not piece:
        break
    answer += piece
sock.close()
assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
assert b"served-from-the-pod" in answer, answer[-200:]
assert pf.error(8080) is None, pf.error(8080)
print("an HTTP answer through the forward")
print("ok")
