"""``python -m dynamo_worker.sglang --role encode``: image embeddings for the language workers of a
vision-language model, computed with the model's own vision tower as HF transformers implements it.

Why the HF vision tower and not SGLang's ``--encoder-only`` mode: SGLang's encode server
(``srt/disaggregation/encode_server.py``) is an HTTP server of its own that pushes embeddings to the
language engine it was paired with (``--language-only`` with ``--encoder-transfer-backend``), keyed by
its request ids; it has no cache by image content and no way to answer a frontend that places the
embeddings itself. Our encode role must answer ``POST /v1/encode`` with ``ImageEmbedding``s (the frontend
puts them in the prompt and any language worker of the model takes them), so it needs the embeddings
in hand: the vision tower of the model folder through ``get_image_features`` (what NVIDIA Dynamo's
SGLang encode worker does too), fed by the model's HF image processor (``pixel_values`` and
``image_grid_thw``, the same processor SGLang's own server runs). The language model's layers are
dropped after loading; only the vision tower and its projector stay on the GPU.

Every image of one request is processed in one batch; the rows of the vision tower's output are split
per image by ``grid_thw`` (``t * h * w / spatial_merge_size**2`` tokens each). Embeddings go out in the
model's dtype, as base64 of their bytes (``protocol.ImageEmbedding``). The cache by content hash is
``multimodal.encode.EncodeService``'s; this module only computes.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import sys
from collections.abc import Sequence
from typing import Any

from dynamo_api.settings_sources import Settings
from pydantic import Field

from dynamo_worker.multimodal.encode import Encoder, EncodeService
from dynamo_worker.multimodal.images import ImageInfo
from dynamo_worker.multimodal.service import ServiceError, run_service
from dynamo_worker.multimodal.settings import MultimodalSettings
from dynamo_worker.protocol import ImageEmbedding
from dynamo_worker.runtime.settings import (
    RuntimeSettings,
    SettingsError,
    add_model_arguments,
    configure_logging,
    settings_from_args,
)

log = logging.getLogger(__name__)

__all__ = ["EncodeSettings", "HfVisionEncoder", "main"]

DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}


class EncodeSettings(Settings):
    model_path: str = Field(description="The vision-language model folder (or hub id) to encode for.")
    served_model_name: str | None = Field(
        None, description="The model name the language workers serve (default: --model-path)."
    )
    trust_remote_code: bool = Field(False, description="Allow the model folder's own code (HF).")
    encoder_device: str = Field("cuda", description="Torch device of the vision tower.")


def _parser() -> Any:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.sglang --role encode",
        description="Compute image embeddings for the language workers of a vision-language model. "
        "Other SGLang flags are accepted and ignored.",
        allow_abbrev=False,
    )
    RuntimeSettings.add_arguments(parser)
    add_model_arguments(parser, MultimodalSettings, "multimodal")
    add_model_arguments(parser, EncodeSettings, "encoder")
    return parser


def parse(argv: Sequence[str]) -> tuple[RuntimeSettings, MultimodalSettings, EncodeSettings, list[str]]:
    args, unknown = _parser().parse_known_args(list(argv))
    # settings_from_args takes the flags of its own model's fields from the namespace
    runtime = RuntimeSettings.from_args(args)
    multimodal = settings_from_args(MultimodalSettings, args, {})
    encode = settings_from_args(EncodeSettings, args, {})
    return runtime, multimodal, encode, unknown


class HfVisionEncoder(Encoder):
    def __init__(self, settings: EncodeSettings) -> None:
        self.settings = settings
        self.model_name = settings.served_model_name or settings.model_path
        self._model: Any = None
        self._processor: Any = None
        self._merge = 1
        self._lock = asyncio.Lock()  # one batch on the GPU at a time

    async def start(self) -> str:
        await asyncio.to_thread(self._load)
        return self.model_name

    def _load(self) -> None:
        import torch
        from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText

        s = self.settings
        config = AutoConfig.from_pretrained(s.model_path, trust_remote_code=s.trust_remote_code)
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.bfloat16
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model = AutoModelForImageTextToText.from_pretrained(
            s.model_path, dtype=dtype, trust_remote_code=s.trust_remote_code
        )
        inner = getattr(model, "model", model)
        for name in ("language_model", "lm_head"):  # only the vision side is used
            for owner in (inner, model):
                if isinstance(getattr(owner, name, None), torch.nn.Module):
                    setattr(owner, name, torch.nn.Identity())
        self._model = model.to(s.encoder_device).eval()
        # the fast (torchvision) processor where it exists, as SGLang's own server loads it
        self._processor = AutoImageProcessor.from_pretrained(
            s.model_path, trust_remote_code=s.trust_remote_code, use_fast=True
        )
        vision = getattr(config, "vision_config", None)
        self._merge = int(getattr(vision, "spatial_merge_size", 1) or 1)
        log.info("Loaded the vision tower model=%s dtype=%s device=%s", s.model_path, dtype, s.encoder_device)

    async def encode(self, images: list[tuple[str, bytes, ImageInfo]]) -> list[ImageEmbedding]:
        async with self._lock:
            return await asyncio.to_thread(self._encode, images)

    def _encode(self, images: list[tuple[str, bytes, ImageInfo]]) -> list[ImageEmbedding]:
        import torch
        from PIL import Image, UnidentifiedImageError

        pictures = []
        for i, (_, data, _) in enumerate(images):
            try:
                pictures.append(Image.open(io.BytesIO(data)).convert("RGB"))
            except (UnidentifiedImageError, OSError) as e:
                raise ServiceError("invalid_request", f"images[{i}] cannot be decoded: {e}") from None
        batch = self._processor(images=pictures, return_tensors="pt")
        device = self.settings.encoder_device
        grids = batch.get("image_grid_thw")
        with torch.inference_mode():
            kwargs = {"pixel_values": batch["pixel_values"].to(device)}
            if grids is not None:
                kwargs["image_grid_thw"] = grids.to(device)
            out = self._model.get_image_features(**kwargs)
        parts = getattr(out, "pooler_output", out)
        if isinstance(parts, torch.Tensor):
            sizes = (
                (grids.prod(-1) // self._merge**2).tolist()
                if grids is not None
                else [parts.shape[0] // len(images)] * len(images)
            )
            parts = parts.reshape(-1, parts.shape[-1]).split(sizes)
        result = []
        for i, ((digest, _, info), emb) in enumerate(zip(images, parts, strict=True)):
            emb = emb.reshape(-1, emb.shape[-1]).contiguous().cpu()
            grid = tuple(int(x) for x in grids[i].tolist()) if grids is not None else None
            result.append(
                ImageEmbedding(
                    content_hash=digest,
                    num_tokens=emb.shape[0],
                    hidden_size=emb.shape[1],
                    dtype=DTYPES[str(emb.dtype)],
                    grid_thw=grid,
                    width=info.width,
                    height=info.height,
                    data=base64.b64encode(emb.view(torch.uint8).numpy().tobytes()).decode(),
                )
            )
        return result


def main(argv: Sequence[str]) -> int:
    try:
        runtime, multimodal, settings, unknown = parse(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging()
    if unknown:
        log.info("Ignored flags the encode role does not use: %s", " ".join(unknown))
    service = EncodeService(HfVisionEncoder(settings), multimodal.embedding_cache_bytes)
    return asyncio.run(run_service(service, runtime))
