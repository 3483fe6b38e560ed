#!/usr/bin/env bash
# Builds the operator image the way CI does, with no container engine and no image registry:
#
#   1. a minimal Debian bookworm rootfs with python3 + python3-venv from Debian packages (debootstrap),
#      cached under $CACHE/rootfs, committed once as a local base image;
#   2. images/operator/Dockerfile built on that base with buildah (vfs storage, chroot isolation),
#      passing --build-arg BASE_IMAGE=<that base> (the same Dockerfile users build with docker);
#   3. `dynamo-operator --help` run inside the built image, as the image's non-root user.
#
# Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap). buildah's storage
# lives in $CACHE/buildah, so a second run reuses the base image and the cached layers.
#
#   bash hack/build-operator-image.sh            # prints the image name on the last line
#
# Environment (all optional):
#   DYNAMO_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/dynamo-sglang)
#   DEBIAN_MIRROR  Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   IMAGE          name of the built image (default localhost/dynamo-sglang/operator:dev)
#   OCI_ARCHIVE    when set, also write the image to this OCI archive (e.g. to load it elsewhere)
#   BUILD_CA_BUNDLE  CA bundle pip trusts during the build only (default: this host's
#                  /etc/ssl/certs/ca-certificates.crt), for networks that reach PyPI through a TLS proxy;
#                  set it empty to use the image's own trust store. It is mounted, never copied in.
set -euo pipefail

CACHE="${DYNAMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dynamo-sglang}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
IMAGE="${IMAGE:-localhost/dynamo-sglang/operator:dev}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { echo "[build-operator-image] $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap and buildah's vfs storage need it), e.g. sudo $0"
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || die "$tool is missing; install it with: apt-get install -y buildah debootstrap"
done

# The base image's name carries what went into it, so changing the suite or packages builds a new one.
BASE_KEY="$(printf '%s|%s' "$SUITE" "$BASE_PACKAGES" | sha256sum | cut -c1-12)"
ROOTFS="$CACHE/rootfs/$SUITE-python3-$BASE_KEY"
BASE_IMAGE="localhost/dynamo-sglang/base:$SUITE-python3-$BASE_KEY"
BUILDAH=(buildah --root "$CACHE/buildah/storage" --runroot "${XDG_RUNTIME_DIR:-/run}/dynamo-sglang-buildah"
  --storage-driver vfs)

ctr=""
pipconf=""
cleanup() {
  if [ -n "$ctr" ]; then "${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true; fi
  if [ -n "$pipconf" ]; then rm -f "$pipconf"; fi
}
trap cleanup EXIT

start=$(date +%s)
phase_start=$start
phase() { local now; now=$(date +%s); log "$1 took $((now - phase_start))s"; phase_start=$now; }

# --- 1. base rootfs and base image ---------------------------------------------------------------
if [ ! -f "$ROOTFS/.ready" ]; then
  log "debootstrapping $SUITE ($BASE_PACKAGES) into $ROOTFS from $DEBIAN_MIRROR"
  rm -rf "$ROOTFS.tmp"
  mkdir -p "$(dirname "$ROOTFS")"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$ROOTFS.tmp" "$DEBIAN_MIRROR" >&2 \
    || die "debootstrap failed (see above); check that $DEBIAN_MIRROR is reachable or set DEBIAN_MIRROR"
  rm -rf "$ROOTFS.tmp"/var/cache/apt/archives/*.deb "$ROOTFS.tmp"/var/lib/apt/lists/*
  rm -rf "$ROOTFS"
  mv "$ROOTFS.tmp" "$ROOTFS"
  touch "$ROOTFS/.ready"
  phase "debootstrap"
fi

if ! "${BUILDAH[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  log "committing $ROOTFS as $BASE_IMAGE"
  ctr=$("${BUILDAH[@]}" from scratch)
  mnt=$("${BUILDAH[@]}" mount "$ctr")
  tar -C "$ROOTFS" --exclude=./.ready -cf - . | tar -C "$mnt" -xf -
  "${BUILDAH[@]}" umount "$ctr" >/dev/null
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  "${BUILDAH[@]}" commit --quiet "$ctr" "$BASE_IMAGE" >/dev/null
  "${BUILDAH[@]}" rm "$ctr" >/dev/null
  ctr=""
  phase "base image"
fi

# --- 2. the operator image from images/operator/Dockerfile -----------------------------------------
# Build-time only mounts (never part of a layer): the host's CA bundle and a pip.conf that points at it.
BUILD_CA_BUNDLE="${BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
build_mounts=()
if [ -n "$BUILD_CA_BUNDLE" ] && [ -f "$BUILD_CA_BUNDLE" ]; then
  pipconf="$(mktemp)"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$pipconf"
  build_mounts=(--volume "$BUILD_CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro"
    --volume "$pipconf:/etc/pip.conf:ro")
fi
log "building $IMAGE on $BASE_IMAGE"
"${BUILDAH[@]}" bud --isolation chroot --pull=never --layers "${build_mounts[@]}" \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" \
  --file "$REPO_ROOT/images/operator/Dockerfile" \
  --ignorefile "$REPO_ROOT/images/operator/Dockerfile.dockerignore" \
  --tag "$IMAGE" "$REPO_ROOT" >&2
phase "image build"

# --- 3. run it -------------------------------------------------------------------------------------
ctr=$("${BUILDAH[@]}" from --pull=never "$IMAGE")
user=$("${BUILDAH[@]}" inspect --type container --format '{{.OCIv1.Config.User}}' "$ctr")
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] \
  || die "the image runs as user '${user:-root}'; images/operator/Dockerfile must set a non-root USER"
"${BUILDAH[@]}" run --isolation chroot --user "$user" "$ctr" -- dynamo-operator --help >&2 \
  || die "dynamo-operator --help failed inside $IMAGE"
phase "dynamo-operator --help inside the image"

if [ -n "${OCI_ARCHIVE:-}" ]; then
  "${BUILDAH[@]}" push --quiet "$IMAGE" "oci-archive:$OCI_ARCHIVE:$IMAGE"
  log "wrote $OCI_ARCHIVE"
fi

log "built and ran $IMAGE (user $user) in $(($(date +%s) - start))s"
echo "$IMAGE"
