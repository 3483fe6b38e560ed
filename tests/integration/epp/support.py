"""What the endpoint picker tests read back: /metrics pages over real HTTP, a worker's served count."""

from __future__ import annotations

import aiohttp

from tests.integration.frontend.conftest import MODEL
from tests.support.metrics import metric

__all__ = ["picks", "scrape", "served"]


async def scrape(port: int) -> str:
    """A /metrics page over real HTTP (the picker's and the frontends' run in the test's event loop)."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        return await r.text()


async def picks(epp, worker: str, role: str = "agg", model: str = MODEL) -> float:
    """The requests the picker named ``worker`` for, in ``role``."""
    text = await scrape(epp.metrics_port)
    return metric(text, "dynamo_epp_worker_picks_total", f'model="{model}",role="{role}",worker="{worker}"')


def served(mocker) -> float:
    """The requests a mocker worker finished, whatever their outcome (its own /metrics)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in mocker.metrics().splitlines()
        if line.startswith("dynamo_worker_requests_total{")
    )
