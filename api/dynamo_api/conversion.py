"""Conversion of ``DynamoGraphDeployment`` between ``nvidia.com/v1alpha1`` and ``nvidia.com/v1beta1``.

Pure functions on raw objects (dicts as the API server sends them), used by the operator's conversion
webhook, by the operator to read what it watches, and by dynamo-run to read manifests:

- :func:`convert` (``obj``, target apiVersion) -> ``obj`` in that version;
- :func:`load_graph` (a raw manifest of either version) -> the one internal model the renderer works
  from, :class:`dynamo_api.models.DynamoGraphDeployment`.

How the fields map (the rules of NVIDIA Dynamo's conversion)::

    v1alpha1 spec.services[NAME]                 v1beta1 spec.components[name=NAME]
      componentType worker + subComponentType P    type P (P: prefill or decode)
      componentType T                              type T
      replicas, multinode, modelRef,               the same
        globalDynamoNamespace
      sharedMemory {disabled: true} | {size: S}    sharedMemorySize "0" | S
      volumeMounts[useAsCompilationCache]          compilationCache {pvcName, mountPath}
      extraPodSpec (a PodSpec)                     podTemplate.spec
      extraPodSpec.mainContainer                   podTemplate.spec.containers[name=main]
      envs                                         main.env (before mainContainer.env)
      envFromSecret S                              main.envFrom[0] = {secretRef: {name: S}}
      resources {requests,limits}{cpu,memory,      main.resources {requests,limits}{cpu, memory,
        gpu, gpuType, custom}, claims                nvidia.com/gpu (or gpuType), custom...}, claims
      livenessProbe, readinessProbe                main.livenessProbe, main.readinessProbe
      extraPodMetadata {annotations, labels}       podTemplate.metadata {annotations, labels}
      scalingAdapter {enabled: true}               scalingAdapter {} (present: enabled)
    spec.envs, spec.backendFramework             spec.env, spec.backendFramework
    status                                       status (one schema, unchanged)

Nothing is lost on a round trip. What one version cannot express is kept in an annotation of the
converted object and restored when it is converted back:

- ``nvidia.com/dgd-v1alpha1-fields`` (on v1beta1 objects): ``spec.pvcs``, ``spec.dynamoGraph`` and, per
  service, the fields v1beta1 has no place for (``volumeMounts``, ``annotations``, ``labels``,
  ``serviceName``, ``dynamoNamespace``, ``autoscaling``, ``ingress``, ``pvc``, a ``componentType`` outside
  v1beta1's enum such as ``main``);
- ``nvidia.com/dgd-v1beta1-fields`` (on v1alpha1 objects): the v1beta1-only graph fields (``annotations``,
  ``labels``, ``priorityClassName``, ``restart``, ``topologyConstraint``, ``experimental``,
  ``providerOverride``), the order of ``spec.components``, and per component its v1beta1-only fields
  (``minAvailable``, ``roles``, ``eppConfig``, ``frontendSidecar``, ``dynamoSidecar``,
  ``compilationCache``, ``runtimeVersionOverride``, ``topologyConstraint``, ``experimental``,
  ``providerOverride``).

Those fields are restored whatever else changed. Where the mapping above is not one-to-one (e.g. env set
in both ``envs`` and ``mainContainer.env`` arrives in v1beta1 as one list), the annotation also keeps the
original component with a fingerprint of what it was converted to: converted back unchanged, the
original comes back exactly; edited in the other version, the edit wins and the mapping above decides.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from dynamo_api import models, v1beta1

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
_BETA_ONLY_SPEC = (
    "annotations",
    "labels",
    "priorityClassName",
    "restart",
    "topologyConstraint",
    "experimental",
    "providerOverride",
)
_BETA_ONLY_COMPONENT = (
    "runtimeVersionOverride",
    "minAvailable",
    "roles",
    "eppConfig",
    "frontendSidecar",
    "dynamoSidecar",
    "compilationCache",
    "topologyConstraint",
    "experimental",
    "providerOverride",
)
_BETA_TYPES = ("frontend", "worker", "prefill", "decode", "planner", "epp")
_SPLIT_TYPES = ("prefill", "decode")


class ConversionError(ValueError):
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


def _service_to_component(name: str, svc: dict[str, Any]) -> dict[str, Any]:
    """The mapping from a v1alpha1 service to a v1beta1 component (no annotations involved)."""
    svc = copy.deepcopy(svc)
    comp: dict[str, Any] = {"name": name}
    ctype, sub = svc.get("componentType"), svc.get("subComponentType")
    if ctype == "worker" and sub in _SPLIT_TYPES:
        comp["type"] = sub
    elif ctype in _BETA_TYPES:
        comp["type"] = ctype
    for key in ("replicas", "multinode", "modelRef", "globalDynamoNamespace"):
        if svc.get(key) is not None:
            comp[key] = svc[key]
    shm = svc.get("sharedMemory") or {}
    if shm.get("disabled"):
        comp["sharedMemorySize"] = "0"
    elif shm.get("size") is not None:
        comp["sharedMemorySize"] = shm["size"]
    if (svc.get("scalingAdapter") or {}).get("enabled"):
        comp["scalingAdapter"] = {}
    for mount in svc.get("volumeMounts") or []:
        if mount.get("useAsCompilationCache"):
            cache = {"pvcName": mount.get("name"), "mountPath": mount.get("mountPoint")}
            comp["compilationCache"] = {k: v for k, v in cache.items() if v is not None}
            break

    spec = dict(svc.get("extraPodSpec") or {})
    main = dict(spec.pop("mainContainer", None) or {})
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
    for probe in ("livenessProbe", "readinessProbe"):
        if svc.get(probe) is not None:
            container[probe] = svc[probe]
    spec["containers"] = [container, *(spec.get("containers") or [])]
    template: dict[str, Any] = {"spec": spec}
    pod_meta = svc.get("extraPodMetadata") or {}
    meta = {k: pod_meta[k] for k in ("annotations", "labels") if pod_meta.get(k)}
    if meta:
        template["metadata"] = meta
    comp["podTemplate"] = template
    return comp


def _component_to_service(comp: dict[str, Any]) -> dict[str, Any]:
    """The mapping from a v1beta1 component to a v1alpha1 service (no annotations involved)."""
    comp = copy.deepcopy(comp)
    svc: dict[str, Any] = {}
    ctype = comp.get("type")
    if ctype in _SPLIT_TYPES:
        svc["componentType"], svc["subComponentType"] = "worker", ctype
    elif ctype is not None:
        svc["componentType"] = ctype
    for key in ("replicas", "multinode", "modelRef", "globalDynamoNamespace"):
        if comp.get(key) is not None:
            svc[key] = comp[key]
    adapter = comp.get("scalingAdapter")
    if isinstance(adapter, dict) and adapter.get("enabled") is not False:
        svc["scalingAdapter"] = {"enabled": True}
    shm = comp.get("sharedMemorySize")
    if shm is not None:
        svc["sharedMemory"] = {"disabled": True} if str(shm) == "0" else {"size": shm}

    template = comp.get("podTemplate") or {}
    pod_meta = template.get("metadata") or {}
    meta = {k: pod_meta[k] for k in ("annotations", "labels") if pod_meta.get(k)}
    if meta:
        svc["extraPodMetadata"] = meta
    spec = dict(template.get("spec") or {})
    containers = list(spec.pop("containers", None) or [])
    main = next((c for c in containers if c.get("name") == v1beta1.MAIN_CONTAINER), None)
    others = [c for c in containers if c is not main]
    if others:
        spec["containers"] = others
    if main is not None:
        main = {k: v for k, v in main.items() if k != "name"}
        if main.get("env"):
            svc["envs"] = main.pop("env")
        env_from = main.pop("envFrom", None) or []
        if env_from and set(env_from[0]) == {"secretRef"} and set(env_from[0]["secretRef"] or {}) == {"name"}:
            svc["envFromSecret"] = env_from[0]["secretRef"]["name"]
            env_from = env_from[1:]
        if env_from:
            main["envFrom"] = env_from
        if main.get("resources") is not None:
            svc["resources"] = _resources_from_k8s(main.pop("resources"))
        for probe in ("livenessProbe", "readinessProbe"):
            if main.get(probe) is not None:
                svc[probe] = main.pop(probe)
        main = {k: v for k, v in main.items() if v is not None}
        if main:
            spec["mainContainer"] = main
    if spec:
        svc["extraPodSpec"] = spec
    return svc


# --- whole objects -----------------------------------------------------------------------------------


def to_v1beta1(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1alpha1 ``DynamoGraphDeployment`` (raw dict) as v1beta1."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    restore = _pop_record(meta, BETA_FIELDS_ANNOTATION)
    _pop_record(meta, ALPHA_FIELDS_ANNOTATION)
    spec = out.pop("spec", None) or {}
    services: dict[str, Any] = spec.get("services") or {}
    saved_components: dict[str, Any] = restore.get("components") or {}
    order = [n for n in restore.get("order") or [] if n in services]
    order += sorted(n for n in services if n not in order)

    keep_spec = {k: spec[k] for k in _ALPHA_ONLY_SPEC if spec.get(k) is not None}
    keep_services: dict[str, Any] = {}
    components = []
    for name in order:
        svc = services[name] or {}
        comp = _service_to_component(name, svc)
        saved = saved_components.get(name) or {}
        if saved.get("component") and saved.get("fingerprint") == _fingerprint(models.ServiceSpec, svc):
            comp = saved["component"]
        else:
            comp.update(saved.get("keep") or {})
        components.append(comp)

        keep = {k: svc[k] for k in _ALPHA_ONLY_SERVICE if svc.get(k) is not None}
        ctype, sub = svc.get("componentType"), svc.get("subComponentType")
        if ctype is not None and ctype not in _BETA_TYPES:
            keep["componentType"] = ctype
        if sub is not None and ctype != "worker":
            keep["subComponentType"] = sub
        record: dict[str, Any] = {"keep": keep} if keep else {}
        back = {**_component_to_service(comp), **keep}
        if _normal(models.ServiceSpec, back) != _normal(models.ServiceSpec, svc):
            record["service"] = svc
            record["fingerprint"] = _fingerprint(v1beta1.ComponentSpec, comp)
        if record:
            keep_services[name] = record

    new_spec: dict[str, Any] = {k: v for k, v in (restore.get("spec") or {}).items() if k in _BETA_ONLY_SPEC}
    if spec.get("backendFramework") is not None:
        new_spec["backendFramework"] = spec["backendFramework"]
    if spec.get("envs"):
        new_spec["env"] = spec["envs"]
    if components:
        new_spec["components"] = components
    out["apiVersion"] = v1beta1.API_VERSION
    out["spec"] = new_spec
    record = {k: v for k, v in (("spec", keep_spec), ("services", keep_services)) if v}
    _put_record(meta, ALPHA_FIELDS_ANNOTATION, record)
    return _reorder(out)


def to_v1alpha1(obj: dict[str, Any]) -> dict[str, Any]:
    """A v1beta1 ``DynamoGraphDeployment`` (raw dict) as v1alpha1.

    Every component has a name (the CRD schema and the v1beta1 model require one). Raises
    :class:`ConversionError` when two components share a name (the API server refuses such an object; a
    manifest file may still hold one)."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    restore = _pop_record(meta, ALPHA_FIELDS_ANNOTATION)
    _pop_record(meta, BETA_FIELDS_ANNOTATION)
    spec = out.pop("spec", None) or {}
    components: list[dict[str, Any]] = spec.get("components") or []
    names: list[str] = [c["name"] for c in components]
    for name in names:
        if names.count(name) > 1:
            raise ConversionError(
                f"spec.components has {names.count(name)} components named {name!r}; give each component "
                "a unique name"
            )
    saved_services: dict[str, Any] = restore.get("services") or {}

    services: dict[str, Any] = {}
    keep_components: dict[str, Any] = {}
    for comp, name in zip(components, names, strict=True):
        svc = _component_to_service(comp)
        saved = saved_services.get(name) or {}
        if saved.get("service") and saved.get("fingerprint") == _fingerprint(v1beta1.ComponentSpec, comp):
            svc = saved["service"]
        else:
            svc.update(saved.get("keep") or {})
        services[name] = svc

        regenerated = _service_to_component(name, svc)  # e.g. compilationCache from volumeMounts
        keep = {
            k: comp[k]
            for k in _BETA_ONLY_COMPONENT
            if comp.get(k) is not None and regenerated.get(k) != comp[k]
        }
        record: dict[str, Any] = {"keep": keep} if keep else {}
        back = {**_service_to_component(name, svc), **keep}
        if _normal(v1beta1.ComponentSpec, back) != _normal(v1beta1.ComponentSpec, comp):
            record["component"] = comp
            record["fingerprint"] = _fingerprint(models.ServiceSpec, svc)
        if record:
            keep_components[name] = record

    new_spec: dict[str, Any] = {k: v for k, v in (restore.get("spec") or {}).items() if k in _ALPHA_ONLY_SPEC}
    if spec.get("backendFramework") is not None:
        new_spec["backendFramework"] = spec["backendFramework"]
    if spec.get("env"):
        new_spec["envs"] = spec["env"]
    if services:
        new_spec["services"] = services
    keep_spec = {k: spec[k] for k in _BETA_ONLY_SPEC if spec.get(k) is not None}
    order = names if names != sorted(names) else []
    out["apiVersion"] = models.API_VERSION
    out["spec"] = new_spec
    record = {k: v for k, v in (("spec", keep_spec), ("order", order), ("components", keep_components)) if v}
    _put_record(meta, BETA_FIELDS_ANNOTATION, record)
    return _reorder(out)


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


