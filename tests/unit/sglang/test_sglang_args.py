"""The SGLang worker's command line: what it forces for the frontend contract, where decode legs find
the bootstrap server, which ZMQ endpoints carry KV events, and that --help works without SGLang."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.sglang import args

from tests.support.sglang_fake import FakeServerArgs

RUNTIME = RuntimeSettings(listen_host="0.0.0.0", advertise_host="10.1.2.3")


def ns(**kw) -> argparse.Namespace:
    base = {
        "skip_tokenizer_init": False,
        "incremental_streaming_output": False,
        "disaggregation_mode": "null",
        "grammar_backend": "none",
    }
    return argparse.Namespace(**{**base, **kw})


def test_contract_overrides_force_token_ids_and_disjoint_streaming():
    values, notes = args.contract_overrides(ns(), ["--model-path", "m"], RUNTIME)
    assert values == {"skip_tokenizer_init": True, "incremental_streaming_output": True, "host": "0.0.0.0"}
    assert len(notes) == 3 and "--skip-tokenizer-init" in notes[0]


def test_a_grammar_backend_keeps_sglangs_tokenizer_for_structured_output():
    for backend in (None, "xgrammar"):  # None: SGLang's default, xgrammar
        values, notes = args.contract_overrides(ns(grammar_backend=backend), ["--model-path", "m"], RUNTIME)
        assert "skip_tokenizer_init" not in values
        assert "grammar backend needs it" in notes[0] and "--grammar-backend none" in notes[0]


def test_contract_overrides_keep_what_is_already_right_and_an_explicit_host():
    given = ns(skip_tokenizer_init=True, incremental_streaming_output=True)
    values, notes = args.contract_overrides(given, ["--host=10.0.0.1"], RUNTIME)
    assert values == {} and notes == []


def test_prefill_without_bootstrap_port_gets_one_chosen():
    values, _ = args.contract_overrides(ns(disaggregation_mode="prefill"), [], RUNTIME)
    assert values["disaggregation_bootstrap_port"] == 0  # 0: the caller picks a free port
    values, _ = args.contract_overrides(
        ns(disaggregation_mode="prefill"), ["--disaggregation-bootstrap-port", "9000"], RUNTIME
    )
    assert "disaggregation_bootstrap_port" not in values
    values, _ = args.contract_overrides(ns(disaggregation_mode="decode"), [], RUNTIME)
    assert "disaggregation_bootstrap_port" not in values


def test_pick_free_port_returns_a_bindable_port():
    import socket

    port = args.pick_free_port("127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_bootstrap_host_is_the_advertised_host_or_the_multinode_leader():
    assert args.bootstrap_host(FakeServerArgs(), RUNTIME) == "10.1.2.3"
    leader = FakeServerArgs(nnodes=2, dist_init_addr="graph-prefill-0.graph-prefill:29500")
    assert args.bootstrap_host(leader, RUNTIME) == "graph-prefill-0.graph-prefill"
    ipv6 = FakeServerArgs(nnodes=2, dist_init_addr="[fd00::1]:29500")
    assert args.bootstrap_host(ipv6, RUNTIME) == "fd00::1"


def test_kv_event_endpoints_one_per_dp_rank():
    config = '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
    assert args.kv_event_endpoints(config, 1) == ["tcp://127.0.0.1:5557"]
    assert args.kv_event_endpoints(config, 2) == ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]
    assert args.kv_event_endpoints('{"publisher": "null"}', 1) == []
    assert args.kv_event_endpoints(None, 1) == []
    assert args.kv_event_endpoints('{"publisher": "zmq", "endpoint": "ipc:///tmp/kv"}', 2) == [
        "ipc:///tmp/kv",
        "ipc:///tmp/kv_dp1",
    ]
    with pytest.raises(args.WorkerArgsError, match="not JSON"):
        args.kv_event_endpoints("{zmq", 1)


def test_without_sglang_the_worker_says_how_to_install_it():
    if _sglang_importable():
        pytest.skip("SGLang is installed here")
    with pytest.raises(args.WorkerArgsError, match=r"dynamo-sglang\[sglang\]"):
        args.parse_worker_args(["--model-path", "m"], env={})


def test_help_works_without_sglang():
    out = subprocess.run(
        [sys.executable, "-m", "dynamo_worker.sglang", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "--nats-server" in out.stdout and "--engine-start-timeout-s" in out.stdout
    if not _sglang_importable():
        assert "dynamo-sglang[sglang]" in out.stdout


def test_our_settings_come_from_flags_and_the_rest_is_left_for_sglang():
    ours, rest = args._our_parser().parse_known_args(
        ["--namespace", "ns1", "--model-path", "m", "--canary-timeout-s", "5", "--tp", "2", "--port=3"]
    )
    assert ours.namespace == "ns1" and ours.canary_timeout_s == "5"
    assert rest == ["--model-path", "m", "--tp", "2", "--port=3"]


def _sglang_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


def test_main_without_sglang_exits_2_and_names_the_fix(capsys):
    if _sglang_importable():
        pytest.skip("SGLang is installed here")
    from dynamo_worker.sglang.__main__ import main

    assert main(["--model-path", "m", "--namespace", "ns"]) == 2
    assert "dynamo-sglang[sglang]" in capsys.readouterr().err


def test_main_rejects_an_invalid_runtime_flag_with_its_name(capsys):
    from dynamo_worker.sglang.__main__ import main

    assert main(["--system-port", "70000", "--model-path", "m"]) == 2
    assert "--system-port" in capsys.readouterr().err
