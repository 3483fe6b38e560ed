"""A TLS proxy in front of the real kube-apiserver that answers the first ``conflicts`` status writes
of a DynamoGraphDeployment with ``409 Conflict`` (the Status body the apiserver itself sends when an
object changed under a write) and forwards everything else, watches included, unchanged.

This is the one fault the real apiserver cannot be made to produce on demand: the operator writes
status with a merge patch that carries no resourceVersion, so a genuine conflict needs a race the test
cannot time. Everything behind the proxy is real; only those answers are injected.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from pathlib import Path

import aiohttp
from aiohttp import web

__all__ = ["ConflictProxy"]

_HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


class ConflictProxy:
    def __init__(self, upstream: str, pki: Path, conflicts: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.pki = pki
        self.left = conflicts
        self.conflicted = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="conflict-proxy")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> ConflictProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        client_ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        client_ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_ctx), timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=True,
        )  # fmt: skip
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(self.pki / "server.crt"), str(self.pki / "server.key"))
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        self.url = f"https://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        status_write = request.method == "PATCH" and request.path.endswith("/status")
        if status_write and "/dynamographdeployments/" in request.path and self.left > 0:
            self.left -= 1
            self.conflicted += 1
            name = request.path.split("/")[-2]
            return web.json_response(
                {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Operation cannot be fulfilled on dynamographdeployments.nvidia.com "
                    f'"{name}": the object has been modified; please apply your changes to the latest '
                    "version and try again",
                    "reason": "Conflict", "code": 409,
                },
                status=409,
            )  # fmt: skip
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            data=(await request.read()) or None,
            headers=headers,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP},
            )
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionResetError):
                pass  # either side went away (a watch ended, the operator stopped, the proxy stops)
            return response

    def stop(self) -> None:
        async def _stop() -> None:
            if self._session is not None:
                await self._session.close()  # ends the watches being relayed
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
