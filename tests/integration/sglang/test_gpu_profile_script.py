"""The GPU profiling script (tests/gpu/run_profile.py) end to end on the mocker, with small sizes: it
sweeps a worker's request plane into a profile file, measures operating points through the frontend,
restarts the worker as a mocker loaded with that profile, measures the same points and prints the
comparison table. The GPU engine is replaced by the mocker (no GPU here), so this keeps the script
working for the integrator's GPU run. Durations are not asserted (the table's tolerance verdict is
the GPU run's business): the profile must be a valid, loadable file shaped by the engine it swept."""

from __future__ import annotations

import json

import pytest
from dynamo_worker.profile.model import Profile

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_profile_script_writes_a_profile_and_compares_the_mocker_on_the_mocker(tmp_path):
    out = tmp_path / "out"
    proc = run_on_mocker(
        "run_profile.py",
        tmp_path,
        PROF_ISL="128,512,2048",
        PROF_BATCH="1,4",
        PROF_CONTEXT="256,1024",
        PROF_POINTS="512:16:1,1024:16:4",
        PROF_NREQ_SCALE="1",
    )
    stdout, stderr = proc.stdout, proc.stderr
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