# v1beta1 fields this operator accepts and does not act on (named in the graph's SpecWarnings).
_IGNORED_SPEC = ("restart", "experimental", "provider_override")
_IGNORED_COMPONENT = (
    "runtime_version_override",
    "roles",
    "epp_config",
    "compilation_cache",
    "experimental",
    "provider_override",
)


def _pack_domain(constraint: dict[str, Any] | None) -> str | None:
    domain = (constraint or {}).get("packDomain")
    return str(domain) if domain else None


def _placement(beta: v1beta1.DynamoGraphDeployment) -> models.GraphPlacement:
    """The v1beta1-only fields of ``beta`` that ``render`` reads (the rest of it maps to v1alpha1)."""
    spec = beta.spec

    def alias(model: type[models._Model], names: tuple[str, ...], obj: Any) -> tuple[str, ...]:
        fields = model.model_fields
        return tuple(fields[n].alias or n for n in names if getattr(obj, n) is not None)

    services = {
        c.name: models.ServicePlacement(
            min_available=c.min_available,
            pack_domain=_pack_domain(c.topology_constraint),
            dynamo_sidecar=c.dynamo_sidecar,
            frontend_sidecar=c.frontend_sidecar,
            ignored=alias(v1beta1.ComponentSpec, _IGNORED_COMPONENT, c),
        )
        for c in spec.components
    }
    return models.GraphPlacement(
        annotations=spec.annotations or {},
        labels=spec.labels or {},
        priority_class_name=spec.priority_class_name or None,
        pack_domain=_pack_domain(spec.topology_constraint),
        ignored=alias(v1beta1.GraphSpec, _IGNORED_SPEC, spec),
        services={k: v for k, v in services.items() if v != models.ServicePlacement()},
    )


