"""What the planner observes: the frontends' Prometheus counters, turned into an interval's traffic.

``parse_frontend_metrics`` (pure) reads the text a frontend serves on ``/metrics`` into cumulative
totals; ``interval`` (pure) turns two totals into an ``Observation``: requests/s, mean input and output
lengths, mean TTFT and ITL. ``scrape`` and ``query_prometheus`` are the thin I/O around them.

Frontend metrics used (``dynamo_worker.frontend.metrics``): ``dynamo_frontend_requests_total`` (finished
requests), ``dynamo_frontend_input_tokens_total``, ``dynamo_frontend_output_tokens_total``,
``dynamo_frontend_inflight_requests``, ``dynamo_frontend_queued_requests`` (requests waiting for a slot,
or for a worker of a model at 0 replicas: demand that no finished request shows yet), and the ``_sum`` /
``_count`` of ``dynamo_frontend_time_to_first_token_seconds`` and
``dynamo_frontend_inter_token_latency_seconds``.
The request rate counts arrivals: requests finished in the interval plus the growth of those in flight
or waiting, so an overloaded graph (whose finished rate is capped by what it can serve) is seen at its
real load. ``Observation.inflight`` counts the waiting ones too.
The input length is per arrival (the frontend counts prompt tokens when it dispatches a request). The
output length is per finished request (counted when a request ends), but never below the tokens
streamed in the interval per arrival (each first token counts towards TTFT, each later one towards
ITL, as it streams): requests with long outputs that have not finished yet still show up in the
interval they start in. A length the interval cannot tell (nothing arrived, nothing streamed) is
``None`` in ``Observation``, and the forecast keeps the last one it knew. A source whose counters went
down (a restarted frontend) is left out of that one interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from dynamo_api.errors import DynamoError
from prometheus_client.parser import text_string_to_metric_families

from dynamo_worker.planner.decide import Load

__all__ = ["Observation", "ScrapeError", "Totals", "interval", "parse_frontend_metrics", "scrape"]

P = "dynamo_frontend_"


class ScrapeError(DynamoError, RuntimeError):
    """No source could be read; the message names each source and why."""


@dataclass(frozen=True)
class Totals:
    """Cumulative counters of one frontend (or of all, summed)."""

    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    inflight: float = 0.0  # a gauge: the value now
    queued: float = 0.0  # a gauge: requests waiting now (frontend.serving.admission)


@dataclass(frozen=True)
class Observation:
    load: Load
    ttft_s: float | None  # mean over the interval; None when no first token was timed
    itl_s: float | None
    inflight: float
    interval_s: float
    isl_known: bool = True
    osl_known: bool = True


def parse_frontend_metrics(text: str, model: str | None = None) -> Totals:
    """Totals from one ``/metrics`` page, of one served model or all."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if model is not None and sample.labels.get("model", model) != model:
                continue
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return Totals(
        requests=values.get(P + "requests_total", 0.0),
        input_tokens=values.get(P + "input_tokens_total", 0.0),
        output_tokens=values.get(P + "output_tokens_total", 0.0),
        ttft_sum=values.get(P + "time_to_first_token_seconds_sum", 0.0),
        ttft_count=values.get(P + "time_to_first_token_seconds_count", 0.0),
        itl_sum=values.get(P + "inter_token_latency_seconds_sum", 0.0),
        itl_count=values.get(P + "inter_token_latency_seconds_count", 0.0),
        inflight=values.get(P + "inflight_requests", 0.0),
        queued=values.get(P + "queued_requests", 0.0),
    )


_COUNTERS = ("requests", "input_tokens", "output_tokens", "ttft_sum", "ttft_count", "itl_sum", "itl_count")


def interval(before: Mapping[str, Totals], after: Mapping[str, Totals], seconds: float) -> Observation:
    """The traffic between two scrapes of the same sources (keyed by URL). Sources missing from either
    scrape, or whose counters went down, are left out."""
    d = dict.fromkeys(_COUNTERS, 0.0)
    arrivals = 0.0
    for source, a in after.items():
        b = before.get(source)
        if b is None or any(getattr(a, k) < getattr(b, k) for k in _COUNTERS):
            continue
        for k in _COUNTERS:
            d[k] += getattr(a, k) - getattr(b, k)
        arrivals += max(a.requests - b.requests + a.inflight + a.queued - b.inflight - b.queued, 0.0)
    n = d["requests"]
    streamed = d["ttft_count"] + d["itl_count"]
    osl = max(d["output_tokens"] / n if n else 0.0, streamed / arrivals if arrivals else 0.0)
    load = Load(
        request_rate=arrivals / seconds if seconds > 0 else 0.0,
        isl=d["input_tokens"] / arrivals if arrivals else 0.0,
        osl=osl,
    )
    return Observation(
        load=load,
        ttft_s=d["ttft_sum"] / d["ttft_count"] if d["ttft_count"] else None,
        itl_s=d["itl_sum"] / d["itl_count"] if d["itl_count"] else None,
        inflight=sum(a.inflight + a.queued for a in after.values()),
        interval_s=seconds,
        isl_known=arrivals > 0 and d["input_tokens"] > 0,
        osl_known=n > 0 or streamed > 0,
    )


async def scrape(
    session: aiohttp.ClientSession, urls: Sequence[str], model: str | None, timeout_s: float = 5.0
) -> tuple[dict[str, Totals], dict[str, str]]:
    """Totals per reachable URL, and why each other URL could not be read."""

    async def one(url: str) -> Totals:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                raise ScrapeError(f"HTTP {r.status}")
            return parse_frontend_metrics(await r.text(), model)

    results = await asyncio.gather(*(one(u) for u in urls), return_exceptions=True)
    totals: dict[str, Totals] = {}
    failed: dict[str, str] = {}
    for url, res in zip(urls, results, strict=True):
        if isinstance(res, Totals):
            totals[url] = res
        elif isinstance(res, BaseException):
            failed[url] = str(res) or type(res).__name__
    return totals, failed


_PROM_QUERIES = {
    "requests": f"sum({P}requests_total)",
    "input_tokens": f"sum({P}input_tokens_total)",
    "output_tokens": f"sum({P}output_tokens_total)",
    "ttft_sum": f"sum({P}time_to_first_token_seconds_sum)",
    "ttft_count": f"sum({P}time_to_first_token_seconds_count)",
    "itl_sum": f"sum({P}inter_token_latency_seconds_sum)",
    "itl_count": f"sum({P}inter_token_latency_seconds_count)",
    "inflight": f"sum({P}inflight_requests)",
    "queued": f"sum({P}queued_requests)",
}


async def query_prometheus(
    session: aiohttp.ClientSession, base_url: str, selector: str, timeout_s: float = 10.0
) -> Totals:
    """Totals summed over every frontend a Prometheus server scrapes (``selector``: extra label
    matchers, e.g. ``namespace="ns"``). Counter resets are Prometheus's business; ``interval`` sees
    one source."""
    values: dict[str, float] = {}
    for field_name, query in _PROM_QUERIES.items():
        if selector:
            query = query.replace(")", f"{{{selector}}})", 1)
        async with session.get(
            base_url.rstrip("/") + "/api/v1/query",
            params={"query": query},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as r:
            body = await r.json(content_type=None)
        if r.status != 200 or body.get("status") != "success":
            raise ScrapeError(f"Prometheus {base_url} answered {r.status} to {query!r}: {body.get('error')}")
        result = body["data"]["result"]
        values[field_name] = float(result[0]["value"][1]) if result else 0.0
    return Totals(**values)
