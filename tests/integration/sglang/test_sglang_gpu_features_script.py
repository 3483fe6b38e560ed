"""The GPU proof of embeddings and structured output (tests/gpu/run_gpu_features.py) end to end on the
mocker: it starts NATS, the frontend and workers as processes, checks vector sizes, base64, usage and
/health for an embedding worker, and JSON that validates against a schema for a generation worker, and
prints a passing summary. The GPU and SGLang's own server are replaced by the mocker (the comparison
with SGLang is skipped), so this keeps the script working between runs on the lent GPU machines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import popen as start_process

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "run_gpu_features.py"


def test_gpu_features_script_passes_on_the_mocker(tmp_path):
    env = {
        **os.environ,
        "ENGINE": "mocker",
        "OUT": str(tmp_path / "out"),
        "FEATURES_DIR": str(tmp_path / "w"),
    }
    proc = start_process(
        [sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the script stops every process it started on SIGTERM
        stdout, stderr = proc.communicate(timeout=120)
        raise AssertionError(f"the GPU features script took over 240 s:\n{stdout[-4000:]}") from None
    assert proc.returncode == 0, stdout[-4000:] + stderr[-2000:]
    summary = (tmp_path / "out" / "features_summary.txt").read_text()
    assert summary.splitlines()[-1] == "RESULT: PASS"
    for check in ("embed vector_size", "embed base64_equals_float", "json json_schema_validates"):
        assert check in summary
    assert stdout.rstrip().endswith("RESULT: PASS")
