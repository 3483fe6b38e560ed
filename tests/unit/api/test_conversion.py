"""Conversion of DynamoGraphDeployment between nvidia.com/v1alpha1 and v1beta1 (what the webhook serves):
every field both versions have maps to its counterpart, property by property; a round trip either way
gives back the object it started from, fields only one version has included; an edit made in one version
shows in the other; and the one internal model reads manifests of both versions."""

from __future__ import annotations

import copy
import json

import pytest
from dynamo_api import models, v1beta1
from dynamo_api.conversion import (
    ALPHA_FIELDS_ANNOTATION,
    BETA_FIELDS_ANNOTATION,
    ConversionError,
    convert,
    load_graph,
    to_v1alpha1,
    to_v1beta1,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

# --- strategies: objects as a user (or the API server) would send them --------------------------------

NAMES = st.text("abcdefghij-", min_size=1, max_size=8).filter(lambda s: s[0] != "-" and s[-1] != "-")
WORDS = st.text("abcxyz019", min_size=1, max_size=6)
QUANTITY = st.sampled_from(["1", "2", "8", "500m", "16Gi", "2Ti"])
ENV = st.builds(lambda n, v: {"name": n.upper(), "value": v}, WORDS, WORDS)
ENV_FROM = st.builds(
    lambda n, k: {"name": n.upper(), "valueFrom": {"secretKeyRef": {"name": n, "key": k}}}, WORDS, WORDS
)
ENVS = st.lists(st.one_of(ENV, ENV_FROM), max_size=3)
LABELS = st.dictionaries(st.sampled_from(["app", "team", "nvidia.com/rdma", "tier"]), WORDS, max_size=2)
PROBE = st.builds(
    lambda p: {"httpGet": {"path": p, "port": 9090}, "periodSeconds": 5},
    st.sampled_from(["/live", "/health"]),
)


def _opt(strategy):
    return st.one_of(st.none(), strategy)


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


RESOURCE_ITEM = st.builds(
    lambda cpu, mem, gpu, gpu_type, custom: _drop_none(
        {"cpu": cpu, "memory": mem, "gpu": gpu, "gpuType": gpu_type, "custom": custom or None}
    ),
    _opt(QUANTITY),
    _opt(QUANTITY),
    _opt(st.sampled_from(["1", "2", "4", "8"])),
    _opt(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu"])),
    st.dictionaries(st.sampled_from(["ephemeral-storage", "rdma/ib", "hugepages-2Mi"]), QUANTITY, max_size=2),
)
RESOURCES = st.builds(
    lambda req, lim: _drop_none({"requests": req, "limits": lim}), _opt(RESOURCE_ITEM), _opt(RESOURCE_ITEM)
)
MAIN_CONTAINER = st.builds(
    lambda image, command, args, env, wd, name: _drop_none(
        {"image": image, "command": command, "args": args, "env": env or None, "workingDir": wd, "name": name}
    ),
    _opt(st.sampled_from(["ghcr.io/dynamo-sglang/dynamo-sglang:0.1.0", "nvcr.io/x/y:1"])),
    _opt(st.lists(WORDS, min_size=1, max_size=3)),
    _opt(st.lists(WORDS, max_size=4)),
    st.lists(ENV, max_size=2),
    _opt(st.sampled_from(["/workspace", "/tmp"])),
    _opt(st.sampled_from(["main", "engine"])),
)
EXTRA_POD_SPEC = st.builds(
    lambda main, tolerations, node_selector, sidecars: _drop_none(
        {
            "mainContainer": main,
            "tolerations": tolerations or None,
            "nodeSelector": node_selector or None,
            "containers": sidecars or None,
        }
    ),
    _opt(MAIN_CONTAINER),
    st.lists(st.builds(lambda k: {"key": k, "operator": "Exists"}, WORDS), max_size=2),
    st.dictionaries(st.sampled_from(["gpu", "zone"]), WORDS, max_size=1),
    st.lists(st.builds(lambda n: {"name": f"side-{n}", "image": "busybox:1.37"}, WORDS), max_size=1),
)
SERVICE = st.builds(
    lambda ct, sub, replicas, nodes, res, envs, secret, eps, epm, shm, probes, mounts, ann, lab, extra: (
        _drop_none(
            {
                "componentType": ct,
                "subComponentType": sub,
                "replicas": replicas,
                "multinode": {"nodeCount": nodes} if nodes else None,
                "resources": res,
                "envs": envs or None,
                "envFromSecret": secret,
                "extraPodSpec": eps,
                "extraPodMetadata": epm,
                "sharedMemory": shm,
                "livenessProbe": probes[0],
                "readinessProbe": probes[1],
                "volumeMounts": mounts or None,
                "annotations": ann or None,
                "labels": lab or None,
                **extra,
            }
        )
    ),
    _opt(st.sampled_from(["frontend", "worker", "prefill", "decode", "planner", "main", "epp", "default"])),
    _opt(st.sampled_from(["prefill", "decode"])),
    _opt(st.integers(0, 4)),
    _opt(st.integers(2, 4)),
    _opt(RESOURCES),
    ENVS,
    _opt(WORDS),
    _opt(EXTRA_POD_SPEC),
    _opt(st.builds(lambda a, b: {"annotations": a, "labels": b}, LABELS, LABELS)),
    _opt(
        st.sampled_from(
            [{"disabled": True}, {"size": "16Gi"}, {"disabled": False}, {"disabled": True, "size": "1Gi"}]
        )
    ),
    st.tuples(_opt(PROBE), _opt(PROBE)),
    st.lists(
        st.builds(
            lambda n, m, c: _drop_none({"name": n, "mountPoint": m, "useAsCompilationCache": c}),
            WORDS,
            _opt(st.sampled_from(["/models", "/cache"])),
            st.booleans(),
        ),
        max_size=2,
    ),
    LABELS,
    LABELS,
    st.fixed_dictionaries(
        {},
        optional={
            "serviceName": WORDS,
            "dynamoNamespace": WORDS,
            "globalDynamoNamespace": st.booleans(),
            "modelRef": st.builds(lambda n: {"name": n}, WORDS),
            "autoscaling": st.just({"enabled": False, "minReplicas": 1}),
            "ingress": st.just({"enabled": False}),
            "pvc": st.builds(lambda n: {"name": n, "create": False}, WORDS),
            "scalingAdapter": st.builds(lambda on: {"enabled": on}, st.booleans()),
            "topologyConstraint": st.just({"packDomain": "rack"}),
            "eppConfig": st.just({"configMapRef": {"name": "epp", "key": "config.yaml"}}),
            "gpuMemoryService": st.sampled_from([{"enabled": True, "mode": "intraPod"}, {"enabled": False}]),
        },
    ),
)
# Graph fields both versions have.
SHARED_SPEC = st.fixed_dictionaries(
    {},
    optional={
        "annotations": LABELS,
        "labels": LABELS,
        "priorityClassName": st.just("high"),
        "topologyConstraint": st.just({"topologyProfile": "gb200", "packDomain": "rack"}),
    },
)
STATUS = st.one_of(
    st.none(),
    st.just(
        {
            "state": "successful",
            "observedGeneration": 3,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady", "message": "ok"}],
            "services": {"decode": {"componentKind": "Deployment", "replicas": 1, "readyReplicas": 1}},
        }
    ),
)
META = st.builds(
    lambda ann: _drop_none(
        {"name": "g", "namespace": "ns", "uid": "u-1", "generation": 2, "annotations": ann or None}
    ),
    LABELS,
)
ALPHA = st.builds(
    lambda meta, services, envs, backend, pvcs, shared, status: _drop_none(
        {
            "apiVersion": models.API_VERSION,
            "kind": models.KIND,
            "metadata": meta,
            "spec": _drop_none(
                {
                    "services": services,
                    "envs": envs or None,
                    "backendFramework": backend,
                    "pvcs": pvcs or None,
                    **shared,
                }
            ),
            "status": status,
        }
    ),
    META,
    st.dictionaries(NAMES, SERVICE, max_size=4),
    ENVS,
    _opt(st.sampled_from(["sglang", "vllm"])),
    st.lists(st.builds(lambda n: {"name": n, "create": False}, WORDS), max_size=1),
    SHARED_SPEC,
    STATUS,
)

CONTAINER = st.builds(
    lambda name, image, env, env_from, res, probe, extra: _drop_none(
        {
            "name": name,
            "image": image,
            "env": env or None,
            "envFrom": env_from or None,
            "resources": res,
            "livenessProbe": probe,
            **extra,
        }
    ),
    st.sampled_from(["main", "main", "sidecar"]),
    _opt(st.just("ghcr.io/dynamo-sglang/dynamo-sglang:0.1.0")),
    st.lists(ENV, max_size=2),
    st.lists(
        st.one_of(
            st.builds(lambda n: {"secretRef": {"name": n}}, WORDS),
            st.builds(lambda n: {"configMapRef": {"name": n}}, WORDS),
            st.builds(lambda n: {"secretRef": {"name": n, "optional": True}}, WORDS),
        ),
        max_size=2,
    ),
    _opt(
        st.builds(
            lambda lim, req: _drop_none({"limits": lim or None, "requests": req or None}),
            st.dictionaries(
                st.sampled_from(["nvidia.com/gpu", "cpu", "memory", "rdma/ib"]), QUANTITY, max_size=3
            ),
            st.dictionaries(
                st.sampled_from(["ephemeral-storage", "cpu", "hugepages-2Mi"]), QUANTITY, max_size=2
            ),
        )
    ),
    _opt(PROBE),
    st.fixed_dictionaries(
        {},
        optional={
            "command": st.lists(WORDS, min_size=1, max_size=3),
            "args": st.lists(WORDS, max_size=4),
            "workingDir": st.just("/workspace"),
            "ports": st.just([{"name": "http", "containerPort": 8000}]),
        },
    ),
)
POD_TEMPLATE = st.builds(
    lambda containers, meta, extra: _drop_none(
        {"metadata": meta, "spec": {"containers": containers, **extra}}
    ),
    st.lists(CONTAINER, max_size=2, unique_by=lambda c: c["name"]),
    _opt(st.builds(lambda a, b: _drop_none({"annotations": a or None, "labels": b or None}), LABELS, LABELS)),
    st.fixed_dictionaries({}, optional={"tolerations": st.just([{"key": "gpu", "operator": "Exists"}])}),
)
COMPONENT = st.builds(
    lambda ctype, replicas, nodes, template, shm, extra: _drop_none(
        {
            "type": ctype,
            "replicas": replicas,
            "multinode": {"nodeCount": nodes} if nodes else None,
            "podTemplate": template,
            "sharedMemorySize": shm,
            **extra,
        }
    ),
    _opt(st.sampled_from(["frontend", "worker", "prefill", "decode", "planner", "epp"])),
    _opt(st.integers(0, 4)),
    _opt(st.integers(2, 4)),
    _opt(POD_TEMPLATE),
    _opt(st.sampled_from(["0", "16Gi", "1Gi"])),
    st.fixed_dictionaries(
        {},
        optional={
            "minAvailable": st.integers(1, 2),
            "dynamoSidecar": WORDS,
            "frontendSidecar": WORDS,
            "runtimeVersionOverride": st.just("1.5.0"),
            "compilationCache": st.builds(lambda n: {"pvcName": n, "mountPath": "/cache"}, WORDS),
            "scalingAdapter": st.sampled_from([{}, {"enabled": True}, {"enabled": False}]),
            "topologyConstraint": st.just({"packDomain": "rack"}),
            "experimental": st.sampled_from(
                [
                    {"checkpoint": {"enabled": False}},
                    {"gpuMemoryService": {"mode": "IntraPod"}},
                    {"gpuMemoryService": {"mode": "IntraPod"}, "failover": {"mode": "IntraPod"}},
                ]
            ),
            "eppConfig": st.just({"config": {"plugins": [{"type": "kv-aware-scorer"}]}}),
            "globalDynamoNamespace": st.booleans(),
            "modelRef": st.builds(lambda n: {"name": n, "revision": "main"}, WORDS),
        },
    ),
)
BETA = st.builds(
    lambda meta, comps, env, backend, extra, status: _drop_none(
        {
            "apiVersion": v1beta1.API_VERSION,
            "kind": models.KIND,
            "metadata": meta,
            "spec": _drop_none(
                {
                    "components": [{"name": n, **c} for n, c in comps] or None,
                    "env": env or None,
                    "backendFramework": backend,
                    **extra,
                }
            ),
            "status": status,
        }
    ),
    META,
    st.lists(st.tuples(NAMES, COMPONENT), max_size=4, unique_by=lambda t: t[0]),
    ENVS,
    _opt(st.sampled_from(["sglang", "trtllm"])),
    st.fixed_dictionaries(
        {},
        optional={
            "annotations": LABELS,
            "labels": LABELS,
            "priorityClassName": st.just("high"),
            "restart": st.just({"id": "r1"}),
            "topologyConstraint": st.just({"clusterTopologyName": "t"}),
        },
    ),
    STATUS,
)

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _alpha(obj: dict) -> dict:
    """``obj`` as the API server stores it at v1alpha1 (schema defaults filled)."""
    return models.DynamoGraphDeployment.model_validate(obj).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )


def _beta(obj: dict) -> dict:
    return v1beta1.DynamoGraphDeployment.model_validate(obj).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )


