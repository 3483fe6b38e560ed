"""The mocker's scheduler state: one request in the engine (``_Seq``), and when its tokens are handed over."""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamo_worker.mocker.outbox import _Outbox
from dynamo_worker.protocol import GenerateRequest


@dataclass(eq=False)
class _Seq:
    key: str
    request: GenerateRequest
    tokens: list[int]  # tokens that need KV: the prompt (+ generated ones after a preemption)
    max_new: int
    digest: int  # the token state after the prompt (``tokens.prompt_digest``)
    out: _Outbox = field(default_factory=_Outbox)
    kv_ready: bool = False  # the KV arrives by transfer (decode leg): no prefill compute
    preset_first: int | None = None  # the prefill leg's token, emitted first by a decode leg
    cached_tokens: int | None = None
    host_cached_tokens: int = 0  # of cached_tokens, loaded back from host memory
    generated: list[int] = field(default_factory=list)
    finished: bool = False
    rank: int = 0  # data-parallel rank whose KV cache holds it
    script: list[int] | None = None  # the scripted (or schema-constrained) output, then "stop"
    queued_tokens: int = 0  # uncached prompt tokens while it waits for a prefill (load reports)
    state: int | None = None  # the token state after the prompt and ``generated`` (digest at first)

    @property
    def lora(self) -> str | None:
        return self.request.lora_name


def hands_over(generated: int, interval: int | None) -> bool:
    """Whether the step that made the ``generated``-th token hands the ready tokens over, as SGLang's
    scheduler decides for a streamed request with ``stream_interval``: the first token, then every
    ``interval`` more (the last one goes with the final chunk in any case)."""
    return interval is None or interval == 1 or generated % interval == 1
