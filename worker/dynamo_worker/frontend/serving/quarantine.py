"""Dead-worker quarantine: a worker that failed a request is out of this frontend's routing at once.

Discovery removes a dead worker only when its record expires (its TTL, 10 s by default). Until then
every new request would try it first. So when a request finds a worker unreachable, its stream broken,
or its stream stalled past the bound, the dispatcher calls ``Quarantine.add``: from that moment the
router never picks it (``ids``). It comes back when it answers again (a TCP connect to its request
plane succeeds; probed every ``probe_interval_s``) or leaves discovery (``present`` says no), whichever
comes first, or registers a new record (``releasing``: a worker whose engine died registers again once
it restarted it). With every worker of a role quarantined, the dispatcher answers 503 naming the role.

A probe is a plain connect: a SIGKILLed or crashed worker refuses it (its port is closed) and stays
out until its record expires; a worker that broke one stream but still listens is back within one
probe interval, so a transient failure never costs more than ``probe_interval_s`` of capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.discovery import InstanceAdded, InstanceEvent

__all__ = ["PROBE_INTERVAL_S", "Quarantine"]

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0  # a transient failure costs at most this long out of routing


@dataclass
class _Entry:
    address: str
    role: str
    reason: str
    since: float
    task: asyncio.Task[None] | None = None


class Quarantine:
    """Instance ids out of routing, each with the probe that brings it back."""

    def __init__(
        self,
        present: Callable[[str], bool] = lambda _: True,
        *,
        probe_interval_s: float = PROBE_INTERVAL_S,
        probe_timeout_s: float = 1.0,
    ) -> None:
        self._present = present
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self._entries: dict[str, _Entry] = {}
        self.ids: frozenset[str] = frozenset()  # read on every request: kept as a ready frozenset

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self._entries

    def reason(self, instance_id: str) -> str | None:
        entry = self._entries.get(instance_id)
        return entry.reason if entry is not None else None

    def add(self, instance_id: str, address: str, role: str, reason: str) -> None:
        """Take the worker out of routing now (no-op when it already is)."""
        if instance_id in self._entries:
            return
        entry = _Entry(address, role, reason, time.monotonic())
        self._entries[instance_id] = entry
        self.ids = frozenset(self._entries)
        log.warning(
            "Quarantined worker instance_id=%s role=%s address=%s reason=%s",
            instance_id,
            role,
            address,
            reason,
        )
        with contextlib.suppress(RuntimeError):  # no running loop (unit tests): no probe
            entry.task = asyncio.get_running_loop().create_task(
                self._probe(instance_id, entry), name=f"quarantine-{instance_id}"
            )

    def release(self, instance_id: str, why: str) -> None:
        entry = self._entries.pop(instance_id, None)
        if entry is None:
            return
        self.ids = frozenset(self._entries)
        if entry.task is not None and entry.task is not asyncio.current_task():
            entry.task.cancel()
        log.info(
            "Released worker from quarantine instance_id=%s role=%s after_s=%.1f why=%s",
            instance_id,
            entry.role,
            time.monotonic() - entry.since,
            why,
        )

    async def releasing(self, events: AsyncIterator[InstanceEvent]) -> AsyncIterator[InstanceEvent]:
        """``events`` passed on; a quarantined worker that registers a new record (discovery passes on
        no unchanged heartbeat) is released first: it restarted, and says it serves."""
        async for event in events:
            if isinstance(event, InstanceAdded) and event.record.instance_id in self._entries:
                self.release(event.record.instance_id, "registered again")
            yield event

    async def _probe(self, instance_id: str, entry: _Entry) -> None:
        host, _, port = entry.address.rpartition(":")
        while True:
            await asyncio.sleep(self.probe_interval_s)
            if not self._present(instance_id):
                self.release(instance_id, "left discovery")
                return
            try:
                async with asyncio.timeout(self.probe_timeout_s):
                    _, writer = await asyncio.open_connection(host, int(port))
            except (OSError, TimeoutError, ValueError):
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self.release(instance_id, "accepts connections again")
            return

    async def close(self) -> None:
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        self._entries.clear()
        self.ids = frozenset()
        await cancel_and_wait(*tasks)
