"""NVIDIA Dynamo's module names run this project's modules, so Dynamo's manifests run unchanged.

Pods of a manifest written for NVIDIA Dynamo run ``python3 -m dynamo.sglang ...`` (workers; the
operator of either project runs ``python3 -m dynamo.frontend`` for a frontend with no command). The
runtime image installs a small ``dynamo`` package (``images/runtime/dynamo-compat``) whose modules
call ``main`` here, which replaces the process with ours, same arguments, same PID:

- ``dynamo.frontend`` -> ``dynamo_worker.frontend`` (it warns about and ignores flags of Dynamo's
  frontend it does not have);
- ``dynamo.mocker`` -> ``dynamo_worker.mocker``;
- ``dynamo.planner`` -> ``dynamo_worker.planner`` (it reads Dynamo's ``--config`` JSON and names the
  fields it does not act on in an Event);
- ``dynamo.sglang`` -> ``dynamo_worker.sglang``, or ``dynamo_worker.mocker`` where
  ``DYN_SGLANG_ENGINE=mocker``: the CPU image sets it, since it has no SGLang to run (a pod may set
  ``DYN_SGLANG_ENGINE=sglang`` to get the real worker's "SGLang is not installed" error instead).

The table is ``dynamo_api.modules`` (``DYNAMO_ALIASES``, ``ENGINES``), which the operator's module
annotation and dynamo-run read too. The ``dynamo`` package is not part of the ``dynamo-sglang`` wheel:
installed next to NVIDIA's ``ai-dynamo``, which owns that name, it would shadow it. ``resolve`` is pure;
``main`` execs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo_api import contract, modules
from dynamo_api.errors import DynamoError

from dynamo_worker.runtime.settings import configure_logging

__all__ = ["ALIASES", "ENGINES", "Alias", "AliasError", "main", "resolve"]

log = logging.getLogger(__name__)

ENGINES: tuple[str, ...] = tuple(modules.ENGINES)
ALIASES = modules.DYNAMO_ALIASES


class AliasError(DynamoError, ValueError):
    """A Dynamo module name or ``DYN_SGLANG_ENGINE`` value this image cannot run; says what can."""


@dataclass(frozen=True)
class Alias:
    dynamo_module: str
    module: str  # ours, run with the same arguments
    reason: str  # one line for the log


def resolve(dynamo_module: str, env: Mapping[str, str]) -> Alias:
    """Which of our modules runs in place of ``dynamo_module``, given the process environment."""
    if dynamo_module not in ALIASES:
        raise AliasError(
            f"{dynamo_module} is NVIDIA Dynamo's and this image has no counterpart; it runs "
            f"{', '.join(sorted(ALIASES))}: give the service one of them or a Dynamo image"
        )
    module = ALIASES[dynamo_module]
    reason = "this image's counterpart"
    if dynamo_module == modules.DYNAMO_SGLANG_MODULE:
        engine = env.get(contract.ENV_SGLANG_ENGINE, "").strip() or "sglang"
        if engine not in ENGINES:
            raise AliasError(
                f"{contract.ENV_SGLANG_ENGINE}={engine!r} is not an engine; set it to one of "
                f"{', '.join(ENGINES)} (or unset it for sglang)"
            )
        module = modules.ENGINES[engine]
        if module == modules.MOCKER_MODULE:
            reason = (
                f"{contract.ENV_SGLANG_ENGINE}=mocker, a simulated engine that loads no model; the CPU "
                "image sets it, the CUDA image serves real models"
            )
    return Alias(dynamo_module=dynamo_module, module=module, reason=reason)


def main(dynamo_module: str, argv: Sequence[str] | None = None) -> int:
    """Run our module in place of ``dynamo_module`` (``os.execv``: same PID, signals reach it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    try:
        alias = resolve(dynamo_module, os.environ)
    except AliasError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.info("Running -m %s in place of -m %s (%s)", alias.module, alias.dynamo_module, alias.reason)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execv(sys.executable, [sys.executable, "-m", alias.module, *argv])
    return 1  # not reached: execv returns only by raising OSError
