"""``GET /v1/models``, ``/v1/models/{model}``, ``/health``, ``/live`` and ``/metrics``: what this
frontend serves and how it is doing, read from the model registry and the metrics registry.

``/v1/models`` lists the models served now and those kept (``models.registry``: a graph's models at 0
replicas, a model whose workers left within the retention), whose requests wait for a worker.
``/health`` is ready while it lists one: a frontend whose models scale from zero must stay in its
Service, or the requests that signal the demand never reach it; and not while a model's first
prefill/decode pairs warm up (``serving.warmup``, bounded), so that Ready means a warm pair. Each LoRA
adapter a listed model's workers hold follows as a model of its own, as SGLang lists them: ``root`` its
source, ``parent`` the model."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dynamo_worker.frontend.errors import ModelNotFound
from dynamo_worker.frontend.http.answer import error_response, json_response
from dynamo_worker.frontend.metrics import FrontendMetrics
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.output.shaping import health, listed_model, model_list
from dynamo_worker.frontend.protocol import ListedModel, Live, dump

__all__ = ["InfoEndpoints"]


class InfoEndpoints:
    def __init__(
        self,
        registry: ModelRegistry,
        metrics: FrontendMetrics,
        starting: Callable[[], list[str]] | None = None,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.starting = starting or list  # models whose first prefill/decode pairs warm up (serving.warmup)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_get("/health", self.health)
        app.router.add_get("/live", self.live)
        app.router.add_get("/metrics", self.prometheus)

    def _cards(self) -> list[ListedModel]:
        cards = [listed_model(m, self.registry.created(m)) for m in self.registry.listed()]
        for name, base, adapter in self.registry.adapter_listing():
            cards.append(listed_model(name, self.registry.created(base), root=adapter.uri, parent=base))
        return cards

    async def models(self, _: web.Request) -> web.Response:
        return json_response(dump(model_list(self._cards())))

    async def model(self, request: web.Request) -> web.Response:
        name, cards = request.match_info["model"], self._cards()
        card = next((c for c in cards if c.id == name), None)
        if card is None:
            return error_response(ModelNotFound(name, [c.id for c in cards]))
        return json_response(dump(card))

    async def health(self, _: web.Request) -> web.Response:
        registry = self.registry
        status, body = health(registry.listed(), registry.namespace, self.starting(), registry.loading())
        return json_response(dump(body), status=status)

    async def live(self, _: web.Request) -> web.Response:
        return json_response(dump(Live()))

    async def prometheus(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )
