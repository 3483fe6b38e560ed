"""A stand-in for ``sglang.srt.entrypoints.engine.Engine`` where SGLang cannot run: no GPU here.

Why a fake: SGLang needs CUDA and torch, which CI and this machine lack; the real engine is exercised by
``tests/gpu``. The fake keeps what our worker depends on and what the compatibility check verifies:
``async_generate`` has SGLang 0.5.17's exact signature (a test compares it with the pinned source), it
returns an async iterator of output dicts shaped like SGLang's with ``skip_tokenizer_init`` and
``incremental_streaming_output`` (``output_ids`` are the new ids; ``meta_info`` has ``finish_reason``
as SGLang's ``to_json()`` dicts, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``), and
``tokenizer_manager`` has ``abort_request``, ``auto_create_handle_loop``, ``get_loads`` and
``bootstrap_server``. LoRA: ``async_load_lora_adapter`` / ``async_unload_lora_adapter`` answer as
SGLang's ``LoRAUpdateOutput`` (``success``, ``error_message``, ``loaded_adapters``; past
``max_loaded_loras`` the least recently loaded unpinned adapter is evicted), and a request's
``lora_path`` shifts its tokens by the adapter (an adapter that is not loaded is SGLang's ValueError).

With ``child_processes``, it also starts real child processes titled as SGLang titles its schedulers and
detokenizer (``sglang::scheduler_TP0``, ``sglang::detokenizer``), listed in
``_scheduler_init_result.all_child_pids`` as SGLang lists them, and killed by ``shutdown`` (SGLang's
``kill_process_tree``): what a test SIGKILLs to kill the engine. Its tokenizer manager's
``auto_create_handle_loop`` installs SIGTERM and SIGQUIT handlers on the loop, as SGLang's does (its
SIGQUIT handler would kill the whole process tree: here it only records that it ran).

Its model is deterministic: token i of a completion is ``(sum(input_ids) + 7 * i) % vocab + 1``; the
prefix cache remembers prompts whole and reports them as cached on a repeat. A decode request waits
until the prefill request of the same ``bootstrap_room`` has finished (the same rendezvous SGLang's KV
transfer imposes), so a frontend that does not send both legs at once hangs here as it would there.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang.srt.disaggregation.utils.FAKE_BOOTSTRAP_HOST


@dataclass
class FakeQueues:
    """``LoadSnapshot.queues`` (0.5.17's ``QueueMetrics``): ``waiting`` is the compute waiting queue."""

    waiting: int = 0


@dataclass
class FakeDisaggregation:
    """``LoadSnapshot.disaggregation`` (0.5.17's ``DisaggregationMetrics``): the KV handoff queues."""

    prefill_bootstrap_queue_reqs: int = 0
    prefill_inflight_queue_reqs: int = 0
    decode_prealloc_queue_reqs: int = 0
    decode_transfer_queue_reqs: int = 0


@dataclass
class FakeLoad:
    """The fields of ``sglang.srt.managers.load_snapshot.LoadSnapshot`` the worker reads."""

    dp_rank: int = 0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_waiting_uncached_tokens: int = 0
    num_used_tokens: int = 0
    num_total_tokens: int = 0  # used plus every token of the waiting (and a prefill's bootstrap) queue
    max_total_num_tokens: int = 4096
    max_running_requests: int = 64
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0
    timestamp: float = 0.0  # when the scheduler published it (0: unknown, as this fake never publishes)
    queues: FakeQueues = field(default_factory=FakeQueues)
    disaggregation: FakeDisaggregation = field(default_factory=FakeDisaggregation)


@dataclass
class FakeBootstrapServer:
    thread: threading.Thread | None = None
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSchedulerInitResult:
    """``SchedulerInitResult``: the child pids SGLang started (schedulers, detokenizer)."""

    all_child_pids: list[int] = field(default_factory=list)


class _Done(threading.Thread):
    """A thread object that never ran: what SGLang's bootstrap server leaves when its bind failed."""

    def __init__(self) -> None:
        super().__init__(daemon=True)


class FakeTokenizerManager:
    def __init__(self, engine: FakeSglangEngine) -> None:
        self._engine = engine
        self.aborted: list[str] = []
        self.bootstrap_server: FakeBootstrapServer | None = None
        self.context_len = 8192
        self.loads = [FakeLoad()]
        self.handle_loop_started = False
        self.asyncio_tasks: set[asyncio.Task] = set()
        self.sglang_sigquit_ran = False  # SGLang's own SIGQUIT handler (kills the process tree) ran
        # While set and not yet open, load queries get no answer: a blocked scheduler, not a busy one.
        self.blocked: asyncio.Event | None = None

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        if abort_all:
            for event in self._engine.abort_events.values():
                event.set()
            return
        self.aborted.append(rid)
        event = self._engine.abort_events.get(rid)
        if event is not None:
            event.set()

    def auto_create_handle_loop(self) -> None:
        """Like SGLang's: installs its own SIGTERM handler on the running loop (the worker must undo it)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        loop.add_signal_handler(signal.SIGQUIT, self._sglang_sigquit)
        self.asyncio_tasks.add(loop.create_task(asyncio.Event().wait()))  # its handle loop, waiting forever
        self.handle_loop_started = True

    def _sglang_sigquit(self) -> None:
        self.sglang_sigquit_ran = True

    async def get_loads(self, include: list[str] | None = None, dp_rank: int | None = None) -> list[Any]:
        if self.blocked is not None:
            await self.blocked.wait()
        running = len(self._engine.abort_events)
        self.loads[0].num_running_reqs = running
        self.loads[0].num_used_tokens = 16 * running
        return list(self.loads)


@dataclass(frozen=True)
class FakeServerArgs:
    """The ``ServerArgs`` fields the worker reads, with SGLang's defaults. Frozen like SGLang's own:
    0.5.17's ``ServerArgs.__setattr__`` raises ``AttributeError`` once constructed (0.5.23's once the
    engine resolved it), so a worker that assigns a field instead of building a new ``ServerArgs``
    fails here as it would on a GPU. This is the 0.5.17 shape: the fields are the resolved values and
    there is no ``resolved_dict()``."""

    model_path: str = "fake-model"
    served_model_name: str = "fake-model"
    tokenizer_path: str | None = None
    page_size: int = 16
    dp_size: int = 1
    enable_dp_attention: bool = False
    host: str = "127.0.0.1"
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    skip_tokenizer_init: bool = True
    incremental_streaming_output: bool = True
    kv_events_config: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    is_embedding: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    grammar_backend: str | None = "xgrammar"
    enable_lora: bool | None = None
    lora_paths: list[Any] | None = None
    max_lora_rank: int | None = None
    lora_target_modules: list[str] | None = None
    max_loras_per_batch: int = 8
    max_loaded_loras: int | None = None
    load_format: str = "auto"


@dataclass
class FakeLoraResult:
    """SGLang's ``LoRAUpdateOutput``."""

    success: bool
    error_message: str | None = None
    loaded_adapters: dict[str, str] | None = None


