#!/usr/bin/env bash
# Installs what building and testing Tessera needs on a fresh Debian machine:
#   protoc      - etcd-client's build script compiles etcd's .proto files with it;
#   etcd 3.4    - the tests and `tessera bench store --backend etcd` run real etcd processes.
# Safe to run again: it installs only what is missing.
set -euo pipefail

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [[ "${1:-}" != "--build-only" ]]; then
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
fi

if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts an etcd service on install; the tests start their own on free ports.
  if [[ " ${need[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --now etcd >/dev/null 2>&1 || true
  fi
fi
echo "setup: protoc $(protoc --version 2>/dev/null | cut -d' ' -f2); etcd $(etcd --version 2>/dev/null | head -1 | cut -d' ' -f3 || echo 'not installed')" >&2
