"""The GPU profiling script (tests/gpu/run_profile.py) end to end on the mocker, with small sizes: it
sweeps a worker's request plane into a profile file, measures operating points through the frontend,
restarts the worker as a mocker loaded with that profile, measures the same points and prints the
comparison table. The GPU engine is replaced by the mocker (no GPU here), so this keeps the script
working for the integrator's GPU run. Durations are not asserted (the table's tolerance verdict is
the GPU run's business): the profile must be a valid, loadable file shaped by the engine it swept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dynamo_worker.profile.model import Profile

from tests.support.procs import popen as start_process

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "run_profile.py"


def test_profile_script_writes_a_profile_and_compares_the_mocker_on_the_mocker(tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "ENGINE": "mocker",
        "OUT": str(out),
        "GPU_STATE": str(tmp_path / "state"),
        "MODEL_DIR": str(tmp_path / "model"),
        "PROF_ISL": "128,512,2048",
        "PROF_BATCH": "1,4",
        "PROF_CONTEXT": "256,1024",
        "PROF_POINTS": "512:16:1,1024:16:4",
        "PROF_NREQ_SCALE": "1",
    }
    proc = start_process(
        [sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the script stops every process it started on SIGTERM
        stdout, stderr = proc.communicate(timeout=120)
        raise AssertionError(f"the script took over 240 s:\n{stdout[-4000:]}") from None
    assert proc.returncode in (0, 1), stdout[-4000:] + stderr[-2000:]
    assert "FAILED" not in stdout and "error:" not in stdout, stdout[-4000:]
    profile = Profile.model_validate_json((out / "sglang-8b-h100.json").read_text())
    assert profile.source == "mocker" and profile.prefill.isl == [128, 512, 2048]
    assert profile.prefill.ttft_ms[-1] > profile.prefill.ttft_ms[0]  # a long prompt takes longer
    assert len(profile.decode.itl_ms) == 2 and all(len(row) == 2 for row in profile.decode.itl_ms)
    result = json.loads((out / "profile.json").read_text())
    for side in ("gpu", "mocker"):
        assert [(p["isl"], p["conc"]) for p in result[side]] == [(512, 1), (1024, 4)]
        assert all(p["errors"] == 0 and p["ttft_p50_ms"] > 0 and p["itl_p50_ms"] > 0 for p in result[side])
    table = stdout[stdout.index("== mocker (--profile measured)") :]
    assert table.count("TTFT p50") == 2 and table.count("ITL p50") == 2
    assert table.rstrip().splitlines()[-1] in ("RESULT: PASS", "RESULT: FAIL")
