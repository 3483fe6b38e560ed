"""The process an encode or diffusion worker runs: its endpoints on the request-plane port, ``/live``
``/health`` ``/metrics`` on the system port, and a discovery record with its role, renewed while it
lives. The same lifecycle as ``runtime.worker.Worker`` (which serves ``GenerateRequest`` streams);
these roles answer one JSON request with one JSON response instead.

A ``Service`` provides the work: ``start`` (load the model), ``handle`` (one request body -> one
response model, raising ``ServiceError`` for a refusal), ``health`` (its health payload) and ``stop``.
At most ``--max-inflight`` requests run at once; more are refused at once with 503 ``overloaded``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import nats
from aiohttp import web
from dynamo_api.errors import DynamoError
from nats.aio.client import Client as NATS
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ValidationError

from dynamo_worker.protocol import ErrorType, InstanceRecord, Role
from dynamo_worker.runtime.discovery import Registration, register
from dynamo_worker.runtime.listening import serve
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.runtime.system_server import SystemServer
from dynamo_worker.runtime.worker import connect_nats

log = logging.getLogger(__name__)

__all__ = ["Service", "ServiceError", "ServiceInfo", "ServiceWorker", "run_service"]

MAX_BODY_BYTES = 512 * 1024 * 1024  # 64 images of 8 MiB, as base64


class ServiceError(DynamoError):
    """A request the service refuses; mapped to an error body with its HTTP status."""

    def __init__(self, error_type: ErrorType, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.status = status


@dataclass(frozen=True)
class ServiceInfo:
    model_name: str


class Service(abc.ABC):
    role: Role
    path: str  # the endpoint, e.g. /v1/encode
    request_model: type[BaseModel]

    def register_metrics(self, registry: CollectorRegistry) -> None:  # noqa: B027 - optional hook
        """Add the service's own metrics to the worker's ``/metrics``."""

    @abc.abstractmethod
    async def start(self) -> ServiceInfo: ...

    @abc.abstractmethod
    async def handle(self, request: Any) -> BaseModel: ...

    def health(self) -> dict[str, Any]:
        """Extra fields of the ``/health`` payload (the role and model are always there)."""
        return {}

    async def stop(self) -> None:  # noqa: B027 - default: nothing to release
        pass


def _error(status: int, error_type: ErrorType, message: str) -> web.Response:
    return web.json_response({"error": {"type": error_type, "message": message}}, status=status)


class ServiceWorker:
    def __init__(self, service: Service, settings: RuntimeSettings) -> None:
        self.service = service
        self.settings = settings
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "dynamo_service_requests", "Requests by outcome", ["outcome"], registry=self.registry
        )
        self.duration = Histogram(
            "dynamo_service_request_seconds", "Request duration", registry=self.registry
        )
        service.register_metrics(self.registry)
        self.system = SystemServer(
            host=settings.listen_host,
            port=settings.system_port,
            registry=self.registry,
            health_check=self._health_check,
        )
        self.nc: NATS | None = None
        self.registration: Registration | None = None
        self.info: ServiceInfo | None = None
        self.port: int | None = None
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self._runner: web.AppRunner | None = None
        self._started = False

    async def start(self) -> InstanceRecord:
        s = self.settings
        self.nc = await connect_nats(s.nats_server, name=f"{s.namespace}.{s.component}.{s.instance_id}")
        if s.system_enabled:
            await self.system.start()
        self._started = True
        self.info = await self.service.start()
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(self.service.path, self._handle)
        app.router.add_get("/health", self._health)
        self._runner, self.port = await serve(
            app,
            "request-plane",
            s.listen_host,
            s.request_port,
            what="the request plane",
            flag="--request-port",
            handler_cancellation=True,
        )
        record = InstanceRecord(
            instance_id=s.instance_id,
            namespace=s.namespace,
            component=s.component,
            endpoint=s.endpoint,
            role=self.service.role,
            model=self.info.model_name,
            address=f"{s.advertise_host}:{self.port}",
            page_size=1,
            total_kv_blocks=0,
            max_running_requests=s.max_inflight,
        )
        self.registration = await register(self.nc, record, s.discovery_ttl)
        self.system.state = "ready"
        log.info(
            "Worker ready role=%s model=%s instance_id=%s address=%s system_port=%s",
            self.service.role,
            self.info.model_name,
            s.instance_id,
            record.address,
            self.system.port,
        )
        return record

    async def _health_check(self) -> None:
        self.service.health()  # raises when the service is unhealthy

    async def _health(self, _: web.Request) -> web.Response:
        status = "draining" if self.draining else "healthy"
        body = {"status": status, "role": self.service.role, "inflight": self.inflight}
        if self.info is not None:
            body["model"] = self.info.model_name
        try:
            body |= self.service.health()
        except Exception as e:  # reported, not raised: /health says why the service is unhealthy
            return web.json_response(body | {"status": "unhealthy", "reason": str(e)}, status=503)
        return web.json_response(body, status=503 if self.draining else 200)

    async def _handle(self, http_request: web.Request) -> web.Response:
        if self.draining:
            self.requests.labels("shutting_down").inc()
            return _error(503, "shutting_down", "worker is shutting down; send it elsewhere")
        if self.inflight >= self.settings.max_inflight:
            self.requests.labels("overloaded").inc()
            return _error(
                503, "overloaded", f"worker serves its maximum of {self.settings.max_inflight} requests"
            )
        self.inflight += 1
        self._idle.clear()
        started = time.monotonic()
        try:
            try:
                request = self.service.request_model.model_validate_json(await http_request.read())
            except ValidationError as e:
                self.requests.labels("invalid_request").inc()
                return _error(400, "invalid_request", f"invalid {self.service.request_model.__name__}: {e}")
            try:
                response = await self.service.handle(request)
            except ServiceError as e:
                self.requests.labels(e.error_type).inc()
                return _error(e.status, e.error_type, str(e))
            except Exception as e:  # an engine bug: this request fails with its reason, the worker lives
                log.exception("Service failed role=%s", self.service.role)
                self.requests.labels("engine_error").inc()
                return _error(500, "engine_error", f"engine failed: {e}")
            self.requests.labels("ok").inc()
            return web.Response(body=response.model_dump_json(), content_type="application/json")
        finally:
            self.inflight -= 1
            if not self.inflight:
                self._idle.set()
            self.duration.observe(time.monotonic() - started)

    async def shutdown(self) -> None:
        self.draining = True
        self.system.state = "draining"
        if self.registration is not None:
            await self.registration.deregister()
            self.registration = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.graceful_shutdown_s):
                await self._idle.wait()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._started:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10.0):
                    await self.service.stop()
        await self.system.stop()
        if self.nc is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                async with asyncio.timeout(5.0):
                    await self.nc.drain()
            self.nc = None
        log.info("Worker stopped instance_id=%s", self.settings.instance_id)


async def run_service(
    service: Service, settings: RuntimeSettings, *, stop: asyncio.Event | None = None
) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop``); 0 after a clean shutdown, 1 when starting failed."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = ServiceWorker(service, settings)
    try:
        try:
            await worker.start()
        except (OSError, TimeoutError, RuntimeError, ValueError) as e:
            log.error("Worker failed to start: %s", e)
            await worker.shutdown()
            return 1
        await stop.wait()
        log.info("Shutting down instance_id=%s", settings.instance_id)
        await worker.shutdown()
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
