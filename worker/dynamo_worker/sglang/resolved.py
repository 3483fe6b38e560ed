"""What the worker reads of SGLang's ``ServerArgs`` once the engine runs, through one function.

Up to SGLang 0.5.17 the engine resolves ``ServerArgs`` in its constructor and the fields hold the
resolved values. From 0.5.19 the fields keep the raw command line (``served_model_name`` stays None
when the flag was not given, ``page_size`` is what was passed, not an MLA model's 64 or 128) and the
resolved values are what ``resolved_dict()`` returns once the engine started. ``server_args_values``
reads the one or the other; ``resolve`` (pure) turns those values into ``ResolvedArgs``.

Data parallelism has two spellings: ``--dp-size N --enable-dp-attention`` (N attention-dp ranks; the
only one up to 0.5.21, deprecated after) and ``--attn-dp-size N`` (0.5.22+, next to ``--dp-size M`` for
M replicas; one of the two is 1). Either way the engine runs ``dp_size x attn_dp_size`` schedulers,
each with its own KV cache and KV event publisher: ``ResolvedArgs.dp_ranks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynamo_worker.sglang.uses import OPTIONAL_RESOLVED_FIELDS, RESOLVED_FIELDS

__all__ = ["ResolvedArgs", "resolve", "resolved_args", "server_args_values"]


@dataclass(frozen=True)
class ResolvedArgs:
    """The resolved ``ServerArgs`` values the worker uses after start."""

    model_path: str
    served_model_name: str
    tokenizer_path: str
    page_size: int
    dp_size: int  # data-parallel replicas
    attn_dp_size: int  # attention data-parallel ranks inside one replica
    disaggregation_mode: str
    disaggregation_bootstrap_port: int
    host: str
    kv_events_config: str | None

    @property
    def dp_ranks(self) -> int:
        """Schedulers, each with its own KV cache and KV event publisher: what discovery reports as
        the worker's dp size and how many ZMQ endpoints carry its KV events."""
        return self.dp_size * self.attn_dp_size


def server_args_values(server_args: Any) -> dict[str, Any]:
    """The resolved values of ``server_args``: ``resolved_dict()`` where SGLang has it, else the
    fields we read (``uses.RESOLVED_FIELDS`` and, where they exist, ``OPTIONAL_RESOLVED_FIELDS``)."""
    resolved_dict = getattr(server_args, "resolved_dict", None)
    if callable(resolved_dict):
        return dict(resolved_dict())
    names = [*RESOLVED_FIELDS, *(n for n in OPTIONAL_RESOLVED_FIELDS if hasattr(server_args, n))]
    return {name: getattr(server_args, name) for name in names}


def resolve(values: Mapping[str, Any]) -> ResolvedArgs:
    """``ResolvedArgs`` from resolved ``ServerArgs`` values (see the module docstring)."""
    dp = int(values.get("dp_size") or 1)
    if values.get("attn_dp_size") is not None:  # 0.5.22+: both widths are fields of their own
        attn = int(values["attn_dp_size"])
    elif values.get("enable_dp_attention"):  # the old spelling: dp_size counts attention-dp ranks
        dp, attn = 1, dp
    else:
        attn = 1
    model_path = str(values["model_path"])
    return ResolvedArgs(
        model_path=model_path,
        served_model_name=str(values.get("served_model_name") or model_path),
        tokenizer_path=str(values.get("tokenizer_path") or model_path),
        page_size=int(values.get("page_size") or 1),
        dp_size=dp,
        attn_dp_size=attn,
        disaggregation_mode=str(values.get("disaggregation_mode") or "null"),
        disaggregation_bootstrap_port=int(values.get("disaggregation_bootstrap_port") or 0),
        host=str(values.get("host") or "127.0.0.1"),
        kv_events_config=values.get("kv_events_config"),
    )


def resolved_args(server_args: Any) -> ResolvedArgs:
    """``resolve(server_args_values(server_args))``: the one way the worker reads ``ServerArgs``
    after the engine started."""
    return resolve(server_args_values(server_args))
