"""Classify each entry of ``spec.services``: frontend, SGLang worker (agg/prefill/decode), endpoint picker
(epp) or generic. Pure.

Shared by the operator's validation and rendering and by dynamo-run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dynamo_api import modules
from dynamo_api.models import DynamoGraphDeployment, ServiceSpec
from dynamo_api.sglang_args import SglangArgs, parse_args

__all__ = [
    "WORKER_TYPES",
    "Component",
    "components",
]

Kind = Literal["frontend", "worker", "epp", "generic"]
Role = Literal["agg", "prefill", "decode", "encode", "diffusion"]
MULTIMODAL_ROLES = ("encode", "diffusion")  # workers started with --role encode|diffusion
WORKER_TYPES = ("worker", "prefill", "decode")


@dataclass(frozen=True)
class Component:
    name: str  # the key in spec.services, as written (e.g. "Frontend")
    spec: ServiceSpec
    component_type: str  # as written; "" when unset
    kind: Kind | None  # None: componentType unset
    role: Role | None  # workers only
    user_container: dict[str, Any]  # extraPodSpec.mainContainer as given (Kubernetes spelling)
    command_view: dict[str, Any]  # {command, args} the main container will run, before mutations

    @property
    def path(self) -> str:
        return f"spec.services.{self.name}"

    @property
    def args(self) -> SglangArgs:
        return parse_args(self.command_view)


def _kind(component_type: str | None) -> Kind | None:
    if component_type is None:
        return None
    if component_type == "frontend":
        return "frontend"
    if component_type == "epp":
        return "epp"
    if component_type in WORKER_TYPES:
        return "worker"
    return "generic"


def _role(spec: ServiceSpec, view: dict[str, Any]) -> Role:
    if spec.component_type in ("prefill", "decode"):
        return spec.component_type
    if spec.sub_component_type is not None:
        return spec.sub_component_type
    args = parse_args(view)
    if args.worker_role in MULTIMODAL_ROLES:
        return args.worker_role  # type: ignore[return-value]
    mode = args.disaggregation_mode
    if mode in ("prefill", "decode"):
        return mode  # type: ignore[return-value]
    return "agg"


def components(dgd: DynamoGraphDeployment) -> list[Component]:
    """The services of ``dgd`` sorted by name, classified."""
    out = []
    for name in sorted(dgd.spec.services):
        spec = dgd.spec.services[name]
        kind = _kind(spec.component_type)
        main = spec.extra_pod_spec.main_container if spec.extra_pod_spec else None
        user = main.model_dump(by_alias=True, exclude_none=True) if main else {}
        default = modules.DEFAULT_COMMANDS.get(kind or "")
        command = user.get("command") or (list(default) if default else [])
        view = {"command": list(command), "args": list(user.get("args") or [])}
        out.append(
            Component(
                name=name,
                spec=spec,
                component_type=spec.component_type or "",
                kind=kind,
                role=_role(spec, view) if kind == "worker" else None,
                user_container=user,
                command_view=view,
            )
        )
    return out
