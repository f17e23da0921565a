#!/usr/bin/env bash
# Installs what building and testing Tessera needs on a fresh Debian machine with Rust:
#   a C toolchain  - rustc links with `cc`; ring and mimalloc compile C (gcc, libc6-dev);
#   tessera-protoc - etcd-client's build script compiles etcd's .proto files through the
#                    program named by PROTOC; .cargo/config.toml names this one, built here
#                    from tools/protoc (protox, pure Rust, with the well-known types inside),
#                    so the build reads no system protoc and no /usr/include/google;
#   etcd           - (tests only) the tests and `tessera bench store --backend etcd` run real
#                    etcd processes;
#   curl, procps   - (tests only) the end-to-end tests call them;
#   iproute2       - (tests, and process nodes) the sandbox brings a pod's loopback up with
#                    `ip link set lo up` inside its network namespace;
#   iptables       - (tests only) the failover test cuts a shard off from the federation
#                    with DROP rules inside a network namespace of its own;
#   prometheus     - (tests only) the monitoring test scrapes a running fleet with a real
#                    Prometheus (Debian's 2.42; its service is not started) and checks the
#                    metrics, rules and alert tests with promtool;
#   .tools/venv    - (tests only) a Python virtualenv with the pinned tools of
#                    scripts/requirements.txt: the Grafana foundation SDK the dashboard is
#                    generated with, and Helm's engine, kubernetes-validate and yamllint
#                    for the chart's checks (python3-venv is installed if `python3 -m venv`
#                    fails).
# kubectl 1.32 is expected on the machine already; the kubectl tests say so if it is not.
# Safe to run again: it installs only what is missing.
#
#   scripts/setup.sh               everything the tests need
#   scripts/setup.sh --build-only  only what `cargo build` needs
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=false
if [[ "${1:-}" == "--build-only" ]]; then build_only=true; fi

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if ! $build_only; then
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  command -v kill >/dev/null 2>&1 || need+=(procps)
  command -v ip >/dev/null 2>&1 || [[ -x /usr/sbin/ip || -x /sbin/ip ]] || need+=(iproute2)
  command -v iptables >/dev/null 2>&1 || [[ -x /usr/sbin/iptables ]] || need+=(iptables)
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  if [[ ! -x .tools/venv/bin/python ]] && ! python3 -m venv --without-pip "$(mktemp -d)/probe" >/dev/null 2>&1; then
    need+=(python3-venv)
  fi
fi

if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  # Packages with services (etcd, Prometheus) must not start them: on a machine without
  # systemd, Debian's scripts would start them at once, listening on every interface.
  # policy-rc.d says no to every start while this install runs (kept if one was there).
  made_policy=false
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    made_policy=true
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  if $made_policy; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
  # Debian starts an etcd service on install; the tests start their own on free ports.
  # Debian starts etcd and Prometheus services on install (where an init system runs);
  # the tests start their own, on loopback and free ports.
  for service in etcd prometheus; do
    if [[ " ${need[*]} " == *" $service"* ]] && command -v systemctl >/dev/null 2>&1; then
      $SUDO systemctl disable --now "$service" >/dev/null 2>&1 || true
    fi
  done
fi

# The Python tools, pinned, in a virtualenv of the project's own (made again when the pins
# change).
if ! $build_only; then
  venv=.tools/venv
  if [[ ! -x $venv/bin/python ]] || [[ scripts/requirements.txt -nt $venv/.installed ]]; then
    echo "setup: installing scripts/requirements.txt into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements.txt
    touch "$venv/.installed"
  fi
fi

# The protoc stand-in, rebuilt when its source is newer than the installed binary.
protoc=.tools/bin/tessera-protoc
if [[ ! -x $protoc ]] || [[ -n $(find tools/protoc Cargo.lock -newer "$protoc" -type f 2>/dev/null | head -1) ]]; then
  echo "setup: building the protoc stand-in (tools/protoc) into $protoc" >&2
  cargo install --quiet --locked --force --path tools/protoc --root .tools 2>&1 |
    grep -v "be sure to add" >&2 || true
fi
# Prove it does what etcd-client's build asks: a file that imports a well-known type.
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
printf 'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\nmessage M { google.protobuf.FileDescriptorProto f = 1; }\n' >"$check/m.proto"
if ! "$protoc" --include_imports -o "$check/set" -I "$check" "$check/m.proto"; then
  echo "setup: $protoc cannot compile a .proto that imports google/protobuf/descriptor.proto" >&2
  exit 1
fi

echo "setup: cc $(cc -dumpversion); protoc stand-in $protoc; etcd $(etcd --version 2>/dev/null | head -1 | cut -d' ' -f3 || echo 'not installed'); kubectl $(kubectl version --client -o json 2>/dev/null | grep -m1 gitVersion | cut -d'"' -f4 || echo 'not installed'); promtool $(promtool --version 2>/dev/null | head -1 | cut -d' ' -f3 || echo 'not installed')" >&2
