"""Conversion of ``DynamoGraphDeployment`` between ``nvidia.com/v1alpha1`` and ``nvidia.com/v1beta1``.

More: docs/module-notes.md (dynamo_api.conversion)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from dynamo_api import models, v1beta1
from dynamo_api.errors import DynamoError

__all__ = [
    "ALPHA_FIELDS_ANNOTATION",
    "BETA_FIELDS_ANNOTATION",
    "ConversionError",
    "convert",
    "load_graph",
    "to_v1alpha1",
    "to_v1beta1",
]

ALPHA_FIELDS_ANNOTATION = "nvidia.com/dgd-v1alpha1-fields"
BETA_FIELDS_ANNOTATION = "nvidia.com/dgd-v1beta1-fields"
SERVED = (v1beta1.API_VERSION, models.API_VERSION)
GPU_RESOURCE = "nvidia.com/gpu"

# Fields of one version that the other has no place for (restored on the way back, always).
_ALPHA_ONLY_SPEC = ("pvcs", "dynamoGraph")
_ALPHA_ONLY_SERVICE = (
    "volumeMounts",
    "annotations",
    "labels",
    "serviceName",
    "dynamoNamespace",
    "autoscaling",
    "ingress",
    "pvc",
)
_BETA_ONLY_SPEC = ("restart", "experimental", "providerOverride")
# Graph fields both versions have, the same way.
_SAME_SPEC = ("annotations", "labels", "priorityClassName", "topologyConstraint")
_BETA_ONLY_COMPONENT = (
    "runtimeVersionOverride",
    "minAvailable",
    "roles",
    "frontendSidecar",
    "dynamoSidecar",
    "compilationCache",
    "experimental",
    "providerOverride",
)
# v1alpha1's service-level gpuMemoryService is v1beta1's experimental.gpuMemoryService.
_EXPERIMENTAL = "experimental"
_GMS = "gpuMemoryService"
_BETA_TYPES = ("frontend", "worker", "prefill", "decode", "planner", "epp")
_SPLIT_TYPES = ("prefill", "decode")


class ConversionError(DynamoError, ValueError):
    """The object cannot be converted; the message names the field and the fix."""


# --- helpers ----------------------------------------------------------------------------------------


def _normal(model: type[models._Model], data: Any) -> Any:
    """``data`` as the API server would store it (defaults filled, unknown fields pruned)."""
    try:
        return model.model_validate(data).model_dump(by_alias=True, exclude_none=True, mode="json")
    except ValidationError:
        return data


def _fingerprint(model: type[models._Model], data: Any) -> str:
    text = json.dumps(_normal(model, data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _pop_record(meta: dict[str, Any], key: str) -> dict[str, Any]:
    annotations = meta.get("annotations") or {}
    raw = annotations.pop(key, None)
    if raw is None:
        return {}
    try:
        record = json.loads(raw)
    except ValueError:
        return {}  # not ours to read (hand-edited): the mapping alone decides
    return record if isinstance(record, dict) else {}


def _put_record(meta: dict[str, Any], key: str, record: dict[str, Any]) -> None:
    annotations = meta.setdefault("annotations", {})
    if record:
        annotations[key] = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if not annotations:
        meta.pop("annotations", None)


def _strip_records(meta: dict[str, Any]) -> None:
    annotations = meta.get("annotations") or {}
    for key in (ALPHA_FIELDS_ANNOTATION, BETA_FIELDS_ANNOTATION):
        annotations.pop(key, None)
    if "annotations" in meta and not annotations:
        meta.pop("annotations")


# --- resources ---------------------------------------------------------------------------------------


def _resource_list_to_k8s(item: dict[str, Any] | None) -> dict[str, Any]:
    if not item:
        return {}
    out: dict[str, Any] = {}
    for key in ("cpu", "memory"):
        if item.get(key) is not None:
            out[key] = item[key]
    if item.get("gpu") is not None:
        out[item.get("gpuType") or GPU_RESOURCE] = item["gpu"]
    out.update(item.get("custom") or {})
    return out


def _resource_list_from_k8s(values: dict[str, Any] | None) -> dict[str, Any]:
    item: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    for key, value in (values or {}).items():
        if key in ("cpu", "memory"):
            item[key] = value
        elif key == GPU_RESOURCE:
            item["gpu"] = value
        else:
            custom[key] = value
    if custom:
        item["custom"] = custom
    return item


def _resources_to_k8s(res: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("requests", "limits"):
        values = _resource_list_to_k8s((res or {}).get(key))
        if values:
            out[key] = values
    if (res or {}).get("claims"):
        out["claims"] = copy.deepcopy(res["claims"])  # type: ignore[index]
    return out


def _resources_from_k8s(res: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("requests", "limits"):
        if (res or {}).get(key) is not None:
            out[key] = _resource_list_from_k8s(res[key])  # type: ignore[index]
    if (res or {}).get("claims"):
        out["claims"] = copy.deepcopy(res["claims"])  # type: ignore[index]
    return out


# --- one component -----------------------------------------------------------------------------------
#
# The two mappings mirror each other block by block: the type, the fields both versions have, shared
# memory, the scaling adapter, then the pod (metadata, and the main container: env, envFrom, resources,
# probes).

_SAME_FIELDS = (
    "replicas",
    "multinode",
    "modelRef",
    "globalDynamoNamespace",
    "topologyConstraint",
    "eppConfig",
)
_PROBES = ("livenessProbe", "readinessProbe")


def _copy_set(src: dict[str, Any], dst: dict[str, Any], keys: tuple[str, ...], *, pop: bool = False) -> None:
    """``dst[k] = src[k]`` for each of ``keys`` set (not ``None``) in ``src``; ``pop``: and remove it."""
    for key in keys:
        if src.get(key) is not None:
            dst[key] = src.pop(key) if pop else src[key]


def _pod_metadata(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The pod metadata both versions carry: annotations and labels."""
    meta = meta or {}
    return {k: meta[k] for k in ("annotations", "labels") if meta.get(k)}


