"""The SGLang worker's command line: what it forces for the frontend contract, where decode legs find
the bootstrap server, which ZMQ endpoints carry KV events, that --help works without SGLang; and, with
the flags of the oldest and the newest SGLang of the window (read from their source) and their own
``--config`` mergers: a flag the installed SGLang lacks is refused before anything starts with one
message naming it, the version and the fix, and ``--config`` works on both module paths.

SGLang's ``ServerArgs`` needs torch to import, so ``tests.support.sglang_source.cli_from_source`` stands
in for it: a parser with exactly the flags that release declares, and a read-only ServerArgs record."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
from dynamo_worker.runtime.settings import RuntimeSettings
from dynamo_worker.sglang import args

from tests.support.sglang_fake import FakeServerArgs
from tests.support.sglang_source import cli_from_source

OLDEST, NEWEST = args.SGLANG_WINDOW

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


@pytest.fixture(scope="module")
def newest_cli(newest_src):
    return cli_from_source(newest_src, NEWEST)


@pytest.fixture(scope="module")
def oldest_cli(oldest_src):
    return cli_from_source(oldest_src, OLDEST)


@pytest.mark.parametrize("flag", ["--enable-prefill-context-parallel", "--torchao-config", "--cuda-graph-bs"])
def test_a_flag_the_newest_sglang_removed_is_refused_with_its_name_the_version_and_the_fix(newest_cli, flag):
    argv = ["--model-path", "m", flag, *([] if flag.startswith("--enable") else ["8"])]
    with pytest.raises(args.WorkerArgsError) as e:
        args.parse_worker_args(argv, env={}, sglang=newest_cli)
    message = str(e.value)
    assert message.startswith(f"{flag} is not a flag of the installed SGLang {NEWEST}")
    assert f"SGLang {OLDEST} has it" in message and "remove it from the worker's arguments" in message


def test_the_removed_flag_has_its_replacement_where_there_is_one(newest_cli):
    with pytest.raises(args.WorkerArgsError, match="use --cuda-graph-bs-decode and --cuda-graph-bs-prefill"):
        args.parse_worker_args(["--model-path", "m", "--cuda-graph-bs", "8"], env={}, sglang=newest_cli)


def test_the_newest_spelling_on_the_oldest_sglang_names_the_old_spelling(oldest_cli, newest_cli):
    with pytest.raises(args.WorkerArgsError, match=f"SGLang {OLDEST}; use --dp-size N --enable-dp-attention"):
        args.parse_worker_args(["--model-path", "m", "--attn-dp-size", "2"], env={}, sglang=oldest_cli)
    plan = args.parse_worker_args(["--model-path", "m", "--attn-dp-size", "2"], env={}, sglang=newest_cli)
    assert plan.server_args.attn_dp_size == 2


def test_the_worker_exits_2_with_one_line_and_no_traceback_for_a_removed_flag(newest_cli, capsys):
    from dynamo_worker.sglang.__main__ import main

    assert main(["--model-path", "m", "--torchao-config", "int8wo"], sglang=newest_cli) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --torchao-config is not a flag of the installed SGLang 0.5.23")
    assert "Traceback" not in err and "usage:" not in err and err.count("\n") == 1


def test_other_sglang_parse_errors_are_ours_too(newest_cli):
    with pytest.raises(
        args.WorkerArgsError, match=f"SGLang {NEWEST} refused the command line: .*invalid int"
    ):
        args.parse_worker_args(["--model-path", "m", "--tp-size", "two"], env={}, sglang=newest_cli)
    with pytest.raises(args.WorkerArgsError, match="takes no positional arguments"):
        args.parse_worker_args(["--model-path", "m", "stray"], env={}, sglang=newest_cli)


@pytest.mark.parametrize("release", ["oldest", "newest"])
@pytest.mark.parametrize("spelling", ["--config {}", "--config={}"])
def test_config_files_work_with_the_merger_of_each_release(release, spelling, request, tmp_path):
    cli = request.getfixturevalue(f"{release}_cli")
    config = tmp_path / "sglang.yaml"
    config.write_text("page-size: 64\ntp-size: 2\n")
    argv = ["--model-path", "m", *spelling.format(config).split(" ")]
    plan = args.parse_worker_args(argv, env={}, sglang=cli)
    assert (plan.server_args.page_size, plan.server_args.tp_size) == (64, 2)


def test_a_removed_flag_in_a_config_file_is_refused_too(newest_cli, tmp_path):
    config = tmp_path / "sglang.yaml"
    config.write_text("torchao-config: int8wo\n")
    with pytest.raises(args.WorkerArgsError, match=r"--torchao-config is not a flag .* --config file"):
        args.parse_worker_args(["--model-path", "m", "--config", str(config)], env={}, sglang=newest_cli)


def test_a_missing_config_file_is_named(newest_cli, tmp_path):
    with pytest.raises(args.WorkerArgsError, match=r"--config: .*not found"):
        args.parse_worker_args(
            ["--model-path", "m", "--config", str(tmp_path / "no.yaml")], env={}, sglang=newest_cli
        )


def test_sglangs_own_validation_of_the_values_is_a_clear_error_too(newest_cli):
    class Validating(newest_cli.server_args_class):
        @classmethod
        def from_cli_args(cls, ns):
            raise ValueError("page_size must be a power of two")  # as SGLang's validation raises

    cli = dataclasses.replace(newest_cli, server_args_class=Validating)
    with pytest.raises(
        args.WorkerArgsError, match=f"SGLang {NEWEST} refused the server arguments: page_size"
    ):
        args.parse_worker_args(["--model-path", "m"], env={}, sglang=cli)


def test_an_embedding_model_or_dynamos_flag_sets_is_embedding(newest_cli, tmp_path):
    plan = args.parse_worker_args(["--model-path", "m", "--embedding-worker"], env={}, sglang=newest_cli)
    assert plan.server_args.is_embedding is True
    assert "Set --is-embedding: --embedding-worker (NVIDIA Dynamo's flag)" in plan.overrides
    folder = tmp_path / "qwen3-embedding"
    folder.mkdir()
    pooling = [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (folder / "modules.json").write_text(json.dumps(pooling))
    plan = args.parse_worker_args(["--model-path", str(folder)], env={}, sglang=newest_cli)
    assert plan.server_args.is_embedding is True
    assert not args.parse_worker_args(
        ["--model-path", "m"], env={}, sglang=newest_cli
    ).server_args.is_embedding


@pytest.mark.parametrize("release", ["oldest_cli", "newest_cli"])
def test_hicache_flags_of_the_example_reach_sglang_on_both_ends_of_the_window(release, request):
    """examples/agg-hicache.yaml's worker args, as the pod passes them, become SGLang's HiCache settings
    on the oldest and the newest release: they pass through like every SGLang flag."""
    from pathlib import Path

    import yaml

    example = Path(__file__).resolve().parents[3] / "examples" / "agg-hicache.yaml"
    graph = yaml.safe_load(example.read_text())
    argv = graph["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["args"]
    plan = args.parse_worker_args(
        [*argv, "--hicache-io-backend", "direct"], env={}, sglang=request.getfixturevalue(release)
    )
    sa = plan.server_args
    assert sa.enable_hierarchical_cache and sa.hicache_ratio == 2.0
    assert (sa.hicache_write_policy, sa.hicache_io_backend) == ("write_through", "direct")


@pytest.mark.parametrize("release", ["oldest_cli", "newest_cli"])
def test_lora_with_dummy_weights_is_refused_at_parse_time_or_announced(release, request):
    """SGLang reads an adapter's weights with the model's --load-format, so under ``dummy`` it can load
    none: ``--lora-paths`` with it is refused before anything starts, naming the flag and the fix;
    ``--enable-lora`` with it starts (the base model serves) and ``lora_blocked`` says why, which the
    worker logs, publishes and answers ``/v1/loras`` with. LoRA off, or real weights: nothing to say."""
    cli = request.getfixturevalue(release)
    with pytest.raises(args.WorkerArgsError) as e:
        args.parse_worker_args(
            ["--model-path", "m", "--load-format", "dummy", "--lora-paths", "a=/adapters/a"],
            env={},
            sglang=cli,
        )
    assert str(e.value).startswith("--lora-paths cannot be loaded with --load-format dummy")
    assert "--load-format auto" in str(e.value)
    enable = ["--model-path", "m", "--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj"]
    plan = args.parse_worker_args([*enable, "--load-format", "dummy"], env={}, sglang=cli)
    why = args.lora_blocked(plan.server_args)
    assert why is not None and "--load-format dummy reads no files" in why and "--load-format auto" in why
    assert args.lora_blocked(args.parse_worker_args(enable, env={}, sglang=cli).server_args) is None
    plain = args.parse_worker_args(["--model-path", "m", "--load-format", "dummy"], env={}, sglang=cli)
    assert args.lora_blocked(plain.server_args) is None
    real = args.parse_worker_args(
        ["--model-path", "m", "--load-format", "auto", "--lora-paths", "a=/adapters/a"], env={}, sglang=cli
    )
    assert args.lora_blocked(real.server_args) is None
