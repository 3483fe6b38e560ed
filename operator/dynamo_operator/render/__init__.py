"""``render(dgd, config) -> Rendered``: the whole desired state of one graph. Pure and deterministic.

No I/O, no clock, no randomness, no environment: the same DynamoGraphDeployment and OperatorConfig
give byte-identical objects. Invalid specs give ``problems`` and no objects.

More: docs/module-notes.md (dynamo_operator.render)."""

from __future__ import annotations

from dynamo_api.components import components
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import validate

from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import endpoint_picker as _endpoint_picker
from dynamo_operator.render import notices as _notices
from dynamo_operator.render import placement as _placement
from dynamo_operator.render import planner as _planner
from dynamo_operator.render import scaling as _scaling
from dynamo_operator.render.names import child_name
from dynamo_operator.render.pods import main_container, rdma_settings
from dynamo_operator.render.revision import pair_revision
from dynamo_operator.render.services import render_service
from dynamo_operator.render.types import GroupPlan, Notice, Problem, Rendered, ServicePlan, Workload
from dynamo_operator.render.workloads import persistent_volume_claim

__all__ = ["GroupPlan", "Notice", "Problem", "Rendered", "ServicePlan", "Workload", "render"]


def render(dgd: DynamoGraphDeployment, config: OperatorConfig) -> Rendered:
    """The desired children of ``dgd`` (see the module docstring), or the problems that prevent them."""
    comps = components(dgd)
    problems = validate(dgd) + tuple(_placement.problems(dgd, comps, config))
    if problems:
        return Rendered(problems=problems)
    objects = [persistent_volume_claim(dgd, pvc) for pvc in dgd.spec.pvcs if pvc.create]
    objects += _placement.graph_pod_group(dgd, comps, config)
    objects += _placement.disruption_budgets(dgd, comps)
    notices: list[Notice] = _placement.notices(dgd, comps, config)
    plans: dict[str, ServicePlan] = {}
    rdma = {c.name: rdma_settings(dgd, c, config) for c in comps}
    revision = pair_revision(dgd, config)
    for c in comps:
        container, container_notices = main_container(dgd, c, config, revision)
        output = render_service(dgd, c, config, container, rdma[c.name], revision)
        if _planner.is_planner(c):
            name = child_name(dgd.name, c.name)
            objects += _planner.planner_rbac(dgd, c)
            objects += _planner.with_service_account(output.objects, name, name)
        else:
            objects += output.objects
        plans[c.name] = output.plan
        notices += _notices.ignored_fields(c)
        notices += _notices.unmanaged(c)
        notices += container_notices
        notices += _notices.tp_mismatch(c)
    objects += _endpoint_picker.picker_objects(dgd, comps)
    notices += _notices.transport(dgd, comps, rdma)
    adapters, conflicts = _scaling.scaling_adapters(dgd, comps)
    return Rendered(
        objects=tuple(objects),
        notices=tuple(notices),
        services=plans,
        adapters=adapters,
        scaling_conflicts=conflicts,
    )
