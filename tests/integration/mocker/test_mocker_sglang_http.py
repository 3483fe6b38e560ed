"""The mocker serving SGLang's native HTTP API (``python -m dynamo_worker.mocker.sglang_http``) with the
real SGLang gateway (``smg launch --policy cache_aware``, the PyPI package) in front of two of them, as
``tests/gpu/run_peers.py`` runs the gateway's stack on the mocker: the gateway registers and
health-checks them, streams ``/generate`` answers in SGLang's shape, and sends a repeated prompt to the
engine that holds its prefix. Everything is real: processes, HTTP, the gateway binary."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.cluster import free_port
from tests.support.procs import listening_port, popen
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:  # the child keeps its own descriptor
        return popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model) -> Iterator[tuple[str, list[str]]]:
    """Two simulated SGLang servers behind the gateway: (the gateway's URL, the servers' URLs)."""
    logs = tmp_path_factory.mktemp("sglang-http")
    procs: list[subprocess.Popen] = []
    try:
        servers = []
        server = [sys.executable, "-m", "dynamo_worker.mocker.sglang_http", "--port", "0"]
        server += ["--model-path", "Qwen/Qwen3-0.6B", "--model-dir", str(tiny_model), "--page-size", "16"]
        for i in range(2):
            log = logs / f"server-{i}.log"
            procs.append(_start(server, log))
            servers.append(f"http://127.0.0.1:{listening_port(procs[-1], log, 'http')}")
        port = free_port()
        smg = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port)]
        smg += ["--prometheus-port", str(free_port()), "--policy", "cache_aware", "--worker-urls", *servers]
        procs.append(_start(smg, logs / "smg.log"))
        yield f"http://127.0.0.1:{port}", servers
    finally:
        _stop(procs)


async def _generate(session: aiohttp.ClientSession, url: str, ids: list[int], n: int) -> list[dict]:
    """A streamed /generate: its events, checked to end with [DONE]."""
    body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
    async with session.post(f"{url}/generate", json=body) as r:
        assert r.status == 200, await r.text()
        lines = [line.strip() async for line in r.content if line.strip()]
    assert lines[-1] == b"data: [DONE]"
    return [json.loads(line.removeprefix(b"data: ")) for line in lines[:-1]]


async def _served(session: aiohttp.ClientSession, gateway: str) -> bool:
    """The gateway registers its workers in the background: until then it answers 503."""
    try:
        async with session.post(f"{gateway}/generate", json={"input_ids": [5] * 8}) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def test_gateway_streams_sglang_answers_and_routes_a_repeat_to_its_cache(stack):
    gateway, _ = stack
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        await wait_until_async(lambda: _served(session, gateway), "smg to register the workers", timeout_s=60)
        for k in range(4):  # distinct prompts: each repeat finds its prefix only where the first went
            prompt = [100 + (k * 37 + i) % 700 for i in range(64)]
            first = await _generate(session, gateway, prompt, 5)
            assert [len(e["output_ids"]) for e in first] == [1, 2, 3, 4, 5], "the whole output each time"
            meta = first[-1]["meta_info"]
            assert meta["prompt_tokens"] == 64 and meta["completion_tokens"] == 5
            assert meta["finish_reason"] == {"type": "length", "length": 5}
            assert meta["cached_tokens"] == 0 and "cached_tokens_details" not in meta
            assert first[-1]["text"], "the tokens detokenized"
            again = (await _generate(session, gateway, prompt, 5))[-1]["meta_info"]
            assert again["cached_tokens"] >= 48, f"prompt {k}: the repeat went to the other engine: {again}"
            assert again["cached_tokens_details"] == {"device": again["cached_tokens"], "host": 0}


async def test_errors_and_disconnect_as_sglang(stack):
    _, servers = stack
    url = servers[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.post(f"{url}/generate", json={"input_ids": [7] * 5000}) as r:  # over 4096
            assert r.status == 400
            assert "context length" in (await r.json())["error"]["message"]
        body = {"input_ids": [7] * 5000, "stream": True}
        async with session.post(f"{url}/generate", json=body) as r:
            events = [line.strip() async for line in r.content if line.strip()]
        assert json.loads(events[0].removeprefix(b"data: "))["error"]["code"] == 400
        assert events[-1] == b"data: [DONE]"
        async with session.post(f"{url}/generate", json={"sampling_params": {"stop": ["x"]}}) as r:
            assert r.status == 400 and (await r.json())["object"] == "error"

        async def running() -> int:
            async with session.get(f"{url}/v1/loads") as r:
                return (await r.json())["loads"][0]["num_running_reqs"]

        body = {"input_ids": [9] * 32, "stream": True, "sampling_params": {"max_new_tokens": 3000}}
        async with session.post(f"{url}/generate", json=body) as r:
            await r.content.readline()  # the first token: it runs
            assert await running() == 1
        # the connection closed mid-answer: the engine drops the request
        await wait_until_async(lambda: _zero(running), "the aborted request to leave the batch", timeout_s=10)


async def _zero(read) -> bool:
    return await read() == 0
