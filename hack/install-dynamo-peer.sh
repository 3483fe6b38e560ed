#!/usr/bin/env bash
# Installs NVIDIA Dynamo 1.6.1 (its Rust frontend and mocker) into its own cached venv, for
# `make bench-peers`. Prints the venv's path. Idempotent: a finished install is reused.
#   ai-dynamo-runtime==1.6.1, then ai-dynamo==1.6.1 --no-deps plus its dependencies except `aisimulate`
#   (not installable here; the frontend and mocker do not need it).
set -euo pipefail
VERSION=${DYNAMO_PEER_VERSION:-1.6.1}
PYTHON=${PYTHON:-python3}
DIR=${DYNAMO_PEER_VENV:-$HOME/.cache/dynamo-sglang/peers/dynamo-$VERSION}
STAMP=$DIR/.installed
if [[ -f $STAMP ]]; then echo "$DIR"; exit 0; fi
test -x "$DIR/bin/python" || "$PYTHON" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" -U pip >&2
"${PIP[@]}" "ai-dynamo-runtime==$VERSION" >&2
"${PIP[@]}" --no-deps "ai-dynamo==$VERSION" >&2
# ai-dynamo's own requirements, minus aisimulate. Its certifi>=2026.10.19 is newer than the registry
# here has; any certifi serves the frontend and mocker.
deps=$("$DIR/bin/python" - <<'PY'
import importlib.metadata as md, re
reqs = md.requires("ai-dynamo") or []
keep = []
for r in reqs:
    if "extra ==" in r:
        continue
    name = re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0]
    if name.lower() in {"aisimulate", "ai-dynamo-runtime"}:
        continue
    keep.append("certifi" if name == "certifi" else r.split(";")[0].strip())
print("\n".join(keep))
PY
)
if [[ -n $deps ]]; then
  mapfile -t reqs <<<"$deps"
  "${PIP[@]}" "${reqs[@]}" >&2
fi
"$DIR/bin/python" -c "import dynamo.frontend, dynamo.mocker" >&2
touch "$STAMP"
echo "$DIR"
