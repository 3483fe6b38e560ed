"""Which module runs which role of a graph, and NVIDIA Dynamo's names for them: the engine-swap table.

Declared once; every place that puts one module in place of another reads it, so they cannot drift:

- what a service runs when its manifest sets no command (``DEFAULT_COMMANDS``: the operator, dynamo-run);
- the runtime image's ``dynamo`` package (``dynamo_worker.aliases``): ``python3 -m dynamo.X`` runs our
  counterpart (``DYNAMO_ALIASES``), and ``dynamo.sglang`` the engine ``DYN_SGLANG_ENGINE`` names
  (``ENGINES``);
- the module annotation (``annotations.MODULE_ANNOTATION``, rendered by the operator): a worker's
  ``dynamo.sglang`` becomes the engine module the annotation names (one of ``ENGINES``' modules), a
  frontend's ``dynamo.frontend`` ours;
- dynamo-run (``dynamo_worker.local.plan``): a pod's module plays the role ``role()`` says, and its engine
  runs as the module of ``--engine`` (``ENGINES``), the mocker's pods as the mocker.

Which modules take SGLang's flags is a flag fact (``sglang_args.SGLANG_MODULES``), built from these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = [
    "DEFAULT_COMMANDS",
    "DYNAMO_ALIASES",
    "DYNAMO_FRONTEND_MODULE",
    "DYNAMO_MOCKER_MODULE",
    "DYNAMO_PLANNER_MODULE",
    "DYNAMO_SGLANG_MODULE",
    "ENGINES",
    "EPP_MODULE",
    "FRONTEND_MODULE",
    "MOCKER_MODULE",
    "PLANNER_MODULE",
    "ROLES",
    "SGLANG_MODULE",
    "Role",
    "ours",
    "role",
]

Role = Literal["frontend", "engine", "planner"]

# --- ours ---------------------------------------------------------------------------------------
FRONTEND_MODULE: Final = "dynamo_worker.frontend"
SGLANG_MODULE: Final = "dynamo_worker.sglang"
MOCKER_MODULE: Final = "dynamo_worker.mocker"  # a simulated SGLang engine: same flags, same protocol
PLANNER_MODULE: Final = "dynamo_worker.planner"
EPP_MODULE: Final = "dynamo_worker.epp"  # a gateway's endpoint picker (componentType epp)
ROLES: Final[Mapping[str, Role]] = {
    FRONTEND_MODULE: "frontend",
    SGLANG_MODULE: "engine",
    MOCKER_MODULE: "engine",
    PLANNER_MODULE: "planner",
}

# --- NVIDIA Dynamo's module names, as found in manifests written for Dynamo's operator ------------
DYNAMO_FRONTEND_MODULE: Final = "dynamo.frontend"
DYNAMO_SGLANG_MODULE: Final = "dynamo.sglang"
DYNAMO_MOCKER_MODULE: Final = "dynamo.mocker"
DYNAMO_PLANNER_MODULE: Final = "dynamo.planner"
# Each runs ours in its place, with the same arguments.
DYNAMO_ALIASES: Final[Mapping[str, str]] = {
    DYNAMO_FRONTEND_MODULE: FRONTEND_MODULE,
    DYNAMO_SGLANG_MODULE: SGLANG_MODULE,
    DYNAMO_MOCKER_MODULE: MOCKER_MODULE,
    DYNAMO_PLANNER_MODULE: PLANNER_MODULE,
}

# --- engines ------------------------------------------------------------------------------------
# An engine's name (dynamo-run's --engine, DYN_SGLANG_ENGINE) -> the module that runs it. The module
# annotation accepts these modules.
ENGINES: Final[Mapping[str, str]] = {"sglang": SGLANG_MODULE, "mocker": MOCKER_MODULE}

# What a service runs when its extraPodSpec.mainContainer sets no command (its args are appended).
DEFAULT_COMMANDS: Final[Mapping[str, tuple[str, ...]]] = {
    "frontend": ("python3", "-m", FRONTEND_MODULE),
    "worker": ("python3", "-m", SGLANG_MODULE),
    "epp": ("python3", "-m", EPP_MODULE),
}


def ours(module: str | None) -> str | None:
    """The module of ours that runs for ``module``: itself, or the counterpart of NVIDIA Dynamo's; None
    for any other module."""
    if module in ROLES:
        return module
    return DYNAMO_ALIASES.get(module or "")


def role(module: str | None) -> Role | None:
    """The role ``module`` (ours or NVIDIA Dynamo's) plays in a graph; None for any other module."""
    found = ours(module)
    return ROLES[found] if found is not None else None
