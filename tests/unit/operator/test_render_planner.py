"""A graph's planner gets least-privilege RBAC: a ServiceAccount its pods run as, a Role allowing get and
patch on its own graph only (by name) and creating Events, and the RoleBinding between them."""

from __future__ import annotations

import yaml
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render

from tests.integration.operator.conftest import EXAMPLES


def _rendered():
    raw = yaml.safe_load((EXAMPLES / "disagg-planner.yaml").read_text())
    raw["metadata"]["namespace"] = "ns"
    return render(DynamoGraphDeployment.model_validate(raw), OperatorConfig())


def test_planner_rbac_is_scoped_to_its_graph():
    objs = {(o["kind"], o["metadata"]["name"]): o for o in _rendered().objects}
    name = "sglang-disagg-planner-planner"
    role = objs[("Role", name)]
    assert role["rules"] == [
        {
            "apiGroups": ["nvidia.com"],
            "resources": ["dynamographdeployments"],
            "resourceNames": ["sglang-disagg-planner"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    binding = objs[("RoleBinding", name)]
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "ns"}]
    assert ("ServiceAccount", name) in objs
    pod = objs[("Deployment", name)]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name
    assert {"name": "system", "containerPort": 9090, "protocol": "TCP"} in pod["containers"][0]["ports"]
    # no other workload runs as the planner's account, and no other component gets RBAC
    others = [o for (k, n), o in objs.items() if k == "Deployment" and n != name]
    assert others and all("serviceAccountName" not in o["spec"]["template"]["spec"] for o in others)
    assert sum(1 for k, _ in objs if k in ("Role", "RoleBinding", "ServiceAccount")) == 3


def test_rendering_is_deterministic():
    assert _rendered().objects == _rendered().objects
