"""Flags of the multimodal roles, shared by ``python -m dynamo_worker.sglang`` and the mocker:
``--role`` picks what the process serves; the rest apply to the encode or diffusion role."""

from __future__ import annotations

from typing import Literal

from dynamo_api.settings_sources import Settings
from pydantic import Field, model_validator

__all__ = ["MultimodalSettings"]


class MultimodalSettings(Settings):
    role: Literal["language", "encode", "diffusion"] = Field(
        "language",
        description="language: serve token generation (agg, prefill or decode by --disaggregation-mode); "
        "encode: compute image embeddings for the language workers of --served-model-name; "
        "diffusion: generate images (POST /v1/images/generations on the frontend).",
    )
    # NVIDIA Dynamo's spellings of --role, so manifests written for its SGLang backend run unchanged.
    multimodal_encode_worker: bool = Field(
        False, description="The same as --role encode (NVIDIA Dynamo's flag)."
    )
    image_diffusion_worker: bool = Field(
        False, description="The same as --role diffusion (NVIDIA Dynamo's flag)."
    )
    multimodal_worker: bool = Field(
        False, description="Accepted (NVIDIA Dynamo's flag): a language worker takes images anyway."
    )
    embedding_worker: bool = Field(
        False,
        description="Serve embeddings, the same as SGLang's --is-embedding (NVIDIA Dynamo's flag). Without "
        "either, a model whose sentence-transformers modules pool its output is served as one.",
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

    @model_validator(mode="after")
    def _one_role(self) -> MultimodalSettings:
        asked = {self.role} - {"language"}
        asked |= {"encode"} if self.multimodal_encode_worker else set()
        asked |= {"diffusion"} if self.image_diffusion_worker else set()
        if len(asked) > 1:
            raise ValueError(f"one role per worker: the flags ask for {' and '.join(sorted(asked))}")
        return self

    @property
    def worker_role(self) -> Literal["language", "encode", "diffusion"]:
        if self.multimodal_encode_worker:
            return "encode"
        if self.image_diffusion_worker:
            return "diffusion"
        return self.role

    @property
    def embedding_cache_bytes(self) -> int:
        return int(self.embedding_cache_mb * 1024 * 1024)
