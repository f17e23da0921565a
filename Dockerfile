# The image the Helm chart runs: the `tessera` binary built on a Debian 12 machine
# (`./scripts/setup.sh --build-only && cargo build --release`), on Debian 12's slim base
# (the same C library). Build it from the repository root:
#   docker build -t tessera:0.1.0 .
# Not built in CI (its machine has no container runtime).
FROM debian:bookworm-slim
COPY target/release/tessera /usr/local/bin/tessera
# Control-plane processes run as this user (the chart's securityContext says the same); the
# node agent's DaemonSet runs as root, privileged, to sandbox containers.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera"]
