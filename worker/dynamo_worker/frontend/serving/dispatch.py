"""From a tokenized request to a stream of worker chunks: pick the workers, talk to them, map failures.

More: docs/module-notes.md (dynamo_worker.frontend.serving.dispatch)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dynamo_api.errors import DynamoError

from dynamo_worker.frontend.errors import (
    ApiError,
    InvalidRequest,
    ServiceUnavailable,
    UpstreamError,
    UpstreamTimeout,
    WorkerLost,
)
from dynamo_worker.frontend.models.pairing import (
    Pair,
    WarmPairs,
    newest_pair,
    no_pair_message,
    routable_pair,
)
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.frontend.serving.direct import FallbackHook, pinned_choices
from dynamo_worker.frontend.serving.quarantine import Quarantine
from dynamo_worker.protocol import (
    MAX_ROOM,
    BootstrapInfo,
    GenerateChunk,
    GenerateRequest,
    InstanceRecord,
    Role,
    StopConditions,
    WorkerError,
)
from dynamo_worker.router import Choice, Router
from dynamo_worker.router.router import PairFilter
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.request_plane import (
    RequestClient,
    RequestPlaneError,
    WorkerRejected,
    WorkerStreamBroken,
    WorkerTimeout,
    WorkerUnreachable,
)

log = logging.getLogger(__name__)

__all__ = [
    "ChunkSource",
    "Dispatcher",
    "Route",
    "route_mode",
]

_RETRYABLE_REJECTIONS = {"overloaded", "shutting_down", "engine_died"}
# How long a prefill leg may still run after its decode leg finished before it is cancelled (_let_end).
PREFILL_GRACE_S = 5.0


@dataclass(frozen=True)
class Route:
    """Where one request goes: its worker (aggregated), or its prefill and decode workers."""

    mode: str  # "agg" | "disagg"
    first: Choice  # the worker computing the prompt (agg, or prefill)
    decode: Choice | None = None


def route_mode(entry: ModelEntry) -> str:
    """``agg`` or ``disagg`` for this model now, or raise 503 naming what is missing."""
    prefill, decode, agg = entry.by_role("prefill"), entry.by_role("decode"), entry.by_role("agg")
    if prefill and decode:
        return "disagg"
    if agg:
        return "agg"
    if decode:
        raise ServiceUnavailable(
            f"Model '{entry.name}' has {len(decode)} decode worker(s) but no prefill worker, and decode "
            "workers cannot serve a request alone. Start (or wait for) a prefill worker.",
            code="no_prefill_workers",
        )
    raise ServiceUnavailable(
        f"Model '{entry.name}' has {len(prefill)} prefill worker(s) but no decode worker. Start (or wait "
        "for) a decode worker.",
        code="no_decode_workers",
    )


def _from_worker_error(error: WorkerError, address: str, role: str = "", instance_id: str = "") -> ApiError:
    if error.type == "engine_died":  # the worker is lost to this request, as if it had died itself
        return WorkerLost(
            f"The {role} worker's engine died: {error.message}",
            code="engine_died",
            instance_id=instance_id,
            role=role,
        )
    if error.type == "invalid_request":
        return InvalidRequest(f"The worker refused the request: {error.message}", code="invalid_request")
    if error.type in _RETRYABLE_REJECTIONS:
        return ServiceUnavailable(
            f"The worker is {error.type.replace('_', ' ')}: {error.message}",
            code=error.type,
            headers={"Retry-After": "1"},
        )
    return UpstreamError(f"The worker at {address} failed ({error.type}): {error.message}", code=error.type)


_LOST_CODES: dict[type[RequestPlaneError], str] = {
    WorkerUnreachable: "worker_unreachable",
    WorkerTimeout: "worker_timeout",
    WorkerStreamBroken: "worker_stream_broken",
}


def _from_plane_error(e: RequestPlaneError, role: str, worker: InstanceRecord) -> ApiError:
    if isinstance(e, WorkerRejected):
        error = WorkerError.model_construct(type=e.error_type, message=e.detail)
        return _from_worker_error(error, e.address, role, worker.instance_id)
    code = _LOST_CODES.get(type(e))
    if code is None:
        return UpstreamError(f"The {role} worker failed: {e}", code="upstream_error")
    return WorkerLost(f"The {role} worker failed: {e}", code=code, instance_id=worker.instance_id, role=role)


class ChunkSource(Protocol):
    """What serving a job needs of the workers: a request's chunks (the runs, the embedding batcher).
    ``Dispatcher`` is one, and ``MigratingDispatcher`` around it the one the frontend uses."""

    def generate(self, entry: ModelEntry, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Chunks of the (decode) stream; raises ``ApiError`` on failure. Closing it cancels the request
        on the workers."""
        ...


