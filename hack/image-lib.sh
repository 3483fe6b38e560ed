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
#   BUILD_LOCK_WAIT_S  how long a build waits for another one on the same cache (default 1800)
#
# After a build that ran, the layers no named image uses any more are removed (prune_stale_layers), so
# the cache holds the base, the images and their build stages (named by bud), not every source ever built.

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
  for tool in buildah debootstrap flock; do
    command -v "$tool" >/dev/null || die "$tool is missing; install it with: apt-get install -y buildah debootstrap util-linux"
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

# Takes the lock on this cache's buildah storage for the rest of the script: two builds at once would
# each prune what the other is building on (prune_stale_layers). Waits at most BUILD_LOCK_WAIT_S.
lock_storage() {
  mkdir -p "$CACHE/buildah"
  exec 8>"$CACHE/buildah/.build.lock"
  if ! flock -n 8; then
    log "another image build uses $CACHE/buildah; waiting up to ${BUILD_LOCK_WAIT_S:-1800}s for it"
    flock -w "${BUILD_LOCK_WAIT_S:-1800}" 8 \
      || die "another image build still holds $CACHE/buildah/.build.lock after ${BUILD_LOCK_WAIT_S:-1800}s; stop it (or set DYNAMO_CACHE to build in another cache)"
  fi
}

# bud DOCKERFILE TAG [ARG...]: builds DOCKERFILE (with its .dockerignore) from the checkout on BASE_IMAGE,
# with this cache's layers and mounts, and names the result TAG; ARGs go to buildah bud (e.g. --target).
# A build stage the image copies from is built and named this way too, so its layers are never
# dangling and prune_stale_layers keeps them for the next build.
bud() {
  local dockerfile=$1 tag=$2
  shift 2
  "${BUILDAH[@]}" bud --isolation chroot --pull=never --layers "${BUILD_MOUNTS[@]}" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" "$@" \
    --file "$dockerfile" --ignorefile "$dockerfile.dockerignore" \
    --tag "$tag" "$REPO_ROOT" >&2
}

# Removes the layers of earlier builds that no named image uses any more (those of sources since
# changed). With vfs storage every layer is a full copy of the filesystem, so without this the store
# grows by about 2 GB with each changed source. The images this script built, their build stages
# (bud) and the base are named, so what the next build reuses stays. A failure here only warns.
prune_stale_layers() {
  local ids before after round
  before=$(du -sm "$CACHE/buildah/storage" | cut -f1)
  # Removing a stale image can leave its parent with no child: repeat until none is left.
  for round in $(seq 100); do
    ids=$("${BUILDAH[@]}" images --all --quiet --filter dangling=true) \
      || { log "warning: could not list the stale layers in $CACHE/buildah; left them"; return 0; }
    [ -n "$ids" ] || break
    # shellcheck disable=SC2086 # one argument per image id
    "${BUILDAH[@]}" rmi $ids >/dev/null \
      || { log "warning: could not remove stale layers from $CACHE/buildah (round $round); left them"; return 0; }
  done
  after=$(du -sm "$CACHE/buildah/storage" | cut -f1)
  log "image store $CACHE/buildah: ${after} MB (removed $((before - after)) MB of stale layers)"
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
