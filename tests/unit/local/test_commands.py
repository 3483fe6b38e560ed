"""dynamo_worker.local.commands: finding `python -m MODULE ARGS` in the command spellings manifests use,
and editing SGLang flags."""

from __future__ import annotations

import pytest
from dynamo_worker.local.commands import ModuleCommand, parse_module_command, set_flag

ARGS = ("--model-path", "Qwen/Qwen3-0.6B", "--tp", "1")


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["python3", "-m", "dynamo.sglang"], list(ARGS)),
        (["python3"], ["-m", "dynamo.sglang", *ARGS]),
        ([], ["python3", "-m", "dynamo.sglang", *ARGS]),
        (["/usr/bin/python3.11", "-m", "dynamo.sglang", *ARGS], []),
        (["sh", "-c"], ["python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --tp 1"]),
        (
            [
                "/bin/bash",
                "-c",
                "cd /workspace && python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --tp 1",
            ],
            [],
        ),
        (["sh", "-c", "python -m dynamo.sglang --model-path 'Qwen/Qwen3-0.6B' --tp 1; echo done"], []),
    ],
)
def test_every_spelling_gives_the_module_and_its_args(command, args):
    assert parse_module_command(command, args) == ModuleCommand("dynamo.sglang", ARGS)


@pytest.mark.parametrize(
    ("command", "args"),
    [([], []), (["/usr/bin/my-server"], ["--port", "1"]), (["sh", "-c", "exec my-server -m x"], [])],
)
def test_no_python_module_gives_none(command, args):
    assert parse_module_command(command, args) is None


def test_set_flag_replaces_every_occurrence_and_aliases():
    args = ["--host", "0.0.0.0", "--port=30000", "--trust-remote-code", "--model", "m"]
    assert set_flag(args, "--host", "127.0.0.1") == (
        "--port=30000",
        "--trust-remote-code",
        "--model",
        "m",
        "--host",
        "127.0.0.1",
    )
    assert set_flag(args, "--port", "5") == (
        "--host",
        "0.0.0.0",
        "--trust-remote-code",
        "--model",
        "m",
        "--port",
        "5",
    )
    assert set_flag(args, "--model-path", "/d", "--model") == (
        "--host",
        "0.0.0.0",
        "--port=30000",
        "--trust-remote-code",
        "--model-path",
        "/d",
    )
