"""``POST /v1/embeddings`` up to the job: OpenAI's request, checked and tokenized.

Input forms (OpenAI's four): a string, a list of strings, a list of token ids, a list of lists of token
ids. Strings are tokenized with the model's tokenizer (special tokens added, as SGLang does); ids are
checked against the vocabulary; every input must be non-empty and fit the context length.
``encoding_format`` ``float`` (lists of numbers) or ``base64`` (little-endian float32, as OpenAI
sends it). ``dimensions`` is passed to the worker (Matryoshka truncation) where the model card says the
model allows it, else refused. ``usage`` counts the input tokens.

Only models whose card says ``model_type: embedding`` (SGLang ``--is-embedding``, the mocker's
``--is-embedding``) serve this endpoint; the others answer 400, and embedding models answer 400 to
chat and completions (``requests.job.check_endpoint``).

Serving the job: batched with other clients' requests (``serving.embedding_batcher``), and answered
(``http.answer.run_embedding``).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.models.preprocessor import encode_off_loop
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.protocol import NvExt
from dynamo_worker.frontend.requests.chat import check_endpoint
from dynamo_worker.frontend.requests.job import EmbeddingPlan, Job
from dynamo_worker.protocol import EmbedOptions, GenerateRequest, ServingFeatures, StopConditions

__all__ = ["EmbeddingRequest", "prepare_embeddings"]

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


async def prepare_embeddings(registry: ModelRegistry, req: EmbeddingRequest) -> Job:
    entry = registry.lookup(req.model)
    if entry.lora_name is not None:
        raise InvalidRequest(
            f"'{req.model}' is a LoRA adapter; adapters serve chat and completions. Ask "
            f"'{entry.base}' for embeddings.",
            param="model",
            code="unsupported",
        )
    pre = entry.preprocessor
    assert pre is not None
    features = pre.features
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
            ids = await encode_off_loop(len(item), pre.encode_prompt, item)
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
        plan=EmbeddingPlan(req.encoding_format),
    )
