"""The Mooncake trace's pure part (``tests.bench.trace``): parsing and its errors, the window by offset,
duration and count, time scaling, prompts built from hash ids (equal ids, equal tokens; the last block
trimmed), the most cacheable share of a window, per-request ITL and goodput at the SLO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench import trace

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "mooncake-window.jsonl"


def _line(ts: float, inp: int, out: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})


def test_parse_reads_the_fixture_window_of_the_real_trace():
    reqs = trace.load(FIXTURE)
    assert len(reqs) == 20
    assert reqs[0] == trace.TraceRequest(1_500_000.0, 917, 167, (0, 81758))
    assert all(len(r.hash_ids) == -(-r.input_length // trace.BLOCK_TOKENS) for r in reqs)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 0, "input_length": 5}', "line 2: not a trace request"),
        ("not json", "line 2: not a trace request"),
        (_line(0, 1025, 4, [1, 2]), "do not cover input_length 1025"),
        (_line(0, 0, 4, [1]), "must be >= 1"),
    ],
)
def test_parse_names_the_line_it_cannot_replay(line, message):
    with pytest.raises(trace.TraceError, match=message):
        trace.parse([_line(0, 10, 2, [7]), line])


def test_parse_skips_blank_lines_and_ignores_hash_ids_past_the_input():
    reqs = trace.parse(["", _line(5, 10, 2, [7, 8, 9]), "  "])
    assert reqs == [trace.TraceRequest(5.0, 10, 2, (7, 8, 9))]


def _reqs(times_ms: list[float]) -> list[trace.TraceRequest]:
    return [trace.TraceRequest(t, 100, 10, (i,)) for i, t in enumerate(times_ms)]


def test_window_by_offset_duration_and_count_rebases_to_its_first_request():
    reqs = _reqs([1000, 1000, 2500, 4000, 7000])
    assert [r.timestamp_ms for r in trace.window(reqs, start_s=1.0)] == [0, 1500, 4500]
    assert [r.hash_ids for r in trace.window(reqs, start_s=1.0, duration_s=3.0)] == [(2,), (3,)]
    assert [r.hash_ids for r in trace.window(reqs, count=3)] == [(0,), (1,), (2,)]
    assert trace.window(reqs, start_s=60) == [] and trace.window([], count=3) == []


def test_scale_divides_the_gaps_and_rejects_a_non_positive_speedup():
    assert [r.timestamp_ms for r in trace.scale(_reqs([0, 1000, 3000]), 4)] == [0, 250, 750]
    with pytest.raises(ValueError, match="speedup"):
        trace.scale(_reqs([0]), 0)


def test_prompts_share_tokens_exactly_where_they_share_hash_ids():
    blocks = trace.BlockTokens(3, 1000, block=4)
    a = trace.prompt_ids(trace.TraceRequest(0, 10, 1, (5, 6, 7)), blocks)
    b = trace.prompt_ids(trace.TraceRequest(0, 8, 1, (5, 6)), blocks)
    c = trace.prompt_ids(trace.TraceRequest(0, 8, 1, (5, 9)), blocks)
    assert len(a) == 10 and len(b) == 8  # the last block trimmed to the input length
    assert a[:8] == b and c[:4] == a[:4] and c[4:] != a[4:8]
    assert all(3 <= t < 1000 for t in a)
    again = trace.BlockTokens(3, 1000, block=4)  # a fresh generator (another process, another stack)
    assert trace.prompt_ids(trace.TraceRequest(0, 10, 1, (5, 6, 7)), again) == a
    assert trace.BlockTokens(3, 1000, block=4, salt=1).ids(5) != blocks.ids(5)


def test_cacheable_share_counts_leading_blocks_sent_before():
    reqs = [
        trace.TraceRequest(0, 1024, 1, (1, 2)),  # nothing before it
        trace.TraceRequest(0, 1536, 1, (1, 2, 3)),  # 1024 of 1536 sent before
        trace.TraceRequest(0, 700, 1, (1, 4)),  # 512: block 4 is new
        trace.TraceRequest(0, 1100, 1, (5, 2, 3)),  # a new first block: nothing after it counts
    ]
    assert trace.cacheable_share(reqs) == pytest.approx((1024 + 512) / (1024 + 1536 + 700 + 1100))
    assert trace.cacheable_share([]) == 0.0
    partial = [trace.TraceRequest(0, 600, 1, (1, 2)), trace.TraceRequest(0, 600, 1, (1, 2))]
    assert trace.cacheable_share(partial) == pytest.approx(600 / 1200)  # a short last block counts its 88


def test_goodput_counts_requests_within_both_targets():
    assert trace.request_itl_s(1.0, 2.0, 11) == pytest.approx(0.1)
    assert trace.request_itl_s(1.0, 2.0, 1) is None
    samples = [(0.5, 0.010), (2.0, 0.025), (2.1, 0.010), (0.5, 0.030), (0.1, None)]
    assert trace.goodput(samples) == 3
    assert trace.goodput(samples, ttft_s=3.0, itl_s=0.05) == 5
