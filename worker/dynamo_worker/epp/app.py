"""The endpoint picker process: NATS, discovery, model cards, the router and its feed, the ext_proc gRPC
server with gRPC health, and ``/metrics``, wired together.

The routing state is the frontend's, built by the frontend's own parts: ``ModelRegistry`` (discovery
and model cards), ``Router`` fed by ``feed_router`` (KV events with tiers, snapshots, load reports), and
``Dispatcher.route`` deciding (``picker``). ``EndpointPicker.stop`` closes them in the reverse order of
their start (an ``AsyncExitStack``). gRPC health says SERVING, and ``/health`` 200, once a model can
be served and a frontend replica is known to send it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from pathlib import Path

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from nats.aio.client import Client as NATS
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dynamo_worker.epp.flow import FlowControl
from dynamo_worker.epp.frontends import Frontends
from dynamo_worker.epp.metrics import EppMetrics
from dynamo_worker.epp.picker import Picker
from dynamo_worker.epp.server import ExtProc
from dynamo_worker.epp.settings import EppSettings
from dynamo_worker.frontend.app import load_preprocessor
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.frontend.serving.quarantine import Quarantine
from dynamo_worker.protocol import InstanceRecord
from dynamo_worker.router import Router
from dynamo_worker.router.feed import feed_router
from dynamo_worker.router.policy import KvWeights
from dynamo_worker.runtime.aio import cancel_and_wait
from dynamo_worker.runtime.discovery import InstanceWatcher
from dynamo_worker.runtime.events import subscribe_load
from dynamo_worker.runtime.listening import binding, log_listening, serve
from dynamo_worker.runtime.request_plane import RequestClient
from dynamo_worker.runtime.worker import close_nats, connect_nats, redact_url

log = logging.getLogger(__name__)

__all__ = ["EndpointPicker", "run_epp"]

HEALTH_EVERY_S = 1.0


class EndpointPicker:
    def __init__(self, settings: EppSettings) -> None:
        self.settings = settings
        self.router = Router(
            settings.router_mode,
            weights=KvWeights(overlap_weight=settings.kv_overlap_weight),
            predict_ttl_s=settings.kv_predict_ttl_s,
        )
        self.metrics = EppMetrics()
        self.frontends = Frontends(settings.frontend_list(), settings.frontend_resolve_s)
        self.flow = FlowControl(
            settings.queue_depth_threshold,
            settings.kv_cache_util_threshold,
            settings.max_queued,
            settings.queue_timeout_s,
        )
        self.health = health.aio.HealthServicer()
        self.nc: NATS | None = None
        self.registry: ModelRegistry | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self._stack = contextlib.AsyncExitStack()
        self._tmp = tempfile.TemporaryDirectory(prefix="dynamo-epp-cards-")
        self.discovery: asyncio.Task[None] | None = None

    async def _load_card(self, record: InstanceRecord) -> Preprocessor:
        assert self.nc is not None
        return await load_preprocessor(self.nc, record, Path(self._tmp.name))

    async def start(self) -> EndpointPicker:
        """Start every part; a part that fails closes those started before it."""
        try:
            return await self._start()
        except BaseException:
            await self._stack.aclose()
            raise

    async def _start(self) -> EndpointPicker:
        s, stack = self.settings, self._stack
        stack.callback(self._tmp.cleanup)
        await self.frontends.resolve()
        self._background(self.frontends.run(), "resolve-frontends")
        self.nc = await connect_nats(s.nats_server, name="dynamo-epp")
        stack.push_async_callback(close_nats, self.nc)
        self.registry = ModelRegistry(self.router, self._load_card, s.namespace, s.model_load_timeout_s)
        stack.push_async_callback(self.registry.close)
        if s.router_mode == "kv":
            feed = await feed_router(
                self.nc, s.namespace, self.router, snapshot_timeout_s=s.kv_snapshot_timeout_s, requester="epp"
            )
            stack.push_async_callback(feed.close)
        load = await subscribe_load(self.nc, s.namespace, self.flow.report)
        stack.push_async_callback(load.unsubscribe)
        watcher = await InstanceWatcher(self.nc, s.namespace).start()
        stack.push_async_callback(watcher.stop)
        self.discovery = self._background(self.registry.run(watcher.events()), "discovery")
        # Dispatcher.route decides; nothing here streams to a worker, so its client never connects.
        client = RequestClient(connect_timeout_s=1.0, first_token_timeout_s=1.0, inter_token_timeout_s=1.0)
        stack.push_async_callback(client.close)
        dispatcher = Dispatcher(self.router, client, quarantine=Quarantine(self.registry.has_worker))
        picker = Picker(self.registry, dispatcher)
        extproc = ExtProc(
            picker,
            self.flow,
            self.metrics,
            self.frontends.next,
            picker.workers,
            priority=s.priority,
            retry_after_s=s.retry_after_s,
            max_body_bytes=s.max_body_bytes,
        )
        await self._serve_grpc(extproc)
        self._background(self._report_health(), "health")
        runner, self.metrics_port = await serve(
            self._metrics_app(),
            "metrics",
            s.host,
            s.metrics_port,
            what="the endpoint picker",
            flag="--metrics-port",
        )
        stack.push_async_callback(runner.cleanup)
        log.info(
            "Started endpoint picker namespace=%s router_mode=%s frontends=%s nats=%s",
            s.namespace,
            s.router_mode,
            ",".join(self.frontends.endpoints) or "none yet",
            redact_url(s.nats_server),
        )
        return self

    def _background(self, coro: object, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._stack.push_async_callback(cancel_and_wait, task)
        return task

    async def _serve_grpc(self, extproc: ExtProc) -> None:
        s = self.settings
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(extproc, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        with binding("the endpoint picker", "--grpc-port", s.host, s.grpc_port):
            port = server.add_insecure_port(f"{s.host}:{s.grpc_port}")
            if port == 0:
                raise OSError(98, "Address already in use")
        await server.start()
        self.grpc_port = port
        log_listening("grpc", "grpc", s.host, port)
        self._stack.push_async_callback(server.stop, 1.0)

    def not_ready(self) -> str | None:
        """Why a request could not be served now (no model yet, no frontend replica known), else None."""
        if self.registry is None or not any(e.can_serve() for e in self.registry.entries()):
            return "no model yet"
        if not self.frontends.endpoints:
            return "no frontend replica resolved yet (--frontends)"
        return None

    async def _report_health(self) -> None:
        """SERVING while ready (the whole server, "" , and the ext_proc service)."""
        services = ("", "envoy.service.ext_proc.v3.ExternalProcessor")
        while True:
            status = (
                health_pb2.HealthCheckResponse.NOT_SERVING
                if self.not_ready()
                else health_pb2.HealthCheckResponse.SERVING
            )
            for service in services:
                await self.health.set(service, status)
            await asyncio.sleep(HEALTH_EVERY_S)

    def _metrics_app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        async def healthz(_: web.Request) -> web.Response:
            why = self.not_ready()
            return web.json_response({"status": why or "ready"}, status=503 if why else 200)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", healthz)

        async def live(_: web.Request) -> web.Response:
            return web.json_response({"status": "live"})

        app.router.add_get("/live", live)
        return app

    async def stop(self) -> None:
        await self._stack.aclose()
        log.info("Endpoint picker stopped")


async def run_epp(settings: EppSettings, *, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop``); 0 after a clean shutdown, 1 when starting failed or
    discovery ended."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    epp = EndpointPicker(settings)
    try:
        try:
            await epp.start()
        except (OSError, TimeoutError, RuntimeError) as e:
            log.error("Endpoint picker failed to start: %s", e)
            return 1
        assert epp.discovery is not None
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({stopped, epp.discovery}, return_when=asyncio.FIRST_COMPLETED)
        code = 0 if stop.is_set() else 1
        if code:
            stopped.cancel()
            log.error("Discovery watch ended: the picker can no longer see workers; exiting to be restarted")
        await epp.stop()
        return code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