def _beta_type(ctype: Any, sub: Any) -> dict[str, Any]:
    """v1alpha1's componentType (+ subComponentType of a worker) as v1beta1's type; none outside its enum."""
    if ctype == "worker" and sub in _SPLIT_TYPES:
        return {"type": sub}
    return {"type": ctype} if ctype in _BETA_TYPES else {}


def _alpha_type(ctype: Any) -> dict[str, Any]:
    """v1beta1's type as v1alpha1's componentType (+ subComponentType for prefill and decode)."""
    if ctype in _SPLIT_TYPES:
        return {"componentType": "worker", "subComponentType": ctype}
    return {"componentType": ctype} if ctype is not None else {}


def _shm_size(shm: dict[str, Any] | None) -> dict[str, Any]:
    """v1alpha1's sharedMemory as v1beta1's sharedMemorySize ("0": disabled)."""
    shm = shm or {}
    if shm.get("disabled"):
        return {"sharedMemorySize": "0"}
    return {"sharedMemorySize": shm["size"]} if shm.get("size") is not None else {}


def _shm(size: Any) -> dict[str, Any]:
    """v1beta1's sharedMemorySize as v1alpha1's sharedMemory."""
    if size is None:
        return {}
    return {"sharedMemory": {"disabled": True} if str(size) == "0" else {"size": size}}


def _beta_adapter(adapter: dict[str, Any] | None) -> dict[str, Any]:
    """v1alpha1's scalingAdapter {enabled: true} as v1beta1's (present: enabled)."""
    return {"scalingAdapter": {}} if (adapter or {}).get("enabled") else {}


