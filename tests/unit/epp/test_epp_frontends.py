"""The frontend replicas the picker sends requests to (``epp.frontends``): while no replica is known (a
headless Service names no pod until the frontends are Ready) the names are looked up again every second,
not every ``--frontend-resolve-s``, so the picker has a destination within a second of the first Ready
frontend; a name that fails is said once, not at every look-up; once known, the slow period applies.

The look-up is injected: a name that starts resolving later cannot be made here without changing the
host's resolver, so a scripted look-up stands in for DNS (the real-node tier resolves a real headless
Service: tests/real/test_gateway_pods.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from dynamo_worker.epp.frontends import NONE_KNOWN_RESOLVE_S, Frontends

from tests.support.wait import wait_until_async


class ScriptedDns:
    """Fails ``failures`` times, then answers two addresses; counts the look-ups."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(-2, "Name or service not known")
        return ["10.0.0.2", "10.0.0.1"]


async def test_names_are_looked_up_every_second_until_a_replica_is_known_then_every_resolve_s(caplog):
    dns = ScriptedDns(failures=2)
    frontends = Frontends([("frontend-pods", 8000)], resolve_s=3600, lookup=dns)
    with caplog.at_level(logging.WARNING, logger="dynamo_worker.epp.frontends"):
        await frontends.resolve()  # the start's look-up: fails
        assert frontends.next() is None
        task = asyncio.create_task(frontends.run())
        try:
            found = await wait_until_async(lambda: frontends.endpoints, "a replica resolved", timeout_s=5)
            assert found == ["10.0.0.1:8000", "10.0.0.2:8000"]
            assert dns.calls == 3  # the start's, then one a second until it answered
            await asyncio.sleep(NONE_KNOWN_RESOLVE_S * 1.5)  # an absence: nothing to poll for
            assert dns.calls == 3, "looked up again within resolve_s although replicas are known"
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    failures = [r for r in caplog.records if "Cannot resolve frontend" in r.getMessage()]
    assert len(failures) == 1, "a failing name is said once until it resolves"
    assert {frontends.next(), frontends.next()} == {"10.0.0.1:8000", "10.0.0.2:8000"}
