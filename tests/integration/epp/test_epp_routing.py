"""Requests through a real Envoy and the endpoint picker land on the workers the picker chose, and the
frontend serves them there (``--router-mode direct``) without routing any itself."""

from __future__ import annotations

import openai
import pytest

from tests.integration.epp.support import picks, scrape, served
from tests.integration.frontend.conftest import MODEL

pytestmark = pytest.mark.integration


async def test_requests_land_on_the_workers_the_picker_named(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    ms = [mockers("null", speedup=100.0) for _ in range(3)]
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe], router_mode="round-robin")
    await wait_workers(fe, 3, mockers=ms)
    await wait_workers(epp, 3, mockers=ms)
    gateway = envoy(epp.grpc_port)
    async with openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0, timeout=30) as c:
        for i in range(9):
            r = await c.completions.create(model=MODEL, prompt=f"hello {i}", max_tokens=2)
            assert r.choices[0].text
    for m in ms:
        chosen = await picks(epp, m.instance_id)
        assert chosen == 3 and served(m) == chosen, (m.instance_id, chosen, served(m))
    assert "dynamo_frontend_direct_fallbacks_total{" not in await scrape(fe.port)
