# Shared by hack/build-operator-image.sh and hack/build-runtime-image.sh (sourced, not run): buildah
# with vfs storage and chroot isolation, no container engine and no image registry, on a Debian
# bookworm base assembled with debootstrap and cached.
#
# The sourcing script sets LOG_PREFIX first. Environment (all optional):
#   DYNAMO_CACHE     cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/dynamo-sglang)
#   DEBIAN_MIRROR    Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   BUILD_CA_BUNDLE  CA bundle pip trusts during the build only (default: this host's
#                    /etc/ssl/certs/ca-certificates.crt), for networks that reach PyPI through a TLS
#                    proxy; set it empty to use the image's own trust store. Mounted, never copied in.

CACHE="${DYNAMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dynamo-sglang}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# Both images start from this base; python3-venv builds the virtualenv, ca-certificates for TLS.
BASE_PACKAGES=python3,python3-venv,ca-certificates
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILDAH=(buildah --root "$CACHE/buildah/storage" --runroot "${XDG_RUNTIME_DIR:-/run}/dynamo-sglang-buildah"
  --storage-driver vfs)

log() { echo "[$LOG_PREFIX] $*" >&2; }
die() { log "error: $*"; exit 1; }

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

require_tools() {
  [ "$(id -u)" = 0 ] || die "run as root (debootstrap and buildah's vfs storage need it), e.g. sudo $0"
  local tool
  for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null || die "$tool is missing; install it with: apt-get install -y buildah debootstrap"
  done
}

# Sets BASE_IMAGE to the local base image, debootstrapping and committing it on the first run. Its name
# carries what went into it, so changing the suite or packages builds a new one.
ensure_base_image() {
  local key rootfs mnt
  key="$(printf '%s|%s' "$SUITE" "$BASE_PACKAGES" | sha256sum | cut -c1-12)"
  rootfs="$CACHE/rootfs/$SUITE-python3-$key"
  BASE_IMAGE="localhost/dynamo-sglang/base:$SUITE-python3-$key"
  if [ ! -f "$rootfs/.ready" ]; then
    log "debootstrapping $SUITE ($BASE_PACKAGES) into $rootfs from $DEBIAN_MIRROR"
    rm -rf "$rootfs.tmp"
    mkdir -p "$(dirname "$rootfs")"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs.tmp" "$DEBIAN_MIRROR" >&2 \
      || die "debootstrap failed (see above); check that $DEBIAN_MIRROR is reachable or set DEBIAN_MIRROR"
    rm -rf "$rootfs.tmp"/var/cache/apt/archives/*.deb "$rootfs.tmp"/var/lib/apt/lists/*
    rm -rf "$rootfs"
    mv "$rootfs.tmp" "$rootfs"
    touch "$rootfs/.ready"
    phase "debootstrap"
  fi
  if ! "${BUILDAH[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    log "committing $rootfs as $BASE_IMAGE"
    ctr=$("${BUILDAH[@]}" from scratch)
    mnt=$("${BUILDAH[@]}" mount "$ctr")
    tar -C "$rootfs" --exclude=./.ready -cf - . | tar -C "$mnt" -xf -
    "${BUILDAH[@]}" umount "$ctr" >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --cmd python3 "$ctr"
    "${BUILDAH[@]}" commit --quiet "$ctr" "$BASE_IMAGE" >/dev/null
    "${BUILDAH[@]}" rm "$ctr" >/dev/null
    ctr=""
    phase "base image"
  fi
}

# Sets BUILD_MOUNTS: build-time only mounts (never part of a layer), the host's CA bundle and a
# pip.conf that points at it.
build_mounts() {
  BUILD_CA_BUNDLE="${BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
  BUILD_MOUNTS=()
  if [ -n "$BUILD_CA_BUNDLE" ] && [ -f "$BUILD_CA_BUNDLE" ]; then
    pipconf="$(mktemp)"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$pipconf"
    BUILD_MOUNTS=(--volume "$BUILD_CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro"
      --volume "$pipconf:/etc/pip.conf:ro")
  fi
}

# Prints the image's configured user; dies when it is root.
image_user() {
  local user
  user=$("${BUILDAH[@]}" inspect --type container --format '{{.OCIv1.Config.User}}' "$1")
  [ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] \
    || die "the image runs as user '${user:-root}'; its Dockerfile must set a non-root USER"
  echo "$user"
}

# Prints the size of an image as buildah stores it (uncompressed layers), e.g. "412 MB".
image_size() {
  "${BUILDAH[@]}" images --format '{{.Size}}' "$1" | head -1
}
