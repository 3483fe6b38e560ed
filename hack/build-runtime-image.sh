#!/usr/bin/env bash
# Builds the runtime image with buildah, as CI does (no container engine, no image registry), and runs
# a disaggregated graph from it:
#
#   1. the Debian bookworm base of hack/image-lib.sh (debootstrap, cached; shared with the operator image);
#   2. images/runtime/Dockerfile, target FLAVOUR (cpu or cuda), built on it with buildah (vfs storage,
#      chroot isolation);
#   3. hack/check-runtime-image.py run inside the image as its non-root user (buildah run, chroot
#      isolation, host network on 127.0.0.1): examples/disagg.yaml through dynamo-run on the mocker, and
#      NVIDIA Dynamo's command lines (python3 -m dynamo.sglang / dynamo.frontend) with the image's
#      `dynamo` modules, each answering a streamed chat completion. Any failure exits non-zero.
#
# Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap).
#
#   bash hack/build-runtime-image.sh                 # the CPU flavour (CI); prints the image name last
#   FLAVOUR=cuda bash hack/build-runtime-image.sh    # SGLang, torch, NIXL: several GB, not in CI
#
# Environment (all optional; DYNAMO_CACHE, DEBIAN_MIRROR, BUILD_CA_BUNDLE: see hack/image-lib.sh):
#   FLAVOUR        cpu (default) or cuda
#   IMAGE          name of the built image (default localhost/dynamo-sglang/runtime:dev-<flavour>)
#   OCI_ARCHIVE    when set, also write the image to this OCI archive (e.g. to load it elsewhere)
#   IMAGE_CHECK    0: build only, without running the image (the real-node tier runs it as pods)
#   CUDA_MIN_FREE_GB  free disk the cuda flavour insists on before it starts (default 40)
set -euo pipefail

LOG_PREFIX=build-runtime-image
# shellcheck source=hack/image-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/image-lib.sh"
FLAVOUR="${FLAVOUR:-cpu}"
case "$FLAVOUR" in
  cpu | cuda) ;;
  *) die "FLAVOUR=$FLAVOUR is not a flavour of images/runtime/Dockerfile; use cpu or cuda" ;;
esac
IMAGE="${IMAGE:-localhost/dynamo-sglang/runtime:dev-$FLAVOUR}"

require_tools
lock_storage
ensure_base_image
build_mounts
if [ "$FLAVOUR" = cuda ]; then
  # buildah's vfs storage keeps every layer as a full copy: the ~10 GB SGLang layer is stored about three
  # times while it is built and run.
  free_gb=$(df -Pk "$CACHE" | awk 'NR == 2 { print int($4 / 1048576) }')
  [ "$free_gb" -ge "${CUDA_MIN_FREE_GB:-40}" ] \
    || die "only ${free_gb} GB free under $CACHE; the cuda flavour needs about ${CUDA_MIN_FREE_GB:-40} GB with vfs storage (free some, or set DYNAMO_CACHE to a larger disk)"
fi

# --- the runtime image from images/runtime/Dockerfile ------------------------------------------------
log "building $IMAGE (target $FLAVOUR) on $BASE_IMAGE"
if [ "$FLAVOUR" = cpu ]; then  # the stage the cpu image copies from (the cuda image has none)
  bud "$REPO_ROOT/images/runtime/Dockerfile" "$IMAGE-build" --target build-cpu
fi
bud "$REPO_ROOT/images/runtime/Dockerfile" "$IMAGE" --target "$FLAVOUR"
phase "image build"

# --- run a disaggregated graph from it ---------------------------------------------------------------
if [ "${IMAGE_CHECK:-1}" = 1 ]; then
  ctr=$("${BUILDAH[@]}" from --pull=never "$IMAGE")
  user=$(image_user "$ctr")
  "${BUILDAH[@]}" run --isolation chroot --user "$user" \
    --volume "$REPO_ROOT/examples:/check/examples:ro" \
    --volume "$REPO_ROOT/hack/check-runtime-image.py:/check/check-runtime-image.py:ro" \
    "$ctr" -- python3 /check/check-runtime-image.py --flavour "$FLAVOUR" /check/examples/disagg.yaml >&2 \
    || die "the disaggregated graph did not serve inside $IMAGE (see above)"
  phase "disaggregated graph inside the image"
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