def _main(comp: dict) -> dict:
    containers = comp.get("podTemplate", {}).get("spec", {}).get("containers", [])
    return next(c for c in containers if c["name"] == "main")


# --- round trips ---------------------------------------------------------------------------------------


@FUZZ
@given(ALPHA)
def test_v1alpha1_round_trip_gives_back_the_object(obj):
    beta = to_v1beta1(obj)
    _beta(beta)  # a valid v1beta1 object
    back = to_v1alpha1(beta)
    assert _alpha(back) == _alpha(obj)
    assert back["metadata"] == obj["metadata"]  # no conversion annotation left behind


@FUZZ
@given(BETA)
def test_v1beta1_round_trip_gives_back_the_object(obj):
    alpha = to_v1alpha1(obj)
    _alpha(alpha)  # a valid v1alpha1 object
    back = to_v1beta1(alpha)
    assert _beta(back) == _beta(obj)
    assert back["spec"].get("components", []) == obj["spec"].get("components", [])  # order kept too
    assert back["metadata"] == obj["metadata"]


# --- property by property ------------------------------------------------------------------------------


@FUZZ
@given(ALPHA)
def test_each_v1alpha1_field_lands_on_its_v1beta1_counterpart(obj):
    beta = to_v1beta1(obj)
    spec, bspec = obj["spec"], beta["spec"]
    assert beta["apiVersion"] == "nvidia.com/v1beta1"
    assert beta.get("status") == obj.get("status")  # one status schema
    assert bspec.get("env", []) == spec.get("envs", [])
    assert bspec.get("backendFramework") == spec.get("backendFramework")
    comps = {c["name"]: c for c in bspec.get("components", [])}
    assert set(comps) == set(spec.get("services", {}))
    for name, svc in spec.get("services", {}).items():
        comp, main = comps[name], _main(comps[name])
        ctype, sub = svc.get("componentType"), svc.get("subComponentType")
        expected_type = (
            sub if ctype == "worker" and sub else (ctype if ctype in v1beta1.ComponentType.__args__ else None)
        )
        assert comp.get("type") == expected_type
        assert comp.get("replicas") == svc.get("replicas")
        assert comp.get("multinode") == svc.get("multinode")
        assert comp.get("modelRef") == svc.get("modelRef")
        shm = svc.get("sharedMemory") or {}
        assert comp.get("sharedMemorySize") == ("0" if shm.get("disabled") else shm.get("size"))
        extra = svc.get("extraPodSpec") or {}
        mc = extra.get("mainContainer") or {}
        for key in ("image", "command", "args", "workingDir"):
            assert main.get(key) == mc.get(key)
        assert main.get("env", []) == [*svc.get("envs", []), *mc.get("env", [])]
        if svc.get("envFromSecret"):
            assert main["envFrom"][0] == {"secretRef": {"name": svc["envFromSecret"]}}
        for kind in ("requests", "limits"):
            item = (svc.get("resources") or {}).get(kind) or {}
            got = (main.get("resources") or {}).get(kind) or {}
            if item.get("gpu"):
                assert got[item.get("gpuType") or "nvidia.com/gpu"] == item["gpu"]
            for key in ("cpu", "memory"):
                assert got.get(key) == item.get(key)
            for key, value in (item.get("custom") or {}).items():
                assert got[key] == value
        for probe in ("livenessProbe", "readinessProbe"):
            if svc.get(probe):
                assert main[probe] == svc[probe]
        pod_spec = comp["podTemplate"]["spec"]
        for key in ("tolerations", "nodeSelector"):
            assert pod_spec.get(key) == extra.get(key)
        assert [c["name"] for c in pod_spec["containers"][1:]] == [
            c["name"] for c in extra.get("containers", [])
        ]
        pod_meta = svc.get("extraPodMetadata") or {}
        for key in ("annotations", "labels"):
            assert comp["podTemplate"].get("metadata", {}).get(key) == (pod_meta.get(key) or None)
        enabled = (svc.get("scalingAdapter") or {}).get("enabled", False)
        assert ("scalingAdapter" in comp) == enabled
        for key in ("topologyConstraint", "eppConfig"):
            assert comp.get(key) == svc.get(key)
        assert (comp.get("experimental") or {}).get("gpuMemoryService") == svc.get("gpuMemoryService")
    for key in ("annotations", "labels", "priorityClassName", "topologyConstraint"):
        assert bspec.get(key) == spec.get(key)


