"""Notices: statements and warnings about a valid graph (ignored fields, TP sizing, KV transport)."""

from __future__ import annotations

from dynamo_api.annotations import RDMA_ANNOTATION
from dynamo_api.components import Component
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import DEFAULT_TRANSFER_BACKEND, gpu_count

from dynamo_operator.backends import nixl
from dynamo_operator.render.types import Notice

__all__ = ["ignored_fields", "tp_mismatch", "transport", "unmanaged"]


def ignored_fields(c: Component) -> list[Notice]:
    spec = c.spec
    ignored = [
        ("autoscaling", spec.autoscaling is not None and bool(spec.autoscaling.enabled)),
        ("ingress", spec.ingress is not None and bool(spec.ingress.enabled)),
        ("dynamoNamespace", spec.dynamo_namespace is not None),
        ("globalDynamoNamespace", bool(spec.global_dynamo_namespace)),
        ("eppConfig", spec.epp_config is not None),
        (
            "gpuMemoryService",
            spec.gpu_memory_service is not None and spec.gpu_memory_service.get("enabled") is not False,
        ),
    ]
    names = [name for name, present in ignored if present]
    if not names:
        return []
    hint = " To autoscale it, set scalingAdapter: {enabled: true} and aim an HPA or KEDA at its adapter."
    epp_hint = (
        " The endpoint picker decides with the frontend's router, not GAIE's plugins: give its flags "
        "(python -m dynamo_worker.epp --help) in extraPodSpec.mainContainer.args."
    )
    return [
        Notice(
            "IgnoredFields",
            f"Service {c.name!r} sets {', '.join(names)}, which this operator accepts but does not act on."
            + (hint if "autoscaling" in names else "")
            + (epp_hint if "eppConfig" in names else ""),
            c.name,
            # named in SpecWarnings, except dynamoNamespace alone, which NVIDIA Dynamo ignores too
            warning=names != ["dynamoNamespace"],
        )
    ]


def unmanaged(c: Component) -> list[Notice]:
    if c.kind != "generic":
        return []
    return [
        Notice(
            "RunAsGiven",
            f"Service {c.name!r} (componentType {c.component_type}) runs its own command as a Deployment, "
            "with the graph's env but no Dynamo-specific wiring or probes.",
            c.name,
        )
    ]


def tp_mismatch(c: Component) -> list[Notice]:
    """A warning when one single-node engine's GPUs (tp x pp [x dp]) are fewer than its pod's: it runs,
    and the rest of the GPUs idle."""
    if c.kind != "worker":
        return []
    gpus = gpu_count(c)
    needed = c.args.gpus_needed
    if gpus is None or not gpus.isdigit() or needed is None:
        return []
    nodes = c.spec.node_count
    available = nodes * int(gpus)
    if needed == available or nodes > 1 or needed > available:
        return []  # the last two cannot run: refused by validation (ParallelismMismatch)
    tp = c.args.tp if c.args.tp_given else f"{c.args.tp} (unset)"
    return [
        Notice(
            "TpMismatch",
            f"Service {c.name!r} runs --tp {tp} (engine needs {needed} GPUs) on {nodes} pod(s) x "
            f"{gpus} GPU(s) = {available}; set --tp to {available}, or resources.limits.gpu so that "
            f"pods x gpu = {needed}.",
            c.name,
            warning=True,
        )
    ]


def transport(
    dgd: DynamoGraphDeployment, comps: list[Component], rdma: dict[str, nixl.RdmaSettings | None]
) -> list[Notice]:
    """Which transport the KV-transferring pods were configured for, stated every time.

    Statements, not warnings (``warning=False``): the reconciler shows them in the graph's
    ``Transport`` condition; the TCP ones carry the hint to enable RDMA."""
    disagg = [c for c in comps if c.kind == "worker" and c.role in ("prefill", "decode")]
    if not disagg:
        enabled = [c for c in comps if rdma.get(c.name) is not None]
        if not enabled:
            return []
        disagg = enabled
    backend = disagg[0].args.transfer_backend or DEFAULT_TRANSFER_BACKEND
    with_rdma = [c.name for c in disagg if rdma.get(c.name) is not None]
    without = [c.name for c in disagg if rdma.get(c.name) is None]
    if not without:
        settings = rdma[with_rdma[0]]
        assert settings is not None
        return [
            Notice(
                "RdmaTransport",
                f"Pods of {', '.join(with_rdma)} are configured for {backend.upper()} over RDMA "
                f"({settings.describe()}).",
            )
        ]
    hint = f'annotate the graph with {RDMA_ANNOTATION}: "true" to use RDMA'
    if not with_rdma:
        return [
            Notice(
                "TcpTransport",
                f"Pods of {', '.join(without)} have no RDMA device: {backend.upper()} will move the KV "
                f"cache over TCP; {hint}.",
            )
        ]
    return [
        Notice(
            "MixedTransport",
            f"Pods of {', '.join(with_rdma)} are configured for RDMA but {', '.join(without)} are not: "
            f"KV transfer between them falls back to TCP; {hint}.",
        )
    ]