def load_graph(raw: dict[str, Any]) -> models.DynamoGraphDeployment:
    """The internal model of a raw ``DynamoGraphDeployment`` manifest of either served version.

    A v1beta1 manifest is validated against the v1beta1 model first, so errors name its own fields
    (``spec.components[1].replicas``); without ``apiVersion`` the manifest is read as v1alpha1. The
    v1beta1 fields v1alpha1 has no place for (priority class, minAvailable, topology, ...) travel in
    ``.v1beta1`` (:class:`dynamo_api.models.GraphPlacement`), also from a v1alpha1 object that
    keeps them in its ``nvidia.com/dgd-v1beta1-fields`` annotation. Raises ``pydantic.ValidationError``
    (with the field and what is wrong) for any invalid manifest."""
    version = raw.get("apiVersion", models.API_VERSION) if isinstance(raw, dict) else None
    placement = models.GraphPlacement()
    if version == v1beta1.API_VERSION:
        beta = v1beta1.DynamoGraphDeployment.model_validate(raw)
        names = [c.name for c in beta.spec.components]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _invalid(
                    ("spec", "components", i, "name"),
                    name,
                    f"a second component named {name!r}: give each component a unique name",
                )
        alpha = to_v1alpha1(raw)
        placement = _placement(beta)
    elif version == models.API_VERSION or not isinstance(raw, dict):
        alpha = raw
        annotations = (raw.get("metadata") or {}).get("annotations") if isinstance(raw, dict) else None
        if isinstance(annotations, dict) and BETA_FIELDS_ANNOTATION in annotations:
            try:  # the fields come back with a conversion; a malformed record restores nothing
                placement = _placement(v1beta1.DynamoGraphDeployment.model_validate(to_v1beta1(raw)))
            except (ValidationError, ConversionError):
                placement = models.GraphPlacement()
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
