"""``POST /v1/embeddings``: OpenAI's request and response, and the batching of small requests.

Input forms (OpenAI's four): a string, a list of strings, a list of token ids, a list of lists of token
ids. Strings are tokenized with the model's tokenizer (special tokens added, as SGLang does); ids are
checked against the vocabulary; every input must be non-empty and fit the context length.
``encoding_format`` ``float`` (lists of numbers) or ``base64`` (little-endian float32, as OpenAI
sends it). ``dimensions`` is passed to the worker (Matryoshka truncation) where the model card says the
model allows it, else refused. ``usage`` counts the input tokens.

Only models whose card says ``model_type: embedding`` (SGLang ``--is-embedding``, the mocker's
``--is-embedding``) serve this endpoint; the others answer 400, and embedding models answer 400 to
chat and completions (``features.check_endpoint``).

Batching (``EmbeddingBatcher``): requests of the same model and ``dimensions`` that arrive within
``window_s`` of each other are sent to one worker as one request (SGLang batches a list of inputs in
one forward pass), up to ``max_inputs`` inputs and ``max_tokens`` tokens; a request that alone reaches
a bound goes by itself at once. A client that goes away leaves its batch running for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from dynamo_worker.frontend.errors import ApiError, InvalidRequest, UpstreamError
from dynamo_worker.frontend.httpio import json_response
from dynamo_worker.frontend.output.responses import Embedding, EmbeddingList, EmbeddingUsage, dump
from dynamo_worker.frontend.requests.features import check_endpoint, serving
from dynamo_worker.frontend.requests.job import Job
from dynamo_worker.frontend.requests.openai_models import NvExt
from dynamo_worker.protocol import (
    EmbedOptions,
    GenerateRequest,
    ServingFeatures,
    StopConditions,
    unpack_vector,
)

if TYPE_CHECKING:
    from dynamo_worker.frontend.http.server import OpenAIServer
    from dynamo_worker.frontend.models.registry import ModelEntry, ModelRegistry
    from dynamo_worker.frontend.serving.dispatch import Dispatcher

log = logging.getLogger(__name__)

__all__ = ["EmbeddingBatcher", "EmbeddingRequest", "prepare_embeddings"]

MAX_INPUTS = 2048  # OpenAI's bounds: inputs per request, and tokens over all of them
MAX_TOTAL_TOKENS = 300_000
_Ids = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: Annotated[str, Field(min_length=1, max_length=512)]
    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)]
        | _Ids
        | Annotated[list[_Ids], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    nvext: NvExt | None = None

    def inputs(self) -> list[str | list[int]]:
        x = self.input
        if isinstance(x, str):
            return [x]
        if isinstance(x[0], int):
            return [list(x)]
        return list(x)


def _check_dimensions(features: ServingFeatures, dimensions: int, model: str) -> None:
    full = features.embedding_dim
    allowed = features.matryoshka_dimensions
    if full is not None and dimensions == full:
        return
    if allowed:
        if dimensions not in allowed:
            raise InvalidRequest(
                f"Model '{model}' serves dimensions {sorted(allowed)} only; ask for one of them or leave "
                "'dimensions' unset.",
                param="dimensions",
                code="invalid_value",
            )
        return
    if not features.is_matryoshka:
        size = f" ({full})" if full else ""
        raise InvalidRequest(
            f"Model '{model}' is not a Matryoshka model, so its vectors cannot be shortened; leave "
            f"'dimensions' unset or set it to the model's size{size}.",
            param="dimensions",
            code="invalid_value",
        )
    if full is not None and dimensions > full:
        raise InvalidRequest(
            f"Model '{model}' makes vectors of {full} dimensions; ask for at most {full}.",
            param="dimensions",
            code="invalid_value",
        )


@dataclass
class EmbeddingPlan:
    batcher: EmbeddingBatcher
    encoding_format: str

    async def run(
        self, server: OpenAIServer, http_request: web.Request, job: Job, started: float
    ) -> web.StreamResponse:
        assert job.generate.embed is not None
        vectors = await self.batcher.embed(job.entry, job.generate)
        tokens = sum(len(i) for i in job.generate.embed.inputs)
        server.metrics.input_tokens.labels(job.model).inc(tokens)
        body = EmbeddingList(
            data=[
                Embedding(index=i, embedding=_encode(v, self.encoding_format)) for i, v in enumerate(vectors)
            ],
            model=job.model,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
        )
        return json_response(dump(body))


def _encode(packed: str, encoding_format: str) -> list[float] | str:
    """The wire already carries OpenAI's base64 form; ``float`` unpacks it."""
    return packed if encoding_format == "base64" else unpack_vector(packed)


