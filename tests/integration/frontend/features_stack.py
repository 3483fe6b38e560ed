"""A stack for the feature tests: a real nats-server (the session's), one mocker worker process per
model family (each with its SGLang ``--tool-call-parser`` / ``--reasoning-parser``, replying with the
family's own format from a shared ``--script``), an embedding mocker, a mocker without a grammar
backend, and the frontend as its own process, all on 127.0.0.1. The golden replies below are written
in each model family's published format."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import listening_port
from tests.support.procs import popen as start_process
from tests.support.wait import wait_until

# DeepSeek writes its markers with U+FF5C (fullwidth bar) and U+2581 (lower one eighth block).
_B, _S = "\uff5c", "\u2581"


def ds(name: str) -> str:
    return f"<{_B}{name.replace('_', _S)}{_B}>"


PARIS = '{"city": "Paris"}'
TOKYO = '{"city": "Tokyo"}'

# model -> (worker flags, {prompt keyword: golden reply})
FAMILIES: dict[str, tuple[list[str], dict[str, str]]] = {
    "llama3": (
        ["--tool-call-parser", "llama3"],
        {
            "one call": '<|python_tag|>{"name": "get_weather", "parameters": ' + PARIS + "}",
            "two calls": '{"name": "get_weather", "parameters": ' + PARIS + '}; {"name": "get_weather", '
            '"parameters": ' + TOKYO + "}",
        },
    ),
    "qwen": (
        ["--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3"],
        {
            "one call": '<tool_call>\n{"name": "get_weather", "arguments": ' + PARIS + "}\n</tool_call>",
            "two calls": 'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": '
            + PARIS
            + '}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
            + TOKYO
            + "}\n</tool_call>",
            "think": "<think>\nThe user asks for the capital of France. It is Paris.\n</think>\n\nParis.",
        },
    ),
    "mistral": (
        ["--tool-call-parser", "mistral"],
        {
            "one call": '[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + PARIS + "}]",
            "two calls": "[TOOL_CALLS]get_weather[ARGS]" + PARIS + "[TOOL_CALLS]get_weather[ARGS]" + TOKYO,
        },
    ),
    "deepseekv3": (
        ["--tool-call-parser", "deepseekv3", "--reasoning-parser", "deepseek-r1"],
        {
            "one call": "I need the weather tool.\n</think>\n\n"
            + ds("tool_calls_begin")
            + ds("tool_call_begin")
            + "function"
            + ds("tool_sep")
            + "get_weather\n```json\n"
            + PARIS
            + "\n```"
            + ds("tool_call_end")
            + ds("tool_calls_end"),
            "two calls": "Two cities.\n</think>\n\n"
            + ds("tool_calls_begin")
            + "".join(
                ds("tool_call_begin")
                + "function"
                + ds("tool_sep")
                + "get_weather\n```json\n"
                + args
                + "\n```"
                + ds("tool_call_end")
                for args in (PARIS, TOKYO)
            )
            + ds("tool_calls_end"),
            "think": "The capital of France is Paris.\n</think>\n\nParis.",
        },
    ),
    "deepseekv31": (
        ["--tool-call-parser", "deepseekv31"],
        {
            "one call": ds("tool_calls_begin")
            + ds("tool_call_begin")
            + "get_weather"
            + ds("tool_sep")
            + PARIS
            + ds("tool_call_end")
            + ds("tool_calls_end"),
            "two calls": ds("tool_calls_begin")
            + "".join(
                ds("tool_call_begin") + "get_weather" + ds("tool_sep") + args + ds("tool_call_end")
                for args in (PARIS, TOKYO)
            )
            + ds("tool_calls_end"),
        },
    ),
    "gpt-oss": (
        ["--tool-call-parser", "gpt-oss", "--reasoning-parser", "gpt-oss"],
        {
            "one call": "<|channel|>analysis<|message|>The user wants the weather in Paris.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            "<|message|>" + PARIS,
            "two calls": "<|channel|>analysis<|message|>Two cities.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            "<|message|>" + PARIS + "<|call|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
            "<|message|>" + TOKYO,
            "think": "<|channel|>analysis<|message|>The capital of France is Paris.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Paris.",
        },
    ),
}
EXTRA = {
    "embed": ["--is-embedding"],
    "embed-big": ["--is-embedding", "--embedding-dim", "4096"],
    "embed-mrl": ["--is-embedding"],  # a Matryoshka model (its config.json lists the sizes)
    "nogrammar": ["--grammar-backend", "none"],
}


def prompt(model: str, keyword: str) -> str:
    return f"[{model}] {keyword}: what is the weather in Paris?"


@dataclass
class Stack:
    namespace: str
    url: str = ""  # once the frontend listens
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    system_ports: dict[str, int] = field(default_factory=dict)  # once the stack serves
    logs: dict[str, Path] = field(default_factory=dict)

    def metrics(self, model: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.system_ports[model]}/metrics", timeout=5) as r:
            return r.read().decode()

    def tail(self) -> str:
        return "\n".join(f"--- {n}\n{p.read_text(errors='replace')[-1500:]}" for n, p in self.logs.items())


def start_stack(nats_url: str, tiny_model: Path, tmp: Path, window_ms: float = 50.0) -> Stack:
    namespace = "feat-" + uuid.uuid4().hex[:8]
    rules = [
        {"match": prompt(model, keyword), "reply": reply}
        for model, (_, replies) in FAMILIES.items()
        for keyword, reply in replies.items()
    ]
    script = tmp / "script.json"
    script.write_text(json.dumps(rules))
    stack = Stack(namespace)
    common = ["--namespace", namespace, "--nats-server", nats_url]
    workers = {m: flags for m, (flags, _) in FAMILIES.items()} | EXTRA
    mrl = tmp / "mrl-model"
    mrl.mkdir()
    for f in tiny_model.iterdir():
        (mrl / f.name).write_bytes(f.read_bytes())
    config = json.loads((tiny_model / "config.json").read_text())
    (mrl / "config.json").write_text(json.dumps(config | {"matryoshka_dimensions": [16, 32, 64]}))
    for model, flags in workers.items():
        cmd = [
            sys.executable, "-m", "dynamo_worker.mocker",
            "--model-path", str(mrl if model == "embed-mrl" else tiny_model),
            "--served-model-name", model, "--speedup", "1000", "--script", str(script),
            "--system-port", "0", "--request-port", "0", "--listen-host", "127.0.0.1",
            "--graceful-shutdown-s", "1", "--component", model.replace("-", "_"), *common, *flags,
        ]  # fmt: skip
        stack.logs[model] = tmp / f"{model}.log"
        with open(stack.logs[model], "wb") as out:
            stack.procs[model] = start_process(cmd, stdout=out, stderr=subprocess.STDOUT)
    cmd = [
        sys.executable, "-m", "dynamo_worker.frontend", "--http-host", "127.0.0.1",
        "--http-port", "0", "--embedding-batch-window-ms", str(window_ms), *common,
    ]  # fmt: skip
    stack.logs["frontend"] = tmp / "frontend.log"
    with open(stack.logs["frontend"], "wb") as out:
        stack.procs["frontend"] = start_process(cmd, stdout=out, stderr=subprocess.STDOUT)
    want = set(workers)

    def serving() -> bool:
        try:
            with urllib.request.urlopen(stack.url + "/v1/models", timeout=2) as r:
                if want <= {m["id"] for m in json.loads(r.read())["data"]}:
                    return True
        except OSError:
            pass
        dead = [n for n, p in stack.procs.items() if p.poll() is not None]
        assert not dead, f"stack not serving {sorted(want)} (dead: {dead})\n{stack.tail()}"
        return False

    try:
        port = listening_port(stack.procs["frontend"], stack.logs["frontend"], "frontend")
        stack.url = f"http://127.0.0.1:{port}"
        wait_until(
            serving, f"the stack to serve {sorted(want)}", timeout_s=120, interval_s=0.3, explain=stack.tail
        )
        for model in workers:
            stack.system_ports[model] = listening_port(stack.procs[model], stack.logs[model], "system")
    except AssertionError:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: Stack) -> None:
    for p in stack.procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in stack.procs.values():
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
