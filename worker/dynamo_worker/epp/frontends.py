"""The frontend replicas a request may be sent to: ``--frontends`` resolved, picked in turn.

Every replica serves the workers the picker named (``--router-mode direct``), so which one carries a
request only spreads the streaming work: round-robin. Host names resolve to all their addresses (a
headless Service: every ready pod), again every ``resolve_s``; a resolution that fails keeps the last
addresses and says so.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket

__all__ = ["Frontends", "endpoint"]

log = logging.getLogger(__name__)


def endpoint(ip: str, port: int) -> str:
    """``ip:port`` as Envoy's original-destination cluster reads it (``[v6]:port``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class Frontends:
    def __init__(self, items: list[tuple[str, int]], resolve_s: float) -> None:
        self._items = items
        self._resolve_s = resolve_s
        self._endpoints: list[str] = []
        self._found: dict[tuple[str, int], list[str]] = {}  # per item, its last addresses
        self._turn = itertools.count()

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def next(self) -> str | None:
        if not self._endpoints:
            return None
        return self._endpoints[next(self._turn) % len(self._endpoints)]

    async def resolve(self) -> None:
        loop = asyncio.get_running_loop()
        for host, port in self._items:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as e:
                log.warning("Cannot resolve frontend host=%s: %s (keeping its last addresses)", host, e)
                continue
            self._found[(host, port)] = [endpoint(str(info[4][0]), port) for info in infos]
        unique = sorted({e for found in self._found.values() for e in found})
        if unique != self._endpoints:
            log.info("Frontend replicas endpoints=%s", ",".join(unique) or "none")
        self._endpoints = unique

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._resolve_s)
            await self.resolve()
