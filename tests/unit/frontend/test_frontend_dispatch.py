"""Serving-mode decision per model: disaggregated when prefill and decode workers exist, aggregated
only where an aggregated worker exists, and a 503 naming the missing role otherwise (never a request
to decode-only workers)."""

from __future__ import annotations

import pytest
from dynamo_worker.frontend.errors import ServiceUnavailable
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.serving.dispatch import for_worker, route_mode
from dynamo_worker.protocol import GenerateRequest, InstanceRecord, StopConditions


def entry(*roles: str) -> ModelEntry:
    e = ModelEntry("m")
    for i, role in enumerate(roles):
        rec = InstanceRecord(
            instance_id=f"{i:016x}",
            namespace="ns",
            component=role,
            role=role,
            model="m",
            address=f"127.0.0.1:{1000 + i}",
            page_size=4,
            total_kv_blocks=10,
        )
        e.workers[rec.instance_id] = rec
    return e


@pytest.mark.parametrize(
    ("roles", "mode"),
    [
        (("agg",), "agg"),
        (("prefill", "decode"), "disagg"),
        (("prefill", "decode", "agg"), "disagg"),
        (("decode", "agg"), "agg"),
        (("prefill", "agg"), "agg"),
    ],
)
def test_mode(roles, mode):
    assert route_mode(entry(*roles)) == mode


@pytest.mark.parametrize(
    ("roles", "code"), [(("decode",), "no_prefill_workers"), (("prefill",), "no_decode_workers")]
)
def test_missing_role_is_503(roles, code):
    with pytest.raises(ServiceUnavailable) as e:
        route_mode(entry(*roles))
    assert e.value.code == code and e.value.status == 503


def test_stream_interval_goes_only_to_workers_that_know_it():
    """An older worker's record lacks ``takes_stream_interval``; its request model refuses unknown
    fields, so the hint is left out for it (the tokens are the same either way)."""
    worker = entry("agg").workers["0" * 16]
    request = GenerateRequest(
        request_id="r", model="m", token_ids=[1], stop=StopConditions(max_tokens=4), stream_interval=50
    )
    assert for_worker(request, worker).stream_interval is None
    newer = worker.model_copy(update={"takes_stream_interval": True})
    assert for_worker(request, newer) is request
