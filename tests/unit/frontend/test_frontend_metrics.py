"""The frontend's per-token histogram tally: what ``/metrics`` shows after a flush is exactly what one
``observe`` per token would have shown."""

from __future__ import annotations

import random

from dynamo_worker.frontend.metrics import FrontendMetrics, Tally
from prometheus_client import generate_latest


def _itl_lines(metrics: FrontendMetrics) -> list[str]:
    """The histogram's exposition lines, its sum rounded (added in another order, it differs in the
    last digits)."""
    text = generate_latest(metrics.registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("dynamo_frontend_inter_token_latency")]
    return [f"{line.rsplit(' ', 1)[0]} {float(line.rsplit(' ', 1)[1]):.6g}" for line in lines]


def test_a_flushed_tally_shows_what_observe_would():
    rng = random.Random(3)
    gaps = [(rng.choice([0.0005, 0.001, 0.004, 0.03, 2.0, 500.0]), rng.randint(1, 4)) for _ in range(300)]
    direct, tallied = FrontendMetrics(), FrontendMetrics()
    for gap, n in gaps:
        for _ in range(n):
            direct.itl.labels("m").observe(gap)
    tally = Tally(tallied.itl.labels("m"), every=10**9)
    for gap, n in gaps:
        tally.observe(gap, n)
    assert _itl_lines(tallied) != _itl_lines(direct)  # nothing shown before the flush
    tally.flush()
    assert _itl_lines(tallied) == _itl_lines(direct)
    tally.flush()  # nothing new: nothing added twice
    assert _itl_lines(tallied) == _itl_lines(direct)


def test_a_long_stream_shows_while_it_runs():
    metrics = FrontendMetrics()
    tally = Tally(metrics.itl.labels("m"), every=8)
    for _ in range(20):
        tally.observe(0.002)
    counts = [line for line in _itl_lines(metrics) if "_count" in line]
    assert counts == ['dynamo_frontend_inter_token_latency_seconds_count{model="m"} 16']
