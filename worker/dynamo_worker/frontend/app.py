"""The frontend process: NATS, discovery, model cards, router feed and the HTTP server, wired together.

``Frontend.start`` connects to NATS, loads the current instances from discovery, subscribes the router
to KV events and load metrics (asking each worker for a snapshot of the KV blocks it already holds),
and listens for HTTP; ``/health`` turns 200 once a model is served.
``Frontend.stop`` stops taking requests, gives in-flight ones ``drain_s`` to finish, and closes
everything else in the reverse order of its start (an ``AsyncExitStack``: each part is pushed as it is
started, so a partial start closes what it started). ``run_frontend`` does both around SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler
from nats.aio.client import Client as NATS

from dynamo_worker.frontend.http.server import OpenAIServer
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.pairing import WarmPairs
from dynamo_worker.frontend.models.preprocessor import ModelFiles, Preprocessor
from dynamo_worker.frontend.models.registry import ModelRegistry, UnpairedCounts, WorkerCounts
from dynamo_worker.frontend.requests.chat_images import ImageFetcher, MultimodalProcessor
from dynamo_worker.frontend.serving.admission import Admission
from dynamo_worker.frontend.serving.direct import PIN, pin_from_headers
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.frontend.serving.image_generation import ImagesApi
from dynamo_worker.frontend.serving.migration import MigratingDispatcher
from dynamo_worker.frontend.serving.quarantine import Quarantine
from dynamo_worker.frontend.serving.warmup import PairWarmer
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.router.feed import KvFeed, feed_router
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.children import die_with_parent
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.listening import serve
from dynamo_worker.runtime.modelcard import ModelCardError, fetch_model_card
from dynamo_worker.runtime.request_plane import RequestClient
from dynamo_worker.runtime.worker import close_nats, connect_nats, redact_url

log = logging.getLogger(__name__)

__all__ = ["Frontend", "load_preprocessor", "run_frontend"]

DRAIN_S = 10.0


async def load_preprocessor(nc: NATS, record: InstanceRecord, cache: Path) -> Preprocessor:
    """The tokenizer and chat template of ``record``'s model card, fetched into ``cache`` (also for the
    endpoint picker, which must tokenize exactly as the frontend does)."""
    if not record.model_card_checksum:
        raise ModelCardError(f"worker {record.instance_id} registered no model card checksum")
    card, local = await fetch_model_card(nc, record.model_card_checksum, cache)
    files = ModelFiles(
        context_length=card.context_length,
        eos_token_ids=tuple(card.eos_token_ids),
        features=card.features,
    )
    return await asyncio.to_thread(Preprocessor.from_dir, local, files)


class Frontend:
    def __init__(self, settings: FrontendSettings) -> None:
        self.settings = settings
        self.nc: NATS | None = None
        self.router = Router(
            settings.router_mode,
            weights=settings.kv_weights(),
            predict_ttl_s=settings.kv_predict_ttl_s,
        )
        self.client = RequestClient(
            connect_timeout_s=settings.connect_timeout_s,
            first_token_timeout_s=settings.first_token_timeout_s,
            inter_token_timeout_s=settings.inter_token_timeout_s,
        )
        self.metrics = FrontendMetrics()
        self._unpaired: UnpairedCounts = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._watcher: InstanceWatcher | None = None
        self._rewatch: asyncio.Task[None] | None = None
        self.kv_feed: KvFeed | None = None
        self._stack = contextlib.AsyncExitStack()
        self._drain_s = DRAIN_S
        self._runner: web.AppRunner | None = None
        self.registry: ModelRegistry | None = None
        self.quarantine: Quarantine | None = None
        self.warmer: PairWarmer | None = None
        self.server: OpenAIServer | None = None
        self.multimodal: MultimodalProcessor | None = None
        self.images: ImagesApi | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.settings.http_host in ("0.0.0.0", "") else self.settings.http_host
        return f"http://{host}:{self.port}"

    async def _load_card(self, record: InstanceRecord) -> Preprocessor:
        assert self.nc is not None
        cache = self.settings.model_cache_dir
        if cache is None:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="dynamo-frontend-cards-")
            cache = Path(self._tmp.name)
        return await load_preprocessor(self.nc, record, cache)

    def _rewatch_soon(self) -> None:
        """After a NATS reconnect, start the discovery watch over at once."""
        if self._watcher is not None:
            self._rewatch = asyncio.create_task(self._watcher.rewatch(), name="rewatch-discovery")

    def _count_workers(self, counts: WorkerCounts, unpaired: UnpairedCounts) -> None:
        for (model, role), n in counts.items():
            self.metrics.workers.labels(model, role).set(n)
        for key in self._unpaired.keys() - unpaired.keys():
            self.metrics.unpaired.remove(*key)
        for key, n in unpaired.items():
            self.metrics.unpaired.labels(*key).set(n)
        self._unpaired = unpaired

    async def start(self) -> Frontend:
        s, stack = self.settings, self._stack
        stack.callback(self._remove_card_cache)
        self.nc = await connect_nats(s.nats_server, name="dynamo-frontend", on_reconnect=self._rewatch_soon)
        stack.push_async_callback(self._close_nats)
        stack.push_async_callback(self.client.close)  # worker connections: after HTTP has stopped
        self.registry = ModelRegistry(
            self.router,
            self._load_card,
            s.namespace,
            s.model_load_timeout_s,
            on_change=self._count_workers,
            retention_s=s.model_retention_s,
            graph_models=[m.strip() for m in s.graph_models.split(",") if m.strip()],
        )
        stack.push_async_callback(self.registry.close)
        if s.router_mode == "kv":
            self.kv_feed = await feed_router(
                self.nc, s.namespace, self.router, snapshot_timeout_s=s.kv_snapshot_timeout_s
            )
            stack.push_async_callback(self.kv_feed.close)
        self._watcher = await InstanceWatcher(self.nc, s.namespace).start()
        stack.push_async_callback(self._stop_watching)
        self.quarantine = Quarantine(self.registry.has_worker)
        stack.push_async_callback(self.quarantine.close)
        events = self.quarantine.releasing(self._watcher.events())
        self.discovery = asyncio.create_task(self.registry.run(events), name="discovery")
        stack.push_async_callback(cancel_and_wait, self.discovery)
        warm = WarmPairs() if s.pair_warmup_timeout_s > 0 else None
        dispatcher = Dispatcher(
            self.router,
            self.client,
            kv_transfer_timeout_s=s.kv_transfer_timeout_s,
            quarantine=self.quarantine,
            warm=warm,
            on_direct_fallback=lambda model, why: self.metrics.direct_fallbacks.labels(model, why).inc(),
        )
        if warm is not None:
            self.warmer = PairWarmer(
                self.registry,
                warm,
                dispatcher.warm_up,
                timeout_s=s.pair_warmup_timeout_s,
                metrics=self.metrics,
            )
            stack.push_async_callback(self.warmer.close)
            self.registry.add_listener(self.warmer.changed)
            self.warmer.changed()  # the workers discovery listed before this listener was added
        migrating = MigratingDispatcher(
            dispatcher,
            s.migration_limit,
            on_migration=lambda model: self.metrics.migrations.labels(model).inc(),
            wait_s=s.scale_up_timeout_s,
            workers_changed=self.registry.wait_changed,
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
        stack.push_async_callback(self.multimodal.close)
        self.images = ImagesApi(
            self.registry, connect_timeout_s=s.connect_timeout_s, timeout_s=s.image_generation_timeout_s
        )
        stack.push_async_callback(self.images.close)
        self.server = OpenAIServer(
            self.registry,
            migrating,
            self.metrics,
            max_inflight=s.max_inflight,
            embedding_batch_window_s=s.embedding_batch_window_ms / 1000,
            multimodal=self.multimodal,
            images=self.images,
            admission=Admission(
                self.registry,
                self.metrics,
                max_queued=s.max_queued_requests,
                queue_ttl_s=s.queue_ttl_s,
                scale_up_timeout_s=s.scale_up_timeout_s,
            ),
            starting=self.warmer.starting if self.warmer is not None else None,
            api_keys=s.api_keys(),
        )
        stack.push_async_callback(self.server.embedder.close)
        reuse_port = s.http_reuse_port or s.http_workers > 1
        application = self.server.app()
        if s.router_mode == "direct":
            application.middlewares.append(_pin_named_workers)
        self._runner, self.port = await serve(
            application,
            "frontend",
            s.http_host,
            s.http_port,
            what="the frontend",
            flag="--http-port",
            handler_cancellation=True,
            backlog=2048,
            reuse_port=reuse_port or None,
        )
        stack.push_async_callback(self._stop_http, self._runner, self.server)
        log.info(
            "Started frontend namespace=%s router_mode=%s migration_limit=%d nats=%s api_keys=%d",
            s.namespace,
            s.router_mode,
            s.migration_limit,
            redact_url(s.nats_server),
            len(s.api_keys()),
        )
        return self

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        """Stop taking requests, give in-flight ones ``drain_s``, then close the rest, last started first.
        Safe after a partial start, and a second time."""
        self._drain_s = drain_s
        await self._stack.aclose()
        log.info("Frontend stopped")

    async def _stop_http(self, runner: web.AppRunner, server: OpenAIServer) -> None:
        """Stop accepting first (``runner.shutdown`` alone does not: aiohttp closes its listeners in
        ``cleanup``), let in-flight requests finish within the drain, then close every connection."""
        for site in runner.sites:
            await site.stop()  # no new connection
        if runner.server is not None:
            runner.server.pre_shutdown()  # an open connection takes no new request after its current one
        await runner.shutdown()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._drain_s):
                await server.idle.wait()
        await runner.cleanup()
        self._runner = None

    async def _stop_watching(self) -> None:
        watcher, self._watcher = self._watcher, None  # a reconnect from now on starts no re-watch
        if self._rewatch is not None:
            await cancel_and_wait(self._rewatch)
        if watcher is not None:
            await watcher.stop()

    async def _close_nats(self) -> None:
        if self.nc is not None:
            await close_nats(self.nc)
            self.nc = None

    def _remove_card_cache(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@web.middleware
async def _pin_named_workers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """--router-mode direct: the workers the endpoint picker named, for this request's task
    (``serving.direct``)."""
    token = PIN.set(pin_from_headers(request.headers))
    try:
        return await handler(request)
    finally:
        PIN.reset(token)


async def run_frontend(
    settings: FrontendSettings, *, stop: asyncio.Event | None = None, argv: Sequence[str] = ()
) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop``); 0 after a clean shutdown, 1 when starting failed.
    With ``--http-workers N`` it also runs N - 1 more serving processes (``argv`` plus the bound port)
    on the same port, stops them with itself, and stops everything when one of them dies."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    frontend = Frontend(settings)
    helpers: list[asyncio.subprocess.Process] = []
    try:
        try:
            await frontend.start()
            helpers = await _start_helpers(settings, frontend.port, argv)
        except (OSError, TimeoutError, RuntimeError) as e:
            log.error("Frontend failed to start: %s", e)
            await _stop_helpers(helpers)
            await frontend.stop(drain_s=0)
            return 1
        stopped = asyncio.create_task(stop.wait())
        helper_exits = [asyncio.create_task(h.wait()) for h in helpers]
        await asyncio.wait({stopped, frontend.discovery, *helper_exits}, return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            stopped.cancel()
            if frontend.discovery.done():  # serving a frozen worker list would be wrong
                error = None if frontend.discovery.cancelled() else frontend.discovery.exception()
                log.error(
                    "Discovery watch ended (%s): the frontend can no longer see workers come and go; "
                    "exiting so that it is restarted",
                    error or "the watch stream closed",
                )
            else:
                dead = next(h for h in helpers if h.returncode is not None)
                log.error(
                    "Serving process pid=%s exited with %s; exiting so that the frontend is restarted",
                    dead.pid,
                    dead.returncode,
                )
            await _stop_helpers(helpers)
            await frontend.stop(drain_s=0)
            return 1
        log.info("Shutting down frontend")
        await asyncio.gather(_stop_helpers(helpers), frontend.stop())
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _start_helpers(
    settings: FrontendSettings, port: int | None, argv: Sequence[str]
) -> list[asyncio.subprocess.Process]:
    """The extra serving processes of ``--http-workers``: this command again, on the bound port."""
    extra = [*argv, "--http-port", str(port), "--http-workers", "1", "--http-reuse-port"]
    helpers = []
    for _ in range(settings.http_workers - 1):
        helpers.append(
            await asyncio.create_subprocess_exec(
                *die_with_parent(), sys.executable, "-m", "dynamo_worker.frontend", *extra
            )
        )
    if helpers:
        log.info("Started serving processes count=%d port=%s", len(helpers), port)
    return helpers


async def _stop_helpers(helpers: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM (they drain like this process), then SIGKILL after the drain bound."""
    for h in helpers:
        if h.returncode is None:
            h.terminate()
    for h in helpers:
        try:
            async with asyncio.timeout(DRAIN_S + 5):
                await h.wait()
        except TimeoutError:
            h.kill()
            await h.wait()
