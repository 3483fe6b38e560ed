"""dynamo_api.sglang_args: SGLang flags read from every command form (exec, split between
command and args, shell script), as validation, rendering and dynamo-run read them."""

from __future__ import annotations

import pytest
from dynamo_api.sglang_args import argv, flag_value, is_shell_form, parse_args


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"command": ["python3", "-m", "dynamo.sglang"], "args": ["--tp", "4", "--page-size=16"]}, (4, "16")),
        ({"command": ["python3", "-m", "dynamo.sglang"], "args": ["--tp-size", "8"]}, (8, None)),
        ({"command": ["sh", "-c"], "args": ["python3 -m dynamo.sglang --tensor-parallel-size 2"]}, (2, None)),
        ({"command": ["python3", "-m", "dynamo.sglang"]}, (1, None)),
    ],
)
def test_parse_args_reads_every_form(container, expected):
    args = parse_args(container)
    assert (args.tp, args.page_size) == expected


def test_parse_args_disaggregation_and_gpus_needed():
    args = parse_args(
        {
            "command": ["python3", "-m", "dynamo.sglang"],
            "args": [
                "--tp", "2", "--dp-size", "2", "--disaggregation-mode", "prefill",
                "--disaggregation-transfer-backend", "nixl", "--disaggregation-bootstrap-port", "12345",
            ],
        }
    )  # fmt: skip
    assert args.disaggregation_mode == "prefill"
    assert args.transfer_backend == "nixl"
    assert args.bootstrap_port == "12345"
    assert args.gpus_needed == 4
    with_attention = parse_args({"args": ["--tp", "2", "--dp-size", "2", "--enable-dp-attention"]})
    assert with_attention.gpus_needed == 2
    assert parse_args({"args": ["--tp", "two"]}).tp is None


def test_shell_script_is_split_like_a_shell_and_flags_read_in_both_spellings():
    container = {"command": ["sh", "-c"], "args": ["cd /w && python3 -m dynamo.sglang --page-size=16 # x"]}
    assert is_shell_form(container)
    assert argv(container) == ["cd", "/w", "&&", "python3", "-m", "dynamo.sglang", "--page-size=16"]
    assert flag_value(["--tp", "2", "--tp=4"], "--tp") == "4"
    assert flag_value(("--tp", "2", "--tp-size", "8"), "--tp", "--tp-size") == "8"
    assert flag_value(["--trust-remote-code", "--tp", "2"], "--trust-remote-code") == ""
    assert flag_value(["--tp", "2"], "--page-size") is None
