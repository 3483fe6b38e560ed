"""Token logprobs as OpenAI sends them: ``{"content": [...]}`` for chat and ``{"tokens",
"token_logprobs", "top_logprobs", "text_offset"}`` for completions (``responses.ChatLogprobs``,
``responses.CompletionLogprobs``). The worker sends one per token with
its chunks; ``Logprobs`` collects them until the next event takes them (so a parser holding text back
never separates a token from its logprob for long). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from dynamo_worker.frontend.output.text import Decoder
from dynamo_worker.frontend.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
)
from dynamo_worker.protocol import TokenLogprob as WorkerLogprob

__all__ = ["Logprobs"]


class Logprobs:
    """Worker logprobs as OpenAI's chat or completions shapes, collected until the next event."""

    def __init__(self, preprocessor: Decoder, chat: bool) -> None:
        self._pre = preprocessor
        self.chat = chat
        self.pending: list[tuple[str, WorkerLogprob]] = []
        self.offset = 0

    def _text(self, token_id: int) -> str:
        return self._pre.decode([token_id], skip_special_tokens=False)

    def _top(self, token_id: int, logprob: float) -> ChatTopLogprob:
        text = self._text(token_id)
        return ChatTopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    def add(self, logprobs: Sequence[WorkerLogprob] | None, count: int) -> None:
        for lp in (logprobs or [])[:count]:
            self.pending.append((self._text(lp.token_id), lp))

    def take(self) -> ChatLogprobs | CompletionLogprobs | None:
        if not self.pending:
            return None
        items, self.pending = self.pending, []
        if self.chat:
            return ChatLogprobs(
                content=[
                    ChatTokenLogprob(
                        token=text,
                        logprob=lp.logprob,
                        bytes=list(text.encode()),
                        top_logprobs=[self._top(top.token_id, top.logprob) for top in lp.top],
                    )
                    for text, lp in items
                ]
            )
        offsets = []
        for text, _ in items:
            offsets.append(self.offset)
            self.offset += len(text)
        return CompletionLogprobs(
            tokens=[text for text, _ in items],
            token_logprobs=[lp.logprob for _, lp in items],
            top_logprobs=[{self._text(t.token_id): t.logprob for t in lp.top} for _, lp in items],
            text_offset=offsets,
        )
