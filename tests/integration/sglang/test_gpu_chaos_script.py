"""The GPU chaos proof (tests/gpu/run_chaos.py) on the mocker, small sizes: through dynamo-run of the
examples, an engine's scheduler process SIGKILLed under load (one of agg-router's two workers, disagg's
decode engine and then its prefill engine mid-transfer, rank 1 of agg-tp2): no stream lost, every one
complete and token-exact against the same requests run before the fault (the mocker's tokens depend
only on the sequence before them), the graph back at full capacity; and --on-engine-death restart
against exit, each serving again. The GPU is replaced by the mocker (no GPU here): this keeps the script
working between the runs on the lent GPU machines."""

from __future__ import annotations

import json

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_every_engine_death_is_survived_token_exact_through_dynamo_run(tmp_path):
    proc = run_on_mocker(
        "run_chaos.py",
        tmp_path,
        timeout_s=400,
        CHAOS_STREAMS="6",
        CHAOS_OSL="200",
        CHAOS_KILL_AT_S="1",
        CHAOS_PREFILL_ISL="512",
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "chaos.json").read_text())
    faults = {f["name"]: f for f in report["faults"]}
    assert len(faults) == 4, faults.keys()
    for name, f in faults.items():
        assert f["exact"] == f["streams"] == 6 and f["lost"] == 0, (name, f)
        assert f["killed"] and f["full_capacity_s"] is not None, (name, f)
    assert faults["agg-router: one worker's scheduler"]["migrations"] >= 1
    assert faults["agg-tp2: rank 1's scheduler"]["migrations"] == 6  # the group's only engine
    modes = {m["mode"]: m for m in report["restart_vs_exit"]}
    assert modes["restart"]["ok"] and not modes["restart"]["worker_restarted"]
    assert modes["exit"]["ok"] and modes["exit"]["worker_restarted"]
    assert all(m["exit_code"] == 0 and m["left"] == 0 for m in modes.values())
