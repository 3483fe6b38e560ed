"""The mocker's prefill/decode rendezvous: a small HTTP server on the prefill worker's bootstrap port.

The frontend sends both legs of a disaggregated request at once, with the same
``{bootstrap_host, bootstrap_port, bootstrap_room}``. As in SGLang, the prefill leg waits for its decode
leg's handshake before it is prefilled (``decode_arrived``: SGLang's bootstrap queue, which a prefill
leaves once the decode worker has allocated the KV memory the cache will land in and told the prefill
worker where). The decode leg first reserves that memory on its own worker, then long-polls
``GET /v1/bootstrap/rooms/<room>?wait_s=...`` on the prefill worker (``fetch_prefill``): its arrival is
the handshake, and the answer comes once the prefill of that room is done (``prefill_done``, which
waits until the decode leg picked it up). Either side waits at most ``bootstrap_timeout_s`` for the
other and then fails with ``BootstrapTimeout`` (the request ends with error type
``bootstrap_timeout``). Either side may arrive first. The answer names the prefill engine
(``PrefillResult.engine``, new at each start), so a decode worker knows a peer it never moved KV from.

Each side knows its KV layout (``kv_layout``: the served model and the page size). A decode leg sends
its own with the fetch, and a prefill worker whose layout differs refuses it (HTTP 409): both legs end
with ``bootstrap_failed`` at once, naming both layouts. SGLang would not refuse: a decode engine reading
KV blocks of another page size or model produces garbage or hangs, which is why the frontend pairs a
prefill and a decode worker only within one revision (``frontend.models.pairing``); the refusal makes a pair
that slipped through visible in tests.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web
from dynamo_api import contract
from dynamo_api.errors import DynamoError

from dynamo_worker.protocol import BootstrapInfo
from dynamo_worker.runtime.listening import serve

__all__ = [
    "BootstrapRefused",
    "BootstrapServer",
    "BootstrapTimeout",
    "PeerConnections",
    "PrefillResult",
    "fetch_prefill",
    "kv_layout",
]

log = logging.getLogger(__name__)

ROOMS_PATH = "/v1/bootstrap/rooms/{room}"
MAX_ROOMS = 100_000


class BootstrapTimeout(DynamoError):
    """The peer leg of a disaggregated request did not show up within the bound."""


class BootstrapRefused(DynamoError):
    """The peer leg's KV layout differs from this worker's: no KV cache can pass between them."""


def kv_layout(model: str, page_size: int) -> str:
    """What a prefill and a decode leg must agree on to hand over a KV cache (in the simulation)."""
    return f"model={model} page_size={page_size}"


@dataclass(frozen=True)
class PrefillResult:
    first_token: int
    prompt_tokens: int
    cached_tokens: int
    host_cached_tokens: int = 0  # of cached_tokens, loaded back from host memory (HiCache)
    engine: str = field(default="", compare=False)  # the prefill engine's id (BootstrapServer.engine)


@dataclass
class _Room:
    result: asyncio.Future[PrefillResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    picked_up: asyncio.Event = field(default_factory=asyncio.Event)
    decode_arrived: asyncio.Event = field(default_factory=asyncio.Event)  # the handshake
    refused: str | None = None  # why a decode leg of another layout was refused


class BootstrapServer:
    """Rendezvous of prefill results and the decode legs that fetch them (runs on a prefill worker)."""

    def __init__(self, host: str, port: int, *, layout: str = "", max_wait_s: float = 600.0) -> None:
        self._host = host
        self._port = port
        self.layout = layout
        self._max_wait_s = max_wait_s
        self._rooms: dict[int, _Room] = {}
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.engine = uuid.uuid4().hex[:12]  # a new peer for every decode worker, as a restarted engine

    @property
    def open_rooms(self) -> int:
        return len(self._rooms)

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get(ROOMS_PATH, self._fetch)
        self._runner, self.port = await serve(
            app,
            "bootstrap",
            self._host,
            self._port,
            what="the bootstrap server",
            flag=contract.BOOTSTRAP_PORT_FLAG,
            handler_cancellation=True,
        )
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _room(self, room: int) -> _Room:
        found = self._rooms.get(room)
        if found is None:
            if len(self._rooms) >= MAX_ROOMS:
                raise RuntimeError(f"too many open bootstrap rooms ({MAX_ROOMS})")
            found = self._rooms[room] = _Room()
        return found

    def _drop(self, room: int, state: _Room) -> None:
        if self._rooms.get(room) is state:
            del self._rooms[room]

    async def decode_arrived(self, room: int, wait_s: float) -> None:
        """Wait (``wait_s`` at most) for the decode leg of ``room`` to arrive (its handshake). Raises
        ``BootstrapTimeout`` when none did, ``BootstrapRefused`` when the one that came had another KV
        layout."""
        state = self._room(room)
        try:
            async with asyncio.timeout(wait_s):
                await state.decode_arrived.wait()
        except TimeoutError:
            self._drop(room, state)
            raise BootstrapTimeout(
                f"no decode leg came for bootstrap_room={room} within {wait_s:.1f}s, so its prefill never "
                "started; the decode worker did not get its leg of the request, could not reserve KV memory "
                "for it, or could not reach this prefill worker's bootstrap port"
            ) from None
        except asyncio.CancelledError:
            if not state.result.done():
                self._drop(room, state)
            raise
        if state.refused is not None:
            self._drop(room, state)
            raise BootstrapRefused(state.refused)

    async def prefill_done(self, room: int, result: PrefillResult, wait_s: float) -> None:
        """Publish the prefill of ``room`` and wait (``wait_s`` at most) until a decode leg took it.
        Raises ``BootstrapTimeout`` when none did, ``BootstrapRefused`` when the one that came had
        another KV layout."""
        state = self._room(room)
        if state.result.done():
            self._drop(room, state)
            raise RuntimeError(f"bootstrap_room {room} was already used by another prefill")
        state.result.set_result(result)
        try:
            async with asyncio.timeout(wait_s):
                await state.picked_up.wait()
        except TimeoutError:
            raise BootstrapTimeout(
                f"no decode leg fetched bootstrap_room={room} within {wait_s:.1f}s; the decode worker "
                "did not get its leg of the request or could not reach this prefill worker's bootstrap port"
            ) from None
        finally:
            self._drop(room, state)
        if state.refused is not None:
            raise BootstrapRefused(state.refused)

    async def _fetch(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
            wait_s = min(float(request.query.get("wait_s", "30")), self._max_wait_s)
        except ValueError:
            return web.json_response({"error": "room must be an integer and wait_s a number"}, status=400)
        try:
            state = self._room(room)
        except RuntimeError as e:
            return web.json_response({"error": str(e)}, status=503)
        theirs = request.query.get("layout", "")
        if self.layout and theirs and theirs != self.layout:
            # Kept (not dropped) so that a prefill leg arriving later is refused at once too.
            state.refused = (
                f"KV layout mismatch for bootstrap_room={room}: the prefill worker has {self.layout}, the "
                f"decode worker {theirs}; a prefill and a decode worker of different revisions were paired"
            )
            log.error("Refused a decode leg of another KV layout: %s", state.refused)
            state.picked_up.set()
            state.decode_arrived.set()
            return web.json_response({"error": state.refused}, status=409)
        state.decode_arrived.set()
        try:
            async with asyncio.timeout(wait_s):
                result = await asyncio.shield(state.result)
        except TimeoutError:
            self._drop(room, state)
            return web.json_response(
                {"error": f"no prefill for bootstrap_room={room} within {wait_s:.1f}s"}, status=504
            )
        except asyncio.CancelledError:
            if not state.result.done():
                self._drop(room, state)
            raise
        state.picked_up.set()
        body = {
            "first_token": result.first_token,
            "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
            "host_cached_tokens": result.host_cached_tokens,
            "engine": self.engine,
        }
        return web.json_response(body)


async def fetch_prefill(
    session: aiohttp.ClientSession, info: BootstrapInfo, timeout_s: float, layout: str = ""
) -> PrefillResult:
    """Wait (``timeout_s`` at most) for the prefill of ``info.bootstrap_room`` on the prefill worker at
    ``bootstrap_host:bootstrap_port``; retries while that port does not answer.
    Raises ``BootstrapTimeout``, or ``BootstrapRefused`` when that worker's KV layout is not ``layout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    url = f"http://{info.bootstrap_host}:{info.bootstrap_port}" + ROOMS_PATH.format(room=info.bootstrap_room)
    last_error = "no answer"
    while (left := deadline - loop.time()) > 0:
        try:
            async with asyncio.timeout(left + 1.0):
                params = {"wait_s": f"{left:.3f}", **({"layout": layout} if layout else {})}
                async with session.get(url, params=params) as response:
                    raw = await response.read()
            if response.status == 200:
                data = orjson.loads(raw)
                return PrefillResult(
                    int(data["first_token"]),
                    int(data["prompt_tokens"]),
                    int(data["cached_tokens"]),
                    int(data.get("host_cached_tokens") or 0),
                    str(data.get("engine", "")),
                )
            if response.status == 504:
                last_error = "the prefill leg never arrived there"
                break
            if response.status == 409:
                raise BootstrapRefused(str(orjson.loads(raw).get("error", "KV layout mismatch")))
            last_error = f"HTTP {response.status}: {raw[:200]!r}"
        except TimeoutError:
            last_error = "the bootstrap server did not answer"
            break
        except (aiohttp.ClientError, OSError, ValueError, KeyError) as e:
            last_error = f"could not reach it ({e})"
        await asyncio.sleep(max(0.0, min(0.2, deadline - loop.time())))  # retry backoff
    raise BootstrapTimeout(
        f"decode leg got no prefill for bootstrap_room={info.bootstrap_room} from "
        f"{info.bootstrap_host}:{info.bootstrap_port} within {timeout_s:.1f}s: {last_error}; check that "
        "the prefill worker is running and received the prefill leg"
    )


class PeerConnections:
    """A decode worker's KV transfer connections, one per prefill engine: the first transfer from an
    engine opens it and costs ``first_transfer_s`` (on GPUs, the first NIXL transfer between a pair:
    seconds), paid once however many transfers wait for it; later ones cost nothing here."""

    def __init__(self, first_transfer_s: float) -> None:
        self.first_transfer_s = first_transfer_s
        self._open: dict[str, asyncio.Future[None]] = {}

    @property
    def peers(self) -> int:
        return len(self._open)

    async def ready(self, engine: str) -> None:
        """Wait until the connection to ``engine`` is open (opening it the first time)."""
        opening = self._open.get(engine)
        if opening is None:
            if self.first_transfer_s > 0:
                log.info(
                    "Opening the KV transfer connection to a new prefill engine engine=%s seconds=%.2f",
                    engine,
                    self.first_transfer_s,
                )
            opening = self._open[engine] = asyncio.ensure_future(asyncio.sleep(self.first_transfer_s))
        await asyncio.shield(opening)
