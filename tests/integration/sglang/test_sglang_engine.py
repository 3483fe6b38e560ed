"""``SglangEngine``: startup (what it registers, SIGTERM kept by the worker, the prefill bootstrap port
checked and re-chosen on a conflict with a new ServerArgs), the resolved ServerArgs values it registers
(served name, page size, dp ranks of both dp-attention spellings), the background canary behind
/health, load reports, and stop.

SGLang itself needs a GPU, which this machine lacks, so the engine factory returns
``tests.support.sglang_fake.FakeSglangEngine`` (same ``async_generate`` signature and output shapes)
and ``ServerArgs`` is ``FakeServerArgs``, read-only once constructed like SGLang's (SGLang's own class
cannot be imported without torch).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import threading
from typing import Any

import pytest
from dynamo_worker.protocol import GenerateRequest, StopConditions
from dynamo_worker.runtime.engine import LoadSnapshot
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.sglang.args import SglangSettings, WorkerPlan
from dynamo_worker.sglang.engine import EngineStartError, SglangEngine
from dynamo_worker.sglang.probes import canary, diagnose
from prometheus_client import CollectorRegistry

from tests.support.sglang_fake import (
    FAKE_BOOTSTRAP_HOST,
    FakeBootstrapServer,
    FakeServerArgs,
    FakeSglangEngine,
    eventually,
)
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration

FAST = SglangSettings(
    canary_interval_s=0.05,
    canary_timeout_s=1.0,
    load_interval_s=0.05,
    capacity_timeout_s=2,
    warmup_timeout_s=2,
)


def plan(tmp_path, mode: str = "null", *, chosen: bool = False, server_args: Any = None) -> WorkerPlan:
    server_args = server_args or FakeServerArgs(
        model_path=str(tmp_path), served_model_name="m", disaggregation_mode=mode
    )
    return WorkerPlan(
        server_args=server_args,
        runtime=RuntimeSettings(listen_host="127.0.0.1", advertise_host="10.0.0.9"),
        settings=FAST,
        bootstrap_port_chosen=chosen,
        bootstrap_host="10.0.0.9",
        fake_bootstrap_host=FAKE_BOOTSTRAP_HOST,
        build_server_args=lambda changes: dataclasses.replace(server_args, **changes),
    )


class Sink:
    def __init__(self) -> None:
        self.loads: list[LoadSnapshot] = []

    def kv_events(self, events, dp_rank: int = 0) -> None:
        return None

    def load(self, snapshot: LoadSnapshot) -> None:
        self.loads.append(snapshot)


async def test_agg_start_reports_capacity_and_keeps_the_workers_sigterm_handler(tmp_path):
    loop = asyncio.get_running_loop()
    ours = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, ours.set)
    made: list[FakeSglangEngine] = []
    engine = SglangEngine(
        plan(tmp_path), engine_factory=lambda a: made.append(FakeSglangEngine(a)) or made[-1]
    )
    sink = Sink()
    engine.attach_events(sink)
    registry = CollectorRegistry()
    engine.register_metrics(registry)
    try:
        info = await engine.start()
        assert engine.role == "agg"
        assert (info.model_name, info.page_size, info.total_kv_blocks) == ("m", 16, 4096 // 16)
        assert info.max_running_requests == 64 and info.dp_size == 1 and info.context_length == 8192
        assert info.bootstrap_host is None and info.bootstrap_port is None
        assert info.model_dir == tmp_path
        assert made[0].tokenizer_manager.handle_loop_started
        assert loop._signal_handlers[signal.SIGTERM]._callback == ours.set  # SGLang's was put back
        await eventually(lambda: sink.loads, 5, "a load report")
        assert sink.loads[0].total_blocks == 256
        assert registry.get_sample_value("dynamo_sglang_total_kv_tokens", {"dp_rank": "0"}) == 4096
        await engine.health_check()
    finally:
        await engine.stop()
        loop.remove_signal_handler(signal.SIGTERM)
    assert made[0].shut_down


async def test_prefill_registers_its_bootstrap_address(tmp_path):
    engine = SglangEngine(plan(tmp_path, "prefill"), engine_factory=FakeSglangEngine)
    try:
        info = await engine.start()
        assert engine.role == "prefill"
        assert (info.bootstrap_host, info.bootstrap_port) == ("10.0.0.9", 8998)
    finally:
        await engine.stop()


async def test_a_chosen_bootstrap_port_taken_meanwhile_is_chosen_again(tmp_path):
    alive = threading.Event()
    running = threading.Thread(target=alive.wait, daemon=True)
    running.start()
    made: list[FakeSglangEngine] = []

    def factory(server_args):
        made.append(FakeSglangEngine(server_args))
        thread = running if len(made) > 1 else threading.Thread(daemon=True)  # first: the bind failed
        made[-1].tokenizer_manager.bootstrap_server = FakeBootstrapServer(thread)
        return made[-1]

    p = plan(tmp_path, "prefill", chosen=True)
    engine = SglangEngine(p, engine_factory=factory)
    try:
        info = await engine.start()
        assert len(made) == 2 and made[0].shut_down and not made[1].shut_down
        # The second engine got a new ServerArgs with a new port; the first one is left as it was
        # (assigning to it raises, as SGLang's read-only ServerArgs does).
        assert made[0].server_args is p.server_args and p.server_args.disaggregation_bootstrap_port == 8998
        assert made[1].server_args is not p.server_args
        assert info.bootstrap_port == made[1].server_args.disaggregation_bootstrap_port != 8998
    finally:
        await engine.stop()
        alive.set()


async def test_a_bootstrap_port_that_never_binds_fails_startup_with_the_fix(tmp_path):
    def factory(server_args):
        fake = FakeSglangEngine(server_args)
        fake.tokenizer_manager.bootstrap_server = FakeBootstrapServer(threading.Thread(daemon=True))
        return fake

    engine = SglangEngine(plan(tmp_path, "prefill", chosen=True), engine_factory=factory)
    with pytest.raises(EngineStartError, match="--disaggregation-bootstrap-port"):
        await engine.start()
    await engine.stop()


@pytest.mark.parametrize("mode", ["null", "prefill", "decode"])
async def test_canary_answers_for_every_role(mode):
    fake = FakeSglangEngine(FakeServerArgs(disaggregation_mode=mode))
    role = {"null": "agg", "prefill": "prefill", "decode": "decode"}[mode]
    assert await canary(fake, role, FAKE_BOOTSTRAP_HOST, 2.0) is None
    if role != "agg":
        assert fake.calls[0]["bootstrap_host"] == FAKE_BOOTSTRAP_HOST
    assert fake.tokenizer_manager.aborted == []


async def unhealthy(engine: SglangEngine) -> str | None:
    """The health check's complaint, or None while it passes."""
    try:
        await engine.health_check()
    except RuntimeError as e:
        return str(e)
    return None


