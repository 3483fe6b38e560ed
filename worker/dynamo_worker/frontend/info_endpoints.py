"""``GET /v1/models``, ``/v1/models/{model}``, ``/health``, ``/live`` and ``/metrics``: what this
frontend serves and how it is doing, read from the model registry and the metrics registry."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dynamo_worker.frontend.errors import ModelNotFound
from dynamo_worker.frontend.httpio import error_response, json_response
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.registry import ModelRegistry
from dynamo_worker.frontend.responses import Live, ModelCard, dump
from dynamo_worker.frontend.shaping import health, model_card, model_list

__all__ = ["InfoEndpoints"]


class InfoEndpoints:
    def __init__(self, registry: ModelRegistry, metrics: FrontendMetrics) -> None:
        self.registry = registry
        self.metrics = metrics

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_get("/health", self.health)
        app.router.add_get("/live", self.live)
        app.router.add_get("/metrics", self.prometheus)

    def _card(self, name: str) -> ModelCard:
        entry = self.registry.get(name)
        return model_card(name, entry.created if entry is not None else 0)

    async def models(self, _: web.Request) -> web.Response:
        return json_response(dump(model_list([self._card(m) for m in self.registry.served()])))

    async def model(self, request: web.Request) -> web.Response:
        name, served = request.match_info["model"], self.registry.served()
        if name not in served:
            return error_response(ModelNotFound(name, served))
        return json_response(dump(self._card(name)))

    async def health(self, _: web.Request) -> web.Response:
        status, body = health(self.registry.served(), self.registry.namespace)
        return json_response(dump(body), status=status)

    async def live(self, _: web.Request) -> web.Response:
        return json_response(dump(Live()))

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )
