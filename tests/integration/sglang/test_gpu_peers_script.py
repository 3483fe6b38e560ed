"""The peer comparison (tests/gpu/run_peers.py) on the mocker: our aggregated and disaggregated stacks
through dynamo-run and SGLang's gateway (the real ``smg``, ``cache_aware``) in front of mocker engines
serving SGLang's HTTP API, each workload swept over concurrency (longmultiturn with HiCache on and its KV
cache cut so its conversations hold 3.5 times it), the table with the host-loaded share, and the goodput
report at both ITL SLOs with the ratio ours / gateway. The gateway's PD stack needs SGLang's bootstrap
protocol and is skipped on the mocker (said in the output). This keeps the script working between the
runs on the lent GPU machines."""

from __future__ import annotations

import json

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_peer_comparison_runs_our_stacks_on_the_mocker(tmp_path):
    proc = run_on_mocker(
        "run_peers.py",
        tmp_path,
        SMALL="1",
        SWEEP="2",
        WORKLOADS="chat,multiturn,longmultiturn",
        GRAPH_GPUS="0,1",
        HICACHE="1",
        LONG_POOL_TOKENS="320",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    points = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert {(p["stack"], p["workload"]) for p in points} == {
        (s, w) for s in ("ours-agg", "ours-disagg", "smg-agg") for w in ("chat", "multiturn", "longmultiturn")
    }
    assert "smg-pd: skipped on the mocker" in proc.stdout
    assert {(p["model_shape"], p["hidden_size"], p["layers"]) for p in points} == {("8b", 4096, 32)}, (
        "every point records the model shape it served"
    )
    assert all(p["errors"] == 0 and p["out_tok_s_per_gpu"] > 0 for p in points), points
    multiturn = [p for p in points if p["workload"] == "multiturn"]
    assert all(p["cached_share"] > 0.3 for p in multiturn), "turns resend their conversation: cache hits"
    assert all(p["cached_share"] <= p["cacheable_share"] for p in points), (
        "no stack finds more cached than its prompts shared with earlier ones"
    )
    assert all(p["cacheable_share"] == 0 for p in points if p["workload"] == "chat"), "chat shares nothing"
    long = [p for p in points if p["workload"] == "longmultiturn"]
    assert all(0 < p["cached_share_host"] <= p["cached_share"] for p in long), (
        "turns come back from host memory"
    )
    assert "longmultiturn sizing: 18 conversations" in proc.stdout and ": 3.6x" in proc.stdout
    assert "goodput per GPU at TTFT p90 <= 2000 ms and ITL p90 <= 50 ms" in proc.stdout
    assert "goodput per GPU at TTFT p90 <= 2000 ms and ITL p90 <= 10 ms" in proc.stdout
    assert "ours-agg/smg-agg" in proc.stdout, "the ratio against the gateway is reported"


def test_the_1b_shape_is_served_recorded_and_reported_beside_the_8b_one(tmp_path):
    """MODEL_SHAPE=1b writes the 1B-shaped config into the model folder, records it on every point and
    keeps its points apart from an 8B call's in the same state folder: the report has both."""
    common = {"SMALL": "1", "SWEEP": "2", "WORKLOADS": "chat", "GRAPH_GPUS": "0"}
    first = run_on_mocker("run_peers.py", tmp_path, "ours-agg", **common)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    proc = run_on_mocker("run_peers.py", tmp_path, "ours-agg", MODEL_SHAPE="1b", **common)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (
        2048,
        16,
        8192,
    )
    points = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert {(p["model_shape"], p["hidden_size"], p["layers"]) for p in points} == {
        ("8b", 4096, 32),
        ("1b", 2048, 16),
    }
    assert "chat          1b " in proc.stdout and "chat          8b " in proc.stdout, "goodput per shape"
