"""The frontend process: NATS, discovery, model cards, router feed and the HTTP server, wired together.

``Frontend.start`` connects to NATS, loads the current instances from discovery, subscribes the router
to KV events and load metrics, and listens for HTTP; ``/health`` turns 200 once a model is served.
``Frontend.stop`` stops taking requests, gives in-flight ones ``drain_s`` to finish, and closes
everything. ``run_frontend`` does both around SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from pathlib import Path

from aiohttp import web
from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription

from dynamo_worker.frontend.dispatch import Dispatcher
from dynamo_worker.frontend.images import ImagesApi
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.multimodal import ImageFetcher, MultimodalProcessor
from dynamo_worker.frontend.preprocess import ModelFiles, Preprocessor
from dynamo_worker.frontend.registry import ModelRegistry
from dynamo_worker.frontend.server import OpenAIServer
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.router.feed import feed_router
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.modelcard import ModelCardError, fetch_model_card
from dynamo_worker.runtime.request_plane import RequestClient
from dynamo_worker.runtime.worker import connect_nats

log = logging.getLogger(__name__)

__all__ = ["Frontend", "run_frontend"]

DRAIN_S = 10.0


class Frontend:
    def __init__(self, settings: FrontendSettings) -> None:
        self.settings = settings
        self.nc: NATS | None = None
        self.router = Router(settings.router_mode, settings.kv_overlap_weight)
        self.client = RequestClient(
            connect_timeout=settings.connect_timeout_s,
            first_chunk_timeout=settings.first_token_timeout_s,
            idle_timeout=settings.inter_token_timeout_s,
        )
        self.metrics = FrontendMetrics()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._watcher: InstanceWatcher | None = None
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.registry: ModelRegistry | None = None
        self.server: OpenAIServer | None = None
        self.multimodal: MultimodalProcessor | None = None
        self.images: ImagesApi | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.settings.http_host in ("0.0.0.0", "") else self.settings.http_host
        return f"http://{host}:{self.port}"

    async def _load_card(self, record: InstanceRecord) -> Preprocessor:
        if not record.model_card_checksum:
            raise ModelCardError(f"worker {record.instance_id} registered no model card checksum")
        assert self.nc is not None
        cache = self.settings.model_cache_dir
        if cache is None:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="dynamo-frontend-cards-")
            cache = Path(self._tmp.name)
        card, local = await fetch_model_card(self.nc, record.model_card_checksum, cache)
        files = ModelFiles(context_length=card.context_length, eos_token_ids=tuple(card.eos_token_ids))
        return await asyncio.to_thread(Preprocessor.from_dir, local, files)

    def _count_workers(self, counts: dict[tuple[str, str], int]) -> None:
        for (model, role), n in counts.items():
            self.metrics.workers.labels(model, role).set(n)

    async def start(self) -> Frontend:
        s = self.settings
        self.nc = await connect_nats(s.nats_server, name="dynamo-frontend")
        self.registry = ModelRegistry(
            self.router, self._load_card, s.namespace, s.model_load_timeout_s, on_change=self._count_workers
        )
        if s.router_mode == "kv":
            self._subs = await feed_router(self.nc, s.namespace, self.router)
        self._watcher = await InstanceWatcher(self.nc, s.namespace).start()
        self.discovery = asyncio.create_task(self.registry.run(self._watcher.events()), name="discovery")
        self._tasks.append(self.discovery)
        dispatcher = Dispatcher(
            self.router,
            self.client,
            connect_timeout_s=s.connect_timeout_s,
            first_token_timeout_s=s.first_token_timeout_s,
            inter_token_timeout_s=s.inter_token_timeout_s,
        )
        self.multimodal = MultimodalProcessor(
            ImageFetcher(
                max_bytes=s.max_image_bytes,
                timeout_s=s.image_fetch_timeout_s,
                allow_private=s.allow_private_image_urls,
            ),
            max_images=s.max_images_per_request,
            connect_timeout_s=s.connect_timeout_s,
            encode_timeout_s=s.encode_timeout_s,
        )
        self.images = ImagesApi(
            self.registry, connect_timeout_s=s.connect_timeout_s, timeout_s=s.image_generation_timeout_s
        )
        self.server = OpenAIServer(
            self.registry,
            dispatcher,
            self.metrics,
            max_inflight=s.max_inflight,
            multimodal=self.multimodal,
            images=self.images,
        )
        self._runner = web.AppRunner(self.server.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.http_host, s.http_port, backlog=2048)
        await site.start()
        server = site._server  # aiohttp exposes the bound sockets only here
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        log.info(
            "Frontend listening url=%s namespace=%s router_mode=%s nats=%s",
            self.url,
            s.namespace,
            s.router_mode,
            s.nats_server,
        )
        return self

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        if self._runner is not None:
            await self._runner.shutdown()  # stop accepting; in-flight handlers continue
            if self.server is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(drain_s):
                        await self.server.idle.wait()
            await self._runner.cleanup()
            self._runner = None
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.registry is not None:
            await self.registry.close()
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        await self.client.close()
        if self.multimodal is not None:
            await self.multimodal.close()
        if self.images is not None:
            await self.images.close()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self.nc.close()
            self.nc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        log.info("Frontend stopped")


async def run_frontend(settings: FrontendSettings, *, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop``); 0 after a clean shutdown, 1 when starting failed."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    frontend = Frontend(settings)
    try:
        try:
            await frontend.start()
        except (OSError, TimeoutError, RuntimeError) as e:
            log.error("Frontend failed to start: %s", e)
            await frontend.stop(drain_s=0)
            return 1
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({stopped, frontend.discovery}, return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():  # the discovery watch ended: serving a frozen worker list would be wrong
            stopped.cancel()
            error = None if frontend.discovery.cancelled() else frontend.discovery.exception()
            log.error(
                "Discovery watch ended (%s): the frontend can no longer see workers come and go; "
                "exiting so that it is restarted",
                error or "the watch stream closed",
            )
            await frontend.stop(drain_s=0)
            return 1
        log.info("Shutting down frontend")
        await frontend.stop()
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