@FUZZ
@given(BETA)
def test_each_v1beta1_field_lands_on_its_v1alpha1_counterpart(obj):
    alpha = to_v1alpha1(obj)
    spec, aspec = obj["spec"], alpha["spec"]
    assert alpha["apiVersion"] == "nvidia.com/v1alpha1"
    assert alpha.get("status") == obj.get("status")
    assert aspec.get("envs", []) == spec.get("env", [])
    for key in ("annotations", "labels", "priorityClassName", "topologyConstraint"):
        assert aspec.get(key) == spec.get(key)
    services = aspec.get("services", {})
    assert list(services) == [c["name"] for c in spec.get("components", [])]
    for comp in spec.get("components", []):
        svc = services[comp["name"]]
        ctype = comp.get("type")
        if ctype in ("prefill", "decode"):
            assert (svc["componentType"], svc["subComponentType"]) == ("worker", ctype)
        else:
            assert svc.get("componentType") == ctype and "subComponentType" not in svc
        assert svc.get("replicas") == comp.get("replicas")
        assert svc.get("multinode") == comp.get("multinode")
        adapter = comp.get("scalingAdapter")
        enabled = adapter is not None and adapter.get("enabled") is not False
        assert (svc.get("scalingAdapter") or {}).get("enabled", False) == enabled
        for key in ("topologyConstraint", "eppConfig"):
            assert svc.get(key) == comp.get(key)
        assert svc.get("gpuMemoryService") == (comp.get("experimental") or {}).get("gpuMemoryService")
        shm = comp.get("sharedMemorySize")
        assert svc.get("sharedMemory") == (
            None if shm is None else {"disabled": True} if shm == "0" else {"size": shm}
        )
        mains = [
            c
            for c in (comp.get("podTemplate") or {}).get("spec", {}).get("containers", [])
            if c["name"] == "main"
        ]
        if not mains:
            continue
        main = mains[0]
        assert svc.get("envs", []) == main.get("env", [])
        limits = (main.get("resources") or {}).get("limits") or {}
        if "nvidia.com/gpu" in limits:
            assert svc["resources"]["limits"]["gpu"] == limits["nvidia.com/gpu"]
        mc = (svc.get("extraPodSpec") or {}).get("mainContainer") or {}
        for key in ("image", "command", "args", "workingDir", "ports"):
            assert mc.get(key) == main.get(key)
        env_from = main.get("envFrom") or []
        first = env_from[0] if env_from else {}
        if set(first) == {"secretRef"} and set(first["secretRef"]) == {
            "name"
        }:  # a plain Secret: envFromSecret
            assert svc["envFromSecret"] == env_from[0]["secretRef"]["name"]
            assert mc.get("envFrom", []) == env_from[1:]
        else:
            assert "envFromSecret" not in svc and mc.get("envFrom", []) == env_from


