"""What the operator reads of a frontend's command line and environment: its router mode (and an
endpoint picker's, which decides for the frontends behind it). Pure.

The frontend's settings (``dynamo_worker.frontend.settings``) declare ``--router-mode`` with the type,
default and variable below and read it through ``settings_sources`` (the flag, else the variable unless
empty, else the default). ``router_mode`` reads a frontend's rendered command and env by the same rule,
so the operator wires KV events exactly where the frontend will route on them. A graph's endpoint picker
(``dynamo_worker.epp``) routes for its frontends, which then run ``--router-mode direct``:
``picker_router_mode`` reads its flag the same way (it reads no variable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

from dynamo_api import contract
from dynamo_api.settings_sources import env_value
from dynamo_api.sglang_args import flag_value

__all__ = [
    "DEFAULT_PICKER_ROUTER_MODE",
    "DEFAULT_ROUTER_MODE",
    "PickerRouterMode",
    "RouterMode",
    "picker_router_mode",
    "router_mode",
]

RouterMode = Literal["round-robin", "random", "kv", "direct"]
DEFAULT_ROUTER_MODE: Final[RouterMode] = "round-robin"
PickerRouterMode = Literal["kv", "round-robin", "random"]
DEFAULT_PICKER_ROUTER_MODE: Final[PickerRouterMode] = "kv"


def router_mode(tokens: Sequence[str], env: Mapping[str, str | None]) -> str:
    """The router mode of a frontend started with the command line ``tokens`` and the environment
    ``env``: the last ``--router-mode`` given, else ``DYN_ROUTER_MODE`` unless unset or empty, else the
    default. A value the frontend would refuse is returned as it is; a flag abbreviated the way argparse
    would accept (``--router-m``) is not read: manifests spell flags out."""
    given = flag_value(tokens, contract.ROUTER_MODE_FLAG)
    if given is not None:
        return given
    return env_value(env, [contract.ENV_ROUTER_MODE]) or DEFAULT_ROUTER_MODE


def picker_router_mode(tokens: Sequence[str]) -> str:
    """The router mode of an endpoint picker started with the command line ``tokens``: the last
    ``--router-mode`` given, else the picker's default (kv)."""
    return flag_value(tokens, contract.ROUTER_MODE_FLAG) or DEFAULT_PICKER_ROUTER_MODE
