"""The HiCache measurement (tests/gpu/run_hicache.py) on the mocker: dynamo-run of
examples/agg-hicache.yaml with a small GPU cache, each prompt measured as a miss, a GPU hit and (after
other traffic evicted it) a host hit, the worker's counters confirming each kind of hit, and the
host-hit weight printed per length. Keeps the script working between runs on the lent GPU machines."""

from __future__ import annotations

import json

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_hicache_weight_is_measured_on_the_mocker(tmp_path):
    proc = run_on_mocker(
        "run_hicache.py", tmp_path, LENGTHS="512", REPS="2", MAX_TOTAL_TOKENS="2048", GRAPH_GPUS="0"
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "out" / "hicache.json").read_text())
    assert [r["length"] for r in rows] == [512]
    assert rows[0]["gpu_share"] > 0.9, "the second send found the prompt on the GPU"
    assert rows[0]["host_share"] > 0.9, "the third send loaded it back from host memory"
    assert "--kv-host-hit-weight from this machine:" in proc.stdout
