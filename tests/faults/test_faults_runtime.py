"""Runtime faults: a failing health canary, and NATS restarted under a running graph. Real mocker
processes, a real nats-server restarted on its port, the real frontend and the ``openai`` client.

Bounds:
- ``DEREGISTER_BOUND_S`` 2 s: from the engine fault to no new traffic on the worker (health checked
  every 0.2 s here, plus the discovery watch; 2 s leaves room for a loaded 2-core machine).
- ``LIVENESS_BOUND_S``: ``--liveness-fail-after-s`` (3 s here) plus 2 s, after which Kubernetes'
  liveness probe sees 503 and restarts the container.
- ``NATS_RECOVERY_BOUND_S`` 10 s: from nats-server answering again to the frontend seeing every worker
  (NATS clients reconnect every 0.5 s; a worker heartbeats every TTL/3 = 1 s here).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import urllib.error
import urllib.request

import pytest
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.runtime.discovery import register
from dynamo_worker.runtime.nats_server import NatsServer
from dynamo_worker.runtime.settings import new_instance_id
from dynamo_worker.runtime.worker import connect_nats

from tests.faults.test_faults_workers import MESSAGES, MODEL, WAIT_S, client, metric, until
from tests.support.procs import die_with_parent

pytestmark = pytest.mark.integration

DEREGISTER_BOUND_S = 2.0
LIVENESS_FAIL_AFTER_S = 3.0
LIVENESS_BOUND_S = LIVENESS_FAIL_AFTER_S + 2.0
NATS_RECOVERY_BOUND_S = 10.0


def live_status(m) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.system_port}/live", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def served(m) -> float:
    text = m.metrics()
    return sum(metric(text, "dynamo_worker_requests_total", f'outcome="{o}"') for o in ("length", "stop"))


async def test_failing_canary_deregisters_then_fails_liveness_then_recovers(
    mockers, frontend_factory, wait_workers, fault_row, tmp_path
):
    row = fault_row(
        "health canary fails",
        "engine fault on 1 of 2 workers: deregistered (no new traffic), /live 503 after 3s, "
        "back when healthy",
        DEREGISTER_BOUND_S,
    )
    fault = tmp_path / "engine-fault"
    flags = ("--health-fault-file", str(fault), "--health-check-interval-s", "0.2")
    sick = mockers("null", *flags, "--liveness-fail-after-s", str(LIVENESS_FAIL_AFTER_S))
    well = mockers("null")
    fe = await frontend_factory()
    await wait_workers(fe, 2, mockers=[sick, well])
    entry = fe.registry.get(MODEL)

    fault.touch()
    broke = time.monotonic()
    row.answered(await until(lambda: len(entry.workers) == 1, "the sick worker to leave discovery"))
    before = served(sick)
    async with client(fe) as c:
        for _ in range(6):
            r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
            assert r.choices[0].finish_reason == "length"
    assert served(sick) == before, "the deregistered worker still got traffic"
    assert live_status(sick) == 200  # not yet: the worker gets --liveness-fail-after-s to recover
    await until(lambda: live_status(sick) == 503, "/live to fail", within_s=WAIT_S)
    failed_live = time.monotonic() - broke
    assert LIVENESS_FAIL_AFTER_S <= failed_live <= LIVENESS_BOUND_S, failed_live

    fault.unlink()
    back = await until(lambda: len(entry.workers) == 2, "the healed worker to register again")
    row.answered(back)
    assert live_status(sick) == 200
    assert row.within_bound()


@pytest.mark.parametrize("keep_storage", [True, False], ids=["storage-kept", "storage-lost"])
async def test_nats_restart_keeps_streams_and_discovery(
    keep_storage, mockers, frontend_factory, wait_workers, fault_row, tmp_path
):
    row = fault_row(
        "NATS restart" + ("" if keep_storage else ", storage lost"),
        "SIGKILL nats-server mid-stream, start it again on its port "
        + ("with its storage" if keep_storage else "with empty storage")
        + ": stream unaffected, discovery back",
        NATS_RECOVERY_BOUND_S,
    )
    broker = NatsServer(store_dir=tmp_path / "nats", command_prefix=die_with_parent()).start()
    try:
        ttl = ("--nats-server", broker.url, "--discovery-ttl", "3")
        a = mockers("null", *ttl, speedup=1.0)
        fe = await frontend_factory(nats_server=broker.url)
        await wait_workers(fe, 1, mockers=[a])
        async with client(fe) as c:
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=400,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            usage, restarted = None, False
            async with asyncio.timeout(WAIT_S):
                async for chunk in stream:
                    usage = chunk.usage or usage
                    if not restarted and chunk.choices and chunk.choices[0].delta.content:
                        broker.proc.kill()  # abrupt, like a crashed pod
                        broker.proc.wait(10)
                        if not keep_storage:
                            shutil.rmtree(broker.store_dir)
                        broker.start()
                        restarted = True  # measure discovery's blind time while the stream goes on
                        probe = asyncio.create_task(watched_after_restart(broker.url, fe))
            row.lost = int(usage is None or usage.completion_tokens != 400)
            assert usage is not None and usage.completion_tokens == 400, "the in-flight stream was cut"

            # the frontend re-watched: a record written after the restart reaches it
            row.answered(await probe)
            b = mockers("null", *ttl)
            entry = fe.registry.get(MODEL)
            await until(
                lambda: len(entry.workers) == 2, "the frontend to see a worker started after the restart"
            )
            # the worker registered before the restart outlives its TTL: its heartbeats re-registered it
            await asyncio.sleep(3.5)
            assert len(entry.workers) == 2
            for _ in range(4):
                r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
                assert r.choices[0].finish_reason == "length"
            assert served(a) > 0 and served(b) > 0
        assert row.within_bound(), f"workers seen again {row.observed_s:.2f}s after the restart"
    finally:
        broker.stop()


async def watched_after_restart(url: str, fe) -> float:
    """Seconds from now until a record the test registers (as soon as NATS takes writes again) is in
    the frontend's registry: the time the frontend's discovery is blind after a restart."""
    started = time.monotonic()
    nc = await connect_nats(url, name="fault-probe")
    try:
        record = InstanceRecord(
            instance_id=new_instance_id(), namespace=fe.settings.namespace, component="probe", role="agg",
            model="nats-restart-probe", address="127.0.0.1:9", page_size=4, total_kv_blocks=1,
        )  # fmt: skip
        registration = await register(nc, record, ttl=30)
        await until(
            lambda: fe.registry.get("nats-restart-probe") is not None, "the frontend to see a new record"
        )
        seconds = time.monotonic() - started
        await registration.deregister()
        return seconds
    finally:
        await nc.close()
