"""The encode role, engine-independent: decode the request's images, answer from the embedding cache
where it can, and compute the rest with the engine's ``Encoder`` (the SGLang vision tower, or the
mocker's simulation). Images of one request are encoded in one call, in order.
"""

from __future__ import annotations

import abc
import base64
import binascii
import logging
from typing import Any

from prometheus_client import CollectorRegistry

from dynamo_worker.multimodal.cache import EmbeddingCache
from dynamo_worker.multimodal.images import BadImage, ImageInfo, content_hash, sniff
from dynamo_worker.multimodal.service import Service, ServiceError, ServiceInfo
from dynamo_worker.multimodal.wire import ENCODE_PATH, EncodeRequest, EncodeResponse
from dynamo_worker.protocol import ImageEmbedding

log = logging.getLogger(__name__)

__all__ = ["EncodeService", "Encoder"]


class Encoder(abc.ABC):
    """Computes image embeddings. ``encode`` gets the files and their sniffed sizes, in order."""

    @abc.abstractmethod
    async def start(self) -> str:
        """Load the model; return the served model name the embeddings are for."""

    @abc.abstractmethod
    async def encode(self, images: list[tuple[str, bytes, ImageInfo]]) -> list[ImageEmbedding]: ...

    async def stop(self) -> None:  # noqa: B027 - default: nothing to release
        pass


class EncodeService(Service):
    role = "encode"
    path = ENCODE_PATH
    request_model = EncodeRequest

    def __init__(self, encoder: Encoder, cache_bytes: int) -> None:
        self.encoder = encoder
        self.cache_bytes = cache_bytes
        self.cache = EmbeddingCache(cache_bytes)
        self.model = ""

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.cache = EmbeddingCache(self.cache_bytes, registry)

    async def start(self) -> ServiceInfo:
        self.model = await self.encoder.start()
        return ServiceInfo(self.model)

    async def stop(self) -> None:
        await self.encoder.stop()

    def health(self) -> dict[str, Any]:
        return {"cache_entries": len(self.cache), "cache_bytes": self.cache.bytes}

    async def handle(self, request: EncodeRequest) -> EncodeResponse:
        if request.model != self.model:
            raise ServiceError(
                "invalid_request", f"this encode worker serves '{self.model}', not '{request.model}'"
            )
        found: list[ImageEmbedding | None] = []
        todo: list[tuple[str, bytes, ImageInfo]] = []
        for i, image in enumerate(request.images):
            hit = self.cache.get(image.content_hash)
            found.append(hit)
            if hit is not None:
                continue
            try:
                data = base64.b64decode(image.data, validate=True)
            except binascii.Error:
                raise ServiceError("invalid_request", f"images[{i}].data is not base64") from None
            if content_hash(data) != image.content_hash:
                raise ServiceError(
                    "invalid_request", f"images[{i}].content_hash is not the sha256 of its data"
                )
            try:
                todo.append((image.content_hash, data, sniff(data)))
            except BadImage as e:
                raise ServiceError("invalid_request", f"images[{i}]: {e}") from None
        computed = iter(await self.encoder.encode(todo) if todo else [])
        embeddings: list[ImageEmbedding] = []
        for hit in found:
            if hit is None:
                hit = next(computed)
                self.cache.put(hit)
            embeddings.append(hit)
        log.debug("Encoded request_id=%s images=%d computed=%d", request.request_id, len(found), len(todo))
        return EncodeResponse(embeddings=embeddings, cached=[f is not None for f in found])
