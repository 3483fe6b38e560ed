"""Send one request and time its stream: the I/O layer of the load generator.

Two targets with one interface (``async send(spec) -> RequestResult``):

- ``OpenAITarget``: any OpenAI-compatible server, ``/v1/chat/completions`` or ``/v1/completions``,
  streamed as server-sent events over one shared ``aiohttp`` session (or, with ``stream=False``, one
  JSON answer each). The official ``openai`` client is
  not used on purpose: it parses every chunk into pydantic objects and hides when bytes arrive, which
  adds client-side CPU per token (on a 2-core machine that lands in the figures) and blurs TTFT/ITL.
  Reading the SSE lines directly timestamps each chunk as it arrives. ``extra_body`` adds fields to
  every request (e.g. NVIDIA Dynamo's ``nvext``); where the server reports no cached tokens but its
  stream carries Dynamo's ``nvext.timing.kv_hit_rate`` (the router's overlap with the chosen worker's
  cache), that share of the prompt counts as cached.
- ``RequestPlaneTarget``: a worker's request plane (``runtime.request_plane``, the frontend's own
  client), the baseline that shows what the frontend adds. Prompts are tokenized with the
  model's ``tokenizer.json`` before the clock starts.

Errors are results, not exceptions: ``RequestResult.error`` is a short type (``http_503``,
``connect``, ``timeout``, ``stream_error``, ``incomplete``, ``cancelled``) for the report's error
counts, and ``error_message`` keeps the server's words.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
import orjson

from dynamo_worker.bench.stats import RequestResult
from dynamo_worker.bench.workload import RequestSpec
from dynamo_worker.protocol import GenerateRequest, SamplingOptions, StopConditions
from dynamo_worker.runtime.request_plane import (
    RequestClient,
    RequestPlaneError,
    WorkerRejected,
    WorkerUnreachable,
)

__all__ = ["OpenAITarget", "RequestPlaneTarget", "Target", "make_session"]


class Target(Protocol):
    async def send(self, spec: RequestSpec) -> RequestResult: ...

    async def close(self) -> None:
        """Release what the target holds beyond the caller's session."""


def make_session(connections: int = 0) -> aiohttp.ClientSession:
    """One keep-alive session for a whole run (``connections`` 0: no limit)."""
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=30.0)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None), read_bufsize=256 * 1024
    )


async def _http_error(response: aiohttp.ClientResponse, result: RequestResult) -> None:
    result.error = f"http_{response.status}"
    body = await response.read()
    try:
        err = orjson.loads(body).get("error", {})
        result.error_message = err.get("message", "") if isinstance(err, dict) else str(err)
    except (orjson.JSONDecodeError, AttributeError):
        result.error_message = body[:200].decode(errors="replace")


class OpenAITarget:
    """Streams chat or text completions from ``url`` (the server root, e.g. http://127.0.0.1:8000)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        *,
        api: Literal["chat", "completions"] = "chat",
        api_key: str | None = None,
        ignore_eos: bool = True,
        timeout_s: float = 120.0,
        stream: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        root = url.rstrip("/")
        root = root.removesuffix("/v1")
        self.endpoint = f"{root}/v1/chat/completions" if api == "chat" else f"{root}/v1/completions"
        self.session, self.model, self.api = session, model, api
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.ignore_eos, self.timeout_s, self.stream = ignore_eos, timeout_s, stream
        self.extra_body = extra_body or {}

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": self.stream,
            "max_tokens": spec.max_tokens,
            "temperature": 0.0,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            body["messages"] = list(spec.messages)
        elif spec.prompt_ids is not None:
            body["prompt"] = list(spec.prompt_ids)
        else:
            body["prompt"] = spec.prompt
        return {**body, **self.extra_body} if self.extra_body else body

    async def close(self) -> None:
        """Nothing to release: the session is the caller's."""

    async def send(self, spec: RequestSpec) -> RequestResult:
        data = orjson.dumps(self.body(spec))
        read = self._read_sse if self.stream else self._read_whole
        return await _post(self.session, self.endpoint, data, self.headers, self.timeout_s, read)

    async def _read_whole(self, response: aiohttp.ClientResponse, result: RequestResult) -> None:
        """A non-streamed answer: its one "chunk" is the whole body, so TTFT equals E2E."""
        body = orjson.loads(await response.read())
        result.first_chunk = time.perf_counter()
        result.chunk_times.append(result.first_chunk)
        choice = (body.get("choices") or [{}])[0]
        result.text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
        usage = body.get("usage") or {}
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.prompt_tokens = usage.get("prompt_tokens")

    async def _read_sse(self, response: aiohttp.ClientResponse, result: RequestResult) -> None:
        chunks_with_output = 0
        usage: dict[str, Any] | None = None
        hit_rate: float | None = None  # Dynamo's nvext.timing.kv_hit_rate, when asked for
        parts: list[str] = []
        done = False
        async for raw in response.content:
            now = time.perf_counter()
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                result.error, result.error_message = "bad_event", payload[:200].decode(errors="replace")
                return
            if "error" in event:
                err = event["error"]
                result.error = "stream_error"
                result.error_message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                return
            if event.get("usage"):
                usage = event["usage"]
            if "nvext" in event:
                hit_rate = _kv_hit_rate(event, hit_rate)
            for choice in event.get("choices") or ():
                text = (
                    (choice.get("delta") or {}).get("content") if self.api == "chat" else choice.get("text")
                )
                if text:
                    parts.append(text)
                    chunks_with_output += 1
                    if result.first_chunk is None:
                        result.first_chunk = now
                    result.chunk_times.append(now)
        if not done:
            result.error, result.error_message = "incomplete", "the stream ended without data: [DONE]"
            return
        result.text = "".join(parts)
        result.output_tokens = chunks_with_output
        if usage:
            _take_usage(result, usage, hit_rate)


