#!/usr/bin/env bash
# Checks our use of SGLang against the oldest and the newest SGLang release of the declared window
# (uses.SGLANG_WINDOW in worker/dynamo_worker/sglang/uses.py, the one place it is declared).
#
#   bash hack/sglang-compat.sh
#
# For each of the two releases: `pip download --no-deps` of its wheel into "$CACHE/dl" (once), its
# Python files unpacked into "$CACHE/sglang-<version>-src" (once), then
# `python -m dynamo_worker.sglang.compat` reads that source with ast and checks the ServerArgs fields,
# flags and modules the worker uses, and encodes KV event batches with SGLang's own struct classes and
# decodes them with ours. Needs the package index on the first run, msgspec (the test extra), and
# neither torch nor a GPU. Exits non-zero when either release is incompatible.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
CACHE="${DYNAMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dynamo-sglang}"

exec "$PYTHON" -m dynamo_worker.sglang.compat --window --cache-dir "$CACHE"
