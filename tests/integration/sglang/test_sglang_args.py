"""The SGLang worker's command line where it reaches the machine: ``--help`` works without SGLang as a real
process, a free port is really bindable, and a prefill plan (which binds a port to choose its bootstrap
port) builds a new ServerArgs for a changed value. The rest of the command line is tested in
tests/unit/sglang/test_sglang_args.py; ``cli_from_source`` stands in for SGLang's ``ServerArgs``."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys

import pytest
from dynamo_worker.sglang import args

from tests.support.sglang_source import cli_from_source

NEWEST = args.SGLANG_WINDOW[1]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def newest_cli(newest_src):
    return cli_from_source(newest_src, NEWEST)


def _sglang_importable() -> bool:
    return importlib.util.find_spec("sglang") is not None


def test_pick_free_port_returns_a_bindable_port():
    port = args.pick_free_port("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_help_works_without_sglang():
    out = subprocess.run(
        [sys.executable, "-m", "dynamo_worker.sglang", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "--nats-server" in out.stdout and "--engine-start-timeout-s" in out.stdout
    if not _sglang_importable():
        assert "dynamo-sglang[sglang]" in out.stdout


def test_the_plan_builds_a_new_server_args_for_a_changed_value(newest_cli):
    plan = args.parse_worker_args(
        ["--model-path", "m", "--disaggregation-mode", "prefill"], env={}, sglang=newest_cli
    )
    assert plan.bootstrap_port_chosen
    with pytest.raises(AttributeError, match="read-only"):
        plan.server_args.disaggregation_bootstrap_port = 1234
    fresh = plan.build_server_args({"disaggregation_bootstrap_port": 1234})
    assert fresh.disaggregation_bootstrap_port == 1234 and fresh.model_path == "m"
    assert plan.server_args.disaggregation_bootstrap_port != 1234
