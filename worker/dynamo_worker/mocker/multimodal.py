"""The mocker's encode and diffusion engines: simulated timing, deterministic output, no GPU.

Encoding an image of W x H pixels gives the patch grid of a Qwen2-VL-like vision tower (14-pixel
patches merged 2 x 2, scaled down to at most ``--mm-max-image-tokens`` tokens): ``num_tokens`` rows of
``--mm-hidden-size`` float16 values derived from the image's content hash, so equal images give equal
embeddings. It takes ``--encode-base-ms`` plus ``--encode-per-token-us`` per token. Diffusion makes
``n`` PNGs whose colours derive from the prompt, seed and index, taking ``--diffusion-step-ms`` per
inference step per image. Every duration is divided by ``--speedup``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import struct

from dynamo_worker.multimodal.diffusion import ImageGenerator
from dynamo_worker.multimodal.encode import Encoder
from dynamo_worker.multimodal.images import ImageInfo, write_png
from dynamo_worker.multimodal.wire import GenerateImagesRequest
from dynamo_worker.protocol import ImageEmbedding

__all__ = ["MockEncoder", "MockImageGenerator", "image_grid"]

PATCH = 14
MERGE = 2


def image_grid(width: int, height: int, max_tokens: int) -> tuple[int, int]:
    """(rows, columns) of merged patches for an image, at most ``max_tokens`` of them."""
    rows, cols = math.ceil(height / (PATCH * MERGE)), math.ceil(width / (PATCH * MERGE))
    if rows * cols > max_tokens:
        scale = math.sqrt(max_tokens / (rows * cols))
        rows, cols = max(1, math.floor(rows * scale)), max(1, math.floor(cols * scale))
    return rows, cols


class MockEncoder(Encoder):
    def __init__(
        self,
        model: str,
        *,
        hidden_size: int,
        max_tokens: int,
        base_ms: float,
        per_token_us: float,
        speedup: float,
    ) -> None:
        self.model = model
        self.hidden_size = hidden_size
        self.max_tokens = max_tokens
        self.base_ms = base_ms
        self.per_token_us = per_token_us
        self.speedup = speedup
        self.encoded = 0

    async def start(self) -> str:
        return self.model

    def _embed(self, content_hash: str, info: ImageInfo) -> ImageEmbedding:
        rows, cols = image_grid(info.width, info.height, self.max_tokens)
        count = rows * cols * self.hidden_size
        raw = hashlib.shake_256(bytes.fromhex(content_hash)).digest(count)
        values = struct.pack(f"<{count}e", *((b - 128) / 128 for b in raw))
        return ImageEmbedding(
            content_hash=content_hash,
            num_tokens=rows * cols,
            hidden_size=self.hidden_size,
            dtype="float16",
            grid_thw=(1, rows * MERGE, cols * MERGE),
            width=info.width,
            height=info.height,
            data=base64.b64encode(values).decode(),
        )

    async def encode(self, images: list[tuple[str, bytes, ImageInfo]]) -> list[ImageEmbedding]:
        out = [self._embed(h, info) for h, _, info in images]
        tokens = sum(e.num_tokens for e in out)
        await asyncio.sleep((self.base_ms / 1e3 + tokens * self.per_token_us / 1e6) / self.speedup)
        self.encoded += len(out)
        return out


class MockImageGenerator(ImageGenerator):
    def __init__(self, model: str, *, step_ms: float, default_steps: int, speedup: float) -> None:
        self.model = model
        self.step_ms = step_ms
        self.default_steps = default_steps
        self.speedup = speedup

    async def start(self) -> str:
        return self.model

    def _png(self, request: GenerateImagesRequest, index: int) -> bytes:
        seed = hashlib.blake2b(f"{request.prompt}\0{request.seed}\0{index}".encode(), digest_size=6).digest()
        w, h = request.width, request.height
        rows = [bytes((seed[0], (seed[1] + 255 * y // h) % 256, seed[2])) * w for y in range(h)]
        return write_png(w, h, b"".join(rows))

    async def generate(self, request: GenerateImagesRequest) -> list[bytes]:
        steps = request.num_inference_steps or self.default_steps
        await asyncio.sleep(steps * request.n * self.step_ms / 1e3 / self.speedup)
        return [await asyncio.to_thread(self._png, request, i) for i in range(request.n)]
