"""The lifeline of a multinode group: the leader learns at once that another rank is gone.

One engine over N pods (``--nnodes N``): rank 0 (the leader) is the worker that registers and serves;
ranks 1..N-1 only run their share of the engine. When a rank's engine dies, the leader's own scheduler
may not fail for minutes: a collective waiting on a peer that is gone hangs until NCCL's or SGLang's
watchdog timeout. So every other rank holds a WebSocket to the leader's system server
(``LIFELINE_PATH``, at ``DYN_LEADER_SYSTEM_ADDR``, which the operator sets on every pod of a group):

- a rank whose engine ends exits (``python -m dynamo_worker.sglang``'s follower does), and the kernel
  closes its connection: the leader's ``GroupLifeline`` reports the rank lost, within the loop turn, and
  the leader treats it as its engine's death (``runtime.recovery``: the in-flight streams go to other
  workers, and the leader exits so that the group restarts together);
- a rank that loses its leader (``hold_lifeline`` returns) exits too, for the same group restart.

A WebSocket heartbeat (``HEARTBEAT_S``) also ends a connection whose peer's node vanished without closing
it. A rank that has not joined within ``JOIN_WARN_S`` of the leader serving is named once in the log: its
loss is then noticed only when the engine itself fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from aiohttp import web

__all__ = ["HEARTBEAT_S", "LIFELINE_PATH", "GroupLifeline", "hold_lifeline", "run_lifeline"]

log = logging.getLogger(__name__)

LIFELINE_PATH = "/group/lifeline"
HEARTBEAT_S = 5.0
JOIN_WARN_S = 60.0
RETRY_S = 0.5


class GroupLifeline:
    """The leader's side: ``handle`` serves ``LIFELINE_PATH``; ``arm(nnodes, on_lost)`` once the engine
    serves, after which a rank whose connection ends calls ``on_lost(reason)`` (once)."""

    def __init__(self) -> None:
        self.joined: set[int] = set()
        self._nnodes = 1
        self._on_lost: Callable[[str], None] | None = None
        self._warn: asyncio.TimerHandle | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            rank = int(request.query.get("rank", ""))
        except ValueError:
            return web.json_response({"error": "rank must be the node rank, an integer"}, status=400)
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S)
        await ws.prepare(request)
        self.joined.add(rank)
        log.info("Group rank joined the lifeline node_rank=%s peer=%s", rank, request.remote)
        try:
            async for _ in ws:  # nothing is sent; the loop ends when the connection does
                pass
        finally:
            self.joined.discard(rank)
            self._lost(rank)
        return ws

    def arm(self, nnodes: int, on_lost: Callable[[str], None]) -> None:
        self._nnodes, self._on_lost = nnodes, on_lost
        if nnodes > 1:
            self._warn = asyncio.get_running_loop().call_later(JOIN_WARN_S, self._say_missing)

    def disarm(self) -> None:
        self._on_lost = None
        if self._warn is not None:
            self._warn.cancel()
            self._warn = None

    def _say_missing(self) -> None:
        missing = sorted(set(range(1, self._nnodes)) - self.joined)
        if missing and self._on_lost is not None:
            log.warning(
                "Group ranks %s have not joined the lifeline within %.0fs: the loss of one of them is "
                "noticed only when the engine itself fails (check DYN_LEADER_SYSTEM_ADDR on those pods)",
                missing,
                JOIN_WARN_S,
            )

    def _lost(self, rank: int) -> None:
        on_lost = self._on_lost
        if on_lost is None:
            log.warning("Group rank left the lifeline node_rank=%s (the engine is not serving)", rank)
            return
        self.disarm()
        on_lost(f"rank {rank} of the {self._nnodes}-node group is gone (its lifeline to this leader closed)")


async def hold_lifeline(leader_addr: str, rank: int, *, retry_s: float = RETRY_S) -> str:
    """A non-leader rank's side: connect to the leader at ``leader_addr`` (host:port of its system
    server), retrying until it answers, and hold the connection. Returns why it ended (the leader is
    gone); cancel it to let go."""
    url = f"http://{leader_addr}{LIFELINE_PATH}?rank={rank}"
    said = False
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.ws_connect(url, heartbeat=HEARTBEAT_S) as ws:
                    log.info("Joined the group's lifeline leader=%s node_rank=%s", leader_addr, rank)
                    async for _ in ws:
                        pass
                    return f"the connection to the group's leader at {leader_addr} closed"
            except (aiohttp.ClientError, OSError) as e:
                if not said:
                    said = True
                    log.info("Waiting for the group's leader at %s to answer (%s)", leader_addr, e)
                await asyncio.sleep(retry_s)


async def run_lifeline(leader_addr: str | None, rank: int, on_lost: Callable[[str], None]) -> None:
    """``hold_lifeline`` and then ``on_lost(reason)``; nothing without a leader address (said once)."""
    if not leader_addr:
        log.warning(
            "No DYN_LEADER_SYSTEM_ADDR: this rank holds no lifeline to its group's leader, which then "
            "notices this rank's loss only when its engine fails"
        )
        return
    on_lost(await hold_lifeline(leader_addr, rank))
