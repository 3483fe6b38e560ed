"""The image-diffusion role, engine-independent: generate ``n`` PNGs for a prompt with the engine's
``ImageGenerator`` (SGLang's diffusion generator, or the mocker's simulation), store each under the
configured file-system URL (``--media-output-fs-url file:///path``), and answer with their URLs
(under ``--media-output-http-url`` when set, else the ``file://`` URL) or the PNGs as base64.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import logging
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dynamo_worker.multimodal.service import Service, ServiceError, ServiceInfo
from dynamo_worker.multimodal.wire import (
    IMAGES_PATH,
    GeneratedImage,
    GenerateImagesRequest,
    GenerateImagesResponse,
)

log = logging.getLogger(__name__)

__all__ = ["DiffusionService", "ImageGenerator", "storage_dir"]


class ImageGenerator(abc.ABC):
    @abc.abstractmethod
    async def start(self) -> str:
        """Load the pipeline; return the served model name."""

    @abc.abstractmethod
    async def generate(self, request: GenerateImagesRequest) -> list[bytes]:
        """``request.n`` PNG files of ``request.width`` x ``request.height``."""

    async def stop(self) -> None:  # noqa: B027 - default: nothing to release
        pass


def storage_dir(fs_url: str) -> Path:
    """The folder a ``file://`` URL names; anything else is refused with the fix."""
    parsed = urlparse(fs_url)
    if parsed.scheme != "file" or not parsed.path.startswith("/") or parsed.netloc not in ("", "localhost"):
        raise ValueError(
            f"--media-output-fs-url must be a file:// URL of an absolute folder (got '{fs_url}'), "
            "e.g. file:///var/lib/dynamo/images"
        )
    return Path(parsed.path)


class DiffusionService(Service):
    role = "diffusion"
    path = IMAGES_PATH
    request_model = GenerateImagesRequest

    def __init__(self, generator: ImageGenerator, fs_url: str, http_url: str | None = None) -> None:
        self.generator = generator
        self.folder = storage_dir(fs_url)
        self.http_url = http_url.rstrip("/") if http_url else None
        self.model = ""
        self.generated = 0
        self.last_error: str | None = None

    async def start(self) -> ServiceInfo:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.model = await self.generator.start()
        return ServiceInfo(self.model)

    async def stop(self) -> None:
        await self.generator.stop()

    def health(self) -> dict[str, Any]:
        if not self.folder.is_dir():
            raise RuntimeError(f"the image folder {self.folder} is gone")
        return {"images_generated": self.generated, "media_output": self.folder.as_uri()}

    async def handle(self, request: GenerateImagesRequest) -> GenerateImagesResponse:
        if request.model != self.model:
            raise ServiceError(
                "invalid_request", f"this diffusion worker serves '{self.model}', not '{request.model}'"
            )
        pngs = await self.generator.generate(request)
        if len(pngs) != request.n:
            raise ServiceError("engine_error", f"the generator made {len(pngs)} images, not {request.n}", 500)
        images = []
        for png in pngs:
            if request.response_format == "b64_json":
                images.append(GeneratedImage(b64_json=base64.b64encode(png).decode()))
                continue
            name = f"{uuid.uuid4().hex}.png"
            await asyncio.to_thread((self.folder / name).write_bytes, png)
            url = f"{self.http_url}/{name}" if self.http_url else (self.folder / name).as_uri()
            images.append(GeneratedImage(url=url))
        self.generated += len(pngs)
        return GenerateImagesResponse(created=int(time.time()), images=images)