class Dispatcher:
    def __init__(
        self,
        router: Router,
        client: RequestClient,
        *,
        kv_transfer_timeout_s: float = 60.0,
        quarantine: Quarantine | None = None,
        warm: WarmPairs | None = None,
        on_direct_fallback: FallbackHook | None = None,
    ) -> None:
        self.router = router
        self.on_direct_fallback = on_direct_fallback  # direct mode: a pin not served (serving.direct)
        self.client = client
        self.kv_transfer_timeout_s = kv_transfer_timeout_s
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        self.warm = warm  # warm prefill/decode pairs (serving.warmup); None: warm-ups off, any pair

    def route(
        self, entry: ModelEntry, token_ids: Sequence[int], exclude: frozenset[str] = frozenset()
    ) -> Route:
        mode = route_mode(entry)
        out = exclude | self.quarantine.ids
        if self.router.mode == "direct":  # the endpoint picker's choice, when it can serve (serving.direct)
            pinned = pinned_choices(entry, mode, token_ids, out, self.on_direct_fallback)
            if pinned is not None:
                return Route(mode, *pinned)
        if mode == "disagg":
            prefill, decode = self._live(entry, "prefill", out), self._live(entry, "decode", out)
            newest = entry.pair() if not out else newest_pair(prefill, decode)
            routable: tuple[Pair, PairFilter | None] | None = None
            if newest is not None and self.warm is None:
                routable = (newest, None)
            elif newest is not None and self.warm is not None:
                routable = routable_pair(newest, prefill, decode, self.warm.is_warm)
            if routable is None:
                raise ServiceUnavailable(
                    no_pair_message(entry.name, prefill, decode),
                    code="no_matching_revision",
                    headers={"Retry-After": "1"},
                )
            pair, allowed = routable
            first, second = self.router.choose_pair(
                entry.name, pair.prefill, pair.decode, token_ids, allowed, entry.lora_name
            )
            return Route("disagg", first, second)
        agg = self._live(entry, "agg", out)
        return Route("agg", self.router.choose(f"{entry.name}/agg", agg, token_ids, entry.lora_name))

    def _live(self, entry: ModelEntry, role: Role, out: frozenset[str]) -> list[InstanceRecord]:
        """The workers of ``role`` a request may go to: registered, neither excluded nor quarantined."""
        registered = entry.by_role(role)
        candidates = [w for w in registered if w.instance_id not in out]
        if not candidates:
            reasons = sorted(r for w in registered if (r := self.quarantine.reason(w.instance_id)))
            why = f" (failure: {reasons[0]})" if reasons else ""
            raise ServiceUnavailable(
                f"No live {role} worker of model '{entry.name}': {len(registered)} registered, all failed "
                f"a request just now and are out of routing until they answer again or leave discovery"
                f"{why}. Retry shortly; if it persists, check the {role} workers.",
                code="no_workers",
                headers={"Retry-After": "1"},
            )
        return candidates

    async def generate(
        self, entry: ModelEntry, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Chunks of the (decode) stream; raises ``ApiError`` on failure. Closing it cancels the legs."""
        excluded: set[str] = set()
        failure: ApiError | None = None
        for attempt in (1, 2):
            try:
                route = self.route(entry, request.token_ids, frozenset(excluded))
            except ServiceUnavailable as unavailable:
                # no other worker to retry on: the first failure says why (and an engine that died lets
                # migration wait for it to come back)
                if failure is not None and (
                    failure.status == 503
                    or isinstance(failure, UpstreamTimeout)
                    or failure.code == "engine_died"
                ):
                    raise failure from None
                raise unavailable from None  # 503 naming the role with no live worker
            started = False
            if route.decode is None:
                flights = [self.router.started(route.first)]
                stream = self._agg(route.first.worker, _on_rank(request, route.first))
            else:
                prefill_flight = self.router.started(route.first, "prefill")
                flights = [prefill_flight, self.router.started(route.decode, "decode")]
                stream = self._disagg(
                    route.first.worker,
                    route.decode.worker,
                    request,
                    prefill_rank=route.first.dp_rank,
                    decode_rank=route.decode.dp_rank,
                    prefill_ended=prefill_flight.done,
                )
            try:
                async with contextlib.aclosing(stream) as chunks:
                    async for chunk in chunks:
                        if not started:
                            started = True
                            for flight in flights:
                                flight.first_token()
                            if route.decode is not None and self.warm is not None:  # its KV moved: warm
                                self.warm.set(
                                    route.first.worker.instance_id, route.decode.worker.instance_id, "warm"
                                )
                        yield chunk
                return
            except _Retryable as e:
                if started or attempt == 2:
                    raise e.error from None
                excluded.update(e.instance_ids)
                failure = e.error
                log.warning(
                    "Retrying on another worker failed_worker=%s reason=%s",
                    ",".join(e.instance_ids),
                    e.error.message,
                )
            finally:
                for flight in flights:
                    flight.done()

    def _stream(
        self, worker: InstanceRecord, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        return self.client.generate(worker.address, for_worker(request, worker))

    async def _agg(
        self, worker: InstanceRecord, request: GenerateRequest, role: str = "aggregated"
    ) -> AsyncGenerator[GenerateChunk, None]:
        """One leg's stream from ``worker``; a refusal before the first chunk is retryable elsewhere."""
        first = True
        try:
            async with contextlib.aclosing(self._stream(worker, request)) as chunks:
                async for chunk in chunks:
                    if chunk.error is not None:
                        error = self._chunk_error(chunk.error, role, worker)
                        if first and chunk.error.type in _RETRYABLE_REJECTIONS:
                            raise _Retryable((worker.instance_id,), error)
                        raise error
                    first = False
                    yield chunk
        except RequestPlaneError as e:
            raise self._failed(e, role, worker, first) from None

    async def _prefill_leg(
        self, worker: InstanceRecord, request: GenerateRequest, ended: Callable[[], None] | None
    ) -> None:
        async with contextlib.aclosing(self._agg(worker, request, "prefill")) as chunks:
            async for _ in chunks:
                pass
        if ended is not None:
            ended()  # the prefill worker is done with this request: its KV has moved

    async def _disagg(
        self,
        prefill: InstanceRecord,
        decode: InstanceRecord,
        request: GenerateRequest,
        *,
        prefill_rank: int | None = None,
        decode_rank: int | None = None,
        prefill_ended: Callable[[], None] | None = None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        if prefill.bootstrap_port is None:
            raise ServiceUnavailable(
                f"Prefill worker {prefill.instance_id} registered no bootstrap port, so no decode worker can "
                "fetch its KV cache. Start it with --disaggregation-bootstrap-port.",
                code="no_bootstrap_port",
            )
        host = prefill.bootstrap_host or prefill.address.rsplit(":", 1)[0]
        info = BootstrapInfo(
            bootstrap_host=host,
            bootstrap_port=prefill.bootstrap_port,
            bootstrap_room=secrets.randbelow(MAX_ROOM + 1),
        )
        prefill_request = request.model_copy(
            update={
                "request_id": f"{request.request_id}-prefill",
                "bootstrap_info": info,
                "stop": StopConditions(max_tokens=1, ignore_eos=True),
                "data_parallel_rank": _rank(request, prefill_rank),
            }
        )
        decode_request = request.model_copy(
            update={"bootstrap_info": info, "data_parallel_rank": _rank(request, decode_rank)}
        )
        log.debug(
            "Dispatching disaggregated request_id=%s prefill=%s decode=%s room=%d",
            request.request_id,
            prefill.instance_id,
            decode.instance_id,
            info.bootstrap_room,
        )
        decode_stream = self._stream(decode, decode_request)
        # The decode leg goes out first: SGLang's prefill engine holds the request in its bootstrap queue
        # until the decode engine's handshake arrives (docs/disaggregated-routing.md has the measurement).
        pending: asyncio.Task[GenerateChunk] | None = asyncio.ensure_future(anext(decode_stream))
        prefill_task = asyncio.create_task(
            self._prefill_leg(prefill, prefill_request, prefill_ended), name=f"prefill-{request.request_id}"
        )
        first = True  # no decode chunk yet: a worker that cannot be reached may be replaced
        finished = False
        handoff_deadline = asyncio.get_running_loop().time() + self.kv_transfer_timeout_s
        try:
            while True:
                try:
                    async with asyncio.timeout_at(handoff_deadline if first else None):
                        if prefill_task.done():
                            if prefill_task.exception() is not None:
                                raise prefill_task.exception()  # type: ignore[misc]
                            # The prefill leg is over (it ends at the decode's first token or before):
                            # read the decode stream directly, without a task per chunk.
                            chunk = await (pending or anext(decode_stream))
                        else:
                            next_chunk = pending or asyncio.ensure_future(anext(decode_stream))
                            chunk = await _next_or_leg_failure(next_chunk, prefill_task)
                        pending = None
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise self._handoff_timeout(prefill, decode, info, prefill_task.done()) from None
                except RequestPlaneError as e:
                    raise self._failed(e, "decode", decode, first) from None
                if chunk.error is not None:
                    error = self._chunk_error(chunk.error, "decode", decode)
                    if first and chunk.error.type in _RETRYABLE_REJECTIONS:
                        raise _Retryable((decode.instance_id,), error)
                    raise error
                first = False
                finished = chunk.finish_reason is not None
                yield chunk
                if finished:
                    break
        finally:
            if pending is not None and not pending.done():  # left before the decode leg's first chunk
                with contextlib.suppress(Exception):
                    await cancel_and_wait(pending)
            await decode_stream.aclose()
            if finished and not prefill_task.done():
                _let_end(prefill_task)
            else:
                with contextlib.suppress(ApiError, _Retryable):
                    await cancel_and_wait(prefill_task)

    async def warm_up(self, model: str, prefill: InstanceRecord, decode: InstanceRecord) -> None:
        """One tiny disaggregated request through this pair (``serving.warmup``): its first KV transfer
        opens the pair's connection. Raises ``ApiError`` (or ``_Retryable``) when it fails."""
        request = GenerateRequest(
            request_id=f"warmup-{prefill.instance_id[:8]}-{decode.instance_id[:8]}-{secrets.token_hex(4)}",
            model=model,
            token_ids=list(range(1, prefill.page_size + 1)),  # one block: ids every vocabulary has
            stop=StopConditions(max_tokens=1, ignore_eos=True),
        )
        async with contextlib.aclosing(self._disagg(prefill, decode, request)) as chunks:
            async for _ in chunks:
                pass

    def _handoff_timeout(
        self, prefill: InstanceRecord, decode: InstanceRecord, info: BootstrapInfo, prefill_done: bool
    ) -> _Retryable:
        """Neither pair worker is known to be lost, but this request's KV did not reach the decode leg in
        time: both legs are cancelled by the caller's cleanup; another pair may take the request."""
        where = (
            "the prefill leg finished, so the KV transfer or the decode worker's first step is stuck"
            if prefill_done
            else "the prefill leg did not finish (queued, prefilling, or waiting for the bootstrap handshake)"
        )
        log.warning(
            "KV handoff timed out prefill=%s decode=%s room=%d prefill_done=%s timeout_s=%.0f",
            prefill.instance_id,
            decode.instance_id,
            info.bootstrap_room,
            prefill_done,
            self.kv_transfer_timeout_s,
        )
        error = UpstreamTimeout(
            f"The KV cache of this request did not reach decode worker {decode.instance_id} from prefill "
            f"worker {prefill.instance_id} within {self.kv_transfer_timeout_s:.0f}s: {where}. Both legs "
            "were cancelled and aborted on their workers. The request was retried on another prefill/decode "
            "pair when one was free. If this recurs on idle workers, check the workers' logs and their KV "
            "transfer backend; if prefills queue this long under load, raise --kv-transfer-timeout-s.",
            code="kv_transfer_timeout",
        )
        return _Retryable((prefill.instance_id, decode.instance_id), error)

    def _failed(
        self, e: RequestPlaneError, role: str, worker: InstanceRecord, first: bool
    ) -> _Retryable | ApiError:
        """Quarantine a worker that is lost (unreachable, broken or stalled stream, engine died), and say
        what the failure means for this request."""
        if type(e) in _LOST_CODES or (isinstance(e, WorkerRejected) and e.error_type == "engine_died"):
            self.quarantine.add(worker.instance_id, worker.address, role, f"{type(e).__name__}: {e}")
        return _retryable_or_error(e, role, worker, first)

    def _chunk_error(self, error: WorkerError, role: str, worker: InstanceRecord) -> ApiError:
        """What an error chunk from ``worker`` means for the request; a worker whose engine died is out
        of routing (it deregisters; quarantine covers the moments until the frontend sees that)."""
        if error.type == "engine_died":
            self.quarantine.add(worker.instance_id, worker.address, role, f"engine died: {error.message}")
        return _from_worker_error(error, worker.address, role, worker.instance_id)


def for_worker(request: GenerateRequest, worker: InstanceRecord) -> GenerateRequest:
    """``request`` as ``worker`` can take it: without ``stream_interval`` (a hint, no token changes) for
    an older worker whose request model does not know it."""
    if request.stream_interval is None or worker.takes_stream_interval:
        return request
    return request.model_copy(update={"stream_interval": None})


def _rank(request: GenerateRequest, routed: int | None) -> int | None:
    """The dp rank a leg goes to: the client's when it named one, else the router's choice."""
    return request.data_parallel_rank if request.data_parallel_rank is not None else routed


def _on_rank(request: GenerateRequest, choice: Choice) -> GenerateRequest:
    rank = _rank(request, choice.dp_rank)
    if rank == request.data_parallel_rank:
        return request
    return request.model_copy(update={"data_parallel_rank": rank})


def _let_end(prefill: asyncio.Task[None]) -> None:
    """A prefill leg still open when its decode leg finished has done its work (the decode worker had
    the KV cache), and its worker's final chunk is on the way: give it ``PREFILL_GRACE_S`` to end by
    itself, so its worker counts a served request, not a cancelled one, then cancel it. The client's
    answer does not wait for it."""
    cancel = asyncio.get_running_loop().call_later(PREFILL_GRACE_S, prefill.cancel)

    def ended(task: asyncio.Task[None]) -> None:
        cancel.cancel()
        if not task.cancelled() and task.exception() is not None:
            log.debug("Prefill leg failed after its decode leg finished: %r", task.exception())

    prefill.add_done_callback(ended)


async def _next_or_leg_failure(
    next_chunk: asyncio.Task[GenerateChunk], leg: asyncio.Task[None]
) -> GenerateChunk:
    """``next_chunk`` (a stream's next chunk, being fetched), or the failure of ``leg`` if it fails first;
    ``next_chunk`` is cancelled if it is not the answer."""
    try:
        await asyncio.wait({next_chunk, leg}, return_when=asyncio.FIRST_COMPLETED)
        if leg.done() and leg.exception() is not None and not next_chunk.done():
            raise leg.exception()  # type: ignore[misc]
        return await next_chunk
    finally:
        if not next_chunk.done():
            with contextlib.suppress(Exception):
                await cancel_and_wait(next_chunk)


def _retryable_or_error(
    e: RequestPlaneError, role: str, worker: InstanceRecord, first: bool
) -> _Retryable | ApiError:
    """A worker that could not be reached, or refused before any work, may be replaced by another of
    its role (``_Retryable``); any other failure is the client's error."""
    error = _from_plane_error(e, role, worker)
    if first and (
        isinstance(e, WorkerUnreachable)
        or (isinstance(e, WorkerRejected) and e.error_type in _RETRYABLE_REJECTIONS)
    ):
        return _Retryable((worker.instance_id,), error)
    return error


class _Retryable(DynamoError):
    """Workers failed this request before any of its tokens went out: others may take it."""

    def __init__(self, instance_ids: tuple[str, ...], error: ApiError) -> None:
        super().__init__(error.message)
        self.instance_ids = instance_ids
        self.error = error