@dataclass
class FakeSglangEngine:
    server_args: FakeServerArgs = field(default_factory=FakeServerArgs)
    vocab: int = 1000
    eos_token_id: int | None = None  # generating this id ends a request with a "stop" finish
    token_delay_s: float = 0.0
    first_token_gate: asyncio.Event | None = None  # when set: no token before the gate opens
    abort_message: str | None = None  # when set: every request ends with this SGLang abort
    max_input_len: int = 4096
    calls: list[dict[str, Any]] = field(default_factory=list)
    abort_events: dict[str, asyncio.Event] = field(default_factory=dict)
    shut_down: bool = False
    child_processes: bool = False  # start real children titled as SGLang's scheduler and detokenizer

    def __post_init__(self) -> None:
        self.tokenizer_manager = FakeTokenizerManager(self)
        self._cache: set[tuple[int, ...]] = set()
        self._finished_rooms: dict[int, asyncio.Event] = {}
        self._children: list[subprocess.Popen[bytes]] = []
        if self.child_processes:
            for title in ("sglang::scheduler_TP0", "sglang::detokenizer"):
                self._children.append(
                    subprocess.Popen(
                        [sys.executable, "-c", "import sys; sys.stdin.buffer.read()", title],
                        stdin=subprocess.PIPE,
                    )
                )
        self._scheduler_init_result = FakeSchedulerInitResult([c.pid for c in self._children])
        self.loras: dict[str, tuple[str, bool]] = {}  # name -> (path, pinned), in load order
        for item in self.server_args.lora_paths or []:
            name, _, path = str(item).partition("=")
            self.loras[name] = (path, False)

    def child(self, title: str) -> int:
        """The pid of the child titled ``sglang::<title>``."""
        return next(c.pid for c in self._children if f"sglang::{title}" in c.args)

    async def async_load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False) -> Any:
        if not (self.server_args.enable_lora or self.server_args.lora_paths):
            return FakeLoraResult(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if lora_name in self.loras:
            return FakeLoraResult(
                False, f"Failed to load LoRA adapter {lora_name} because it is already loaded"
            )
        self.loras[lora_name] = (lora_path, pinned)
        cap = self.server_args.max_loaded_loras
        while cap is not None and len(self.loras) > cap:
            victim = next((n for n, (_, p) in self.loras.items() if not p and n != lora_name), None)
            if victim is None:
                raise ValueError("Didn't find any LoRA adapters when trying to evict LRU LoRA adapter.")
            del self.loras[victim]
        return FakeLoraResult(True, None, {n: p for n, (p, _) in self.loras.items()})

    async def async_unload_lora_adapter(self, lora_name: str) -> Any:
        if lora_name not in self.loras:
            return FakeLoraResult(
                False, f"LoRA with name {lora_name} does not exist. Loaded LoRAs: {list(self.loras)}"
            )
        del self.loras[lora_name]
        return FakeLoraResult(True, None, {n: p for n, (p, _) in self.loras.items()})

    def lora_shift(self, lora_path: str | None) -> int:
        """How much an adapter moves every token id (0: the base model)."""
        return 0 if lora_path is None else 1 + sum(map(ord, lora_path)) % 97

    def shutdown(self) -> None:
        self.shut_down = True
        for child in self._children:  # SGLang's kill_process_tree: SIGKILL, then reap
            if child.poll() is None:
                child.kill()
            child.wait(5)
            if child.stdin is not None:
                child.stdin.close()

    def _room(self, room: int) -> asyncio.Event:
        return self._finished_rooms.setdefault(room, asyncio.Event())

    # SGLang 0.5.17's signature, keyword for keyword (tests/unit/sglang compares it with the source).
    async def async_generate(
        self,
        prompt: list[str] | str | None = None,
        sampling_params: list[dict] | dict | None = None,
        input_ids: list[list[int]] | list[int] | None = None,
        image_data: Any | None = None,
        audio_data: Any | None = None,
        video_data: Any | None = None,
        mm_hashes: list[str] | list[list[str]] | None = None,
        return_logprob: list[bool] | bool | None = False,
        logprob_start_len: list[int] | int | None = None,
        top_logprobs_num: list[int] | int | None = None,
        token_ids_logprob: list[list[int]] | list[int] | None = None,
        lora_path: list[str | None] | None = None,
        custom_logit_processor: list[str] | str | None = None,
        require_reasoning: bool = False,
        return_hidden_states: Any = False,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        stream: bool = False,
        bootstrap_host: list[str] | str | None = None,
        bootstrap_port: list[int] | int | None = None,
        bootstrap_room: list[int] | int | None = None,
        routed_dp_rank: int | None = None,
        disagg_prefill_dp_rank: int | None = None,
        data_parallel_rank: int | None = None,
        external_trace_header: dict | None = None,
        rid: list[str] | str | None = None,
        session_params: dict | None = None,
        priority: int | None = None,
        session_id: str | None = None,
    ) -> Any:
        call = {k: v for k, v in locals().items() if k != "self" and v not in (None, False, 0)}
        self.calls.append(call)
        assert isinstance(rid, str) and isinstance(input_ids, list) and isinstance(sampling_params, dict)
        if lora_path is not None and lora_path not in self.loras:  # as SGLang's LoRARegistry.acquire
            raise ValueError(f"The following requested LoRA adapters are not loaded: {lora_path}")
        generator = self._generate(
            list(input_ids), dict(sampling_params), rid, bootstrap_host, bootstrap_room, lora_path
        )
        return generator if stream else await generator.__anext__()

    async def _generate(
        self,
        ids: list[int],
        params: dict[str, Any],
        rid: str,
        host: str | None,
        room: int | None,
        lora_path: Any = None,
    ) -> Any:
        if len(ids) > self.max_input_len:
            raise ValueError(f"The input ({len(ids)} tokens) is longer than the model's context length")
        mode = self.server_args.disaggregation_mode
        if mode != "null" and host is None:
            raise ValueError("Disaggregated requests need bootstrap_host and bootstrap_room")
        aborted = self.abort_events.setdefault(rid, asyncio.Event())
        try:
            cached = len(ids) if tuple(ids) in self._cache else 0
            self._cache.add(tuple(ids))
            meta = {"id": rid, "prompt_tokens": len(ids), "cached_tokens": cached, "finish_reason": None}
            if self.abort_message is not None:
                reason = {
                    "type": "abort",
                    "message": self.abort_message,
                    "status_code": 500,
                    "err_type": None,
                }
                yield {
                    "output_ids": [],
                    "meta_info": {**meta, "finish_reason": reason, "completion_tokens": 0},
                }
                return
            if mode == "decode" and host != FAKE_BOOTSTRAP_HOST:
                await self._wait(self._room(room or 0).wait(), aborted)
            if self.first_token_gate is not None:
                await self._wait(self.first_token_gate.wait(), aborted)
            stops = set(params.get("stop_token_ids") or ())
            if self.eos_token_id is not None and not params.get("ignore_eos"):
                stops.add(self.eos_token_id)
            limit = int(params.get("max_new_tokens", 128))
            for i in range(limit):
                if aborted.is_set():
                    reason = {"type": "abort", "message": "Abort in waiting queue", "status_code": None}
                    yield {
                        "output_ids": [],
                        "meta_info": {**meta, "finish_reason": reason, "completion_tokens": i},
                    }
                    return
                token = (sum(ids) + 7 * i + self.lora_shift(lora_path)) % self.vocab + 1
                done = token in stops or i + 1 == limit
                if done:
                    reason = (
                        {"type": "stop", "matched": token}
                        if token in stops
                        else {"type": "length", "length": limit}
                    )
                    if mode == "prefill":
                        self._room(room or 0).set()
                    yield {
                        "output_ids": [token],
                        "meta_info": {**meta, "finish_reason": reason, "completion_tokens": i + 1},
                    }
                    return
                yield {"output_ids": [token], "meta_info": {**meta, "completion_tokens": i + 1}}
                await self._wait(asyncio.sleep(self.token_delay_s), aborted)
        finally:
            self.abort_events.pop(rid, None)

    @staticmethod
    async def _wait(awaitable: Any, aborted: asyncio.Event) -> None:
        """Wait for ``awaitable`` unless the request is aborted first."""
        task = asyncio.ensure_future(awaitable)
        abort = asyncio.ensure_future(aborted.wait())
        await asyncio.wait([task, abort], return_when=asyncio.FIRST_COMPLETED)
        for t in (task, abort):
            t.cancel()

    def expected_tokens(self, ids: list[int], n: int, lora: str | None = None) -> list[int]:
        return [(sum(ids) + 7 * i + self.lora_shift(lora)) % self.vocab + 1 for i in range(n)]


async def eventually(predicate: Any, within_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate()`` until it is true; fail after ``within_s`` seconds."""
    try:
        async with asyncio.timeout(within_s):
            while True:
                if predicate():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what} not reached within {within_s}s") from None
