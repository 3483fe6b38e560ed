"""The decision for one request: parse its OpenAI body, tokenize it with its model's card, and pick its
worker(s) with the frontend's own router and dispatcher.

The job is the one the frontend builds (``requests.chat.prepare_chat``, ``prepare_completion``,
``prepare_embeddings``), so the token ids, and so the KV block hashes, are the frontend's; the route is
``Dispatcher.route`` (serving mode, the newest revision's prefill/decode pair as one decision,
quarantine, LoRA residency), never a second copy of it.

A decision starts its request's flights on the router (``Router.started``, as the frontend's dispatch
does), so that the picker counts its own requests on each worker at once, between two load reports;
``Decision.done`` ends them (idempotent), ``Decision.first_token`` moves them on to decoding. The
stream (``server``) calls ``done`` when the request ends: Envoy keeps the ext_proc stream open until
the response ends while it is to send response trailers (``response_trailer_mode: SEND``,
docs/gateway-api-envoy.yaml). The picker never sees the first token unless the response headers are
sent to it too, so with our configuration a request's new blocks count as queued prefill on its worker
until it ends.

A path that is not a generation endpoint (``/v1/models``, ``/health``...), and a chat request with
images (the frontend's multimodal processor places them), go to a frontend unpinned: it routes them
itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dynamo_worker.epp.flow import Workers
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from dynamo_worker.frontend.requests.chat import image_urls, prepare_chat
from dynamo_worker.frontend.requests.completions import prepare_completion
from dynamo_worker.frontend.requests.embeddings import EmbeddingRequest, prepare_embeddings
from dynamo_worker.frontend.requests.job import Job
from dynamo_worker.frontend.serving.dispatch import Dispatcher
from dynamo_worker.router import Flight

__all__ = ["ENDPOINTS", "Decision", "Parsed", "Picker", "parse"]

Request = ChatCompletionRequest | CompletionRequest | EmbeddingRequest

ENDPOINTS: dict[str, type[Request]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
}


@dataclass(frozen=True)
class Parsed:
    """A generation request's body, validated as the frontend validates it."""

    request: Request

    @property
    def model(self) -> str:
        return self.request.model


@dataclass
class Decision:
    """Where one request goes: its worker (aggregated or decode) and its prefill worker (disaggregated),
    both None when the frontend routes it itself."""

    model: str | None = None
    worker: str | None = None
    prefill: str | None = None
    flights: tuple[Flight, ...] = ()  # the request's share of its workers' load, until ``done``

    def first_token(self) -> None:
        for flight in self.flights:
            flight.first_token()

    def done(self) -> None:
        """The request ended (answered, refused, cancelled): its workers' load drops (idempotent)."""
        for flight in self.flights:
            flight.done()

    def roles(self) -> dict[str, str]:
        """The named workers by their role in the request."""
        if self.prefill is not None and self.worker is not None:
            return {"prefill": self.prefill, "decode": self.worker}
        return {"agg": self.worker} if self.worker is not None else {}


def parse(path: str, body: bytes) -> Parsed | None:
    """The request of a generation endpoint (``InvalidRequest``, a 400, for a body that is not one), or
    None for any other path."""
    model = ENDPOINTS.get(path.split("?", 1)[0].rstrip("/") or "/")
    if model is None:
        return None
    return Parsed(parse_request(model, body))


class Picker:
    def __init__(self, registry: ModelRegistry, dispatcher: Dispatcher) -> None:
        self.registry = registry
        self.dispatcher = dispatcher
        self._prepare: dict[type[Request], Callable[[Any], Awaitable[Job]]] = {
            ChatCompletionRequest: lambda r: prepare_chat(registry, None, r),
            CompletionRequest: lambda r: prepare_completion(registry, r),
            EmbeddingRequest: lambda r: prepare_embeddings(registry, r),
        }

    async def pick(self, parsed: Parsed) -> Decision:
        """The decision for ``parsed``, its flights started (the caller ends them: ``Decision.done``);
        raises ``ApiError`` as the frontend would answer it (unknown model 404, a prompt too long 400,
        no worker that can serve 503)."""
        req = parsed.request
        if isinstance(req, ChatCompletionRequest) and image_urls(req):
            return Decision(model=req.model)
        job = await self._prepare[type(req)](req)
        route = self.dispatcher.route(job.entry, job.prompt_ids)
        router = self.dispatcher.router
        if route.decode is None:
            return Decision(job.model, route.first.worker.instance_id, None, (router.started(route.first),))
        flights = (router.started(route.first, "prefill"), router.started(route.decode, "decode"))
        return Decision(job.model, route.decode.worker.instance_id, route.first.worker.instance_id, flights)

    def workers(self, model: str) -> Workers:
        """The workers that compute ``model``'s prompts now (aggregated and prefill), for flow control."""

        def now() -> list[str]:
            entry = self.registry.get(model)
            if entry is None:
                return []
            return [w.instance_id for role in ("agg", "prefill") for w in entry.by_role(role)]

        return now