# --- edits in one version show in the other ---------------------------------------------------------------

ALPHA_GRAPH = {
    "apiVersion": "nvidia.com/v1alpha1",
    "kind": "DynamoGraphDeployment",
    "metadata": {"name": "g", "namespace": "ns"},
    "spec": {
        "pvcs": [{"name": "models", "create": False}],
        "services": {
            "decode": {
                "componentType": "worker",
                "replicas": 1,
                "resources": {"limits": {"gpu": "1"}},
                "envs": [{"name": "A", "value": "1"}],
                "annotations": {"nvidia.com/rdma": "true"},
                "volumeMounts": [{"name": "models", "mountPoint": "/models"}],
                "extraPodSpec": {
                    "mainContainer": {"args": ["--tp", "1"], "env": [{"name": "B", "value": "2"}]}
                },
            }
        },
    },
}


def test_an_edit_at_v1beta1_wins_and_v1alpha1_only_fields_survive_it():
    beta = to_v1beta1(ALPHA_GRAPH)
    assert json.loads(beta["metadata"]["annotations"][ALPHA_FIELDS_ANNOTATION])["spec"]["pvcs"]
    beta["spec"]["components"][0]["replicas"] = 3
    _main(beta["spec"]["components"][0])["args"] = ["--tp", "2"]
    alpha = to_v1alpha1(beta)
    decode = alpha["spec"]["services"]["decode"]
    assert decode["replicas"] == 3
    assert decode["extraPodSpec"]["mainContainer"]["args"] == ["--tp", "2"]
    assert decode["annotations"] == {"nvidia.com/rdma": "true"}  # no v1beta1 home: restored
    assert decode["volumeMounts"] == [{"name": "models", "mountPoint": "/models"}]
    assert alpha["spec"]["pvcs"] == [{"name": "models", "create": False}]
    assert [e["name"] for e in decode["envs"]] == ["A", "B"]  # the edited component: one env list
    assert not alpha["metadata"].get("annotations", {}).get(ALPHA_FIELDS_ANNOTATION)


