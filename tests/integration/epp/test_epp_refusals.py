"""The endpoint picker's own answers, through a real Envoy: a full queue sheds with 429 and Retry-After,
a body that is not JSON is a 400, both OpenAI-shaped errors; and when the picker is killed, Envoy's
configured failure mode (fail closed, the config we ship) answers 503 at once."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys

import aiohttp
import pytest

from tests.integration.frontend.conftest import MODEL
from tests.support.procs import listening_port, popen
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


async def post(url: str, body: bytes | dict, timeout_s: float = 30) -> tuple[int, dict, dict]:
    kwargs = {"json": body} if isinstance(body, dict) else {"data": body}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s,
        s.post(url, **kwargs) as r,
    ):
        return r.status, dict(r.headers), await r.json(content_type=None)


async def test_a_full_queue_sheds_with_429_and_retry_after_through_envoy(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    m = mockers("null", speedup=0.5)
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory(
        [fe], router_mode="kv", kv_cache_util_threshold=0.001, max_queued=0, retry_after_s=2
    )
    for stack in (fe, epp):
        await wait_workers(stack, 1, mockers=[m])
    gateway = envoy(epp.grpc_port)
    url = f"{gateway.url}/v1/completions"
    long = {"model": MODEL, "prompt": "a long answer", "max_tokens": 400, "ignore_eos": True}
    busy = [asyncio.create_task(post(url, long, timeout_s=120))]
    try:
        # the long request's KV (a few blocks of 16384) is over the 0.1 % saturation threshold
        await wait_until_async(
            lambda: epp.flow.room([m.instance_id]) == 0,
            "the worker to report the long request's KV",
            timeout_s=20,
        )
        status, headers, body = await post(url, {"model": MODEL, "prompt": "one more", "max_tokens": 2})
        assert status == 429, body
        assert headers["Retry-After"] == "2"
        assert body["error"]["code"] == "queue_full"
        assert "--max-queued" in body["error"]["message"]
    finally:
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)


async def test_a_body_that_is_not_json_is_a_400_naming_the_fix(
    mockers, frontend_factory, wait_workers, epp_factory, envoy
):
    m = mockers("null", speedup=100.0)
    fe = await frontend_factory(router_mode="direct")
    epp = await epp_factory([fe])
    await wait_workers(epp, 1, mockers=[m])
    gateway = envoy(epp.grpc_port)
    status, _, body = await post(f"{gateway.url}/v1/chat/completions", b"model=tiny&prompt=hi")
    assert status == 400, body
    assert body["error"]["code"] == "invalid_json"
    assert "Send a JSON object" in body["error"]["message"]


def start_epp(log_path, namespace: str, nats_url: str, frontend_port: int) -> subprocess.Popen:
    """The picker as a process of its own, so that it can be killed."""
    args = ["--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "0", "--namespace", namespace]
    args += ["--nats-server", nats_url, "--frontends", f"127.0.0.1:{frontend_port}"]
    with open(log_path, "wb") as out:
        return popen([sys.executable, "-m", "dynamo_worker.epp", *args], stdout=out, stderr=subprocess.STDOUT)


async def test_envoy_fails_closed_with_503_when_the_picker_is_killed(
    mockers, frontend_factory, wait_workers, envoy, nats_url, namespace, tmp_path
):
    m = mockers("null", speedup=100.0)
    fe = await frontend_factory(router_mode="direct")
    await wait_workers(fe, 1, mockers=[m])
    log_path = tmp_path / "epp.log"
    proc = start_epp(log_path, namespace, nats_url, fe.port)
    try:
        grpc_port = await asyncio.to_thread(listening_port, proc, log_path, "grpc")
        metrics_port = await asyncio.to_thread(listening_port, proc, log_path, "metrics")

        async def ready() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(f"http://127.0.0.1:{metrics_port}/health") as r,
                ):
                    return r.status == 200
            return False

        await wait_until_async(ready, "the picker to serve the model", timeout_s=30)
        gateway = envoy(grpc_port)  # failure_mode_allow: false, as shipped
        url = f"{gateway.url}/v1/completions"
        status, _, body = await post(url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert status == 200, body
        proc.kill()
        proc.wait(10)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s,
            s.post(url, json={"model": MODEL, "prompt": "hi", "max_tokens": 2}) as r,
        ):
            assert r.status == 503, await r.text()  # within the client's 30 s: an answer, not a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
