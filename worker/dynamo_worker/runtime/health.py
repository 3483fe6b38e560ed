"""Canaries that act: the worker runs its engine's health check itself and acts on the answer.

Every ``interval_s`` the monitor calls the engine's ``health_check`` (the SGLang engine's reports its
last canary request; the mocker's, its scheduler), bounded by ``timeout_s``. On the first failure the
worker deregisters (``on_unhealthy``): frontends stop routing to it within their discovery watch, and
requests it serves now may finish. While the check keeps failing, ``/live`` turns 503 once it has
failed for ``liveness_fail_after_s`` so that Kubernetes restarts the container (its liveness probe);
a check that passes again before that re-registers the worker (``on_healthy``) and traffic returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dynamo_worker.runtime.aio import cancel_and_wait

__all__ = ["HealthMonitor"]

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(
        self,
        check: Callable[[], Awaitable[None]],
        *,
        interval_s: float,
        timeout_s: float,
        liveness_fail_after_s: float,
        on_unhealthy: Callable[[str], Awaitable[None]],
        on_healthy: Callable[[], Awaitable[None]],
    ) -> None:
        self._check = check
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.liveness_fail_after_s = liveness_fail_after_s
        self._on_unhealthy = on_unhealthy
        self._on_healthy = on_healthy
        self.failing_since: float | None = None
        self.reason: str | None = None
        self._registration_owed = False  # healthy again, not yet registered again (NATS refused it)
        self._task: asyncio.Task[None] | None = None

    def live(self) -> tuple[bool, str]:
        """Whether ``/live`` should pass, and why not."""
        if self.failing_since is None:
            return True, ""
        failing_for = time.monotonic() - self.failing_since
        if failing_for < self.liveness_fail_after_s:
            return True, ""
        return False, (
            f"the engine health check has failed for {failing_for:.0f}s (limit "
            f"{self.liveness_fail_after_s:g}s, --liveness-fail-after-s): {self.reason}"
        )

    async def check_once(self) -> str | None:
        """Run the check; None when it passed, else why not."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._check()
        except TimeoutError:
            return f"engine health check took longer than {self.timeout_s:g}s"
        except Exception as e:  # any failure of the check means unhealthy; acted on below
            return str(e) or type(e).__name__
        return None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            reason = await self.check_once()
            if reason is not None:
                self.reason = reason
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                    log.warning("Engine health check failed; deregistering reason=%s", reason)
                    await self._on_unhealthy(reason)
            elif self.failing_since is not None or self._registration_owed:
                if self.failing_since is not None:
                    log.info(
                        "Engine health check passes again after_s=%.1f; registering",
                        time.monotonic() - self.failing_since,
                    )
                # The engine answers: /live passes from now, before the worker is listed again (a
                # client that sees it listed finds it live), and whatever registering costs.
                self.failing_since, self.reason = None, None
                self._registration_owed = True
                try:
                    await self._on_healthy()
                except Exception as e:  # e.g. NATS unreachable: retried at the next interval
                    log.warning("Could not register again; retrying in %ss error=%r", self.interval_s, e)
                    continue
                self._registration_owed = False

    def start(self, *, registration_owed: bool = False) -> None:
        """Start checking, from a clean slate (also after ``stop``); ``registration_owed``: the worker
        is not registered yet, and registers at the first check that passes."""
        self.failing_since, self.reason = None, None
        self._registration_owed = registration_owed
        self._task = asyncio.create_task(self._run(), name="health-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