async def test_a_blocked_scheduler_fails_the_canary_and_health(tmp_path):
    gate = asyncio.Event()
    fake = FakeSglangEngine(FakeServerArgs(), first_token_gate=gate)
    problem = await canary(fake, "agg", FAKE_BOOTSTRAP_HOST, 0.2)
    assert "did not answer a canary request" in problem
    assert len(fake.tokenizer_manager.aborted) == 1

    made: list[FakeSglangEngine] = []
    engine = SglangEngine(
        plan(tmp_path), engine_factory=lambda a: made.append(FakeSglangEngine(a)) or made[-1]
    )
    try:
        await engine.start()  # warmed up and registered while SGLang answers
        made[0].first_token_gate = gate  # then its scheduler stops answering anything
        made[0].tokenizer_manager.blocked = gate
        why = await wait_until_async(
            lambda: unhealthy(engine), "the canary to fail the health check", timeout_s=15, interval_s=0.05
        )
        assert "canary" in why and "blocked" in why, why
    finally:
        gate.set()
        await engine.stop()


async def test_a_busy_engine_keeps_its_health_when_a_canary_waits(tmp_path, caplog):
    """A canary that waits behind running requests is slowness, not a failure: /health stays 200 (a
    worker deregistered for being busy would only move its load elsewhere)."""
    import logging

    gate = asyncio.Event()
    made: list[FakeSglangEngine] = []
    engine = SglangEngine(
        plan(tmp_path), engine_factory=lambda a: made.append(FakeSglangEngine(a)) or made[-1]
    )
    caplog.set_level(logging.WARNING, logger="dynamo_worker.sglang.engine")
    try:
        await engine.start()
        made[0].first_token_gate = gate  # a long request runs and holds the canary behind it
        request = GenerateRequest(
            request_id="long", model="m", token_ids=[1, 2, 3], stop=StopConditions(max_tokens=4)
        )
        user = asyncio.create_task(anext(engine.generate(request)))
        await wait_until_async(
            lambda: "the engine is healthy" in caplog.text, "a slow canary to be diagnosed", timeout_s=15
        )
        assert "busy (1 running" in caplog.text
        assert await unhealthy(engine) is None
        gate.set()
        assert (await user).token_ids, "the long request goes on once the engine has capacity again"
    finally:
        gate.set()
        await engine.stop()


