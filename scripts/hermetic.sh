#!/usr/bin/env bash
# Runs a command where the system's protoc and Protocol Buffers includes cannot be seen, so a
# build that still reached for them fails instead of passing on a machine that happens to have
# them (as the package libprotobuf-dev once hid a broken set-up). It hides every `protoc` on
# the PATH and /usr/include/google and /usr/local/include/google in a private mount namespace
# and clears PROTOC/PROTOC_INCLUDE, so the build can only use the stand-in that
# .cargo/config.toml names.
#
#   scripts/hermetic.sh cargo test --workspace
set -euo pipefail

if [[ -z ${TESSERA_HERMETIC:-} ]]; then
  export TESSERA_HERMETIC=1
  if unshare --mount --propagation private true 2>/dev/null; then
    exec unshare --mount --propagation private "$0" "$@"
  elif unshare --user --map-root-user --mount true 2>/dev/null; then
    exec unshare --user --map-root-user --mount "$0" "$@"
  fi
  echo "hermetic: no mount namespace available here (needs root or user namespaces);" \
    "running without hiding the system protoc" >&2
  unset PROTOC PROTOC_INCLUDE
  exec "$@"
fi

for dir in /usr/include/google /usr/local/include/google; do
  if [[ -d $dir ]]; then
    mount -t tmpfs -o ro,size=4k tessera-hidden "$dir"
    echo "hermetic: hid $dir" >&2
  fi
done
while read -r bin; do
  [[ -n $bin ]] || continue
  mount --bind /dev/null "$(readlink -f "$bin")"
  echo "hermetic: hid $bin" >&2
done < <(type -ap protoc | sort -u)
unset PROTOC PROTOC_INCLUDE
exec "$@"
