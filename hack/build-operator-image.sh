#!/usr/bin/env bash
# Builds the operator image the way CI does, with no container engine and no image registry:
#
#   1. a minimal Debian bookworm rootfs with python3 + python3-venv from Debian packages (debootstrap),
#      cached under $CACHE/rootfs, committed once as a local base image (hack/image-lib.sh);
#   2. images/operator/Dockerfile built on that base with buildah (vfs storage, chroot isolation),
#      passing --build-arg BASE_IMAGE=<that base> (the same Dockerfile users build with docker);
#   3. `dynamo-operator --help` run inside the built image, as the image's non-root user.
#
# Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap). buildah's storage
# lives in $CACHE/buildah, so a second run reuses the base image and the cached layers.
#
#   bash hack/build-operator-image.sh            # prints the image name on the last line
#
# Environment (all optional; DYNAMO_CACHE, DEBIAN_MIRROR, BUILD_CA_BUNDLE: see hack/image-lib.sh):
#   IMAGE          name of the built image (default localhost/dynamo-sglang/operator:dev)
#   OCI_ARCHIVE    when set, also write the image to this OCI archive (e.g. to load it elsewhere)
#   IMAGE_CHECK    0: build only, without running the image (the real-node tier runs it as pods)
set -euo pipefail

LOG_PREFIX=build-operator-image
# shellcheck source=hack/image-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/image-lib.sh"
IMAGE="${IMAGE:-localhost/dynamo-sglang/operator:dev}"

require_tools
lock_storage
ensure_base_image
build_mounts

# --- the operator image from images/operator/Dockerfile ----------------------------------------------
log "building $IMAGE on $BASE_IMAGE"
bud "$REPO_ROOT/images/operator/Dockerfile" "$IMAGE-build" --target build  # the stage it copies from
bud "$REPO_ROOT/images/operator/Dockerfile" "$IMAGE"
phase "image build"

# --- run it ------------------------------------------------------------------------------------------
if [ "${IMAGE_CHECK:-1}" = 1 ]; then
  ctr=$("${BUILDAH[@]}" from --pull=never "$IMAGE")
  user=$(image_user "$ctr")
  "${BUILDAH[@]}" run --isolation chroot --user "$user" "$ctr" -- dynamo-operator --help >&2 \
    || die "dynamo-operator --help failed inside $IMAGE"
  phase "dynamo-operator --help inside the image"
else
  log "IMAGE_CHECK=0: not running the image"
fi

if [ -n "${OCI_ARCHIVE:-}" ]; then
  "${BUILDAH[@]}" push --quiet "$IMAGE" "oci-archive:$OCI_ARCHIVE:$IMAGE"
  log "wrote $OCI_ARCHIVE"
fi

prune_stale_layers
log "built${user:+ and ran} $IMAGE (${user:+user $user, }$(image_size "$IMAGE")) in $(($(date +%s) - start))s"
echo "$IMAGE"
