"""What a worker implements: the engine behind the request plane (SGLang, or the mocker).

``run_worker`` drives an ``Engine``: ``attach_events`` and ``attach_death`` (before ``start``), ``start``,
then ``generate`` concurrently for every accepted request, ``health_check`` on each ``/health`` probe, and
``stop`` on shutdown.

Engine death (``runtime.recovery``): after each ``start`` the worker watches the engine's
``processes()`` (SGLang's schedulers and detokenizer, the mocker's scheduler process); when one exits,
or the engine reports its own death through ``attach_death`` (SGLang's SIGQUIT from a failed child), the
worker ends every stream with ``engine_died`` and either restarts the engine in place (``stop``, then
``start`` again on the same object: an engine must support that) or exits.

Cancellation contract: ``generate`` returns an async iterator; when the caller goes away the consuming
task is cancelled and the iterator is closed (``aclose``). The engine must then abort the request and
free what it holds (KV blocks, queue slots) before ``aclose`` returns.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from dynamo_worker.protocol import GenerateChunk, GenerateRequest, KvEvent, Role, ServingFeatures

__all__ = ["Engine", "EngineEventSink", "EngineInfo", "EngineProcess", "LoadSnapshot", "NullEventSink"]


@dataclass(frozen=True)
class EngineInfo:
    """What an started engine tells the runtime; it becomes the worker's ``InstanceRecord``."""

    model_name: str  # the served model name
    page_size: int
    total_kv_blocks: int
    max_running_requests: int | None = None
    bootstrap_host: str | None = None  # prefill workers: where decode legs fetch KV
    bootstrap_port: int | None = None
    dp_size: int = 1
    model_dir: Path | None = None  # folder with tokenizer.json etc.; published as the model card
    context_length: int | None = None
    features: ServingFeatures = field(default_factory=ServingFeatures)  # published in the model card
    nnodes: int = 1  # nodes of a multinode engine: this worker leads a group of nnodes - 1 more ranks


@dataclass(frozen=True)
class EngineProcess:
    """A process that is part of the running engine: when it exits, the engine is dead."""

    name: str  # what the logs call it, e.g. "scheduler_tp0", "detokenizer"
    pid: int


@dataclass(frozen=True)
class LoadSnapshot:
    active_blocks: int
    total_blocks: int
    waiting: int
    running: int


class EngineEventSink(Protocol):
    """Where an engine reports KV cache events and load; calls must not block (called from the loop).
    A data-parallel engine reports each rank's KV events with that ``dp_rank``."""

    def kv_events(self, events: Sequence[KvEvent], dp_rank: int = 0) -> None: ...

    def load(self, snapshot: LoadSnapshot) -> None: ...


class NullEventSink:
    """Drops everything: the sink of an engine that no runtime has attached to."""

    def kv_events(self, events: Sequence[KvEvent], dp_rank: int = 0) -> None:
        return None

    def load(self, snapshot: LoadSnapshot) -> None:
        return None


class Engine(abc.ABC):
    """An inference engine served by ``run_worker``."""

    role: Role = "agg"

    def attach_events(self, sink: EngineEventSink) -> None:  # noqa: B027 - optional hook
        """Called once before ``start`` with the sink for KV events and load; default: ignore."""

    def register_metrics(self, registry: CollectorRegistry) -> None:  # noqa: B027 - optional hook
        """Called once before ``start`` with the worker's ``/metrics`` registry; default: add nothing."""

    def attach_death(self, report: Callable[[str], None]) -> None:  # noqa: B027 - optional hook
        """Called once before ``start`` with what to call (from the loop, with the reason) when the
        engine finds out by itself that it is dead; default: the engine never does."""

    def processes(self) -> Sequence[EngineProcess]:
        """The processes of the started engine, whose exit is the engine's death; read after every
        ``start``. Default: none (the engine runs in this process)."""
        return ()

    @abc.abstractmethod
    async def start(self) -> EngineInfo:
        """Load the model and be ready to serve; bounded by the engine's own startup timeout."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Stream disjoint token ids; the last chunk has ``finish_reason`` (and ``usage``). A request
        the engine cannot serve ends with ``finish_reason="error"`` and a typed ``error``."""

    async def health_check(self) -> None:  # noqa: B027 - default: healthy while started
        """Raise when the engine cannot serve (the ``/health`` probe turns 503)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Abort what is still running and release the engine's resources. Also called after a
        ``start`` that failed or was cancelled half-way, so it must cope with a partial start."""
