"""SGLang's native HTTP API served by one simulated engine, for gateways that front SGLang servers.

``python -m dynamo_worker.mocker.sglang_http --host H --port P [SGLang and mocker flags]`` runs one
``MockerEngine`` (the same settings, timing model and KV cache as ``python -m dynamo_worker.mocker``)
behind the HTTP endpoints ``sglang.launch_server`` serves, so that SGLang's own gateway (``smg launch
--worker-urls ...``) can front N of them exactly as it fronts SGLang servers (``tests/gpu/run_peers.py``
compares it with our stack this way). No NATS, no discovery, no KV events: nothing but HTTP.

More: docs/module-notes.md (dynamo_worker.mocker.sglang_http)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web
from dynamo_api.errors import DynamoError
from dynamo_api.settings_sources import add_model_arguments, settings_from_args
from pydantic import ValidationError

from dynamo_worker.mocker.engine import MockerEngine
from dynamo_worker.mocker.settings import MULTI_VALUE_FLAGS, MockerSettings, spread_values
from dynamo_worker.profile.model import ProfileError
from dynamo_worker.protocol import (
    GenerateChunk,
    GenerateRequest,
    KvEvent,
    SamplingOptions,
    StopConditions,
    StructuredOutput,
    Usage,
)
from dynamo_worker.runtime import listening
from dynamo_worker.runtime.engine import EngineInfo, LoadSnapshot
from dynamo_worker.runtime.modelcard import build_model_card
from dynamo_worker.runtime.settings import SettingsError, configure_logging

__all__ = ["SGLangServer", "build_parser", "generate_request", "main"]

log = logging.getLogger("dynamo_worker.mocker.sglang_http")

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when sampling_params sets none
HEALTH_TIMEOUT_S = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT
VERSION = "0.5.17"  # the SGLang whose API this serves (its /server_info "version")
# sampling_params SGLang takes that change nothing in the simulation (the tokens do not depend on them)
_ACCEPTED = {"n", "repetition_penalty", "skip_special_tokens", "spaces_between_special_tokens",
             "no_stop_trim", "custom_params", "stream_interval", "logit_bias"}  # fmt: skip
_SAMPLING = {"temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty"}


class BadRequest(DynamoError, ValueError):
    """What SGLang answers 400 to; the message names the field and what to send."""


# --- pure: SGLang's request and answer shapes ----------------------------------------------------


def prompt_ids(body: Mapping[str, Any], encode: Any = None) -> list[int]:
    """The prompt of a ``/generate`` body: ``input_ids``, else ``text`` through ``encode`` (None: no
    tokenizer). Raises ``BadRequest``."""
    ids = body.get("input_ids")
    if ids is None and isinstance(body.get("text"), str):
        if encode is None:
            raise BadRequest("text needs a tokenizer: give --model-path (or --model-dir) a model folder")
        ids = encode(body["text"])
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise BadRequest(
            "send one prompt: input_ids (a non-empty list of token ids) or text (a string); batches are "
            "not simulated by the mocker"
        )
    return ids


def simulated_params(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body's ``sampling_params``, once nothing in the body asks for what the simulation cannot
    honour (named in the ``BadRequest``)."""
    params = body.get("sampling_params") or {}
    if not isinstance(params, Mapping):
        raise BadRequest("sampling_params must be an object")
    unsupported = [k for k in ("return_logprob", "lora_path", "image_data", "input_embeds") if body.get(k)]
    unsupported += [k for k in ("stop", "regex", "ebnf", "structural_tag") if params.get(k)]
    if unsupported:
        raise BadRequest(f"{', '.join(unsupported)}: not simulated by the mocker; leave them out")
    unknown = set(params) - _ACCEPTED - _SAMPLING - {
        "max_new_tokens", "min_new_tokens", "sampling_seed", "stop_token_ids", "ignore_eos", "json_schema",
        "stop", "regex", "ebnf", "structural_tag",
    }  # fmt: skip
    if unknown:
        raise BadRequest(f"sampling_params: unknown field(s) {', '.join(sorted(unknown))}")
    return params