def _kv_hit_rate(event: dict[str, Any], before: float | None) -> float | None:
    """Dynamo's ``nvext.timing.kv_hit_rate`` of a stream event, else what was seen before."""
    timing = (event["nvext"] or {}).get("timing") or {}
    rate = timing.get("kv_hit_rate")
    return float(rate) if rate is not None else before


def _take_usage(result: RequestResult, usage: dict[str, Any], hit_rate: float | None) -> None:
    """The stream's usage into ``result``: output and prompt tokens, and the cached tokens (the
    server's count; else ``hit_rate`` of the prompt, where the stream told one)."""
    result.output_tokens = int(usage.get("completion_tokens") or result.output_tokens)
    result.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        result.cached_tokens = int(details["cached_tokens"])
    elif hit_rate is not None and result.prompt_tokens:
        result.cached_tokens = round(hit_rate * result.prompt_tokens)


class RequestPlaneTarget:
    """Streams ``GenerateRequest``s straight to a worker's request plane (``host:port``) with the
    frontend's own ``RequestClient`` (one connection for the run; ``close`` ends it)."""

    def __init__(self, address: str, model: str, tokenizer_json: Path, *, timeout_s: float = 120.0) -> None:
        from tokenizers import Tokenizer

        self.address, self.model, self.timeout_s = address, model, timeout_s
        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.client = RequestClient(first_token_timeout_s=timeout_s, inter_token_timeout_s=timeout_s)

    def request(self, spec: RequestSpec) -> GenerateRequest:
        ids = self.tokenizer.encode(spec.prompt, add_special_tokens=False).ids or [0]
        return GenerateRequest(
            request_id=uuid.uuid4().hex,
            model=self.model,
            token_ids=ids,
            sampling=SamplingOptions(temperature=0.0),
            stop=StopConditions(max_tokens=spec.max_tokens, ignore_eos=True),
        )

    async def send(self, spec: RequestSpec) -> RequestResult:
        request = self.request(spec)
        result = RequestResult(start=time.perf_counter())
        tokens = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                async for chunk in self.client.generate(self.address, request):
                    now = time.perf_counter()
                    if chunk.error is not None:
                        result.error, result.error_message = "stream_error", chunk.error.message
                        break
                    if chunk.token_ids:
                        tokens += len(chunk.token_ids)
                        if result.first_chunk is None:
                            result.first_chunk = now
                        result.chunk_times.append(now)
                    if chunk.finish_reason is not None:
                        usage = chunk.usage
                        result.output_tokens = usage.completion_tokens if usage else tokens
                        result.prompt_tokens = usage.prompt_tokens if usage else None
                        result.cached_tokens = usage.cached_tokens if usage else 0
        except TimeoutError:
            result.error, result.error_message = "timeout", f"no complete answer within {self.timeout_s}s"
        except WorkerUnreachable as e:
            result.error, result.error_message = "connect", str(e)
        except WorkerRejected as e:
            result.error, result.error_message = f"http_{e.status}", e.detail
        except RequestPlaneError as e:
            result.error, result.error_message = "stream_broken", str(e)
        finally:
            result.end = time.perf_counter()
        return result

    async def close(self) -> None:
        await self.client.close()


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    data: bytes,
    headers: dict[str, str],
    timeout_s: float,
    read: Callable[[aiohttp.ClientResponse, RequestResult], Awaitable[None]],
) -> RequestResult:
    """POST one request and time it; ``read`` consumes a 200 stream. Failures land in the result."""
    result = RequestResult(start=time.perf_counter())
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=data, headers=headers) as response:
                if response.status != 200:
                    await _http_error(response, result)
                else:
                    await read(response, result)
    except TimeoutError:
        result.error, result.error_message = "timeout", f"no complete answer within {timeout_s}s"
    except aiohttp.ClientConnectorError as e:
        result.error, result.error_message = "connect", str(e)
    except (aiohttp.ClientError, ConnectionError) as e:
        result.error, result.error_message = "stream_broken", str(e) or type(e).__name__
    finally:
        result.end = time.perf_counter()
    return result
