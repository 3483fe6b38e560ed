"""Flags of the multimodal roles, shared by ``python -m dynamo_worker.sglang`` and the mocker:
``--role`` picks what the process serves; the rest apply to the encode or diffusion role."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MultimodalSettings"]


class MultimodalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["language", "encode", "diffusion"] = Field(
        "language",
        description="language: serve token generation (agg, prefill or decode by --disaggregation-mode); "
        "encode: compute image embeddings for the language workers of --served-model-name; "
        "diffusion: generate images (POST /v1/images/generations on the frontend).",
    )
    embedding_cache_mb: float = Field(
        1024.0, ge=0, description="encode: memory for cached image embeddings (LRU, by content hash)."
    )
    media_output_fs_url: str = Field(
        "file:///tmp/dynamo-images", description="diffusion: file:// URL of the folder images are written to."
    )
    media_output_http_url: str | None = Field(
        None, description="diffusion: public base URL of that folder, used in responses instead of file://."
    )

    @property
    def embedding_cache_bytes(self) -> int:
        return int(self.embedding_cache_mb * 1024 * 1024)
