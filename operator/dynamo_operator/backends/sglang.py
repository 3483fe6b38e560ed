"""SGLang backend rules, as pure functions over a container dict (a Kubernetes Container).

Command forms understood, for reading flags and for adding them:

- exec form, ``command: [python3, -m, dynamo_worker.sglang]`` + ``args: [--tp, "8", ...]``, or split
  anywhere between command and args (``command: [python3]``, ``args: [-m, dynamo.sglang, ...]``):
  flags are appended to ``args``, i.e. to the end of the argument vector.
- shell form, ``command: [sh, -c]`` + ``args: ["python3 -m dynamo.sglang --tp 8 && ..."]`` (or the
  script inside ``command``): flags are inserted right after the SGLang invocation inside the script
  (before any ``&&``, ``;``, ``|`` or newline that ends it), or at the script's end when no known
  module is found.

Multinode: every pod of a group gets ``--dist-init-addr <leader-host>:29500 --nnodes N --node-rank R``.
R is ``0`` on the leader and ``$(DYN_NODE_RANK)`` on the others: Kubernetes itself expands ``$(VAR)``
references in command and args from the container's env (``DYN_NODE_RANK`` comes from the pod-index
label through the downward API), before any shell runs, so one spelling serves both forms and needs
no shell. Non-leader pods get no probes (they serve nothing; the leader speaks for the group).

Compatibility: a manifest written for NVIDIA Dynamo (``-m dynamo.sglang``) keeps its module unless the
graph (or service) carries the annotation ``nvidia.com/dynamo-worker-module`` naming ours
(``dynamo_worker.sglang``, or ``dynamo_worker.mocker`` to simulate the engine); the same annotation
swaps ``dynamo.frontend`` for ``dynamo_worker.frontend``.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

from dynamo_operator.api import contract

__all__ = [
    "MODULE_ANNOTATION",
    "SGLANG_MODULES",
    "SWAPPABLE_MODULES",
    "SglangArgs",
    "append_flags",
    "argv",
    "ensure_flag",
    "flag_value",
    "for_group_member",
    "is_shell_form",
    "parse_args",
    "swap_module",
]

MODULE_ANNOTATION = "nvidia.com/dynamo-worker-module"
# Modules that run an SGLang engine (or our simulation of one) and take SGLang's flags.
SGLANG_MODULES = (
    contract.SGLANG_MODULE,
    contract.MOCKER_MODULE,
    contract.DYNAMO_SGLANG_MODULE,
    "sglang.launch_server",
)
# Values the module annotation accepts.
SWAPPABLE_MODULES = (contract.SGLANG_MODULE, contract.MOCKER_MODULE)
TP_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size")
PP_FLAGS = ("--pp", "--pp-size", "--pipeline-parallel-size")
DP_FLAGS = ("--dp", "--dp-size", "--data-parallel-size")
_SHELLS = {"sh", "bash", "dash", "ash", "zsh"}
_MODULE_RE = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(m) for m in SGLANG_MODULES) + r")(?:\.[\w.]+)?")


# --- reading ---------------------------------------------------------------------------------------


def _parts(container: dict[str, Any]) -> tuple[list[str], list[str]]:
    return list(container.get("command") or []), list(container.get("args") or [])


def _shell_script_index(full: list[str]) -> int | None:
    """Index of the script in ``sh -c SCRIPT`` form, or None for the exec form."""
    if len(full) >= 3 and os.path.basename(full[0]) in _SHELLS:
        opt = full[1]
        if opt.startswith("-") and not opt.startswith("--") and "c" in opt:
            return 2
    return None


def is_shell_form(container: dict[str, Any]) -> bool:
    command, args = _parts(container)
    return _shell_script_index(command + args) is not None


def argv(container: dict[str, Any]) -> list[str]:
    """The tokens the engine will see: command+args, or the shell script split like a shell would."""
    command, args = _parts(container)
    full = command + args
    index = _shell_script_index(full)
    if index is None:
        return full
    try:
        return shlex.split(full[index], comments=True)
    except ValueError:  # an unbalanced quote: read what can be read
        return full[index].split()


def flag_value(tokens: list[str], *names: str) -> str | None:
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
        bootstrap_port=flag_value(tokens, "--disaggregation-bootstrap-port"),
        host=flag_value(tokens, "--host"),
        tp_given=flag_value(tokens, *TP_FLAGS) is not None,
    )


# --- writing ---------------------------------------------------------------------------------------


def _split_back(container: dict[str, Any], full: list[str], n_command: int) -> dict[str, Any]:
    out = copy.deepcopy(container)
    out["command"] = full[:n_command]
    out["args"] = full[n_command:]
    for key in ("command", "args"):
        if not out[key]:
            del out[key]
    return out


def _end_of_invocation(script: str) -> int:
    """Where the SGLang command in ``script`` ends (before ``&&``, ``;``, ``|``, ``&``, newline)."""
    match = _MODULE_RE.search(script)
    if match is None:
        return len(script.rstrip())
    quote: str | None = None
    depth = 0  # inside $( ... ) or ( ... ) of an argument
    i = match.end()
    while i < len(script):
        ch = script[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch == "\\":
            i += 2  # an escaped character, or a line continuation that keeps the command going
            continue
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth == 0 and (ch in ";|&\n)" or (ch == "#" and script[i - 1].isspace())):
            break
        i += 1
    return len(script[:i].rstrip())


def _insert_into_script(script: str, extra: list[str]) -> str:
    at = _end_of_invocation(script)
    return f"{script[:at]} {shlex.join(extra)}{script[at:]}"


def append_flags(container: dict[str, Any], extra: list[str]) -> dict[str, Any]:
    """The container with ``extra`` added to the SGLang invocation (see the module docstring)."""
    command, args = _parts(container)
    full = command + args
    index = _shell_script_index(full)
    if index is None:
        return _split_back(container, full + list(extra), len(command))
    full[index] = _insert_into_script(full[index], extra)
    return _split_back(container, full, len(command))


def ensure_flag(container: dict[str, Any], name: str, value: str) -> tuple[dict[str, Any], str | None]:
    """The container with ``name value`` set; also the previous value when a different one was replaced."""
    command, args = _parts(container)
    full = command + args
    index = _shell_script_index(full)
    tokens = argv(container)
    previous = flag_value(tokens, name)
    if previous == value:
        return container, None
    if previous is None:
        return append_flags(container, [name, value]), None
    if index is None:
        for i, token in enumerate(full):
            if token == name and i + 1 < len(full) and not full[i + 1].startswith("--"):
                full[i + 1] = value
            elif token == name:
                full.insert(i + 1, value)
            elif token.startswith(name + "="):
                full[i] = f"{name}={value}"
        return _split_back(container, full, len(command)), previous
    pattern = re.compile(re.escape(name) + r"(?:=|\s+)(?:'[^']*'|\"[^\"]*\"|[^\s;&|]+)")
    full[index] = pattern.sub(f"{name} {shlex.quote(value)}", full[index])
    return _split_back(container, full, len(command)), previous


def swap_module(container: dict[str, Any], old: str, new: str) -> tuple[dict[str, Any], bool]:
    """The container running ``-m new`` where it ran ``-m old``; and whether anything changed."""
    command, args = _parts(container)
    full = command + args
    index = _shell_script_index(full)
    changed = False
    if index is None:
        for i in range(1, len(full)):
            if full[i] == old and full[i - 1] == "-m":
                full[i] = new
                changed = True
    else:
        pattern = re.compile(r"(-m\s+)" + re.escape(old) + r"(?![\w.])")
        script, count = pattern.subn(lambda m: m.group(1) + new, full[index])
        full[index] = script
        changed = count > 0
    if not changed:
        return container, False
    return _split_back(container, full, len(command)), True


def for_group_member(
    container: dict[str, Any], *, nnodes: int, leader_host: str, leader: bool
) -> dict[str, Any]:
    """A multinode pod's main container: distributed-init flags added, probes only on the leader."""
    rank = "0" if leader else f"$({contract.ENV_NODE_RANK})"
    flags = [
        "--dist-init-addr",
        f"{leader_host}:{contract.DIST_INIT_PORT}",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        rank,
    ]
    out = append_flags(container, flags)
    if not leader:
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            out.pop(probe, None)
    return out
