"""``POST /v1/chat/completions`` and ``POST /v1/completions`` up to the job, from the parsed and
validated body (``openai_models.parse_request``; the server holds it for a slot in between,
``serving.admission``): look the model up (404 unknown, 503 nobody serving it), plan the features it
uses, tokenize (the chat template for chat; images through ``requests.multimodal``) and check the
context length (``job.build_job``). Serving the job is ``serving.plain_run`` or ``serving.featured_run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.requests.features import (
    chat_messages,
    plan_chat,
    plan_completion,
    served_features,
)
from dynamo_worker.frontend.requests.job import Job, build_job, with_plan
from dynamo_worker.frontend.requests.multimodal import MultimodalProcessor, has_images
from dynamo_worker.frontend.requests.openai_models import ChatCompletionRequest, CompletionRequest

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "THREAD_TOKENIZE_CHARS", "prepare_chat", "prepare_completion"]

# Prompts at least this long (characters) are tokenized in a thread: a few milliseconds of tokenizing
# would otherwise stall every stream this frontend relays. Shorter ones cost less than the hop.
THREAD_TOKENIZE_CHARS = 4096
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


async def _tokenize(chars: int, encode: Callable[..., list[int]], *args: Any) -> list[int]:
    """``encode(*args)``, in a thread when the text is ``chars`` >= ``THREAD_TOKENIZE_CHARS`` long."""
    if chars < THREAD_TOKENIZE_CHARS:
        return encode(*args)
    return await asyncio.to_thread(encode, *args)


async def prepare_chat(
    registry: ModelRegistry, multimodal: MultimodalProcessor | None, req: ChatCompletionRequest
) -> Job:
    entry = registry.lookup(req.model)
    pre = entry.preprocessor
    assert pre is not None
    if has_images(req):  # processor -> encode worker -> language worker (frontend.multimodal)
        if multimodal is None:
            raise InvalidRequest("This frontend takes no images.", param="messages", code="unsupported")
        ids, spans, _ = await multimodal.prepare(entry, req, pre)
        job = build_job("chat", req, entry, ids, prompt_param="messages", default_max=None)
        job.generate = job.generate.model_copy(update={"images": spans})
        return job
    plan = plan_chat(req, served_features(pre))
    messages = chat_messages(req)
    kwargs = (plan.template_kwargs,) if plan is not None and plan.template_kwargs else ()
    ids = await _tokenize(
        sum(len(m["content"]) for m in messages),
        pre.encode_chat,
        messages,
        req.add_generation_prompt,
        *kwargs,
    )
    return with_plan(build_job("chat", req, entry, ids, prompt_param="messages", default_max=None), plan)


async def prepare_completion(registry: ModelRegistry, req: CompletionRequest) -> Job:
    entry = registry.lookup(req.model)
    pre = entry.preprocessor
    assert pre is not None
    plan = plan_completion(req, served_features(pre))
    prompt = req.prompt_text_or_ids()
    if isinstance(prompt, str):
        ids = await _tokenize(len(prompt), pre.encode_prompt, prompt)
    else:
        pre.check_ids(prompt)
        ids = prompt
    job = build_job(
        "completion", req, entry, ids, prompt_param="prompt", default_max=COMPLETIONS_DEFAULT_MAX_TOKENS
    )
    return with_plan(job, plan)
