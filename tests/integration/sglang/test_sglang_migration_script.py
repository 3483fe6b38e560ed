"""The GPU migration script (tests/gpu/run_migration.py) end to end on the mocker: two workers, one
SIGKILLed mid-stream per run, every stream completes with the right token count and usage, and the
summary ends in PASS. The GPU is replaced by the mocker (no GPU here), so the script keeps working
between runs on the lent GPU machines."""

from __future__ import annotations

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_migration_script_passes_on_the_mocker(tmp_path):
    proc = run_on_mocker(
        "run_migration.py", tmp_path, MIG_ISL="128", MIG_OSL="64", MIG_KILL_AT="16", MIG_RUNS="2"
    )
    stdout = proc.stdout + proc.stderr
    assert proc.returncode == 0, stdout[-4000:]
    summary = (tmp_path / "out" / "migration.txt").read_text()
    assert summary.splitlines()[-1] == "RESULT: PASS"
    for check in ("killed_mid_stream", "stream_completed", "token_count_right", "usage_right"):
        assert f"{check:32} 2/2" in summary, summary
    assert (tmp_path / "out" / "logs" / "agg-0.log").is_file()