def test_an_edit_at_v1alpha1_wins_and_v1beta1_only_fields_survive_it():
    beta = to_v1beta1(ALPHA_GRAPH)
    beta["spec"]["priorityClassName"] = "high"
    beta["spec"]["components"][0]["dynamoSidecar"] = "runtime"
    beta["spec"]["components"][0]["minAvailable"] = 1
    alpha = to_v1alpha1(beta)
    assert BETA_FIELDS_ANNOTATION in alpha["metadata"]["annotations"]
    alpha["spec"]["services"]["decode"]["replicas"] = 2
    again = to_v1beta1(alpha)
    comp = again["spec"]["components"][0]
    assert comp["replicas"] == 2
    assert (comp["dynamoSidecar"], comp["minAvailable"]) == ("runtime", 1)
    assert again["spec"]["priorityClassName"] == "high"


def test_gpu_memory_service_edited_at_v1alpha1_joins_the_other_experimental_features():
    """v1alpha1's gpuMemoryService is v1beta1's experimental.gpuMemoryService; the other experimental
    entries (v1beta1 only) are kept beside it through an edit at v1alpha1."""
    beta = to_v1beta1(ALPHA_GRAPH)
    beta["spec"]["components"][0]["experimental"] = {
        "gpuMemoryService": {"mode": "IntraPod"},
        "failover": {"mode": "IntraPod"},
    }
    alpha = to_v1alpha1(beta)
    assert alpha["spec"]["services"]["decode"]["gpuMemoryService"] == {"mode": "IntraPod"}
    alpha["spec"]["services"]["decode"]["gpuMemoryService"] = {"mode": "InterPod"}
    again = to_v1beta1(alpha)
    assert again["spec"]["components"][0]["experimental"] == {
        "gpuMemoryService": {"mode": "InterPod"},
        "failover": {"mode": "IntraPod"},
    }


