"""The GPU migration script (tests/gpu/run_migration.py) end to end on the mocker: two workers, one
SIGKILLed mid-stream per run, every stream completes with the right token count and usage, and the
summary ends in PASS. The GPU is replaced by the mocker (no GPU here), so the script keeps working
between runs on the lent GPU machines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import popen

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "run_migration.py"


def test_migration_script_passes_on_the_mocker(tmp_path):
    env = {
        **os.environ,
        "ENGINE": "mocker",
        "OUT": str(tmp_path / "out"),
        "GPU_STATE": str(tmp_path / "state"),
        "MODEL_DIR": str(tmp_path / "model"),
        "MIG_ISL": "128",
        "MIG_OSL": "64",
        "MIG_KILL_AT": "16",
        "MIG_RUNS": "2",
    }
    proc = popen(
        [sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        stdout, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the script stops every process it started on SIGTERM
        stdout, _ = proc.communicate(timeout=120)
        raise AssertionError(f"the migration script took over 240 s:\n{stdout[-4000:]}") from None
    assert proc.returncode == 0, stdout[-4000:]
    summary = (tmp_path / "out" / "migration.txt").read_text()
    assert summary.splitlines()[-1] == "RESULT: PASS"
    for check in ("killed_mid_stream", "stream_completed", "token_count_right", "usage_right"):
        assert f"{check:32} 2/2" in summary, summary
    assert (tmp_path / "out" / "logs" / "agg-0.log").is_file()
