"""The trace replay's own pure parts (``tests.bench.trace_replay``): one request per trace request whose
words follow its hash ids, the figures of a replay (TTFT, per-request ITL, goodput at the SLO, cached
against cacheable share, CPU per request), and a command line whose ``--help`` says what it runs."""

from __future__ import annotations

import pytest
from dynamo_worker.bench.stats import RequestResult

from tests.bench import trace
from tests.bench.trace_replay import main, requests_of, summarize


def test_requests_carry_the_trace_lengths_and_share_words_where_hash_ids_match():
    window = [trace.TraceRequest(0, 600, 7, (1, 2)), trace.TraceRequest(0, 1000, 3, (1, 3))]
    a, b = (s.prompt.split(" ") for s in requests_of(window))
    assert (len(a), len(b)) == (600, 1000)
    assert a[:512] == b[:512] and a[512:] != b[512:600]
    assert [s.max_tokens for s in requests_of(window)] == [7, 3]


def _result(start, ttft, end, tokens, prompt=100, cached=None, error=None):
    return RequestResult(
        start=start, end=end, first_chunk=start + ttft, output_tokens=tokens,
        prompt_tokens=prompt, cached_tokens=cached, error=error,
    )  # fmt: skip


def test_summary_counts_goodput_cached_and_cacheable_shares():
    window = [trace.TraceRequest(0, 512, 10, (1,)), trace.TraceRequest(0, 1024, 10, (1, 2))]
    results = [
        _result(0.0, 0.5, 0.5 + 9 * 0.01, 10, 512, 0),  # within both targets
        _result(1.0, 2.5, 3.5 + 9 * 0.01, 10, 1024, 512),  # TTFT past 2 s
        RequestResult(start=2.0, end=4.0, error="timeout"),
    ]
    s = summarize(results, window, send_lag_s=0.003, cpu_s=(0.3, 0.6))
    assert (s.requests, s.completed, s.errors) == (3, 2, {"timeout": 1})
    assert s.good_share == pytest.approx(1 / 3) and s.goodput_rps == pytest.approx(1 / 4.0)
    assert s.cached_share == pytest.approx(512 / 1536)
    assert s.cacheable_share == pytest.approx(512 / 1536)
    assert s.itl_p50_ms == pytest.approx(10.0) and s.send_lag_ms == pytest.approx(3.0)
    assert s.ttft_p90_ms == pytest.approx(1000 * (0.5 + 0.9 * 2.0))
    assert (s.frontend_cpu_ms_per_request, s.worker_cpu_ms_per_request) == pytest.approx((100.0, 200.0))


def test_help_names_the_window_the_pace_and_the_slo(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    for shown in ("--start-s", "--duration-s", "--count", "--speedup", "--dynamo-venv", "TTFT <= 2 s"):
        assert shown in out


def test_a_missing_trace_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--trace", str(tmp_path / "none.jsonl")])
    assert "no trace at" in capsys.readouterr().err
