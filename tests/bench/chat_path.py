"""The shape of one chat request's route through the frontend (not a test):
``python -m tests.bench.chat_path``.

An in-process frontend, one mocker process and a nats-server, all on 127.0.0.1. After two warm-up
requests, each traced request records every product function called (``sys.setprofile``) inside the
task that serves it and the tasks it starts: from the HTTP handler through the worker client and back
to the response body. For each request kind (a plain chat, whole and streamed; a chat with logprobs; a
KV-routed chat) it prints the files the route runs through and its *returns*: the calls that enter a
file the route had already left (the files of successive calls, repeats collapsed, that appeared
before), for the whole route and for ``prepare_chat``'s part (calls made while it is on the stack).
A regression count for the closing note of a change, not a goal: a return is a reader's jump back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
from dynamo_worker.frontend.app import Frontend
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.runtime.nats_server import NatsServer
from dynamo_worker.tinymodel import ensure_tiny_model

MODEL = "tiny"
ROOTS = ("dynamo_worker", "dynamo_api")  # the product's packages
# aiohttp's task per request (and per connection): what runs in them serves the request
_HANDLER_TASKS = ("RequestHandler._handle_request", "RequestHandler.start")
_serving: contextvars.ContextVar[bool] = contextvars.ContextVar("serving", default=False)


def _product_file(filename: str) -> str | None:
    parts = Path(filename).parts
    for root in ROOTS:
        if root in parts:
            return "/".join(parts[parts.index(root) :])
    return None


class PathTracer:
    """Product files whose functions run in the tasks of aiohttp's request handler (and their children:
    a ``ContextVar`` set there is copied into every task created from it)."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.path: list[str] = []  # the file of each call, repeats collapsed
        self.prepare: list[str] = []  # the same, for calls made while prepare_chat is on the stack

    def _profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        name = _product_file(frame.f_code.co_filename)
        if name is None:
            return
        if not _serving.get():
            try:
                task = asyncio.current_task()
            except RuntimeError:
                return
            coro = task.get_coro() if task is not None else None
            if getattr(coro, "__qualname__", "") not in _HANDLER_TASKS:
                return
            _serving.set(True)
        self.files.add(name)
        _extend(self.path, name)
        if _under(frame, "prepare_chat"):
            _extend(self.prepare, name)

    def __enter__(self) -> PathTracer:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


def _extend(path: list[str], name: str) -> None:
    if not path or path[-1] != name:
        path.append(name)


def _under(frame: FrameType | None, function: str) -> bool:
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def returns(path: list[str]) -> int:
    """Calls along ``path`` that enter a file the route had already left."""
    seen: set[str] = set()
    count = 0
    for name in path:
        count += name in seen
        seen.add(name)
    return count


async def _wait_served(fe: Frontend, mocker: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        entry = fe.registry.get(MODEL) if fe.registry is not None else None
        if entry is not None and entry.workers and entry.preprocessor is not None:
            return
        if mocker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the mocker did not come up (exit code {mocker.poll()})")
        await asyncio.sleep(0.1)


# (router mode, the request's extra fields) per request kind
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "plain chat, whole": ("round-robin", {}),
    "plain chat, streamed": ("round-robin", {"stream": True}),
    "chat with logprobs, streamed": ("round-robin", {"stream": True, "logprobs": True}),
    "KV-routed chat, streamed": ("kv", {"stream": True}),
}


async def _post(url: str, extra: dict[str, Any]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello, how are you?"}], "max_tokens": 8}
    # a connection per request: its handler task serves this request only
    async with aiohttp.ClientSession() as http, http.post(url, json=body | extra) as r:
        await r.read()
        assert r.status == 200, await r.text()


def start_mocker(nats_url: str, namespace: str, model_dir: Path, log_path: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "dynamo_worker.mocker", "--model-path", str(model_dir),
        "--served-model-name", MODEL, "--namespace", namespace, "--nats-server", nats_url,
        "--system-port", "0", "--request-port", "0", "--listen-host", "127.0.0.1",
        "--advertise-host", "127.0.0.1", "--speedup", "100", "--graceful-shutdown-s", "1",
    ]  # fmt: skip
    with open(log_path, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


async def measure(nats_url: str, namespace: str, mocker: subprocess.Popen) -> dict[str, PathTracer]:
    found = {}
    for mode in dict.fromkeys(m for m, _ in REQUESTS.values()):
        settings = FrontendSettings(
            http_host="127.0.0.1", http_port=0, namespace=namespace, nats_server=nats_url, router_mode=mode
        )
        fe = await Frontend(settings).start()
        try:
            await _wait_served(fe, mocker)
            url = fe.url + "/v1/chat/completions"
            for name, (_, extra) in ((n, r) for n, r in REQUESTS.items() if r[0] == mode):
                for _ in range(2):
                    await _post(url, extra)  # warm-up: lazy imports, caches
                with PathTracer() as tracer:
                    await _post(url, extra)
                found[name] = tracer
        finally:
            await fe.stop(drain_s=1)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.chat_path", description=__doc__)
    parser.parse_args(argv)
    namespace = "path-" + uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="chat-path-") as tmp, NatsServer() as nats:
        model_dir = ensure_tiny_model(Path(tmp) / "model")
        mocker = start_mocker(nats.url, namespace, model_dir, Path(tmp) / "mocker.log")
        try:
            found = asyncio.run(measure(nats.url, namespace, mocker))
        finally:
            mocker.terminate()
            mocker.wait(15)
    for name, tracer in found.items():
        print(f"\n{name}: {len(tracer.files)} files, {returns(tracer.path)} returns to a file already left")
        print(f"  prepare_chat's part: {returns(tracer.prepare)} returns: {' -> '.join(tracer.prepare)}")
        for f in sorted(tracer.files):
            print("  " + f)
    union = set().union(*(t.files for t in found.values()))
    print(f"\nall of them: {len(union)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
