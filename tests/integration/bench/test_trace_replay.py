"""A Mooncake trace window replayed through our frontend (kv routing) and two mocker processes at its
scaled timestamps (``tests.bench.trace_replay``): every request completes with its trace output length,
the servers find some prompt tokens cached and never more than the window could share, and the
figures within the SLO are counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import trace
from tests.bench.trace_replay import Options, run_stack

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "mooncake-window.jsonl"


def test_a_trace_window_replays_through_our_frontend_and_mockers(tmp_path):
    o = Options(trace=FIXTURE, count=20, speedup=20, workers=2, engine_speedup=10, drain_s=60)
    s = run_stack("ours", tmp_path, o, model_dir=tmp_path / "model")
    window = trace.load(FIXTURE)
    assert (s.requests, s.completed, s.errors) == (20, 20, {})
    assert s.cacheable_share == pytest.approx(trace.cacheable_share(window))
    assert s.cached_share is not None and 0 < s.cached_share <= s.cacheable_share + 0.01
    assert s.output_tokens_per_s * s.duration_s == pytest.approx(
        sum(r.output_length for r in window), rel=0.01
    )
    assert 0 < s.good_share <= 1 and s.ttft_p50_ms is not None and s.itl_p90_ms is not None
