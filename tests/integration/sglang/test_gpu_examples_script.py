"""The user-path proof (tests/gpu/run_examples.py) on the mocker: fresh starts of examples/disagg.yaml
through dynamo-run whose very first request (a chat, then a completion) must answer about as fast as the
steady state (the new pair's KV connection opened before Ready, and not without the frontend's warm-up)
and without waiting in the frontend's queue (its model card loaded before Ready), with a clean Ctrl-C
each time; and the prefill engine stopped (SIGSTOP) mid-request, whose client must get 504 at the
frontend's --kv-transfer-timeout-s and whose pair must serve again once the engine continues. The GPU is
replaced by the mocker (no GPU here): this keeps the script working between the runs on the lent GPU
machines, and runs the fresh-start and stuck-engine checks in the normal suite."""

from __future__ import annotations

import json

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_every_fresh_start_answers_its_first_request_as_fast_as_the_steady_state(tmp_path):
    """The mocker's first KV transfer of a new prefill/decode pair costs 3 s, as on GPUs: the frontend's
    warm-up pays it before Ready, so the first request sent at Ready answers about as fast as the steady
    state (tens of ms here; one request on a loaded CI machine may take a few times that, so the bound
    here is 5x, not the GPU run's 2x: without the warm-up it is a hundred times, below)."""
    proc = run_on_mocker(
        "run_examples.py", tmp_path, "fresh", "2", "disagg", FIRST_S="30", STALL_S="20", FIRST_RATIO="5"
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "out" / "fresh-disagg.json").read_text())
    assert [r["first"] for r in rows] == ["chat", "completion"]
    assert all(r["why"] == "ok" and r["exit_code"] == 0 and r["left"] == 0 for r in rows), rows
    assert all(r["ratio"] <= 5 and r["steady_ttft_ms"] > 0 for r in rows), rows
    assert all(r["first_held_ms"] == 0 for r in rows), rows  # Ready: card loaded, pair warm
    assert proc.stdout.rstrip().endswith(
        "first request answered: 2/2; its TTFT within 5x steady state: 2/2; held by the frontend: 0/2; "
        "clean exits: 2/2"
    )


def test_without_the_frontends_warm_up_the_first_request_opens_the_pairs_connection(tmp_path):
    proc = run_on_mocker(
        "run_examples.py", tmp_path, "fresh", "1", "disagg", FRONTEND_ARGS="--pair-warmup-timeout-s 0"
    )
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "out" / "fresh-disagg.json").read_text())
    assert row["why"] == "ok" and row["first_ttft_ms"] >= 3000 and row["ratio"] > 2, row


def test_a_stopped_prefill_engine_is_answered_at_the_kv_transfer_bound(tmp_path):
    proc = run_on_mocker("run_examples.py", tmp_path, "stuck", STUCK_BOUND_S="2")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    row = json.loads((tmp_path / "out" / "stuck.json").read_text())
    assert row["status"] == 504 and "kv-transfer-timeout-s" in row["outcome"], row
    assert 2.0 <= row["answered_after_stop_s"] <= 7.0, row
    assert row["after"] == "ok" and row["exit_code"] == 0 and row["left"] == 0, row
