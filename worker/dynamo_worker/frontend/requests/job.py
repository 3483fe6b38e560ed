"""One generation request after validation (``Job``), and the checks that turn an OpenAI request plus
its prompt tokens into the worker's ``GenerateRequest`` (``build_job``): the prompt is not empty, it
leaves room in the context, ``max_tokens`` fits, and the sampling options are the worker's.

Pure: no I/O; a job's id is random and its ``created`` the wall clock's second.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.protocol import ChatCompletionRequest, CompletionRequest
from dynamo_worker.protocol import GenerateRequest, SamplingOptions, StopConditions, Usage

if TYPE_CHECKING:
    from dynamo_worker.frontend.models.preprocess import Preprocessor
    from dynamo_worker.frontend.models.registry import ModelEntry
    from dynamo_worker.frontend.requests.features import FeaturePlan

__all__ = ["EmbeddingPlan", "Job", "JobKind", "build_job", "with_plan"]

JobKind = Literal["chat", "completion", "embedding"]


@dataclass(frozen=True)
class EmbeddingPlan:
    """An embedding job's answer: its vectors as lists of floats or as OpenAI's base64."""

    encoding_format: Literal["float", "base64"]


@dataclass
class Job:
    """One request after validation: what to generate and how to shape the answer."""

    kind: JobKind
    model: str
    entry: ModelEntry
    preprocessor: Preprocessor
    prompt_ids: list[int]
    generate: GenerateRequest
    stop_strings: list[str]
    stop_token_ids: list[int]
    stream: bool
    include_usage: bool
    id: str
    created: int = field(default_factory=lambda: int(time.time()))
    # How serving differs from a plain job's: tools, reasoning, logprobs, ... (``serving.featured_run``);
    # an embedding's answer (``serving.embeddings``). None: plain (``serving.plain_run``).
    plan: FeaturePlan | EmbeddingPlan | None = None


def prompt_tokens(job: Job, worker_usage: Usage | None) -> int:
    """The prompt's size to report: the frontend's own count, but the worker's for a request with
    images, whose engine may add tokens around each image (Qwen2-VL's vision start and end)."""
    if job.generate.images and worker_usage is not None and worker_usage.prompt_tokens:
        return worker_usage.prompt_tokens
    return len(job.prompt_ids)


def _max_tokens(
    req: ChatCompletionRequest | CompletionRequest,
    prompt_tokens: int,
    context_length: int,
    prompt_param: str,
    default_max: int | None,
) -> int:
    """The request's token limit, checked against the room the prompt leaves in the context."""
    max_tokens = req.token_limit()
    room = context_length - prompt_tokens
    if room < 1:
        raise InvalidRequest(
            f"The prompt has {prompt_tokens} tokens but the model's context length is {context_length}; "
            "shorten the prompt.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if max_tokens is None:
        return min(default_max, room) if default_max is not None else room
    if max_tokens > room:
        limit_param = "max_tokens"
        if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
            limit_param = "max_completion_tokens"
        raise InvalidRequest(
            f"The prompt ({prompt_tokens} tokens) plus {limit_param}={max_tokens} exceeds the model's "
            f"context length of {context_length}; ask for at most {room} tokens.",
            param=limit_param,
            code="context_length_exceeded",
        )
    return max_tokens


def _sampling(req: ChatCompletionRequest | CompletionRequest) -> SamplingOptions:
    try:
        return SamplingOptions(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            min_p=req.min_p or 0.0,
            seed=req.seed,
            frequency_penalty=req.frequency_penalty or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
        )
    except ValueError as e:  # the request models already bound every field; kept as a last guard
        raise InvalidRequest(f"Invalid sampling options: {e}", code="invalid_value") from None


def build_job(
    kind: Literal["chat", "completion"],
    req: ChatCompletionRequest | CompletionRequest,
    entry: ModelEntry,
    ids: list[int],
    *,
    prompt_param: str,
    default_max: int | None,
) -> Job:
    """The job for ``req`` with prompt ``ids``; raises ``InvalidRequest`` naming ``prompt_param`` or the
    token limit's field when the prompt is empty or does not fit. ``default_max``: the token limit when
    the request sets none (``None``: all the room left)."""
    pre = entry.preprocessor
    assert pre is not None
    if not ids:
        raise InvalidRequest(
            "The prompt is empty after tokenization; send some text.",
            param=prompt_param,
            code="empty_prompt",
        )
    max_tokens = _max_tokens(req, len(ids), pre.context_length, prompt_param, default_max)
    sampling = _sampling(req)
    stop_ids = list(req.stop_token_ids or [])
    request_id = uuid.uuid4().hex
    generate = GenerateRequest(
        request_id=request_id,
        model=req.model,
        token_ids=ids,
        sampling=sampling,
        stop=StopConditions(
            max_tokens=max_tokens,
            min_tokens=min(req.min_tokens, max_tokens),
            stop_token_ids=stop_ids,
            ignore_eos=req.ignore_eos,
        ),
        eos_token_ids=list(pre.eos_token_ids),
        lora_name=entry.lora_name,  # a LoRA adapter's view of its model (models.adapters)
    )
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Job(
        kind=kind,
        model=req.model,
        entry=entry,
        preprocessor=pre,
        prompt_ids=ids,
        generate=generate,
        stop_strings=req.stop_strings(),
        stop_token_ids=stop_ids,
        stream=bool(req.stream),
        include_usage=req.include_usage(),
        id=prefix + request_id,
    )


def with_plan(job: Job, plan: FeaturePlan | None) -> Job:
    """``job`` served through ``serving.featured_run`` when ``plan`` changes the answer; template-only plans
    (``chat_template_kwargs``) already did their part in tokenizing."""
    if plan is not None and plan.shapes_answer():
        job.plan = plan
        job.generate = job.generate.model_copy(update=plan.generate_update())
    return job
