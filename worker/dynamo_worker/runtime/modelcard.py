"""Model cards: what a frontend needs to serve a model, published by workers to a JetStream object store.

A worker reads its model folder and publishes, to the object store ``dynamo-model-cards``:

- ``<checksum>/<file>`` for each of ``tokenizer.json``, ``tokenizer_config.json`` (it holds the chat
  template), ``generation_config.json``, ``config.json`` that exists (plus ``chat_template.jinja``);
- ``<checksum>/card.json``: the ``ModelCard`` (served name, context length, page size, eos ids, what
  the model serves (``ServingFeatures``: generation or embeddings, tool-call and reasoning parsers,
  grammar backend), and the sha256 of every file), written last, so a card that exists is complete.

``checksum`` is the sha256 of the card's content, so equal models share one entry and workers of the
same model publish once. ``InstanceRecord.model_card_checksum`` points at it; the frontend calls
``fetch_model_card`` and gets a local folder it can load tokenizers from (no model volume, no hub).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import nats.js.errors
from dynamo_api.errors import DynamoError
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, ConfigDict, Field

from dynamo_worker.protocol import ServingFeatures
from dynamo_worker.runtime.discovery import NO_JETSTREAM

__all__ = [
    "CARD_FILES",
    "MODEL_CARD_BUCKET",
    "ModelCard",
    "ModelCardError",
    "build_model_card",
    "fetch_model_card",
    "publish_model_card",
]

log = logging.getLogger(__name__)

MODEL_CARD_BUCKET = "dynamo-model-cards"
CARD_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
)
CARD_OBJECT = "card.json"
NATS_OP_TIMEOUT_S = 30.0


class ModelCardError(DynamoError, RuntimeError):
    """A model card could not be built, published or fetched; the message says which and why."""


class ModelCard(BaseModel):
    # A newer worker's card (a field this frontend does not know) still loads: see dynamo_worker.protocol.
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str  # the served model name
    context_length: Annotated[int, Field(ge=1)] | None = None
    page_size: Annotated[int, Field(ge=1)] | None = None
    eos_token_ids: list[int] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)  # file name -> sha256 hex
    features: ServingFeatures = ServingFeatures()
    checksum: str = ""  # sha256 of the card without this field
    version: int = 1

    def content_checksum(self) -> str:
        body = self.model_dump(exclude={"checksum"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _eos_ids(model_dir: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        value = _read_json(model_dir / name).get("eos_token_id")
        if isinstance(value, int):
            return [value]
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return list(value)
    eos = _read_json(model_dir / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str):
        for tok in _read_json(model_dir / "tokenizer.json").get("added_tokens", []):
            if tok.get("content") == eos and isinstance(tok.get("id"), int):
                return [tok["id"]]
    return []


def build_model_card(
    model_dir: Path,
    name: str,
    *,
    context_length: int | None = None,
    page_size: int | None = None,
    features: ServingFeatures | None = None,
) -> ModelCard:
    """Describe ``model_dir`` (pure file reads). Raises ``ModelCardError`` when it has no tokenizer."""
    model_dir = Path(model_dir)
    files = {
        f: hashlib.sha256((model_dir / f).read_bytes()).hexdigest()
        for f in CARD_FILES
        if (model_dir / f).is_file()
    }
    if "tokenizer.json" not in files:
        raise ModelCardError(
            f"model folder {model_dir} has no tokenizer.json; point --model-path (or --model-dir) at a "
            "folder with the tokenizer files"
        )
    if context_length is None:
        config = _read_json(model_dir / "config.json")
        ctx = config.get("max_position_embeddings") or config.get("max_sequence_length")
        context_length = ctx if isinstance(ctx, int) and ctx > 0 else None
    card = ModelCard(
        name=name,
        context_length=context_length,
        page_size=page_size,
        eos_token_ids=_eos_ids(model_dir),
        files=files,
        features=features or ServingFeatures(),
    )
    return card.model_copy(update={"checksum": card.content_checksum()})


def _js(js_or_nc: JetStreamContext | NATS) -> JetStreamContext:
    return js_or_nc.jetstream() if isinstance(js_or_nc, NATS) else js_or_nc


async def _open_store(js: JetStreamContext) -> ObjectStore:
    try:
        return await js.object_store(MODEL_CARD_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        pass
    try:
        return await js.create_object_store(MODEL_CARD_BUCKET, description="Dynamo model cards")
    except nats.js.errors.BadRequestError:  # created concurrently by another worker
        return await js.object_store(MODEL_CARD_BUCKET)


async def publish_model_card(
    js_or_nc: JetStreamContext | NATS,
    model_dir: Path,
    name: str,
    *,
    context_length: int | None = None,
    page_size: int | None = None,
    features: ServingFeatures | None = None,
) -> ModelCard:
    """Publish the card of ``model_dir`` (skipped when the same card is already there)."""
    card = build_model_card(
        model_dir, name, context_length=context_length, page_size=page_size, features=features
    )
    try:
        async with asyncio.timeout(NATS_OP_TIMEOUT_S):
            store = await _open_store(_js(js_or_nc))
            try:
                await store.get_info(f"{card.checksum}/{CARD_OBJECT}")
                log.info("Model card already published name=%s checksum=%s", name, card.checksum[:12])
                return card
            except nats.js.errors.ObjectNotFoundError:
                pass
            for f in card.files:
                await _put_once(store, f"{card.checksum}/{f}", (Path(model_dir) / f).read_bytes())
            await _put_once(store, f"{card.checksum}/{CARD_OBJECT}", card.model_dump_json().encode())
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        raise ModelCardError(f"could not publish the model card of {name}: {NO_JETSTREAM}") from None
    except (nats.errors.Error, TimeoutError) as e:
        raise ModelCardError(f"could not publish the model card of {name} to NATS: {e!r}") from None
    log.info("Published model card name=%s checksum=%s files=%s", name, card.checksum[:12], list(card.files))
    return card


async def _put_once(store: ObjectStore, name: str, data: bytes) -> None:
    """Put ``name`` unless an object with the same content is already there. Workers of one model
    (prefill and decode start together) publish the same card at once; re-putting an object purges the
    chunks of the copy a frontend may be reading at that moment, which then never completes."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
    try:
        info = await store.get_info(name)
        if not info.deleted and (info.digest or "").partition("=")[2] == digest:  # "SHA-256=<b64>"
            return
    except nats.js.errors.ObjectNotFoundError:
        pass
    await store.put(name, data)


