"""GPU proof of request migration: one of two SGLang workers is SIGKILLed mid-stream, and the client's
stream completes with the right token count.

usage: python tests/gpu/run_migration.py        (see tests/gpu/README.md for the device call)

An embedded nats-server, our frontend (``--migration-limit 1``) and two of our aggregated SGLang
workers on GPU 0 (``--mem-fraction-static 0.30`` and ``--max-total-tokens`` equal on both, own ports),
same dummy weights as ``run_gpu.py``. With the official ``openai`` client, greedy, ``ignore_eos``:

1. a reference stream of ``MIG_OSL`` tokens that nothing interrupts;
2. for each of ``MIG_RUNS`` prompts: a stream of ``MIG_OSL`` tokens; after ``MIG_KILL_AT`` tokens the
   worker serving it (the one whose ``dynamo_worker_inflight_requests`` is 1) is SIGKILLed with its
   whole process group (SGLang's scheduler included); the stream must end with ``finish_reason``
   ``length``, ``MIG_OSL`` tokens received, ``usage.completion_tokens == MIG_OSL``, and no pause longer
   than ``MIG_STALL_BOUND_S``; the killed worker is started again before the next run.

Also reported, not required: whether the migrated stream's tokens equal the reference's (greedy
decoding of prompt + streamed tokens on another worker gives the same continuation on the same
weights, up to numerics of a different batch). Prints the summary last (also ``$OUT/migration.txt``),
exits 1 when a check failed. ``ENGINE=mocker`` runs it on the simulated engine with no GPU (the
reference comparison is then meaningless, the mocker's tokens depend on the prompt it is sent).

Env: ENGINE (sglang|mocker), MIG_ISL, MIG_OSL, MIG_KILL_AT, MIG_RUNS, MIG_STALL_BOUND_S, MIG_MAX_TOTAL_TOKENS,
STARTUP_S, plus run_gpu.py's GRAPHS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_gpu import (
    ENGINE,
    MODEL,
    MODEL_DIR,
    NAMESPACE,
    OUT,
    SGLANG_FLAGS,
    STARTUP_S,
    Proc,
    Stack,
    free_port,
    ids_of,
    log,
    make_model,
    prompts,
    wait_http,
    wait_served,
)

ISL = int(os.environ.get("MIG_ISL", 512))
OSL = int(os.environ.get("MIG_OSL", 256))
KILL_AT = int(os.environ.get("MIG_KILL_AT", 32))
RUNS = int(os.environ.get("MIG_RUNS", 2))
STALL_BOUND_S = float(os.environ.get("MIG_STALL_BOUND_S", 30))
MAX_TOTAL_TOKENS = os.environ.get("MIG_MAX_TOTAL_TOKENS", "32768")  # 4 GiB of KV each at 8B shape
_AT = SGLANG_FLAGS.index("--mem-fraction-static")
FLAGS = [
    *SGLANG_FLAGS[:_AT],
    *SGLANG_FLAGS[_AT + 2 :],
    "--mem-fraction-static",
    "0.30",
]  # two engines on GPU 0
INFLIGHT = re.compile(r"^dynamo_worker_inflight_requests (\S+)$", re.M)


class Worker:
    """One of the two aggregated workers on GPU 0; ``start`` again after a kill."""

    def __init__(self, stack: Stack, index: int) -> None:
        self.stack, self.index = stack, index
        self.proc: Proc | None = None
        self.system_port = 0

    def start(self) -> Worker:
        self.system_port = free_port()
        module = "dynamo_worker.sglang" if ENGINE == "sglang" else "dynamo_worker.mocker"
        nats = f"nats://127.0.0.1:{self.stack.nats_port}"
        cmd = [sys.executable, "-m", module, "--model-path", str(MODEL_DIR), "--served-model-name", MODEL,
               "--disaggregation-mode", "null", "--base-gpu-id", "0", "--port", str(free_port()),
               *FLAGS, "--max-total-tokens", MAX_TOTAL_TOKENS,
               "--namespace", NAMESPACE, "--component", "agg", "--nats-server", nats,
               "--system-port", str(self.system_port), "--request-port", "0", "--listen-host", "127.0.0.1",
               "--advertise-host", "127.0.0.1", "--graceful-shutdown-s", "5"]  # fmt: skip
        if ENGINE == "mocker":
            cmd += ["--vocab-size", "128256", "--eos-probability", "0"]
        self.proc = self.stack._add(f"agg-{self.index}", cmd)
        return self

    def wait_ready(self) -> float:
        assert self.proc is not None
        return wait_http(self.proc, f"http://127.0.0.1:{self.system_port}/health", STARTUP_S)

    def inflight(self) -> float:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{self.system_port}/metrics", timeout=5) as r,
        ):
            m = INFLIGHT.search(r.read().decode())
            return float(m.group(1)) if m else 0.0
        return 0.0


async def stream(client, ids: list[int], on_token=None) -> dict:
    """One greedy stream; ``on_token(n)`` is awaited after each chunk with output."""
    s = await client.completions.create(
        model=MODEL, prompt=ids, max_tokens=OSL, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    text, usage, finish, last, stall = "", None, None, time.monotonic(), 0.0
    async for event in s:
        now = time.monotonic()
        stall, last = max(stall, now - last), now
        usage = event.usage or usage
        for c in event.choices:
            finish = c.finish_reason or finish
            if c.text:
                text += c.text
                if on_token is not None:
                    await on_token(len(ids_of(text)))
    return {
        "ids": ids_of(text),
        "usage": usage.model_dump() if usage else None,
        "finish": finish,
        "stall": stall,
    }


async def migration_run(client, workers: list[Worker], ids: list[int], reference: list[int]) -> dict:
    killed: list[tuple[Worker, float]] = []

    async def on_token(n: int) -> None:
        if n >= KILL_AT and not killed:
            serving = [w for w in workers if w.inflight() > 0]
            if len(serving) != 1:
                raise RuntimeError(f"expected one worker serving the stream, found {len(serving)}")
            serving[0].proc.kill()  # SIGKILL of its process group
            killed.append((serving[0], time.monotonic()))
            log(f"SIGKILLed agg-{serving[0].index} after {n} tokens")

    try:
        r = await stream(client, ids, on_token)
        error = ""
    except Exception as e:  # the stream broke: the check fails with the reason
        r, error = {"ids": [], "usage": None, "finish": None, "stall": 0.0}, f"{type(e).__name__}: {e}"[:300]
    usage = r["usage"] or {}
    checks = {
        "killed_mid_stream": bool(killed),
        "stream_completed": not error and r["finish"] == "length",
        "token_count_right": len(r["ids"]) == OSL,
        "usage_right": usage.get("completion_tokens") == OSL and usage.get("prompt_tokens") == len(ids),
        "stall_within_bound": r["stall"] <= STALL_BOUND_S,
    }
    result = {
        "ok": all(checks.values()),
        "checks": checks,
        "tokens": len(r["ids"]),
        "usage": usage,
        "longest_pause_s": round(r["stall"], 3),
        "equal_to_uninterrupted": r["ids"] == reference,
        "error": error,
    }
    if killed:
        worker = killed[0][0]
        worker.start()
        worker.wait_ready()
    return result


async def run() -> dict:
    import openai

    stack = Stack()
    try:
        stack.start_nats()
        workers = []
        for i in range(2):  # one after the other: each SGLang engine sizes its memory from what is free
            workers.append(Worker(stack, i).start())
            log(f"agg-{i} ready in {workers[-1].wait_ready():.0f}s")
        frontend = stack._add(
            "frontend",
            [sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1",
             "--http-port", str(stack.http_port), "--namespace", NAMESPACE,
             "--nats-server", f"nats://127.0.0.1:{stack.nats_port}", "--migration-limit", "1"],
        )  # fmt: skip
        wait_http(frontend, f"http://127.0.0.1:{stack.http_port}/live", 60)
        base = f"http://127.0.0.1:{stack.http_port}/v1"
        await wait_served(base, {"agg"})
        runs = []
        async with openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600) as client:
            for i, ids in enumerate(prompts(RUNS, ISL, seed=11)):
                reference = (await stream(client, ids))["ids"]
                result = await migration_run(client, workers, ids, reference)
                log(f"run {i}: {json.dumps(result)}")
                runs.append(result)
        return {"engine": ENGINE, "isl": ISL, "osl": OSL, "kill_at": KILL_AT, "runs": runs}
    finally:
        stack.close()


def summary(result: dict) -> tuple[str, bool]:
    runs = result.get("runs", [])
    ok = bool(runs) and all(r["ok"] for r in runs)
    lines = [
        f"== migration proof: ENGINE={ENGINE} ISL={ISL} OSL={OSL}, SIGKILL after {KILL_AT} tokens, "
        f"{RUNS} runs ==",
        f"{'check':32} result",
    ]
    for name in (
        "killed_mid_stream",
        "stream_completed",
        "token_count_right",
        "usage_right",
        "stall_within_bound",
    ):
        lines.append(f"{name:32} {sum(r['checks'][name] for r in runs)}/{len(runs)}")
    pauses = ", ".join(f"{r['longest_pause_s']}s" for r in runs)
    lines.append(f"{'longest pause (bound ' + str(STALL_BOUND_S) + 's)':32} {pauses}")
    same = sum(r["equal_to_uninterrupted"] for r in runs)
    lines.append(f"{'equal to uninterrupted (info)':32} {same}/{len(runs)}")
    errors = [r["error"] for r in runs if r["error"]]
    if errors:
        lines.append(f"errors: {errors}")
    lines += ["", f"RESULT: {'PASS' if ok else 'FAIL'}"]
    return "\n".join(lines), ok


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    OUT.mkdir(parents=True, exist_ok=True)
    if not (MODEL_DIR / "tokenizer.json").is_file():
        make_model(MODEL_DIR)
    try:
        result = asyncio.run(run())
    except Exception as e:  # the run ends with its reason and a failing summary
        log(f"FAILED: {e}")
        result = {"runs": [], "error": str(e)}
    (OUT / "migration.json").write_text(json.dumps(result, indent=1))
    text, ok = summary(result)
    (OUT / "migration.txt").write_text(text)
    print(text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
