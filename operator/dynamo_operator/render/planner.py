"""Least-privilege RBAC for a graph's ``planner`` component. Pure.

A planner scales its own graph and nothing else, so each planner service gets:

- a ServiceAccount ``<graph>-<service>``, set as the planner pods' ``serviceAccountName``;
- a Role of the same name allowing ``get`` and ``patch`` on ``dynamographdeployments`` restricted by
  ``resourceNames`` to this graph (the replicas are written by server-side apply, a patch), and
  ``create`` on ``events`` (Events cannot be restricted by name: their names are generated);
- a RoleBinding of the same name granting the Role to the ServiceAccount;
- container port ``system`` (9090) on its main container, where ``python -m dynamo_worker.planner``
  serves ``/metrics`` (``planner_*``), so the chart's PodMonitor scrapes it like a worker.

The pods run the user's command (``python3 -m dynamo_worker.planner ...``, or NVIDIA Dynamo's planner
image) with the graph's name and namespace in ``DYN_PARENT_DGD_K8S_NAME`` / ``_NAMESPACE``.
"""

from __future__ import annotations

import copy
from typing import Any

from dynamo_api import contract
from dynamo_api.components import Component
from dynamo_api.models import DynamoGraphDeployment

from dynamo_operator.render.names import child_name
from dynamo_operator.render.pods import object_meta

__all__ = ["is_planner", "planner_rbac", "with_service_account"]

GROUP = "nvidia.com"
RBAC = "rbac.authorization.k8s.io"


def is_planner(c: Component) -> bool:
    return c.component_type == "planner"


def planner_rbac(dgd: DynamoGraphDeployment, c: Component) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding of planner service ``c`` (all named ``<graph>-<service>``)."""
    name = child_name(dgd.name, c.name)
    meta = object_meta(dgd, c, name)
    role = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "Role",
        "metadata": copy.deepcopy(meta),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": ["dynamographdeployments"],
                "resourceNames": [dgd.name],
                "verbs": ["get", "patch"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ],
    }
    binding = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": copy.deepcopy(meta),
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": dgd.namespace}],
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(meta)}
    return [account, role, binding]


def with_service_account(objects: list[dict[str, Any]], workload: str, account: str) -> list[dict[str, Any]]:
    """``objects`` with the pods of Deployment ``workload`` running as ``account`` and declaring the
    metrics port (a new list)."""
    out = []
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == workload:
            obj = copy.deepcopy(obj)
            pod = obj["spec"]["template"]["spec"]
            pod["serviceAccountName"] = account
            for container in pod["containers"]:
                ports = container.setdefault("ports", [])
                if container["name"] == "main" and not any(p.get("name") == "system" for p in ports):
                    ports.append({"name": "system", "containerPort": contract.SYSTEM_PORT, "protocol": "TCP"})
        out.append(obj)
    return out
