"""The mocker's scheduler step, pure: one request in the engine (``Seq``), which waiting requests join
the batch (``admit``), the token a sequence generates next (``next_token``), and which sequences a step
advances and how long it takes (``batch_step``). The engine (``mocker.engine``) applies the decisions:
it sends tokens, publishes KV events and load, and sleeps the step's simulated time."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from dynamo_worker.mocker.kv_manager import BlockManager
from dynamo_worker.mocker.lora import MockLoras
from dynamo_worker.mocker.outbox import Outbox
from dynamo_worker.mocker.tokens import TokenSampler
from dynamo_worker.protocol import ErrorType, GenerateChunk, GenerateRequest, KvEvent, WorkerError

__all__ = ["Join", "Refuse", "Seq", "admit", "batch_step", "error_chunk", "hands_over", "next_token"]


@dataclass(eq=False)
class Seq:
    key: str
    request: GenerateRequest
    tokens: list[int]  # tokens that need KV: the prompt (+ generated ones after a preemption)
    max_new: int
    digest: int  # the token state after the prompt (``tokens.prompt_digest``)
    out: Outbox = field(default_factory=Outbox)
    kv_ready: bool = False  # the KV arrives by transfer (decode leg): no prefill compute
    preset_first: int | None = None  # the prefill leg's token, emitted first by a decode leg
    cached_tokens: int | None = None
    host_cached_tokens: int = 0  # of cached_tokens, loaded back from host memory
    generated: list[int] = field(default_factory=list)
    finished: bool = False
    rank: int = 0  # data-parallel rank whose KV cache holds it
    script: list[int] | None = None  # the scripted (or schema-constrained) output, then "stop"
    queued_tokens: int = 0  # uncached prompt tokens while it waits for a prefill (load reports)
    state: int | None = None  # the token state after the prompt and ``generated`` (digest at first)

    @property
    def lora(self) -> str | None:
        return self.request.lora_name


def hands_over(generated: int, interval: int | None) -> bool:
    """Whether the step that made the ``generated``-th token hands the ready tokens over, as SGLang's
    scheduler decides for a streamed request with ``stream_interval``: the first token, then every
    ``interval`` more (the last one goes with the final chunk in any case)."""
    return interval is None or interval == 1 or generated % interval == 1


@dataclass(frozen=True)
class Join:
    """``seq`` joins the running batch: ``prefill`` (uncached, cached tokens) when it is prefilled this
    step (None: its KV arrived by transfer), ``loaded`` of them loaded back from host memory, and the KV
    events of its allocation."""

    seq: Seq
    prefill: tuple[int, int] | None = None
    loaded: int = 0
    events: Sequence[KvEvent] = ()


@dataclass(frozen=True)
class Refuse:
    """``seq`` can never run: the KV cache cannot hold it even with nothing else running."""

    seq: Seq


def admit(
    waiting: deque[Seq],
    running: Sequence[Seq],
    kvs: Sequence[BlockManager],
    loras: MockLoras | None,
    *,
    prefill_budget: int,
    max_running: int,
) -> Iterator[Join | Refuse]:
    """The scheduler's admission, as SGLang's: waiting requests in order while the batch has room, the
    prefill tokens fit ``prefill_budget`` (the first always goes) and their KV fits; a request whose
    adapter has no batch slot is passed over, and keeps its place. Pure but for the state it is given:
    it takes what it admits off ``waiting`` and allocates its KV in ``kvs``. The caller applies each
    decision before the next is made (a joining sequence may finish at once and free its slot)."""
    budget = prefill_budget
    admitted = 0
    adapters = {s.lora for s in running} if loras is not None else None
    passed: list[Seq] = []  # waiting for a batch slot of their adapter; later ones may go first
    while waiting and len(running) < max_running:
        seq = waiting[0]
        if seq.finished:
            waiting.popleft()
            continue
        if adapters is not None and loras is not None and not loras.can_join(adapters, seq.lora):
            passed.append(waiting.popleft())
            continue
        kv = kvs[seq.rank]
        if seq.kv_ready and kv.has_seq(seq.key):  # a decode leg's KV, reserved when it arrived
            waiting.popleft()
            admitted += 1
            _joins(adapters, seq)
            yield Join(seq)
            continue
        new_tokens = 0 if seq.kv_ready else len(seq.tokens) - kv.cached_prefix_tokens(seq.tokens, seq.lora)
        if admitted and new_tokens > budget:
            break
        alloc = kv.allocate(seq.key, seq.tokens, seq.lora)
        if alloc is None:
            if not running:
                waiting.popleft()
                yield Refuse(seq)
                continue
            break
        waiting.popleft()
        admitted += 1
        if seq.cached_tokens is None:
            seq.cached_tokens = alloc.cached_tokens
            seq.host_cached_tokens = alloc.host_cached_tokens
        _joins(adapters, seq)
        if seq.kv_ready:
            yield Join(seq, events=alloc.events)
            continue
        uncached = len(seq.tokens) - alloc.cached_tokens
        budget -= uncached
        yield Join(seq, (uncached, alloc.cached_tokens), alloc.host_cached_tokens, alloc.events)
    waiting.extendleft(reversed(passed))


def _joins(adapters: set[str | None] | None, seq: Seq) -> None:
    if adapters is not None:
        adapters.add(seq.lora)


def next_token(seq: Seq, state: int, sampler: TokenSampler, eos_probability: float) -> int | None:
    """The token ``seq`` generates next from the token ``state``, or None when it stops here: the
    prefill leg's token first on a decode leg, else the script's next, else a sampled one (EOS with
    ``eos_probability``); a stop token or EOS past ``min_tokens`` stops it."""
    req, pos = seq.request, len(seq.generated)
    if pos == 0 and seq.preset_first is not None:
        token = seq.preset_first
    elif seq.script is not None:
        if pos >= len(seq.script):
            return None
        token = seq.script[pos]
    else:
        token = sampler.token(state, 0)
        if (
            eos_probability > 0
            and req.eos_token_ids
            and not req.stop.ignore_eos
            and pos >= req.stop.min_tokens
            and sampler.chance(state, 0) < eos_probability
        ):
            token = req.eos_token_ids[0]
    eos = not req.stop.ignore_eos and token in req.eos_token_ids
    if pos >= req.stop.min_tokens and (token in req.stop.stop_token_ids or eos):
        return None
    return token


def batch_step(
    running: Sequence[Seq], prefilled: Sequence[Seq], prefill_s: float, *, mixed_chunk: bool, decode_s: float
) -> tuple[Sequence[Seq], float]:
    """Which sequences get a token at the end of this step, and how long it takes. SGLang's default
    schedule runs a prefill batch on its own (the running batch gets no token until no waiting request
    can be admitted); with ``--enable-mixed-chunk`` the prefills ride along with one decode step
    (``decode_s``: that step's time for the running batch)."""
    if prefilled and not mixed_chunk:
        return prefilled, prefill_s
    return running, prefill_s + decode_s


def error_chunk(error_type: ErrorType, message: str) -> GenerateChunk:
    """The chunk that ends a request with an error."""
    return GenerateChunk(finish_reason="error", error=WorkerError(type=error_type, message=message))
