"""Figures of a load run: pure functions from per-request results to a report, a table and JSON.

- TTFT: request sent -> first chunk carrying output (text or tokens).
- ITL (inter-token latency): the gaps between consecutive output chunks of a stream. A server that
  sends several tokens per chunk shows fewer, longer gaps; TPOT, ``(e2e - ttft) / (output_tokens - 1)``,
  is the per-token figure that does not depend on chunking.
- E2E: request sent -> stream finished.
- Throughput: completed requests and output tokens per second of wall time (first send -> last end).
- Cache hit rate: sum of ``usage.prompt_tokens_details.cached_tokens`` over sum of prompt tokens, over
  the requests whose server reported it (``None`` when none did).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Distribution",
    "Report",
    "RequestResult",
    "format_comparison",
    "format_report",
    "percentile",
    "summarize",
]

QUANTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """What happened to one request. Times are seconds of ``time.perf_counter``."""

    start: float
    end: float = 0.0
    first_chunk: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0  # usage.completion_tokens when reported, else chunks with output
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None  # a short type, e.g. "http_503", "timeout", "stream_error"
    error_message: str = ""
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default). Raises ValueError on an empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Distribution:
    """Summary of a latency in milliseconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of_seconds(cls, values: Sequence[float]) -> Distribution | None:
        if not values:
            return None
        ms = [v * 1e3 for v in values]
        return cls(len(ms), sum(ms) / len(ms), *(percentile(ms, q) for q in QUANTILES))


@dataclass(frozen=True)
class Report:
    requests: int
    completed: int
    errors: dict[str, int]
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    input_tokens_per_s: float | None
    output_tokens: int
    prompt_tokens: int | None
    cache_hit_rate: float | None
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    error_examples: dict[str, str] = field(default_factory=dict)  # the first message of each type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[RequestResult]) -> Report:
    """The report of one run. Latencies and throughput count completed requests only."""
    ok = [r for r in results if r.ok]
    errors, examples = _errors(results)
    duration = max(r.end for r in results) - min(r.start for r in results) if results else 0.0
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens, hit_rate = _prompt_tokens(ok)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    return Report(
        requests=len(results),
        completed=len(ok),
        errors=errors,
        duration_s=duration,
        requests_per_s=per_s(len(ok)),
        output_tokens_per_s=per_s(out_tokens),
        input_tokens_per_s=per_s(prompt_tokens) if prompt_tokens is not None else None,
        output_tokens=out_tokens,
        prompt_tokens=prompt_tokens,
        cache_hit_rate=hit_rate,
        ttft_ms=Distribution.of_seconds([r.first_chunk - r.start for r in ok if r.first_chunk is not None]),
        itl_ms=Distribution.of_seconds(_gaps(ok)),
        tpot_ms=Distribution.of_seconds(_tpot(ok)),
        e2e_ms=Distribution.of_seconds([r.end - r.start for r in ok]),
        error_examples=examples,
    )


def _errors(results: Sequence[RequestResult]) -> tuple[dict[str, int], dict[str, str]]:
    """How many requests failed with each error type (sorted), and the first message of each."""
    errors = dict(sorted(Counter(r.error for r in results if r.error is not None).items()))
    examples: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            examples.setdefault(r.error, r.error_message)
    return errors, {k: examples[k] for k in errors}


def _prompt_tokens(ok: Sequence[RequestResult]) -> tuple[int | None, float | None]:
    """The prompt tokens of the requests whose server reported them, and the share of them that hit
    the cache among those that reported cached tokens too (``None``: not reported)."""
    reported = [r for r in ok if r.prompt_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens or 0 for r in reported) if reported else None
    cached = [r for r in reported if r.cached_tokens is not None]
    cached_prompt = sum(r.prompt_tokens or 0 for r in cached)
    hit_rate = sum(r.cached_tokens or 0 for r in cached) / cached_prompt if cached and cached_prompt else None
    return prompt_tokens, hit_rate


def _gaps(ok: Sequence[RequestResult]) -> list[float]:
    """The gaps between consecutive output chunks of every stream (ITL)."""
    return [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]


def _tpot(ok: Sequence[RequestResult]) -> list[float]:
    """Time per output token after the first, per request of more than one token."""
    return [
        (r.end - r.first_chunk) / (r.output_tokens - 1)
        for r in ok
        if r.first_chunk is not None and r.output_tokens > 1
    ]


def _rows(report: Report) -> list[tuple[str, int | float | str | None]]:
    rows: list[tuple[str, int | float | str | None]] = [
        ("requests completed", report.completed),
        ("errors", ", ".join(f"{k}={v}" for k, v in report.errors.items()) or "0"),
        ("duration s", report.duration_s),
        ("requests/s", report.requests_per_s),
        ("output tokens/s", report.output_tokens_per_s),
        ("input tokens/s", report.input_tokens_per_s),
        ("cache hit rate", report.cache_hit_rate),
    ]
    for name, dist in (
        ("TTFT", report.ttft_ms),
        ("ITL", report.itl_ms),
        ("TPOT", report.tpot_ms),
        ("E2E", report.e2e_ms),
    ):
        for q in ("p50", "p90", "p99"):
            rows.append((f"{name} {q} ms", getattr(dist, q) if dist else None))
    return rows


def _cell(v: int | float | str | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, str | int):
        return str(v)
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def format_report(report: Report, title: str = "") -> str:
    """A two-column table of one run, then one server message per error type (what to fix)."""
    rows = _rows(report)
    width = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"  {k:<{width}}  {_cell(v):>12}" for k, v in rows]
    lines += [f"  error {k}: {msg or '(no message)'}" for k, msg in report.error_examples.items()]
    return "\n".join(lines)


def format_comparison(a_label: str, a: Report, b_label: str, b: Report, title: str = "") -> str:
    """Both runs side by side and their ratio ``a / b`` per figure."""
    ra, rb = _rows(a), _rows(b)
    width = max(len(k) for k, _ in ra)
    cw = max(12, len(a_label), len(b_label))
    lines = [title] if title else []
    lines.append(f"  {'':<{width}}  {a_label:>{cw}}  {b_label:>{cw}}  {'ratio':>8}")
    for (k, va), (_, vb) in zip(ra, rb, strict=True):
        ratio = "-"
        if isinstance(va, int | float) and isinstance(vb, int | float) and vb != 0:
            ratio = f"{va / vb:.2f}x"
        lines.append(f"  {k:<{width}}  {_cell(va):>{cw}}  {_cell(vb):>{cw}}  {ratio:>8}")
    return "\n".join(lines)