def generate_request(
    body: Mapping[str, Any], model: str, eos_token_ids: Sequence[int], encode: Any = None
) -> tuple[GenerateRequest, bool]:
    """The engine request for an SGLang ``/generate`` body, and whether it streams. ``encode``: text to
    token ids (None: no tokenizer, ``text`` is refused). Raises ``BadRequest``."""
    ids = prompt_ids(body, encode)
    params = simulated_params(body)
    max_new = params.get("max_new_tokens")
    rid = body.get("rid") or uuid.uuid4().hex
    try:
        request = GenerateRequest(
            request_id=str(rid),
            model=model,
            token_ids=ids,
            sampling=SamplingOptions(
                **{k: params[k] for k in _SAMPLING if params.get(k) is not None},
                seed=params.get("sampling_seed"),
            ),
            stop=StopConditions(
                max_tokens=DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new,
                min_tokens=params.get("min_new_tokens") or 0,
                stop_token_ids=list(params.get("stop_token_ids") or []),
                ignore_eos=bool(params.get("ignore_eos", False)),
            ),
            eos_token_ids=list(eos_token_ids),
            structured=StructuredOutput(json_schema=params["json_schema"])
            if params.get("json_schema")
            else None,
        )
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise BadRequest(f"invalid request: {problems}") from None
    return request, bool(body.get("stream", False))


def finish_reason(chunk: GenerateChunk, output_ids: Sequence[int], request: GenerateRequest) -> Any:
    """SGLang's ``meta_info.finish_reason`` of a finished chunk (``None`` while it runs)."""
    if chunk.finish_reason is None:
        return None
    if chunk.finish_reason == "length":
        return {"type": "length", "length": len(output_ids)}
    if chunk.finish_reason == "stop":
        matched = request.stop.stop_token_ids[:1] or request.eos_token_ids[:1]
        return {"type": "stop", "matched": matched[0] if matched else None}
    status = 503 if chunk.error is not None and chunk.error.type == "shutting_down" else 500
    message = chunk.error.message if chunk.error is not None else "Aborted"
    return {"type": "abort", "message": message, "status_code": status, "err_type": None}


def meta_info(
    rid: str, prompt_tokens: int, output_ids: Sequence[int], reason: Any, usage: Usage | None
) -> dict[str, Any]:
    """SGLang's ``meta_info``; the cached tokens are known with the usage, in the last event."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(output_ids),
    }
    if usage is not None:
        meta["cached_tokens"] = usage.cached_tokens
        if usage.cached_tokens:
            host = min(usage.cached_tokens_host, usage.cached_tokens)
            meta["cached_tokens_details"] = {"device": usage.cached_tokens - host, "host": host}
    return meta


def error_event(message: str, code: int = 400) -> dict[str, Any]:
    """The event SGLang streams for a request it cannot serve (then ``[DONE]``)."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}


def error_response(message: str, code: int) -> web.Response:
    """SGLang's ErrorResponse (a malformed body, an engine that failed a request not streamed)."""
    phrase = "Bad Request" if code == 400 else str(code)
    body = {"object": "error", "message": message, "type": phrase, "param": None, "code": code}
    return web.json_response(body, status=code, dumps=lambda o: orjson.dumps(o).decode())


# --- the server ----------------------------------------------------------------------------------


