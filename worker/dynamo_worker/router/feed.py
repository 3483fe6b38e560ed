"""Feed a ``Router`` from the event plane: KV cache events and load metrics of a namespace (NATS I/O)."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from dynamo_worker.router.router import Router
from dynamo_worker.runtime.events import subscribe_kv_events, subscribe_load

__all__ = ["feed_router"]


async def feed_router(nc: NATS, namespace: str, router: Router) -> list[Subscription]:
    """Subscribe the router to the namespace's KV events and load metrics; unsubscribe the returned
    subscriptions to stop."""
    return [
        await subscribe_kv_events(nc, namespace, router.on_kv_events),
        await subscribe_load(nc, namespace, router.on_load),
    ]
