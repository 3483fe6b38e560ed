"""The revision a worker publishes in discovery: the operator's when given (the same on a graph's
prefill and decode pods), else derived from what fixes the worker's KV layout and model, so that two
workers started by hand pair only when page size, model and model card agree."""

from __future__ import annotations

from dynamo_worker.runtime.engine import EngineInfo
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.worker import worker_revision


def info(page_size: int = 16, model: str = "m") -> EngineInfo:
    return EngineInfo(model_name=model, page_size=page_size, total_kv_blocks=100)


def test_the_operators_revision_wins():
    assert worker_revision("abc123", info(), "card") == "abc123"
    settings = RuntimeSettings.parse([], env={"DYN_REVISION": "abc123"})
    assert settings.pair_revision == "abc123"


def test_a_derived_revision_follows_page_size_model_and_card():
    base = worker_revision(None, info(), "card")
    assert base == worker_revision(None, info(), "card")  # prefill and decode of one setup agree
    assert base != worker_revision(None, info(page_size=32), "card")
    assert base != worker_revision(None, info(model="other"), "card")
    assert base != worker_revision(None, info(), "another-card")