def test_a_record_of_an_older_operator_still_restores_the_graph_fields_v1alpha1_has_now():
    """Before v1alpha1 had spec.labels (and annotations, priorityClassName, topologyConstraint), a
    conversion kept them in the v1beta1-fields annotation of the v1alpha1 object: such an object (e.g. a
    saved `kubectl get -o yaml`) applied again keeps them."""
    alpha = copy.deepcopy(ALPHA_GRAPH)
    record = {"spec": {"labels": {"team": "search"}, "priorityClassName": "high"}}
    alpha["metadata"]["annotations"] = {BETA_FIELDS_ANNOTATION: json.dumps(record)}
    beta = to_v1beta1(alpha)
    assert (beta["spec"]["labels"], beta["spec"]["priorityClassName"]) == ({"team": "search"}, "high")
    alpha["spec"]["labels"] = {"team": "ads"}  # set in the spec now: the spec wins
    assert to_v1beta1(alpha)["spec"]["labels"] == {"team": "ads"}


def test_convert_to_the_same_version_is_a_copy_and_unknown_versions_are_refused():
    assert convert(ALPHA_GRAPH, "nvidia.com/v1alpha1") == ALPHA_GRAPH
    with pytest.raises(ConversionError, match="v1beta2 is not served"):
        convert(ALPHA_GRAPH, "nvidia.com/v1beta2")


