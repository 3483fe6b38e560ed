"""The picker's own count of its requests on a worker, through a real Envoy: a request counts on the
worker the picker named from the decision until its response is over (Envoy holds the ext_proc stream
open that long, ``response_trailer_mode: SEND``), and a client that goes away mid-stream ends the count
too, so that it goes back to zero."""

from __future__ import annotations

import aiohttp
import pytest

from tests.integration.frontend.conftest import MODEL
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


async def test_a_request_counts_on_its_worker_while_it_streams_and_not_after_it_ends_or_is_dropped(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    m = mockers("null", speedup=2.0)  # slow enough that a stream is still open after its first chunk
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe], router_mode="kv")
    for stack in (fe, epp):
        await wait_workers(stack, 1, mockers=[m])
    gateway = envoy(epp.grpc_port)

    def requests() -> int:
        return epp.router.load_of(m.instance_id)["requests"]

    body = {"model": MODEL, "prompt": "count me while I stream", "max_tokens": 40, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            await r.content.readline()  # the first event: the request runs
            assert requests() == 1
            async for _ in r.content:
                pass
        await wait_until_async(lambda: requests() == 0, "the finished request to end its count", timeout_s=10)

        async with s.post(gateway.url + "/v1/completions", json=body) as r:
            await r.content.readline()
            assert requests() == 1
            r.close()  # the client goes away mid-stream: Envoy resets the ext_proc stream
        await wait_until_async(lambda: requests() == 0, "the dropped request to end its count", timeout_s=10)
