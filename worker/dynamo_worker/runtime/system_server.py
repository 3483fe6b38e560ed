"""The system server of a worker process (``DYN_SYSTEM_PORT``, 9090 in pods).

- ``GET /live``: 200 while the process runs its event loop and ``live_check`` passes (the liveness
  probe; the worker's ``HealthMonitor`` fails it once the engine has been unhealthy too long).
- ``GET /health``: 200 once the engine started and the worker registered, and while the engine's
  ``health_check`` passes; 503 before that, while draining, and when the check fails or exceeds its
  bound. The body is JSON ``{"status": ..., "reason": ...}`` saying why.
- ``GET /metrics``: Prometheus text format from this process's own registry.
- ``GET /group/lifeline`` (a multinode leader only): the other ranks' lifelines (``runtime.group``).

While the worker restarts its engine after the engine died, ``/health`` is 503 ``restarting`` with the
reason, and ``/live`` stays 200 (the restart is bounded by the engine's start timeout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web
from dynamo_api import contract
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dynamo_worker.runtime.listening import serve

__all__ = ["SystemServer"]

log = logging.getLogger(__name__)

State = Literal["starting", "ready", "draining", "restarting"]
_REASONS = {
    "starting": "engine starting or not yet registered",
    "draining": "draining",
    "restarting": "the engine died; restarting it",
}


class SystemServer:
    """``/live``, ``/health`` and ``/metrics``; ``state`` is set by the worker as it moves along."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        registry: CollectorRegistry | None = None,
        health_check: Callable[[], Awaitable[None]] | None = None,
        health_timeout_s: float = 5.0,
        live_check: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self.live_check = live_check
        self._host = host
        self._port = port
        self.registry = registry if registry is not None else CollectorRegistry()
        self._health_check = health_check
        self._health_timeout_s = health_timeout_s
        self.state: State = "starting"
        self.state_reason: str | None = None  # said by /health while not ready (default: the state's)
        self.routes: list[tuple[str, Callable[[web.Request], Awaitable[Any]]]] = []  # more GET routes
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get(contract.LIVE_PATH, self._live)
        app.router.add_get(contract.HEALTH_PATH, self._health)
        app.router.add_get(contract.METRICS_PATH, self._metrics)
        for path, handler in self.routes:
            app.router.add_get(path, handler)
        self._runner, self.port = await serve(
            app, "system", self._host, self._port, what="the system server", flag="--system-port"
        )
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _live(self, _: web.Request) -> web.Response:
        if self.live_check is not None:
            live, reason = self.live_check()
            if not live:
                return web.json_response({"status": "failing", "reason": reason}, status=503)
        return web.json_response({"status": "live"})

    async def _health(self, _: web.Request) -> web.Response:
        if self.state != "ready":
            reason = self.state_reason or _REASONS[self.state]
            return web.json_response({"status": self.state, "reason": reason}, status=503)
        if self._health_check is not None:
            try:
                async with asyncio.timeout(self._health_timeout_s):
                    await self._health_check()
            except TimeoutError:
                reason = f"engine health check took longer than {self._health_timeout_s}s"
                return web.json_response({"status": "unhealthy", "reason": reason}, status=503)
            except Exception as e:  # any failure of the check means unhealthy; mapped to 503
                log.warning("Engine health check failed error=%r", e)
                return web.json_response({"status": "unhealthy", "reason": str(e)}, status=503)
        return web.json_response({"status": "ready"})

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
