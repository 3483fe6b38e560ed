"""Load mode's input: the workers' load reports on the event plane (``dynamo.<ns>.load``), joined with
discovery for each worker's role. ``summary`` gives, per role, the mean waiting requests per worker and
the mean KV usage of the workers alive in discovery; a role none of whose workers reported gives
``(None, None)`` (the planner then leaves it unchanged and says so)."""

from __future__ import annotations

from collections.abc import Mapping

from nats.aio.client import Client as NATS

from dynamo_worker.protocol import LoadMetrics
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.events import subscribe_load

__all__ = ["LoadFeed", "summarise"]


def summarise(
    roles: Mapping[str, str], reports: Mapping[str, LoadMetrics]
) -> dict[str, tuple[float | None, float | None]]:
    """Pure: ``roles`` instance id -> role (alive ones), ``reports`` instance id -> last report."""
    out: dict[str, tuple[float | None, float | None]] = {}
    for role in set(roles.values()):
        mine = [reports[i] for i, r in roles.items() if r == role and i in reports]
        if not mine:
            out[role] = (None, None)
            continue
        queue = sum(m.waiting for m in mine) / len(mine)
        kv = sum(m.active_blocks / m.total_blocks for m in mine if m.total_blocks) / len(mine)
        out[role] = (queue, kv)
    return out


class LoadFeed:
    def __init__(self, nc: NATS, namespace: str) -> None:
        self._nc, self.namespace = nc, namespace
        self.watcher = InstanceWatcher(nc, namespace)
        self.reports: dict[str, LoadMetrics] = {}

    async def start(self) -> LoadFeed:
        await self.watcher.start()

        async def on_load(m: LoadMetrics) -> None:
            self.reports[m.instance_id] = m

        self._sub = await subscribe_load(self._nc, self.namespace, on_load)
        return self

    def summary(self) -> dict[str, tuple[float | None, float | None]]:
        roles = {i: rec.role for i, rec in self.watcher.instances.items()}
        return summarise(roles, self.reports)

    async def stop(self) -> None:
        await self._sub.unsubscribe()
        await self.watcher.stop()