async def fetch_model_card(
    js_or_nc: JetStreamContext | NATS, checksum: str, cache_dir: Path
) -> tuple[ModelCard, Path]:
    """The card and a local folder with its files (``cache_dir/<checksum>``), downloaded once and
    verified against their sha256. Raises ``ModelCardError``."""
    target = Path(cache_dir) / checksum
    card_path = target / CARD_OBJECT
    if card_path.is_file():
        card = ModelCard.model_validate_json(card_path.read_bytes())
        if all((target / f).is_file() for f in card.files):
            return card, target
    try:
        async with asyncio.timeout(NATS_OP_TIMEOUT_S):
            store = await _open_store(_js(js_or_nc))
            raw = (await store.get(f"{checksum}/{CARD_OBJECT}")).data
            if raw is None:
                raise ModelCardError(f"model card {checksum[:12]} in the object store is empty")
            card = ModelCard.model_validate_json(raw)
            blobs = {f: (await store.get(f"{checksum}/{f}")).data for f in card.files}
    except (nats.js.errors.ObjectNotFoundError, nats.js.errors.BucketNotFoundError):
        raise ModelCardError(f"model card {checksum[:12]} is not in the object store") from None
    except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError):
        raise ModelCardError(f"could not fetch model card {checksum[:12]}: {NO_JETSTREAM}") from None
    except (nats.errors.Error, TimeoutError) as e:
        raise ModelCardError(f"could not fetch model card {checksum[:12]}: {e!r}") from None
    verified: dict[str, bytes] = {}
    for f, data in blobs.items():
        if data is None or hashlib.sha256(data).hexdigest() != card.files[f]:
            raise ModelCardError(f"model card {checksum[:12]}: file {f} does not match its checksum")
        verified[f] = data
    _store_files(Path(cache_dir), target, {**verified, CARD_OBJECT: raw})
    return card, target


def _store_files(cache_dir: Path, target: Path, blobs: dict[str, bytes]) -> None:
    """Write ``blobs`` into ``target`` atomically (a temporary folder renamed into place)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=cache_dir))
    for f, data in blobs.items():
        (tmp / f).write_bytes(data)
    if target.exists():  # an incomplete earlier download
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.rename(tmp, target)
    except OSError:  # another fetch got there first
        shutil.rmtree(tmp, ignore_errors=True)
