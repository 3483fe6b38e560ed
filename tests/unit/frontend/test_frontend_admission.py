"""Admission: how long a request may wait and in which order. The pure parts (the request's hints from
headers and ``nvext``, Go durations, each waiter's budget in both regimes, a model's slots, who a full
queue sheds), and the queues themselves driven through a real model registry fed with discovery events:
a full queue answers 429 at once, priority orders the queue and displaces the lowest, a waiter whose
deadline passes is answered then (never before), a kept model's requests wait for a worker and are
served when one registers, and the queue gauge tells the demand."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from pathlib import Path

import pytest
from dynamo_worker.frontend.errors import ApiError, InvalidRequest, ModelNotFound
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.models.registry import ModelEntry, ModelRegistry
from dynamo_worker.frontend.serving.admission import (
    DROPPED_REASON_HEADER,
    PRIORITY_HEADER,
    TTL_HEADER,
    Admission,
    Hints,
    budget,
    capacity,
    parse_duration,
    request_hints,
)
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.runtime.discovery import InstanceAdded, InstanceRemoved

from tests.support.bpe_model import build_tokenizer, write_model_dir

_ids = itertools.count(1)


def worker(role: str = "agg", slots: int | None = 2, revision: str | None = "r") -> InstanceRecord:
    i = next(_ids)
    return InstanceRecord(
        instance_id=f"{i:016x}",
        namespace="ns",
        component=role,
        role=role,
        model="m",
        address=f"127.0.0.1:{3000 + i}",
        page_size=4,
        total_kv_blocks=10,
        max_running_requests=slots,
        revision=revision,
    )


# --- the pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2s", 2.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0), ("0.25", 0.25), ("3", 3.0)],
)
def test_durations_in_go_syntax_or_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "2 s", "s2", "2x", "1m30"])
def test_what_is_not_a_duration(text):
    assert parse_duration(text) is None


def test_headers_override_the_body():
    assert request_hints({}, 3, 4.0) == Hints(priority=3, ttl_s=4.0)
    assert request_hints({PRIORITY_HEADER: "-2", TTL_HEADER: "750ms"}, 3, 4.0) == Hints(-2, 0.75)
    assert request_hints({}, None, "1m") == Hints(0, 60.0)
    assert request_hints({}) == Hints(0, None)


@pytest.mark.parametrize(
    ("headers", "ttl", "named"),
    [
        ({PRIORITY_HEADER: "high"}, None, PRIORITY_HEADER),
        ({TTL_HEADER: "forever"}, None, TTL_HEADER),
        ({TTL_HEADER: "0s"}, None, TTL_HEADER),
        ({}, -1.0, "nvext.request_ttl"),
        ({}, "2 days", "nvext.request_ttl"),
    ],
)
def test_a_hint_that_is_not_understood_is_a_400_naming_it(headers, ttl, named):
    with pytest.raises(InvalidRequest) as e:
        request_hints(headers, None, ttl)
    assert named in e.value.message and e.value.status == 400


def test_budget_follows_the_regime():
    # no worker: the scale-up budget from arrival
    assert budget(10.0, None, None, queue_ttl_s=5, scale_up_timeout_s=300) == (310.0, "model_scaling_up")
    # served: the queue TTL from arrival, or from when the model was served again
    assert budget(10.0, 0.0, None, queue_ttl_s=5, scale_up_timeout_s=300) == (15.0, "queue_timeout")
    assert budget(10.0, 200.0, None, queue_ttl_s=5, scale_up_timeout_s=300) == (205.0, "queue_timeout")
    # the request's own time to live bounds both
    assert budget(10.0, None, 12.0, queue_ttl_s=5, scale_up_timeout_s=300) == (12.0, "model_scaling_up")
    assert budget(10.0, 0.0, 11.0, queue_ttl_s=5, scale_up_timeout_s=300) == (11.0, "queue_timeout")


def _entry(*workers: InstanceRecord) -> ModelEntry:
    e = ModelEntry("m")
    for w in workers:
        e.workers[w.instance_id] = w
    return e


def test_capacity_is_the_serving_workers_slots():
    assert capacity(_entry(worker("agg", 3), worker("agg", 5))) == 8
    assert capacity(_entry(worker("agg", 3), worker("agg", None))) is None  # one without a bound
    # disaggregated: the decode workers of the revision requests go to
    prefill, decode = worker("prefill", 1), worker("decode", 4)
    stale = worker("decode", 100, revision="other")
    assert capacity(_entry(prefill, decode, stale)) == 4
    assert capacity(_entry(worker("decode", 4))) is None  # cannot serve: dispatch says why


# --- the queues -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"), build_tokenizer())


@pytest.fixture
async def registry(model_dir):
    async def load(_: InstanceRecord) -> Preprocessor:
        return Preprocessor.from_dir(model_dir)

    reg = ModelRegistry(Router("round-robin"), load, "ns", load_timeout_s=10, retention_s=600)
    yield reg
    await reg.close()


async def serve(reg: ModelRegistry, *workers: InstanceRecord) -> None:
    for w in workers:
        reg.apply(InstanceAdded(w))
    async with asyncio.timeout(10):
        while not reg.admissible("m"):
            await reg.wait_changed()


def admission(reg: ModelRegistry, **kw) -> tuple[Admission, FrontendMetrics]:
    metrics = FrontendMetrics()
    values = {"max_queued": 4, "queue_ttl_s": 30.0, "scale_up_timeout_s": 30.0} | kw
    return Admission(reg, metrics, **values), metrics


def gauge(metrics: FrontendMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


class Client:
    """A request that takes a slot and keeps it until released: what a streaming request does."""

    def __init__(self, adm: Admission, hints: Hints = Hints(), model: str = "m") -> None:
        self.admitted = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run(adm, hints, model))

    async def _run(self, adm: Admission, hints: Hints, model: str) -> None:
        async with adm.slot(model, hints):
            self.admitted.set()
            await self.release.wait()

    async def error(self) -> ApiError:
        async with asyncio.timeout(10):
            with pytest.raises(ApiError) as e:
                await self.task
        return e.value


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_full_queue_is_429_at_once(registry):
    await serve(registry, worker("agg", slots=1))
    adm, metrics = admission(registry, max_queued=1)
    running, waiting = Client(adm), Client(adm)
    await asyncio.wait_for(running.admitted.wait(), 5)
    await settle()
    assert adm.waiting("m") == 1 and gauge(metrics, "dynamo_frontend_queued_requests", model="m") == 1
    refused = Client(adm)
    err = await refused.error()
    assert err.status == 429 and err.code == "queue_full" and err.headers["Retry-After"] == "1"
    assert err.headers[DROPPED_REASON_HEADER] == "rejected-saturated"
    assert "--max-queued-requests" in err.message
    assert gauge(metrics, "dynamo_frontend_queue_rejected_total", model="m", reason="queue_full") == 1
    running.release.set()
    await asyncio.wait_for(waiting.admitted.wait(), 5)  # the slot went to the one that waited
    waiting.release.set()
    await asyncio.gather(running.task, waiting.task)
    assert adm.inflight("m") == 0 and gauge(metrics, "dynamo_frontend_queued_requests", model="m") == 0


async def test_priority_orders_the_queue_and_displaces_the_lowest(registry):
    await serve(registry, worker("agg", slots=1))
    adm, metrics = admission(registry, max_queued=2)
    running = Client(adm)
    await asyncio.wait_for(running.admitted.wait(), 5)
    low, mid = Client(adm, Hints(priority=0)), Client(adm, Hints(priority=5))
    await settle()
    urgent = Client(adm, Hints(priority=9))  # the queue is full: the lowest waiter gives way
    err = await low.error()
    assert err.status == 429 and "higher priority" in err.message
    assert gauge(metrics, "dynamo_frontend_queue_rejected_total", model="m", reason="shed") == 1
    equal = Client(adm, Hints(priority=5))  # outranks nobody: refused itself
    assert (await equal.error()).status == 429
    running.release.set()
    await asyncio.wait_for(urgent.admitted.wait(), 5)
    assert not mid.admitted.is_set()  # arrived first, but ranks lower
    urgent.release.set()
    await asyncio.wait_for(mid.admitted.wait(), 5)
    mid.release.set()
    await asyncio.gather(running.task, urgent.task, mid.task)


async def test_a_waiter_is_answered_at_its_deadline_not_before(registry):
    await serve(registry, worker("agg", slots=1))
    adm, metrics = admission(registry, queue_ttl_s=30.0)
    running = Client(adm)
    await asyncio.wait_for(running.admitted.wait(), 5)
    t0 = time.monotonic()
    late = Client(adm, Hints(ttl_s=0.3))
    err = await late.error()
    waited = time.monotonic() - t0
    assert waited >= 0.3
    assert err.status == 503 and err.code == "queue_timeout" and err.headers["Retry-After"] == "1"
    assert err.headers[DROPPED_REASON_HEADER] == "rejected-ttl-expired"
    assert gauge(metrics, "dynamo_frontend_queue_expired_total", model="m", reason="deadline") == 1
    assert adm.waiting("m") == 0
    running.release.set()
    await running.task


async def test_a_kept_model_holds_requests_until_a_worker_registers(registry):
    agg = worker("agg", slots=1)
    await serve(registry, agg)
    adm, metrics = admission(registry, scale_up_timeout_s=30.0)
    registry.apply(InstanceRemoved(agg.instance_id, agg))  # its last worker left: kept (retention)
    assert registry.keeps("m") and "m" in registry.listed() and not registry.admissible("m")
    held = Client(adm)
    await settle()
    assert not held.admitted.is_set() and gauge(metrics, "dynamo_frontend_queued_requests", model="m") == 1
    registry.apply(InstanceAdded(worker("agg", slots=1)))  # a worker is back (its card is cached)
    await asyncio.wait_for(held.admitted.wait(), 5)
    held.release.set()
    await held.task


async def test_a_held_request_gets_503_scaling_up_when_no_worker_comes(registry):
    agg = worker("agg")
    await serve(registry, agg)
    adm, metrics = admission(registry, scale_up_timeout_s=0.3)
    registry.apply(InstanceRemoved(agg.instance_id, agg))
    t0 = time.monotonic()
    err = await Client(adm).error()
    assert time.monotonic() - t0 >= 0.3
    assert err.status == 503 and err.code == "model_scaling_up" and "scaling up" in err.message
    assert err.headers["Retry-After"] == "5" and err.headers[DROPPED_REASON_HEADER] == "rejected-no-endpoints"
    assert gauge(metrics, "dynamo_frontend_queue_expired_total", model="m", reason="scaling_up") == 1


async def test_a_model_back_from_zero_gives_its_waiters_a_fresh_queue_budget(registry):
    agg = worker("agg", slots=1)
    await serve(registry, agg)
    adm, _ = admission(registry, queue_ttl_s=0.5, scale_up_timeout_s=30.0)
    registry.apply(InstanceRemoved(agg.instance_id, agg))
    first, second = Client(adm), Client(adm)
    await asyncio.sleep(0.6)  # longer than the queue TTL, while nobody serves the model: still held
    assert first.task.done() is False and second.task.done() is False
    registry.apply(InstanceAdded(worker("agg", slots=1)))
    await asyncio.wait_for(first.admitted.wait(), 5)
    # one slot: the second waits again, now on the queue TTL counted from the model's return
    err = await second.error()
    assert err.code == "queue_timeout"
    first.release.set()
    await first.task


async def test_unknown_models_are_not_held(registry):
    await serve(registry, worker("agg"))
    adm, _ = admission(registry)
    with pytest.raises(ModelNotFound):
        async with adm.slot("nope", Hints()):
            pass


async def test_a_client_that_leaves_while_waiting_frees_its_place(registry):
    await serve(registry, worker("agg", slots=1))
    adm, metrics = admission(registry)
    running, gone = Client(adm), Client(adm)
    await asyncio.wait_for(running.admitted.wait(), 5)
    await settle()
    gone.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone.task
    assert adm.waiting("m") == 0 and gauge(metrics, "dynamo_frontend_queued_requests", model="m") == 0
    running.release.set()
    await running.task
    assert adm.inflight("m") == 0


async def test_a_full_queue_of_a_model_without_workers_is_503_not_429(registry):
    agg = worker("agg")
    await serve(registry, agg)
    adm, _ = admission(registry, max_queued=1)
    registry.apply(InstanceRemoved(agg.instance_id, agg))
    held = Client(adm)
    await settle()
    err = await Client(adm).error()
    assert err.status == 503 and err.code == "model_scaling_up"
    assert err.headers[DROPPED_REASON_HEADER] == "rejected-no-endpoints"
    held.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await held.task
