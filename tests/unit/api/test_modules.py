"""dynamo_api.modules, the engine-swap table: every NVIDIA Dynamo name runs one of ours, the runtime image
has a ``dynamo`` module for each, every engine runs a module of the engine role, and the module
annotation, the image's aliases and the default commands all read the same table."""

from __future__ import annotations

import ast
from pathlib import Path

from dynamo_api import modules
from dynamo_api.components import components
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.sglang_args import SGLANG_MODULES, SWAPPABLE_MODULES
from dynamo_worker import aliases

COMPAT = Path(__file__).resolve().parents[3] / "images" / "runtime" / "dynamo-compat" / "dynamo"


def test_each_dynamo_name_runs_one_of_ours_in_the_same_role():
    assert set(modules.DYNAMO_ALIASES.values()) == set(modules.ROLES)
    for dynamo, ours in modules.DYNAMO_ALIASES.items():
        assert modules.ours(dynamo) == ours and modules.role(dynamo) == modules.ROLES[ours]
    assert modules.ours("dynamo.vllm") is None and modules.role("sglang.launch_server") is None
    assert modules.ours(None) is None


def test_the_runtime_image_has_a_dynamo_module_for_each_alias_that_runs_it():
    shipped = {f"dynamo.{p.parent.name}" for p in COMPAT.glob("*/__main__.py")}
    assert shipped == set(modules.DYNAMO_ALIASES)
    for name in shipped:
        tree = ast.parse((COMPAT / name.split(".")[1] / "__main__.py").read_text())
        called = [
            n.args[0].value
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
        ]
        assert called == [name]  # main("dynamo.x"): the alias of its own name


def test_engines_run_modules_of_the_engine_role_and_take_sglangs_flags():
    assert all(modules.ROLES[m] == "engine" for m in modules.ENGINES.values())
    assert set(SWAPPABLE_MODULES) == set(modules.ENGINES.values())
    assert set(modules.ENGINES.values()) < set(SGLANG_MODULES)


def test_the_image_aliases_read_the_table():
    assert aliases.ALIASES == modules.DYNAMO_ALIASES
    assert aliases.ENGINES == ("sglang", "mocker") == tuple(modules.ENGINES)
    for engine, module in modules.ENGINES.items():
        assert aliases.resolve("dynamo.sglang", {"DYN_SGLANG_ENGINE": engine}).module == module


def test_a_service_with_no_command_runs_the_default_command_of_its_kind():
    dgd = DynamoGraphDeployment.model_validate(
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g"},
            "spec": {
                "services": {
                    "fe": {"componentType": "frontend"},
                    "w": {"componentType": "worker"},
                    "p": {"componentType": "epp"},
                }
            },
        }
    )
    views = {c.kind: c.command_view["command"] for c in components(dgd)}
    assert views == {kind: list(command) for kind, command in modules.DEFAULT_COMMANDS.items()}
    assert {kind: modules.role(command[2]) for kind, command in modules.DEFAULT_COMMANDS.items()} == {
        "frontend": "frontend",
        "worker": "engine",
        "epp": None,  # a picker plays no role in a graph dynamo-run runs (it refuses one)
    }
