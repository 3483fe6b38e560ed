"""``POST /v1/images/generations``: OpenAI's image generation, served by diffusion workers.

The body is OpenAI's (``model``, ``prompt``, ``n`` 1-10, ``size`` ``WxH`` or ``auto``, ``response_format``
``url`` or ``b64_json``; ``quality``, ``style`` and ``user`` are accepted) plus ``seed`` and
``num_inference_steps`` as extensions. A diffusion worker of the model (round-robin, one retry on
another when one cannot be reached) generates the images and stores them under its
``--media-output-fs-url``; the answer is ``{"created", "data": [{"url"} | {"b64_json"}]}``.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Annotated, Literal

import aiohttp
from pydantic import Field, ValidationError, field_validator

from dynamo_worker.frontend.errors import (
    InvalidRequest,
    ModelNotFound,
    ServiceUnavailable,
    UpstreamError,
)
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.protocol import GeneratedImages, ImageData, _RequestBody, parse_request
from dynamo_worker.frontend.requests.chat_images import Unreachable, post_to_worker
from dynamo_worker.multimodal.wire import (
    IMAGES_PATH,
    MAX_GENERATED_IMAGES,
    GenerateImagesRequest,
    GenerateImagesResponse,
)

__all__ = ["ImageGenerationRequest", "ImagesApi"]

DEFAULT_SIZE = (1024, 1024)


class ImageGenerationRequest(_RequestBody):
    model: Annotated[str, Field(min_length=1, max_length=512)]
    prompt: Annotated[str, Field(min_length=1, max_length=32000)]
    n: Annotated[int, Field(ge=1, le=MAX_GENERATED_IMAGES)] = 1
    size: str | None = None
    response_format: Literal["url", "b64_json"] | None = None
    quality: str | None = None
    style: str | None = None
    user: str | None = None
    seed: int | None = None
    num_inference_steps: Annotated[int, Field(ge=1, le=1000)] | None = None

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v in (None, "auto"):
            return v
        w, sep, h = v.partition("x")
        if not (sep and w.isdigit() and h.isdigit() and 64 <= int(w) <= 4096 and 64 <= int(h) <= 4096):
            raise ValueError(
                "size must be 'auto' or WIDTHxHEIGHT with each side from 64 to 4096, e.g. '1024x1024'"
            )
        return v

    def dimensions(self) -> tuple[int, int]:
        if self.size in (None, "auto"):
            return DEFAULT_SIZE
        w, _, h = self.size.partition("x")
        return int(w), int(h)


class ImagesApi:
    def __init__(self, registry: ModelRegistry, *, connect_timeout_s: float, timeout_s: float) -> None:
        self.registry = registry
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._turn = itertools.count()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def generate(self, body: bytes) -> GeneratedImages:
        req = parse_request(ImageGenerationRequest, body)
        entry = self.registry.get(req.model)
        if entry is None:
            raise ModelNotFound(req.model, self.registry.listed())
        workers = entry.by_role("diffusion")
        if not workers:
            if entry.workers and not entry.generates_images():
                raise InvalidRequest(
                    f"Model '{req.model}' is a language model and generates no images; send its requests to "
                    "/v1/chat/completions or /v1/completions.",
                    param="model",
                    code="wrong_endpoint",
                )
            raise ServiceUnavailable(
                f"No diffusion worker serves model '{req.model}' right now; retry when one has registered.",
                code="no_workers",
            )
        width, height = req.dimensions()
        request = GenerateImagesRequest(
            request_id=uuid.uuid4().hex,
            model=req.model,
            prompt=req.prompt,
            n=req.n,
            width=width,
            height=height,
            response_format=req.response_format or "url",
            seed=req.seed,
            num_inference_steps=req.num_inference_steps,
        )
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        start, failure = next(self._turn), None
        for attempt in range(min(2, len(workers))):
            worker = workers[(start + attempt) % len(workers)]
            try:
                payload = await post_to_worker(
                    self._session,
                    worker,
                    IMAGES_PATH,
                    request.model_dump_json(),
                    role="diffusion",
                    connect_timeout_s=self.connect_timeout_s,
                    timeout_s=self.timeout_s,
                )
                break
            except Unreachable as e:
                failure = e.error
        else:
            assert failure is not None
            raise failure
        try:
            answer = GenerateImagesResponse.model_validate_json(payload)
        except ValidationError as e:
            raise UpstreamError(f"The diffusion worker at {worker.address} answered nonsense: {e}") from None
        if len(answer.images) != req.n:
            raise UpstreamError(f"The diffusion worker made {len(answer.images)} images, not {req.n}.")
        data = [ImageData(url=img.url, b64_json=img.b64_json) for img in answer.images]
        return GeneratedImages(created=answer.created, data=data)
