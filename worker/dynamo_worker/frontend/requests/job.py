"""The ``Job`` a run serves, built alike by every generation endpoint (chat, completions, embeddings),
and the ``FeaturePlan`` that says what serving does differently for it.

The job (``build_job``): the prompt is not empty, it leaves room in the context, ``max_tokens`` fits,
and the sampling options are the worker's. Pure but for the tokenizing thread of a long prompt: a
job's id is random and its ``created`` the wall clock's second.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.output.chat_output import AnswerParser
from dynamo_worker.frontend.protocol import ChatCompletionRequest, CompletionRequest
from dynamo_worker.protocol import (
    GenerateRequest,
    SamplingOptions,
    StopConditions,
    StructuredOutput,
    Usage,
)

if TYPE_CHECKING:
    from dynamo_worker.frontend.models.preprocessor import Preprocessor
    from dynamo_worker.frontend.models.registry import ModelEntry

__all__ = [
    "WHOLE_ANSWER_INTERVAL",
    "EmbeddingPlan",
    "FeaturePlan",
    "Grammar",
    "Job",
    "JobKind",
    "build_job",
    "prompt_tokens",
    "reads_whole",
    "whole_answer_interval",
    "with_plan",
]

# --- features -------------------------------------------------------------------------------------

# A constraint on the output as the request names it: (its field, the grammar).
Grammar = tuple[str, StructuredOutput]


@dataclass
class FeaturePlan:
    """What serving does differently for this request (``None`` from ``plan_*``: nothing); a job with
    one is served by ``http.answer.FeaturedRun``."""

    structured: StructuredOutput | None = None
    logprobs: int | None = None  # None: off; k: each token's logprob and k alternatives
    answer: AnswerParser | None = None  # chat: how the text becomes reasoning / content / tool calls
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def generate_update(self) -> dict[str, Any]:
        return {"structured": self.structured, "logprobs": self.logprobs}

    def shapes_answer(self) -> bool:
        """Whether the answer is served differently (else the plan did its part in the chat template)."""
        return self.structured is not None or self.logprobs is not None or self.answer is not None


# --- the job --------------------------------------------------------------------------------------

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
    # How serving differs from a plain job's: tools, reasoning, logprobs, ... (``http.answer.FeaturedRun``);
    # an embedding's answer (``http.answer.run_embedding``). None: plain (``http.answer.PlainRun``).
    plan: FeaturePlan | EmbeddingPlan | None = None

    @property
    def reads_whole(self) -> bool:
        return reads_whole(self.stream, self.stop_strings)


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


# Decode steps between two hand-overs of an answer the client reads whole (SGLang's own interval for a
# request that is not streamed): the tokens cross the engine's and the request plane's process
# boundaries once per 50 steps, not at every step (what that is worth: tests/gpu/README.md, LoRA).
WHOLE_ANSWER_INTERVAL = 50


def reads_whole(stream: bool, stop_strings: list[str]) -> bool:
    """Whether the answer is only read whole: not streamed, and no stop string, which the frontend
    matches on the text as it comes (so a request with one keeps every step, and the engine stops within
    a step of the match, not up to ``WHOLE_ANSWER_INTERVAL`` tokens after it)."""
    return not stream and not stop_strings


def whole_answer_interval(stream: bool, stop_strings: list[str]) -> int | None:
    """``GenerateRequest.stream_interval`` for a request: ``WHOLE_ANSWER_INTERVAL`` when its answer is
    only read whole (``reads_whole``), else None (every step)."""
    return WHOLE_ANSWER_INTERVAL if reads_whole(stream, stop_strings) else None


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
    pre.check_ids(stop_ids, "stop_token_ids")
    stop_strings = req.stop_strings()
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
        lora_name=entry.lora_name,  # a LoRA adapter's view of its model (models.lora_adapters)
        stream_interval=whole_answer_interval(bool(req.stream), stop_strings),
    )
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Job(
        kind=kind,
        model=req.model,
        entry=entry,
        preprocessor=pre,
        prompt_ids=ids,
        generate=generate,
        stop_strings=stop_strings,
        stop_token_ids=stop_ids,
        stream=bool(req.stream),
        include_usage=req.include_usage(),
        id=prefix + request_id,
    )


def with_plan(job: Job, plan: FeaturePlan | None) -> Job:
    """``job`` served through ``http.answer.FeaturedRun`` when ``plan`` changes the answer; template-only
    plans (``chat_template_kwargs``) already did their part in tokenizing."""
    if plan is not None and plan.shapes_answer():
        job.plan = plan
        job.generate = job.generate.model_copy(update=plan.generate_update())
    return job
