"""Images on the SGLang language worker: a ``GenerateRequest`` with image spans -> the ``input_ids`` and
the one ``image_data`` item SGLang's ``async_generate`` takes for precomputed embeddings.

The frontend puts ``num_tokens`` pad ids (``protocol.image_pad_id(content_hash)``) where each image goes;
SGLang wants the model's own tokens there: its image token id repeated ``num_tokens`` times, between the
vision start and end tokens for models that have them (Qwen2-VL: ``<|vision_start|>`` ``<|image_pad|>``
x N ``<|vision_end|>``, the layout its processor makes from the chat template and the one its M-RoPE
position code looks for: an image starts at the token after a vision start token). The start and end
tokens are added unless the prompt already has them around the span, so the prompt SGLang sees equals
the one its own server makes from the same chat message.

SGLang 0.5.17 takes one preprocessed item per modality per request (``validate_mm_data``), so every
image's embeddings go into one item, concatenated in prompt order, with one ``image_grid_thw`` row per
image (its M-RoPE positions and the split into images come from those rows). The item's format is
``processor_output`` with the embeddings under ``precomputed_embeddings``: SGLang 0.5.17..0.5.23 put a
``precomputed_embedding`` item's tensor in ``feature``, the vision tower's *input*, so the model would
run its vision tower on the embeddings; ``processor_output`` sets ``precomputed_embeddings`` itself and
the model skips its vision tower for them.

This module is pure (no torch): ``image_item`` gets the tensor builder from the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dynamo_worker.protocol import GenerateRequest, ImageEmbedding, image_pad_id

__all__ = ["ImageTokens", "image_item", "image_prompt", "image_tokens"]


@dataclass(frozen=True)
class ImageTokens:
    """The model's image token id, and its vision start and end token ids where it has them."""

    image: int
    start: int | None = None
    end: int | None = None
    needs_grid: bool = False  # positions depend on the patch grid (M-RoPE): every image needs grid_thw


def image_tokens(hf_config: Any) -> ImageTokens | None:
    """The image tokens of a model's HF config (``image_token_id`` or ``image_token_index``, and Qwen-VL's
    ``vision_start_token_id`` / ``vision_end_token_id``); None for a model that takes no images."""
    image = getattr(hf_config, "image_token_id", None)
    if image is None:
        image = getattr(hf_config, "image_token_index", None)
    if not isinstance(image, int):
        return None
    start = getattr(hf_config, "vision_start_token_id", None)
    end = getattr(hf_config, "vision_end_token_id", None)
    rope = getattr(hf_config, "rope_scaling", None) or getattr(hf_config, "rope_parameters", None) or {}
    mrope = isinstance(rope, dict) and ("mrope_section" in rope or rope.get("type") == "mrope")
    return ImageTokens(
        image=image,
        start=start if isinstance(start, int) else None,
        end=end if isinstance(end, int) else None,
        needs_grid=mrope or isinstance(start, int),
    )


def image_prompt(req: GenerateRequest, tokens: ImageTokens) -> tuple[list[int], list[ImageEmbedding]]:
    """SGLang's ``input_ids`` for ``req`` (pad ids replaced by the model's image tokens, vision start
    and end added where missing) and the images' embeddings in prompt order. ``ValueError`` names what
    is wrong with a request this model cannot take."""
    ids = req.token_ids
    out: list[int] = []
    pos = 0
    shape: tuple[int, str] | None = None
    for i, span in enumerate(req.images):
        emb = span.embedding
        pad = image_pad_id(emb.content_hash)
        if any(t != pad for t in ids[span.offset : span.offset + emb.num_tokens]):
            raise ValueError(f"images[{i}]: token_ids at its span are not its pad id {pad}")
        if tokens.needs_grid and emb.grid_thw is None:
            raise ValueError(
                f"images[{i}] has no grid_thw; this model's positions need the patch grid: "
                "serve it with an encode worker of this model (python -m dynamo_worker.sglang --role encode)"
            )
        if shape is not None and shape != (emb.hidden_size, emb.dtype):
            raise ValueError(f"images[{i}] has embeddings of another size or dtype than images[0]")
        shape = (emb.hidden_size, emb.dtype)
        out += ids[pos : span.offset]
        if tokens.start is not None and (not out or out[-1] != tokens.start):
            out.append(tokens.start)
        out += [tokens.image] * emb.num_tokens
        pos = span.offset + emb.num_tokens
        if tokens.end is not None and (pos >= len(ids) or ids[pos] != tokens.end):
            out.append(tokens.end)
    out += ids[pos:]
    return out, [span.embedding for span in req.images]


def image_item(
    embeddings: Sequence[ImageEmbedding],
    tensors: Callable[[Sequence[ImageEmbedding]], tuple[Any, Any]],
) -> dict[str, Any]:
    """The one ``image_data`` item for ``embeddings``; ``tensors`` makes (the concatenated embeddings,
    one ``grid_thw`` row per image or None) as the engine's tensors."""
    features, grids = tensors(embeddings)
    item: dict[str, Any] = {"format": "processor_output", "precomputed_embeddings": features}
    if grids is not None:
        item["image_grid_thw"] = grids
    return item
