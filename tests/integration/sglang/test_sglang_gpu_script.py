"""The GPU proof script (tests/gpu/run_gpu.py) end to end on the mocker: it starts NATS, the frontend
and workers as processes, runs its correctness checks, benchmarks and the prefill-kill check, and
prints a passing summary. The GPU itself is replaced by the mocker (no GPU here), so this keeps the
script working between the rare runs on the lent GPU machines; the SGLang comparisons are skipped."""

from __future__ import annotations

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_gpu_proof_script_passes_on_the_mocker(tmp_path):
    proc = run_on_mocker(
        "run_gpu.py",
        tmp_path,
        "all",
        ISL="256",
        OSL="16",
        NREQ="8",
        SWEEP="2",
        PROBES="2",
        KILL_NREQ="16",
        KILL_ISL="2048",
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, stdout[-4000:] + stderr[-2000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert summary.splitlines()[-1] == "RESULT: PASS"
    for check in ("disagg greedy_equal_agg", "agg usage_right", "disagg prefill killed mid-request"):
        assert check in summary
    assert stdout.rstrip().endswith("RESULT: PASS")  # the summary is printed last
    assert (tmp_path / "out" / "logs" / "frontend.log").is_file()
