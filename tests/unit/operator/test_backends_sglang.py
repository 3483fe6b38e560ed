"""SGLang backend rules: adding multinode flags in every command form, --host, module swaps, and probes
only on the leader (explicit expected containers). Reading flags: test_api_sglang_args.py."""

from __future__ import annotations

from dynamo_operator.backends import sglang

PROBES = {
    "livenessProbe": {"httpGet": {"path": "/live", "port": "system"}},
    "readinessProbe": {"httpGet": {"path": "/health", "port": "system"}},
    "startupProbe": {"httpGet": {"path": "/health", "port": "system"}},
}
DIST = ["--dist-init-addr", "g-0.g.ns.svc:29500", "--nnodes", "2", "--node-rank"]


def test_exec_form_command_and_args():
    container = {"command": ["python3", "-m", "dynamo.sglang"], "args": ["--tp", "8"], **PROBES}
    leader = sglang.for_group_member(container, nnodes=2, leader_host="g-0.g.ns.svc", leader=True)
    assert leader == {
        "command": ["python3", "-m", "dynamo.sglang"],
        "args": ["--tp", "8", *DIST, "0"],
        **PROBES,
    }
    worker = sglang.for_group_member(container, nnodes=2, leader_host="g-0.g.ns.svc", leader=False)
    assert worker == {
        "command": ["python3", "-m", "dynamo.sglang"],
        "args": ["--tp", "8", *DIST, "$(DYN_NODE_RANK)"],
    }
    assert container["args"] == ["--tp", "8"], "the input is not changed"


def test_exec_form_split_between_command_and_args():
    container = {"command": ["python3"], "args": ["-m", "dynamo.sglang", "--tp", "8"]}
    out = sglang.for_group_member(container, nnodes=2, leader_host="g-0.g.ns.svc", leader=True)
    assert out == {"command": ["python3"], "args": ["-m", "dynamo.sglang", "--tp", "8", *DIST, "0"]}


def test_exec_form_all_in_command():
    container = {"command": ["python3", "-m", "dynamo_worker.sglang", "--tp", "8"]}
    out = sglang.for_group_member(container, nnodes=2, leader_host="g-0.g.ns.svc", leader=True)
    assert out == {
        "command": ["python3", "-m", "dynamo_worker.sglang", "--tp", "8"],
        "args": [*DIST, "0"],
    }


def test_shell_form_inserts_after_the_sglang_invocation():
    container = {
        "command": ["sh", "-c"],
        "args": ["python3 -m dynamo.sglang --tp 8 --model-path 'my model' && echo done"],
    }
    out = sglang.for_group_member(container, nnodes=2, leader_host="g-0.g.ns.svc", leader=False)
    assert out == {
        "command": ["sh", "-c"],
        "args": [
            "python3 -m dynamo.sglang --tp 8 --model-path 'my model' --dist-init-addr g-0.g.ns.svc:29500 "
            "--nnodes 2 --node-rank '$(DYN_NODE_RANK)' && echo done"
        ],
    }


def test_shell_form_script_in_command_and_line_continuations():
    script = "set -e\npython3 -m dynamo_worker.sglang \\\n  --tp 8\necho bye"
    out = sglang.append_flags({"command": ["/bin/bash", "-ec", script]}, ["--nnodes", "2"])
    assert out == {
        "command": [
            "/bin/bash",
            "-ec",
            "set -e\npython3 -m dynamo_worker.sglang \\\n  --tp 8 --nnodes 2\necho bye",
        ]
    }


def test_shell_form_without_a_known_module_appends_at_the_end():
    out = sglang.append_flags({"command": ["sh", "-c", "exec ./serve.sh --tp 8  "]}, ["--nnodes", "2"])
    assert out == {"command": ["sh", "-c", "exec ./serve.sh --tp 8 --nnodes 2  "]}


def test_ensure_flag_adds_replaces_or_keeps():
    base = {"command": ["python3", "-m", "dynamo.sglang"], "args": ["--tp", "1"]}
    added, previous = sglang.ensure_flag(base, "--host", "0.0.0.0")
    assert added["args"] == ["--tp", "1", "--host", "0.0.0.0"] and previous is None
    kept, previous = sglang.ensure_flag(added, "--host", "0.0.0.0")
    assert kept == added and previous is None
    replaced, previous = sglang.ensure_flag({"args": ["--host=127.0.0.1", "--tp", "1"]}, "--host", "0.0.0.0")
    assert replaced == {"args": ["--host=0.0.0.0", "--tp", "1"]} and previous == "127.0.0.1"
    shell, previous = sglang.ensure_flag(
        {"command": ["sh", "-c", "python3 -m dynamo.sglang --host 127.0.0.1 --tp 1"]}, "--host", "0.0.0.0"
    )
    assert shell == {"command": ["sh", "-c", "python3 -m dynamo.sglang --host 0.0.0.0 --tp 1"]}
    assert previous == "127.0.0.1"


def test_swap_module_only_after_dash_m():
    container = {
        "command": ["python3", "-m", "dynamo.sglang"],
        "args": ["--served-model-name", "dynamo.sglang"],
    }
    out, changed = sglang.swap_module(container, "dynamo.sglang", "dynamo_worker.sglang")
    assert changed
    assert out == {
        "command": ["python3", "-m", "dynamo_worker.sglang"],
        "args": ["--served-model-name", "dynamo.sglang"],
    }
    shell, changed = sglang.swap_module(
        {"command": ["sh", "-c", "python3 -m dynamo.sglang --tp 1"]}, "dynamo.sglang", "dynamo_worker.mocker"
    )
    assert changed and shell == {"command": ["sh", "-c", "python3 -m dynamo_worker.mocker --tp 1"]}
    same, changed = sglang.swap_module(
        {"command": ["python3", "-m", "dynamo_worker.sglang"]}, "dynamo.sglang", "x"
    )
    assert not changed and same == {"command": ["python3", "-m", "dynamo_worker.sglang"]}


def test_shell_form_command_substitution_subshell_and_comment():
    script = "python3 -m dynamo.sglang --model-path $(cat /m) --tag a#b # the model"
    out = sglang.append_flags({"command": ["sh", "-c", script]}, ["--nnodes", "2"])
    assert (
        out["command"][2]
        == "python3 -m dynamo.sglang --model-path $(cat /m) --tag a#b --nnodes 2 # the model"
    )
    out = sglang.append_flags(
        {"command": ["sh", "-c", "(python3 -m dynamo.sglang --tp 1) && x"]}, ["--nnodes", "2"]
    )
    assert out["command"][2] == "(python3 -m dynamo.sglang --tp 1 --nnodes 2) && x"
