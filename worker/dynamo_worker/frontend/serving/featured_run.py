"""Serving a job that uses features (``requests.chat``): the same run as a plain job's
(``serving.plain_run.Run``), its answer shaped with reasoning, tool calls and logprobs.

The text still goes through ``OutputText`` (incremental detokenization, stop strings), then through
``AnswerStream`` for chat; logprobs come with the worker's chunks, one per token, and ride on the next
event sent (``output.logprobs``). A chat answer that made tool calls ends with ``finish_reason``
``tool_calls``. The chunks are OpenAI's (``protocol``): ``delta.reasoning_content`` (as SGLang
and vLLM name it), ``delta.content``, ``delta.tool_calls[i]``, and ``choices[0].logprobs``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from dynamo_worker.frontend.output.chat_output import AnswerStream
from dynamo_worker.frontend.output.shaping import KeepSpecialDecoder, Logprobs, StreamEvents, whole
from dynamo_worker.frontend.protocol import (
    ChatCompletion,
    ChatDelta,
    Completion,
    FinishReason,
    Usage,
)
from dynamo_worker.frontend.requests.chat import FeaturePlan
from dynamo_worker.frontend.serving.plain_run import Run

if TYPE_CHECKING:
    from dynamo_worker.frontend.metrics import FrontendMetrics
    from dynamo_worker.frontend.requests.chat import Job
    from dynamo_worker.frontend.serving.dispatch import Dispatch
    from dynamo_worker.protocol import GenerateChunk

__all__ = ["FeaturedRun"]


class FeaturedRun(Run):
    """A job with a ``FeaturePlan``: one event per chunk, parsed into reasoning, content and tool calls
    (chat), with the logprobs of its tokens."""

    __slots__ = ("answer", "chat", "logprobs")

    def __init__(
        self,
        dispatcher: Dispatch,
        metrics: FrontendMetrics,
        http_request: web.Request,
        job: Job,
        started: float,
    ) -> None:
        plan = job.plan
        assert isinstance(plan, FeaturePlan)
        pre = job.preprocessor
        keep = plan.answer.keep_special() if plan.answer is not None else frozenset()
        decoder = KeepSpecialDecoder(pre, keep) if keep else None
        super().__init__(dispatcher, metrics, http_request, job, started, decoder)
        self.chat = job.kind == "chat"
        self.answer = AnswerStream(plan.answer) if self.chat and plan.answer is not None else None
        self.logprobs = Logprobs(pre, self.chat) if plan.logprobs is not None else None

    def _decode(self, chunk: GenerateChunk) -> list[str]:
        delta = self.out.push(chunk.token_ids)
        self.completion_tokens += delta.token_count
        if self.logprobs is not None:
            self.logprobs.add(chunk.logprobs, delta.token_count)
        if delta.stopped:
            self.finish = "stop"
        return [delta.text]

    async def emit(self, *parts: str) -> None:
        text = "".join(parts)
        events = self.events
        if events is None:
            self.texts.append(text)
            return
        response = self.response
        if response is None:
            response = await self.start(events)
        out = self.pending
        out += self._text_events(events, text, final=False)
        if self.logprobs is not None and self.logprobs.pending:  # of tokens whose text is held back
            out.append(self._event(events, self._empty()))
        if out:
            await response.write(b"".join(out))
            out.clear()

    async def _close(self, events: StreamEvents) -> None:
        """What the answer parser still holds, and the finish reason."""
        if self.response is None:
            await self.start(events)
        self.pending += self._text_events(events, "", final=True)
        self.pending.append(self._event(events, self._empty(), self._reason()))

    def _whole(self, use: Usage) -> ChatCompletion | Completion:
        text = "".join(self.texts)
        logprobs = self.logprobs.take() if self.logprobs is not None else None
        message = None
        if self.answer is not None:
            self.answer.push(text)
            self.answer.finish()
            message = self.answer.message()
        return whole(self.head, text, self._reason(), use, message=message, logprobs=logprobs)

    # --- events ---------------------------------------------------------------------------------

    def _empty(self) -> ChatDelta | str:
        return ChatDelta() if self.chat else ""

    def _event(
        self, events: StreamEvents, delta: ChatDelta | str, finish: FinishReason | None = None
    ) -> bytes:
        """An event with ``delta`` and the logprobs of the tokens not sent yet."""
        return events.event(delta, self.logprobs.take() if self.logprobs is not None else None, finish)

    def _text_events(self, events: StreamEvents, text: str, final: bool) -> list[bytes]:
        if self.answer is not None:
            deltas = self.answer.finish() if final else self.answer.push(text)
            return [self._event(events, d) for d in deltas]
        return [self._event(events, ChatDelta(content=text) if self.chat else text)] if text else []

    def _reason(self) -> FinishReason:
        """The finish reason to send: ``tool_calls`` for a chat answer that called tools and stopped."""
        reason = self.finish or "stop"
        return "tool_calls" if self.answer is not None and self.answer.calls and reason == "stop" else reason