def _alpha_adapter(adapter: Any) -> dict[str, Any]:
    """v1beta1's scalingAdapter (present, and not enabled: false) as v1alpha1's."""
    enabled = isinstance(adapter, dict) and adapter.get("enabled") is not False
    return {"scalingAdapter": {"enabled": True}} if enabled else {}


def _compilation_cache(mounts: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The first volume mount used as compilation cache, as v1beta1's compilationCache."""
    for mount in mounts or []:
        if mount.get("useAsCompilationCache"):
            cache = {"pvcName": mount.get("name"), "mountPath": mount.get("mountPoint")}
            return {"compilationCache": {k: v for k, v in cache.items() if v is not None}}
    return {}


def _main_container(svc: dict[str, Any], main: dict[str, Any]) -> dict[str, Any]:
    """v1beta1's main container: v1alpha1's mainContainer with the service's env (before the
    container's own), envFromSecret (first), resources and probes."""
    main.pop("name", None)
    container: dict[str, Any] = {"name": v1beta1.MAIN_CONTAINER, **main}
    env = [*(svc.get("envs") or []), *(main.get("env") or [])]
    container.pop("env", None)
    if env:
        container["env"] = env
    if svc.get("envFromSecret"):
        container["envFrom"] = [{"secretRef": {"name": svc["envFromSecret"]}}, *(main.get("envFrom") or [])]
    resources = {**(main.get("resources") or {}), **_resources_to_k8s(svc.get("resources"))}
    if resources:
        container["resources"] = resources
    _copy_set(svc, container, _PROBES)
    return container


def _just_a_secret(env_from: dict[str, Any]) -> bool:
    """Whether an envFrom entry is just ``{secretRef: {name}}``: what v1alpha1's envFromSecret says."""
    return set(env_from) == {"secretRef"} and set(env_from["secretRef"] or {}) == {"name"}


def _main_to_service(main: dict[str, Any], svc: dict[str, Any]) -> dict[str, Any]:
    """Move what v1alpha1 has fields for (env, envFromSecret, resources, probes) from v1beta1's main
    container into ``svc``; what is left is v1alpha1's mainContainer."""
    main = {k: v for k, v in main.items() if k != "name"}
    if main.get("env"):
        svc["envs"] = main.pop("env")
    env_from = main.pop("envFrom", None) or []
    if env_from and _just_a_secret(env_from[0]):
        svc["envFromSecret"] = env_from[0]["secretRef"]["name"]
        env_from = env_from[1:]
    if env_from:
        main["envFrom"] = env_from
    if main.get("resources") is not None:
        svc["resources"] = _resources_from_k8s(main.pop("resources"))
    _copy_set(main, svc, _PROBES, pop=True)
    return {k: v for k, v in main.items() if v is not None}


def _service_to_component(name: str, svc: dict[str, Any]) -> dict[str, Any]:
    """The mapping from a v1alpha1 service to a v1beta1 component (no annotations involved)."""
    svc = copy.deepcopy(svc)
    comp: dict[str, Any] = {"name": name, **_beta_type(svc.get("componentType"), svc.get("subComponentType"))}
    _copy_set(svc, comp, _SAME_FIELDS)
    comp.update(_shm_size(svc.get("sharedMemory")))
    comp.update(_beta_adapter(svc.get("scalingAdapter")))
    comp.update(_compilation_cache(svc.get("volumeMounts")))
    if svc.get(_GMS) is not None:
        comp[_EXPERIMENTAL] = {_GMS: svc[_GMS]}

    spec = dict(svc.get("extraPodSpec") or {})
    main = dict(spec.pop("mainContainer", None) or {})
    spec["containers"] = [_main_container(svc, main), *(spec.get("containers") or [])]
    template: dict[str, Any] = {"spec": spec}
    meta = _pod_metadata(svc.get("extraPodMetadata"))
    if meta:
        template["metadata"] = meta
    comp["podTemplate"] = template
    return comp


def _main_and_others(containers: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """v1beta1's main container (``None``: none), and the pod's other containers."""
    main = next((c for c in containers if c.get("name") == v1beta1.MAIN_CONTAINER), None)
    return main, [c for c in containers if c is not main]


def _component_to_service(comp: dict[str, Any]) -> dict[str, Any]:
    """The mapping from a v1beta1 component to a v1alpha1 service (no annotations involved)."""
    comp = copy.deepcopy(comp)
    svc: dict[str, Any] = _alpha_type(comp.get("type"))
    _copy_set(comp, svc, _SAME_FIELDS)
    svc.update(_alpha_adapter(comp.get("scalingAdapter")))
    svc.update(_shm(comp.get("sharedMemorySize")))
    if isinstance(comp.get(_EXPERIMENTAL), dict) and comp[_EXPERIMENTAL].get(_GMS) is not None:
        svc[_GMS] = comp[_EXPERIMENTAL][_GMS]

    template = comp.get("podTemplate") or {}
    meta = _pod_metadata(template.get("metadata"))
    if meta:
        svc["extraPodMetadata"] = meta
    spec = dict(template.get("spec") or {})
    main, others = _main_and_others(spec.pop("containers", None) or [])
    if others:
        spec["containers"] = others
    main = _main_to_service(main, svc) if main is not None else {}
    if main:
        spec["mainContainer"] = main
    if spec:
        svc["extraPodSpec"] = spec
    return svc


# --- what one version keeps of the other -------------------------------------------------------------


def _alpha_only(svc: dict[str, Any], _regenerated: dict[str, Any]) -> dict[str, Any]:
    """A v1alpha1 service's fields v1beta1 has no place for (a componentType outside its enum too)."""
    keep = {k: svc[k] for k in _ALPHA_ONLY_SERVICE if svc.get(k) is not None}
    ctype, sub = svc.get("componentType"), svc.get("subComponentType")
    if ctype is not None and ctype not in _BETA_TYPES:
        keep["componentType"] = ctype
    if sub is not None and ctype != "worker":
        keep["subComponentType"] = sub
    return keep


def _beta_only(comp: dict[str, Any], regenerated: dict[str, Any]) -> dict[str, Any]:
    """A v1beta1 component's fields v1alpha1 has no place for, unless the mapping back makes them
    again (``regenerated``: e.g. compilationCache from a volume mount); of ``experimental``, the entries
    other than gpuMemoryService (which v1alpha1 has)."""
    keep = {
        k: comp[k] for k in _BETA_ONLY_COMPONENT if comp.get(k) is not None and regenerated.get(k) != comp[k]
    }
    if isinstance(keep.get(_EXPERIMENTAL), dict):
        rest = {k: v for k, v in keep[_EXPERIMENTAL].items() if k != _GMS}
        keep.pop(_EXPERIMENTAL)
        if rest:
            keep[_EXPERIMENTAL] = rest
    return keep


def _restore(converted: dict[str, Any], keep: dict[str, Any]) -> None:
    """Put the fields an earlier conversion kept back on ``converted``; ``experimental`` entries join
    the gpuMemoryService the mapping made."""
    for key, value in keep.items():
        made = converted.get(key)
        if key == _EXPERIMENTAL and isinstance(made, dict) and isinstance(value, dict):
            converted[key] = {**value, **made}
        else:
            converted[key] = value


@dataclass(frozen=True)
class _Version:
    """One served version, as converting from or into it needs it."""

    api_version: str
    part: str  # what a service or component is called in the records: "service" | "component"
    parts: str  # where the spec holds them: "services" (a map) | "components" (a list)
    model: type[models._Model]  # of one part
    env: str  # the graph's env: "envs" | "env"
    only_spec: tuple[str, ...]  # graph fields only this version has
    # The annotation that keeps this version's fields on an object of the other version.
    annotation: str
    # The mapping of the other version's part (with its name) into this version's.
    to_part: Callable[[str, dict[str, Any]], dict[str, Any]]
    # A part's fields the other version has no place for, given what the mapping back makes of it.
    only_part: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


_ALPHA = _Version(
    api_version=models.API_VERSION,
    part="service",
    parts="services",
    model=models.ServiceSpec,
    env="envs",
    only_spec=_ALPHA_ONLY_SPEC,
    annotation=ALPHA_FIELDS_ANNOTATION,
    to_part=lambda _name, comp: _component_to_service(comp),
    only_part=_alpha_only,
)
_BETA = _Version(
    api_version=v1beta1.API_VERSION,
    part="component",
    parts="components",
    model=v1beta1.ComponentSpec,
    env="env",
    only_spec=_BETA_ONLY_SPEC,
    annotation=BETA_FIELDS_ANNOTATION,
    to_part=_service_to_component,
    only_part=_beta_only,
)


def _convert_part(
    name: str, part: dict[str, Any], saved: dict[str, Any], source: _Version, target: _Version
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One service or component of ``source`` in ``target``, and the record that brings it back.

    ``saved`` is the record an earlier conversion left: the original (restored when ``part`` is what
    that original was converted to), or the fields ``target`` alone has (restored whatever else
    changed)."""
    converted = target.to_part(name, part)
    if saved.get(target.part) and saved.get("fingerprint") == _fingerprint(source.model, part):
        converted = saved[target.part]
    else:
        _restore(converted, saved.get("keep") or {})
    regenerated = source.to_part(name, converted)
    keep = source.only_part(part, regenerated)
    record: dict[str, Any] = {"keep": keep} if keep else {}
    if _normal(source.model, {**regenerated, **keep}) != _normal(source.model, part):
        record[source.part] = part  # the mapping is not one-to-one here: keep the original
        record["fingerprint"] = _fingerprint(target.model, converted)
    return converted, record


def _convert_parts(
    parts: list[tuple[str, dict[str, Any]]], restore: dict[str, Any], source: _Version, target: _Version
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Every part, converted, and the records of those that need one (by name)."""
    saved: dict[str, Any] = restore.get(target.parts) or {}
    converted, records = [], {}
    for name, part in parts:
        new, record = _convert_part(name, part, saved.get(name) or {}, source, target)
        converted.append((name, new))
        if record:
            records[name] = record
    return converted, records


# --- whole objects -----------------------------------------------------------------------------------


def _open(
    obj: dict[str, Any], source: _Version, target: _Version
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A copy of ``obj`` without its spec, its metadata, its spec, and the record of ``target``'s fields
    an earlier conversion left on it (a stale record of ``source``'s own fields is dropped)."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    restore = _pop_record(meta, target.annotation)
    _pop_record(meta, source.annotation)
    spec = out.pop("spec", None) or {}
    return out, meta, spec, restore


def _graph_spec(
    spec: dict[str, Any], restore: dict[str, Any], source: _Version, target: _Version
) -> dict[str, Any]:
    """``target``'s graph fields: those only it has (restored; also a field both have now, from a record
    written before, where the spec has none), the ones both have, the graph's env."""
    restored = (restore.get("spec") or {}).items()
    new_spec = {
        k: v for k, v in restored if k in target.only_spec or (k in _SAME_SPEC and spec.get(k) is None)
    }
    _copy_set(spec, new_spec, ("backendFramework", *_SAME_SPEC))
    if spec.get(source.env):
        new_spec[target.env] = spec[source.env]
    return new_spec


def _close(
    out: dict[str, Any],
    meta: dict[str, Any],
    spec: dict[str, Any],
    target: _Version,
    source: _Version,
    record: dict[str, Any],
) -> dict[str, Any]:
    out["apiVersion"] = target.api_version
    out["spec"] = spec
    _put_record(meta, source.annotation, {k: v for k, v in record.items() if v})
    return _reorder(out)


def _component_order(services: dict[str, Any], saved: list[str]) -> list[str]:
    """The order of the v1beta1 components: the one an earlier conversion saved, then by name."""
    order = [n for n in saved if n in services]
    return order + sorted(n for n in services if n not in order)


def to_v1beta1(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1alpha1 ``DynamoGraphDeployment`` (raw dict) as v1beta1."""
    out, meta, spec, restore = _open(obj, _ALPHA, _BETA)
    services: dict[str, Any] = spec.get("services") or {}
    order = _component_order(services, restore.get("order") or [])
    components, records = _convert_parts([(n, services[n] or {}) for n in order], restore, _ALPHA, _BETA)
    new_spec = _graph_spec(spec, restore, _ALPHA, _BETA)
    if components:
        new_spec["components"] = [c for _, c in components]
    kept = {k: spec[k] for k in _ALPHA_ONLY_SPEC if spec.get(k) is not None}
    return _close(out, meta, new_spec, _BETA, _ALPHA, {"spec": kept, "services": records})


def to_v1alpha1(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1beta1 ``DynamoGraphDeployment`` (raw dict) as v1alpha1.

    Every component has a name (the CRD schema and the v1beta1 model require one). Raises
    :class:`ConversionError` when two components share a name (the API server refuses such an object; a
    manifest file may still hold one)."""
    out, meta, spec, restore = _open(obj, _BETA, _ALPHA)
    components: list[dict[str, Any]] = spec.get("components") or []
    names: list[str] = [c["name"] for c in components]
    for name in names:
        if names.count(name) > 1:
            raise ConversionError(
                f"spec.components has {names.count(name)} components named {name!r}; give each component "
                "a unique name"
            )
    services, records = _convert_parts(list(zip(names, components, strict=True)), restore, _BETA, _ALPHA)
    new_spec = _graph_spec(spec, restore, _BETA, _ALPHA)
    if services:
        new_spec["services"] = dict(services)
    kept = {k: spec[k] for k in _BETA_ONLY_SPEC if spec.get(k) is not None}
    order = names if names != sorted(names) else []
    return _close(out, meta, new_spec, _ALPHA, _BETA, {"spec": kept, "order": order, "components": records})


def _reorder(obj: dict[str, Any]) -> dict[str, Any]:
    """apiVersion, kind, metadata, spec, status, then anything else: the order people read."""
    head = ("apiVersion", "kind", "metadata", "spec", "status")
    return {**{k: obj[k] for k in head if k in obj}, **{k: v for k, v in obj.items() if k not in head}}


def convert(obj: dict[str, Any], api_version: str) -> dict[str, Any]:
    """``obj`` (either served version) in ``api_version``; a copy when it already is in it."""
    if api_version not in SERVED:
        raise ConversionError(f"apiVersion {api_version} is not served: use one of {', '.join(SERVED)}")
    have = obj.get("apiVersion")
    if have not in SERVED:
        raise ConversionError(f"apiVersion {have} is not served: use one of {', '.join(SERVED)}")
    if have == api_version:
        return copy.deepcopy(obj)
    return to_v1beta1(obj) if api_version == v1beta1.API_VERSION else to_v1alpha1(obj)


def _invalid(loc: tuple[str | int, ...], value: Any, message: str) -> ValidationError:
    error = PydanticCustomError("dgd_conversion", message)
    return ValidationError.from_exception_data(
        models.KIND, [InitErrorDetails(type=error, loc=loc, input=value)]
    )


# v1beta1 fields this operator accepts and does not act on (named in the graph's SpecWarnings; those
# v1alpha1 has too, eppConfig and experimental.gpuMemoryService, are named from the internal model).
_IGNORED_SPEC = ("restart", "experimental", "provider_override")
_IGNORED_COMPONENT = (
    "runtime_version_override",
    "roles",
    "compilation_cache",
    "experimental",
    "provider_override",
)


def _placement(beta: v1beta1.DynamoGraphDeployment) -> models.GraphPlacement:
    """The v1beta1-only fields of ``beta`` that ``render`` reads (the rest of it maps to v1alpha1)."""
    spec = beta.spec

    def alias(model: type[models._Model], names: tuple[str, ...], obj: Any) -> tuple[str, ...]:
        fields = model.model_fields
        return tuple(fields[n].alias or n for n in names if getattr(obj, n) is not None)

    services = {
        c.name: models.ServicePlacement(
            min_available=c.min_available,
            dynamo_sidecar=c.dynamo_sidecar,
            frontend_sidecar=c.frontend_sidecar,
            # experimental only with more than gpuMemoryService, which v1alpha1 has (and names)
            ignored=alias(
                v1beta1.ComponentSpec,
                _IGNORED_COMPONENT,
                c.model_copy(
                    update={
                        "experimental": {k: v for k, v in (c.experimental or {}).items() if k != _GMS} or None
                    }
                ),
            ),
        )
        for c in spec.components
    }
    return models.GraphPlacement(
        ignored=alias(v1beta1.GraphSpec, _IGNORED_SPEC, spec),
        services={k: v for k, v in services.items() if v != models.ServicePlacement()},
    )


def load_graph(raw: dict[str, Any]) -> models.DynamoGraphDeployment:
    """The internal model of a raw ``DynamoGraphDeployment`` manifest of either served version.

    A v1beta1 manifest is validated against the v1beta1 model first, so errors name its own fields
    (``spec.components[1].replicas``); without ``apiVersion`` the manifest is read as v1alpha1. The
    v1beta1 fields v1alpha1 has no place for (minAvailable, sidecars, ...) travel in
    ``.v1beta1`` (:class:`dynamo_api.models.GraphPlacement`), also from a v1alpha1 object that
    keeps them in its ``nvidia.com/dgd-v1beta1-fields`` annotation. Raises ``pydantic.ValidationError``
    (with the field and what is wrong) for any invalid manifest."""
    version = raw.get("apiVersion", models.API_VERSION) if isinstance(raw, dict) else None
    if version == v1beta1.API_VERSION:
        alpha, placement = _read_v1beta1(raw)
    elif version == models.API_VERSION or not isinstance(raw, dict):
        alpha, placement = raw, _kept_placement(raw)
    else:
        raise _invalid(
            ("apiVersion",),
            version,
            f"apiVersion {version} is not served: write {v1beta1.API_VERSION} or {models.API_VERSION}",
        )
    if isinstance(alpha, dict) and isinstance(alpha.get("metadata"), dict):
        alpha = {**alpha, "metadata": copy.deepcopy(alpha["metadata"])}
        _strip_records(alpha["metadata"])
    return models.DynamoGraphDeployment.model_validate(alpha).model_copy(update={"v1beta1": placement})


def _read_v1beta1(raw: dict[str, Any]) -> tuple[Any, models.GraphPlacement]:
    """A v1beta1 manifest checked against its own model (unique component names included), as the
    v1alpha1 dict and the placement fields v1alpha1 has no place for."""
    beta = v1beta1.DynamoGraphDeployment.model_validate(raw)
    names = [c.name for c in beta.spec.components]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _invalid(
                ("spec", "components", i, "name"),
                name,
                f"a second component named {name!r}: give each component a unique name",
            )
    return to_v1alpha1(raw), _placement(beta)


def _kept_placement(raw: Any) -> models.GraphPlacement:
    """The v1beta1-only fields a v1alpha1 object keeps in its annotation; a malformed record restores
    nothing."""
    annotations = (raw.get("metadata") or {}).get("annotations") if isinstance(raw, dict) else None
    if not (isinstance(annotations, dict) and BETA_FIELDS_ANNOTATION in annotations):
        return models.GraphPlacement()
    try:
        return _placement(v1beta1.DynamoGraphDeployment.model_validate(to_v1beta1(raw)))
    except (ValidationError, ConversionError):
        return models.GraphPlacement()