def test_two_components_with_one_name_are_refused_with_the_fix():
    beta = to_v1beta1(ALPHA_GRAPH)
    beta["spec"]["components"].append(copy.deepcopy(beta["spec"]["components"][0]))
    with pytest.raises(ConversionError, match="unique name"):
        to_v1alpha1(beta)
    with pytest.raises(ValidationError) as info:
        load_graph(beta)
    assert info.value.errors()[0]["loc"] == ("spec", "components", 1, "name")


# --- the internal model --------------------------------------------------------------------------------


def test_load_graph_reads_both_versions_into_one_model():
    beta = to_v1beta1(ALPHA_GRAPH)
    assert load_graph(beta) == load_graph(ALPHA_GRAPH)
    assert load_graph(beta).api_version == "nvidia.com/v1alpha1"


def test_load_graph_names_the_v1beta1_field_that_is_wrong():
    beta = to_v1beta1(ALPHA_GRAPH)
    beta["spec"]["components"][0]["replicas"] = -1
    with pytest.raises(ValidationError) as info:
        load_graph(beta)
    assert info.value.errors()[0]["loc"][:4] == ("spec", "components", 0, "replicas")


def test_load_graph_refuses_an_unserved_api_version_with_the_fix():
    with pytest.raises(ValidationError, match=r"write nvidia.com/v1beta1 or nvidia.com/v1alpha1"):
        load_graph({**ALPHA_GRAPH, "apiVersion": "nvidia.com/v2"})
