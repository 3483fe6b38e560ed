"""The one-GPU KV routing script (tests/gpu/run_kv_routing.py) end to end on the mocker, with small
sizes: it starts NATS, two workers with KV events and a frontend per router mode, drives the
shared-prefix workload and prints the table. The GPU is replaced by the mocker (no GPU here), so this
keeps the script working for the integrator's GPU run; the assertion is on routing (the cache share
kv routing reaches against round-robin's under cache pressure), never on a duration."""

from __future__ import annotations

import json

import pytest

from tests.support.gpu_scripts import run_on_mocker

pytestmark = pytest.mark.integration


def test_kv_routing_script_prints_the_table_on_the_mocker(tmp_path):
    proc = run_on_mocker(
        "run_kv_routing.py",
        tmp_path,
        PREFIXES="6",
        PREFIX_LEN="512",
        UNIQUE_LEN="32",
        NREQ="96",
        CONC="8",
        OSL="8",
        MAX_TOTAL_TOKENS="3072",  # each worker holds about 4 of the 6 prefixes: cache pressure
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, stdout[-4000:] + stderr[-2000:]
    assert stdout.rstrip().endswith("RESULT: PASS")
    assert "| round-robin |" in stdout and "| kv |" in stdout and "kv / round-robin:" in stdout
    results = {r["mode"]: r for r in json.loads((tmp_path / "out" / "kv_routing.json").read_text())}
    assert results["kv"]["errors"] == results["round-robin"]["errors"] == 0
    assert results["kv"]["cached_share"] > results["round-robin"]["cached_share"]
    assert (tmp_path / "out" / "logs" / "worker-1.log").is_file()