async def prepare_embeddings(
    registry: ModelRegistry, batcher: EmbeddingBatcher, req: EmbeddingRequest
) -> Job:
    entry = registry.lookup(req.model)
    pre = entry.preprocessor
    assert pre is not None
    features = serving(pre)
    check_endpoint(features, "embedding", req.model)
    dimensions = req.dimensions
    if dimensions is not None:
        _check_dimensions(features, dimensions, req.model)
        if dimensions == features.embedding_dim:
            dimensions = None  # the full size: nothing to cut (SGLang refuses dimensions on other models)
    inputs: list[list[int]] = []
    for i, item in enumerate(req.inputs()):
        param = "input" if isinstance(req.input, str) or isinstance(req.input[0], int) else f"input[{i}]"
        if isinstance(item, str):
            long = len(item) >= 4096
            ids = await asyncio.to_thread(pre.encode_prompt, item) if long else pre.encode_prompt(item)
        else:
            try:
                pre.check_ids(item)
            except InvalidRequest as e:
                raise InvalidRequest(e.message, param=param, code=e.code) from None
            ids = item
        if not ids:
            raise InvalidRequest(
                "The input is empty after tokenization; send some text.", param=param, code="empty_prompt"
            )
        if len(ids) > pre.context_length:
            raise InvalidRequest(
                f"The input has {len(ids)} tokens but the model's context length is {pre.context_length}; "
                "shorten it.",
                param=param,
                code="context_length_exceeded",
            )
        inputs.append(ids)
    total = sum(map(len, inputs))
    if total > MAX_TOTAL_TOKENS:
        raise InvalidRequest(
            f"The inputs have {total} tokens in all; at most {MAX_TOTAL_TOKENS} fit one request. Split them "
            "over several requests.",
            param="input",
            code="too_many_tokens",
        )
    request_id = uuid.uuid4().hex
    generate = GenerateRequest(
        request_id=request_id,
        model=req.model,
        token_ids=inputs[0],
        stop=StopConditions(max_tokens=1),
        embed=EmbedOptions(inputs=inputs, dimensions=dimensions),
    )
    return Job(
        kind="embedding",
        model=req.model,
        entry=entry,
        preprocessor=pre,
        prompt_ids=inputs[0],
        generate=generate,
        stop_strings=[],
        stop_token_ids=[],
        stream=False,
        include_usage=False,
        id="embd-" + request_id,
        plan=EmbeddingPlan(batcher, req.encoding_format),
    )


@dataclass
class _Waiting:
    inputs: list[list[int]]
    future: asyncio.Future[list[str]]


class EmbeddingBatcher:
    def __init__(
        self, dispatcher: Dispatcher, *, window_s: float = 0.002, max_inputs: int = 64, max_tokens: int = 8192
    ) -> None:
        self._dispatcher = dispatcher
        self.window_s = window_s
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self._queues: dict[tuple[str, int | None], list[_Waiting]] = {}
        self._timers: dict[tuple[str, int | None], asyncio.TimerHandle] = {}
        self._batches: set[asyncio.Task[None]] = set()

    async def embed(self, entry: ModelEntry, request: GenerateRequest) -> list[str]:
        """One vector per input of ``request.embed``, in order (``protocol.pack_vector``); raises
        ``ApiError``."""
        assert request.embed is not None
        inputs = request.embed.inputs
        if len(inputs) >= self.max_inputs or sum(map(len, inputs)) >= self.max_tokens:
            return await self._send(entry, request)
        key = (entry.name, request.embed.dimensions)
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(key, [])
        queue.append(_Waiting(inputs, future))
        full = (
            sum(len(w.inputs) for w in queue) >= self.max_inputs
            or sum(len(i) for w in queue for i in w.inputs) >= self.max_tokens
        )
        if full:
            self._flush(key, entry)
        elif key not in self._timers:
            self._timers[key] = asyncio.get_running_loop().call_later(self.window_s, self._flush, key, entry)
        return await future

    def _flush(self, key: tuple[str, int | None], entry: ModelEntry) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        waiting = [w for w in self._queues.pop(key, []) if not w.future.done()]
        if waiting:
            task = asyncio.create_task(self._batch(entry, key[1], waiting), name=f"embed-batch-{key[0]}")
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _batch(self, entry: ModelEntry, dimensions: int | None, waiting: list[_Waiting]) -> None:
        inputs = [i for w in waiting for i in w.inputs]
        request = GenerateRequest(
            request_id=uuid.uuid4().hex,
            model=entry.name,
            token_ids=inputs[0],
            stop=StopConditions(max_tokens=1),
            embed=EmbedOptions(inputs=inputs, dimensions=dimensions),
        )
        try:
            vectors = await self._send(entry, request)
        except ApiError as e:
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(e)
            return
        pos = 0
        for w in waiting:
            if not w.future.done():
                w.future.set_result(vectors[pos : pos + len(w.inputs)])
            pos += len(w.inputs)
        if len(waiting) > 1:
            log.debug("Batched embeddings model=%s requests=%d inputs=%d", entry.name, len(waiting), pos)

    async def _send(self, entry: ModelEntry, request: GenerateRequest) -> list[str]:
        assert request.embed is not None
        expected = len(request.embed.inputs)
        vectors: list[str] = []
        async with contextlib.aclosing(self._dispatcher.generate(entry, request)) as chunks:
            async for chunk in chunks:
                vectors += chunk.embeddings or []
                if chunk.finish_reason is None:
                    continue
                if len(vectors) != expected:
                    raise UpstreamError(
                        f"The worker returned {len(vectors)} embeddings for {expected} inputs; is it an "
                        "embedding worker (--is-embedding)?",
                        code="bad_worker_answer",
                    )
                return vectors
        raise UpstreamError("The worker ended the stream without embeddings.", code="bad_worker_answer")

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in list(self._batches):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
