"""SGLang backend rules: edit the flags of a container dict (a Kubernetes Container). Pure.

More: docs/module-notes.md (dynamo_operator.backends.sglang)."""

from __future__ import annotations

import copy
import json
import re
import shlex
from typing import Any

from dynamo_api import contract
from dynamo_api.sglang_args import (
    SGLANG_MODULES,
    argv,
    command_parts,
    flag_value,
    shell_script_index,
)

__all__ = [
    "append_flags",
    "ensure_flag",
    "for_group_member",
    "kv_events_config",
    "kv_events_port_name",
    "swap_module",
    "wire_kv_events",
]

_MODULE_RE = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(m) for m in SGLANG_MODULES) + r")(?:\.[\w.]+)?")


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
    command, args = command_parts(container)
    full = command + args
    index = shell_script_index(full)
    if index is None:
        return _split_back(container, full + list(extra), len(command))
    full[index] = _insert_into_script(full[index], extra)
    return _split_back(container, full, len(command))


def ensure_flag(container: dict[str, Any], name: str, value: str) -> tuple[dict[str, Any], str | None]:
    """The container with ``name value`` set; also the previous value when a different one was replaced."""
    command, args = command_parts(container)
    full = command + args
    index = shell_script_index(full)
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
    command, args = command_parts(container)
    full = command + args
    index = shell_script_index(full)
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


def kv_events_config(port: int = contract.KV_EVENTS_PORT) -> str:
    """The ``--kv-events-config`` value the operator sets: a ZMQ publisher on all interfaces."""
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}"}, separators=(",", ":"))


def kv_events_port_name(rank: int) -> str:
    return contract.KV_EVENTS_PORT_NAME if rank == 0 else f"{contract.KV_EVENTS_PORT_NAME}-dp{rank}"


def _publisher_port(config: str) -> tuple[bool, int | None, str | None]:
    """(publishes, tcp port, why not) of a ``--kv-events-config`` value."""
    try:
        parsed = json.loads(config)
    except json.JSONDecodeError as e:
        return False, None, f"is not JSON ({e.msg})"
    if not isinstance(parsed, dict):
        return False, None, "is not a JSON object"
    publisher = parsed.get("publisher", "null")
    if publisher != "zmq":
        return False, None, f'sets "publisher": {json.dumps(publisher)}, which publishes nothing'
    endpoint = str(parsed.get("endpoint") or f"tcp://*:{contract.KV_EVENTS_PORT}")
    if endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[-1].isdigit():
        return True, int(endpoint.rsplit(":", 1)[-1]), None
    return True, None, None


def wire_kv_events(container: dict[str, Any], dp_size: int) -> tuple[dict[str, Any], str | None]:
    """The container of an SGLang worker whose frontend routes on KV: with a KV events publisher of
    its own and its port(s) declared. Also, when the manifest's own ``--kv-events-config`` publishes
    nothing, why (for a warning)."""
    given = flag_value(argv(container), contract.KV_EVENTS_FLAG)
    if given is None:
        out = append_flags(container, [contract.KV_EVENTS_FLAG, kv_events_config()])
        port: int | None = contract.KV_EVENTS_PORT
        problem = None
    else:
        out = container
        publishes, port, problem = _publisher_port(given)
        if publishes:
            problem = None
    if port is None:
        return out, problem
    out = copy.deepcopy(out) if out is container else out
    ports = out.setdefault("ports", [])
    taken = {p.get("name") for p in ports} | {p.get("containerPort") for p in ports}
    for rank in range(max(dp_size, 1)):
        name = kv_events_port_name(rank)
        if name in taken or port + rank in taken:
            continue
        ports.append({"name": name, "containerPort": port + rank, "protocol": "TCP"})
    return out, problem
