"""The frontend replicas a request may be sent to: ``--frontends`` resolved, picked in turn.

Every replica serves the workers the picker named (``--router-mode direct``), so which one carries a
request only spreads the streaming work: round-robin. Host names resolve to all their addresses (a
headless Service: every ready pod), again every ``resolve_s``, and every second while none is known (the
replicas are starting and their Service names no pod yet); a resolution that fails keeps the last
addresses and says so once, until the name resolves again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable

__all__ = ["Frontends", "endpoint"]

log = logging.getLogger(__name__)

NONE_KNOWN_RESOLVE_S = 1.0  # how often the names are resolved again while no replica is known


def endpoint(ip: str, port: int) -> str:
    """``ip:port`` as Envoy's original-destination cluster reads it (``[v6]:port``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


Lookup = Callable[[str, int], Awaitable[list[str]]]  # host, port -> its addresses; OSError when none


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class Frontends:
    def __init__(self, items: list[tuple[str, int]], resolve_s: float, lookup: Lookup = _getaddrinfo) -> None:
        self._items = items
        self._resolve_s = resolve_s
        self._lookup = lookup
        self._endpoints: list[str] = []
        self._found: dict[tuple[str, int], list[str]] = {}  # per item, its last addresses
        self._turn = itertools.count()
        self._failing: set[tuple[str, int]] = set()  # items whose last resolution failed (said once)

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def next(self) -> str | None:
        if not self._endpoints:
            return None
        return self._endpoints[next(self._turn) % len(self._endpoints)]

    async def resolve(self) -> None:
        for host, port in self._items:
            try:
                addresses = await self._lookup(host, port)
            except OSError as e:
                if (host, port) not in self._failing:
                    log.warning("Cannot resolve frontend host=%s: %s (keeping its last addresses)", host, e)
                self._failing.add((host, port))
                continue
            self._failing.discard((host, port))
            self._found[(host, port)] = [endpoint(ip, port) for ip in addresses]
        unique = sorted({e for found in self._found.values() for e in found})
        if unique != self._endpoints:
            log.info("Frontend replicas endpoints=%s", ",".join(unique) or "none")
        self._endpoints = unique

    async def run(self) -> None:
        while True:
            await asyncio.sleep(
                self._resolve_s if self._endpoints else min(self._resolve_s, NONE_KNOWN_RESOLVE_S)
            )
            await self.resolve()
