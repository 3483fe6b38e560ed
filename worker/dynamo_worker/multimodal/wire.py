"""Wire models of the encode and image-generation endpoints (request plane, JSON over HTTP/1.1).

``POST http://<encode worker>/v1/encode`` with an ``EncodeRequest`` answers ``200`` with an
``EncodeResponse`` (one embedding per image, in order). ``POST http://<diffusion worker>/v1/images``
with a ``GenerateImagesRequest`` answers ``200`` with a ``GenerateImagesResponse``. A refusal is a
non-200 status with ``{"error": {"type": ..., "message": ...}}`` (``protocol.WorkerError``): 400
``invalid_request`` (the caller's fault, e.g. an image the encoder cannot decode), 503 ``overloaded``
or ``shutting_down``, 500 ``engine_error``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from dynamo_worker.protocol import ImageEmbedding

__all__ = [
    "ENCODE_PATH",
    "IMAGES_PATH",
    "EncodeRequest",
    "EncodeResponse",
    "GenerateImagesRequest",
    "GenerateImagesResponse",
    "GeneratedImage",
    "ImageInput",
]

ENCODE_PATH = "/v1/encode"
IMAGES_PATH = "/v1/images"
MAX_IMAGES_PER_REQUEST = 64
MAX_GENERATED_IMAGES = 10  # OpenAI's bound on n


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageInput(_Wire):
    content_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # sha256 of the file's bytes
    data: str  # base64 of the image file (PNG, JPEG, GIF or WebP)


class EncodeRequest(_Wire):
    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    model: str
    images: Annotated[list[ImageInput], Field(min_length=1, max_length=MAX_IMAGES_PER_REQUEST)]


class EncodeResponse(_Wire):
    embeddings: list[ImageEmbedding]
    cached: list[bool]  # per image: its embedding came from the cache


class GenerateImagesRequest(_Wire):
    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    model: str
    prompt: Annotated[str, Field(min_length=1)]
    n: Annotated[int, Field(ge=1, le=MAX_GENERATED_IMAGES)] = 1
    width: Annotated[int, Field(ge=64, le=4096)] = 1024
    height: Annotated[int, Field(ge=64, le=4096)] = 1024
    response_format: Literal["url", "b64_json"] = "url"
    seed: int | None = None
    num_inference_steps: Annotated[int, Field(ge=1, le=1000)] | None = None


class GeneratedImage(_Wire):
    url: str | None = None  # where the worker stored it (response_format "url")
    b64_json: str | None = None  # the PNG itself (response_format "b64_json")


class GenerateImagesResponse(_Wire):
    created: int
    images: list[GeneratedImage]
