"""Statistics of the load generator: percentiles, the per-run report (throughput, TTFT, ITL, TPOT,
end-to-end latency, errors by type, cache hit rate) and its table/comparison formatting."""

from __future__ import annotations

import pytest
from dynamo_worker.bench.stats import RequestResult, format_comparison, format_report, percentile, summarize


def test_percentile_interpolates_linearly_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order does not matter


def test_percentile_rejects_empty_input_and_bad_quantiles():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q must"):
        percentile([1.0], 101)


def _ok(start, first, chunks, end, tokens, prompt=None, cached=None):
    return RequestResult(
        start=start,
        end=end,
        first_chunk=first,
        chunk_times=chunks,
        output_tokens=tokens,
        prompt_tokens=prompt,
        cached_tokens=cached,
    )


def test_summarize_computes_throughput_latencies_and_hit_rate():
    results = [
        _ok(0.0, 0.1, [0.1, 0.2, 0.3], 0.3, 3, prompt=100, cached=50),
        _ok(0.5, 0.7, [0.7, 0.8, 1.0], 1.0, 3, prompt=100, cached=0),
        RequestResult(start=0.2, end=0.4, error="http_503"),
        RequestResult(start=0.3, end=0.6, error="http_503"),
        RequestResult(start=0.3, end=0.6, error="timeout"),
    ]
    report = summarize(results)
    assert report.requests == 5 and report.completed == 2
    assert report.errors == {"http_503": 2, "timeout": 1}
    assert report.duration_s == pytest.approx(1.0)
    assert report.requests_per_s == pytest.approx(2.0)
    assert report.output_tokens_per_s == pytest.approx(6.0)
    assert report.input_tokens_per_s == pytest.approx(200.0)
    assert report.cache_hit_rate == pytest.approx(0.25)
    assert report.ttft_ms.p50 == pytest.approx(150.0)
    assert report.ttft_ms.count == 2
    assert sorted([report.itl_ms.count]) == [4]
    assert report.itl_ms.p50 == pytest.approx(100.0)
    assert report.tpot_ms.mean == pytest.approx((100.0 + 150.0) / 2)
    assert report.e2e_ms.p90 == pytest.approx(300 + 0.9 * 200)


def test_summarize_leaves_hit_rate_unset_when_the_server_reports_no_cached_tokens():
    report = summarize([_ok(0.0, 0.1, [0.1], 0.2, 1, prompt=10)])
    assert report.cache_hit_rate is None
    assert report.tpot_ms is None  # a single token has no per-token time


def test_summarize_of_nothing_is_an_empty_report():
    report = summarize([])
    assert report.completed == 0 and report.requests_per_s == 0.0 and report.ttft_ms is None


def test_tables_show_every_figure_and_the_ratio_of_two_runs():
    a = summarize([_ok(0.0, 0.1, [0.1, 0.2], 1.0, 10, prompt=10, cached=5)])
    b = summarize([_ok(0.0, 0.2, [0.2, 0.4], 2.0, 10, prompt=10, cached=0)])
    table = format_report(a, "run a")
    assert table.splitlines()[0] == "run a"
    for name in (
        "requests/s",
        "output tokens/s",
        "TTFT p99 ms",
        "ITL p50 ms",
        "E2E p90 ms",
        "cache hit rate",
    ):
        assert name in table
    comparison = format_comparison("kv", a, "round-robin", b)
    line = next(row for row in comparison.splitlines() if "output tokens/s" in row)
    assert line.split()[-1] == "2.00x"
    ttft = next(row for row in comparison.splitlines() if "TTFT p50 ms" in row)
    assert ttft.split()[-1] == "0.50x"
    hit = next(row for row in comparison.splitlines() if "cache hit rate" in row)
    assert hit.split()[-1] == "-"  # b's rate is 0: no ratio


def test_the_table_names_each_error_type_with_the_servers_message():
    report = summarize(
        [
            RequestResult(start=0.0, end=0.1, error="http_404", error_message="model 'nope' is not served"),
            RequestResult(start=0.0, end=0.2, error="http_404", error_message="model 'nope' is not served"),
            RequestResult(start=0.0, end=0.3, error="connect", error_message=""),
        ]
    )
    assert report.error_examples == {"connect": "", "http_404": "model 'nope' is not served"}
    table = format_report(report)
    assert "error http_404: model 'nope' is not served" in table
    assert "error connect: (no message)" in table
    assert report.to_dict()["error_examples"]["http_404"] == "model 'nope' is not served"