@dataclass
class _Text:
    """The output's text so far, decoded one token at a time (SGLang streams the whole text each time)."""

    tokenizer: Any
    stream: Any = None
    text: str = ""

    def add(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return self.text
        from tokenizers.decoders import DecodeStream

        if self.stream is None:
            self.stream = DecodeStream(skip_special_tokens=True)
        for token in ids:
            piece = self.stream.step(self.tokenizer, token)
            if piece:
                self.text += piece
        return self.text


class _LastLoad:
    """The engine's event sink here: keeps its latest load report (``/v1/loads``), drops KV events."""

    def __init__(self) -> None:
        self.snapshot: LoadSnapshot | None = None

    def kv_events(self, events: Sequence[KvEvent], dp_rank: int = 0) -> None:
        return None

    def load(self, snapshot: LoadSnapshot) -> None:
        self.snapshot = snapshot


def sglang_loads(snap: LoadSnapshot | None, page_size: int, max_running: int) -> dict[str, Any]:
    """One rank's entry of SGLang's ``/v1/loads`` from the engine's report. Tokens in the waiting queue
    count its uncached prompt tokens (SGLang counts their whole length)."""
    snap = snap or LoadSnapshot(active_blocks=0, total_blocks=1, waiting=0, running=0)
    used, total = snap.active_blocks * page_size, snap.total_blocks * page_size
    pending = used + snap.waiting_prefill_tokens
    return {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": snap.running,
        "num_waiting_reqs": snap.waiting,
        "num_waiting_uncached_tokens": snap.waiting_prefill_tokens,
        "num_used_tokens": used,
        "num_total_tokens": pending,
        "num_active_tokens": pending,
        "max_total_num_tokens": total,
        "max_running_requests": max_running,
        "token_usage": used / total if total else 0.0,
        "disaggregation": {"mode": "null"},
        "queues": {"waiting": snap.waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }


class SGLangServer:
    """One engine behind SGLang's HTTP API (the module docstring lists the endpoints)."""

    def __init__(self, engine: MockerEngine, settings: MockerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.info: EngineInfo | None = None
        self.tokenizer: Any = None
        self.eos_token_ids: list[int] = []
        self.model_config: dict[str, Any] = {}
        self.started = time.time()
        self.last_output = 0.0  # time.monotonic() of the last token any request produced
        self.output = asyncio.Event()  # set at every output, for the health check
        self.running: dict[str, asyncio.Task[Any]] = {}  # rid -> its handler (abort_request)
        self.stopping = False
        self.loads = _LastLoad()
        engine.attach_events(self.loads)

    async def start(self) -> None:
        self.info = await self.engine.start()
        model_dir = self.info.model_dir
        if model_dir is not None:
            card = await asyncio.to_thread(build_model_card, model_dir, self.info.model_name)
            self.eos_token_ids = card.eos_token_ids
            if (model_dir / "tokenizer.json").is_file():
                from tokenizers import Tokenizer

                self.tokenizer = await asyncio.to_thread(
                    Tokenizer.from_file, str(model_dir / "tokenizer.json")
                )
            with contextlib.suppress(OSError, ValueError):
                self.model_config = orjson.loads((model_dir / "config.json").read_bytes())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self.health)
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self.server_info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/loads", self.v1_loads)
        app.router.add_route("POST", "/generate", self.generate)
        app.router.add_route("PUT", "/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        return app

    @property
    def model(self) -> str:
        s = self.settings
        return s.served_model_name or s.model_path or (self.info.model_name if self.info else "")

    # --- information ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """SGLang's check: a one-token request; healthy as soon as the engine produced anything since."""
        if self.info is None or self.stopping:
            return web.Response(status=503)
        since = time.monotonic()
        probe = asyncio.create_task(self._probe())
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                while self.last_output <= since:
                    self.output.clear()
                    await self.output.wait()
        except TimeoutError:
            log.error("Health check failed: no output from the engine within %.0fs", HEALTH_TIMEOUT_S)
            return web.Response(status=503)
        finally:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await probe
        return web.Response(status=200)

    async def _probe(self) -> None:
        request = GenerateRequest(
            request_id=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            model=self.model,
            token_ids=[0],
            sampling=SamplingOptions(temperature=0.0),
            stop=StopConditions(max_tokens=1),
        )
        async with contextlib.aclosing(self.engine.generate(request)) as chunks:
            async for chunk in chunks:
                if chunk.token_ids or chunk.finish_reason is not None:
                    self._produced()

    def _produced(self) -> None:
        self.last_output = time.monotonic()
        self.output.set()

    async def model_info(self, request: web.Request) -> web.Response:
        s, c = self.settings, self.model_config
        return _json({
            "model_path": s.model_path or (str(self.info.model_dir) if self.info else None),
            "tokenizer_path": s.tokenizer_path,
            "is_generation": not s.is_embedding,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": c.get("model_type"),
            "architectures": c.get("architectures"),
        })  # fmt: skip

    async def server_info(self, request: web.Request) -> web.Response:
        """The engine's flags under SGLang's names (the mocker's own knobs too), as SGLang lists its
        server args, with what the engine resolved."""
        info = self.info
        args = self.settings.model_dump(mode="json")
        args.update(
            served_model_name=self.model,
            context_length=info.context_length if info else None,
            max_total_tokens=self.settings.gpu_blocks * self.settings.page_size,
        )
        return _json({
            **args,
            "startup_time": self.started,
            "internal_states": [{"max_total_num_tokens": self.settings.gpu_blocks * self.settings.page_size}],
            "version": VERSION,
            "kv_events": None,
            "mocker": True,
        })  # fmt: skip

    async def models(self, request: web.Request) -> web.Response:
        ctx = self.info.context_length if self.info else None
        card = {"id": self.model, "object": "model", "created": int(self.started), "owned_by": "sglang",
                "root": self.model, "parent": None, "max_model_len": ctx}  # fmt: skip
        return _json({"object": "list", "data": [card]})

    async def v1_loads(self, request: web.Request) -> web.Response:
        load = sglang_loads(self.loads.snapshot, self.settings.page_size, self.settings.max_running_requests)
        return _json({"timestamp": datetime.now(UTC).isoformat(), "version": VERSION, "accelerator": None,
                      "num_accelerators": 1, "loads": [load]})  # fmt: skip

    # --- generation ----------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            encode = (lambda t: self.tokenizer.encode(t).ids) if self.tokenizer is not None else None
            req, stream = generate_request(body, self.model, self.eos_token_ids, encode)
        except (orjson.JSONDecodeError, BadRequest) as e:
            return error_response(str(e), 400)
        if self.info is None or self.stopping:
            return error_response("the server is not serving (starting or shutting down)", 503)
        task = asyncio.current_task()
        assert task is not None
        self.running[req.request_id] = task
        try:
            if stream:
                return await self._stream(request, req)
            return await self._whole(req)
        finally:
            self.running.pop(req.request_id, None)

    async def _chunks(self, req: GenerateRequest) -> AsyncIterator[tuple[GenerateChunk, list[int]]]:
        """The engine's chunks with the output ids so far; closing this aborts the request."""
        output: list[int] = []
        async with contextlib.aclosing(self.engine.generate(req)) as chunks:
            async for chunk in chunks:
                output.extend(chunk.token_ids)
                if chunk.token_ids:
                    self._produced()
                yield chunk, output

    async def _stream(self, request: web.Request, req: GenerateRequest) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        text = _Text(self.tokenizer)
        async for chunk, output in self._chunks(req):
            if chunk.error is not None and chunk.error.type == "invalid_request":
                event = error_event(chunk.error.message)
            else:
                reason = finish_reason(chunk, output, req)
                meta = meta_info(req.request_id, len(req.token_ids), output, reason, chunk.usage)
                event = {"text": text.add(chunk.token_ids), "output_ids": output, "meta_info": meta}
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _whole(self, req: GenerateRequest) -> web.Response:
        last: GenerateChunk | None = None
        output: list[int] = []
        async for chunk, so_far in self._chunks(req):
            last, output = chunk, so_far
        assert last is not None
        if last.error is not None:
            if last.error.type == "invalid_request":
                return _json({"error": {"message": last.error.message}}, 400)
            reason = finish_reason(last, output, req)
            return error_response(last.error.message, reason["status_code"])
        meta = meta_info(
            req.request_id, len(req.token_ids), output, finish_reason(last, output, req), last.usage
        )
        return _json({"text": _Text(self.tokenizer).add(output), "output_ids": output, "meta_info": meta})

    async def abort(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as e:
            return error_response(str(e), 400)
        rid = body.get("rid") if isinstance(body, dict) else None
        tasks = list(self.running.values()) if isinstance(body, dict) and body.get("abort_all") else []
        if rid in self.running:
            tasks.append(self.running[rid])
        for task in tasks:
            task.cancel()  # closes the request's engine stream: its blocks are freed
        return web.Response(status=200)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


# --- the process ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_worker.mocker.sglang_http",
        allow_abbrev=False,
        description="A simulated SGLang server: one mocker engine (the same timing model, KV cache, "
        "HiCache host tier and flags as python -m dynamo_worker.mocker) behind SGLang's native HTTP API "
        "(/generate, /health, /health_generate, /model_info, /server_info, /v1/models, /v1/loads, "
        "/abort_request) on --host:--port (0: any free port, logged), so that SGLang's gateway (smg launch "
        "--worker-urls ...) can front it as it fronts sglang.launch_server. No NATS, no discovery and no "
        "KV events in this mode; aggregated only (no --disaggregation-mode). Other SGLang flags are "
        "accepted and named at startup.",
    )
    add_model_arguments(parser, MockerSettings, "engine (SGLang flags and mocker knobs)")
    return parser


def parse(argv: Sequence[str]) -> tuple[MockerSettings, list[str]]:
    """The engine's settings and the flags it does not know (ignored). Raises ``SettingsError``."""
    args, unknown = build_parser().parse_known_args(spread_values(argv, MULTI_VALUE_FLAGS))
    return settings_from_args(MockerSettings, args, {}), unknown


async def serve(settings: MockerSettings) -> int:
    if settings.role != "agg" or settings.is_embedding or settings.node_rank > 0:
        log.error(
            "This mode serves an aggregated generation engine only: drop --disaggregation-mode, "
            "--is-embedding and --node-rank (SGLang's PD bootstrap protocol is not simulated over HTTP)"
        )
        return 2
    try:
        engine = MockerEngine(settings)
    except ProfileError as e:
        log.error("--profile: %s", e)
        return 2
    server = SGLangServer(engine, settings)
    await server.start()
    try:
        runner, port = await listening.serve(
            server.app(), "http", settings.host, settings.port, what="the SGLang HTTP API", flag="--port",
            handler_cancellation=True,  # a client that goes away cancels its handler: the request aborts
        )  # fmt: skip
    except listening.PortUnavailable as e:
        log.error("%s", e)
        await engine.stop()
        return 2
    log.info("Serving SGLang's HTTP API port=%s model=%s (simulated engine)", port, server.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stopping = True
    await runner.cleanup()
    await engine.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    try:
        settings, unknown = parse(sys.argv[1:] if argv is None else argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if unknown:
        log.info("Ignored flags the mocker does not simulate: %s", " ".join(unknown))
    return asyncio.run(serve(settings))


if __name__ == "__main__":
    raise SystemExit(main())
