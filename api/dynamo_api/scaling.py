"""Pydantic model of ``nvidia.com/v1alpha1`` ``DynamoGraphDeploymentScalingAdapter`` (short name ``dgdsa``).

NVIDIA Dynamo's shape: one adapter per service that opts in (``scalingAdapter: {enabled: true}``), named
``<graph>-<service lowercased>``, with ``spec.replicas`` and ``spec.dgdRef: {name, serviceName}``. Its
``scale`` subresource (``.spec.replicas``, ``.status.replicas``, ``.status.selector``) is what HPA, KEDA
and ``kubectl scale`` act on. The operator creates and deletes adapters (owned by their graph) and copies
an adapter's ``spec.replicas`` into its service; ``status`` reports the service's pods.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from dynamo_api.models import ObjectMeta, _Model

__all__ = [
    "API_VERSION",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "AdapterSpec",
    "AdapterStatus",
    "DgdRef",
    "DynamoGraphDeploymentScalingAdapter",
]

VERSION: Final = "v1alpha1"
API_VERSION: Final = "nvidia.com/v1alpha1"  # models.GROUP/VERSION, spelled out: its type is the literal
KIND: Final = "DynamoGraphDeploymentScalingAdapter"
PLURAL = "dynamographdeploymentscalingadapters"
SINGULAR = "dynamographdeploymentscalingadapter"
SHORT_NAME = "dgdsa"


class DgdRef(_Model):
    name: Annotated[str, Field(min_length=1)] = Field(description="The DynamoGraphDeployment's name.")
    service_name: Annotated[str, Field(min_length=1)] = Field(
        description="The key of the service in the graph's spec.services (a component's name in v1beta1)."
    )


class AdapterSpec(_Model):
    replicas: Annotated[int, Field(ge=0)] = Field(
        description="Desired replicas of the service: set by HPA, KEDA or kubectl scale."
    )
    dgd_ref: DgdRef = Field(description="The graph and service this adapter scales.")


class AdapterStatus(_Model):
    replicas: Annotated[int, Field(ge=0)] | None = Field(
        None, description="Replicas of the service that exist (pods, or groups when multinode)."
    )
    selector: str | None = Field(None, description="Label selector of the service's pods (for HPA).")
    last_scale_time: str | None = Field(None, description="When the operator last changed the service.")


class DynamoGraphDeploymentScalingAdapter(_Model):
    """Scales one service of a DynamoGraphDeployment through the scale subresource (HPA, KEDA, kubectl)."""

    api_version: Literal["nvidia.com/v1alpha1"] = API_VERSION
    kind: Literal["DynamoGraphDeploymentScalingAdapter"] = KIND
    metadata: ObjectMeta
    spec: AdapterSpec
    status: AdapterStatus | None = None
