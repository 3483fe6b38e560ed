"""Read the SGLang flags of a container (a Kubernetes Container dict), as the engine will see them. Pure.

Command forms understood:

- exec form, ``command: [python3, -m, dynamo_worker.sglang]`` + ``args: [--tp, "8", ...]``, or split
  anywhere between command and args (``command: [python3]``, ``args: [-m, dynamo.sglang, ...]``);
- shell form, ``command: [sh, -c]`` + ``args: ["python3 -m dynamo.sglang --tp 8 && ..."]`` (or the
  script inside ``command``): the script is split the way a shell would.

Shared by the operator's validation and rendering (``dynamo_operator.backends.sglang`` edits the
flags) and by dynamo-run, so both read a manifest's flags alike.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dynamo_api import contract, modules

__all__ = [
    "DP_FLAGS",
    "PP_FLAGS",
    "SGLANG_MODULES",
    "SWAPPABLE_MODULES",
    "TP_FLAGS",
    "SglangArgs",
    "argv",
    "command_parts",
    "flag_value",
    "is_shell_form",
    "parse_args",
    "served_model_name",
    "shell_script_index",
]

# Modules that run an SGLang engine (or our simulation of one) and take SGLang's flags. A manifest's
# dynamo.mocker is written for NVIDIA Dynamo's mocker, whose flags are its own: not judged as SGLang's.
SGLANG_MODULES = (
    modules.SGLANG_MODULE,
    modules.MOCKER_MODULE,
    modules.DYNAMO_SGLANG_MODULE,
    "sglang.launch_server",
)
# Values the module annotation (``annotations.MODULE_ANNOTATION``) accepts: the engines' modules.
SWAPPABLE_MODULES = tuple(modules.ENGINES.values())
TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size")
PP_FLAGS = ("--pp", "--pp-size", "--pipeline-parallel-size")
DP_FLAGS = ("--dp", "--dp-size", "--data-parallel-size")
_SHELLS = {"sh", "bash", "dash", "ash", "zsh"}


def command_parts(container: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Copies of the container's ``command`` and ``args`` (empty when unset)."""
    return list(container.get("command") or []), list(container.get("args") or [])


def shell_script_index(full: list[str]) -> int | None:
    """Index of the script in ``sh -c SCRIPT`` form, or None for the exec form."""
    if len(full) >= 3 and os.path.basename(full[0]) in _SHELLS:
        opt = full[1]
        if opt.startswith("-") and not opt.startswith("--") and "c" in opt:
            return 2
    return None


def is_shell_form(container: dict[str, Any]) -> bool:
    command, args = command_parts(container)
    return shell_script_index(command + args) is not None


def argv(container: dict[str, Any]) -> list[str]:
    """The tokens the engine will see: command+args, or the shell script split like a shell would."""
    command, args = command_parts(container)
    full = command + args
    index = shell_script_index(full)
    if index is None:
        return full
    try:
        return shlex.split(full[index], comments=True)
    except ValueError:  # an unbalanced quote: read what can be read
        return full[index].split()


def flag_value(tokens: Sequence[str], *names: str) -> str | None:
    """The value of the last ``--name value`` / ``--name=value`` among ``names``; "" for a bare flag."""
    found: str | None = None
    for i, token in enumerate(tokens):
        for name in names:
            if token == name:
                nxt = tokens[i + 1] if i + 1 < len(tokens) else None
                found = nxt if nxt is not None and not nxt.startswith("--") else ""
            elif token.startswith(name + "="):
                found = token[len(name) + 1 :]
    return found


def served_model_name(tokens: Sequence[str]) -> str | None:
    """The model name clients ask for: ``--served-model-name``, else the model path (as SGLang does)."""
    return flag_value(tokens, "--served-model-name") or flag_value(tokens, "--model-path", "--model")


def _int(value: str | None, default: int) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class SglangArgs:
    """The SGLang flags the operator checks. Integers are None when the flag's value is not one."""

    tp: int | None
    pp: int | None
    dp: int | None
    dp_attention: bool
    page_size: str | None
    disaggregation_mode: str | None
    transfer_backend: str | None
    bootstrap_port: str | None
    host: str | None
    tp_given: bool
    worker_role: str | None = None  # --role: language (default), encode or diffusion
    model: str | None = None  # what it serves: --served-model-name, else --model-path
    runs_engine: bool = False  # the command runs one of SGLANG_MODULES (an engine, or our simulation)

    @property
    def gpus_needed(self) -> int | None:
        """GPUs one engine uses: tp x pp, times dp unless dp-attention shares the tp GPUs."""
        if self.tp is None or self.pp is None or self.dp is None:
            return None
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)


def parse_args(container: dict[str, Any]) -> SglangArgs:
    tokens = argv(container)
    return SglangArgs(
        tp=_int(flag_value(tokens, *TP_FLAGS), 1),
        pp=_int(flag_value(tokens, *PP_FLAGS), 1),
        dp=_int(flag_value(tokens, *DP_FLAGS), 1),
        dp_attention=flag_value(tokens, "--enable-dp-attention") is not None,
        page_size=flag_value(tokens, "--page-size"),
        disaggregation_mode=flag_value(tokens, "--disaggregation-mode"),
        transfer_backend=flag_value(tokens, "--disaggregation-transfer-backend"),
        bootstrap_port=flag_value(tokens, contract.BOOTSTRAP_PORT_FLAG),
        host=flag_value(tokens, "--host"),
        tp_given=flag_value(tokens, *TP_FLAGS) is not None,
        worker_role=flag_value(tokens, "--role")
        or ("encode" if "--multimodal-encode-worker" in tokens else None)
        or ("diffusion" if "--image-diffusion-worker" in tokens else None),
        model=flag_value(tokens, "--served-model-name")
        or flag_value(tokens, "--model-path", "--model")
        or None,
        runs_engine=any(t in SGLANG_MODULES for t in tokens),
    )