@pytest.mark.parametrize(
    ("role", "disagg", "healthy", "said"),
    [
        ("prefill", {"prefill_bootstrap_queue_reqs": 2}, False, "KV transfer is stuck"),
        ("decode", {"decode_transfer_queue_reqs": 1}, False, "KV transfer is stuck"),
        ("decode", {}, False, "runs nothing"),
        ("agg", {}, False, "runs nothing"),
    ],
)
async def test_diagnose_tells_a_stuck_kv_transfer_from_an_idle_engine(role, disagg, healthy, said):
    from tests.support.sglang_fake import FakeDisaggregation, FakeLoad

    fake = FakeSglangEngine(FakeServerArgs())
    fake.tokenizer_manager.loads = [FakeLoad(disaggregation=FakeDisaggregation(**disagg))]
    ok, why = await diagnose(fake, role)
    assert ok is healthy and said in why, why


async def test_diagnose_calls_a_scheduler_whose_load_reports_stopped_blocked():
    """SGLang 0.5.17 answers load queries from the snapshots its scheduler publishes: one that stopped
    publishing (its loop does not turn) is blocked even though the query itself answers at once."""
    import time

    from tests.support.sglang_fake import FakeLoad, FakeQueues

    fake = FakeSglangEngine(FakeServerArgs())
    fake.tokenizer_manager.loads = [FakeLoad(queues=FakeQueues(waiting=3), timestamp=time.time() - 60)]
    ok, why = await diagnose(fake, "prefill")
    assert not ok and "no load report for 60s" in why and "blocked" in why, why
    fake.tokenizer_manager.loads = [FakeLoad(queues=FakeQueues(waiting=3), timestamp=time.time())]
    assert (await diagnose(fake, "prefill"))[0], "a fresh report with running requests is busy"


async def test_diagnose_calls_a_queue_busy(tmp_path):
    from tests.support.sglang_fake import FakeDisaggregation, FakeLoad, FakeQueues

    fake = FakeSglangEngine(FakeServerArgs())
    fake.tokenizer_manager.loads = [
        FakeLoad(
            queues=FakeQueues(waiting=5), disaggregation=FakeDisaggregation(prefill_bootstrap_queue_reqs=3)
        )
    ]
    ok, why = await diagnose(fake, "prefill")
    assert ok and "5 queued for compute" in why, why


@pytest.mark.parametrize("mode", ["null", "prefill", "decode"])
async def test_warmup_serves_prompts_of_every_kernel_shape_to_the_end_before_registration(tmp_path, mode):
    """After one greedy one-token request alone, a user's first request loaded SGLang's kernels (5-6 times
    the steady TTFT on an H200, the sampler's above all): the warm-up serves a greedy page-aligned prompt
    alone, then two sampled ones at once (an unaligned one, a cached prefix extended), each to its last
    token, through the fake bootstrap host when disaggregated."""
    made: list[FakeSglangEngine] = []
    engine = SglangEngine(
        plan(tmp_path, mode), engine_factory=lambda a: made.append(FakeSglangEngine(a)) or made[-1]
    )
    try:
        await engine.start()
        warmups = [c for c in made[0].calls if c["rid"].startswith("engine-warmup-")]
        assert [len(c["input_ids"]) for c in warmups] == [64, 37, 83]
        assert warmups[2]["input_ids"][:64] == warmups[0]["input_ids"]  # extends the first one's prefix
        tokens = 1 if mode == "prefill" else 8
        assert all(c["sampling_params"]["max_new_tokens"] == tokens for c in warmups)
        assert all(
            c.get("bootstrap_host") == (None if mode == "null" else FAKE_BOOTSTRAP_HOST) for c in warmups
        )
        assert made[0].calls[: len(warmups)] == warmups  # before anything else, registration included
        temperatures = [c["sampling_params"].get("temperature") for c in warmups]
        assert temperatures == [0.0, 1.0, 0.7] and warmups[2]["sampling_params"]["top_p"] == 0.9
        assert made[0].tokenizer_manager.aborted == []  # every one ran to its end
    finally:
        await engine.stop()


