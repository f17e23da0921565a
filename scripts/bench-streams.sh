#!/usr/bin/env bash
# Measures exec and port-forward into a process pod with the real kubectl, against a
# `tessera up` (release build) with one process node: exec round trips, exec output
# throughput both ways, port-forward throughput over the WebSocket tunnel and over plain
# SPDY. With `federation` as the third argument the node is in shard-0 of a federation and
# every measurement goes through the federation (the streams tunnelled over the shard's
# gRPC stream). Needs root (the sandbox), kubectl, curl and python3. Bounded: every step has
# a timeout.
#
#   cargo build --release && sudo scripts/bench-streams.sh [execs=50] [MiB=256] [shard|federation]
set -euo pipefail
cd "$(dirname "$0")/.."
execs=${1:-50}
mib=${2:-256}
mode=${3:-shard}
case "$mode" in
  shard) shards=0 node=proc-0 home=() ;;
  federation) shards=1 node=shard-0-proc-0 home=(--context shard-0) ;;
  *) echo "mode: shard or federation, not $mode" >&2; exit 2 ;;
esac
bin=./target/release/tessera
dir=$(mktemp -d)
# The pod is deleted before the node goes, so none of its processes outlive the run.
trap 'kubectl "${home[@]}" delete pod bench --wait --timeout=30s >/dev/null 2>&1 || true; kill "$up" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$bin" up --data-dir "$dir/data" --api-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 \
  --grpc-addr 127.0.0.1:0 --shards "$shards" --nodes-per-shard 0 --process-nodes 1 >"$dir/up.log" 2>&1 &
up=$!
export KUBECONFIG=$dir/data/kubeconfig
for _ in $(seq 100); do grep -q "Press Ctrl-C" "$dir/up.log" && break; sleep 0.2; done
if [ "$mode" = federation ]; then
  for _ in $(seq 100); do kubectl "${home[@]}" get node "$node" >/dev/null 2>&1 && break; sleep 0.2; done
fi
cat <<EOF | kubectl "${home[@]}" apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: bench}
spec:
  nodeName: $node
  containers:
  - name: main
    image: busybox
    command: [sh, -c, "head -c ${mib}M /dev/zero > /tmp/blob && cd /tmp && exec python3 -m http.server 8080 --bind 127.0.0.1"]
    ports: [{containerPort: 8080}]
EOF
kubectl "${home[@]}" wait --for=condition=Ready pod/bench --timeout=60s >/dev/null
for _ in $(seq 100); do
  kubectl exec bench -- python3 -c "import socket; socket.create_connection(('127.0.0.1', 8080))" 2>/dev/null && break
  sleep 0.2
done

ms() { date +%s%N; }
per() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.1f", (b - a) / 1e6 / n }'; }
mibs() { awk -v bytes="$1" -v ns="$2" 'BEGIN { printf "%.1f", bytes / 1048576 / (ns / 1e9) }'; }

t0=$(ms)
for _ in $(seq "$execs"); do kubectl get pod bench -o name >/dev/null; done
t1=$(ms)
for _ in $(seq "$execs"); do kubectl exec bench -- true; done
t2=$(ms)
echo "kubectl get pod (baseline): $(per "$t0" "$t1" "$execs") ms each over $execs"
echo "kubectl exec -- true:       $(per "$t1" "$t2" "$execs") ms each over $execs"

t0=$(ms)
bytes=$(kubectl exec bench -- cat /tmp/blob | wc -c)
t1=$(ms)
echo "exec output: $bytes bytes in $(per "$t0" "$t1" 1) ms = $(mibs "$bytes" $((t1 - t0))) MiB/s"
t0=$(ms)
bytes=$(head -c "${mib}M" /dev/zero | kubectl exec -i bench -- wc -c)
t1=$(ms)
echo "exec input:  $bytes bytes in $(per "$t0" "$t1" 1) ms = $(mibs "$bytes" $((t1 - t0))) MiB/s"

forward() {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  env "$@" kubectl port-forward pod/bench "$port:8080" >"$dir/pf.log" 2>&1 &
  local pf=$!
  for _ in $(seq 100); do grep -q Forwarding "$dir/pf.log" && break; sleep 0.1; done
  curl -s -o /dev/null -w '%{size_download} %{speed_download}\n' --max-time 120 "http://127.0.0.1:$port/blob"
  kill "$pf"
  wait "$pf" 2>/dev/null || true
}
read -r size speed < <(forward KUBECTL_PORT_FORWARD_WEBSOCKETS=true)
echo "port-forward (WebSocket tunnel): $size bytes at $(mibs "$speed" 1000000000) MiB/s"
read -r size speed < <(forward KUBECTL_PORT_FORWARD_WEBSOCKETS=false)
echo "port-forward (SPDY):             $size bytes at $(mibs "$speed" 1000000000) MiB/s"
