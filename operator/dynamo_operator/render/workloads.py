"""Builders of the Kubernetes objects a service becomes: Deployment, Service, StatefulSet, LWS, PVC."""

from __future__ import annotations

from typing import Any

from dynamo_api import contract
from dynamo_api.components import Component
from dynamo_api.models import PVC, DynamoGraphDeployment

from dynamo_operator.render import labels
from dynamo_operator.render.pods import object_meta

__all__ = [
    "deployment",
    "headless_service",
    "leader_worker_set",
    "persistent_volume_claim",
    "service",
    "stateful_set",
]


def deployment(
    dgd: DynamoGraphDeployment, c: Component, name: str, replicas: int, template: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(dgd, c, name),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels.selector(dgd.name, c.name)},
            "template": template,
        },
    }


def service(dgd: DynamoGraphDeployment, c: Component, name: str) -> dict[str, Any]:
    """The frontend's ClusterIP Service on port 8000 (``http``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dgd, c, name),
        "spec": {
            "type": "ClusterIP",
            "selector": labels.selector(dgd.name, c.name),
            "ports": [
                {"name": "http", "port": contract.FRONTEND_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def headless_service(dgd: DynamoGraphDeployment, c: Component, name: str, group: str) -> dict[str, Any]:
    """Stable DNS for the pods of one multinode group; resolvable before they are ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(dgd, c, name, {labels.GROUP: group}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {**labels.selector(dgd.name, c.name), labels.GROUP: group},
            "ports": [
                {"name": "dist-init", "port": contract.DIST_INIT_PORT, "targetPort": contract.DIST_INIT_PORT}
            ],
        },
    }


def stateful_set(
    dgd: DynamoGraphDeployment,
    c: Component,
    name: str,
    *,
    group: str,
    role: str,
    pods: int,
    first_ordinal: int,
    template: dict[str, Any],
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": pods,
        "serviceName": group,
        "podManagementPolicy": "Parallel",
        "selector": {
            "matchLabels": {
                **labels.selector(dgd.name, c.name),
                labels.GROUP: group,
                labels.MULTINODE_ROLE: role,
            }
        },
        "template": template,
    }
    if first_ordinal:
        spec["ordinals"] = {"start": first_ordinal}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(dgd, c, name, {labels.GROUP: group, labels.MULTINODE_ROLE: role}),
        "spec": spec,
    }


def leader_worker_set(
    dgd: DynamoGraphDeployment,
    c: Component,
    name: str,
    *,
    size: int,
    leader_template: dict[str, Any],
    worker_template: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": object_meta(dgd, c, name, {labels.GROUP: name}),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_template,
                "workerTemplate": worker_template,
            },
        },
    }


def persistent_volume_claim(dgd: DynamoGraphDeployment, pvc: PVC) -> dict[str, Any]:
    assert pvc.name is not None  # checked by validation
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(dgd, None, pvc.name),
        "spec": {
            "accessModes": [pvc.volume_access_mode],
            "storageClassName": pvc.storage_class,
            "resources": {"requests": {"storage": pvc.size}},
        },
    }