async def test_warmup_prompts_fit_a_short_context(tmp_path):
    def short(args: Any) -> FakeSglangEngine:
        fake = FakeSglangEngine(args, max_input_len=40)
        fake.tokenizer_manager.context_len = 40
        made.append(fake)
        return fake

    made: list[FakeSglangEngine] = []
    engine = SglangEngine(plan(tmp_path), engine_factory=short)
    try:
        await engine.start()
        assert [len(c["input_ids"]) for c in made[0].calls[:3]] == [31, 31, 31]  # 40 - 8 tokens - 1
    finally:
        await engine.stop()


async def test_a_warmup_that_fails_or_runs_out_stops_startup_naming_the_flag(tmp_path):
    gate = asyncio.Event()
    p = plan(tmp_path)
    p.settings = FAST.model_copy(update={"warmup_timeout_s": 0.3})
    engine = SglangEngine(p, engine_factory=lambda a: FakeSglangEngine(a, first_token_gate=gate))
    with pytest.raises(EngineStartError, match=r"did not finish within 0\.3s.*--warmup-timeout-s"):
        await engine.start()
    await engine.stop()

    engine = SglangEngine(
        plan(tmp_path), engine_factory=lambda a: FakeSglangEngine(a, abort_message="CUDA error")
    )
    with pytest.raises(EngineStartError, match=r"warmup requests: .*CUDA error"):
        await engine.start()
    await engine.stop()


async def test_generate_before_start_is_a_programming_error(tmp_path):
    with pytest.raises(RuntimeError, match="before start"):
        SglangEngine(plan(tmp_path), engine_factory=FakeSglangEngine).generate(None)


async def test_a_multinode_follower_serves_live_registers_nothing_and_stops(tmp_path, caplog):
    import logging
    import threading
    import urllib.request

    from dynamo_worker.runtime.listening import bound_ports
    from dynamo_worker.sglang.__main__ import run_follower

    released = threading.Event()
    killed: list[bool] = []
    p = plan(tmp_path)
    caplog.set_level(logging.INFO, logger="dynamo_worker")
    p.runtime = RuntimeSettings(listen_host="127.0.0.1", system_port=0, nats_server="nats://127.0.0.1:1")
    p.server_args = dataclasses.replace(p.server_args, node_rank=1)
    stop = asyncio.Event()

    def schedulers_run(server_args):  # SGLang's constructor blocks while this node's schedulers run
        released.wait(10)

    def kill_children():
        killed.append(True)
        released.set()

    task = asyncio.create_task(
        run_follower(p, engine_factory=schedulers_run, kill_children=kill_children, stop=stop)
    )
    port = await wait_until_async(
        lambda: bound_ports(caplog.text).get("system"), "the system server to listen", timeout_s=10
    )

    def live() -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=2) as r:
            return r.status

    async def answers() -> bool:
        try:
            return await asyncio.to_thread(live) == 200
        except OSError:
            return False

    await wait_until_async(answers, "/live to answer 200", timeout_s=10, interval_s=0.05)
    stop.set()
    assert await task == 0 and killed == [True]


async def test_a_follower_whose_schedulers_exit_ends_with_an_error(tmp_path):
    from dynamo_worker.sglang.__main__ import run_follower

    p = plan(tmp_path)
    p.runtime = RuntimeSettings(system_enabled=False)

    def schedulers_died(server_args):
        raise RuntimeError("scheduler exited")

    assert await run_follower(p, engine_factory=schedulers_died, kill_children=lambda: None) == 1


async def test_an_engine_that_does_not_load_in_time_is_stopped_and_named(tmp_path):
    loading = threading.Event()

    def slow_load(server_args):
        loading.wait(10)  # SGLang's constructor returns (raises) once its schedulers are gone
        raise RuntimeError("schedulers were killed")

    p = plan(tmp_path)
    p.settings = SglangSettings(engine_start_timeout_s=0.2)
    engine = SglangEngine(p, engine_factory=slow_load, kill_children=loading.set)
    with pytest.raises(EngineStartError, match="--engine-start-timeout-s"):
        await engine.start()
    assert loading.is_set()
    await engine.stop()
