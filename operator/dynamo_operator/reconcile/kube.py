"""The operator's side of the one Kubernetes client (:mod:`dynamo_clients.kube`): the types it touches
(:data:`KNOWN_TYPES`), its field manager, and the client and its errors for the rest of the operator."""

from __future__ import annotations

from dynamo_api.kube_errors import Conflict as Conflict  # the client's errors, for its callers
from dynamo_api.kube_errors import KubeError as KubeError
from dynamo_api.kube_errors import NotFound as NotFound
from dynamo_clients.kube import CRD as CRD
from dynamo_clients.kube import EVENT, ResourceType
from dynamo_clients.kube import Credentials as Credentials
from dynamo_clients.kube import Kube as Kube
from dynamo_clients.kube import is_rejection as is_rejection
from dynamo_clients.kube import label_selector as label_selector
from dynamo_clients.kube import load_credentials as load_credentials
from dynamo_clients.kube import timestamp as timestamp

FIELD_MANAGER = "dynamo-sglang-operator"


# The stored version: reading and writing it never needs the conversion webhook.
DGD = ResourceType("nvidia.com/v1beta1", "DynamoGraphDeployment", "dynamographdeployments")
SCALING_ADAPTER = ResourceType(
    "nvidia.com/v1alpha1", "DynamoGraphDeploymentScalingAdapter", "dynamographdeploymentscalingadapters"
)
DYNAMO_MODEL = ResourceType("nvidia.com/v1alpha1", "DynamoModel", "dynamomodels")
DEPLOYMENT = ResourceType("apps/v1", "Deployment", "deployments")
STATEFULSET = ResourceType("apps/v1", "StatefulSet", "statefulsets")
SERVICE = ResourceType("v1", "Service", "services")
POD = ResourceType("v1", "Pod", "pods")
PVC = ResourceType("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SERVICE_ACCOUNT = ResourceType("v1", "ServiceAccount", "serviceaccounts")
ROLE = ResourceType("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = ResourceType("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
LWS = ResourceType("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets")
PDB = ResourceType("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
POD_GROUP = ResourceType("scheduling.x-k8s.io/v1alpha1", "PodGroup", "podgroups")  # scheduler-plugins
INFERENCE_POOL = ResourceType("inference.networking.k8s.io/v1", "InferencePool", "inferencepools")  # GAIE
VALIDATING_WEBHOOK = ResourceType(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)

KNOWN_TYPES: dict[tuple[str, str], ResourceType] = {
    (t.api_version, t.kind): t
    for t in (
        DGD,
        SCALING_ADAPTER,
        DYNAMO_MODEL,
        DEPLOYMENT,
        STATEFULSET,
        SERVICE,
        POD,
        EVENT,
        PVC,
        LWS,
        CRD,
        SERVICE_ACCOUNT,
        ROLE,
        ROLE_BINDING,
        PDB,
        POD_GROUP,
        INFERENCE_POOL,
        VALIDATING_WEBHOOK,
    )
}

LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"
POD_GROUP_CRD_NAME = "podgroups.scheduling.x-k8s.io"


def resource_type(api_version: str, kind: str) -> ResourceType:
    try:
        return KNOWN_TYPES[(api_version, kind)]
    except KeyError:
        raise ValueError(
            f"The operator does not know the Kubernetes type {api_version}/{kind}; "
            "add it to dynamo_operator.reconcile.kube.KNOWN_TYPES"
        ) from None
