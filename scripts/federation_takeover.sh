#!/usr/bin/env bash
# Measures how long a leader-elected federation is without a leader: two `tessera federation
# --leader-elect` processes on one etcd, a shard joined with both addresses; the leader is
# killed (SIGKILL) and the time until the standby is ready, and until the shard is Ready
# there, is printed. Run from the repository root after `cargo build --release`:
#   scripts/federation_takeover.sh [runs]           # the default Lease timings (15/10/2 s)
#   LD=3 RD=2 RP=0.5 scripts/federation_takeover.sh # --lease-duration/--renew-deadline/--retry-period
#   SIGNAL=TERM scripts/federation_takeover.sh      # the leader stopped (as on pod deletion), not killed
# Needs etcd and kubectl; binds loopback ports 24790, 24800, 29460 and 29461.
set -euo pipefail
tessera=$PWD/target/release/tessera
[[ -x $tessera ]] || { echo "build first: cargo build --release" >&2; exit 1; }
runs=${1:-3}
LD=${LD:-15} RD=${RD:-10} RP=${RP:-2}

one_run() {
  local w pids=()
  w=$(mktemp -d)
  trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$w"' RETURN
  cd "$w"
  etcd --name e --data-dir e --listen-client-urls http://127.0.0.1:24790 \
    --advertise-client-urls http://127.0.0.1:24790 --listen-peer-urls http://127.0.0.1:24800 \
    --initial-advertise-peer-urls http://127.0.0.1:24800 --initial-cluster e=http://127.0.0.1:24800 \
    --log-level error >etcd.log 2>&1 &
  pids+=($!)
  "$tessera" certs init --pki-dir pki --federation >/dev/null
  local fed=()
  for i in 0 1; do
    TESSERA_LOG=error "$tessera" federation --data-dir "f$i" --pki-dir pki --api-addr 127.0.0.1:0 \
      --metrics-addr 127.0.0.1:0 --grpc-addr "127.0.0.1:2946$i" --store etcd \
      --etcd-servers http://127.0.0.1:24790 --leader-elect=true --identity "fed-$i" \
      --lease-duration "$LD" --renew-deadline "$RD" --retry-period "$RP" >"f$i.out" 2>&1 &
    pids+=($!); fed+=($!)
  done
  TESSERA_LOG=error "$tessera" up --shards 0 --nodes-per-shard 50 --data-dir s --api-addr 127.0.0.1:0 \
    --metrics-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 >s.out 2>&1 &
  pids+=($!)
  until [[ -f s/kubeconfig ]]; do sleep 0.2; done
  TESSERA_LOG=error "$tessera" join --federation https://127.0.0.1:29460,https://127.0.0.1:29461 \
    --federation-ca pki/ca.crt --token-file pki/join.token --name shard-a --kubeconfig s/kubeconfig \
    --metrics-addr 127.0.0.1:0 >j.out 2>&1 &
  pids+=($!)
  ready() { kubectl --kubeconfig "f$1/kubeconfig" get --raw /readyz >/dev/null 2>&1; }
  shard_ready() { kubectl --kubeconfig "f$1/kubeconfig" get shards --no-headers 2>/dev/null | grep -q " True "; }
  local leader=
  until [[ -n $leader ]]; do
    if ready 0; then leader=0; elif ready 1; then leader=1; else sleep 0.2; fi
  done
  local other=$((1 - leader))
  until shard_ready "$leader"; do sleep 0.2; done
  local start t_ready t_shard
  start=$(date +%s.%N)
  kill -"${SIGNAL:-KILL}" "${fed[$leader]}"
  until ready "$other"; do sleep 0.05; done
  t_ready=$(date +%s.%N)
  until shard_ready "$other"; do sleep 0.05; done
  t_shard=$(date +%s.%N)
  printf 'SIG%s, lease %ss, renew %ss, retry %ss: standby ready after %.2f s; the shard Ready there after %.2f s\n' \
    "${SIGNAL:-KILL}" "$LD" "$RD" "$RP" "$(echo "$t_ready - $start" | bc)" "$(echo "$t_shard - $start" | bc)"
  cd - >/dev/null
}

for _ in $(seq "$runs"); do one_run; done
